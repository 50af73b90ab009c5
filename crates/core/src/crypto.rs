//! Encryption and keyed hashing: the repository's master key and the sealing of every
//! stored object with the repository's [`Cipher`] (AEGIS-256 where the processor has AES
//! instructions, XChaCha20-Poly1305 elsewhere and in format 1). Key files, which wrap the
//! master key, are [`crate::keyfile`]'s.
//!
//! The id key (naming blobs) and the data key (sealing them) are separate secrets, so a
//! later version can hand out write-only keys without revealing how to name or read data.
//! Nothing here does I/O.

use aegis::aegis256::Aegis256;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{Key, Tag, XChaCha20Poly1305, XNonce};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use cairn_chunker::Gear;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::envelope::{Envelope, Recipient, RecoveryKey, ENVELOPE_LEN};
use crate::id::BlobId;

const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
/// Bytes a sealed object has beyond its plaintext, at least (XChaCha20-Poly1305's; see
/// [`Cipher::overhead`]).
pub const SEAL_OVERHEAD: usize = NONCE_LEN + TAG_LEN;
const AEGIS_NONCE_LEN: usize = 32;
const AEGIS_TAG_LEN: usize = 32;

/// The AEAD that seals a repository's objects, chosen at `init` and recorded in the
/// (authenticated) config.
///
/// AEGIS-256 runs at 9.8 GB/s per core on this project's AES-NI machine against 1.6 GB/s
/// for XChaCha20-Poly1305 (1 MiB messages; docs/BENCHMARKS.md). Its 256-bit nonces are
/// drawn at random, as XChaCha's 192-bit ones are, so no nonce limit applies within any
/// realistic number of objects (AES-256-GCM's 96-bit random nonces would need subkeys
/// past 2^32 objects). Its 256-bit tag is the one the AEGIS specification recommends.
/// Without AES instructions AEGIS is slower than ChaCha, so `init` picks by the machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cipher {
    #[default]
    #[serde(rename = "xchacha20-poly1305")]
    XChaCha20Poly1305,
    #[serde(rename = "aegis-256")]
    Aegis256,
}

impl Cipher {
    /// The faster cipher on this machine: AEGIS-256 with AES instructions.
    pub fn fastest_here() -> Cipher {
        #[cfg(target_arch = "x86_64")]
        let aes = std::arch::is_x86_feature_detected!("aes");
        #[cfg(target_arch = "aarch64")]
        let aes = std::arch::is_aarch64_feature_detected!("aes");
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let aes = false;
        if aes {
            Cipher::Aegis256
        } else {
            Cipher::XChaCha20Poly1305
        }
    }

    /// Bytes a sealed object has beyond its (padded) plaintext: nonce and tag.
    pub fn overhead(self) -> usize {
        let (nonce, tag) = self.nonce_and_tag_len();
        nonce + tag
    }

    /// The name `init --cipher` and the config use.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::XChaCha20Poly1305 => "xchacha20-poly1305",
            Cipher::Aegis256 => "aegis-256",
        }
    }
}

impl std::str::FromStr for Cipher {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "xchacha20-poly1305" => Ok(Cipher::XChaCha20Poly1305),
            "aegis-256" => Ok(Cipher::Aegis256),
            _ => Err(format!(
                "unknown cipher {s:?}: use aegis-256 or xchacha20-poly1305"
            )),
        }
    }
}

/// Sealed data that does not open: tampered, truncated, or sealed with another key.
#[derive(Debug, thiserror::Error)]
#[error("Authentication failed (the bytes were changed, truncated, or sealed with another key)")]
pub struct OpenError;

/// What a sealed object is. Under format 2 each kind of object is sealed with its own
/// subkey and bound to what it is by associated data, so no object opens as another (a
/// data blob cannot pass for a snapshot) and a blob opens only under its own id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    DataBlob(BlobId),
    TreeBlob(BlobId),
    PackHeader,
    Index,
    Snapshot,
    Trash,
    Session,
}

impl Purpose {
    /// The byte naming the purpose in associated data, and which subkey it uses.
    fn tag(self) -> u8 {
        match self {
            Purpose::DataBlob(_) => 1,
            Purpose::TreeBlob(_) => 2,
            Purpose::PackHeader => 3,
            Purpose::Index => 4,
            Purpose::Snapshot => 5,
            Purpose::Trash => 6,
            Purpose::Session => 7,
        }
    }

    fn is_blob(self) -> bool {
        matches!(self, Purpose::DataBlob(_) | Purpose::TreeBlob(_))
    }

    fn subkey(self) -> usize {
        match self {
            Purpose::DataBlob(_) | Purpose::TreeBlob(_) => 0,
            Purpose::PackHeader => 1,
            Purpose::Index => 2,
            Purpose::Snapshot => 3,
            Purpose::Trash => 4,
            Purpose::Session => 5,
        }
    }

    /// `"cairn" || format:u32le || tag || blob id (blobs only)`.
    fn associated_data(self, format: u32) -> ([u8; 42], usize) {
        let mut ad = [0u8; 42];
        ad[..5].copy_from_slice(b"cairn");
        ad[5..9].copy_from_slice(&format.to_le_bytes());
        ad[9] = self.tag();
        match self {
            Purpose::DataBlob(id) | Purpose::TreeBlob(id) => {
                ad[10..42].copy_from_slice(&id.0);
                (ad, 42)
            }
            _ => (ad, 10),
        }
    }
}

/// BLAKE3 key-derivation contexts of format 2's subkeys, by [`Purpose::subkey`], and of
/// the config's MAC key. Derived from the data key: the id key stays apart, for keys
/// that will write without reading.
const SUBKEY_CONTEXTS: [&str; 6] = [
    "cairn format 2 blob sealing key",
    "cairn format 2 pack header sealing key",
    "cairn format 2 index sealing key",
    "cairn format 2 snapshot sealing key",
    "cairn format 2 trash sealing key",
    "cairn format 2 session sealing key",
];
/// Appended to each subkey context for AEGIS-256, so the two ciphers never share a key.
const AEGIS_CONTEXT_SUFFIX: &str = " for aegis-256";
const CONFIG_MAC_CONTEXT: &str = "cairn format 2 config MAC key";
const GEAR_CONTEXT: &str = "cairn format 2 chunker gear table";

/// The repository's secrets, as key files hold them. Zeroed when dropped.
#[derive(Clone, Zeroize, ZeroizeOnDrop, Serialize, Deserialize)]
struct Secrets {
    /// The repository format the key seals for; absent (1) in format 1 key files.
    #[serde(default = "format_1")]
    format: u32,
    #[serde(with = "b64_array", default, skip_serializing_if = "is_zero")]
    data_key: [u8; 32],
    #[serde(with = "b64_array")]
    id_key: [u8; 32],
    /// Format 1's chunker secret: XORed into fastcdc's public gear table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chunker_seed: Option<u64>,
    /// Format 2's: the whole gear table is derived from it.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "b64_option")]
    chunker_key: Option<[u8; 32]>,
    /// `"write-only"` for a key that writes but cannot read (format 3); absent for a
    /// full key. A write-only key holds no data key (`data_key` is all zeros).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    /// A write-only key's: the repository's recovery public key, which it wraps its
    /// own keys to.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "b64_option")]
    recipient: Option<[u8; 32]>,
    /// A write-only key's: the BLAKE3 hash of the config's settings (the bytes the MAC
    /// covers) when a full key made it. It cannot compute the MAC, so it compares these.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "b64_option")]
    settings_hash: Option<[u8; 32]>,
}

const WRITE_ONLY: &str = "write-only";

fn format_1() -> u32 {
    1
}

fn is_zero(key: &[u8; 32]) -> bool {
    key.iter().all(|&b| b == 0)
}

/// In format 3, the first byte of every sealed object: who sealed it.
const SEALED_BY_REPOSITORY: u8 = 0;
/// ... or a writer, whose [`Envelope`] follows.
const SEALED_BY_WRITER: u8 = 1;

/// The first format whose sealed objects begin with who sealed them, and that has
/// write-only keys.
pub const WRITERS_FORMAT: u32 = 3;

/// The first format that seals blobs without Padmé and pads whole packs instead (to a
/// multiple of [`crate::pack::GRID`], every read of a pack widened to the same grid): the
/// sizes a storage sees still do not give away a blob's, at 0.2% of the space of a 16 MiB
/// pack where Padmé took 1.2-1.5% of every blob of 0.5-8 MiB.
pub const GRID_FORMAT: u32 = 4;

/// What a key is, beyond its secrets: a full key opens what writers sealed (with the
/// recovery key it derives); a write-only key seals under a data key of its own, drawn at
/// random by each process and wrapped to the repository's recipient.
enum Role {
    Full {
        recovery: OnceLock<RecoveryKey>,
        /// The subkeys of each writer whose objects were opened, by envelope.
        writers: Mutex<HashMap<Envelope, Arc<Subkeys>>>,
    },
    Writer {
        /// This process's data key, wrapped (once the repository id is known).
        envelope: OnceLock<Envelope>,
    },
}

/// State shared by the clones of one key.
struct Keyring {
    role: Role,
    /// The repository's id, which binds envelopes to it ([`MasterKey::bind_repository`]).
    repository: OnceLock<String>,
}

/// The repository's master key: its secrets and, for format 2, the subkeys derived from
/// them. Zeroed when dropped.
#[derive(Clone, Zeroize, ZeroizeOnDrop, Serialize, Deserialize)]
#[serde(try_from = "Secrets", into = "Secrets")]
pub struct MasterKey {
    secrets: Secrets,
    /// A property of the repository, not of the key: set from the config.
    #[zeroize(skip)]
    cipher: Cipher,
    subkeys: [[u8; 32]; 6],
    config_mac_key: [u8; 32],
    /// What this key seals with: the data key, or a write-only key's own random one.
    sealing_key: [u8; 32],
    #[zeroize(skip)]
    keyring: Arc<Keyring>,
}

impl TryFrom<Secrets> for MasterKey {
    type Error = String;

    fn try_from(secrets: Secrets) -> Result<Self, String> {
        match (secrets.format, secrets.chunker_seed, secrets.chunker_key) {
            (1, Some(_), None) | (2..=4, Some(_), None) | (2..=4, None, Some(_)) => {}
            (1..=4, _, _) => return Err("the chunker secret is missing or doubled".into()),
            (n, _, _) => return Err(format!("the key is for repository format {n}, unknown")),
        }
        let role = match secrets.kind.as_deref() {
            None => Role::Full {
                recovery: OnceLock::new(),
                writers: Mutex::new(HashMap::new()),
            },
            Some(WRITE_ONLY) => {
                if secrets.format < WRITERS_FORMAT
                    || !is_zero(&secrets.data_key)
                    || secrets.recipient.is_none()
                    || secrets.settings_hash.is_none()
                {
                    return Err("the write-only key is incomplete".into());
                }
                Role::Writer {
                    envelope: OnceLock::new(),
                }
            }
            Some(other) => return Err(format!("unknown kind of key {other:?}")),
        };
        let sealing_key = match role {
            Role::Full { .. } => secrets.data_key,
            Role::Writer { .. } => {
                let mut key = [0; 32];
                rand::rngs::OsRng.fill_bytes(&mut key);
                key
            }
        };
        Ok(MasterKey {
            subkeys: subkeys(&sealing_key, Cipher::XChaCha20Poly1305),
            config_mac_key: blake3::derive_key(CONFIG_MAC_CONTEXT, &secrets.data_key),
            cipher: Cipher::XChaCha20Poly1305,
            sealing_key,
            keyring: Arc::new(Keyring {
                role,
                repository: OnceLock::new(),
            }),
            secrets,
        })
    }
}

/// Format 2's subkeys for `cipher`, by [`Purpose::subkey`].
fn subkeys(data_key: &[u8; 32], cipher: Cipher) -> [[u8; 32]; 6] {
    SUBKEY_CONTEXTS.map(|context| match cipher {
        Cipher::XChaCha20Poly1305 => blake3::derive_key(context, data_key),
        Cipher::Aegis256 => {
            blake3::derive_key(&format!("{context}{AEGIS_CONTEXT_SUFFIX}"), data_key)
        }
    })
}

/// A writer's subkeys, as a full key derives them from its envelope; zeroed when dropped.
type Subkeys = Zeroizing<[[u8; 32]; 6]>;

/// The subkeys that open one object: the key's own, or a writer's.
enum SubkeysRef<'a> {
    Own(&'a [[u8; 32]; 6]),
    Writer(Arc<Subkeys>),
}

impl SubkeysRef<'_> {
    fn get(&self, purpose: Purpose) -> &[u8; 32] {
        match self {
            SubkeysRef::Own(keys) => &keys[purpose.subkey()],
            SubkeysRef::Writer(keys) => &keys[purpose.subkey()],
        }
    }
}

impl From<MasterKey> for Secrets {
    fn from(key: MasterKey) -> Self {
        key.secrets.clone()
    }
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

/// The newest repository format a new key seals for.
pub const KEY_FORMAT: u32 = crate::config::FORMAT_VERSION;

impl MasterKey {
    /// A new random key for a repository of the newest format.
    pub fn generate() -> Self {
        Self::generate_for(KEY_FORMAT)
    }

    /// A new random key for a repository of `format` (1 to 4): the older ones only to
    /// make old repositories in tests.
    ///
    /// # Panics
    ///
    /// On a format other than 1 to 4.
    pub fn generate_for(format: u32) -> Self {
        let mut rng = rand::rngs::OsRng;
        let mut secrets = Secrets {
            format,
            data_key: [0; 32],
            id_key: [0; 32],
            chunker_seed: None,
            chunker_key: None,
            kind: None,
            recipient: None,
            settings_hash: None,
        };
        rng.fill_bytes(&mut secrets.data_key);
        rng.fill_bytes(&mut secrets.id_key);
        if format == 1 {
            secrets.chunker_seed = Some(rng.next_u64());
        } else {
            let mut chunker_key = [0; 32];
            rng.fill_bytes(&mut chunker_key);
            secrets.chunker_key = Some(chunker_key);
        }
        Self::try_from(secrets).expect("formats 1 to 4 make valid keys")
    }

    /// A new key of the newest format that names blobs and cuts chunks exactly as
    /// `other` does, with its own encryption key: a repository made with it deduplicates
    /// with `other`'s, and copying between the two sends only missing blobs, found by id
    /// without reading. (From a format 1 key, it keeps format 1's weaker chunker secret.)
    pub fn sharing_ids_with(other: &MasterKey) -> Self {
        let mut secrets = Self::generate().secrets.clone();
        secrets.id_key = other.secrets.id_key;
        secrets.chunker_seed = other.secrets.chunker_seed;
        secrets.chunker_key = other.secrets.chunker_key;
        Self::try_from(secrets).expect("the other key's chunker secret is valid")
    }

    /// Whether blobs are named, and chunks cut, the same way under both keys.
    pub fn shares_ids_with(&self, other: &MasterKey) -> bool {
        let (a, b) = (&self.secrets, &other.secrets);
        a.id_key == b.id_key && a.chunker_seed == b.chunker_seed && a.chunker_key == b.chunker_key
    }

    /// The repository format this key seals for.
    pub fn format(&self) -> u32 {
        self.secrets.format
    }

    /// Seals and opens with `cipher` from now on, as the repository's config says. Format
    /// 1 knows only XChaCha20-Poly1305.
    pub fn use_cipher(&mut self, cipher: Cipher) -> Result<(), String> {
        if self.secrets.format == 1 && cipher != Cipher::XChaCha20Poly1305 {
            return Err(format!("format 1 has no cipher {}", cipher.name()));
        }
        self.subkeys = subkeys(&self.sealing_key, cipher);
        self.cipher = cipher;
        if let Role::Full { writers, .. } = &self.keyring.role {
            writers.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
        Ok(())
    }

    /// Binds the key to the repository `id` (the config's), which envelopes name: a
    /// write-only key wraps its own key now, a full key opens only envelopes made for
    /// this repository. Once per key; a second, different id is refused.
    pub fn bind_repository(&self, id: &str) -> Result<(), String> {
        let bound = self.keyring.repository.get_or_init(|| id.to_string());
        if bound != id {
            return Err(format!("the key is already bound to repository {bound}"));
        }
        if let (Role::Writer { envelope }, Some(recipient)) =
            (&self.keyring.role, self.secrets.recipient)
        {
            envelope.get_or_init(|| Recipient(recipient).wrap(id, &self.sealing_key));
        }
        Ok(())
    }

    /// Whether this key writes without reading (format 3's `key add --write-only`).
    pub fn is_write_only(&self) -> bool {
        matches!(self.keyring.role, Role::Writer { .. })
    }

    /// A write-only key for this repository: the id and chunker keys, the recovery key's
    /// public half and a hash of the config's `settings` (as
    /// [`config_mac`](Self::config_mac) takes them), and no data key. Only a full key of
    /// format 3 makes one.
    pub fn write_only(&self, settings: &[u8]) -> Result<MasterKey, String> {
        if self.is_write_only() {
            return Err("a write-only key cannot make another key".into());
        }
        if self.secrets.format < WRITERS_FORMAT {
            return Err(format!(
                "write-only keys need repository format {WRITERS_FORMAT}; this repository is \
                 format {}: copy it into a new repository (`cairn init` then `cairn copy`)",
                self.secrets.format
            ));
        }
        let secrets = Secrets {
            format: self.secrets.format,
            data_key: [0; 32],
            id_key: self.secrets.id_key,
            chunker_seed: self.secrets.chunker_seed,
            chunker_key: self.secrets.chunker_key,
            kind: Some(WRITE_ONLY.into()),
            recipient: Some(self.recovery()?.recipient().0),
            settings_hash: Some(*blake3::hash(settings).as_bytes()),
        };
        let mut key = MasterKey::try_from(secrets)?;
        key.use_cipher(self.cipher)?;
        Ok(key)
    }

    /// The recovery key pair, which only full keys derive.
    fn recovery(&self) -> Result<&RecoveryKey, String> {
        match &self.keyring.role {
            Role::Full { recovery, .. } => {
                Ok(recovery.get_or_init(|| RecoveryKey::from_data_key(&self.secrets.data_key)))
            }
            Role::Writer { .. } => Err("a write-only key has no recovery key".into()),
        }
    }

    /// A MAC for what a write-only key keeps on its own client ([`crate::writer_cache`]):
    /// keyed by the id key, which every key of the repository holds.
    pub fn local_mac(&self, bytes: &[u8]) -> [u8; 32] {
        let key = blake3::derive_key("cairn writer cache MAC", &self.secrets.id_key);
        *blake3::keyed_hash(&key, bytes).as_bytes()
    }

    /// Whether `sealed` was sealed by a writer (format 3), not by the repository key:
    /// what it says is a writer's word, and blobs in its packs are not deduplicated
    /// against by full keys until prune has verified them.
    pub fn sealed_by_writer(&self, sealed: &[u8]) -> bool {
        self.secrets.format >= WRITERS_FORMAT && sealed.first() == Some(&SEALED_BY_WRITER)
    }

    /// Whether opening `sealed` as a blob also proves that its plaintext is the one its
    /// id names, so that hashing the plaintext again adds nothing an attacker could
    /// defeat. From format 2 on a blob's associated data holds its id: a blob the
    /// repository key sealed opens only under the id its sealer computed from that very
    /// plaintext. Not in format 1 (no associated data), nor for a writer's blob (a
    /// write-only key is trusted to add data, not to name it truthfully).
    pub fn seal_binds_blob_id(&self, sealed: &[u8]) -> bool {
        self.secrets.format >= 2
            && matches!(self.keyring.role, Role::Full { .. })
            && !self.sealed_by_writer(sealed)
    }

    /// The length of [`key_reference`](Self::key_reference).
    fn key_reference_len(&self) -> usize {
        match (self.secrets.format < WRITERS_FORMAT, &self.keyring.role) {
            (true, _) => 0,
            (false, Role::Full { .. }) => 1,
            (false, Role::Writer { .. }) => 1 + ENVELOPE_LEN,
        }
    }

    /// The bytes that say who sealed an object, put before it (format 3).
    fn key_reference(&self) -> Option<([u8; 1 + ENVELOPE_LEN], usize)> {
        if self.secrets.format < WRITERS_FORMAT {
            return None;
        }
        let mut out = [0; 1 + ENVELOPE_LEN];
        match &self.keyring.role {
            Role::Full { .. } => {
                out[0] = SEALED_BY_REPOSITORY;
                Some((out, 1))
            }
            Role::Writer { envelope } => {
                let envelope = envelope
                    .get()
                    .expect("a write-only key is bound to its repository before it seals");
                out[0] = SEALED_BY_WRITER;
                out[1..].copy_from_slice(&envelope.0);
                Some((out, 1 + ENVELOPE_LEN))
            }
        }
    }

    /// Splits a format 3 object into the subkeys that open it and the sealed bytes after
    /// its key reference. A write-only key opens only what it sealed itself.
    fn subkeys_for(&self, sealed: &[u8]) -> Result<(SubkeysRef<'_>, usize), OpenError> {
        if self.secrets.format < WRITERS_FORMAT {
            return Ok((SubkeysRef::Own(&self.subkeys), 0));
        }
        match (sealed.first(), &self.keyring.role) {
            (Some(&SEALED_BY_REPOSITORY), Role::Full { .. }) => {
                Ok((SubkeysRef::Own(&self.subkeys), 1))
            }
            (Some(&SEALED_BY_WRITER), role) if sealed.len() > ENVELOPE_LEN => {
                let envelope = Envelope(
                    sealed[1..1 + ENVELOPE_LEN]
                        .try_into()
                        .expect("ENVELOPE_LEN bytes"),
                );
                match role {
                    Role::Writer { envelope: own } => match own.get() {
                        Some(own) if *own == envelope => {
                            Ok((SubkeysRef::Own(&self.subkeys), 1 + ENVELOPE_LEN))
                        }
                        _ => Err(OpenError),
                    },
                    Role::Full { writers, .. } => {
                        let mut cache = writers.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some(keys) = cache.get(&envelope) {
                            return Ok((SubkeysRef::Writer(Arc::clone(keys)), 1 + ENVELOPE_LEN));
                        }
                        let repository = self.keyring.repository.get().ok_or(OpenError)?;
                        let recovery = self.recovery().map_err(|_| OpenError)?;
                        let data_key = recovery
                            .open(repository, &envelope)
                            .map_err(|_| OpenError)?;
                        let keys = Arc::new(Zeroizing::new(subkeys(&data_key, self.cipher)));
                        cache.insert(envelope, Arc::clone(&keys));
                        Ok((SubkeysRef::Writer(keys), 1 + ENVELOPE_LEN))
                    }
                }
            }
            _ => Err(OpenError),
        }
    }

    /// The cipher this key seals with.
    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// The keyed BLAKE3 hash that names a blob.
    pub fn blob_id(&self, plaintext: &[u8]) -> BlobId {
        BlobId(*blake3::keyed_hash(&self.secrets.id_key, plaintext).as_bytes())
    }

    /// A hasher for blob ids over data that arrives in pieces.
    pub fn blob_hasher(&self) -> blake3::Hasher {
        blake3::Hasher::new_keyed(&self.secrets.id_key)
    }

    /// The chunker's gear table. Format 2 derives all 256 entries from the 256-bit
    /// chunker key with BLAKE3 (a PRF); format 1 XORed a 64-bit seed into fastcdc's public
    /// table, where only 48 bits move cut points.
    pub fn chunker_gear(&self) -> Gear {
        match (self.secrets.chunker_key, self.secrets.chunker_seed) {
            (Some(key), _) => {
                let mut stream = blake3::Hasher::new_keyed(&key);
                stream.update(GEAR_CONTEXT.as_bytes());
                let mut bytes = [0u8; 256 * 8];
                stream.finalize_xof().fill(&mut bytes);
                let mut table = [0u64; 256];
                for (entry, b) in table.iter_mut().zip(bytes.chunks_exact(8)) {
                    *entry = u64::from_le_bytes(b.try_into().expect("8 bytes"));
                }
                Gear::from_table(table)
            }
            (None, seed) => Gear::from(seed.unwrap_or(0)),
        }
    }

    /// The MAC that authenticates the config's settings (format 2).
    pub fn config_mac(&self, settings: &[u8]) -> [u8; 32] {
        *blake3::keyed_hash(&self.config_mac_key, settings).as_bytes()
    }

    /// Whether the config's `settings` and its `mac` are the ones of this key's
    /// repository: a full key checks the MAC; a write-only key, which cannot, compares
    /// the settings with the hash it was made with (so the MAC is not even needed).
    pub fn vouches_for(&self, settings: &[u8], mac: Option<&str>) -> bool {
        match &self.keyring.role {
            Role::Full { .. } => mac == Some(hex::encode(self.config_mac(settings)).as_str()),
            Role::Writer { .. } => {
                self.secrets.settings_hash == Some(*blake3::hash(settings).as_bytes())
            }
        }
    }

    /// Encrypts and authenticates `plaintext` as `purpose`: `nonce || ciphertext || tag`.
    /// Format 2 on pads the plaintext first (see [`padme`]; blobs only before [`GRID_FORMAT`]).
    pub fn seal(&self, purpose: Purpose, plaintext: &[u8]) -> Vec<u8> {
        self.seal_parts(purpose, &[plaintext])
    }

    /// Seals the concatenation of `parts`, without first copying them into one buffer.
    pub fn seal_parts(&self, purpose: Purpose, parts: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        self.seal_parts_into(purpose, parts, &mut out);
        out
    }

    /// [`seal_parts`](Self::seal_parts) into `out` (emptied first), reusing its memory.
    pub fn seal_parts_into(&self, purpose: Purpose, parts: &[&[u8]], out: &mut Vec<u8>) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        out.clear();
        out.reserve(self.sealed_len_of(purpose.is_blob(), len));
        out.resize(self.seal_headroom(), 0);
        for p in parts {
            out.extend_from_slice(p);
        }
        self.seal_in_place(purpose, out);
    }

    /// Bytes a sealed object holds before its plaintext (who sealed it, then the nonce):
    /// the room [`seal_in_place`](Self::seal_in_place) expects at the front of its buffer.
    pub fn seal_headroom(&self) -> usize {
        match self.secrets.format {
            1 => NONCE_LEN,
            _ => self.key_reference_len() + self.cipher.nonce_and_tag_len().0,
        }
    }

    /// Seals the plaintext `buf` holds after [`seal_headroom`](Self::seal_headroom) bytes
    /// (whatever those are), in place: `buf` becomes what [`seal`](Self::seal) returns
    /// for that plaintext. A chunk is sealed in the buffer it was copied into, with no
    /// second buffer to fault in and fill (a cold first backup of the mixed corpus took
    /// 50,000 page faults so, 88,000 with one: docs/BENCHMARKS.md).
    ///
    /// # Panics
    /// If `buf` is shorter than the headroom.
    pub fn seal_in_place(&self, purpose: Purpose, buf: &mut Vec<u8>) {
        let head = self.seal_headroom();
        assert!(buf.len() >= head, "no room before the plaintext to seal");
        let format = self.secrets.format;
        if format == 1 {
            return seal_xchacha(&self.secrets.data_key, b"", buf, 0);
        }
        let mut at = 0;
        if let Some((reference, len)) = self.key_reference() {
            buf[..len].copy_from_slice(&reference[..len]);
            at = len;
        }
        let len = buf.len() - head;
        let padded = padded_len(format, purpose.is_blob(), len);
        buf.resize(head + padded - 4, 0);
        buf.extend_from_slice(&(len as u32).to_le_bytes());
        let (ad, ad_len) = purpose.associated_data(format);
        let key = &self.subkeys[purpose.subkey()];
        match self.cipher {
            Cipher::XChaCha20Poly1305 => seal_xchacha(key, &ad[..ad_len], buf, at),
            Cipher::Aegis256 => seal_aegis(key, &ad[..ad_len], buf, at),
        }
    }

    /// The length of a sealed object other than a blob whose plaintext is `len` bytes long.
    pub fn sealed_len(&self, len: usize) -> usize {
        self.sealed_len_of(false, len)
    }

    /// The length of a sealed blob whose plaintext is `len` bytes long.
    pub fn sealed_blob_len(&self, len: usize) -> usize {
        self.sealed_len_of(true, len)
    }

    fn sealed_len_of(&self, blob: bool, len: usize) -> usize {
        match self.secrets.format {
            1 => len + SEAL_OVERHEAD,
            format => {
                self.key_reference_len() + padded_len(format, blob, len) + self.cipher.overhead()
            }
        }
    }

    /// Opens what [`seal`](Self::seal) sealed as `purpose`; anything else fails.
    pub fn open(&self, purpose: Purpose, sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
        let (keys, skip) = self.subkeys_for(sealed)?;
        let sealed = &sealed[skip..];
        let cipher = self.sealing_cipher();
        let (nonce_len, tag_len) = cipher.nonce_and_tag_len();
        if sealed.len() < nonce_len + tag_len {
            return Err(OpenError);
        }
        // The ciphertext alone is copied, and decrypted in that copy.
        let mut plain = sealed[nonce_len..sealed.len() - tag_len].to_vec();
        let len = self.decrypt(
            keys.get(purpose),
            purpose,
            &sealed[..nonce_len],
            &mut plain,
            &sealed[sealed.len() - tag_len..],
        )?;
        plain.truncate(len);
        Ok(plain)
    }

    /// Opens `sealed` where it lies, decrypting it in place, and returns the plaintext
    /// within it: no allocation and no copy (restore opens every blob this way).
    pub fn open_in_place<'a>(
        &self,
        purpose: Purpose,
        sealed: &'a mut [u8],
    ) -> Result<&'a [u8], OpenError> {
        let (keys, skip) = self.subkeys_for(sealed)?;
        let sealed = &mut sealed[skip..];
        let (nonce_len, tag_len) = self.sealing_cipher().nonce_and_tag_len();
        if sealed.len() < nonce_len + tag_len {
            return Err(OpenError);
        }
        let (nonce, rest) = sealed.split_at_mut(nonce_len);
        let (ciphertext, tag) = rest.split_at_mut(rest.len() - tag_len);
        let len = self.decrypt(keys.get(purpose), purpose, nonce, ciphertext, tag)?;
        Ok(&ciphertext[..len])
    }

    /// Format 1 seals as XChaCha20-Poly1305 (with the data key, no associated data).
    fn sealing_cipher(&self) -> Cipher {
        match self.secrets.format {
            1 => Cipher::XChaCha20Poly1305,
            _ => self.cipher,
        }
    }

    /// Decrypts `ciphertext` in place and returns the plaintext's length within it
    /// (format 2 strips its padding).
    fn decrypt(
        &self,
        key: &[u8; 32],
        purpose: Purpose,
        nonce: &[u8],
        ciphertext: &mut [u8],
        tag: &[u8],
    ) -> Result<usize, OpenError> {
        let format = self.secrets.format;
        if format == 1 {
            decrypt_xchacha(&self.secrets.data_key, b"", nonce, ciphertext, tag)?;
            return Ok(ciphertext.len());
        }
        let (ad, ad_len) = purpose.associated_data(format);
        let ad = &ad[..ad_len];
        match self.cipher {
            Cipher::XChaCha20Poly1305 => decrypt_xchacha(key, ad, nonce, ciphertext, tag)?,
            Cipher::Aegis256 => {
                let nonce = nonce.try_into().map_err(|_| OpenError)?;
                let tag: &[u8; AEGIS_TAG_LEN] = tag.try_into().map_err(|_| OpenError)?;
                Aegis256::<AEGIS_TAG_LEN>::new(key, nonce)
                    .decrypt_in_place(ciphertext, tag, ad)
                    .map_err(|_| OpenError)?;
            }
        }
        let Some(len_at) = ciphertext.len().checked_sub(4) else {
            return Err(OpenError);
        };
        let len = u32::from_le_bytes(ciphertext[len_at..].try_into().expect("4 bytes")) as usize;
        if len > len_at {
            return Err(OpenError);
        }
        Ok(len)
    }
}

impl Cipher {
    fn nonce_and_tag_len(self) -> (usize, usize) {
        match self {
            Cipher::XChaCha20Poly1305 => (NONCE_LEN, TAG_LEN),
            Cipher::Aegis256 => (AEGIS_NONCE_LEN, AEGIS_TAG_LEN),
        }
    }
}

/// The ciphertext length of `len` bytes of plaintext and its 4-byte length (format 2 on):
/// Padmé-padded, except blobs from [`GRID_FORMAT`] on, whose packs are padded instead.
fn padded_len(format: u32, blob: bool, len: usize) -> usize {
    if blob && format >= GRID_FORMAT {
        len + 4
    } else {
        padme(len as u64 + 4) as usize
    }
}

/// Padmé (Nikitin et al., "Reducing metadata leakage from encrypted files and
/// communication with PURBs", 2019): rounds `len` up so that only O(log log len) bits of
/// it show, at most 12% more (about 1.5% for a 1 MiB blob, 3% for a 2 KiB tree).
pub fn padme(len: u64) -> u64 {
    if len < 2 {
        return len;
    }
    let e = 63 - len.leading_zeros(); // floor(log2 len)
    let s = 32 - e.leading_zeros(); // floor(log2 e) + 1
    let mask = (1u64 << (e - s)) - 1;
    (len + mask) & !mask
}

/// Seals `parts` under `key` with no associated data and no padding (format 1, key files).
pub(crate) fn seal_with(key: &[u8; 32], parts: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![0; NONCE_LEN];
    for p in parts {
        out.extend_from_slice(p);
    }
    seal_xchacha(key, b"", &mut out, 0);
    out
}

/// Opens what [`seal_with`] sealed.
pub(crate) fn open_with(key: &[u8; 32], sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
    if sealed.len() < SEAL_OVERHEAD {
        return Err(OpenError);
    }
    let (nonce, rest) = sealed.split_at(NONCE_LEN);
    let (ciphertext, tag) = rest.split_at(rest.len() - TAG_LEN);
    let mut plain = ciphertext.to_vec();
    decrypt_xchacha(key, b"", nonce, &mut plain, tag)?;
    Ok(plain)
}

/// Encrypts `buf[at + NONCE_LEN..]` in place under a fresh nonce, written into the
/// `NONCE_LEN` bytes at `at`, and appends the tag.
fn seal_xchacha(key: &[u8; 32], ad: &[u8], buf: &mut Vec<u8>, at: usize) {
    let mut nonce = [0u8; NONCE_LEN];
    rand::rngs::OsRng.fill_bytes(&mut nonce);
    buf[at..at + NONCE_LEN].copy_from_slice(&nonce);
    let tag = XChaCha20Poly1305::new(Key::from_slice(key))
        .encrypt_in_place_detached(XNonce::from_slice(&nonce), ad, &mut buf[at + NONCE_LEN..])
        .expect("XChaCha20-Poly1305 encrypts any length a pack can hold");
    buf.extend_from_slice(&tag);
}

fn decrypt_xchacha(
    key: &[u8; 32],
    ad: &[u8],
    nonce: &[u8],
    ciphertext: &mut [u8],
    tag: &[u8],
) -> Result<(), OpenError> {
    if nonce.len() != NONCE_LEN || tag.len() != TAG_LEN {
        return Err(OpenError);
    }
    XChaCha20Poly1305::new(Key::from_slice(key))
        .decrypt_in_place_detached(
            XNonce::from_slice(nonce),
            ad,
            ciphertext,
            Tag::from_slice(tag),
        )
        .map_err(|_| OpenError)
}

/// [`seal_xchacha`] with AEGIS-256.
fn seal_aegis(key: &[u8; 32], ad: &[u8], buf: &mut Vec<u8>, at: usize) {
    let mut nonce = [0u8; AEGIS_NONCE_LEN];
    rand::rngs::OsRng.fill_bytes(&mut nonce);
    buf[at..at + AEGIS_NONCE_LEN].copy_from_slice(&nonce);
    let tag = Aegis256::<AEGIS_TAG_LEN>::new(key, &nonce)
        .encrypt_in_place(&mut buf[at + AEGIS_NONCE_LEN..], ad);
    buf.extend_from_slice(&tag);
}

mod b64_option {

    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<[u8; 32]>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => super::b64_array::serialize(v, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[u8; 32]>, D::Error> {
        super::b64_array::deserialize(d).map(Some)
    }
}

mod b64_array {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&B64.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let s = Zeroizing::new(String::deserialize(d)?);
        let v = Zeroizing::new(B64.decode(s.as_bytes()).map_err(serde::de::Error::custom)?);
        v.as_slice()
            .try_into()
            .map_err(|_| serde::de::Error::custom("a key must be 32 bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SNAP: Purpose = Purpose::Snapshot;

    fn key_with(cipher: Cipher) -> MasterKey {
        let mut key = MasterKey::generate();
        key.use_cipher(cipher).unwrap();
        key
    }

    /// A key of every kind that seals: format 1, formats 2 to 4 with each cipher, and a
    /// write-only key of the newest format.
    fn every_kind_of_key() -> Vec<MasterKey> {
        let mut keys = vec![MasterKey::generate_for(1)];
        for format in [2, 3, 4] {
            for cipher in [Cipher::XChaCha20Poly1305, Cipher::Aegis256] {
                let mut key = MasterKey::generate_for(format);
                key.use_cipher(cipher).unwrap();
                keys.push(key);
            }
        }
        keys.push(writer_of(&key_with(Cipher::Aegis256)).1);
        keys
    }

    /// Each kind of key that seals, with the key that opens what it sealed: itself, or for
    /// a write-only key, the full key it was made from.
    fn sealers_and_openers() -> Vec<(MasterKey, MasterKey)> {
        let (full, writer) = writer_of(&key_with(Cipher::Aegis256));
        let mut pairs: Vec<(MasterKey, MasterKey)> = every_kind_of_key()
            .into_iter()
            .filter(|k| !k.is_write_only())
            .map(|k| (k.clone(), k))
            .collect();
        pairs.push((writer, full));
        pairs
    }

    /// A full key bound to a repository, and a write-only key made from it.
    fn writer_of(full: &MasterKey) -> (MasterKey, MasterKey) {
        let full = full.clone();
        full.bind_repository("repo").unwrap();
        let writer = full.write_only(b"settings").unwrap();
        writer.bind_repository("repo").unwrap();
        (full, writer)
    }

    /// Format 4 moves the padding from blobs to packs; every other object keeps Padmé.
    #[test]
    fn blobs_are_padded_before_format_4_and_sealed_at_their_size_from_it() {
        let id = BlobId([3; 32]);
        let plain = vec![9u8; 1_000_000];
        for key in every_kind_of_key() {
            let blob = key.seal(Purpose::DataBlob(id), &plain);
            let snapshot = key.seal(SNAP, &plain);
            assert_eq!(blob.len(), key.sealed_blob_len(plain.len()));
            assert_eq!(snapshot.len(), key.sealed_len(plain.len()));
            assert_eq!(key.open(Purpose::DataBlob(id), &blob).unwrap(), plain);
            let padded = padme(1_000_004) as usize;
            let expected = match key.format() {
                1 => plain.len(),
                2 | 3 => padded,
                _ => plain.len() + 4,
            };
            let overhead = match key.format() {
                1 => SEAL_OVERHEAD,
                _ => key.sealed_len(0) - padme(4) as usize,
            };
            assert_eq!(blob.len() - overhead, expected, "format {}", key.format());
            if key.format() > 1 {
                assert_eq!(snapshot.len() - overhead, padded, "format {}", key.format());
            }
        }
    }

    #[test]
    fn sealed_data_opens_to_the_plaintext_in_both_formats_and_ciphers() {
        for key in every_kind_of_key() {
            let mut sealed = key.seal(SNAP, b"hello");
            assert_eq!(sealed.len(), key.sealed_len(5));
            assert_eq!(key.open(SNAP, &sealed).unwrap(), b"hello");
            assert_eq!(key.open_in_place(SNAP, &mut sealed).unwrap(), b"hello");
        }
        assert_eq!(MasterKey::generate_for(1).sealed_len(5), 5 + SEAL_OVERHEAD);
        assert_eq!(
            key_with(Cipher::Aegis256).sealed_len(5),
            1 + padme(9) as usize + 64,
            "format 3: who sealed it, then the sealed bytes"
        );
        let mut two = MasterKey::generate_for(2);
        two.use_cipher(Cipher::Aegis256).unwrap();
        assert_eq!(two.sealed_len(5), padme(9) as usize + 64);
    }

    /// Sealed in place after headroom holding anything, a blob is what `seal` makes of it:
    /// its length is the sealed length and it opens to the plaintext, for every kind of
    /// key, a write-only one included.
    #[test]
    fn a_blob_sealed_in_place_opens_as_one_sealed_by_copy() {
        let plain = vec![5; 1000];
        let id = BlobId([9; 32]);
        for (sealer, opener) in sealers_and_openers() {
            let mut buf = vec![0xAA; sealer.seal_headroom()];
            buf.extend_from_slice(&plain);
            sealer.seal_in_place(Purpose::DataBlob(id), &mut buf);
            assert_eq!(buf.len(), sealer.sealed_blob_len(plain.len()));
            assert_eq!(buf.len(), sealer.seal(Purpose::DataBlob(id), &plain).len());
            assert_eq!(opener.open(Purpose::DataBlob(id), &buf).unwrap(), plain);
            // Format 1 binds nothing to the blob's id.
            let other = opener.open(Purpose::DataBlob(BlobId([8; 32])), &buf);
            assert_eq!(other.is_err(), sealer.secrets.format >= 2);
        }
    }

    /// Parts are sealed as their concatenation, into a buffer that held something else,
    /// whatever their lengths (these cross AEGIS-256's 32-byte blocks mid-part).
    #[test]
    fn parts_seal_as_their_concatenation_into_a_used_buffer() {
        let parts: [&[u8]; 4] = [&[1], &[2; 17], &[], &[3; 100]];
        let whole = parts.concat();
        for (sealer, opener) in sealers_and_openers() {
            let mut out = vec![0xAA; 300];
            sealer.seal_parts_into(SNAP, &parts, &mut out);
            assert_eq!(
                out.len(),
                sealer.sealed_len(whole.len()),
                "{:?}",
                sealer.cipher
            );
            assert_eq!(
                opener.open(SNAP, &out).unwrap(),
                whole,
                "{:?}",
                sealer.cipher
            );
        }
    }

    /// Only a full key's own seal of format 2 on proves a blob's id: format 1 has no
    /// associated data, and a writer names its blobs as it likes.
    #[test]
    fn only_a_full_keys_seal_from_format_2_on_binds_a_blobs_id() {
        let id = BlobId([7; 32]);
        for key in every_kind_of_key() {
            let sealed = key.seal(Purpose::DataBlob(id), b"chunk");
            let expected = key.secrets.format >= 2 && !key.is_write_only();
            assert_eq!(
                key.seal_binds_blob_id(&sealed),
                expected,
                "{:?}",
                key.cipher
            );
            if expected {
                let mut moved = sealed.clone();
                assert!(key
                    .open_in_place(Purpose::DataBlob(BlobId([8; 32])), &mut moved)
                    .is_err());
            }
        }
        let (full, writer) = writer_of(&key_with(Cipher::Aegis256));
        let by_writer = writer.seal(Purpose::DataBlob(id), b"chunk");
        assert!(!full.seal_binds_blob_id(&by_writer));
        assert!(full.seal_binds_blob_id(&full.seal(Purpose::DataBlob(id), b"chunk")));
    }

    /// A write-only key seals what only full keys of its repository open; it opens what it
    /// sealed itself and nothing else: not the repository key's objects, not another
    /// writer's, not its own objects once the process (and its random key) is gone.
    #[test]
    fn a_write_only_key_seals_for_full_keys_and_reads_nothing_of_others() {
        for cipher in [Cipher::XChaCha20Poly1305, Cipher::Aegis256] {
            let (full, writer) = writer_of(&key_with(cipher));
            assert!(writer.is_write_only() && !full.is_write_only());
            let by_writer = writer.seal(SNAP, b"from the laptop");
            assert!(
                full.sealed_by_writer(&by_writer) && !full.sealed_by_writer(&full.seal(SNAP, b"x"))
            );
            assert_eq!(by_writer.len(), writer.sealed_len(15));
            assert_eq!(full.open(SNAP, &by_writer).unwrap(), b"from the laptop");
            assert_eq!(writer.open(SNAP, &by_writer).unwrap(), b"from the laptop");
            let mut in_place = by_writer.clone();
            assert_eq!(
                full.open_in_place(SNAP, &mut in_place).unwrap(),
                b"from the laptop"
            );
            assert!(
                full.open(Purpose::Index, &by_writer).is_err(),
                "as another kind"
            );

            assert!(writer.open(SNAP, &full.seal(SNAP, b"x")).is_err());
            let (_, other_writer) = writer_of(&full);
            assert!(other_writer.open(SNAP, &by_writer).is_err());
            let material = serde_json::to_string(&writer).unwrap();
            let reloaded: MasterKey = serde_json::from_str(&material).unwrap();
            reloaded.bind_repository("repo").unwrap();
            assert!(
                reloaded.open(SNAP, &by_writer).is_err(),
                "a new process's key"
            );
            assert!(!material.contains("data_key"), "no data key: {material}");

            // A key of another repository, or the same key bound to another id, cannot
            // open the writer's envelope.
            let elsewhere = full.clone();
            let rebound = MasterKey::try_from(Secrets::from(elsewhere)).unwrap();
            rebound.bind_repository("another repo").unwrap();
            assert!(rebound.open(SNAP, &by_writer).is_err());
            assert!(key_with(cipher).open(SNAP, &by_writer).is_err());

            // Ids and cut points agree, so what a writer stores deduplicates.
            assert_eq!(writer.blob_id(b"chunk"), full.blob_id(b"chunk"));
            assert_eq!(writer.chunker_gear(), full.chunker_gear());
            assert!(writer.vouches_for(b"settings", None));
            assert!(!writer.vouches_for(
                b"settingz",
                Some(&hex::encode(full.config_mac(b"settingz")))
            ));
            assert!(writer.write_only(b"settings").is_err());
        }
        let old = MasterKey::generate_for(2);
        assert!(old.write_only(b"s").unwrap_err().contains("format 3"));
    }

    /// The cipher is the repository's: a key sealing with one cipher opens nothing sealed
    /// with the other (subkeys differ too), and format 1 refuses AEGIS.
    #[test]
    fn the_two_ciphers_do_not_open_each_others_objects() {
        let mut key = key_with(Cipher::Aegis256);
        let aegis = key.seal(SNAP, b"secret");
        key.use_cipher(Cipher::XChaCha20Poly1305).unwrap();
        let chacha = key.seal(SNAP, b"secret");
        assert!(key.open(SNAP, &aegis).is_err());
        key.use_cipher(Cipher::Aegis256).unwrap();
        assert!(key.open(SNAP, &chacha).is_err());
        assert_eq!(key.open(SNAP, &aegis).unwrap(), b"secret");
        assert!(MasterKey::generate_for(1)
            .use_cipher(Cipher::Aegis256)
            .is_err());
        assert_eq!("aegis-256".parse::<Cipher>(), Ok(Cipher::Aegis256));
        assert!("aes-128-ecb".parse::<Cipher>().is_err());
    }

    #[test]
    fn any_flipped_bit_is_rejected() {
        for key in every_kind_of_key() {
            let sealed = key.seal(SNAP, b"some secret bytes");
            for i in 0..sealed.len() {
                let mut bad = sealed.clone();
                bad[i] ^= 0x01;
                assert!(
                    key.open(SNAP, &bad).is_err(),
                    "flip at byte {i} went unnoticed"
                );
                assert!(key.open_in_place(SNAP, &mut bad).is_err(), "in place, {i}");
            }
            assert!(key.open(SNAP, &sealed[..sealed.len() - 1]).is_err());
            assert!(key.open(SNAP, &sealed[..10]).is_err());
        }
    }

    #[test]
    fn another_key_cannot_open() {
        let sealed = MasterKey::generate().seal(SNAP, b"x");
        assert!(MasterKey::generate().open(SNAP, &sealed).is_err());
    }

    /// The format 1 finding: one key and no associated data let a data blob (`tag 0 ||
    /// chunk`, chosen by whoever writes a file into the backup set) open as a snapshot.
    #[test]
    fn no_object_opens_as_another_kind_and_a_blob_only_under_its_id() {
        for cipher in [Cipher::XChaCha20Poly1305, Cipher::Aegis256] {
            no_object_opens_as_another_kind_with(key_with(cipher));
        }
        // Format 1 had no such separation: kept readable, not written.
        let old = MasterKey::generate_for(1);
        let blob = old.seal(Purpose::DataBlob(old.blob_id(b"chunk")), b"x");
        assert!(old.open(Purpose::Snapshot, &blob).is_ok());
    }

    fn no_object_opens_as_another_kind_with(key: MasterKey) {
        let id = key.blob_id(b"chunk");
        let other = key.blob_id(b"other");
        let all = [
            Purpose::DataBlob(id),
            Purpose::TreeBlob(id),
            Purpose::DataBlob(other),
            Purpose::PackHeader,
            Purpose::Index,
            Purpose::Snapshot,
            Purpose::Trash,
            Purpose::Session,
        ];
        for sealed_as in all {
            let sealed = key.seal(sealed_as, b"\x00{\"time\": \"2099-01-01T00:00:00Z\"}");
            for opened_as in all {
                assert_eq!(
                    key.open(opened_as, &sealed).is_ok(),
                    sealed_as == opened_as,
                    "sealed as {sealed_as:?}, opened as {opened_as:?}"
                );
            }
        }
    }

    #[test]
    fn padding_hides_exact_sizes_and_costs_little() {
        assert_eq!(padme(1_000_000), 1_015_808); // 31 * 32 KiB
        assert_eq!(padme(100), 104);
        for key in [
            key_with(Cipher::XChaCha20Poly1305),
            key_with(Cipher::Aegis256),
        ] {
            for len in [0usize, 1, 3, 4, 100, 2000, 70_000, 1 << 20, 5_000_001] {
                let padded = padme(len as u64 + 4);
                assert!(padded >= len as u64 + 4 && padded <= (len as u64 + 4) * 112 / 100 + 1);
                let plain = vec![7u8; len];
                let sealed = key.seal(SNAP, &plain);
                assert_eq!(sealed.len(), 1 + padded as usize + key.cipher().overhead());
                assert_eq!(key.open(SNAP, &sealed).unwrap(), plain);
            }
        }
        let key = MasterKey::generate();
        // Neighbouring sizes share a sealed size.
        assert_eq!(
            key.seal(SNAP, &[0; 70_000]).len(),
            key.seal(SNAP, &[0; 70_100]).len()
        );
    }

    #[test]
    fn a_key_sharing_ids_names_blobs_alike_but_encrypts_apart() {
        for format in [1, 2] {
            let a = MasterKey::generate_for(format);
            let b = MasterKey::sharing_ids_with(&a);
            assert_eq!(b.format(), KEY_FORMAT);
            assert!(b.shares_ids_with(&a) && !MasterKey::generate().shares_ids_with(&a));
            assert_eq!(a.blob_id(b"chunk"), b.blob_id(b"chunk"));
            assert_eq!(a.chunker_gear(), b.chunker_gear());
            assert!(b.open(SNAP, &a.seal(SNAP, b"secret")).is_err());
        }
    }

    #[test]
    fn blob_ids_depend_on_the_id_key() {
        let a = MasterKey::generate();
        let b = MasterKey::generate();
        assert_eq!(a.blob_id(b"data"), a.blob_id(b"data"));
        assert_ne!(a.blob_id(b"data"), b.blob_id(b"data"));
        let mut h = a.blob_hasher();
        h.update(b"da");
        h.update(b"ta");
        assert_eq!(BlobId(*h.finalize().as_bytes()), a.blob_id(b"data"));
    }

    fn cuts(gear: Gear, data: &[u8]) -> Vec<(usize, usize)> {
        let params = cairn_chunker::ChunkerParams::new(2048, 8192, 32768).unwrap();
        cairn_chunker::chunk_slice(data, params, gear)
    }

    /// The format 1 finding: bits 48-63 of the 64-bit seed never move a cut point, so the
    /// seed has 48 effective bits. Every bit of format 2's chunker key moves them.
    #[test]
    fn every_bit_of_the_chunker_key_moves_cut_points() {
        use rand::{rngs::StdRng, SeedableRng};
        let mut data = vec![0u8; 400_000];
        StdRng::seed_from_u64(3).fill_bytes(&mut data);
        let seed = 0x0123_4567_89ab_cdef_u64;
        let base = cuts(Gear::from(seed), &data);
        assert!(
            base.iter().any(|&(_, len)| len < 32768),
            "content-defined cuts"
        );
        assert_ne!(cuts(Gear::from(seed ^ (1 << 20)), &data), base);
        for bit in 48..64 {
            assert_eq!(
                cuts(Gear::from(seed ^ (1 << bit)), &data),
                base,
                "bit {bit}"
            );
        }
        let key = MasterKey::generate();
        let base = cuts(key.chunker_gear(), &data);
        for bit in (0..256).step_by(17) {
            let mut secrets = key.secrets.clone();
            let mut k = secrets.chunker_key.expect("format 2");
            k[bit / 8] ^= 1 << (bit % 8);
            secrets.chunker_key = Some(k);
            let flipped = MasterKey::try_from(secrets).unwrap();
            assert_ne!(cuts(flipped.chunker_gear(), &data), base, "bit {bit}");
        }
    }

    #[test]
    fn key_material_round_trips_and_format_1_keys_still_read() {
        let key = MasterKey::generate();
        let json = serde_json::to_string(&key).unwrap();
        let back: MasterKey = serde_json::from_str(&json).unwrap();
        assert_eq!(back.format(), KEY_FORMAT);
        assert_eq!(back.open(SNAP, &key.seal(SNAP, b"x")).unwrap(), b"x");
        let v1 = r#"{"data_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                     "id_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","chunker_seed":5}"#;
        let old: MasterKey = serde_json::from_str(v1).unwrap();
        assert_eq!((old.format(), old.chunker_gear()), (1, Gear::from(5)));
        for bad in [
            r#"{"format":5,"data_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","id_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","chunker_seed":5}"#,
            r#"{"format":3,"kind":"write-only","id_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","chunker_seed":5}"#,
            r#"{"format":2,"kind":"write-only","id_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","chunker_seed":5,"recipient":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","settings_hash":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}"#,
            r#"{"format":3,"kind":"read-only","data_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","id_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","chunker_seed":5}"#,
            r#"{"format":1,"data_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","id_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}"#,
        ] {
            assert!(serde_json::from_str::<MasterKey>(bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod pinned {
    use super::*;

    /// The gear table is part of format 2: if its derivation changed, new backups would
    /// cut existing files differently and stop deduplicating against older snapshots,
    /// and nothing else would notice (the fixture test only restores). So the cut points
    /// of a known key over known bytes are pinned.
    #[test]
    fn a_known_key_cuts_known_bytes_where_it_always_did() {
        let json = r#"{"format":2,"data_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            "id_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            "chunker_key":"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="}"#;
        let key: MasterKey = serde_json::from_str(json).unwrap();
        let mut data = vec![0u8; 300_000];
        blake3::Hasher::new()
            .update(b"pinned input")
            .finalize_xof()
            .fill(&mut data);
        let params = cairn_chunker::ChunkerParams::new(2048, 8192, 32768).unwrap();
        let cuts = cairn_chunker::chunk_slice(&data, params, key.chunker_gear());
        let lengths: Vec<String> = cuts
            .iter()
            .take(6)
            .map(|(_, len)| len.to_string())
            .collect();
        assert_eq!(
            (cuts.len(), lengths.join(" ")),
            (PINNED_COUNT, PINNED_FIRST.to_string())
        );
    }

    const PINNED_COUNT: usize = 30;
    const PINNED_FIRST: &str = "9015 9855 9260 16692 14142 9079";
}

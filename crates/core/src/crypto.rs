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
    #[serde(with = "b64_array")]
    data_key: [u8; 32],
    #[serde(with = "b64_array")]
    id_key: [u8; 32],
    /// Format 1's chunker secret: XORed into fastcdc's public gear table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chunker_seed: Option<u64>,
    /// Format 2's: the whole gear table is derived from it.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "b64_option")]
    chunker_key: Option<[u8; 32]>,
}

fn format_1() -> u32 {
    1
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
}

impl TryFrom<Secrets> for MasterKey {
    type Error = String;

    fn try_from(secrets: Secrets) -> Result<Self, String> {
        match (secrets.format, secrets.chunker_seed, secrets.chunker_key) {
            (1, Some(_), None) | (2, Some(_), None) | (2, None, Some(_)) => {}
            (1 | 2, _, _) => return Err("the chunker secret is missing or doubled".into()),
            (n, _, _) => return Err(format!("the key is for repository format {n}, unknown")),
        }
        Ok(MasterKey {
            subkeys: subkeys(&secrets.data_key, Cipher::XChaCha20Poly1305),
            config_mac_key: blake3::derive_key(CONFIG_MAC_CONTEXT, &secrets.data_key),
            cipher: Cipher::XChaCha20Poly1305,
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
pub const KEY_FORMAT: u32 = 2;

impl MasterKey {
    /// A new random key for a repository of the newest format.
    pub fn generate() -> Self {
        Self::generate_for(KEY_FORMAT)
    }

    /// A new random key for a repository of `format` (1 or 2): format 1 only to make old
    /// repositories in tests.
    ///
    /// # Panics
    ///
    /// On a format other than 1 or 2.
    pub fn generate_for(format: u32) -> Self {
        let mut rng = rand::rngs::OsRng;
        let mut secrets = Secrets {
            format,
            data_key: [0; 32],
            id_key: [0; 32],
            chunker_seed: None,
            chunker_key: None,
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
        Self::try_from(secrets).expect("formats 1 and 2 make valid keys")
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
        self.subkeys = subkeys(&self.secrets.data_key, cipher);
        self.cipher = cipher;
        Ok(())
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

    /// Encrypts and authenticates `plaintext` as `purpose`: `nonce || ciphertext || tag`.
    /// Format 2 pads the plaintext first (see [`padme`]).
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
        let format = self.secrets.format;
        if format == 1 {
            return seal_ad(&self.secrets.data_key, b"", parts, None, out);
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let (ad, ad_len) = purpose.associated_data(format);
        let padded = padme(len as u64 + 4) as usize;
        let key = &self.subkeys[purpose.subkey()];
        match self.cipher {
            Cipher::XChaCha20Poly1305 => seal_ad(key, &ad[..ad_len], parts, Some(padded), out),
            Cipher::Aegis256 => seal_aegis(key, &ad[..ad_len], parts, padded, out),
        }
    }

    /// The length of a sealed object whose plaintext is `len` bytes long.
    pub fn sealed_len(&self, len: usize) -> usize {
        match self.secrets.format {
            1 => len + SEAL_OVERHEAD,
            _ => padme(len as u64 + 4) as usize + self.cipher.overhead(),
        }
    }

    /// Opens what [`seal`](Self::seal) sealed as `purpose`; anything else fails.
    pub fn open(&self, purpose: Purpose, sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
        let cipher = self.sealing_cipher();
        let (nonce_len, tag_len) = cipher.nonce_and_tag_len();
        if sealed.len() < nonce_len + tag_len {
            return Err(OpenError);
        }
        // The ciphertext alone is copied, and decrypted in that copy.
        let mut plain = sealed[nonce_len..sealed.len() - tag_len].to_vec();
        let len = self.decrypt(
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
        let (nonce_len, tag_len) = self.sealing_cipher().nonce_and_tag_len();
        if sealed.len() < nonce_len + tag_len {
            return Err(OpenError);
        }
        let (nonce, rest) = sealed.split_at_mut(nonce_len);
        let (ciphertext, tag) = rest.split_at_mut(rest.len() - tag_len);
        let len = self.decrypt(purpose, nonce, ciphertext, tag)?;
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
        let (key, ad) = (&self.subkeys[purpose.subkey()], &ad[..ad_len]);
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
    let mut out = Vec::new();
    seal_ad(key, b"", parts, None, &mut out);
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

/// Seals the concatenation of `parts` bound to `ad` into `out`. With `pad_to`, the
/// plaintext is first padded to that length with zeros ending in its own length (`u32le`).
fn seal_ad(key: &[u8; 32], ad: &[u8], parts: &[&[u8]], pad_to: Option<usize>, out: &mut Vec<u8>) {
    let cipher = XChaCha20Poly1305::new(Key::from_slice(key));
    let mut nonce = [0u8; NONCE_LEN];
    rand::rngs::OsRng.fill_bytes(&mut nonce);
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let padded = pad_to.unwrap_or(len);
    out.clear();
    out.reserve(padded + SEAL_OVERHEAD);
    out.extend_from_slice(&nonce);
    for p in parts {
        out.extend_from_slice(p);
    }
    if pad_to.is_some() {
        out.resize(NONCE_LEN + padded - 4, 0);
        out.extend_from_slice(&(len as u32).to_le_bytes());
    }
    let tag = cipher
        .encrypt_in_place_detached(XNonce::from_slice(&nonce), ad, &mut out[NONCE_LEN..])
        .expect("XChaCha20-Poly1305 encrypts any length a pack can hold");
    out.extend_from_slice(&tag);
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

/// Seals the concatenation of `parts`, padded to `padded` bytes (its length last, as
/// [`seal_ad`] pads), with AEGIS-256: `nonce || ciphertext || tag`.
fn seal_aegis(key: &[u8; 32], ad: &[u8], parts: &[&[u8]], padded: usize, out: &mut Vec<u8>) {
    let mut nonce = [0u8; AEGIS_NONCE_LEN];
    rand::rngs::OsRng.fill_bytes(&mut nonce);
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.clear();
    out.reserve(AEGIS_NONCE_LEN + padded + AEGIS_TAG_LEN);
    out.extend_from_slice(&nonce);
    for p in parts {
        out.extend_from_slice(p);
    }
    out.resize(AEGIS_NONCE_LEN + padded - 4, 0);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    let tag = Aegis256::<AEGIS_TAG_LEN>::new(key, &nonce)
        .encrypt_in_place(&mut out[AEGIS_NONCE_LEN..], ad);
    out.extend_from_slice(&tag);
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

    /// A key of every kind that seals: format 1, and format 2 with each cipher.
    fn every_kind_of_key() -> [MasterKey; 3] {
        [
            MasterKey::generate_for(1),
            key_with(Cipher::XChaCha20Poly1305),
            key_with(Cipher::Aegis256),
        ]
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
            padme(9) as usize + 64
        );
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
                assert_eq!(sealed.len(), padded as usize + key.cipher().overhead());
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
            assert_eq!(b.format(), 2);
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
        assert_eq!(back.format(), 2);
        assert_eq!(back.open(SNAP, &key.seal(SNAP, b"x")).unwrap(), b"x");
        let v1 = r#"{"data_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                     "id_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","chunker_seed":5}"#;
        let old: MasterKey = serde_json::from_str(v1).unwrap();
        assert_eq!((old.format(), old.chunker_gear()), (1, Gear::from(5)));
        for bad in [
            r#"{"format":3,"data_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","id_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","chunker_seed":5}"#,
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

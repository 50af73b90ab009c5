//! Encryption and keyed hashing: the repository's master key, sealing of every stored
//! object with XChaCha20-Poly1305, and key files that wrap the master key with a key
//! derived from the user's password by Argon2id.
//!
//! The id key (naming blobs) and the data key (sealing them) are separate secrets, so a
//! later version can hand out write-only keys without revealing how to name or read data.
//! Nothing here does I/O.

use argon2::{Algorithm, Argon2, Params, Version};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{Key, Tag, XChaCha20Poly1305, XNonce};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::id::BlobId;

const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
/// Bytes a sealed object has beyond its plaintext.
pub const SEAL_OVERHEAD: usize = NONCE_LEN + TAG_LEN;

/// Sealed data that does not open: tampered, truncated, or sealed with another key.
#[derive(Debug, thiserror::Error)]
#[error("Authentication failed (the bytes were changed, truncated, or sealed with another key)")]
pub struct OpenError;

/// The repository's secrets. Zeroed when dropped.
#[derive(Clone, Zeroize, ZeroizeOnDrop, Serialize, Deserialize)]
pub struct MasterKey {
    #[serde(with = "b64_array")]
    data_key: [u8; 32],
    #[serde(with = "b64_array")]
    id_key: [u8; 32],
    /// Keys the chunker's gear table, so chunk boundaries do not reveal known files.
    chunker_seed: u64,
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl MasterKey {
    pub fn generate() -> Self {
        let mut rng = rand::rngs::OsRng;
        let mut key = MasterKey {
            data_key: [0; 32],
            id_key: [0; 32],
            chunker_seed: rng.next_u64(),
        };
        rng.fill_bytes(&mut key.data_key);
        rng.fill_bytes(&mut key.id_key);
        key
    }

    /// A new key that names blobs and cuts chunks exactly as `other` does, with its own
    /// encryption key: a repository made with it deduplicates with `other`'s, and
    /// copying between the two sends only missing blobs, found by id without reading.
    pub fn sharing_ids_with(other: &MasterKey) -> Self {
        let mut key = Self::generate();
        key.id_key = other.id_key;
        key.chunker_seed = other.chunker_seed;
        key
    }

    /// Whether blobs are named, and chunks cut, the same way under both keys.
    pub fn shares_ids_with(&self, other: &MasterKey) -> bool {
        self.id_key == other.id_key && self.chunker_seed == other.chunker_seed
    }

    /// The keyed BLAKE3 hash that names a blob.
    pub fn blob_id(&self, plaintext: &[u8]) -> BlobId {
        BlobId(*blake3::keyed_hash(&self.id_key, plaintext).as_bytes())
    }

    /// A hasher for blob ids over data that arrives in pieces.
    pub fn blob_hasher(&self) -> blake3::Hasher {
        blake3::Hasher::new_keyed(&self.id_key)
    }

    pub fn chunker_seed(&self) -> u64 {
        self.chunker_seed
    }

    /// Encrypts and authenticates: `nonce || ciphertext || tag`.
    pub fn seal(&self, plaintext: &[u8]) -> Vec<u8> {
        seal_with(&self.data_key, &[plaintext])
    }

    /// Seals the concatenation of `parts`, without first copying them into one buffer.
    pub fn seal_parts(&self, parts: &[&[u8]]) -> Vec<u8> {
        seal_with(&self.data_key, parts)
    }

    pub fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
        open_with(&self.data_key, sealed)
    }
}

fn seal_with(key: &[u8; 32], parts: &[&[u8]]) -> Vec<u8> {
    let cipher = XChaCha20Poly1305::new(Key::from_slice(key));
    let mut nonce = [0u8; NONCE_LEN];
    rand::rngs::OsRng.fill_bytes(&mut nonce);
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity(len + SEAL_OVERHEAD);
    out.extend_from_slice(&nonce);
    for p in parts {
        out.extend_from_slice(p);
    }
    let tag = cipher
        .encrypt_in_place_detached(XNonce::from_slice(&nonce), b"", &mut out[NONCE_LEN..])
        .expect("XChaCha20-Poly1305 encrypts any length a pack can hold");
    out.extend_from_slice(&tag);
    out
}

fn open_with(key: &[u8; 32], sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
    if sealed.len() < SEAL_OVERHEAD {
        return Err(OpenError);
    }
    let cipher = XChaCha20Poly1305::new(Key::from_slice(key));
    let (nonce, rest) = sealed.split_at(NONCE_LEN);
    let (ciphertext, tag) = rest.split_at(rest.len() - TAG_LEN);
    let mut buf = ciphertext.to_vec();
    cipher
        .decrypt_in_place_detached(
            XNonce::from_slice(nonce),
            b"",
            &mut buf,
            Tag::from_slice(tag),
        )
        .map_err(|_| OpenError)?;
    Ok(buf)
}

/// Argon2id cost parameters, stored in each key file so they can change over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KdfParams {
    pub memory_kib: u32,
    pub iterations: u32,
    pub parallelism: u32,
}

impl Default for KdfParams {
    /// 64 MiB, 3 passes and 4 lanes: RFC 9106's second recommended setting. The lanes are
    /// filled on all cores, which took the derivation from 0.24 to 0.16 s on 2 cores
    /// (one lane: the key files of repositories made before, still read as they are).
    fn default() -> Self {
        KdfParams {
            memory_kib: 64 * 1024,
            iterations: 3,
            parallelism: 4,
        }
    }
}

/// The stored form of a key file: the master key sealed under a password-derived key.
#[derive(Debug, Serialize, Deserialize)]
pub struct KeyFile {
    pub version: u32,
    pub created: jiff::Timestamp,
    pub host: String,
    pub kdf: String,
    pub params: KdfParams,
    pub salt: String,
    pub wrapped: String,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    #[error("Not a key file: {0}")]
    Malformed(String),
    #[error("Unsupported key derivation {0:?}")]
    UnknownKdf(String),
    #[error("The password does not open this key")]
    WrongPassword,
}

impl KeyFile {
    /// Wraps `key` under `password`.
    pub fn create(key: &MasterKey, password: &[u8], params: KdfParams, host: &str) -> Self {
        let mut salt = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut salt);
        let wrapping = derive(password, &salt, params).expect("default KDF parameters are valid");
        let plain = Zeroizing::new(serde_json::to_vec(key).expect("a key serializes"));
        KeyFile {
            version: 1,
            created: jiff::Timestamp::now(),
            host: host.to_string(),
            kdf: "argon2id".into(),
            params,
            salt: B64.encode(salt),
            wrapped: B64.encode(seal_with(&wrapping, &[plain.as_slice()])),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a key file serializes")
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyFileError> {
        serde_json::from_slice(bytes).map_err(|e| KeyFileError::Malformed(e.to_string()))
    }

    /// Unwraps the master key with `password`.
    pub fn open(&self, password: &[u8]) -> Result<MasterKey, KeyFileError> {
        if self.kdf != "argon2id" {
            return Err(KeyFileError::UnknownKdf(self.kdf.clone()));
        }
        let bad = |what: &str| KeyFileError::Malformed(what.to_string());
        // Key files are plaintext on storage: whoever can write there must not be able to
        // make opening one take terabytes or hours.
        let p = self.params;
        if !(8..=4 << 20).contains(&p.memory_kib)
            || !(1..=64).contains(&p.iterations)
            || !(1..=64).contains(&p.parallelism)
        {
            return Err(bad(&format!(
                "Argon2 costs out of range (memory {} KiB of at most 4 GiB, {} passes of at most 64, \
                 {} lanes of at most 64)",
                p.memory_kib, p.iterations, p.parallelism
            )));
        }
        let salt = B64
            .decode(&self.salt)
            .map_err(|_| bad("salt is not base64"))?;
        let wrapped = B64
            .decode(&self.wrapped)
            .map_err(|_| bad("wrapped key is not base64"))?;
        let wrapping = derive(password, &salt, self.params)?;
        let plain = Zeroizing::new(
            open_with(&wrapping, &wrapped).map_err(|_| KeyFileError::WrongPassword)?,
        );
        serde_json::from_slice(&plain).map_err(|e| KeyFileError::Malformed(e.to_string()))
    }
}

fn derive(password: &[u8], salt: &[u8], p: KdfParams) -> Result<Zeroizing<[u8; 32]>, KeyFileError> {
    let params = Params::new(p.memory_kib, p.iterations, p.parallelism, Some(32))
        .map_err(|e| KeyFileError::Malformed(format!("KDF parameters: {e}")))?;
    let mut out = Zeroizing::new([0u8; 32]);
    let blocks = params.block_count();
    let argon2 = Argon2::new(Algorithm::Argon2id, Version::V0x13, params);
    let done = match KdfMemory::map(blocks) {
        Some(memory) => argon2.hash_password_into_with_memory(password, salt, out.as_mut(), memory),
        None => argon2.hash_password_into(password, salt, out.as_mut()),
    };
    done.map_err(|e| KeyFileError::Malformed(format!("KDF: {e}")))?;
    Ok(out)
}

/// Argon2's memory mapped fresh from the kernel: its pages are zero, and each is first
/// touched by the lane that fills it, on all cores. The crate's own allocation
/// (`alloc_zeroed` of 64-byte-aligned blocks) has the calling thread zero all 64 MiB
/// before the derivation starts (perf of an unchanged backup: page faults and memset under
/// `derive` on the main thread, about 30 ms, then the lanes' 80 ms on both cores).
struct KdfMemory {
    blocks: std::ptr::NonNull<argon2::Block>,
    len: usize,
}

impl KdfMemory {
    fn map(len: usize) -> Option<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<argon2::Block>())?;
        if bytes == 0 {
            return None;
        }
        // SAFETY: a new private anonymous mapping, at an address the kernel chooses; the
        // result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let blocks = std::ptr::NonNull::new(p.cast())?;
        Some(KdfMemory { blocks, len })
    }
}

impl AsMut<[argon2::Block]> for KdfMemory {
    fn as_mut(&mut self) -> &mut [argon2::Block] {
        // SAFETY: the mapping holds `len` blocks, is page-aligned (more than a block's 64
        // bytes), zero-filled (a valid block: any bits are) and owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.blocks.as_ptr(), self.len) }
    }
}

impl Drop for KdfMemory {
    fn drop(&mut self) {
        let bytes = self.len * std::mem::size_of::<argon2::Block>();
        // SAFETY: unmaps exactly the mapping made in `map`, which nothing borrows now.
        unsafe { libc::munmap(self.blocks.as_ptr().cast(), bytes) };
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

    const FAST: KdfParams = KdfParams {
        memory_kib: 64,
        iterations: 1,
        parallelism: 1,
    };

    #[test]
    fn sealed_data_opens_to_the_plaintext() {
        let key = MasterKey::generate();
        let sealed = key.seal(b"hello");
        assert_eq!(sealed.len(), 5 + SEAL_OVERHEAD);
        assert_eq!(key.open(&sealed).unwrap(), b"hello");
    }

    #[test]
    fn any_flipped_bit_is_rejected() {
        let key = MasterKey::generate();
        let sealed = key.seal(b"some secret bytes");
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x01;
            assert!(key.open(&bad).is_err(), "flip at byte {i} went unnoticed");
        }
        assert!(key.open(&sealed[..sealed.len() - 1]).is_err());
        assert!(key.open(&sealed[..10]).is_err());
    }

    #[test]
    fn another_key_cannot_open() {
        let sealed = MasterKey::generate().seal(b"x");
        assert!(MasterKey::generate().open(&sealed).is_err());
    }

    #[test]
    fn a_key_sharing_ids_names_blobs_alike_but_encrypts_apart() {
        let a = MasterKey::generate();
        let b = MasterKey::sharing_ids_with(&a);
        assert!(b.shares_ids_with(&a) && !MasterKey::generate().shares_ids_with(&a));
        assert_eq!(a.blob_id(b"chunk"), b.blob_id(b"chunk"));
        assert_eq!(a.chunker_seed(), b.chunker_seed());
        assert!(b.open(&a.seal(b"secret")).is_err());
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

    #[test]
    fn key_file_opens_only_with_its_password() {
        let key = MasterKey::generate();
        let file = KeyFile::create(&key, b"correct horse", FAST, "host");
        let file = KeyFile::from_bytes(&file.to_bytes()).unwrap();
        let opened = file.open(b"correct horse").unwrap();
        assert_eq!(opened.blob_id(b"x"), key.blob_id(b"x"));
        assert!(matches!(
            file.open(b"wrong"),
            Err(KeyFileError::WrongPassword)
        ));
    }

    #[test]
    fn a_key_file_opens_with_the_lanes_it_was_made_with() {
        let key = MasterKey::generate();
        let four_lanes = KdfParams {
            parallelism: 4,
            ..FAST
        };
        let mut file = KeyFile::create(&key, b"pw", four_lanes, "host");
        assert_eq!(file.open(b"pw").unwrap().blob_id(b"x"), key.blob_id(b"x"));
        // The lanes are part of the derivation: read with one, the key does not open.
        file.params.parallelism = 1;
        assert!(matches!(file.open(b"pw"), Err(KeyFileError::WrongPassword)));
    }
}

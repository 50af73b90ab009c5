//! Encryption and keyed hashing: the repository's master key and the sealing of every
//! stored object with XChaCha20-Poly1305. Key files, which wrap the master key, are
//! [`crate::keyfile`]'s.
//!
//! The id key (naming blobs) and the data key (sealing them) are separate secrets, so a
//! later version can hand out write-only keys without revealing how to name or read data.
//! Nothing here does I/O.

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

pub(crate) fn seal_with(key: &[u8; 32], parts: &[&[u8]]) -> Vec<u8> {
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

pub(crate) fn open_with(key: &[u8; 32], sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
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
}

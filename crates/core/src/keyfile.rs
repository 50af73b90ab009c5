//! Key files: the master key wrapped by a key derived from a password with Argon2id.
//! Nothing here does I/O.

use argon2::{Algorithm, Argon2, Params, Version};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::crypto::{open_with, seal_with, MasterKey};

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

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: KdfParams = KdfParams {
        memory_kib: 64,
        iterations: 1,
        parallelism: 1,
    };

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

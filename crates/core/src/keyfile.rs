//! Key files: the master key wrapped by a key derived from a secret. Two derivations:
//!
//! - `argon2id`, for passwords people type: memory-hard stretching, costs stored in the
//!   file and accepted only up to [`MAX_MEMORY_KIB`] and [`MAX_WORK`].
//! - `blake3`, for the 256-bit random secrets cairn generates itself (the default
//!   repository's key file): a secret that cannot be guessed needs no stretching, so
//!   opening costs microseconds instead of 64 MiB and ~80 ms on every command. Only a
//!   [`RandomSecret`] writes or opens such a file; a typed password never does, so no
//!   password is ever protected by a fast hash, and a planted `blake3` file gets a typed
//!   password nowhere (it is skipped unread).
//!
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

/// The most memory a key file may ask Argon2 for: 1 GiB, 16 times our default and every
/// peer's (borg writes 64 MiB × 3 passes × 4 lanes, as we do; restic calibrates scrypt to
/// about 60 MiB and 0.5 s; kopia's names fix scrypt at 64 MiB). Key files are plaintext
/// on storage, so these costs are chosen by whoever can write there: before this cap,
/// 4 GiB × 64 passes, minutes and gigabytes per planted file and command.
pub const MAX_MEMORY_KIB: u32 = 1 << 20;
/// The most passes a key file may ask for.
pub const MAX_ITERATIONS: u32 = 16;
/// The most lanes (they split the memory, so they add threads, not work).
pub const MAX_PARALLELISM: u32 = 16;
/// The work of our default parameters, in KiB-passes (memory × passes), the unit every
/// cost here is counted in: about 80 ms on 2 cores.
pub const DEFAULT_WORK: u64 = 64 * 1024 * 3;
/// The most work one key file may ask for: 16 times the default (1 GiB × 3 passes, or
/// 256 MiB × 12), about 1.3 s on 2 cores.
pub const MAX_WORK: u64 = 16 * DEFAULT_WORK;

impl KdfParams {
    /// Memory × passes, in KiB-passes: what deriving with these parameters costs.
    pub fn work(&self) -> u64 {
        u64::from(self.memory_kib) * u64::from(self.iterations)
    }

    /// Whether a key file may ask for these costs (see [`MAX_MEMORY_KIB`]).
    pub fn within_caps(&self) -> bool {
        (8..=MAX_MEMORY_KIB).contains(&self.memory_kib)
            && (1..=MAX_ITERATIONS).contains(&self.iterations)
            && (1..=MAX_PARALLELISM).contains(&self.parallelism)
            && self.work() <= MAX_WORK
    }
}

/// A 256-bit secret cairn generated itself, in the text form it is stored in (64 lowercase
/// hex digits, the whole of the default repository's key file but its newline). Zeroed
/// when dropped.
#[derive(Clone)]
pub struct RandomSecret(Zeroizing<String>);

impl std::fmt::Debug for RandomSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RandomSecret(..)")
    }
}

impl RandomSecret {
    pub fn generate() -> Self {
        let mut bytes = Zeroizing::new([0u8; 32]);
        rand::rngs::OsRng.fill_bytes(bytes.as_mut());
        RandomSecret(Zeroizing::new(hex::encode(bytes.as_ref())))
    }

    /// The secret written as `text`, if it has the form cairn generates: 64 lowercase hex
    /// digits. Anything else (a password a person put in the file) is not one.
    pub fn from_text(text: &str) -> Option<Self> {
        let valid =
            text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        valid.then(|| RandomSecret(Zeroizing::new(text.to_string())))
    }

    /// The text to store, and to give as a password to older versions of cairn.
    pub fn as_text(&self) -> &str {
        &self.0
    }
}

/// How a key file derives its wrapping key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kdf {
    Argon2id(KdfParams),
    /// Keyed BLAKE3 of a [`RandomSecret`]: no stretching.
    Blake3,
}

impl std::fmt::Display for Kdf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kdf::Argon2id(p) => write!(
                f,
                "argon2id {} MiB x{} x{}",
                p.memory_kib / 1024,
                p.iterations,
                p.parallelism
            ),
            Kdf::Blake3 => f.write_str("blake3 (random key)"),
        }
    }
}

/// The stored form of a key file: the master key sealed under a key derived from a secret.
#[derive(Debug, Serialize, Deserialize)]
pub struct KeyFile {
    pub version: u32,
    pub created: jiff::Timestamp,
    pub host: String,
    /// `argon2id` or `blake3`.
    pub kdf: String,
    /// Argon2id's costs; absent for `blake3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<KdfParams>,
    pub salt: String,
    pub wrapped: String,
    /// `"write-only"` for a key that writes but cannot read (format 3). Shown by `key
    /// list` and nothing else: the wrapped part decides what the key is, so a changed
    /// hint misleads the list but opens nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
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
    #[error(
        "This key file is for a random key that cairn generated (kdf blake3); a typed \
         password never opens one"
    )]
    NotForPasswords,
}

/// The domain of the BLAKE3 derivation: never changes for `blake3` key files.
const BLAKE3_CONTEXT: &str = "cairn 2026-11 key file: wrapping key from a 256-bit random secret";

impl KeyFile {
    /// Wraps `key` under a typed `password`, stretched with Argon2id.
    pub fn create(key: &MasterKey, password: &[u8], params: KdfParams, host: &str) -> Self {
        let salt = new_salt();
        let wrapping = derive(password, &salt, params).expect("default KDF parameters are valid");
        Self::wrap(key, &wrapping, "argon2id", Some(params), &salt, host)
    }

    /// Wraps `key` under a secret cairn generated, with no stretching.
    pub fn create_for_random(key: &MasterKey, secret: &RandomSecret, host: &str) -> Self {
        let salt = new_salt();
        let wrapping = derive_blake3(secret, &salt);
        Self::wrap(key, &wrapping, "blake3", None, &salt, host)
    }

    fn wrap(
        key: &MasterKey,
        wrapping: &[u8; 32],
        kdf: &str,
        params: Option<KdfParams>,
        salt: &[u8],
        host: &str,
    ) -> Self {
        let plain = Zeroizing::new(serde_json::to_vec(key).expect("a key serializes"));
        KeyFile {
            version: 1,
            created: jiff::Timestamp::now(),
            host: host.to_string(),
            kdf: kdf.into(),
            params,
            salt: B64.encode(salt),
            wrapped: B64.encode(seal_with(wrapping, &[plain.as_slice()])),
            kind: key.is_write_only().then(|| "write-only".to_string()),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a key file serializes")
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyFileError> {
        serde_json::from_slice(bytes).map_err(|e| KeyFileError::Malformed(e.to_string()))
    }

    /// The derivation this file asks for, checked against the caps: a file asking for
    /// more is refused here, before any work.
    pub fn kdf(&self) -> Result<Kdf, KeyFileError> {
        match (self.kdf.as_str(), self.params) {
            ("blake3", None) => Ok(Kdf::Blake3),
            ("blake3", Some(_)) => Err(KeyFileError::Malformed(
                "a blake3 key file has no Argon2 parameters".into(),
            )),
            ("argon2id", None) => Err(KeyFileError::Malformed(
                "an argon2id key file without its parameters".into(),
            )),
            ("argon2id", Some(p)) if !p.within_caps() => Err(KeyFileError::Malformed(format!(
                "Argon2 costs out of range: memory {} KiB (at most {MAX_MEMORY_KIB}), {} passes \
                 (at most {MAX_ITERATIONS}), {} lanes (at most {MAX_PARALLELISM}), memory x passes \
                 at most {MAX_WORK} KiB; cairn never writes such a file, so someone else put it there",
                p.memory_kib, p.iterations, p.parallelism
            ))),
            ("argon2id", Some(p)) => Ok(Kdf::Argon2id(p)),
            (other, _) => Err(KeyFileError::UnknownKdf(other.to_string())),
        }
    }

    /// What opening this file costs, in KiB-passes (0 for `blake3`); `None` when it
    /// cannot be opened at all.
    pub fn work(&self) -> Option<u64> {
        match self.kdf().ok()? {
            Kdf::Argon2id(p) => Some(p.work()),
            Kdf::Blake3 => Some(0),
        }
    }

    /// Unwraps the master key with a typed `password`. `blake3` files are refused.
    pub fn open(&self, password: &[u8]) -> Result<MasterKey, KeyFileError> {
        match self.kdf()? {
            Kdf::Argon2id(p) => {
                let salt = self.salt()?;
                self.unwrap_with(&*derive(password, &salt, p)?)
            }
            Kdf::Blake3 => Err(KeyFileError::NotForPasswords),
        }
    }

    /// Unwraps the master key with a secret cairn generated: `blake3` files, and
    /// `argon2id` ones (which older versions wrote for the default repository, with the
    /// secret's text as the password).
    pub fn open_random(&self, secret: &RandomSecret) -> Result<MasterKey, KeyFileError> {
        match self.kdf()? {
            Kdf::Argon2id(_) => self.open(secret.as_text().as_bytes()),
            Kdf::Blake3 => {
                let salt = self.salt()?;
                self.unwrap_with(&derive_blake3(secret, &salt))
            }
        }
    }

    fn salt(&self) -> Result<Vec<u8>, KeyFileError> {
        B64.decode(&self.salt)
            .map_err(|_| KeyFileError::Malformed("salt is not base64".into()))
    }

    fn unwrap_with(&self, wrapping: &[u8; 32]) -> Result<MasterKey, KeyFileError> {
        let wrapped = B64
            .decode(&self.wrapped)
            .map_err(|_| KeyFileError::Malformed("wrapped key is not base64".into()))?;
        let plain =
            Zeroizing::new(open_with(wrapping, &wrapped).map_err(|_| KeyFileError::WrongPassword)?);
        serde_json::from_slice(&plain).map_err(|e| KeyFileError::Malformed(e.to_string()))
    }
}

fn new_salt() -> [u8; 16] {
    let mut salt = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut salt);
    salt
}

/// BLAKE3 in key-derivation mode over the salt and the secret (both of fixed length for
/// files cairn writes; the salt's length is prefixed so no two inputs run together).
fn derive_blake3(secret: &RandomSecret, salt: &[u8]) -> Zeroizing<[u8; 32]> {
    let mut h = blake3::Hasher::new_derive_key(BLAKE3_CONTEXT);
    h.update(&(salt.len() as u64).to_le_bytes());
    h.update(salt);
    h.update(secret.as_text().as_bytes());
    Zeroizing::new(*h.finalize().as_bytes())
}

#[cfg(test)]
thread_local! {
    /// Argon2 derivations run by this thread: tests count the work instead of timing it,
    /// since a loaded machine can stall any command longer than a costly derivation takes.
    static DERIVATIONS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// How many Argon2 derivations `f` ran on this thread.
#[cfg(test)]
pub(crate) fn derivations_in<T>(f: impl FnOnce() -> T) -> (T, u32) {
    let before = DERIVATIONS.with(|d| d.get());
    let out = f();
    (out, DERIVATIONS.with(|d| d.get()) - before)
}

fn derive(password: &[u8], salt: &[u8], p: KdfParams) -> Result<Zeroizing<[u8; 32]>, KeyFileError> {
    let params = Params::new(p.memory_kib, p.iterations, p.parallelism, Some(32))
        .map_err(|e| KeyFileError::Malformed(format!("KDF parameters: {e}")))?;
    #[cfg(test)]
    DERIVATIONS.with(|d| d.set(d.get() + 1));
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
        file.params.as_mut().unwrap().parallelism = 1;
        assert!(matches!(file.open(b"pw"), Err(KeyFileError::WrongPassword)));
    }

    #[test]
    fn a_random_key_file_opens_with_its_secret_only_and_never_with_a_typed_password() {
        let key = MasterKey::generate();
        let secret = RandomSecret::generate();
        let file = KeyFile::create_for_random(&key, &secret, "host");
        let file = KeyFile::from_bytes(&file.to_bytes()).unwrap();
        assert_eq!(file.kdf().unwrap(), Kdf::Blake3);
        assert_eq!(file.work(), Some(0));
        let opened = file.open_random(&secret).unwrap();
        assert_eq!(opened.blob_id(b"x"), key.blob_id(b"x"));
        assert!(matches!(
            file.open_random(&RandomSecret::generate()),
            Err(KeyFileError::WrongPassword)
        ));
        // Not even the secret itself, typed: a password is never checked with a fast hash.
        assert!(matches!(
            file.open(secret.as_text().as_bytes()),
            Err(KeyFileError::NotForPasswords)
        ));
    }

    #[test]
    fn a_random_secret_opens_the_argon2_key_files_older_versions_wrote_with_it() {
        let key = MasterKey::generate();
        let secret = RandomSecret::generate();
        let file = KeyFile::create(&key, secret.as_text().as_bytes(), FAST, "host");
        let opened = file.open_random(&secret).unwrap();
        assert_eq!(opened.blob_id(b"x"), key.blob_id(b"x"));
    }

    #[test]
    fn only_what_cairn_generates_is_a_random_secret() {
        let generated = RandomSecret::generate();
        assert!(RandomSecret::from_text(generated.as_text()).is_some());
        let upper = generated.as_text().to_uppercase();
        let short = &generated.as_text()[..63];
        for text in ["", "hunter2", "correct horse battery staple", short, &upper] {
            assert!(RandomSecret::from_text(text).is_none(), "{text:?}");
        }
    }

    #[test]
    fn argon2_costs_above_the_caps_are_refused_before_any_work() {
        let key = MasterKey::generate();
        let mut file = KeyFile::create(&key, b"pw", FAST, "host");
        for (memory_kib, iterations, parallelism) in [
            (MAX_MEMORY_KIB + 1, 1, 1),
            (4 << 20, 64, 64),
            (64, MAX_ITERATIONS + 1, 1),
            (64, 1, MAX_PARALLELISM + 1),
            // Each within its own cap, but together more work than one file may ask.
            (MAX_MEMORY_KIB, MAX_ITERATIONS, 4),
        ] {
            let p = KdfParams {
                memory_kib,
                iterations,
                parallelism,
            };
            file.params = Some(p);
            assert!(file.work().is_none(), "{p:?}");
            let (opened, derivations) = derivations_in(|| file.open(b"pw"));
            assert!(matches!(opened, Err(KeyFileError::Malformed(_))), "{p:?}");
            assert_eq!(derivations, 0, "{p:?}");
        }
        file.params = Some(KdfParams::default());
        assert_eq!(file.work(), Some(DEFAULT_WORK));
        file.params = None;
        assert!(file.kdf().is_err(), "argon2id without parameters");
    }
}

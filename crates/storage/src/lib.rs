//! Named, write-once files on some backend: a local directory, SFTP, S3, or a
//! `cairn serve` repository server.
//!
//! This crate knows nothing of what the bytes mean: no ids, no encryption, no packs.
//! It promises what a deduplicating repository needs from any backend: relative names,
//! whole or ranged reads, create-only atomic writes that are durable when they return,
//! and listings that never show half-written files. Every backend must pass
//! [`testsuite::run_all`].

mod counts;
mod error;
mod limit;
mod local;
mod location;
mod name;
pub mod pagecache;
mod remote;
pub mod rest;
mod ssh_orphans;
pub mod testsuite;
mod writeback;

pub use counts::RequestCounts;
pub use error::{Result, StorageError};
pub use limit::{Limited, RateLimits};
pub use local::{LocalStorage, LocalUnnamedWrite, PendingWrite};
pub use location::{open, open_with, Location, OpenOptions};
pub use remote::{RemoteStorage, S3Config, SftpConfig};

use std::time::SystemTime;

/// Whether `name` follows the naming rules of [`Storage`]; what every backend checks
/// before touching anything.
pub fn is_valid_name(name: &str) -> bool {
    name::validate_name(name)
}

/// Deletes `name` if it is there: for files that another process (a prune, a session's
/// own cleanup) may have removed first, where either way the file is gone as wanted.
/// Where a ranged read of `len` bytes at `offset` ends; or, for a read that fetches
/// nothing, its answer: nothing if the range lies within the object, else `Truncated`.
pub(crate) fn range_end(
    storage: &dyn Storage,
    name: &str,
    offset: u64,
    len: u64,
) -> std::result::Result<u64, Result<Vec<u8>>> {
    match offset.checked_add(len) {
        Some(end) if len > 0 => Ok(end),
        _ => Err(storage
            .size(name)
            .and_then(|size| match offset.checked_add(len) {
                Some(end) if end <= size => Ok(Vec::new()),
                _ => Err(range_truncated(storage, name, offset, len, size)),
            })),
    }
}

/// A ranged read past the end of an object of `size` bytes.
pub(crate) fn range_truncated(
    storage: &dyn Storage,
    name: &str,
    offset: u64,
    len: u64,
    size: u64,
) -> StorageError {
    StorageError::Truncated {
        name: name.to_string(),
        location: storage.location(),
        offset,
        len,
        size,
    }
}

pub fn delete_if_present(storage: &dyn Storage, name: &str) -> Result<()> {
    removed(storage.delete(name))
}

/// A removal's result, a file that was already gone counting as removed.
pub fn removed(result: Result<()>) -> Result<()> {
    match result {
        Ok(()) | Err(StorageError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// An object being written by [`Storage::begin_unnamed_write`]. Dropped without
/// `commit_as`, it leaves nothing behind; a crash may leave a temporary file, which
/// [`Storage::temporaries`] names.
pub trait UnnamedWrite: Send + std::fmt::Debug {
    /// Appends `data` to the object's bytes.
    fn write_all(&mut self, data: &[u8]) -> Result<()>;

    /// Makes the object durable under `name`, which must lie below the directory the
    /// write began in, as [`Storage::write`] would; [`StorageError::AlreadyExists`] if
    /// the name is taken (the existing file is untouched).
    fn commit_as(self: Box<Self>, name: &str) -> Result<()>;
}

/// A store of named, write-once files.
///
/// Names are relative paths of `/`-separated components of ASCII letters, digits, `.`,
/// `_` and `-`, never `.` or `..`, never empty, never starting with `.tmp-` (reserved for
/// unfinished writes), e.g. `config`, `keys/ab12..`, `data/ab/ab12..`. Every method
/// rejects other names with [`StorageError::InvalidName`].
pub trait Storage: Send + Sync + std::fmt::Debug {
    /// Human-readable location, e.g. `/srv/repo` (used in messages).
    fn location(&self) -> String;

    /// The whole file.
    fn read(&self, name: &str) -> Result<Vec<u8>>;

    /// Exactly `len` bytes at `offset`, or [`StorageError::Truncated`].
    fn read_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>>;

    /// [`read_range`](Self::read_range) into `buf`, which ends up exactly `len` bytes
    /// long: a caller that reads many ranges reuses one buffer instead of allocating
    /// (and zeroing) each.
    fn read_range_into(&self, name: &str, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<()> {
        *buf = self.read_range(name, offset, len)?;
        Ok(())
    }

    /// Advice that `len` bytes at `offset` of the file, already read, will not be read
    /// again: a local store drops them from the page cache (a restore reads each pack
    /// once; left cached, a large restore pushes out what the machine is using and takes
    /// a fresh page for every page it reads). Failures change nothing but the cache.
    fn uncache(&self, _name: &str, _offset: u64, _len: u64) {}

    /// Creates the file. Create-only and atomic: readers see the whole file or nothing,
    /// even after a crash; durable when it returns. [`StorageError::AlreadyExists`] if
    /// the name exists (the existing file is untouched). On failure nothing is left
    /// behind.
    fn write(&self, name: &str, data: &[u8]) -> Result<()>;

    /// Starts writing an object below `dir` whose name is known only once its bytes are
    /// (a pack, named by the hash of its bytes), so that its bytes need not be held in
    /// memory; `None` where the store cannot (the caller then gathers the bytes and calls
    /// [`write`](Self::write)). The object appears only at
    /// [`UnnamedWrite::commit_as`], with every promise of `write`.
    fn begin_unnamed_write(&self, _dir: &str) -> Option<Result<Box<dyn UnnamedWrite>>> {
        None
    }

    /// Full names (like `data/ab/abcd..`) of all files below `dir`, recursively, sorted.
    /// `""` lists the whole store. Temporary files of unfinished writes are never listed;
    /// a missing directory gives an empty list.
    fn list(&self, dir: &str) -> Result<Vec<String>>;

    /// The files [`list`](Self::list) gives, each with the time the storage last wrote
    /// it by the storage's own clock: a local file's mtime, S3's `Last-Modified`, the
    /// SFTP server's mtime. cairn compares such times only with each other, never with a
    /// host's clock, so hosts whose clocks disagree still agree on them.
    fn list_modified(&self, dir: &str) -> Result<Vec<(String, SystemTime)>>;

    /// Temporary files that unfinished writes left anywhere in the store (a crash, a cut
    /// connection), with their modification times by the storage's clock. A write in
    /// progress shows here too: judge by age. Empty where writes leave none (S3).
    fn temporaries(&self) -> Result<Vec<(String, SystemTime)>>;

    /// Removes a temporary file that [`temporaries`](Self::temporaries) named;
    /// [`StorageError::InvalidName`] for any other name.
    fn delete_temporary(&self, name: &str) -> Result<()>;

    /// Size in bytes, or [`StorageError::NotFound`].
    fn size(&self, name: &str) -> Result<u64>;

    /// Whether the file exists.
    fn exists(&self, name: &str) -> Result<bool>;

    /// Removes the file, or [`StorageError::NotFound`] if it is missing. The removal is
    /// durable when this returns.
    fn delete(&self, name: &str) -> Result<()>;

    /// Removes the file like [`delete`](Self::delete), without waiting for the removal
    /// to be durable: a crash soon after may bring the file back as it was. Only for
    /// files whose return is harmless, such as a finished session's.
    fn delete_unsynced(&self, name: &str) -> Result<()> {
        self.delete(name)
    }

    /// Requests issued so far, for stores where requests cost time or money (remote
    /// ones); `None` for a local directory.
    fn request_counts(&self) -> Option<std::sync::Arc<RequestCounts>> {
        None
    }

    /// Whether each request costs a network round trip (then caching and reading ahead
    /// pay off).
    fn is_remote(&self) -> bool {
        self.request_counts().is_some()
    }

    /// Whether [`write`](Self::write)'s create-only check is atomic. Where it is not
    /// (SFTP has no create-if-absent rename), two writes racing for one name may both
    /// succeed and the last one stays, whole. cairn names every file but `config` by
    /// the hash of its bytes, so racing writers write the same bytes.
    fn create_is_exclusive(&self) -> bool {
        true
    }
}

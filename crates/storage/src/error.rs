//! The one error type of this crate. Every variant names the object and the store's
//! location, because a user may have several repositories and needs to know which one
//! is full, damaged or missing a file.

/// Result of a storage operation.
pub type Result<T> = std::result::Result<T, StorageError>;

/// What went wrong with a storage operation.
///
/// `location` is the store's [`Storage::location`](crate::Storage::location). For
/// [`StorageError::Io`] the operating system's error is the `source`, not part of the
/// message, so that error reporters print it once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The named file does not exist.
    #[error("Object {name} not found in {location}")]
    NotFound { name: String, location: String },

    /// A write found the name already taken; the existing file was left as it was.
    #[error("Object {name} already exists in {location}")]
    AlreadyExists { name: String, location: String },

    /// A ranged read reached past the end of the file.
    #[error(
        "Object {name} in {location} is too short: reading {len} bytes at offset {offset} \
         goes past its end at {size} bytes"
    )]
    Truncated {
        name: String,
        location: String,
        offset: u64,
        len: u64,
        size: u64,
    },

    /// The disk or quota ran out while writing; the partial file was removed.
    #[error("The disk holding the repository {location} is full: nothing was written for {name}")]
    NoSpace { name: String, location: String },

    /// The name breaks the naming rules of [`Storage`](crate::Storage).
    #[error(
        "Invalid object name {name:?} for {location}: names are /-separated components of \
         ASCII letters, digits, '.', '_' and '-', not '.', '..' or starting with '.tmp-'"
    )]
    InvalidName { name: String, location: String },

    /// The repository address is malformed, or names something cairn will not use as it
    /// is (plain HTTP to S3 without the opt-in); `reason` says which and what to do.
    #[error("{reason}")]
    InvalidAddress { address: String, reason: String },

    /// A remote store (S3, SFTP) refused or failed a request after its retries; `hint`
    /// says what to check.
    #[error("Cannot {op} {name} in {location}: {hint}")]
    Remote {
        op: &'static str,
        name: String,
        location: String,
        hint: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A repository server (`cairn serve`) refused the request for a reason it gave: a
    /// token without the right, a quota used up, an object outside the repository's
    /// layout. Not retried: asking again gets the same answer.
    #[error("The server {location} refused to {op} {name} (HTTP {status}): {reason}")]
    Refused {
        op: &'static str,
        name: String,
        location: String,
        status: u16,
        reason: String,
    },

    /// Any other I/O failure; `op` says what was being done, e.g. "read" or "sync".
    #[error("Cannot {op} {name} in {location}")]
    Io {
        op: &'static str,
        name: String,
        location: String,
        #[source]
        source: std::io::Error,
    },
}

impl StorageError {
    /// A stable word for what went wrong, for programs (`--json` error documents): one
    /// of `not_found`, `already_exists`, `corrupt`, `no_space`, `usage`, `remote`,
    /// `server_refused` or `io`.
    pub fn kind(&self) -> &'static str {
        match self {
            StorageError::NotFound { .. } => "not_found",
            StorageError::AlreadyExists { .. } => "already_exists",
            StorageError::Truncated { .. } => "corrupt",
            StorageError::NoSpace { .. } => "no_space",
            StorageError::InvalidName { .. } | StorageError::InvalidAddress { .. } => "usage",
            StorageError::Remote { .. } => "remote",
            StorageError::Refused { .. } => "server_refused",
            StorageError::Io { .. } => "io",
        }
    }
}

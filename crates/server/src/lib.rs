//! `cairn serve`: a repository server that a compromised client cannot damage.
//!
//! It serves the repositories in the subdirectories of one directory over HTTP(S)
//! ([`serve`]; the client is `cairn_storage::rest`). Each request carries a token with
//! rights on one repository ([`access`]). Uploads are verified against the repository
//! layout ([`layout`]): hash-named objects must hash to their names, and nothing is ever
//! overwritten, so an `append` token can add garbage but never alter or remove what is
//! there. Deletions wait out a delay before they free anything ([`deleted`]). [`scrub`]
//! re-hashes stored objects without any key.
//!
//! It knows nothing of what objects mean (no keys, no packs): that is `cairn-core`'s.

pub mod access;
pub mod deleted;
mod http;
pub mod layout;
pub mod scrub;
mod state;

use std::path::PathBuf;
use std::time::Duration;

pub use http::{serve, Listening};

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The directory whose subdirectories are the repositories.
    pub dir: PathBuf,
    /// `host:port`; plain HTTP only on a loopback address.
    pub listen: String,
    /// PEM certificate chain and private key, for HTTPS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// How long deleted objects are kept before they are freed.
    pub delete_delay: Duration,
    /// The largest upload accepted.
    pub max_body: u64,
    /// Connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// How long a request may wait for its headers, or between two pieces of its body.
    pub idle_timeout: Duration,
}

impl ServeOptions {
    pub fn new(dir: PathBuf, listen: String) -> Self {
        ServeOptions {
            dir,
            listen,
            tls: None,
            delete_delay: Duration::from_secs(7 * 24 * 3600),
            // Packs are 16 MiB; a directory of a million entries makes a tree blob of
            // tens of MB, which becomes a pack of its own.
            max_body: 1 << 30,
            max_connections: 64,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// What went wrong, naming the file or setting involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("Cannot {op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is damaged: {reason}; restore it from a backup or remove it", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("{0}")]
    Invalid(String),
    #[error("Object {0} not found")]
    NotFound(String),
    #[error(transparent)]
    Storage(#[from] cairn_storage::StorageError),
}

impl Error {
    pub(crate) fn io(op: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

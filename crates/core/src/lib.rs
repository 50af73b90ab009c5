//! cairn-core: the repository and the operations on it.
//!
//! Layers, top down: [`ops`] (one module per user-visible operation) → [`repo`] (open,
//! keys, config, blobs, snapshots) → [`writer`], [`pack`], [`index`] → pure pieces
//! ([`crypto`], [`compress`], [`tree`], [`id`]) → the `cairn-storage` crate.
//! Nothing here knows about terminals or argument syntax.

pub mod cache;
pub mod client_state;
pub mod commit;
pub mod compress;
pub mod config;
pub mod crypto;
pub mod envelope;
pub mod error;
pub mod fsmeta;
pub mod id;
pub mod index;
pub mod keyfile;
pub mod keys;
pub mod monitor;
pub mod object;
pub mod ops;
pub mod pack;
pub mod repo;
pub mod session;
pub mod snapshot;
pub mod stores;
pub mod trash;
pub mod tree;
pub mod window;
pub mod writer;
pub mod writer_cache;

pub use error::{Error, Result};
pub use repo::{InitOptions, Repository};

pub use cairn_chunker as chunker;
pub use cairn_storage as storage;

/// The cores this process may use, read once: the standard library reads the cgroup's
/// quota files at every call, and a backup asked three times (about 1% of an unchanged
/// backup's CPU time).
pub fn cores() -> Option<std::num::NonZeroUsize> {
    static CORES: std::sync::OnceLock<Option<std::num::NonZeroUsize>> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().ok())
}

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

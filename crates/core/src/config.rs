//! The repository's `config` file: the one plaintext file besides key files. It says which
//! format version wrote the repository and how data is chunked, named and compressed, so a
//! reader can refuse what it does not understand before touching anything else.

use cairn_chunker::ChunkerParams;
use serde::{Deserialize, Serialize};

use crate::compress::Compression;

/// The newest repository format this binary reads and writes.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    /// Format version; a reader refuses anything newer than [`FORMAT_VERSION`].
    pub version: u32,
    /// Random id of the repository, fixed at init.
    pub id: String,
    pub chunker: ChunkerConfig,
    /// Keyed hash naming blobs.
    pub hash: String,
    pub compression: Compression,
    /// Target size of a pack file in bytes.
    pub pack_size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChunkerConfig {
    pub algorithm: String,
    pub min_size: u32,
    pub avg_size: u32,
    pub max_size: u32,
}

impl ChunkerConfig {
    pub fn fastcdc(p: ChunkerParams) -> Self {
        ChunkerConfig {
            algorithm: "fastcdc-2020".into(),
            min_size: p.min_size,
            avg_size: p.avg_size,
            max_size: p.max_size,
        }
    }
}

/// Peeks at the version before parsing the rest, so a newer format with fields this
/// binary does not know still gets the "newer version" message rather than a parse error.
#[derive(Deserialize)]
pub(crate) struct VersionOnly {
    pub version: u32,
}

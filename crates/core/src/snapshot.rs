//! Snapshots: the small metadata object that makes a backup visible. It is written last;
//! until it exists, nothing a backup wrote is relied on by anyone.

use serde::{Deserialize, Serialize};

use crate::id::{BlobId, SnapshotId};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub time: jiff::Timestamp,
    pub host: String,
    pub username: String,
    /// The backed-up paths, absolute (lossy UTF-8 for display; the tree holds the bytes).
    pub paths: Vec<String>,
    pub tags: Vec<String>,
    /// The root tree: `/`, holding the backed-up paths.
    pub tree: BlobId,
    pub parent: Option<SnapshotId>,
    pub program_version: String,
    pub summary: SnapshotSummary,
}

/// Figures recorded at backup time, so `snapshots` can show them without reading trees.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SnapshotSummary {
    pub files: u64,
    pub dirs: u64,
    /// Sum of the sizes of all files in the snapshot.
    pub total_bytes: u64,
    pub bytes_added: u64,
}

impl Snapshot {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a snapshot serializes")
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

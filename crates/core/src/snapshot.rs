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
    /// The snapshot this one replaced (`tag`, `rewrite`): its first version, which kept
    /// the same time. Absent in snapshots written by a backup, and in those of cairn
    /// before 0.2 (a reader that does not know the field ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<SnapshotId>,
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

/// Which snapshots a command considers (`--host`, `--tag`, `--path`), and so which one
/// `latest` is. Empty lists match every snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotFilter {
    /// A snapshot of any of these hosts.
    pub hosts: Vec<String>,
    /// A snapshot carrying every tag of any one of these groups (`--tag a,b --tag c`:
    /// both a and b, or c).
    pub tags: Vec<Vec<String>>,
    /// A snapshot whose paths include all of these (absolute) paths.
    pub paths: Vec<String>,
}

impl SnapshotFilter {
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty() && self.tags.is_empty() && self.paths.is_empty()
    }

    pub fn matches(&self, s: &Snapshot) -> bool {
        (self.hosts.is_empty() || self.hosts.contains(&s.host))
            && (self.tags.is_empty()
                || self
                    .tags
                    .iter()
                    .any(|group| group.iter().all(|t| s.tags.contains(t))))
            && self.paths.iter().all(|p| s.paths.contains(p))
    }
}

impl std::fmt::Display for SnapshotFilter {
    /// As typed: `--host a --tag x,y --path /p`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        parts.extend(self.hosts.iter().map(|h| format!("--host {h}")));
        parts.extend(self.tags.iter().map(|t| format!("--tag {}", t.join(","))));
        parts.extend(self.paths.iter().map(|p| format!("--path {p}")));
        f.write_str(&parts.join(" "))
    }
}

#[cfg(test)]
mod filter_tests {
    use super::*;

    fn snap(host: &str, tags: &[&str], paths: &[&str]) -> Snapshot {
        Snapshot {
            time: jiff::Timestamp::UNIX_EPOCH,
            host: host.into(),
            username: String::new(),
            paths: paths.iter().map(|p| p.to_string()).collect(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            tree: BlobId([0; 32]),
            parent: None,
            original: None,
            program_version: String::new(),
            summary: SnapshotSummary::default(),
        }
    }

    #[test]
    fn a_filter_matches_any_host_any_tag_group_and_all_paths() {
        let s = snap("h", &["a", "b"], &["/x", "/y"]);
        let f = |hosts: &[&str], tags: &[&[&str]], paths: &[&str]| SnapshotFilter {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            tags: tags
                .iter()
                .map(|g| g.iter().map(|t| t.to_string()).collect())
                .collect(),
            paths: paths.iter().map(|p| p.to_string()).collect(),
        };
        assert!(f(&[], &[], &[]).matches(&s));
        assert!(f(&["other", "h"], &[], &[]).matches(&s));
        assert!(!f(&["other"], &[], &[]).matches(&s));
        assert!(f(&[], &[&["a", "b"]], &[]).matches(&s));
        assert!(!f(&[], &[&["a", "c"]], &[]).matches(&s));
        assert!(f(&[], &[&["a", "c"], &["b"]], &[]).matches(&s));
        assert!(f(&[], &[], &["/x", "/y"]).matches(&s));
        assert!(!f(&[], &[], &["/x", "/z"]).matches(&s));
    }
}

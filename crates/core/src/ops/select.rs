//! Resolving the snapshots and paths a user names, and when one does not exist, saying
//! which ones do: the closest names in that directory, or the closest snapshot ids.
//! Reads snapshot metadata and trees only.

use crate::error::{Error, Result};
use crate::id::SnapshotId;
use crate::ops::browse::{path_names, Entry};
use crate::repo::Repository;
use crate::snapshot::Snapshot;
use crate::tree::NodeKind;

/// How many suggestions an error lists.
const SUGGESTIONS: usize = 5;

/// Up to `n` of `candidates`, closest to `wanted` by edit distance first (ties by name).
pub fn nearest(
    wanted: &str,
    candidates: impl IntoIterator<Item = String>,
    n: usize,
) -> Vec<String> {
    let mut scored: Vec<(usize, String)> = candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(wanted, &c), c))
        .collect();
    scored.sort();
    scored.into_iter().take(n).map(|(_, c)| c).collect()
}

/// Resolves `latest`, a full id or a unique prefix, as [`Repository::find_snapshot`]
/// does; when nothing matches, the error lists the existing snapshots closest to `spec`.
pub fn find_snapshot(repo: &Repository, spec: &str) -> Result<(SnapshotId, Snapshot)> {
    match repo.find_snapshot(spec) {
        Err(Error::SnapshotNotFound { spec }) => {
            let list = repo.snapshots()?;
            let wanted = spec.to_ascii_lowercase();
            // Compare with the id's prefix of the typed length: a mistyped prefix is then
            // one or two edits away from the id it meant.
            let len = wanted.len().clamp(8, 64);
            let mut scored: Vec<(usize, String)> = list
                .snapshots
                .iter()
                .rev()
                .map(|(id, s)| {
                    let distance = strsim::levenshtein(&wanted, &id.to_hex()[..len]);
                    let label = format!(
                        "{} ({})",
                        id.short(),
                        s.time.strftime("%Y-%m-%d %H:%M:%S UTC")
                    );
                    (distance, label)
                })
                .collect();
            // Stable: among equal distances the newest comes first.
            scored.sort_by_key(|(d, _)| *d);
            Err(Error::SnapshotNotFoundAmong {
                spec,
                existing: scored
                    .into_iter()
                    .take(SUGGESTIONS)
                    .map(|(_, l)| l)
                    .collect(),
            })
        }
        other => other,
    }
}

/// Finds `path` in `snapshot` as [`crate::ops::browse::find`] does, but a missing path
/// is an error naming the closest entries of the deepest directory that exists.
pub fn find_path(
    repo: &Repository,
    id: &SnapshotId,
    snapshot: &Snapshot,
    path: &[u8],
) -> Result<Entry> {
    let mut found = Entry::Root(snapshot.tree);
    let mut walked = Vec::new();
    for name in path_names(path) {
        let dir_shown = if walked.is_empty() {
            "/".to_string()
        } else {
            String::from_utf8_lossy(&walked).into_owned()
        };
        let not_found = |nearest: Vec<String>, dir: String| Error::PathNotFoundNear {
            path: String::from_utf8_lossy(path).into_owned(),
            snapshot: id.short(),
            dir,
            nearest,
        };
        let tree_id = match &found {
            Entry::Root(tree) => *tree,
            Entry::Node(node) => match &node.kind {
                NodeKind::Dir { subtree } => *subtree,
                other => {
                    return Err(not_found(
                        Vec::new(),
                        format!("{dir_shown} (a {}, not a directory)", other.name()),
                    ))
                }
            },
        };
        let tree = repo.read_tree(&tree_id)?;
        match tree.find(name) {
            Some(node) => found = Entry::Node(node.clone()),
            None => {
                let names = tree
                    .nodes
                    .iter()
                    .map(|n| String::from_utf8_lossy(&n.name).into_owned());
                let wanted = String::from_utf8_lossy(name);
                return Err(not_found(nearest(&wanted, names, 3), dir_shown));
            }
        }
        walked.push(b'/');
        walked.extend_from_slice(name);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_names_come_closest_first() {
        let names = ["report.txt", "notes.md", "reports", "zzz"].map(String::from);
        assert_eq!(
            nearest("reprot.txt", names, 2),
            vec!["report.txt".to_string(), "reports".to_string()]
        );
    }
}

//! Resolving the snapshots a user names, and when one does not exist, saying which ones
//! do: the closest snapshot ids. (Missing paths: [`crate::ops::browse::find`].)

use crate::error::{Error, Result};
use crate::id::SnapshotId;
use crate::repo::Repository;
use crate::snapshot::Snapshot;

/// How many suggestions an error lists.
const SUGGESTIONS: usize = 5;

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

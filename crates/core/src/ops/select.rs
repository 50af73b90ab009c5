//! Resolving the snapshots a user names, and when one does not exist, saying which ones
//! do: the closest snapshot ids. (Missing paths: [`crate::ops::browse::find`].)

use crate::error::{Error, Result};
use crate::id::SnapshotId;
use crate::repo::{Repository, SnapshotList};
use crate::snapshot::{Snapshot, SnapshotFilter};

/// How many suggestions an error lists.
const SUGGESTIONS: usize = 5;

/// The snapshots `filter` selects, oldest first (damaged ones are listed apart, whatever
/// the filter: their host and tags cannot be read).
pub fn snapshots(repo: &Repository, filter: &SnapshotFilter) -> Result<SnapshotList> {
    let mut list = repo.snapshots()?;
    list.snapshots.retain(|(_, s)| filter.matches(s));
    Ok(list)
}

/// Resolves `latest` (the newest snapshot `filter` selects), a full id or a unique
/// prefix (whatever the filter: an id names one snapshot); when nothing matches, the
/// error lists the existing snapshots closest to `spec`.
pub fn find_snapshot(
    repo: &Repository,
    spec: &str,
    filter: &SnapshotFilter,
) -> Result<(SnapshotId, Snapshot)> {
    if spec == "latest" && !filter.is_empty() {
        return snapshots(repo, filter)?
            .snapshots
            .pop()
            .ok_or_else(|| Error::NoSnapshotMatches {
                filter: filter.to_string(),
            });
    }
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

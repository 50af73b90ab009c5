//! `tag` and `rewrite`: change existing snapshots. A snapshot file never changes (its name
//! is its hash), so a changed snapshot is written anew, with the original's time, host and
//! paths and the original's id in `original`, and the original is removed (by `rewrite`
//! only with `forget`).
//!
//! Safe beside prune and forget, without a lock. Every blob the new snapshot S' shares
//! with its original S is one S needs, so it is safe as long as every prune sees S or S'.
//! S' is written first, then S is checked to be still there, and only then removed: so S
//! existed from before this command read it until after S' was written. A prune's first
//! snapshot listing that ends before S is removed sees S (it existed throughout); one that
//! overlaps the removal is followed by its second listing (after its session listing),
//! which starts after S' was written and so sees S'. If S is gone at the check (a forget
//! ran meanwhile), S' is removed again and the change reported as not made: S' would need
//! blobs that a prune may already be freeing. New trees (`rewrite`) go into new packs
//! under a backup session and pass the commit check, as a backup's do.
//!
//! Small files share blobs (bundles, across neighbouring directories): when `rewrite`
//! removes one, the kept files' ranges of its bundles, anywhere in the snapshots, move to
//! a new bundle for each old one, so that no kept file holds on to the removed bytes and
//! `prune` can free them, while the kept files stay compressed together.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::id::{BlobId, SnapshotId};
use crate::monitor::Monitor;
use crate::ops::exclude::Excludes;
use crate::pack::BlobKind;
use crate::repo::Repository;
use crate::session::{Session, SessionKind};
use crate::snapshot::{Snapshot, SnapshotSummary};
use crate::tree::{NodeKind, Tree};
use crate::writer::BlobWriter;

/// How `tag` changes a snapshot's tags: `set` replaces them all, then `remove` and `add`.
#[derive(Debug, Clone, Default)]
pub struct TagChange {
    pub set: Option<Vec<String>>,
    pub add: Vec<String>,
    pub remove: Vec<String>,
}

impl TagChange {
    /// `tags` changed, without duplicates, in their first order.
    pub fn apply(&self, tags: &[String]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let start = self.set.as_deref().unwrap_or(tags);
        for t in start.iter().chain(&self.add) {
            if !self.remove.contains(t) && !out.contains(t) {
                out.push(t.clone());
            }
        }
        out
    }
}

/// One snapshot replaced by another (`new` is `None` in a dry run).
#[derive(Debug, Clone, Serialize)]
pub struct Replaced {
    pub old: SnapshotId,
    pub new: Option<SnapshotId>,
    /// Whether the old snapshot was removed.
    pub removed: bool,
    /// `rewrite`: the paths left out (a directory once, not its contents).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub removed_paths: Vec<String>,
}

/// Changes the tags of `selected`; snapshots whose tags would not change are left alone
/// (and not listed).
pub fn tag(
    repo: &Repository,
    selected: &[(SnapshotId, Snapshot)],
    change: &TagChange,
    dry_run: bool,
) -> Result<Vec<Replaced>> {
    let mut done = Vec::new();
    for (id, old) in selected {
        let tags = change.apply(&old.tags);
        if tags == old.tags {
            continue;
        }
        let new = Snapshot {
            tags,
            original: Some(old.original.unwrap_or(*id)),
            ..old.clone()
        };
        let new_id = match dry_run {
            true => None,
            false => Some(replace(repo, *id, &new, None, true)?),
        };
        done.push(Replaced {
            old: *id,
            new: new_id,
            removed: !dry_run,
            removed_paths: Vec::new(),
        });
    }
    Ok(done)
}

/// What `rewrite` leaves out, and whether it removes the originals.
#[derive(Debug, Clone, Default)]
pub struct RewriteOptions {
    /// Patterns with backup's `--exclude` meaning, matched against the absolute paths in
    /// the snapshot (`ops::exclude`).
    pub excludes: Vec<String>,
    /// Remove each rewritten snapshot's original once the new one is written.
    pub forget: bool,
    /// Say what would change; write nothing.
    pub dry_run: bool,
}

#[derive(Debug, Default, Serialize)]
pub struct RewriteReport {
    pub rewritten: Vec<Replaced>,
    /// Selected snapshots in which no pattern matched.
    pub unchanged: Vec<SnapshotId>,
}

/// Writes a version of each of `selected` without the paths `opts.excludes` match.
/// Without `forget`, each original stays beside its new version.
pub fn rewrite(
    repo: &mut Repository,
    selected: &[(SnapshotId, Snapshot)],
    opts: &RewriteOptions,
    monitor: &dyn Monitor,
) -> Result<RewriteReport> {
    let excludes = Excludes::new(&opts.excludes)?;
    if opts.excludes.is_empty() {
        return Err(Error::InvalidInput(
            "Nothing to rewrite: give at least one --exclude pattern".into(),
        ));
    }
    // New trees go into new packs, as a backup's: the session keeps prune from taking them
    // for leftovers, and the index is read after it is registered.
    let session = match opts.dry_run {
        true => {
            repo.load_index()?;
            None
        }
        false => {
            let s = Session::start(
                repo,
                SessionKind::Backup,
                &crate::session::local_host_name(),
            )?;
            let observed = repo.load_index()?;
            s.observe(observed)?;
            Some(s)
        }
    };
    let mut report = RewriteReport::default();
    // (original, new version, paths left out)
    let mut changed: Vec<(SnapshotId, Snapshot, Vec<String>)> = Vec::new();
    let written = {
        let writer = session.as_ref().map(|_| repo.blob_writer());
        let mut pruner = Pruner {
            repo,
            writer: writer.as_ref(),
            excludes: &excludes,
            removed: Vec::new(),
            summary: SnapshotSummary::default(),
            removed_blobs: HashSet::new(),
            kept_parts: BTreeMap::new(),
            moved: HashMap::new(),
        };
        let mut walk = || -> Result<()> {
            // The removed files' blobs of every selected snapshot first: a later snapshot
            // whose kept file shares a bundle with a file removed from an earlier one
            // (deleted from disk in between) must let go of that bundle too.
            for (_, old) in selected.iter() {
                pruner.find_removed_blobs(&old.tree, Path::new("/"), false)?;
            }
            pruner.regroup()?;
            for (i, (id, old)) in selected.iter().enumerate() {
                monitor.progress("snapshots", i as u64, selected.len() as u64);
                if monitor.cancelled() {
                    return Err(Error::Interrupted);
                }
                pruner.removed.clear();
                pruner.summary = SnapshotSummary::default();
                let tree = pruner.tree(&old.tree, Path::new("/"))?;
                let Some(tree) = tree else {
                    report.unchanged.push(*id);
                    continue;
                };
                let summary = SnapshotSummary {
                    bytes_added: old.summary.bytes_added,
                    ..pruner.summary.clone()
                };
                changed.push((
                    *id,
                    Snapshot {
                        tree,
                        summary,
                        original: Some(old.original.unwrap_or(*id)),
                        ..old.clone()
                    },
                    std::mem::take(&mut pruner.removed),
                ));
            }
            Ok(())
        };
        let walked = walk();
        match (walked, writer) {
            (Err(e), Some(w)) => return Err(w.cause(e)),
            (Err(e), None) => return Err(e),
            (Ok(()), Some(w)) => Some(w.finish()?),
            (Ok(()), None) => None,
        }
    };
    let (Some(session), Some(mut written)) = (session, written) else {
        report.rewritten = changed
            .into_iter()
            .map(|(old, _, removed_paths)| Replaced {
                old,
                new: None,
                removed: false,
                removed_paths,
            })
            .collect();
        return Ok(report);
    };
    let relied = crate::commit::relied_packs(&written);
    repo.index_written(&mut written)?;
    let checked_at = crate::session::boot_time();
    let unsafe_packs = crate::commit::check(repo, &session, &relied)?;
    if let Some(pack) = unsafe_packs.first() {
        return Err(Error::InvalidInput(format!(
            "pack {} that this rewrite wrote or needs is gone or condemned (was the repository \
             pruned while this ran paused?); no snapshot was written. Run it again",
            pack.storage_name()
        )));
    }
    for (old, new, removed_paths) in changed {
        let id = replace(
            repo,
            old,
            &new,
            Some((&session, &relied, checked_at)),
            opts.forget,
        )?;
        report.rewritten.push(Replaced {
            old,
            new: Some(id),
            removed: opts.forget,
            removed_paths,
        });
    }
    session.finish();
    Ok(report)
}

/// Writes `new` in place of `old` (see the module's description), removing `old` if
/// `remove`; with a session, through the commit check of the packs its trees need.
fn replace(
    repo: &Repository,
    old: SnapshotId,
    new: &Snapshot,
    session: Option<(&Session, &HashSet<crate::id::PackId>, std::time::Duration)>,
    remove: bool,
) -> Result<SnapshotId> {
    let new_id = match session {
        None => repo.save_snapshot(new)?,
        Some((session, relied, checked_at)) => {
            match crate::commit::save_snapshot(repo, session, relied, new, checked_at)? {
                Ok(id) => id,
                Err(packs) => {
                    return Err(Error::InvalidInput(format!(
                        "{} pack(s) the new version of snapshot {} needs are gone or \
                         condemned; it was not written. Run it again",
                        packs.len(),
                        old.short()
                    )))
                }
            }
        }
    };
    if !repo.storage().exists(&old.storage_name())? {
        crate::ops::forget::remove(repo, &[new_id])?;
        return Err(Error::InvalidInput(format!(
            "Snapshot {} was removed (by a forget?) while it was being changed; its new \
             version was taken back",
            old.short()
        )));
    }
    if remove {
        crate::ops::forget::remove(repo, &[old])?;
    }
    Ok(new_id)
}

/// Walks a snapshot's trees, leaving out what the patterns match.
struct Pruner<'a, 'w> {
    repo: &'a Repository,
    /// `None` in a dry run: new trees are only hashed.
    writer: Option<&'w BlobWriter<'a>>,
    excludes: &'a Excludes,
    /// Paths left out so far in this snapshot.
    removed: Vec<String>,
    /// Of what is kept.
    summary: SnapshotSummary,
    /// Blobs holding bytes of a file left out of any of the snapshots.
    removed_blobs: HashSet<BlobId>,
    /// The ranges of blobs that kept files hold a part of, not the whole (of bundles).
    kept_parts: BTreeMap<BlobId, BTreeSet<(u32, u32)>>,
    /// Where each kept range of a blob in `removed_blobs` moved: (blob, offset, length)
    /// to the new blob and the offset in it.
    moved: HashMap<(BlobId, u32, u32), (BlobId, u32)>,
}

impl Pruner<'_, '_> {
    /// Adds to `removed_blobs` the blobs of the files the patterns leave out below tree
    /// `id` (at `path`), or of every file below it if `all`, and to `kept_parts` the
    /// ranges of bundles the other files hold. Before any tree is changed: a bundle
    /// holds small files of neighbouring directories (see `ops::backup`), so a kept file
    /// anywhere in the snapshots may share a blob with a removed one.
    fn find_removed_blobs(&mut self, id: &BlobId, path: &Path, all: bool) -> Result<()> {
        let tree = self.repo.read_tree(id)?;
        for node in &tree.nodes {
            let child = path.join(std::ffi::OsStr::from_bytes(&node.name));
            let removed = all || self.excludes.matches(&child);
            match &node.kind {
                NodeKind::File { content, .. } if removed => {
                    self.removed_blobs.extend(content.iter().map(|c| c.blob));
                }
                NodeKind::File { content, .. } => {
                    let index = self.repo.index();
                    for part in content {
                        let whole = part.offset == 0
                            && index.get(&part.blob).map(|l| l.raw_length) == Some(part.len);
                        if !whole {
                            let ranges = self.kept_parts.entry(part.blob).or_default();
                            ranges.insert((part.offset, part.len));
                        }
                    }
                }
                NodeKind::Dir { subtree } => self.find_removed_blobs(subtree, &child, removed)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Copies the kept ranges of each blob in `removed_blobs` into a new blob, in their
    /// order, and notes in `moved` where each went. A whole blob a kept file holds stays
    /// (the removed file held the same bytes).
    fn regroup(&mut self) -> Result<()> {
        for (old, ranges) in std::mem::take(&mut self.kept_parts) {
            if !self.removed_blobs.contains(&old) {
                continue;
            }
            let blob = self.repo.read_blob_shared(&old)?;
            let mut bytes = Vec::new();
            let mut placed = Vec::with_capacity(ranges.len());
            for (offset, len) in ranges {
                let (start, end) = (offset as usize, offset as usize + len as usize);
                let Some(range) = blob.get(start..end) else {
                    return Err(Error::InvalidInput(format!(
                        "blob {old} is shorter than a file's part of it ({len} bytes at {start})"
                    )));
                };
                // Within the new blob's u32 offsets: its ranges were in one blob.
                placed.push(((old, offset, len), bytes.len() as u32));
                bytes.extend_from_slice(range);
            }
            let new = self.store(BlobKind::Data, bytes)?;
            self.moved
                .extend(placed.into_iter().map(|(from, at)| (from, (new, at))));
        }
        Ok(())
    }

    /// The id of tree `id` (at `path`) without the excluded entries, or `None` if nothing
    /// below it is excluded.
    fn tree(&mut self, id: &BlobId, path: &Path) -> Result<Option<BlobId>> {
        let tree = self.repo.read_tree(id)?;
        let mut changed = false;
        let mut kept = Vec::with_capacity(tree.nodes.len());
        for node in tree.nodes {
            let child: PathBuf = path.join(std::ffi::OsStr::from_bytes(&node.name));
            if self.excludes.matches(&child) {
                self.removed.push(child.to_string_lossy().into_owned());
                changed = true;
                continue;
            }
            kept.push((child, node));
        }
        let mut nodes = Vec::with_capacity(kept.len());
        for (child, mut node) in kept {
            match &mut node.kind {
                NodeKind::Dir { subtree } => {
                    self.summary.dirs += 1;
                    if let Some(new) = self.tree(subtree, &child)? {
                        *subtree = new;
                        changed = true;
                    }
                }
                NodeKind::File { size, content } => {
                    self.summary.files += 1;
                    self.summary.total_bytes += *size;
                    // A kept file's range of a blob with removed bytes moves (see
                    // `regroup`), or the removed bytes would stay in the repository for
                    // as long as the kept file.
                    for part in content.iter_mut() {
                        if let Some(&(blob, offset)) =
                            self.moved.get(&(part.blob, part.offset, part.len))
                        {
                            (part.blob, part.offset) = (blob, offset);
                            changed = true;
                        }
                    }
                }
                _ => {}
            }
            nodes.push(node);
        }
        if !changed {
            return Ok(None);
        }
        Ok(Some(self.store(BlobKind::Tree, Tree { nodes }.to_bytes())?))
    }

    /// Stores a blob, or in a dry run only names it.
    fn store(&mut self, kind: BlobKind, bytes: Vec<u8>) -> Result<BlobId> {
        Ok(match self.writer {
            Some(w) => w.add_owned(kind, bytes)?.0,
            None => self.repo.key().blob_id(&bytes),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_tag_change_sets_then_removes_then_adds_without_duplicates() {
        let change = TagChange {
            set: None,
            add: tags(&["c", "a"]),
            remove: tags(&["b"]),
        };
        assert_eq!(change.apply(&tags(&["a", "b"])), tags(&["a", "c"]));
        let set = TagChange {
            set: Some(tags(&["x", "y"])),
            add: Vec::new(),
            remove: tags(&["y"]),
        };
        assert_eq!(set.apply(&tags(&["a"])), tags(&["x"]));
    }
}

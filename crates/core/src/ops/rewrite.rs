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
use crate::tree::{ContentRef, NodeKind, Tree};
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
            s.observe(observed);
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
            moved: HashMap::new(),
        };
        let mut walk = || -> Result<()> {
            // The removed files' blobs of every selected snapshot first: a later snapshot
            // whose kept file shares a bundle with a file removed from an earlier one
            // (deleted from disk in between) must let go of that bundle too.
            pruner.regroup(selected)?;
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
    /// Where each kept range of a blob that also held removed bytes moved: (blob, offset,
    /// length) to the new blob and the offset in it.
    moved: HashMap<(BlobId, u32, u32), (BlobId, u32)>,
}

impl Pruner<'_, '_> {
    /// Calls `each` with whether it is left out and the content of every file of the
    /// `selected` snapshots. A tree met again at the same path (a directory unchanged
    /// from one snapshot to the next) is walked once: the patterns match it the same.
    fn visit_files(
        &self,
        selected: &[(SnapshotId, Snapshot)],
        each: &mut dyn FnMut(bool, &[ContentRef]),
    ) -> Result<()> {
        let mut seen = HashSet::new();
        for (_, snapshot) in selected {
            self.visit_tree(&snapshot.tree, Path::new("/"), false, &mut seen, each)?;
        }
        Ok(())
    }

    /// [`visit_files`](Self::visit_files) below tree `id`, at `path` (all left out if
    /// `all`).
    fn visit_tree(
        &self,
        id: &BlobId,
        path: &Path,
        all: bool,
        seen: &mut HashSet<(BlobId, PathBuf)>,
        each: &mut dyn FnMut(bool, &[ContentRef]),
    ) -> Result<()> {
        if !seen.insert((*id, path.to_path_buf())) {
            return Ok(());
        }
        let tree = self.repo.read_tree(id)?;
        for node in &tree.nodes {
            let child = path.join(std::ffi::OsStr::from_bytes(&node.name));
            let removed = all || self.excludes.matches(&child);
            match &node.kind {
                NodeKind::File { content, .. } => each(removed, content),
                NodeKind::Dir { subtree } => {
                    self.visit_tree(subtree, &child, removed, seen, each)?
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Before any tree is changed: finds the blobs of the files the patterns leave out of
    /// any of the `selected` snapshots, then copies the ranges of those blobs that kept
    /// files hold into a new blob for each, and notes in `moved` where each range went. A
    /// bundle holds small files of neighbouring directories (see `ops::backup`), so a
    /// kept file anywhere in the snapshots may share a blob with a removed one; its new
    /// blob keeps the kept files of the bundle compressed together. A whole blob a kept
    /// file holds stays (the removed file held the same bytes).
    fn regroup(&mut self, selected: &[(SnapshotId, Snapshot)]) -> Result<()> {
        let mut removed_blobs = HashSet::new();
        self.visit_files(selected, &mut |removed, content| {
            if removed {
                removed_blobs.extend(content.iter().map(|c| c.blob));
            }
        })?;
        // The ranges of those blobs that kept files hold, by blob.
        let mut kept: BTreeMap<BlobId, BTreeSet<(u32, u32)>> = BTreeMap::new();
        let index = self.repo.index();
        self.visit_files(selected, &mut |removed, content| {
            let parts = content
                .iter()
                .filter(|p| !removed && removed_blobs.contains(&p.blob));
            for part in parts {
                let whole = part.offset == 0
                    && index.get(&part.blob).map(|l| l.raw_length) == Some(part.len);
                if !whole {
                    kept.entry(part.blob)
                        .or_default()
                        .insert((part.offset, part.len));
                }
            }
        })?;
        for (old, ranges) in kept {
            let blob = self.repo.read_blob_shared(&old)?;
            let (bytes, placed) = copy_ranges(&blob, &ranges).ok_or_else(|| {
                Error::InvalidInput(format!(
                    "blob {old} is shorter than a file's part of it, or over 4 GiB"
                ))
            })?;
            let new = self.store(BlobKind::Data, bytes)?;
            for ((offset, len), at) in ranges.into_iter().zip(placed) {
                self.moved.insert((old, offset, len), (new, at));
            }
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

/// `ranges` (offset, length; in order) of `blob` copied into one buffer, each overlapping
/// or touching run of them once, and where each range starts in it; `None` if one ends
/// past the blob. The copy is never longer than the blob, so its offsets fit in a u32
/// whatever the ranges: a tree (a writer's) could name one bundle's bytes many times over.
fn copy_ranges(blob: &[u8], ranges: &BTreeSet<(u32, u32)>) -> Option<(Vec<u8>, Vec<u32>)> {
    let mut bytes = Vec::new();
    let mut placed = Vec::with_capacity(ranges.len());
    // The run being copied: where it starts and ends in `blob`, and where it starts in
    // `bytes`.
    let mut run: Option<(usize, usize, usize)> = None;
    for &(offset, len) in ranges {
        let start = offset as usize;
        let end = start.checked_add(len as usize)?;
        let piece = blob.get(start..end)?;
        let (run_start, run_end, base) = match run {
            Some((s, e, base)) if start <= e => {
                if end > e {
                    bytes.extend_from_slice(&blob[e..end]);
                }
                (s, e.max(end), base)
            }
            _ => {
                let base = bytes.len();
                bytes.extend_from_slice(piece);
                (start, end, base)
            }
        };
        run = Some((run_start, run_end, base));
        placed.push(u32::try_from(base + (start - run_start)).ok()?);
    }
    Some((bytes, placed))
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

    #[test]
    fn kept_ranges_are_copied_once_where_they_overlap_and_never_past_the_blob() {
        let blob: Vec<u8> = (0..100u8).collect();
        let ranges: BTreeSet<(u32, u32)> = [(10, 5), (10, 20), (25, 10), (50, 5), (90, 10)]
            .into_iter()
            .collect();
        let (bytes, placed) = copy_ranges(&blob, &ranges).unwrap();
        // 10..35 once (three ranges overlapping or touching), then 50..55 and 90..100.
        let expect: Vec<u8> = (10..35).chain(50..55).chain(90..100).collect();
        assert_eq!(bytes, expect);
        for ((offset, len), at) in ranges.iter().zip(&placed) {
            let (at, offset, len) = (*at as usize, *offset as usize, *len as usize);
            assert_eq!(bytes[at..at + len], blob[offset..offset + len]);
        }
        // A range named many times over costs its bytes once.
        let many: BTreeSet<(u32, u32)> = (0..60).map(|i| (i, 40)).collect();
        assert_eq!(copy_ranges(&blob, &many).unwrap().0, blob[..99]);
        // Past the end of the blob, or wrapping: no copy.
        assert!(copy_ranges(&blob, &[(90, 11)].into_iter().collect()).is_none());
        assert!(copy_ranges(&blob, &[(1, u32::MAX)].into_iter().collect()).is_none());
    }
}

//! Copying snapshots from one repository into another, sending only the blobs the
//! destination lacks, encrypted with the destination's keys.
//!
//! When the two repositories name blobs alike (the destination was made with
//! `init --copy-chunker-params`), a blob the destination has is skipped by its id without
//! being read. Otherwise every blob of the copied snapshots is read, decrypted and named
//! with the destination's id key, and trees are rewritten with the new ids; the
//! destination's dedup still stores each distinct chunk once.
//!
//! The destination is written the way a backup writes it: a session first (so a
//! concurrent prune keeps what this copy builds on), then packs, the index naming them,
//! and last the snapshots.

use std::collections::HashMap;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::id::{BlobId, SnapshotId};
use crate::monitor::Monitor;
use crate::pack::BlobKind;
use crate::repo::Repository;
use crate::session::{Session, SessionKind};
use crate::snapshot::{Snapshot, SnapshotFilter};
use crate::tree::{NodeKind, Tree};
use crate::writer::BlobWriter;

#[derive(Debug, Clone, Default)]
pub struct CopyOptions {
    /// Snapshots of the source to copy; empty means all of them.
    pub snapshots: Vec<SnapshotId>,
    /// With no `snapshots`: copy only those this selects.
    pub filter: SnapshotFilter,
    /// Host name recorded in the destination's session file.
    pub host: String,
}

#[derive(Debug, Default)]
pub struct CopyReport {
    /// `(source id, new id in the destination)` of each snapshot copied.
    pub copied: Vec<(SnapshotId, SnapshotId)>,
    /// Source snapshots the destination already had a copy of.
    pub already_present: Vec<SnapshotId>,
    /// Whether the repositories name blobs alike (blobs skipped without being read).
    pub shared_ids: bool,
    /// Blobs read from the source.
    pub blobs_read: u64,
    pub blobs_added: u64,
    /// Plaintext bytes of the blobs added to the destination.
    pub raw_bytes_added: u64,
    /// Bytes written to the destination (packs).
    pub bytes_added: u64,
    pub duration_ms: u64,
}

/// Copies `opts.snapshots` (or all) of `src` into `dst`, skipping snapshots `dst`
/// already has a copy of (same time, host, user, paths and tags). `dst` may be opened
/// without its index: the copy reads it after registering its session. Reports the
/// snapshots done through `Monitor::progress` and the data blobs read through
/// `bytes_done`; stops with `Error::Interrupted` when the monitor says so, leaving no
/// session and no snapshot behind.
pub fn copy(
    src: &Repository,
    dst: &mut Repository,
    opts: &CopyOptions,
    monitor: &dyn Monitor,
) -> Result<CopyReport> {
    let started = Instant::now();
    let session = Session::start(dst, SessionKind::Backup, &opts.host)?;
    let observed = dst.load_index()?;
    session.observe(observed);
    let mut report = CopyReport {
        shared_ids: src.key().shares_ids_with(dst.key()),
        ..CopyReport::default()
    };

    let wanted: Vec<(SnapshotId, Snapshot)> = if opts.snapshots.is_empty() {
        crate::ops::select::snapshots(src, &opts.filter)?.snapshots
    } else {
        opts.snapshots
            .iter()
            .map(|id| Ok((*id, src.load_snapshot(id)?)))
            .collect::<Result<_>>()?
    };
    let present = dst.snapshots()?.snapshots;
    let mut todo = Vec::new();
    for (id, snapshot) in wanted {
        if present.iter().any(|(_, p)| is_copy_of(p, &snapshot)) {
            report.already_present.push(id);
        } else {
            todo.push((id, snapshot));
        }
    }
    if todo.is_empty() {
        session.finish();
        report.duration_ms = started.elapsed().as_millis() as u64;
        return Ok(report);
    }

    // A round stores what the destination lacks; a second one follows only if packs the
    // first built on were gone at commit (then they are treated as absent).
    let mut rounds = 0;
    let (trees, written) = loop {
        rounds += 1;
        let (trees, mut written) = {
            let mut copier = Copier {
                src,
                writer: dst.blob_writer(),
                shared_ids: report.shared_ids,
                data: HashMap::new(),
                trees: HashMap::new(),
                blobs_read: 0,
                monitor,
            };
            let mut trees = Vec::with_capacity(todo.len());
            for (done, (_, snapshot)) in todo.iter().enumerate() {
                monitor.progress("snapshots", done as u64, todo.len() as u64);
                match copier.tree(&snapshot.tree) {
                    Ok(tree) => trees.push(tree),
                    Err(e) => return Err(copier.writer.cause(e)),
                }
            }
            monitor.progress("snapshots", todo.len() as u64, todo.len() as u64);
            report.blobs_read += copier.blobs_read;
            (trees, copier.writer.finish()?)
        };
        let relied = crate::commit::relied_packs(&written);
        // Durability order, as in a backup: packs, then the index naming them, then
        // snapshots.
        dst.index_written(&mut written)?;
        let checked_at = crate::session::boot_time();
        let unsafe_packs = crate::commit::check(dst, &session, &relied)?;
        if unsafe_packs.is_empty() {
            break (trees, (written, relied, checked_at));
        }
        if rounds == 3 {
            return Err(Error::InvalidInput(format!(
                "{} pack(s) this copy builds on are gone from {} or condemned by a prune, \
                 e.g. {}; no snapshot was written. Run it again: it reuses what was copied",
                unsafe_packs.len(),
                dst.storage().location(),
                unsafe_packs[0].storage_name()
            )));
        }
        dst.condemn(unsafe_packs);
    };
    let (written, relied, checked_at) = written;
    let mut new_ids: HashMap<SnapshotId, SnapshotId> = HashMap::new();
    for ((src_id, snapshot), tree) in todo.into_iter().zip(trees) {
        let copy = Snapshot {
            tree,
            // A parent is only meaningful in its own repository; keep it when it was
            // copied too.
            parent: snapshot.parent.and_then(|p| new_ids.get(&p).copied()),
            original: snapshot.original.and_then(|p| new_ids.get(&p).copied()),
            ..snapshot
        };
        let id = dst.save_snapshot(&copy)?;
        new_ids.insert(src_id, id);
        report.copied.push((src_id, id));
    }
    // Silent since the check for so long that a prune may have taken the session for
    // crashed: check again, and take the snapshots back if what they need is going.
    if crate::session::boot_time().saturating_sub(checked_at) >= session.lost_after() {
        let unsafe_packs = crate::commit::check(dst, &session, &relied)?;
        if !unsafe_packs.is_empty() {
            for (_, id) in &report.copied {
                let _ = dst.storage().delete(&id.storage_name());
            }
            return Err(Error::InvalidInput(format!(
                "this copy was paused long enough for a prune to delete pack {} it builds \
                 on; its snapshots were taken back. Run it again",
                unsafe_packs[0].storage_name()
            )));
        }
    }
    session.finish();
    report.blobs_added = written.blobs_added;
    report.raw_bytes_added = written.raw_bytes_added;
    report.bytes_added = written.stored_bytes_added;
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// Whether `existing` is a copy of `snapshot`. Tree ids cannot tell when the repositories
/// name blobs differently, so a snapshot is known by when, where and of what it was taken.
fn is_copy_of(existing: &Snapshot, snapshot: &Snapshot) -> bool {
    existing.time == snapshot.time
        && existing.host == snapshot.host
        && existing.username == snapshot.username
        && existing.paths == snapshot.paths
        && existing.tags == snapshot.tags
}

struct Copier<'a, 'w> {
    src: &'a Repository,
    writer: BlobWriter<'w>,
    shared_ids: bool,
    /// Source data blob id → destination id, so shared chunks are handled once.
    data: HashMap<BlobId, BlobId>,
    /// The same for trees: a subtree shared by many snapshots is rewritten once.
    trees: HashMap<BlobId, BlobId>,
    blobs_read: u64,
    monitor: &'a dyn Monitor,
}

impl Copier<'_, '_> {
    fn stop_if_cancelled(&self) -> Result<()> {
        if self.monitor.cancelled() {
            return Err(Error::Interrupted);
        }
        Ok(())
    }

    /// Copies tree `id` and everything below it; returns its id in the destination.
    fn tree(&mut self, id: &BlobId) -> Result<BlobId> {
        if let Some(new) = self.trees.get(id) {
            return Ok(*new);
        }
        self.stop_if_cancelled()?;
        // Even with shared ids a tree the destination has is read: it may be left over
        // from an interrupted backup whose files' data was pruned since.
        let mut tree: Tree = self.src.read_tree(id)?;
        for node in &mut tree.nodes {
            match &mut node.kind {
                NodeKind::File { content, .. } => {
                    for part in content {
                        part.blob = self.data_blob(&part.blob)?;
                    }
                }
                NodeKind::Dir { subtree } => *subtree = self.tree(subtree)?,
                _ => {}
            }
        }
        let (new, _) = self.writer.add_owned(BlobKind::Tree, tree.to_bytes())?;
        self.trees.insert(*id, new);
        Ok(new)
    }

    fn data_blob(&mut self, id: &BlobId) -> Result<BlobId> {
        if let Some(new) = self.data.get(id) {
            return Ok(*new);
        }
        let new = if self.shared_ids && self.writer.has(id) {
            *id
        } else {
            self.stop_if_cancelled()?;
            let plain = self.src.read_blob(id)?;
            self.blobs_read += 1;
            self.monitor.bytes_done(plain.len() as u64);
            self.writer.add(BlobKind::Data, &plain)?.0
        };
        self.data.insert(*id, new);
        Ok(new)
    }
}

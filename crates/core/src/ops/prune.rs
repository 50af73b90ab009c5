//! `prune`: delete what no snapshot needs, without a lock and without ever deleting data
//! that a concurrent backup builds on.
//!
//! 1. Find the blobs every snapshot needs, walking all trees.
//! 2. Condemn packs: wholly unused ones, and mostly unused ones after copying their
//!    needed blobs into new packs. Condemnations go into a trash file; from then on new
//!    backups do not build on blobs only condemned packs hold.
//! 3. Delete condemned packs that are safe to delete: no snapshot needs a blob that only
//!    they hold (snapshots are listed again, after the sessions, to see backups that just
//!    finished), and no backup session that could have read the index before the
//!    condemnation is still running. The rest wait for a later prune.
//! 4. Write one index file for what remains, then delete the index files it replaces,
//!    then the packs, then the processed trash files.
//!
//! The argument for why this is safe is in `docs/ARCHITECTURE.md`.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use jiff::{SignedDuration, Timestamp};
use serde::Serialize;

use crate::error::{chain, Error, Result};
use crate::id::{BlobId, PackId, SnapshotId};
use crate::index::IndexedPack;
use crate::monitor::Monitor;
use crate::pack::PackEntry;
use crate::repo::Repository;
use crate::session::{self, STALE_AFTER};
use crate::trash::{self, Condemned, TrashFile};
use crate::tree::NodeKind;

/// Clocks of different hosts may disagree by this much; a session that started up to
/// this long after a condemnation still counts as having started before it.
const CLOCK_SKEW: SignedDuration = SignedDuration::from_mins(5);

#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// Repack packs with more than this percentage of unused bytes.
    pub max_unused_percent: f64,
    pub dry_run: bool,
}

impl Default for PruneOptions {
    fn default() -> Self {
        PruneOptions {
            max_unused_percent: 5.0,
            dry_run: false,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct PruneReport {
    pub dry_run: bool,
    pub snapshots: u64,
    pub packs: u64,
    pub blobs_used: u64,
    pub blobs_unused: u64,
    pub bytes_unused: u64,
    /// Packs condemned by this run (wholly unused, or repacked).
    pub packs_condemned: u64,
    pub packs_repacked: u64,
    pub blobs_repacked: u64,
    pub bytes_repacked: u64,
    pub packs_deleted: u64,
    pub bytes_freed: u64,
    /// Condemned packs left for a later prune because a backup may still build on them.
    pub packs_deferred: u64,
    /// Sessions that deferred deletions: host, start time.
    pub blocking_sessions: Vec<String>,
    /// Condemned packs that a snapshot turned out to need; they are kept.
    pub packs_rescued: u64,
    /// Packs in no index file, left alone because a backup was running (they may be
    /// its own). When none runs, such packs are deleted: a failed backup left them.
    pub packs_unindexed: u64,
    pub index_files_replaced: u64,
    pub duration_ms: u64,
}

pub fn prune(
    repo: &mut Repository,
    opts: &PruneOptions,
    monitor: &dyn Monitor,
) -> Result<PruneReport> {
    let started = Instant::now();
    let mut report = PruneReport {
        dry_run: opts.dry_run,
        ..PruneReport::default()
    };

    // 1. What the snapshots need. Snapshots are listed before the index is read: a
    // backup writes its index before its snapshot, so every listed snapshot's blobs are
    // in the index files read after.
    let snapshot_ids: HashSet<SnapshotId> = repo.snapshot_ids()?.into_iter().collect();
    let mut index_files = Vec::new();
    for (id, file) in repo.index_files()? {
        let file = file.map_err(|e| {
            refuse(
                &e,
                "an index file is damaged; run `cairn repair index` first",
            )
        })?;
        index_files.push((id, file));
    }
    let mut trash_files = Vec::new();
    for (name, file) in trash::list(repo)? {
        let file =
            file.map_err(|e| refuse(&e, "a trash file is damaged; remove it and run prune again"))?;
        trash_files.push((name, file));
    }
    let trash_read: Vec<TrashFile> = trash_files.iter().map(|(_, t)| t.clone()).collect();
    repo.set_index(&trash_read, index_files.iter().map(|(_, f)| f));
    let mut used = Used::default();
    for (i, id) in snapshot_ids.iter().enumerate() {
        monitor.progress("snapshots", i as u64, snapshot_ids.len() as u64);
        used.add_snapshot(repo, id)?;
    }
    report.snapshots = snapshot_ids.len() as u64;

    let mut packs: HashMap<PackId, Vec<PackEntry>> = HashMap::new();
    for (_, file) in &index_files {
        for p in &file.packs {
            packs.entry(p.id).or_insert_with(|| p.entries.clone());
        }
    }
    let stored: HashSet<PackId> = repo.list_packs()?.into_iter().collect();
    let mut condemned: HashMap<PackId, Timestamp> = HashMap::new();
    for (_, t) in &trash_files {
        for c in &t.packs {
            condemned.entry(c.id).or_insert(c.condemned_at);
        }
    }
    report.packs = stored.len() as u64;
    report.packs_unindexed = stored
        .iter()
        .filter(|p| !packs.contains_key(p) && !condemned.contains_key(p))
        .count() as u64;

    // 2. Condemn. A needed blob is kept in the one pack the index locates it in (a live
    // one when there is one); other copies count as unused.
    let needed_in = |blob: &BlobId, pack: &PackId| {
        used.contains(blob) && repo.index().get(blob).is_some_and(|l| l.pack == *pack)
    };
    let mut newly_condemned = Vec::new();
    let mut to_repack: Vec<(PackId, Vec<PackEntry>)> = Vec::new();
    let mut live: Vec<&PackId> = packs
        .keys()
        .filter(|p| !condemned.contains_key(p))
        .collect();
    live.sort();
    for pack in live {
        let entries = &packs[pack];
        let (need, spare): (Vec<&PackEntry>, Vec<&PackEntry>) =
            entries.iter().partition(|e| needed_in(&e.id, pack));
        report.blobs_used += need.len() as u64;
        report.blobs_unused += spare.len() as u64;
        let total: u64 = entries.iter().map(|e| e.length as u64).sum();
        let unused: u64 = spare.iter().map(|e| e.length as u64).sum();
        report.bytes_unused += unused;
        if need.is_empty() {
            newly_condemned.push(*pack);
        } else if !spare.is_empty()
            && unused as f64 > total as f64 * opts.max_unused_percent / 100.0
        {
            to_repack.push((*pack, need.into_iter().copied().collect()));
        }
    }
    for (pack, need) in &to_repack {
        report.packs_repacked += 1;
        report.blobs_repacked += need.len() as u64;
        report.bytes_repacked += need.iter().map(|e| e.raw_length as u64).sum::<u64>();
        newly_condemned.push(*pack);
    }
    report.packs_condemned = newly_condemned.len() as u64;
    if opts.dry_run {
        report.packs_deleted = newly_condemned.len() as u64
            + condemned.keys().filter(|p| stored.contains(p)).count() as u64;
        report.duration_ms = started.elapsed().as_millis() as u64;
        return Ok(report);
    }
    if !to_repack.is_empty() {
        repack(repo, &to_repack, monitor)?;
    }
    let now = Timestamp::now();
    let mut new_trash = None;
    if !newly_condemned.is_empty() {
        let file = TrashFile::new(
            newly_condemned
                .iter()
                .map(|&id| Condemned {
                    id,
                    condemned_at: now,
                })
                .collect(),
        );
        new_trash = Some(trash::write(repo, &file)?);
        repo.condemn(newly_condemned.iter().copied());
        // Adding the packs again moves blob locations to live copies where there are any.
        for (_, file) in &index_files {
            repo.absorb(&file.packs);
        }
        for pack in &newly_condemned {
            condemned.insert(*pack, now);
        }
    }

    // 3. Which condemned packs may go now. Sessions first, then snapshots again: a backup
    // that ended after step 1 has removed its session only after writing its snapshot.
    let sessions = session::list(repo)?;
    let new_snapshots: Vec<SnapshotId> = repo
        .snapshot_ids()?
        .into_iter()
        .filter(|id| !snapshot_ids.contains(id))
        .collect();
    // Index files written since step 1, by backups that may have finished meanwhile.
    let known: HashSet<_> = index_files.iter().map(|(id, _)| *id).collect();
    let mut newly_indexed = HashSet::new();
    for (id, file) in repo.index_files()? {
        if known.contains(&id) {
            continue;
        }
        let file = file.map_err(|e| {
            refuse(
                &e,
                "an index file is damaged; run `cairn repair index` first",
            )
        })?;
        newly_indexed.extend(file.packs.iter().map(|p| p.id));
        repo.absorb(&file.packs);
    }
    for id in &new_snapshots {
        used.add_snapshot(repo, id)?;
    }
    let active: Vec<&(String, Option<session::SessionInfo>)> = sessions
        .iter()
        .filter(|(_, info)| match info {
            Some(s) => now.duration_since(s.started) < STALE_AFTER,
            None => true,
        })
        .collect();
    // Packs in no index while no backup runs: left by a backup that failed or was
    // killed. Nothing can build on them (backups dedup only against indexed blobs).
    let orphans: Vec<PackId> = if active.is_empty() {
        stored
            .iter()
            .filter(|p| {
                !packs.contains_key(p) && !condemned.contains_key(p) && !newly_indexed.contains(p)
            })
            .copied()
            .collect()
    } else {
        Vec::new()
    };
    let mut rescued = HashSet::new();
    let mut deferred = HashSet::new();
    let mut deletable = Vec::new();
    for (pack, at) in &condemned {
        let holds_only_copy = packs.get(pack).is_some_and(|entries| {
            entries
                .iter()
                .any(|e| used.contains(&e.id) && !repo.index().contains_live(&e.id))
        });
        if holds_only_copy {
            rescued.insert(*pack);
            continue;
        }
        let blockers: Vec<String> = sessions
            .iter()
            .filter(|(_, info)| match info {
                Some(s) => {
                    now.duration_since(s.started) < STALE_AFTER && s.started < *at + CLOCK_SKEW
                }
                None => true,
            })
            .map(|(name, info)| match info {
                Some(s) => format!("backup from {} started {} ({name})", s.host, s.started),
                None => format!("unreadable session file {name}"),
            })
            .collect();
        if blockers.is_empty() {
            deletable.push(*pack);
        } else {
            deferred.insert(*pack);
            for b in blockers {
                if !report.blocking_sessions.contains(&b) {
                    report.blocking_sessions.push(b);
                }
            }
        }
    }
    report.packs_rescued = rescued.len() as u64;
    report.packs_deferred = deferred.len() as u64;

    // 4. Index first, then packs, then the trash that named them.
    let deleted: HashSet<PackId> = deletable.iter().copied().collect();
    if !deleted.is_empty() {
        let keep: Vec<IndexedPack> = packs
            .iter()
            .filter(|(id, _)| !deleted.contains(id))
            .map(|(id, entries)| IndexedPack {
                id: *id,
                entries: entries.clone(),
            })
            .collect();
        repo.write_index(keep)?;
        for (id, _) in &index_files {
            delete_quietly(repo, &id.storage_name())?;
        }
        report.index_files_replaced = index_files.len() as u64;
        for (i, pack) in deletable.iter().enumerate() {
            monitor.progress("deleting packs", i as u64, deletable.len() as u64);
            let name = pack.storage_name();
            if let Ok(size) = repo.storage().size(&name) {
                report.bytes_freed += size;
            }
            delete_quietly(repo, &name)?;
            report.packs_deleted += 1;
        }
    }
    for pack in &orphans {
        let name = pack.storage_name();
        if let Ok(size) = repo.storage().size(&name) {
            report.bytes_freed += size;
        }
        delete_quietly(repo, &name)?;
        report.packs_deleted += 1;
    }
    report.packs_unindexed = report.packs_unindexed.saturating_sub(orphans.len() as u64);
    let remaining: Vec<Condemned> = condemned
        .iter()
        .filter(|(p, _)| deferred.contains(p))
        .map(|(&id, &condemned_at)| Condemned { id, condemned_at })
        .collect();
    // The remaining condemnations go into one new trash file before the files that held
    // them (those read in step 1 and this run's) are removed.
    let mut replaced: Vec<String> = trash_files.into_iter().map(|(n, _)| n).collect();
    replaced.extend(new_trash);
    let kept = match remaining.is_empty() {
        true => None,
        false => Some(trash::write(repo, &TrashFile::new(remaining))?),
    };
    for name in replaced {
        if Some(&name) != kept.as_ref() {
            delete_quietly(repo, &name)?;
        }
    }
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

fn refuse(e: &Error, what: &str) -> Error {
    Error::InvalidInput(format!("Prune cannot run safely: {what} ({})", chain(e)))
}

fn delete_quietly(repo: &Repository, name: &str) -> Result<()> {
    match repo.storage().delete(name) {
        Ok(()) | Err(cairn_storage::StorageError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Copies the needed blobs of mostly unused packs into new packs, and indexes those.
pub(crate) fn repack(
    repo: &mut Repository,
    packs: &[(PackId, Vec<PackEntry>)],
    monitor: &dyn Monitor,
) -> Result<()> {
    let total: usize = packs.iter().map(|(_, e)| e.len()).sum();
    let mut written = {
        let writer = repo.blob_writer();
        let mut done = 0;
        let copied = packs.iter().flat_map(|(_, e)| e).try_for_each(|e| {
            let data = repo.read_blob(&e.id)?;
            writer.add_copy(e.kind, &data)?;
            done += 1;
            monitor.progress("repacking", done, total as u64);
            Ok(())
        });
        match copied {
            Ok(()) => writer.finish()?,
            Err(e) => return Err(writer.cause(e)),
        }
    };
    repo.index_written(&mut written)?;
    Ok(())
}

/// Every blob some snapshot needs.
#[derive(Default)]
struct Used {
    blobs: HashSet<BlobId>,
}

impl Used {
    fn contains(&self, blob: &BlobId) -> bool {
        self.blobs.contains(blob)
    }

    fn add_snapshot(&mut self, repo: &Repository, id: &SnapshotId) -> Result<()> {
        let snapshot = repo
            .load_snapshot(id)
            .map_err(|e| refuse(&e, &format!("snapshot {} cannot be read", id.short())))?;
        self.add_tree(repo, &snapshot.tree).map_err(|e| {
            refuse(
                &e,
                &format!(
                    "snapshot {} has a damaged tree; run `cairn repair snapshots` first",
                    id.short()
                ),
            )
        })
    }

    fn add_tree(&mut self, repo: &Repository, tree: &BlobId) -> Result<()> {
        if !self.blobs.insert(*tree) {
            return Ok(());
        }
        for node in repo.read_tree(tree)?.nodes {
            match node.kind {
                NodeKind::Dir { subtree } => self.add_tree(repo, &subtree)?,
                NodeKind::File { content, .. } => self.blobs.extend(content.iter().map(|c| c.blob)),
                _ => {}
            }
        }
        Ok(())
    }
}

//! `prune`: delete what no snapshot needs, without a lock and without ever deleting data
//! that a concurrent backup builds on, whatever the hosts' clocks say.
//!
//! 1. Register a maintenance session; refuse if another prune or repair runs.
//! 2. Find the blobs every snapshot needs, walking all trees. Index the packs that no
//!    index file names (a killed backup's, a crashed repack's) once they are older than
//!    the grace period by the storage's clock.
//! 3. Condemn packs in a new trash generation: wholly unused ones, and mostly unused
//!    ones after copying their needed blobs into new packs. From then on new backups do
//!    not build on blobs only condemned packs hold.
//! 4. Delete condemned packs that are safe to delete: no snapshot needs a blob that only
//!    they hold (snapshots are listed again, after the sessions, to see backups that just
//!    finished), and every live session has observed the generation that condemned them.
//!    The rest wait for a later prune.
//! 5. Write one index file for what remains, then delete the index files it replaces,
//!    then the packs, then rewrite the trash; remove old temporary files and the files of
//!    sessions that ended without doing so.
//!
//! The argument for why this is safe is in `docs/ARCHITECTURE.md`.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::error::{chain, Error, Result};
use crate::id::{BlobId, IndexId, PackId, SnapshotId};
use crate::index::{IndexFile, IndexedPack};
use crate::monitor::Monitor;
use crate::pack::PackEntry;
use crate::repo::Repository;
use crate::session::{self, Host, Session};
use crate::trash::{self, Condemned};
use crate::tree::NodeKind;

/// Packs in no index file and temporary files younger than this (by the storage's
/// clock) may belong to a backup that is still writing; `CAIRN_GRACE_SECS` overrides.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// Repack packs with more than this percentage of unused bytes.
    pub max_unused_percent: f64,
    pub dry_run: bool,
    /// Host name recorded in the prune's session file.
    pub host: String,
}

impl Default for PruneOptions {
    fn default() -> Self {
        PruneOptions {
            max_unused_percent: 5.0,
            dry_run: false,
            host: "localhost".into(),
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
    /// Writers' packs read and found to hold exactly what their ids say: from now on
    /// full keys build on them too (format 3).
    pub writer_packs_verified: u64,
    pub blobs_repacked: u64,
    pub bytes_repacked: u64,
    pub packs_deleted: u64,
    pub bytes_freed: u64,
    /// Condemned packs left for a later prune because a backup may still build on them.
    pub packs_deferred: u64,
    /// Sessions that deferred deletions.
    pub blocking_sessions: Vec<String>,
    /// Condemned packs that a snapshot turned out to need; they are kept.
    pub packs_rescued: u64,
    /// Packs in no index file that this run indexed (left by a backup or repack that did
    /// not finish); unused ones are condemned like any other.
    pub packs_adopted: u64,
    /// Packs in no index file left alone: younger than the grace period (a backup may be
    /// writing them), or with an unreadable header (see `check`).
    pub packs_unindexed: u64,
    pub index_files_replaced: u64,
    /// Temporary files of cut writes, older than the grace period, deleted.
    pub temporaries_deleted: u64,
    /// Files of sessions that ended without removing them (crashed, stopped), removed.
    pub sessions_removed: u64,
    pub duration_ms: u64,
}

/// The grace period for packs in no index and temporary files.
pub fn grace() -> Duration {
    std::env::var("CAIRN_GRACE_SECS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(DEFAULT_GRACE, Duration::from_secs)
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
    let here = Host::this();
    // A dry run changes nothing, so it needs no session.
    let session = match opts.dry_run {
        true => None,
        false => Some(Session::start_maintenance(repo, &opts.host, &here)?),
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
    let mut trash = trash::read(repo)?;
    if let Some(e) = trash.problems.first() {
        return Err(refuse(
            e,
            "a trash file cannot be read, so which packs are condemned is unknown; \
             if it is damaged, delete it (its packs are then simply kept) and run prune again",
        ));
    }
    repo.set_index(&trash, index_files.iter().map(|(_, f)| f));
    let mut used = Used::default();
    for (i, id) in snapshot_ids.iter().enumerate() {
        monitor.progress("snapshots", i as u64, snapshot_ids.len() as u64);
        used.add_snapshot(repo, id)?;
    }
    report.snapshots = snapshot_ids.len() as u64;

    let (mut packs, disputed, overruled) = pack_entries(index_files.iter().map(|(_, f)| f));
    // Index files that said something about a pack that its header or a full key's file
    // contradicts are replaced, whatever else this run does.
    let rewrite_index = overruled || !disputed.is_empty();
    // A pack two files name says itself what it holds: a planted file may list blobs it
    // does not hold, which the index written below would otherwise repeat.
    for pack in disputed {
        match repo.read_pack_header(&pack) {
            Ok(entries) => {
                packs.insert(pack, entries);
            }
            Err(e @ Error::Storage(_)) if !is_not_found(&e) => return Err(e),
            // Gone (handled below), or a header that does not open: the files' word.
            Err(_) => {}
        }
    }
    let stored: HashMap<PackId, SystemTime> = repo.list_packs_modified()?.into_iter().collect();
    report.packs = stored.len() as u64;
    // Packs the index names but storage lacks are gone (they were listed after the index
    // was read, and a pack is stored before any index names it): deleted by hand, lost,
    // or deleted by a prune while another one, paused, still held them. The copies of
    // their blobs elsewhere are the ones needed; the index written below drops them.
    let gone: Vec<PackId> = packs
        .keys()
        .filter(|p| !stored.contains_key(p))
        .copied()
        .collect();
    if !gone.is_empty() {
        repo.condemn(gone.iter().copied());
        for (_, file) in &index_files {
            repo.absorb_file(file);
        }
        for p in &gone {
            packs.remove(p);
        }
    }

    // Packs in no index: index them once older than the grace period by the storage's
    // clock (a backup writing them indexes them itself long before).
    let mut replaced_files: Vec<IndexId> = index_files.iter().map(|(id, _)| *id).collect();
    // The highest generation any session has observed: new ones go above it, even if the
    // trash file that said so was deleted by hand.
    let mut floor = 0;
    if let Some(session) = &session {
        let survey = session.survey(repo, &here)?;
        floor = observed_floor(&survey);
        fresh(session)?;
        let grace = grace();
        let old = |p: &PackId| {
            stored
                .get(p)
                .is_some_and(|t| survey.now.duration_since(*t).unwrap_or_default() > grace)
        };
        let (adopted, file) = repo.adopt_unindexed_packs(|p| !trash.is_condemned(p) && old(p))?;
        report.packs_adopted = adopted.len() as u64;
        replaced_files.extend(file);
        for p in adopted {
            packs.insert(p.id, p.entries);
        }
    }
    report.packs_unindexed = stored
        .keys()
        .filter(|p| !packs.contains_key(p) && !trash.is_condemned(p))
        .count() as u64;

    // 2. Condemn. A needed blob is kept in the one pack the index locates it in (a live
    // one when there is one); other copies count as unused.
    let needed_in = |blob: &BlobId, pack: &PackId| {
        used.contains(blob) && repo.index().get(blob).is_some_and(|l| l.pack == *pack)
    };
    let mut newly_condemned = Vec::new();
    let mut to_repack: Vec<(PackId, Vec<PackEntry>)> = Vec::new();
    let mut vouched: Vec<PackId> = Vec::new();
    let mut live: Vec<&PackId> = packs.keys().filter(|p| !trash.is_condemned(p)).collect();
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
        // A writer's pack that holds needed blobs is read once: if every blob in it is
        // what its id says, full keys may build on it from now on (the index written
        // below names it as theirs) and its writer keeps deduplicating against it. One
        // that does not verify has its good needed blobs re-sealed, and goes.
        let mut writer_unverified = false;
        if !need.is_empty() && repo.index().is_writer_pack(pack) {
            match session.is_some() && vouch(repo, pack, entries)? {
                true => vouched.push(*pack),
                false => writer_unverified = true,
            }
        }
        if need.is_empty() {
            newly_condemned.push(*pack);
        } else if writer_unverified
            || (!spare.is_empty() && unused as f64 > total as f64 * opts.max_unused_percent / 100.0)
        {
            to_repack.push((*pack, need.into_iter().copied().collect()));
        }
    }
    report.writer_packs_verified = vouched.len() as u64;
    repo.trust_writer_packs(vouched.iter().copied());
    for (pack, need) in &to_repack {
        report.packs_repacked += 1;
        report.blobs_repacked += need.len() as u64;
        report.bytes_repacked += need.iter().map(|e| e.raw_length as u64).sum::<u64>();
        newly_condemned.push(*pack);
    }
    report.packs_condemned = newly_condemned.len() as u64;
    let Some(session) = session else {
        // What a run would delete, sized as the run sizes what it deletes.
        let condemned = trash.packs.keys().filter(|p| stored.contains_key(p));
        for pack in newly_condemned.iter().chain(condemned) {
            report.packs_deleted += 1;
            if let Ok(size) = repo.storage().size(&pack.storage_name()) {
                report.bytes_freed += size;
            }
        }
        report.duration_ms = started.elapsed().as_millis() as u64;
        return Ok(report);
    };
    if !to_repack.is_empty() {
        fresh(&session)?;
        repack(repo, &to_repack, monitor)?;
    }
    // Copied by this run, from copies that were read and verified as they were (those
    // left out as damaged are in no pack that stays: their packs are rescued first).
    let copied: HashSet<BlobId> = to_repack
        .iter()
        .flat_map(|(_, need)| need.iter().map(|e| e.id))
        .collect();
    // Packs condemned in generation 0 (a backup found them missing) that are stored after
    // all (put back by hand, `serve undelete`): a session that read the trash before may
    // build on them, so they are condemned anew and wait like packs condemned now.
    let reborn = trash
        .packs
        .values()
        .filter(|c| c.generation == 0 && stored.contains_key(&c.id))
        .map(|c| c.id);
    let condemning: Vec<PackId> = newly_condemned.iter().copied().chain(reborn).collect();
    if !condemning.is_empty() {
        // A prune paused for long may have been taken for crashed, and another may have
        // written the trash since: condemning on this stale view would break the rule
        // that a session knows every condemnation up to the generation it observed.
        fresh(&session)?;
        trash::condemn(repo, &mut trash, &condemning, floor)?;
        repo.condemn(newly_condemned.iter().copied());
        // Adding the packs again moves blob locations to live copies where there are any.
        for (_, file) in &index_files {
            repo.absorb_file(file);
        }
    }

    // 3. Which condemned packs may go now. Sessions first (after the trash is written:
    // a session missing from this listing starts later and reads the new trash), then
    // snapshots again: a backup that ended after step 1 removed its session only after
    // writing its snapshot.
    session.beat()?;
    let survey = session.survey(repo, &here)?;
    if session.lost() {
        return Err(paused());
    }
    let current = trash.generation;
    let new_snapshots: Vec<SnapshotId> = repo
        .snapshot_ids()?
        .into_iter()
        .filter(|id| !snapshot_ids.contains(id))
        .collect();
    // Index files written since step 1, by backups that may have finished meanwhile.
    let known: HashSet<IndexId> = replaced_files.iter().copied().collect();
    for (id, file) in repo.index_files()? {
        if known.contains(&id) {
            continue;
        }
        match file {
            // Not added to `packs`: the file stays, and the index written below must not
            // name its packs a second time.
            Ok(file) => repo.absorb_file(&file),
            // Only this prune deletes index files, and it has not yet: damage.
            Err(e) => {
                return Err(refuse(
                    &e,
                    "an index file is damaged; run `cairn repair index` first",
                ))
            }
        }
    }
    for id in &new_snapshots {
        used.add_snapshot(repo, id)?;
    }
    let live_sessions: Vec<&session::SessionView> = survey.live().collect();
    let mut rescued = HashSet::new();
    let mut deferred = HashSet::new();
    let mut deletable = Vec::new();
    let mut condemned: Vec<&Condemned> = trash.packs.values().collect();
    condemned.sort_by_key(|c| c.id);
    for c in condemned {
        // Generation 0: a pack some backup found missing, or a trash file from before
        // generations. If it is stored after all, sessions may have built on it: it waits
        // like a pack condemned now.
        let generation = match c.generation {
            0 => current,
            g => g,
        };
        // Already gone (deleted by hand, or by a prune that stopped before rewriting the
        // trash): nothing to wait for; it leaves the index and the trash.
        if !stored.contains_key(&c.id) {
            deletable.push(c.id);
            continue;
        }
        let holds_only_copy = packs.get(&c.id).is_some_and(|entries| {
            entries
                .iter()
                .any(|e| used.contains(&e.id) && !repo.index().contains_live(&e.id))
        });
        if holds_only_copy {
            rescued.insert(c.id);
            continue;
        }
        let blockers: Vec<String> = live_sessions
            .iter()
            .filter(|v| !may_delete(generation, v.info.as_ref().and_then(|i| i.observed)))
            .map(|v| match &v.info {
                Some(i) => i.describe(),
                None => format!("unreadable session file {}", v.files.join(", ")),
            })
            .collect();
        if blockers.is_empty() {
            deletable.push(c.id);
        } else {
            deferred.insert(c.id);
            for b in blockers {
                if !report.blocking_sessions.contains(&b) {
                    report.blocking_sessions.push(b);
                }
            }
        }
    }
    // The last word before a pack goes is its own header: whatever the index files say,
    // every blob a snapshot needs that the pack holds must be in a pack that stays, and
    // that copy must be whole. Index files are anyone's who can write (a thief with a
    // writer's key and an append-only token can add one that lists a pack as empty).
    let leaving: HashSet<PackId> = deletable.iter().chain(&gone).copied().collect();
    // Blobs whose copy in a pack that stays was read and found whole.
    let mut whole = HashSet::new();
    let mut kept = Vec::new();
    for pack in &deletable {
        if !stored.contains_key(pack) {
            continue;
        }
        let listed = packs.get(pack).map_or(&[][..], Vec::as_slice);
        if let Some(why) = still_needed(repo, pack, listed, &used, &leaving, &copied, &mut whole)? {
            let path = std::path::PathBuf::from(pack.storage_name());
            monitor.problem(&path, &format!("kept: {why}"));
            kept.push(*pack);
        }
    }
    deletable.retain(|p| !kept.contains(p));
    rescued.extend(kept);
    report.packs_rescued = rescued.len() as u64;
    report.packs_deferred = deferred.len() as u64;

    // 4. Index first, then packs, then the trash that named them. A prune paused since
    // its decisions may have been taken for crashed, and another may have run: then
    // these decisions are stale.
    fresh(&session)?;
    let deleted: HashSet<PackId> = deletable.iter().copied().chain(gone).collect();
    if !deleted.is_empty() || !vouched.is_empty() || rewrite_index {
        let keep: Vec<IndexedPack> = packs
            .iter()
            .filter(|(id, _)| !deleted.contains(id))
            .map(|(id, entries)| IndexedPack {
                id: *id,
                entries: entries.clone(),
            })
            .collect();
        repo.write_index(keep)?;
        for id in &replaced_files {
            delete_quietly(repo, &id.storage_name())?;
        }
        report.index_files_replaced = replaced_files.len() as u64;
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
    if !deleted.is_empty() || !rescued.is_empty() {
        let remaining: Vec<Condemned> = trash
            .packs
            .values()
            .filter(|c| deferred.contains(&c.id))
            .map(|c| match c.generation {
                0 => Condemned {
                    generation: current,
                    ..*c
                },
                _ => *c,
            })
            .collect();
        let generation = trash.generation;
        fresh(&session)?;
        trash::replace(repo, &mut trash, generation, remaining)?;
    }

    // 5. What cut writes and ended sessions left behind. Not while another session is
    // live: a backup into a local repository writes each data pack to a temporary file
    // until the pack is full, which takes as long as its source takes (a slow stream on
    // standard input), so a temporary file older than the grace period may be in use.
    let grace = grace();
    let writers_live = survey.live().next().is_some();
    for (name, time) in repo.storage().temporaries()? {
        if !writers_live && survey.now.duration_since(time).unwrap_or_default() > grace {
            match repo.storage().delete_temporary(&name) {
                Ok(()) | Err(cairn_storage::StorageError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            report.temporaries_deleted += 1;
        }
    }
    // An ended session's file tells the next backup to adopt what it left in no index;
    // it stays until no such pack is left.
    if report.packs_unindexed == 0 {
        for (view, _) in survey.ended() {
            session::remove(repo, view)?;
            report.sessions_removed += 1;
        }
    }
    session.finish();
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// Whether a pack condemned in generation `condemned` may be deleted while a session
/// that has observed generation `observed` is live: only if that session read the trash
/// with the condemnation in it (then it does not build on the pack).
pub fn may_delete(condemned: u64, observed: Option<u64>) -> bool {
    observed.is_some_and(|o| o >= condemned)
}

/// Writes a session file and fails if the session was ever lost: called before each
/// write that acts on decisions made earlier.
pub(crate) fn fresh(session: &Session) -> Result<()> {
    session.beat()?;
    match session.lost() {
        true => Err(paused()),
        false => Ok(()),
    }
}

/// The highest trash generation any session, live or ended, says it has observed.
pub(crate) fn observed_floor(survey: &session::Survey) -> u64 {
    survey
        .others
        .iter()
        .filter_map(|(v, _)| v.info.as_ref()?.observed)
        .max()
        .unwrap_or(0)
}

fn paused() -> Error {
    Error::InvalidInput(
        "This prune was paused (or could not write its session file) for so long that \
         another prune may have started meanwhile; nothing was deleted. Run it again"
            .into(),
    )
}

fn refuse(e: &Error, what: &str) -> Error {
    Error::InvalidInput(format!("Prune cannot run safely: {what} ({})", chain(e)))
}

fn delete_quietly(repo: &Repository, name: &str) -> Result<()> {
    Ok(cairn_storage::delete_if_present(
        repo.storage().as_ref(),
        name,
    )?)
}

/// Whether every blob the index places in writer's pack `pack` opens and hashes to its
/// id. A pack gone meanwhile is not vouched for.
fn vouch(repo: &Repository, pack: &PackId, entries: &[PackEntry]) -> Result<bool> {
    let bytes = match repo.storage().read(&pack.storage_name()) {
        Ok(bytes) => bytes,
        Err(cairn_storage::StorageError::NotFound { .. }) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    Ok(entries
        .iter()
        .all(|e| crate::pack::verify_blob(repo.key(), &bytes, e)))
}

/// What each pack holds, by the index files: every blob that files naming the pack as
/// the repository's own (sealed with a full key) list there, or, for a pack no such file
/// names, every blob that writers' files list. No one file can make a pack look emptier
/// than the others say it is, nor can a writer's file speak for a pack of a full key.
/// Also returns the packs that more than one file of that standing names, and whether a
/// writer's file named a pack of a full key.
fn pack_entries<'a>(
    files: impl Iterator<Item = &'a IndexFile>,
) -> (HashMap<PackId, Vec<PackEntry>>, Vec<PackId>, bool) {
    // Per pack: whether a full key's file named it, and its entries.
    let mut packs: HashMap<PackId, (bool, Vec<PackEntry>)> = HashMap::new();
    let mut disputed = HashSet::new();
    let mut overruled = false;
    for file in files {
        for p in &file.packs {
            let own = !file.writer_packs.contains(&p.id);
            match packs.get_mut(&p.id) {
                None => {
                    packs.insert(p.id, (own, p.entries.clone()));
                }
                Some(known) if own && !known.0 => {
                    *known = (true, p.entries.clone());
                    disputed.remove(&p.id);
                    overruled = true;
                }
                // The same entries again (old and new index files both left by a prune
                // that stopped before deleting the old ones): nothing to settle.
                Some(known) if own == known.0 && known.1 == p.entries => {}
                Some(known) if own == known.0 => {
                    // Rare (a pack two files name differently): only then a set.
                    let ids: HashSet<BlobId> = known.1.iter().map(|e| e.id).collect();
                    known
                        .1
                        .extend(p.entries.iter().filter(|e| !ids.contains(&e.id)));
                    disputed.insert(p.id);
                }
                Some(_) => overruled = true,
            }
        }
    }
    let packs = packs
        .into_iter()
        .map(|(id, (_, entries))| (id, entries))
        .collect();
    (packs, disputed.into_iter().collect(), overruled)
}

fn is_not_found(e: &Error) -> bool {
    matches!(
        e,
        Error::Storage(cairn_storage::StorageError::NotFound { .. })
    )
}

/// Why `pack`, about to be deleted, must stay: a blob its own header lists is one some
/// snapshot needs, whole in it, and no other pack that stays holds it whole (`copied`
/// were copied by this run, `checked` found whole before: neither needs a second look).
/// `None` if it may go. Where the
/// header cannot be read (a damaged pack `repair index` condemned), what the index
/// files `listed` there stands in for it.
fn still_needed(
    repo: &Repository,
    pack: &PackId,
    listed: &[PackEntry],
    used: &Used,
    leaving: &HashSet<PackId>,
    copied: &HashSet<BlobId>,
    checked: &mut HashSet<BlobId>,
) -> Result<Option<String>> {
    let entries = match repo.read_pack_header(pack) {
        Ok(entries) => entries,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e @ Error::Storage(_)) => return Err(e),
        Err(_) => listed.to_vec(),
    };
    for e in entries.iter().filter(|e| used.contains(&e.id)) {
        if copied.contains(&e.id) || checked.contains(&e.id) {
            continue;
        }
        let elsewhere = repo
            .index()
            .get(&e.id)
            .filter(|l| l.pack != *pack && !leaving.contains(&l.pack));
        let whole = match elsewhere {
            Some(l) => is_whole(repo, &e.id, &l)?,
            None => false,
        };
        // Keeping the pack helps only if its own copy is whole (a writer's blob that did
        // not verify, left out of its repack, is garbage here too).
        let here = crate::index::BlobLocation {
            pack: *pack,
            kind: e.kind,
            offset: e.offset,
            length: e.length,
            raw_length: e.raw_length,
        };
        if !whole && is_whole(repo, &e.id, &here)? {
            return Ok(Some(format!(
                "it holds blob {}, which a snapshot needs, and no pack that stays holds it whole",
                e.id
            )));
        }
        if whole {
            checked.insert(e.id);
        }
    }
    Ok(None)
}

/// Whether blob `id` at `loc` opens, decompresses and hashes to its id.
fn is_whole(repo: &Repository, id: &BlobId, loc: &crate::index::BlobLocation) -> Result<bool> {
    let sealed = match repo.read_pack_range(
        &loc.pack.storage_name(),
        u64::from(loc.offset),
        u64::from(loc.length),
    ) {
        Ok(sealed) => sealed,
        Err(
            cairn_storage::StorageError::NotFound { .. }
            | cairn_storage::StorageError::Truncated { .. },
        ) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let entry = PackEntry {
        id: *id,
        kind: loc.kind,
        offset: 0,
        length: loc.length,
        raw_length: loc.raw_length,
    };
    Ok(crate::pack::verify_blob(repo.key(), &sealed, &entry))
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
        let copied = packs.iter().try_for_each(|(pack, entries)| {
            entries.iter().try_for_each(|e| {
                let data = match repo.read_blob(&e.id) {
                    Ok(data) => data,
                    // A writer's blob that does not open as its id is a writer's garbage
                    // (or a thief's): nothing of a full key's relies on it. It is left
                    // out, and whatever snapshot names it is damaged for `check`.
                    Err(err @ Error::BlobDamaged { .. }) if repo.index().is_writer_pack(pack) => {
                        let path = std::path::PathBuf::from(pack.storage_name());
                        monitor.problem(
                            &path,
                            &format!("blob {} left out, it does not verify: {err}", e.id),
                        );
                        return Ok(());
                    }
                    Err(err) => return Err(err),
                };
                writer.add_copy(e.kind, &data)?;
                done += 1;
                monitor.progress("repacking", done, total as u64);
                Ok(())
            })
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
        let snapshot = match repo.load_snapshot(id) {
            Ok(snapshot) => snapshot,
            // Removed since it was listed (forget, or a backup taking it back): it needs
            // nothing any more.
            Err(Error::Storage(cairn_storage::StorageError::NotFound { .. })) => return Ok(()),
            Err(e) => {
                return Err(refuse(
                    &e,
                    &format!("snapshot {} cannot be read", id.short()),
                ))
            }
        };
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

//! The commit check: what a backup, copy or repair verifies just before (and, if its
//! session went silent meanwhile, just after) writing a snapshot, so that no snapshot
//! relies on a pack that is gone or about to go.
//!
//! A writer relies on packs in two ways: blobs it stored itself and blobs it found in
//! the index (dedup, unchanged files, shared trees). Every such pack must exist. While
//! its session stayed live, a pack condemned after the session observed the trash
//! cannot be deleted until the session ends, and the snapshot written before that end
//! makes prune keep it. A pack condemned in a generation the session has observed may
//! go at any time, and a session that may have been taken for crashed ("lost") cannot
//! count on any condemned pack: both are unsafe. See `docs/ARCHITECTURE.md`.

use std::collections::HashSet;

use crate::error::Result;
use crate::id::PackId;
use crate::id::SnapshotId;
use crate::repo::Repository;
use crate::session::Session;
use crate::snapshot::Snapshot;

/// Above this many packs, one listing of `data/` is cheaper than asking for each: on a
/// remote store a request each against a few listing requests. On a local one a listing
/// opens all 256 directories of `data/`, 0.36 ms for the repository of the mixed corpus
/// (60 packs), where `stat` of its 58 packs takes 0.1 ms (both timed in loops, warm
/// cache); a listing pays only for thousands.
fn list_above(remote: bool) -> usize {
    if remote {
        32
    } else {
        4096
    }
}

/// The packs of `relied` that a snapshot may not build on: missing ones, and condemned
/// ones that a prune may delete at once (condemned in a generation the session has
/// observed, or in any generation if the session is lost). Sorted.
pub fn unsafe_packs(
    relied: &HashSet<PackId>,
    exists: impl Fn(&PackId) -> bool,
    condemned: impl Fn(&PackId) -> bool,
) -> Vec<PackId> {
    let mut out: Vec<PackId> = relied
        .iter()
        .filter(|p| !exists(p) || condemned(p))
        .copied()
        .collect();
    out.sort();
    out
}

/// Whether a pack condemned in `generation` may be deleted while this session lives, so
/// that the session must not build on it: one whose generation it has observed (it knew
/// of the condemnation, or should have), or any for a lost session.
pub fn deletable_under(generation: u64, observed: Option<u64>, lost: bool) -> bool {
    lost || crate::ops::prune::may_delete(generation, observed)
}

/// Checks `relied` against the storage (and, for a lost session, a fresh read of the
/// trash). Returns the packs the writer must not build on; empty when it may commit.
/// Missing packs are recorded in the trash ([`crate::trash::mark_missing`]).
pub fn check(
    repo: &Repository,
    session: &Session,
    relied: &HashSet<PackId>,
) -> Result<Vec<PackId>> {
    let lost = session.lost();
    if lost {
        // Live again for prunes from now on; what they did meanwhile is checked below.
        session.beat()?;
    }
    if repo.key().is_write_only() {
        return check_as_writer(repo, relied, lost);
    }
    let observed = session.info().observed;
    // Read again even by a session that never went silent: a condemnation it should
    // have known of (a prune that wrote a trash file on a stale view, a trash file
    // deleted by hand) must not slip through.
    let trash = crate::trash::read(repo)?;
    let stored: Option<HashSet<PackId>> =
        match relied.len() > list_above(repo.storage().is_remote()) {
            true => Some(repo.list_packs()?.into_iter().collect()),
            false => None,
        };
    let mut missing = HashSet::new();
    if stored.is_none() {
        for pack in relied {
            if !repo.storage().exists(&pack.storage_name())? {
                missing.insert(*pack);
            }
        }
    }
    let exists = |p: &PackId| match &stored {
        Some(s) => s.contains(p),
        None => !missing.contains(p),
    };
    let gone: Vec<PackId> = relied.iter().filter(|p| !exists(p)).copied().collect();
    if !gone.is_empty() {
        // Readers then prefer the copies the writer stores again.
        crate::trash::mark_missing(repo, &gone)?;
    }
    let condemned = |p: &PackId| match trash.packs.get(p) {
        Some(c) => deletable_under(c.generation, observed, lost),
        // What an unreadable trash file condemns is unknown; a lost session cannot
        // count on prunes waiting for it.
        None => lost && !trash.problems.is_empty(),
    };
    Ok(unsafe_packs(relied, exists, condemned))
}

/// [`check`] for a write-only key, which cannot read the trash: its session observed
/// nothing (`observed: null`), so no prune deletes a pack while it is live, and a gone
/// pack is all it must look for. A lost session cannot tell what prunes condemned
/// meanwhile, so everything it relies on counts as unsafe and is stored again. It marks
/// nothing missing: only full keys write trash files.
fn check_as_writer(repo: &Repository, relied: &HashSet<PackId>, lost: bool) -> Result<Vec<PackId>> {
    if lost {
        return Ok(relied.iter().copied().collect());
    }
    let stored: HashSet<PackId> = repo.list_packs()?.into_iter().collect();
    Ok(relied
        .iter()
        .filter(|p| !stored.contains(p))
        .copied()
        .collect())
}

/// Every pack a writer's result relies on: those it stored and those it reused.
pub fn relied_packs(written: &crate::writer::WriterReport) -> HashSet<PackId> {
    let mut packs: HashSet<PackId> = written.reused_packs.clone();
    packs.extend(written.stored.by_pack().packs().copied());
    packs
}

/// Writes `snapshot` after [`check`] found nothing unsafe. If the session went silent
/// between that check and the write, long enough that a prune may have taken it for
/// crashed, the check runs again; on a problem the snapshot is deleted at once and the
/// packs returned.
pub fn save_snapshot(
    repo: &Repository,
    session: &Session,
    relied: &HashSet<PackId>,
    snapshot: &Snapshot,
    checked_at: std::time::Duration,
) -> Result<std::result::Result<SnapshotId, Vec<PackId>>> {
    let id = repo.save_snapshot(snapshot)?;
    if crate::session::boot_time().saturating_sub(checked_at) < session.lost_after() {
        return Ok(Ok(id));
    }
    let unsafe_packs = check(repo, session, relied)?;
    if unsafe_packs.is_empty() {
        return Ok(Ok(id));
    }
    cairn_storage::delete_if_present(repo.storage().as_ref(), &id.storage_name())?;
    Ok(Err(unsafe_packs))
}

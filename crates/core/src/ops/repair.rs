//! `repair index` and `repair snapshots`: get a damaged repository back to one that checks
//! clean, keeping everything that can still be read.
//!
//! - The index is rebuilt from the pack headers alone: one new index file is written for
//!   every pack whose header reads, then the old index files are removed.
//! - Snapshots whose files need blobs that are gone are rewritten: a damaged file keeps the
//!   chunks that remain, under its name plus `.damaged`; an unreadable directory becomes an
//!   empty one marked the same way. The new snapshot carries the tag `repaired`.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::error::{chain, Result};
use crate::id::{BlobId, PackId, SnapshotId};
use crate::index::IndexedPack;
use crate::monitor::Monitor;
use crate::pack::BlobKind;
use crate::pack::PackEntry;
use crate::repo::Repository;
use crate::snapshot::Snapshot;
use crate::tree::{NodeKind, Tree};
use crate::writer::BlobWriter;

#[derive(Debug, Clone, Default, Serialize)]
pub struct IndexRepairReport {
    pub packs_indexed: u64,
    pub blobs_indexed: u64,
    /// Packs whose header could not be read, with the reason; their blobs are lost.
    pub packs_unreadable: Vec<(String, String)>,
    pub index_files_replaced: u64,
    /// With `read_data`: blobs left out of the index because their data is damaged. A
    /// later backup of the same files stores them again.
    pub blobs_damaged: u64,
    /// Packs with damaged blobs whose good blobs were copied out; `prune` deletes them.
    pub packs_condemned: u64,
    /// Packs whose header is damaged: their blobs were taken from the old index (and,
    /// with `read_data`, verified and copied to new packs).
    pub packs_header_damaged: Vec<String>,
    /// The index files already say what the packs hold: nothing was written or removed.
    pub up_to_date: bool,
}

/// Rebuilds the index from the pack headers; with `read_data`, every blob is verified
/// and damaged ones are left out. When the index files already say exactly that, nothing
/// is written, so a second run changes nothing.
pub fn repair_index(
    repo: &mut Repository,
    read_data: bool,
    monitor: &dyn Monitor,
) -> Result<IndexRepairReport> {
    let mut report = IndexRepairReport::default();
    // Index files are replaced and packs condemned: no prune may run meanwhile.
    let session = crate::session::Session::start_maintenance(
        repo,
        &crate::session::local_host_name(),
        &crate::session::Host::this(),
    )?;
    // Read after the session exists, like everything this repair decides on.
    repo.load_index()?;
    let old: Vec<String> = repo.storage().list("index")?;
    let (known, known_complete) = indexed_by_files(repo)?;
    let packs = repo.list_packs()?;
    let mut indexed = Vec::with_capacity(packs.len());
    // Packs with damaged blobs: their good blobs move to new packs, then they are condemned.
    let mut damaged = Vec::new();
    let mut writer_packs = Vec::new();
    for (i, pack) in packs.iter().enumerate() {
        monitor.progress("reading packs", i as u64, packs.len() as u64);
        let before = known.get(pack);
        if repo.index().is_condemned(pack) {
            if let Some(entries) = before {
                // Condemned by prune or by an earlier repair, which copied out what was
                // needed: nothing relies on it and prune deletes it, so it keeps the entries
                // it was condemned with rather than being verified, copied and condemned
                // again on every run.
                indexed.push(IndexedPack {
                    id: *pack,
                    entries: entries.clone(),
                });
                continue;
            }
        }
        match inspect_pack(repo, pack, read_data, before.cloned()) {
            Ok(found) => {
                report.blobs_indexed += found.entries.len() as u64;
                report.blobs_damaged += found.damaged_blobs;
                if !found.header_ok {
                    report.packs_header_damaged.push(pack.storage_name());
                }
                if found.by_writer {
                    writer_packs.push(*pack);
                }
                if read_data
                    && (found.damaged_blobs > 0 || !found.header_ok)
                    && !repo.index().is_condemned(pack)
                {
                    damaged.push((*pack, found.entries.clone()));
                }
                indexed.push(IndexedPack {
                    id: *pack,
                    entries: found.entries,
                });
            }
            Err(e) => report
                .packs_unreadable
                .push((pack.storage_name(), chain(&e))),
        }
    }
    report.packs_indexed = indexed.len() as u64;
    if known_complete && damaged.is_empty() && same_packs(&known, &indexed) {
        report.up_to_date = true;
        session.finish();
        return Ok(report);
    }
    // A repair paused long enough to be taken for crashed may be acting on packs a prune
    // has deleted since.
    crate::ops::prune::fresh(&session)?;
    repo.mark_writer_packs(writer_packs);
    let new = repo.write_index(indexed)?.map(|id| id.storage_name());
    for name in old {
        if Some(&name) != new.as_ref() {
            cairn_storage::delete_if_present(repo.storage().as_ref(), &name)?;
            report.index_files_replaced += 1;
        }
    }
    repo.load_index()?;
    if !damaged.is_empty() {
        crate::ops::prune::repack(repo, &damaged, monitor)?;
        let damaged: Vec<PackId> = damaged.iter().map(|(id, _)| *id).collect();
        crate::ops::prune::fresh(&session)?;
        let floor = crate::ops::prune::observed_floor(
            &session.survey(repo, &crate::session::Host::this())?,
        );
        crate::trash::condemn_with_care(repo, &damaged, floor)?;
        report.packs_condemned = damaged.len() as u64;
        repo.load_index()?;
    }
    session.finish();
    Ok(report)
}

/// What the index files say each pack holds (every file's entries, not only the
/// location the in-memory index prefers for a blob two packs hold), and whether every
/// index file could be read. Holds the entries once more while repairing, which is rare.
fn indexed_by_files(repo: &Repository) -> Result<(HashMap<PackId, Vec<PackEntry>>, bool)> {
    let mut known: HashMap<PackId, Vec<PackEntry>> = HashMap::new();
    let mut complete = true;
    for (_, file) in repo.index_files()? {
        match file {
            Ok(file) => {
                for p in file.packs {
                    known.entry(p.id).or_default().extend(p.entries);
                }
            }
            Err(_) => complete = false,
        }
    }
    for entries in known.values_mut() {
        sort_entries(entries);
        entries.dedup();
    }
    Ok((known, complete))
}

fn sort_entries(entries: &mut [PackEntry]) {
    entries.sort_by_key(|e| (e.id, e.offset, e.length));
}

/// Whether the index files name exactly these packs with exactly these blobs.
fn same_packs(known: &HashMap<PackId, Vec<PackEntry>>, indexed: &[IndexedPack]) -> bool {
    known.len() == indexed.len()
        && indexed.iter().all(|p| {
            known.get(&p.id).is_some_and(|k| {
                let mut entries = p.entries.clone();
                sort_entries(&mut entries);
                entries.dedup();
                *k == entries
            })
        })
}

/// What the repair learned about one pack.
struct PackFindings {
    entries: Vec<PackEntry>,
    damaged_blobs: u64,
    header_ok: bool,
    /// A writer sealed it (format 3): it stays a writer's pack in the new index.
    by_writer: bool,
}

/// The blobs of a pack: from its header, or from the old index when the header is
/// damaged; with `read_data`, only those that verify.
fn inspect_pack(
    repo: &Repository,
    pack: &PackId,
    read_data: bool,
    fallback: Option<Vec<PackEntry>>,
) -> Result<PackFindings> {
    // A pack whose header is damaged keeps the standing the index files gave it.
    let was_writer = repo.index().is_writer_pack(pack);
    let found = |entries, header_ok, by_writer| PackFindings {
        entries,
        damaged_blobs: 0,
        header_ok,
        by_writer,
    };
    if !read_data {
        return match (repo.read_pack_header_and_sealer(pack), fallback) {
            (Ok((entries, by_writer)), _) => Ok(found(entries, true, by_writer)),
            (Err(_), Some(entries)) => Ok(found(entries, false, was_writer)),
            (Err(e), None) => Err(e),
        };
    }
    let name = pack.storage_name();
    let bytes = repo.storage().read(&name)?;
    let (entries, header_ok) = match (crate::pack::read_header(repo.key(), &bytes), fallback) {
        (Ok(entries), _) => (entries, true),
        (Err(_), Some(entries)) => (entries, false),
        (Err(reason), None) => return Err(repo.corrupt(&name, reason)),
    };
    let by_writer = match header_ok {
        true => crate::pack::sealed_by_writer(repo.key(), &bytes),
        false => was_writer,
    };
    let before = entries.len();
    let good: Vec<PackEntry> = entries
        .into_iter()
        .filter(|e| crate::pack::verify_blob(repo.key(), &bytes, e))
        .collect();
    Ok(PackFindings {
        damaged_blobs: (before - good.len()) as u64,
        entries: good,
        header_ok,
        by_writer,
    })
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SnapshotRepairReport {
    pub snapshots_checked: u64,
    /// (old id, new id) of each rewritten snapshot.
    pub snapshots_repaired: Vec<(String, String)>,
    /// (old id, id of its repaired version) of each damaged snapshot that an earlier run
    /// already repaired: it is not repaired again; `--forget` removes it.
    pub snapshots_already_repaired: Vec<(String, String)>,
    /// Identical copies of a repaired snapshot, left by repeated runs of versions that did
    /// not recognise their own repairs; `--forget` removes all but one.
    pub snapshots_duplicate: Vec<String>,
    /// Snapshots whose root directory is lost: nothing can be repaired; `--forget`
    /// removes them.
    pub snapshots_lost: Vec<String>,
    pub files_damaged: u64,
    pub dirs_damaged: u64,
    pub snapshots_removed: u64,
}

/// The tag of a snapshot that `repair snapshots` wrote.
pub const REPAIRED_TAG: &str = "repaired";

/// Rewrites snapshots that need missing blobs, each once: a damaged snapshot that already
/// has a repaired version is not repaired again. With `forget`, the damaged originals are
/// removed once their repaired versions are written, and so are lost snapshots and extra
/// identical copies of a repaired one.
pub fn repair_snapshots(
    repo: &mut Repository,
    forget: bool,
    dry_run: bool,
    monitor: &dyn Monitor,
) -> Result<SnapshotRepairReport> {
    let mut report = SnapshotRepairReport::default();
    // New trees go into new packs, like a backup's: a session keeps prune from taking
    // them for leftovers, and the index is read again after it is registered.
    let session = match dry_run {
        true => None,
        false => {
            let session = crate::session::Session::start(
                repo,
                crate::session::SessionKind::Backup,
                &crate::session::local_host_name(),
            )?;
            let observed = repo.load_index()?;
            session.observe(observed);
            Some(session)
        }
    };
    let stored: HashSet<PackId> = repo.list_packs()?.into_iter().collect();
    let list = repo.snapshots()?;
    let mut repaired: Vec<(SnapshotId, Snapshot, BlobId)> = Vec::new();
    let mut already = Vec::new();
    let mut lost: Vec<SnapshotId> = Vec::new();
    let duplicates = duplicate_repairs(&list.snapshots);
    let written = {
        let mut fixer = Fixer {
            repo,
            stored,
            writer: None,
            done: HashMap::new(),
            probed: HashMap::new(),
            files_damaged: 0,
            dirs_damaged: 0,
            dry_run,
        };
        // Nothing of a snapshot can be found without its root directory.
        lost.extend(
            list.snapshots
                .iter()
                .filter(|(_, s)| !fixer.tree_readable(&s.tree))
                .map(|(id, _)| *id),
        );
        let versions = repaired_versions(&list.snapshots, &lost);
        for (i, (id, snapshot)) in list.snapshots.iter().enumerate() {
            monitor.progress("snapshots", i as u64, list.snapshots.len() as u64);
            report.snapshots_checked += 1;
            // An extra copy is not repaired on its own: its twin is, and `--forget`
            // removes it.
            if lost.contains(id) || duplicates.contains(id) {
                continue;
            }
            let fixed = match versions.get(id) {
                // Repairing it again would only add a second copy of `version`, which
                // already keeps what can be kept (or, if damaged since, is repaired itself).
                Some(version) => fixer.damaged(&snapshot.tree).map(|damaged| {
                    if damaged {
                        already.push((*id, *version));
                    }
                    None
                }),
                None => fixer.fix_tree(&snapshot.tree),
            };
            match fixed {
                Ok(Some(tree)) => repaired.push((*id, snapshot.clone(), tree)),
                Ok(None) => {}
                Err(e) => {
                    return Err(match fixer.writer {
                        Some(w) => w.cause(e),
                        None => e,
                    })
                }
            }
        }
        report.files_damaged = fixer.files_damaged;
        report.dirs_damaged = fixer.dirs_damaged;
        match fixer.writer {
            Some(w) => Some(w.finish()?),
            None => None,
        }
    };
    // The packs the repaired trees rely on, and when they were last checked.
    let mut checked: Option<(HashSet<PackId>, std::time::Duration)> = None;
    if let Some(mut w) = written {
        let relied = crate::commit::relied_packs(&w);
        repo.index_written(&mut w)?;
        // The repaired trees' other blobs are their originals', which stay until the
        // repaired versions are written; the new packs must still be there.
        if let Some(session) = &session {
            let at = crate::session::boot_time();
            let unsafe_packs = crate::commit::check(repo, session, &relied)?;
            if let Some(pack) = unsafe_packs.first() {
                return Err(packs_gone(pack));
            }
            checked = Some((relied, at));
        }
    }
    // Snapshot files that cannot be read at all are lost the same way.
    lost.extend(list.damaged.iter().map(|(id, _)| *id));
    report.snapshots_lost = lost.iter().map(|id| id.to_hex()).collect();
    report.snapshots_duplicate = duplicates.iter().map(|id| id.to_hex()).collect();
    report.snapshots_already_repaired = already
        .iter()
        .map(|(old, new): &(SnapshotId, SnapshotId)| (old.to_hex(), new.to_hex()))
        .collect();
    if forget && !dry_run {
        let mut remove = lost;
        remove.extend(already.iter().map(|(old, _)| *old));
        remove.extend(duplicates);
        crate::ops::forget::remove(repo, &remove)?;
        report.snapshots_removed += remove.len() as u64;
    }
    for (old_id, old, tree) in repaired {
        if dry_run {
            report
                .snapshots_repaired
                .push((old_id.to_hex(), String::new()));
            continue;
        }
        let mut snapshot = old.clone();
        snapshot.tree = tree;
        snapshot.parent = Some(old_id);
        if !snapshot.tags.iter().any(|t| t == REPAIRED_TAG) {
            snapshot.tags.push(REPAIRED_TAG.into());
        }
        // A repair paused after its check may have been taken for crashed, and its new
        // packs pruned: then the check runs again, and the original is not forgotten.
        let new_id = match (&session, &mut checked) {
            (Some(session), Some((relied, at))) => {
                let before = crate::session::boot_time();
                match crate::commit::save_snapshot(repo, session, relied, &snapshot, *at)? {
                    // Checked again in there if it was long since: no sooner next time.
                    Ok(id) => {
                        if before.saturating_sub(*at) >= session.lost_after() {
                            *at = before;
                        }
                        id
                    }
                    Err(packs) => return Err(packs_gone(&packs[0])),
                }
            }
            _ => repo.save_snapshot(&snapshot)?,
        };
        if forget {
            crate::ops::forget::remove(repo, &[old_id])?;
            report.snapshots_removed += 1;
        }
        report
            .snapshots_repaired
            .push((old_id.to_hex(), new_id.to_hex()));
    }
    if let Some(session) = session {
        session.finish();
    }
    Ok(report)
}

/// Each damaged snapshot's repaired version, as `repair snapshots` marks one: the tag
/// `repaired`, the original as its parent, and the original's time, host and paths (a
/// backup's parent never shares its time). Versions whose root is lost do not count.
pub(crate) fn repaired_versions(
    snapshots: &[(SnapshotId, Snapshot)],
    lost: &[SnapshotId],
) -> HashMap<SnapshotId, SnapshotId> {
    let by_id: HashMap<&SnapshotId, &Snapshot> = snapshots.iter().map(|(id, s)| (id, s)).collect();
    let mut versions: HashMap<SnapshotId, SnapshotId> = HashMap::new();
    for (id, s) in snapshots {
        let Some(parent) = s.parent else { continue };
        let is_version = s.tags.iter().any(|t| t == REPAIRED_TAG)
            && !lost.contains(id)
            && by_id
                .get(&parent)
                .is_some_and(|o| o.time == s.time && o.host == s.host && o.paths == s.paths);
        if is_version {
            // Of several (duplicates), the lowest id, so every run picks the same one.
            let v = versions.entry(parent).or_insert(*id);
            *v = (*v).min(*id);
        }
    }
    versions
}

/// Repaired snapshots whose content equals another's: the same snapshot written twice
/// (each file is sealed with a fresh nonce, so its id differs). All but the lowest id of
/// each group, which lose nothing when removed.
pub(crate) fn duplicate_repairs(snapshots: &[(SnapshotId, Snapshot)]) -> Vec<SnapshotId> {
    let mut groups: HashMap<Vec<u8>, Vec<SnapshotId>> = HashMap::new();
    for (id, s) in snapshots {
        if s.tags.iter().any(|t| t == REPAIRED_TAG) {
            groups.entry(s.to_json()).or_default().push(*id);
        }
    }
    let mut extra: Vec<SnapshotId> = groups
        .into_values()
        .flat_map(|mut ids| {
            ids.sort();
            ids.into_iter().skip(1)
        })
        .collect();
    extra.sort();
    extra
}

struct Fixer<'r> {
    repo: &'r Repository,
    stored: HashSet<PackId>,
    writer: Option<BlobWriter<'r>>,
    /// Tree id → its repaired id (`None`: intact).
    done: HashMap<BlobId, Option<BlobId>>,
    /// Tree id → whether anything below it is damaged, for trees only looked at.
    probed: HashMap<BlobId, bool>,
    files_damaged: u64,
    dirs_damaged: u64,
    dry_run: bool,
}

impl Fixer<'_> {
    fn readable(&self, blob: &BlobId) -> bool {
        let index = self.repo.index();
        // Readers take another place the index files give when the first is gone.
        (index.get(blob).into_iter())
            .chain(index.other_places(blob))
            .any(|loc| self.stored.contains(&loc.pack))
    }

    /// Whether the tree can be read: it is indexed in a stored pack and decrypts.
    fn tree_readable(&self, tree: &BlobId) -> bool {
        self.readable(tree) && self.repo.read_tree(tree).is_ok()
    }

    /// Whether anything below a readable tree is damaged, writing nothing.
    fn damaged(&mut self, id: &BlobId) -> Result<bool> {
        if let Some(done) = self.done.get(id) {
            return Ok(done.is_some());
        }
        if let Some(&damaged) = self.probed.get(id) {
            return Ok(damaged);
        }
        let tree = self.repo.read_tree(id)?;
        let mut damaged = false;
        for node in &tree.nodes {
            damaged = match &node.kind {
                NodeKind::Dir { subtree } => {
                    !self.tree_readable(subtree) || self.damaged(subtree)?
                }
                NodeKind::File { content, .. } => content.iter().any(|c| !self.readable(&c.blob)),
                _ => false,
            };
            if damaged {
                break;
            }
        }
        self.probed.insert(*id, damaged);
        Ok(damaged)
    }

    /// The id of a repaired copy of `tree`, or `None` when it is intact.
    fn fix_tree(&mut self, id: &BlobId) -> Result<Option<BlobId>> {
        if let Some(done) = self.done.get(id) {
            return Ok(*done);
        }
        let tree = self.repo.read_tree(id)?;
        let mut changed = false;
        let mut nodes = Vec::with_capacity(tree.nodes.len());
        for mut node in tree.nodes {
            match &node.kind {
                NodeKind::Dir { subtree } => {
                    let subtree = *subtree;
                    if self.tree_readable(&subtree) {
                        if let Some(new) = self.fix_tree(&subtree)? {
                            node.kind = NodeKind::Dir { subtree: new };
                            changed = true;
                        }
                    } else {
                        node.kind = NodeKind::Dir {
                            subtree: self.store(&Tree::default())?,
                        };
                        mark(&mut node.name);
                        self.dirs_damaged += 1;
                        changed = true;
                    }
                }
                NodeKind::File { content, .. }
                    if content.iter().any(|c| !self.readable(&c.blob)) =>
                {
                    let kept: Vec<_> = content
                        .iter()
                        .copied()
                        .filter(|c| self.readable(&c.blob))
                        .collect();
                    let size = kept.iter().map(|c| c.len as u64).sum();
                    node.kind = NodeKind::File {
                        size,
                        content: kept,
                    };
                    mark(&mut node.name);
                    self.files_damaged += 1;
                    changed = true;
                }
                _ => {}
            }
            nodes.push(node);
        }
        let result = if changed {
            nodes.sort_by(|a, b| a.name.cmp(&b.name));
            nodes.dedup_by(|a, b| a.name == b.name);
            Some(self.store(&Tree { nodes })?)
        } else {
            None
        };
        self.done.insert(*id, result);
        Ok(result)
    }

    fn store(&mut self, tree: &Tree) -> Result<BlobId> {
        let bytes = tree.to_bytes();
        if self.dry_run {
            return Ok(self.repo.key().blob_id(&bytes));
        }
        let repo = self.repo;
        let writer = self.writer.get_or_insert_with(|| repo.blob_writer());
        Ok(writer.add_owned(BlobKind::Tree, bytes)?.0)
    }
}

fn mark(name: &mut Vec<u8>) {
    if !name.ends_with(b".damaged") {
        name.extend_from_slice(b".damaged");
    }
}

/// Why a repair stopped: a pack it wrote went (a prune ran while it was paused).
fn packs_gone(pack: &PackId) -> crate::error::Error {
    crate::error::Error::InvalidInput(format!(
        "pack {} that this repair wrote is gone or condemned (was the repository pruned \
         while this ran paused?); no snapshot was written for it. Run it again",
        pack.storage_name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(second: i64, tags: &[&str], parent: Option<SnapshotId>, tree: u8) -> Snapshot {
        Snapshot {
            time: jiff::Timestamp::from_second(second).expect("a valid time"),
            host: "host".into(),
            username: "user".into(),
            paths: vec!["/src".into()],
            tags: tags.iter().map(|t| t.to_string()).collect(),
            tree: BlobId([tree; 32]),
            parent,
            original: None,
            program_version: "test".into(),
            summary: Default::default(),
        }
    }

    fn id(n: u8) -> SnapshotId {
        SnapshotId::of_bytes(&[n])
    }

    #[test]
    fn a_repaired_version_shares_its_originals_time_host_and_paths_and_names_it_parent() {
        let original = snapshot(100, &["daily"], None, 1);
        let repaired = snapshot(100, &["daily", REPAIRED_TAG], Some(id(1)), 2);
        // A later backup whose parent is the original is no repair of it, tag or not.
        let backup = snapshot(200, &[REPAIRED_TAG], Some(id(1)), 3);
        let list = vec![(id(1), original), (id(2), repaired), (id(3), backup)];
        let versions = repaired_versions(&list, &[]);
        assert_eq!(versions, HashMap::from([(id(1), id(2))]));
        assert!(
            repaired_versions(&list, &[id(2)]).is_empty(),
            "a version whose root is lost keeps nothing"
        );
    }

    #[test]
    fn identical_repaired_copies_are_duplicates_and_the_lowest_id_is_the_version() {
        let original = snapshot(100, &[], None, 1);
        let copy = snapshot(100, &[REPAIRED_TAG], Some(id(1)), 2);
        let (low, high) = (id(2).min(id(3)), id(2).max(id(3)));
        let list = vec![(id(1), original), (id(2), copy.clone()), (id(3), copy)];
        assert_eq!(duplicate_repairs(&list), vec![high]);
        assert_eq!(repaired_versions(&list, &[])[&id(1)], low);
        // Identical snapshots that no repair wrote are left alone.
        let twins = snapshot(300, &[], None, 4);
        assert!(duplicate_repairs(&[(id(4), twins.clone()), (id(5), twins)]).is_empty());
    }
}

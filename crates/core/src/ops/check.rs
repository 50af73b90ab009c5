//! `check`: is every snapshot fully restorable? Structure first (index files, pack
//! headers, every tree and blob a snapshot needs), then optionally the data itself
//! (`--read-data`, or a subset so a large repository is checked over several nights).
//! Every problem names the object, the snapshots and paths it damages, and the repair.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use crate::error::{chain, Result};
use crate::id::{BlobId, PackId, SnapshotId};
use crate::index::{BlobSet, PackGroups};
use crate::monitor::Monitor;
use crate::pack::{self, PackEntry};
use crate::repo::Repository;
use crate::tree::NodeKind;

/// Which packs `--read-data` reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Subset {
    All,
    /// Part `n` (1-based) of `m`: packs whose id falls in that slice.
    Part {
        n: u32,
        m: u32,
    },
    /// About this percentage of packs, chosen by id.
    Percent(f64),
}

impl Subset {
    fn contains(&self, pack: &PackId) -> bool {
        let x = u32::from_be_bytes(pack.0[..4].try_into().expect("4 bytes"));
        match *self {
            Subset::All => true,
            Subset::Part { n, m } => x % m == n - 1,
            Subset::Percent(p) => (x as f64) < p / 100.0 * (u32::MAX as f64 + 1.0),
        }
    }
}

impl FromStr for Subset {
    type Err = String;

    /// `N/M` (1 ≤ N ≤ M) or `P%` (0 < P ≤ 100).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a subset: use N/M (e.g. 1/7) or P% (e.g. 10%)");
        if let Some(p) = s.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| bad())?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(bad());
            }
            return Ok(Subset::Percent(p));
        }
        let (n, m) = s.split_once('/').ok_or_else(bad)?;
        let (n, m): (u32, u32) = (
            n.trim().parse().map_err(|_| bad())?,
            m.trim().parse().map_err(|_| bad())?,
        );
        if n == 0 || m == 0 || n > m {
            return Err(bad());
        }
        Ok(Subset::Part { n, m })
    }
}

#[derive(Debug, Clone, Default)]
pub struct CheckOptions {
    /// Decrypt and verify the blobs of these packs.
    pub read_data: Option<Subset>,
}

/// A snapshot path that cannot be restored exactly because of a problem.
#[derive(Debug, Clone, Serialize)]
pub struct Damage {
    #[serde(rename = "snapshot_id")]
    pub snapshot: SnapshotId,
    pub path: String,
}

/// Damage lists stop growing here; `damaged_paths` keeps counting.
const MAX_DAMAGES_LISTED: usize = 100;

#[derive(Debug, Clone, Serialize)]
pub struct CheckProblem {
    /// The damaged object, e.g. `data/ab/ab12…` or `blob 1234…`.
    pub object: String,
    pub problem: String,
    /// The commands that repair it, in order.
    pub repair: String,
    #[serde(skip)]
    pub repair_steps: Vec<RepairStep>,
    pub damaged_paths: u64,
    pub damages: Vec<Damage>,
}

/// A repair command that check recommends. Whatever the problems, running the steps they
/// name once each, in this order, leaves a repository that checks clean: the index first,
/// because `repair snapshots` trusts it to tell which blobs are lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RepairStep {
    /// Rebuild the index from the pack headers (adopts packs no index file names).
    Index,
    /// The same, verifying every blob and copying the intact ones out of damaged packs.
    IndexReadData,
    /// Replace each damaged snapshot by its repaired version.
    SnapshotsForget,
}

impl RepairStep {
    pub fn command(self) -> &'static str {
        match self {
            RepairStep::Index => "cairn repair index",
            RepairStep::IndexReadData => "cairn repair index --read-data",
            RepairStep::SnapshotsForget => "cairn repair snapshots --forget",
        }
    }
}

/// What `repair snapshots --forget` does, for whoever is told to run it.
pub const FORGET_EXPLAINED: &str =
    "`cairn repair snapshots --forget` replaces each damaged snapshot \
     by a repaired one (tag `repaired`) that keeps all its files minus the lost content: a \
     file that lost data is kept as NAME.damaged with what remains, an unreadable directory \
     as an empty NAME.damaged; the damaged originals are removed. If the lost files still \
     exist, a backup run after `cairn repair index` stores their data again and makes the \
     damaged snapshots whole: run it before `repair snapshots --forget`";

#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    pub snapshots: u64,
    pub trees: u64,
    pub data_blobs: u64,
    pub packs: u64,
    /// Packs prune has condemned; not checked, as no snapshot needs them.
    pub packs_condemned: u64,
    pub packs_read: u64,
    pub blobs_verified: u64,
    pub bytes_read: u64,
    pub problems: Vec<CheckProblem>,
    /// The repair commands for all the problems, each once, in the order to run them;
    /// after them, check is clean.
    pub repair_commands: Vec<String>,
    /// What the repair commands do to snapshots, when they touch any.
    pub repair_note: Option<String>,
    /// Things worth knowing that are not damage.
    pub notes: Vec<String>,
    pub duration_ms: u64,
}

impl CheckReport {
    fn problem(&mut self, object: String, problem: String, steps: &[RepairStep]) -> usize {
        self.problems.push(CheckProblem {
            object,
            problem,
            repair: String::new(),
            repair_steps: steps.to_vec(),
            damaged_paths: 0,
            damages: Vec::new(),
        });
        self.problems.len() - 1
    }

    /// Fills in each problem's repair and the plan for all of them. `lost_known`: problems
    /// whose lost blobs are all known, so that they need no snapshot repair when no
    /// snapshot needs those blobs.
    fn plan(&mut self, lost_known: &HashSet<usize>) {
        let mut all = Vec::new();
        for (i, p) in self.problems.iter_mut().enumerate() {
            if lost_known.contains(&i) && p.damaged_paths == 0 {
                p.repair_steps.retain(|s| *s != RepairStep::SnapshotsForget);
            }
            p.repair = p
                .repair_steps
                .iter()
                .map(|s| s.command())
                .collect::<Vec<_>>()
                .join(", then ");
            all.extend_from_slice(&p.repair_steps);
        }
        all.sort();
        all.dedup();
        // Verifying the data rebuilds the index as well.
        if all.contains(&RepairStep::IndexReadData) {
            all.retain(|s| *s != RepairStep::Index);
        }
        self.repair_commands = all.iter().map(|s| s.command().to_string()).collect();
        if all.contains(&RepairStep::SnapshotsForget) {
            self.repair_note = Some(FORGET_EXPLAINED.to_string());
        }
    }
}

/// What a write-only key can check (format 3): it opens nothing, but every file but the
/// config is named by the BLAKE3 hash of its bytes, so damage shows without a key. Key,
/// index, snapshot, session and trash files are read and hashed; packs too with
/// `read_data`. Whether the index, trees and snapshots are whole only a full key can say.
pub fn check_structure(
    repo: &Repository,
    opts: &CheckOptions,
    monitor: &dyn Monitor,
) -> Result<CheckReport> {
    let started = Instant::now();
    let mut report = CheckReport::default();
    let storage = repo.storage();
    let mut names = Vec::new();
    for dir in ["keys", "index", "snapshots", "sessions", "trash"] {
        names.extend(storage.list(dir)?);
    }
    report.snapshots = names.iter().filter(|n| n.starts_with("snapshots/")).count() as u64;
    let packs = storage.list("data")?;
    report.packs = packs.len() as u64;
    if opts.read_data.is_some() {
        names.extend(packs);
    }
    for (i, name) in names.iter().enumerate() {
        monitor.progress("checking files", i as u64, names.len() as u64);
        let bytes = match storage.read(name) {
            Ok(bytes) => bytes,
            // A session file ended, or prune replaced a file, since the listing.
            Err(cairn_storage::StorageError::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        report.bytes_read += bytes.len() as u64;
        if name.starts_with("data/") {
            report.packs_read += 1;
        }
        if let Err(e) = repo.check_name(name, &bytes) {
            report.problem(name.clone(), chain(&e), &[]);
        }
    }
    report.plan(&HashSet::new());
    for p in &mut report.problems {
        p.repair = "check with a full key (`cairn check --read-data`) to see what it damages \
                    and how to repair it"
            .into();
    }
    report.notes.push(
        "checked with a write-only key: each file against its name (the BLAKE3 hash of its \
         bytes); what the files hold, and whether snapshots are whole, only a full key can check"
            .into(),
    );
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

pub fn check(repo: &Repository, opts: &CheckOptions, monitor: &dyn Monitor) -> Result<CheckReport> {
    let started = Instant::now();
    let mut report = CheckReport::default();
    for e in repo.index_problems() {
        report.problem("index".into(), chain(e), &[RepairStep::Index]);
    }
    // Problems whose lost blobs are all known.
    let mut lost_known = HashSet::new();
    // Blobs that cannot be read, and the problem each belongs to.
    let mut bad: HashMap<BlobId, usize> = HashMap::new();

    let stored: HashSet<PackId> = repo.list_packs()?.into_iter().collect();
    let indexed = repo.index().by_pack();
    report.packs = stored.len() as u64;
    let mut missing: Vec<&PackId> = indexed.packs().filter(|p| !stored.contains(p)).collect();
    missing.sort();
    for pack in missing {
        let i = report.problem(
            pack.storage_name(),
            format!(
                "pack is missing, and with it {} blobs",
                indexed.blob_count(pack)
            ),
            &[RepairStep::Index, RepairStep::SnapshotsForget],
        );
        lost_known.insert(i);
        bad.extend(indexed.blobs(pack).iter().map(|e| (e.id, i)));
    }
    let condemned = |p: &PackId| repo.index().is_condemned(p);
    report.packs_condemned = stored.iter().filter(|p| condemned(p)).count() as u64;
    let mut unindexed: Vec<&PackId> = stored
        .iter()
        .filter(|p| !indexed.contains(p) && !condemned(p))
        .collect();
    unindexed.sort();
    // Which blobs `repair index` would recover, so that the walk can tell them from blobs
    // that are lost. Only packs in no index file, usually none or few; not condemned
    // ones, which `repair index` keeps as they were condemned.
    let mut adoptable = HashSet::new();
    for pack in &unindexed {
        if let Ok(entries) = repo.read_pack_header(pack) {
            adoptable.extend(entries.iter().map(|e| e.id));
        }
    }
    if !unindexed.is_empty() {
        // Not damage: an interrupted or running backup leaves such packs, and no snapshot
        // relies on them (if one did, the walk below reports the blobs it misses).
        report.notes.push(format!(
            "{} pack(s) are in no index file, e.g. {}: left by an interrupted or running backup. \
             `cairn repair index` adopts them so that backups reuse their data",
            unindexed.len(),
            unindexed[0].storage_name()
        ));
    }
    // Sessions are not damage: a running command has one, and the files of one that
    // ended without removing them are removed by the next backup or prune.
    let here = crate::session::Host::this();
    let views = crate::session::list(repo)?;
    if let Some(now) = views.iter().map(|v| v.beat).max() {
        for view in &views {
            let what = match &view.info {
                Some(info) => info.describe(),
                None => format!("unreadable session file {}", view.files.join(", ")),
            };
            let note = match view.standing(now, &here) {
                crate::session::Standing::Live => format!("session of a {what} is registered (it may be running)"),
                crate::session::Standing::Ended(why) => format!(
                    "session of a {what} ended without finishing ({why}); the next backup or prune removes it"
                ),
            };
            report.notes.push(note);
        }
    }

    // Condemned packs wait for prune to delete them; nothing relies on them.
    let mut to_check: Vec<PackId> = indexed
        .packs()
        .filter(|p| stored.contains(p) && !condemned(p))
        .copied()
        .collect();
    to_check.sort();
    let results = check_packs(repo, &to_check, &indexed, opts.read_data, monitor);
    for r in results {
        report.packs_read += r.read as u64;
        report.bytes_read += r.bytes;
        report.blobs_verified += r.blobs_verified;
        if let Some(problem) = r.problem {
            // --read-data keeps every blob that verifies, even from a pack whose header
            // is gone, and copies them out of the damaged pack. Unless this pack was read,
            // which blobs are lost is not known: snapshots may need repair.
            let steps: &[RepairStep] = if r.read && r.bad_blobs.is_empty() {
                &[RepairStep::IndexReadData]
            } else {
                &[RepairStep::IndexReadData, RepairStep::SnapshotsForget]
            };
            let i = report.problem(r.pack.storage_name(), problem, steps);
            if r.read {
                lost_known.insert(i);
            }
            bad.extend(r.bad_blobs.iter().map(|b| (*b, i)));
        }
    }

    let list = repo.snapshots()?;
    for (id, e) in &list.damaged {
        report.problem(
            id.storage_name(),
            format!(
                "{}; it cannot be read, so repairing it removes it",
                chain(e)
            ),
            &[RepairStep::SnapshotsForget],
        );
    }
    report.snapshots = list.snapshots.len() as u64;
    let mut walker = Walker {
        repo,
        bad,
        clean: BlobSet::new(repo.index()),
        seen_trees: BlobSet::new(repo.index()),
        seen_blobs: BlobSet::new(repo.index()),
        adoptable,
        unindexed_problem: None,
        lost_problem: None,
        damaged: HashSet::new(),
        report: &mut report,
    };
    for (i, (id, snapshot)) in list.snapshots.iter().enumerate() {
        monitor.progress("snapshots", i as u64, list.snapshots.len() as u64);
        walker.walk(id, &snapshot.tree, b"");
    }
    let (trees, blobs) = (
        walker.seen_trees.len() as u64,
        walker.seen_blobs.len() as u64,
    );
    let damaged = std::mem::take(&mut walker.damaged);
    report.trees = trees;
    report.data_blobs = blobs;
    repair_notes(&mut report, &list.snapshots, &damaged);
    report.plan(&lost_known);
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// Notes on what earlier repairs left: damaged snapshots beside their repaired versions,
/// and identical copies of repaired snapshots.
fn repair_notes(
    report: &mut CheckReport,
    snapshots: &[(SnapshotId, crate::snapshot::Snapshot)],
    damaged: &HashSet<SnapshotId>,
) {
    let versions = crate::ops::repair::repaired_versions(snapshots, &[]);
    let mut beside: Vec<SnapshotId> = damaged
        .iter()
        .filter(|id| versions.contains_key(id))
        .copied()
        .collect();
    beside.sort();
    if let Some(first) = beside.first() {
        report.notes.push(format!(
            "{} damaged snapshot(s), e.g. {}, already have a repaired version (tag `repaired`): \
             `cairn repair snapshots --forget` removes the damaged originals and repairs nothing twice",
            beside.len(),
            first.short()
        ));
    }
    let duplicates = crate::ops::repair::duplicate_repairs(snapshots);
    if let Some(first) = duplicates.first() {
        report.notes.push(format!(
            "{} snapshot(s), e.g. {}, are identical copies of a repaired snapshot, written by \
             repeated repairs: `cairn repair snapshots --forget` removes the extra copies",
            duplicates.len(),
            first.short()
        ));
    }
}

struct PackResult {
    pack: PackId,
    read: bool,
    bytes: u64,
    blobs_verified: u64,
    problem: Option<String>,
    bad_blobs: Vec<BlobId>,
}

/// Checks pack headers against the index, and reads the selected packs, on all cores.
fn check_packs(
    repo: &Repository,
    packs: &[PackId],
    indexed: &PackGroups,
    read_data: Option<Subset>,
    monitor: &dyn Monitor,
) -> Vec<PackResult> {
    let next = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    let results = Mutex::new(Vec::with_capacity(packs.len()));
    let threads = crate::cores().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(pack) = packs.get(i) else { break };
                let read = read_data.is_some_and(|sub| sub.contains(pack));
                let r = check_pack(repo, pack, &indexed.blobs(pack), read);
                results.lock().expect("no thread panics holding it").push(r);
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                monitor.progress("packs", n, packs.len() as u64);
            });
        }
    });
    let mut results = results.into_inner().expect("no thread panicked");
    results.sort_by_key(|r| r.pack);
    results
}

fn check_pack(repo: &Repository, pack: &PackId, blobs: &[PackEntry], read: bool) -> PackResult {
    let mut r = PackResult {
        pack: *pack,
        read,
        bytes: 0,
        blobs_verified: 0,
        problem: None,
        bad_blobs: Vec::new(),
    };
    if !read {
        match repo.read_pack_header(pack) {
            Ok(entries) => r.problem = compare_header(&entries, blobs),
            Err(e) => r.problem = Some(format!("pack header unreadable: {}; `cairn check --read-data` tells which blobs are affected", chain(&e))),
        }
        return r;
    }
    let bytes = match repo.storage().read(&pack.storage_name()) {
        Ok(b) => b,
        Err(e) => {
            r.problem = Some(chain(&e));
            r.bad_blobs = blobs.iter().map(|b| b.id).collect();
            return r;
        }
    };
    r.bytes = bytes.len() as u64;
    let mut notes = Vec::new();
    if PackId::of_bytes(&bytes) != *pack {
        notes.push("its content does not match its name".to_string());
    }
    notes.extend(pack::off_grid(repo.key(), r.bytes));
    match pack::read_header(repo.key(), &bytes) {
        Ok(entries) => notes.extend(compare_header(&entries, blobs)),
        Err(e) => notes.push(format!("header unreadable: {e}")),
    }
    for b in blobs {
        let ok = pack::verify_blob(repo.key(), &bytes, b);
        if ok {
            r.blobs_verified += 1;
        } else {
            r.bad_blobs.push(b.id);
        }
    }
    if !r.bad_blobs.is_empty() {
        notes.push(format!(
            "{} of its {} blobs are damaged",
            r.bad_blobs.len(),
            blobs.len()
        ));
    }
    if !notes.is_empty() {
        r.problem = Some(notes.join("; "));
    }
    r
}

fn compare_header(entries: &[PackEntry], blobs: &[PackEntry]) -> Option<String> {
    let header: HashMap<BlobId, (u32, u32)> = entries
        .iter()
        .map(|e| (e.id, (e.offset, e.length)))
        .collect();
    let disagree = blobs
        .iter()
        .filter(|b| header.get(&b.id) != Some(&(b.offset, b.length)))
        .count();
    (disagree > 0).then(|| format!("the index and the pack header disagree about {disagree} blobs"))
}

/// Walks snapshot trees, remembering clean subtrees so shared ones are read once.
struct Walker<'a> {
    repo: &'a Repository,
    bad: HashMap<BlobId, usize>,
    clean: BlobSet<'a>,
    seen_trees: BlobSet<'a>,
    seen_blobs: BlobSet<'a>,
    /// Blobs in packs that no index file names, which `repair index` adopts.
    adoptable: HashSet<BlobId>,
    unindexed_problem: Option<usize>,
    lost_problem: Option<usize>,
    /// Snapshots with at least one damaged path.
    damaged: HashSet<SnapshotId>,
    report: &'a mut CheckReport,
}

impl Walker<'_> {
    fn damage(&mut self, problem: usize, snapshot: &SnapshotId, path: &[u8]) {
        self.damaged.insert(*snapshot);
        let p = &mut self.report.problems[problem];
        p.damaged_paths += 1;
        if p.damages.len() < MAX_DAMAGES_LISTED {
            p.damages.push(Damage {
                snapshot: *snapshot,
                path: if path.is_empty() {
                    "/".into()
                } else {
                    String::from_utf8_lossy(path).into_owned()
                },
            });
        }
    }

    /// The problem a blob belongs to, if it cannot be read.
    fn blob_problem(&mut self, blob: &BlobId) -> Option<usize> {
        if let Some(&i) = self.bad.get(blob) {
            return Some(i);
        }
        if self.repo.index().contains(blob) {
            return None;
        }
        let i = if self.adoptable.contains(blob) {
            *self.unindexed_problem.get_or_insert_with(|| {
                self.report.problem(
                    "index".into(),
                    "blobs that snapshots need are in packs that no index file names".into(),
                    &[RepairStep::Index],
                )
            })
        } else {
            *self.lost_problem.get_or_insert_with(|| {
                self.report.problem(
                    "data".into(),
                    "blobs that snapshots need are in no index file and in no pack: they are lost"
                        .into(),
                    &[RepairStep::SnapshotsForget],
                )
            })
        };
        self.bad.insert(*blob, i);
        Some(i)
    }

    /// Returns whether everything below `tree` is intact.
    fn walk(&mut self, snapshot: &SnapshotId, tree_id: &BlobId, path: &[u8]) -> bool {
        if self.clean.contains(tree_id) {
            return true;
        }
        self.seen_trees.insert(tree_id);
        if let Some(i) = self.blob_problem(tree_id) {
            self.damage(i, snapshot, path);
            return false;
        }
        let tree = match self.repo.read_tree_at_its_place(tree_id) {
            Ok(t) => t,
            Err(e) => {
                // An indexed tree that does not decrypt: its pack is damaged, which only
                // `check --read-data` reports; repairing the index with it drops the tree.
                let i = self.report.problem(
                    format!("tree {tree_id}"),
                    chain(&e),
                    &[RepairStep::IndexReadData, RepairStep::SnapshotsForget],
                );
                self.bad.insert(*tree_id, i);
                self.damage(i, snapshot, path);
                return false;
            }
        };
        let mut intact = true;
        for node in &tree.nodes {
            let mut child = path.to_vec();
            child.push(b'/');
            child.extend_from_slice(&node.name);
            match &node.kind {
                NodeKind::Dir { subtree } => intact &= self.walk(snapshot, subtree, &child),
                NodeKind::File { content, .. } => {
                    let mut reported = HashSet::new();
                    for part in content {
                        self.seen_blobs.insert(&part.blob);
                        if let Some(i) = self.blob_problem(&part.blob) {
                            intact = false;
                            if reported.insert(i) {
                                self.damage(i, snapshot, &child);
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        if intact {
            self.clean.insert(tree_id);
        }
        intact
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsets_parse_and_partition_packs() {
        assert_eq!("2/5".parse::<Subset>(), Ok(Subset::Part { n: 2, m: 5 }));
        assert!("0/5".parse::<Subset>().is_err());
        assert!("6/5".parse::<Subset>().is_err());
        assert!("0%".parse::<Subset>().is_err());
        assert_eq!("10%".parse::<Subset>(), Ok(Subset::Percent(10.0)));
        let packs: Vec<PackId> = (0..1000u32)
            .map(|i| PackId::of_bytes(&i.to_le_bytes()))
            .collect();
        for p in &packs {
            let parts = (1..=3)
                .filter(|&n| Subset::Part { n, m: 3 }.contains(p))
                .count();
            assert_eq!(parts, 1, "every pack is in exactly one part");
        }
        let tenth = packs
            .iter()
            .filter(|p| Subset::Percent(10.0).contains(p))
            .count();
        assert!((50..150).contains(&tenth), "{tenth} of 1000 packs in 10%");
        assert!(packs.iter().all(|p| Subset::Percent(100.0).contains(p)));
    }
}

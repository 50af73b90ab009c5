//! `stats`: how much a repository stores, and how well deduplication and compression do.
//!
//! For the whole repository everything comes from the index and the snapshots' recorded
//! summaries, so it reads no tree and no pack. For chosen snapshots it walks their trees,
//! each subtree once (the totals below a tree are remembered by its id, so shared
//! subtrees cost nothing more), and counts the blobs they reference. It only reads.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::id::{BlobId, PackId, SnapshotId};
use crate::index::Index;
use crate::ops::select;
use crate::pack::{self, BlobKind};
use crate::repo::Repository;
use crate::snapshot::Snapshot;
use crate::tree::NodeKind;

/// Count and sizes of a set of distinct blobs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BlobTotals {
    #[serde(rename = "blobs")]
    pub count: u64,
    /// Sealed (compressed and encrypted) bytes, as stored in packs.
    pub stored_bytes: u64,
    /// Plaintext bytes.
    pub raw_bytes: u64,
}

impl BlobTotals {
    fn add(&mut self, stored: u32, raw: u32) {
        self.count += 1;
        self.stored_bytes += stored as u64;
        self.raw_bytes += raw as u64;
    }
}

/// What `stats` found. Plain numbers; the ratios are `None` when there is nothing to
/// divide by.
#[derive(Debug, Default, Serialize)]
pub struct StatsReport {
    pub snapshots: u64,
    /// Files, directories and bytes that restoring every counted snapshot would produce
    /// (a file in two snapshots counts twice).
    pub files: u64,
    pub dirs: u64,
    pub restore_bytes: u64,
    /// Distinct data blobs (file contents): all indexed ones for the whole repository,
    /// the referenced ones for chosen snapshots.
    pub data: BlobTotals,
    /// Distinct tree blobs (directories), likewise.
    pub trees: BlobTotals,
    /// Packs: all of them, or those holding a referenced blob.
    pub packs: u64,
    /// Sum of the pack files' sizes (whole repository only), computed from the index:
    /// exact unless a blob is stored in two packs (after concurrent backups), whose
    /// second copy the index does not list.
    pub pack_bytes: Option<u64>,
    /// Raw over stored bytes of the blobs counted.
    pub compression_ratio: Option<f64>,
    /// Restore size over raw bytes of the distinct data blobs.
    pub dedup_ratio: Option<f64>,
    /// Referenced blobs the index does not know (chosen snapshots only); `check` says why.
    pub blobs_missing: u64,
    /// Trees read (chosen snapshots only).
    pub trees_read: u64,
    /// Snapshot files that could not be read (whole repository only); left out of the
    /// figures.
    #[serde(skip)]
    pub damaged: Vec<(SnapshotId, Error)>,
}

impl StatsReport {
    fn finish(&mut self) {
        let stored = self.data.stored_bytes + self.trees.stored_bytes;
        let raw = self.data.raw_bytes + self.trees.raw_bytes;
        self.compression_ratio = ratio(raw, stored);
        self.dedup_ratio = ratio(self.restore_bytes, self.data.raw_bytes);
    }
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

/// Figures for the whole repository, or, when `snapshots` names some (`latest`, ids,
/// unique prefixes), for those alone.
pub fn stats(repo: &Repository, snapshots: &[String]) -> Result<StatsReport> {
    let mut report = if snapshots.is_empty() {
        repository_stats(repo)?
    } else {
        snapshot_stats(repo, snapshots)?
    };
    report.finish();
    Ok(report)
}

fn repository_stats(repo: &Repository) -> Result<StatsReport> {
    let list = repo.snapshots()?;
    let mut report = StatsReport {
        damaged: list.damaged,
        ..StatsReport::default()
    };
    for (_, s) in &list.snapshots {
        report.snapshots += 1;
        report.files += s.summary.files;
        report.dirs += s.summary.dirs;
        report.restore_bytes += s.summary.total_bytes;
    }
    let index = repo.index();
    for (_, loc) in index.iter() {
        match loc.kind {
            BlobKind::Data => report.data.add(loc.length, loc.raw_length),
            BlobKind::Tree => report.trees.add(loc.length, loc.raw_length),
        }
    }
    let packs = index.by_pack();
    report.packs = packs.len() as u64;
    report.pack_bytes = Some(
        packs
            .packs()
            .map(|p| pack::file_size(repo.key(), &packs.blobs(p)))
            .sum(),
    );
    Ok(report)
}

fn snapshot_stats(repo: &Repository, specs: &[String]) -> Result<StatsReport> {
    let mut chosen: Vec<(SnapshotId, Snapshot)> = Vec::new();
    for spec in specs {
        let found = select::find_snapshot(repo, spec, &Default::default())?;
        if !chosen.iter().any(|(id, _)| *id == found.0) {
            chosen.push(found);
        }
    }
    let mut walker = Walker {
        repo,
        index: repo.index(),
        below: HashMap::new(),
        blobs: HashSet::new(),
        packs: HashSet::new(),
        report: StatsReport::default(),
    };
    for (_, snapshot) in &chosen {
        let t = walker.tree(&snapshot.tree)?;
        walker.report.snapshots += 1;
        walker.report.files += t.files;
        walker.report.dirs += t.dirs;
        walker.report.restore_bytes += t.bytes;
    }
    let mut report = walker.report;
    report.packs = walker.packs.len() as u64;
    Ok(report)
}

/// What lies below one tree, as a restore of it would produce.
#[derive(Debug, Clone, Copy, Default)]
struct Below {
    files: u64,
    dirs: u64,
    bytes: u64,
}

struct Walker<'a> {
    repo: &'a Repository,
    index: &'a Index,
    /// Totals below each tree already read, so a shared subtree is read once.
    below: HashMap<BlobId, Below>,
    /// Every blob counted so far, trees and data.
    blobs: HashSet<BlobId>,
    packs: HashSet<PackId>,
    report: StatsReport,
}

impl Walker<'_> {
    fn tree(&mut self, id: &BlobId) -> Result<Below> {
        if let Some(b) = self.below.get(id) {
            return Ok(*b);
        }
        self.count_blob(id);
        let tree = self.repo.read_tree(id)?;
        self.report.trees_read += 1;
        let mut below = Below::default();
        for node in &tree.nodes {
            match &node.kind {
                NodeKind::File { size, content } => {
                    below.files += 1;
                    below.bytes += size;
                    for c in content {
                        self.count_blob(&c.blob);
                    }
                }
                NodeKind::Dir { subtree } => {
                    let sub = self.tree(subtree)?;
                    below.dirs += 1 + sub.dirs;
                    below.files += sub.files;
                    below.bytes += sub.bytes;
                }
                _ => {}
            }
        }
        self.below.insert(*id, below);
        Ok(below)
    }

    /// Counts a blob the first time it is referenced, by the kind the index records.
    fn count_blob(&mut self, id: &BlobId) {
        if !self.blobs.insert(*id) {
            return;
        }
        match self.index.get(id) {
            Some(loc) => {
                self.packs.insert(loc.pack);
                match loc.kind {
                    BlobKind::Data => self.report.data.add(loc.length, loc.raw_length),
                    BlobKind::Tree => self.report.trees.add(loc.length, loc.raw_length),
                }
            }
            None => self.report.blobs_missing += 1,
        }
    }
}

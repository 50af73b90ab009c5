//! `restore --dry-run`: what a restore would do to its target, decided as restore
//! decides (the same filters and overwrite modes, `delete` included), without writing
//! anything. It reads the target by path, which is safe only because it changes nothing;
//! restore itself never does (see `ops::restore_target`).
//!
//! One approximation: `--overwrite if-changed --verify` also compares contents, which
//! the plan does not read; a file whose size and mtime match is planned as unchanged.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::Metadata;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::id::BlobId;
use crate::ops::browse::{self, Entry};
use crate::ops::restore::{Overwrite, RestoreOptions};
use crate::ops::restore_filter::{child_path, RestoreFilter, Selection};
use crate::repo::Repository;
use crate::snapshot::Snapshot;
use crate::tree::{Node, NodeKind};

/// What restore would do with one path of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Write it (nothing there, or what is there is replaced).
    Write,
    /// Leave what is there: it matches the snapshot.
    Unchanged,
    /// Leave what is there: the overwrite mode keeps it.
    Keep,
    /// Remove it (`delete`: the snapshot does not hold it).
    Delete,
}

#[derive(Debug, Clone, Serialize)]
pub struct Planned {
    pub path: String,
    pub action: Action,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RestorePlan {
    /// Every path restore would touch or consider, in walk order.
    pub entries: Vec<Planned>,
}

impl RestorePlan {
    pub fn count(&self, action: Action) -> u64 {
        self.entries.iter().filter(|e| e.action == action).count() as u64
    }
}

/// Plans the restore `opts` describes, failing where restore would fail before writing
/// (a filter that matches nothing, a target that is not empty or unrelated).
pub fn plan(repo: &Repository, snapshot: &Snapshot, opts: &RestoreOptions) -> Result<RestorePlan> {
    let filter = RestoreFilter::new(&opts.includes, &opts.excludes)?;
    let subpath = opts.subpath.as_deref().unwrap_or(b"/");
    let start = browse::find(repo, snapshot, subpath)?;
    let start_path: Vec<u8> = browse::path_names(subpath)
        .iter()
        .fold(Vec::new(), |p, n| child_path(&p, n));
    match &start {
        Entry::Root(tree) => filter.check_all_match(repo, Some(tree), None)?,
        Entry::Node(node) => filter.check_all_match(repo, None, Some((node, &start_path)))?,
    }
    crate::ops::restore::check_target(repo, &start, opts)?;
    let mut p = Planner {
        repo,
        opts,
        filter,
        plan: RestorePlan::default(),
    };
    let target = opts.target.as_path();
    match &start {
        Entry::Root(tree) => p.tree(tree, target, &start_path, false, true)?,
        Entry::Node(node) => match &node.kind {
            NodeKind::Dir { subtree } => p.tree(subtree, target, &start_path, false, true)?,
            _ => {
                let path = target.join(OsStr::from_bytes(&node.name));
                p.node(node, &path, &start_path, false)?;
            }
        },
    }
    Ok(p.plan)
}

struct Planner<'a> {
    repo: &'a Repository,
    opts: &'a RestoreOptions,
    filter: RestoreFilter,
    plan: RestorePlan,
}

impl Planner<'_> {
    fn add(&mut self, path: &Path, action: Action) {
        self.plan.entries.push(Planned {
            path: path.to_string_lossy().into_owned(),
            action,
        });
    }

    /// The entries of `tree` restored into directory `dir` (which exists if `existed`).
    fn tree(
        &mut self,
        tree: &BlobId,
        dir: &Path,
        snap: &[u8],
        inside: bool,
        existed: bool,
    ) -> Result<()> {
        let tree = self.repo.read_tree(tree)?;
        for node in &tree.nodes {
            let node_snap = child_path(snap, &node.name);
            let is_dir = matches!(node.kind, NodeKind::Dir { .. });
            let path = dir.join(OsStr::from_bytes(&node.name));
            match self.filter.select(&node_snap, is_dir, inside) {
                Selection::Skip => {}
                Selection::All => self.node_in(node, &path, &node_snap, true, existed)?,
                Selection::Search => self.node_in(node, &path, &node_snap, false, existed)?,
            }
        }
        if existed && self.opts.delete {
            let names: HashSet<&[u8]> = tree.nodes.iter().map(|n| n.name.as_slice()).collect();
            let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
            let mut gone = Vec::new();
            for entry in entries {
                let entry = entry.map_err(|e| Error::io(dir, e))?;
                let name = entry.file_name();
                if names.contains(name.as_bytes()) {
                    continue;
                }
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                if self
                    .filter
                    .select(&child_path(snap, name.as_bytes()), is_dir, inside)
                    == Selection::All
                {
                    gone.push(entry.path());
                }
            }
            gone.sort();
            for path in gone {
                self.add(&path, Action::Delete);
            }
        }
        Ok(())
    }

    fn node_in(
        &mut self,
        node: &Node,
        path: &Path,
        snap: &[u8],
        inside: bool,
        parent_existed: bool,
    ) -> Result<()> {
        if parent_existed {
            self.node(node, path, snap, inside)
        } else {
            self.fresh(node, path, snap, inside)
        }
    }

    /// `node` at `path`, where something may already be.
    fn node(&mut self, node: &Node, path: &Path, snap: &[u8], inside: bool) -> Result<()> {
        let found = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return self.fresh(node, path, snap, inside)
            }
            Err(e) => return Err(Error::io(path, e)),
        };
        if let NodeKind::Dir { subtree } = &node.kind {
            if found.is_dir() {
                return self.tree(subtree, path, snap, inside, true);
            }
        }
        let action = self.decide(node, path, &found)?;
        self.add(path, action);
        if let (Action::Write, NodeKind::Dir { subtree }) = (action, &node.kind) {
            self.tree(subtree, path, snap, inside, false)?;
        }
        Ok(())
    }

    /// `node` at `path`, where nothing is: written, with everything selected below it.
    fn fresh(&mut self, node: &Node, path: &Path, snap: &[u8], inside: bool) -> Result<()> {
        if let NodeKind::Dir { subtree } = &node.kind {
            // A directory the filter only searches is made when something below is.
            if inside {
                self.add(path, Action::Write);
            }
            return self.tree(subtree, path, snap, inside, false);
        }
        self.add(path, Action::Write);
        Ok(())
    }

    /// As restore's `decide`: what the overwrite mode makes of an existing entry.
    fn decide(&self, node: &Node, path: &Path, found: &Metadata) -> Result<Action> {
        Ok(match self.opts.overwrite {
            None | Some(Overwrite::Never) => Action::Keep,
            Some(Overwrite::Always) => Action::Write,
            Some(Overwrite::IfChanged) => {
                if same(node, path, found)? {
                    Action::Unchanged
                } else {
                    Action::Write
                }
            }
            Some(Overwrite::IfNewer) => {
                let theirs = (found.mtime(), found.mtime_nsec());
                if theirs < (node.mtime.sec, i64::from(node.mtime.nsec)) {
                    Action::Write
                } else {
                    Action::Keep
                }
            }
        })
    }
}

/// Whether the entry at `path` already is `node`, as `--overwrite if-changed` judges
/// without reading contents.
fn same(node: &Node, path: &Path, found: &Metadata) -> Result<bool> {
    let t = found.file_type();
    Ok(match &node.kind {
        NodeKind::File { size, .. } => {
            t.is_file()
                && found.len() == *size
                && (found.mtime(), found.mtime_nsec())
                    == (node.mtime.sec, i64::from(node.mtime.nsec))
        }
        NodeKind::Dir { .. } => t.is_dir(),
        NodeKind::Symlink { target } => {
            t.is_symlink()
                && std::fs::read_link(path)
                    .map_err(|e| Error::io(path, e))?
                    .as_os_str()
                    .as_bytes()
                    == target.as_slice()
        }
        NodeKind::Fifo => t.is_fifo(),
        NodeKind::Socket => t.is_socket(),
        NodeKind::CharDevice { rdev } => t.is_char_device() && found.rdev() == *rdev,
        NodeKind::BlockDevice { rdev } => t.is_block_device() && found.rdev() == *rdev,
    })
}

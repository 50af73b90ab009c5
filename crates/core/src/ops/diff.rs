//! `diff`: what changed between two snapshots, or between a snapshot and a live
//! directory. Both sides are walked together in name order, and a subtree with the same
//! id on both sides is skipped unread, so two snapshots of a mostly unchanged tree cost
//! a few tree reads. File contents are read only for `content` (a unified diff of
//! changed text files), never to decide whether a file changed.

use std::ffi::OsStr;
use std::fs::Metadata;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::fsmeta::{self, NameCache};
use crate::id::{BlobId, SnapshotId};
use crate::monitor::Monitor;
use crate::ops::browse::{self, path_names, Entry};
use crate::ops::exclude::{ExcludeOptions, Excludes};
use crate::ops::ignore_files::IgnoreStack;
use crate::repo::Repository;
use crate::snapshot::Snapshot;
use crate::tree::{ContentRef, Node, NodeKind};

/// One side of a comparison.
// A diff holds two of these: boxing the snapshot would save nothing worth the noise.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum DiffSide {
    Snapshot {
        id: SnapshotId,
        snapshot: Snapshot,
    },
    /// A directory on this machine, by absolute path; it is compared with the same path
    /// in the snapshot on the other side.
    Live(PathBuf),
}

impl DiffSide {
    /// How the side is named in unified diff headers: the short id, or `live`.
    pub fn label(&self) -> String {
        match self {
            DiffSide::Snapshot { id, .. } => id.short(),
            DiffSide::Live(_) => "live".into(),
        }
    }
}

/// What to compare and how. Plain data: the CLI fills it from its flags.
#[derive(Debug, Clone)]
pub struct DiffOptions {
    /// Compare only below this absolute snapshot path.
    pub path: Option<Vec<u8>>,
    /// Read both versions of each modified file and make a unified diff of text files.
    pub content: bool,
    /// Files larger than this on either side get no content diff.
    pub max_content_bytes: u64,
    /// What the live side leaves out, as backup would: with backup's options, the diff
    /// says what the next backup would add, change and remove.
    pub exclude: ExcludeOptions,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            path: None,
            content: false,
            max_content_bytes: 16 << 20,
            exclude: ExcludeOptions::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Removed,
    /// The content changed: a different list of content blobs or size (for a live file,
    /// a different size or mtime). Metadata may have changed too.
    Modified,
    /// Only metadata changed: mode, owner, mtime, xattrs, link target or device number.
    Metadata,
    /// The entry is of another type (a file became a directory, ...).
    TypeChanged,
}

impl ChangeKind {
    /// The letter restic users know: `+`, `-`, `M`, `U`, `T`.
    pub fn letter(self) -> char {
        match self {
            ChangeKind::Added => '+',
            ChangeKind::Removed => '-',
            ChangeKind::Modified => 'M',
            ChangeKind::Metadata => 'U',
            ChangeKind::TypeChanged => 'T',
        }
    }
}

/// What `content` found for a modified file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentDiff {
    /// A unified diff, with `---`/`+++` headers.
    Unified(String),
    /// One side is not UTF-8 text (or holds a NUL byte).
    Binary,
    /// One side is larger than [`DiffOptions::max_content_bytes`].
    TooLarge,
}

/// One changed path.
#[derive(Debug, Clone)]
pub struct Change {
    /// Absolute path as in the snapshot.
    pub path: Vec<u8>,
    pub kind: ChangeKind,
    /// Type names ([`NodeKind::name`]) on the old and new side, where the entry exists.
    pub old_type: Option<&'static str>,
    pub new_type: Option<&'static str>,
    /// File sizes on each side (files only).
    pub old_size: Option<u64>,
    pub new_size: Option<u64>,
    /// Metadata fields that differ: `mode`, `owner`, `mtime`, `xattrs`, `link_target`,
    /// `device`.
    pub metadata: Vec<&'static str>,
    pub content: Option<ContentDiff>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct DiffSummary {
    pub added: u64,
    pub removed: u64,
    pub modified: u64,
    pub metadata_only: u64,
    pub type_changed: u64,
    /// Sizes of added files, plus the growth of modified files.
    pub bytes_added: u64,
    /// Sizes of removed files, plus the shrinkage of modified files.
    pub bytes_removed: u64,
    /// Trees read from the repository.
    pub trees_read: u64,
    /// Subtrees skipped because both sides have the same id.
    pub trees_skipped: u64,
}

/// A live path that could not be read; it is left out of the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct DiffProblem {
    pub path: String,
    pub error: String,
}

#[derive(Debug, Clone, Default)]
pub struct DiffReport {
    /// In path order, parents before their entries.
    pub changes: Vec<Change>,
    pub summary: DiffSummary,
    pub problems: Vec<DiffProblem>,
}

/// Compares `old` with `new`. At least one side must be a snapshot. Without
/// `opts.path`, two snapshots are compared from the root and a live directory with the
/// same path in the snapshot; a missing path on both sides is an error naming the
/// closest existing names.
pub fn diff(
    repo: &Repository,
    old: &DiffSide,
    new: &DiffSide,
    opts: &DiffOptions,
    monitor: &dyn Monitor,
) -> Result<DiffReport> {
    let live = [old, new].into_iter().find_map(|s| match s {
        DiffSide::Live(p) => Some(p.as_os_str().as_bytes().to_vec()),
        DiffSide::Snapshot { .. } => None,
    });
    if matches!((old, new), (DiffSide::Live(_), DiffSide::Live(_))) {
        return Err(Error::InvalidInput(
            "diff compares a snapshot with a snapshot or a live directory; both sides are \
             directories here"
                .into(),
        ));
    }
    let top = match (&opts.path, &live) {
        (Some(p), _) => normalized(p),
        (None, Some(l)) => normalized(l),
        (None, None) => b"/".to_vec(),
    };
    if let Some(l) = &live {
        let l = normalized(l);
        if !Path::new(OsStr::from_bytes(&top)).starts_with(OsStr::from_bytes(&l)) {
            return Err(Error::InvalidInput(format!(
                "{} is not inside the live directory {}; give a path below it",
                String::from_utf8_lossy(&top),
                String::from_utf8_lossy(&l)
            )));
        }
    }
    let mut differ = Differ {
        repo,
        opts,
        labels: (old.label(), new.label()),
        monitor,
        names: NameCache::default(),
        report: DiffReport::default(),
        excludes: Excludes::of(&opts.exclude)?,
        ignores: IgnoreStack::default(),
    };
    let a = differ.start(old, &top)?;
    let b = differ.start(new, &top)?;
    // A live directory the snapshot does not hold is more likely a typo than a wish to
    // see every file as added: say which paths the snapshot has.
    for (side, start) in [(old, &a), (new, &b)] {
        if let (DiffSide::Snapshot { id, snapshot }, Start::Item(None), Some(l)) =
            (side, start, &live)
        {
            if opts.path.is_none() || normalized(l) == top {
                browse::find(repo, snapshot, &top).map_err(|e| e.naming_snapshot(id, snapshot))?;
            }
        }
    }
    match (a, b) {
        (Start::Root(a), Start::Root(b)) => differ.compare_dirs(&top, &a, &b)?,
        (Start::Root(a), Start::Item(Some(Item { dir: Some(b), .. })))
        | (Start::Item(Some(Item { dir: Some(a), .. })), Start::Root(b)) => {
            differ.compare_dirs(&top, &a, &b)?
        }
        (Start::Root(_), _) | (_, Start::Root(_)) => {
            return Err(Error::InvalidInput(
                "a snapshot's root can only be compared with a directory".into(),
            ))
        }
        (Start::Item(None), Start::Item(None)) => {
            // Neither side has it: let the first snapshot side say which names exist.
            for side in [old, new] {
                if let DiffSide::Snapshot { id, snapshot } = side {
                    browse::find(repo, snapshot, &top)
                        .map_err(|e| e.naming_snapshot(id, snapshot))?;
                }
            }
            return Err(Error::InvalidInput(format!(
                "{} exists on neither side",
                String::from_utf8_lossy(&top)
            )));
        }
        (Start::Item(a), Start::Item(b)) => differ.compare(&top, a, b)?,
    }
    Ok(differ.report)
}

/// `/a/b` for `a//b/`, `/./a/b` and the like.
fn normalized(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len() + 1);
    for name in path_names(path) {
        out.push(b'/');
        out.extend_from_slice(name);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    out
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = dir.to_vec();
    if path.last() != Some(&b'/') {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

fn fs_path(path: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(path))
}

/// A directory on one side: a stored tree or a live directory.
#[derive(Debug, Clone)]
enum Dir {
    Stored(BlobId),
    Live(PathBuf),
}

/// An entry on one side. A live entry's node has an empty content list, and for a
/// directory a placeholder subtree id: `dir` is what names its entries.
#[derive(Debug, Clone)]
struct Item {
    node: Node,
    dir: Option<Dir>,
    live: bool,
}

/// Where the comparison starts on one side.
// Two exist per diff, briefly.
#[allow(clippy::large_enum_variant)]
enum Start {
    /// A snapshot's root, which has no node (no metadata) of its own.
    Root(Dir),
    Item(Option<Item>),
}

struct Differ<'a> {
    repo: &'a Repository,
    opts: &'a DiffOptions,
    labels: (String, String),
    monitor: &'a dyn Monitor,
    names: NameCache,
    report: DiffReport,
    excludes: Excludes,
    /// Ignore-file matchers of the live directories being compared.
    ignores: IgnoreStack,
}

impl Differ<'_> {
    fn start(&mut self, side: &DiffSide, top: &[u8]) -> Result<Start> {
        match side {
            DiffSide::Snapshot { snapshot, .. } if top == b"/" => {
                Ok(Start::Root(Dir::Stored(snapshot.tree)))
            }
            DiffSide::Snapshot { snapshot, .. } => match browse::find(self.repo, snapshot, top) {
                Ok(Entry::Node(node)) => Ok(Start::Item(Some(stored_item(node)))),
                Ok(Entry::Root(tree)) => Ok(Start::Root(Dir::Stored(tree))),
                Err(Error::PathNotFound { .. }) => Ok(Start::Item(None)),
                Err(e) => Err(e),
            },
            DiffSide::Live(root) => {
                let path = fs_path(top);
                match std::fs::symlink_metadata(path) {
                    Ok(md) => {
                        let name = path
                            .file_name()
                            .map_or_else(Vec::new, |n| n.as_bytes().to_vec());
                        Ok(Start::Item(self.live_item(name, path, &md)))
                    }
                    // Below the live directory, a missing path is a removal; the live
                    // directory itself must exist.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && path != root => {
                        Ok(Start::Item(None))
                    }
                    Err(e) => Err(Error::io(path, e)),
                }
            }
        }
    }

    fn problem(&mut self, path: &Path, error: &dyn std::fmt::Display) {
        self.monitor.problem(path, error);
        self.report.problems.push(DiffProblem {
            path: path.to_string_lossy().into_owned(),
            error: error.to_string(),
        });
    }

    /// A live entry as a node, the way backup would record it (without reading
    /// contents); `None` if it cannot be read (reported).
    fn live_item(&mut self, name: Vec<u8>, path: &Path, md: &Metadata) -> Option<Item> {
        let ft = md.file_type();
        let mut dir = None;
        let kind = if ft.is_dir() {
            dir = Some(Dir::Live(path.to_path_buf()));
            NodeKind::Dir {
                subtree: BlobId([0; 32]),
            }
        } else if ft.is_file() {
            NodeKind::File {
                size: md.len(),
                content: Vec::new(),
            }
        } else if ft.is_symlink() {
            match std::fs::read_link(path) {
                Ok(t) => NodeKind::Symlink {
                    target: t.as_os_str().as_bytes().to_vec(),
                },
                Err(e) => {
                    self.problem(path, &e);
                    return None;
                }
            }
        } else {
            fsmeta::special_kind(md)
        };
        let mut node = fsmeta::node_from_metadata(name, md, kind, &mut self.names);
        match fsmeta::read_xattrs(path) {
            Ok(x) => node.xattrs = x,
            Err(e) => self.problem(path, &format!("extended attributes not read: {e}")),
        }
        Some(Item {
            node,
            dir,
            live: true,
        })
    }

    /// The entries of `dir`, sorted by name.
    fn list(&mut self, dir: &Dir) -> Result<Vec<Item>> {
        match dir {
            Dir::Stored(id) => {
                self.report.summary.trees_read += 1;
                let tree = self.repo.read_tree(id)?;
                Ok(tree.nodes.into_iter().map(stored_item).collect())
            }
            Dir::Live(path) => {
                let mut names = Vec::new();
                match std::fs::read_dir(path) {
                    Ok(rd) => {
                        for entry in rd {
                            match entry {
                                Ok(e) => names.push(e.file_name().as_bytes().to_vec()),
                                Err(e) => self.problem(path, &format!("listing incomplete: {e}")),
                            }
                        }
                    }
                    Err(e) => self.problem(path, &format!("directory not read: {e}")),
                }
                names.sort_unstable();
                let mut items = Vec::with_capacity(names.len());
                for name in names {
                    let child = path.join(OsStr::from_bytes(&name));
                    match std::fs::symlink_metadata(&child) {
                        Ok(md) if self.excluded(&child, &md) => {}
                        Ok(md) => items.extend(self.live_item(name, &child, &md)),
                        Err(e) => self.problem(&child, &e),
                    }
                }
                Ok(items)
            }
        }
    }

    fn compare_dirs(&mut self, path: &[u8], a: &Dir, b: &Dir) -> Result<()> {
        if let (Dir::Stored(x), Dir::Stored(y)) = (a, b) {
            if x == y {
                self.report.summary.trees_skipped += 1;
                return Ok(());
            }
        }
        if self.monitor.cancelled() {
            return Err(Error::Interrupted);
        }
        let live = [a, b].into_iter().find_map(|d| match d {
            Dir::Live(path) => Some(path.clone()),
            Dir::Stored(_) => None,
        });
        let pushed = match &live {
            Some(dir) => self.push_ignores(dir)?,
            None => false,
        };
        let mut old = self.list(a)?.into_iter().peekable();
        let mut new = self.list(b)?.into_iter().peekable();
        loop {
            let order = match (old.peek(), new.peek()) {
                (None, None) => break,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some(x), Some(y)) => x.node.name.cmp(&y.node.name),
            };
            let (x, y) = match order {
                std::cmp::Ordering::Less => (old.next(), None),
                std::cmp::Ordering::Greater => (None, new.next()),
                std::cmp::Ordering::Equal => (old.next(), new.next()),
            };
            let name = x.as_ref().or(y.as_ref()).map(|i| i.node.name.clone());
            if let Some(name) = name {
                self.compare(&join(path, &name), x, y)?;
            }
        }
        if pushed {
            self.ignores.pop();
        }
        Ok(())
    }

    /// Adds the ignore files of live directory `dir`; whether a level was pushed.
    fn push_ignores(&mut self, dir: &Path) -> Result<bool> {
        let (pushed, unreadable) =
            self.ignores
                .push_dir(dir, &self.opts.exclude.ignore_files, |name| {
                    std::fs::symlink_metadata(dir.join(name)).is_ok()
                })?;
        for (file, e) in unreadable {
            self.problem(&file, &format!("ignore file not read, not applied: {e}"));
        }
        Ok(pushed)
    }

    /// Whether backup would leave out live entry `path` (never the live directory
    /// itself: backup applies exclusions below the paths it is given).
    fn excluded(&self, path: &Path, md: &Metadata) -> bool {
        let why =
            (self.opts.exclude).why_excluded(&self.excludes, &self.ignores, path, md, false, None);
        why.is_some()
    }

    fn compare(&mut self, path: &[u8], old: Option<Item>, new: Option<Item>) -> Result<()> {
        match (old, new) {
            (None, None) => Ok(()),
            (Some(a), None) => self.whole(path, &a, ChangeKind::Removed),
            (None, Some(b)) => self.whole(path, &b, ChangeKind::Added),
            (Some(a), Some(b)) if a.node.kind.name() != b.node.kind.name() => {
                let s = &mut self.report.summary;
                s.type_changed += 1;
                s.bytes_removed += file_size(&a.node).unwrap_or(0);
                s.bytes_added += file_size(&b.node).unwrap_or(0);
                self.push(
                    path,
                    ChangeKind::TypeChanged,
                    Some(&a),
                    Some(&b),
                    Vec::new(),
                );
                // The entries of a directory that appeared or vanished are changes too.
                if let Some(dir) = &a.dir {
                    for child in self.list(dir)? {
                        let p = join(path, &child.node.name);
                        self.whole(&p, &child, ChangeKind::Removed)?;
                    }
                }
                if let Some(dir) = &b.dir {
                    for child in self.list(dir)? {
                        let p = join(path, &child.node.name);
                        self.whole(&p, &child, ChangeKind::Added)?;
                    }
                }
                Ok(())
            }
            (Some(a), Some(b)) => {
                let live = a.live || b.live;
                let content_changed = match (&a.node.kind, &b.node.kind) {
                    (
                        NodeKind::File {
                            size: sa,
                            content: ca,
                        },
                        NodeKind::File {
                            size: sb,
                            content: cb,
                        },
                    ) => {
                        // A live file is not read: like backup, trust size and mtime.
                        sa != sb
                            || if live {
                                a.node.mtime != b.node.mtime
                            } else {
                                !self.same_content(path, &a, &b, ca, cb)?
                            }
                    }
                    _ => false,
                };
                let metadata = metadata_changes(&a.node, &b.node);
                if content_changed {
                    let (sa, sb) = (
                        file_size(&a.node).unwrap_or(0),
                        file_size(&b.node).unwrap_or(0),
                    );
                    let s = &mut self.report.summary;
                    s.modified += 1;
                    s.bytes_added += sb.saturating_sub(sa);
                    s.bytes_removed += sa.saturating_sub(sb);
                    self.push(path, ChangeKind::Modified, Some(&a), Some(&b), metadata);
                    if self.opts.content {
                        let content = self.content_diff(path, &a, &b)?;
                        if let Some(last) = self.report.changes.last_mut() {
                            last.content = Some(content);
                        }
                    }
                } else if !metadata.is_empty() {
                    self.report.summary.metadata_only += 1;
                    self.push(path, ChangeKind::Metadata, Some(&a), Some(&b), metadata);
                }
                if let (Some(x), Some(y)) = (&a.dir, &b.dir) {
                    self.compare_dirs(path, x, y)?;
                }
                Ok(())
            }
        }
    }

    /// Records `item` and everything below it as added or removed.
    fn whole(&mut self, path: &[u8], item: &Item, kind: ChangeKind) -> Result<()> {
        let size = file_size(&item.node).unwrap_or(0);
        let s = &mut self.report.summary;
        if kind == ChangeKind::Added {
            s.added += 1;
            s.bytes_added += size;
            self.push(path, kind, None, Some(item), Vec::new());
        } else {
            s.removed += 1;
            s.bytes_removed += size;
            self.push(path, kind, Some(item), None, Vec::new());
        }
        if let Some(dir) = &item.dir {
            for child in self.list(dir)? {
                self.whole(&join(path, &child.node.name), &child, kind)?;
            }
        }
        Ok(())
    }

    fn push(
        &mut self,
        path: &[u8],
        kind: ChangeKind,
        old: Option<&Item>,
        new: Option<&Item>,
        metadata: Vec<&'static str>,
    ) {
        self.report.changes.push(Change {
            path: path.to_vec(),
            kind,
            old_type: old.map(|i| i.node.kind.name()),
            new_type: new.map(|i| i.node.kind.name()),
            old_size: old.and_then(|i| file_size(&i.node)),
            new_size: new.and_then(|i| file_size(&i.node)),
            metadata,
            content: None,
        });
    }

    fn content_diff(&mut self, path: &[u8], a: &Item, b: &Item) -> Result<ContentDiff> {
        let limit = self.opts.max_content_bytes;
        if file_size(&a.node).unwrap_or(0) > limit || file_size(&b.node).unwrap_or(0) > limit {
            return Ok(ContentDiff::TooLarge);
        }
        let (old, new) = (self.read_content(path, a)?, self.read_content(path, b)?);
        let (Some(old), Some(new)) = (as_text(&old), as_text(&new)) else {
            return Ok(ContentDiff::Binary);
        };
        let shown = String::from_utf8_lossy(path);
        let text = similar::TextDiff::from_lines(old, new)
            .unified_diff()
            .context_radius(3)
            .header(
                &format!("{}:{shown}", self.labels.0),
                &format!("{}:{shown}", self.labels.1),
            )
            .to_string();
        Ok(ContentDiff::Unified(text))
    }

    /// Whether two stored files of the same size hold the same bytes. Lists of whole
    /// chunks differ exactly when their ids do (equal data is cut alike), but the same
    /// small file may sit in different bundles (see `ops::ingest`): a file that refers to
    /// part of a blob is compared byte by byte. Bundled files are small, so this is cheap.
    fn same_content(
        &self,
        path: &[u8],
        a: &Item,
        b: &Item,
        ca: &[ContentRef],
        cb: &[ContentRef],
    ) -> Result<bool> {
        if ca == cb {
            return Ok(true);
        }
        if browse::whole_blobs(self.repo, ca) && browse::whole_blobs(self.repo, cb) {
            return Ok(false);
        }
        Ok(self.read_content(path, a)? == self.read_content(path, b)?)
    }

    fn read_content(&self, path: &[u8], item: &Item) -> Result<Vec<u8>> {
        if item.live {
            return std::fs::read(fs_path(path)).map_err(|e| Error::io(fs_path(path), e));
        }
        let mut out = Vec::new();
        browse::cat(
            self.repo,
            &item.node,
            &String::from_utf8_lossy(path),
            &mut out,
        )?;
        Ok(out)
    }
}

fn stored_item(node: Node) -> Item {
    let dir = match &node.kind {
        NodeKind::Dir { subtree } => Some(Dir::Stored(*subtree)),
        _ => None,
    };
    Item {
        node,
        dir,
        live: false,
    }
}

fn file_size(node: &Node) -> Option<u64> {
    match node.kind {
        NodeKind::File { size, .. } => Some(size),
        _ => None,
    }
}

/// Text for a diff: UTF-8 without NUL bytes (which text never holds, and binaries do).
fn as_text(bytes: &[u8]) -> Option<&str> {
    if bytes.contains(&0) {
        return None;
    }
    std::str::from_utf8(bytes).ok()
}

/// Metadata fields that differ between two entries of the same type. Inode, device,
/// link count and ctime are left out: a restore or a copy changes them without the
/// user changing anything. A directory's mtime is left out too: it changes whenever an
/// entry is added or removed, which the diff already shows.
fn metadata_changes(a: &Node, b: &Node) -> Vec<&'static str> {
    let mut out = Vec::new();
    let (is_dir, is_link) = (
        matches!(a.kind, NodeKind::Dir { .. }),
        matches!(a.kind, NodeKind::Symlink { .. }),
    );
    // Symlink permission bits mean nothing on Linux.
    if !is_link && a.mode != b.mode {
        out.push("mode");
    }
    if (a.uid, a.gid) != (b.uid, b.gid) {
        out.push("owner");
    }
    if !is_dir && a.mtime != b.mtime {
        out.push("mtime");
    }
    if a.xattrs != b.xattrs {
        out.push("xattrs");
    }
    match (&a.kind, &b.kind) {
        (NodeKind::Symlink { target: x }, NodeKind::Symlink { target: y }) if x != y => {
            out.push("link_target")
        }
        (NodeKind::CharDevice { rdev: x }, NodeKind::CharDevice { rdev: y })
        | (NodeKind::BlockDevice { rdev: x }, NodeKind::BlockDevice { rdev: y })
            if x != y =>
        {
            out.push("device")
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Time;

    fn file(size: u64, mode: u32, mtime: i64) -> Node {
        Node {
            name: b"f".to_vec(),
            kind: NodeKind::File {
                size,
                content: Vec::new(),
            },
            mode,
            uid: 1,
            gid: 1,
            user: None,
            group: None,
            mtime: Time {
                sec: mtime,
                nsec: 0,
            },
            ctime: Time::default(),
            inode: 1,
            device: 1,
            links: 1,
            xattrs: Vec::new(),
        }
    }

    #[test]
    fn metadata_changes_name_each_field_and_ignore_inode_and_ctime() {
        let a = file(1, 0o644, 10);
        let mut b = file(1, 0o600, 11);
        b.inode = 99;
        b.ctime = Time { sec: 5, nsec: 0 };
        assert_eq!(metadata_changes(&a, &b), vec!["mode", "mtime"]);
        assert!(metadata_changes(&a, &a.clone()).is_empty());
    }

    #[test]
    fn paths_are_normalized_and_joined() {
        assert_eq!(normalized(b"a//b/./c/"), b"/a/b/c");
        assert_eq!(normalized(b""), b"/");
        assert_eq!(join(b"/", b"x"), b"/x");
        assert_eq!(join(b"/a", b"x"), b"/a/x");
    }

    #[test]
    fn text_is_utf8_without_nul() {
        assert_eq!(as_text(b"hi\n"), Some("hi\n"));
        assert_eq!(as_text(b"a\0b"), None);
        assert_eq!(as_text(&[0xff]), None);
    }
}

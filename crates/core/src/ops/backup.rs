//! `backup`: walk the source paths in name order, read the parent snapshot's trees in step
//! to skip files whose metadata did not change, chunk and hash the rest, hand new blobs
//! to the writer, store trees bottom-up, then the index, then the snapshot, last.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use cairn_chunker::{Chunker, ChunkerParams};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::fsmeta::{self, NameCache};
use crate::id::{BlobId, PackId, SnapshotId};
use crate::monitor::Monitor;
use crate::ops::exclude::Excludes;
use crate::ops::ignore_files::{self, IgnoreStack};
use crate::pack::BlobKind;
use crate::repo::Repository;
use crate::session::Session;
use crate::snapshot::{Snapshot, SnapshotSummary};
use crate::tree::{ContentRef, Node, NodeKind, Tree};
use crate::writer::{BlobWriter, WriterReport as Written};

/// What to back up and how. Plain data: the CLI fills it from its flags.
#[derive(Debug, Clone, Default)]
pub struct BackupOptions {
    pub paths: Vec<PathBuf>,
    /// Glob patterns: without `/` they match a name anywhere; with `/`, the absolute path.
    pub excludes: Vec<String>,
    pub tags: Vec<String>,
    pub host: String,
    pub username: String,
    pub one_file_system: bool,
    /// Compare with this snapshot; `None` picks the latest with the same host and paths.
    pub parent: Option<SnapshotId>,
    /// Read every file even when its metadata says it is unchanged.
    pub force: bool,
    /// Names of per-directory ignore files in gitignore syntax, in increasing precedence
    /// (the CLI passes `.gitignore` with `--git-ignore`, then `.cairnignore`).
    pub ignore_files: Vec<OsString>,
    /// Leave out a directory that holds a file of one of these names.
    pub exclude_if_present: Vec<OsString>,
    /// Leave out directories tagged with a valid `CACHEDIR.TAG`.
    pub exclude_caches: bool,
    /// Leave out files larger than this many bytes.
    pub exclude_larger_than: Option<u64>,
}

/// A path that could not be backed up, and why.
#[derive(Debug, Clone, Serialize)]
pub struct SourceProblem {
    pub path: String,
    pub error: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct BackupStats {
    pub files_new: u64,
    pub files_changed: u64,
    pub files_unchanged: u64,
    pub dirs: u64,
    /// Symlinks, FIFOs, sockets and devices.
    pub others: u64,
    pub excluded: u64,
    /// Bytes read from source files.
    pub bytes_read: u64,
    /// Sum of the sizes of all files in the snapshot.
    pub total_bytes: u64,
    pub blobs_added: u64,
    /// Plaintext bytes of the new blobs.
    pub raw_bytes_added: u64,
    /// Bytes written to the repository after dedup and compression.
    pub bytes_added: u64,
    pub errors: Vec<SourceProblem>,
    pub duration_ms: u64,
}

#[derive(Debug)]
pub struct BackupReport {
    pub snapshot_id: SnapshotId,
    pub snapshot: Snapshot,
    pub parent: Option<SnapshotId>,
    pub stats: BackupStats,
}

/// Registers a backup session, then (re)reads the index: from here on, prune will not
/// delete a pack this backup may build on.
fn begin(repo: &mut Repository, opts: &BackupOptions) -> Result<Session> {
    let session = Session::start(repo, &opts.host)?;
    repo.load_index()?;
    Ok(session)
}

/// Backs up `opts.paths`. The repository may be opened without its index; the backup
/// reads it after registering its session.
pub fn backup(
    repo: &mut Repository,
    opts: &BackupOptions,
    monitor: &dyn Monitor,
) -> Result<BackupReport> {
    let started = Instant::now();
    let paths = normalize_paths(&opts.paths)?;
    let session = begin(repo, opts)?;
    let display_paths: Vec<String> = paths
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let parent = match opts.parent {
        Some(id) => Some((id, repo.load_snapshot(&id)?)),
        None => find_parent(repo, &opts.host, &display_paths)?,
    };
    let parent_tree = match &parent {
        Some((_, s)) => Some(repo.read_tree(&s.tree)?),
        None => None,
    };
    let excludes = Excludes::new(&opts.excludes)?;
    let (tree, stats) = {
        let mut archiver = Archiver::new(repo, opts, &excludes, monitor)?;
        let root = SourceDir::build(&paths);
        let tree = archiver.save_virtual(&root, parent_tree.as_ref())?;
        archiver.finish(tree)?
    };
    commit(
        repo,
        session,
        tree,
        stats,
        parent.map(|p| p.0),
        display_paths,
        opts,
        started,
    )
}

/// Backs up everything `reader` yields as one file named `name` at the root.
pub fn backup_stdin(
    repo: &mut Repository,
    name: &str,
    reader: &mut dyn Read,
    opts: &BackupOptions,
    monitor: &dyn Monitor,
) -> Result<BackupReport> {
    let started = Instant::now();
    if !crate::tree::is_safe_name(name.as_bytes()) {
        return Err(Error::InvalidInput(format!(
            "--stdin-filename {name:?} must be a plain file name, without '/'"
        )));
    }
    let session = begin(repo, opts)?;
    let excludes = Excludes::new(&[])?;
    let (tree, stats) = {
        let mut archiver = Archiver::new(repo, opts, &excludes, monitor)?;
        let (content, size) = archiver
            .chunk(reader)?
            .map_err(|e| Error::io("<stdin>", e))?;
        archiver.stats.files_new = 1;
        archiver.stats.total_bytes = size;
        let now = crate::tree::Time::now();
        let node = Node {
            name: name.as_bytes().to_vec(),
            kind: NodeKind::File { size, content },
            mode: 0o644,
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            user: archiver.names.user(nix::unistd::getuid().as_raw()),
            group: archiver.names.group(nix::unistd::getgid().as_raw()),
            mtime: now,
            ctime: now,
            inode: 0,
            device: 0,
            links: 1,
            xattrs: Vec::new(),
        };
        let tree = archiver.save_tree(Tree { nodes: vec![node] })?;
        archiver.finish(tree)?
    };
    let paths = vec![format!("/{name}")];
    commit(repo, session, tree, stats, None, paths, opts, started)
}

#[allow(clippy::too_many_arguments)]
fn commit(
    repo: &mut Repository,
    session: Session,
    (tree, written): (BlobId, Written),
    mut stats: BackupStats,
    parent: Option<SnapshotId>,
    paths: Vec<String>,
    opts: &BackupOptions,
    started: Instant,
) -> Result<BackupReport> {
    // Durability order: packs are stored (finish waited for them), then the index that
    // names them, then the snapshot that relies on both.
    repo.write_index(written.packs[written.packs_indexed..].to_vec())?;
    repo.absorb(&written.packs);
    crate::session::confirm_reused_packs(repo, &session, &written.reused_packs)?;
    stats.duration_ms = started.elapsed().as_millis() as u64;
    let snapshot = Snapshot {
        time: jiff::Timestamp::now(),
        host: opts.host.clone(),
        username: opts.username.clone(),
        paths,
        tags: opts.tags.clone(),
        tree,
        parent,
        program_version: format!("cairn {}", env!("CARGO_PKG_VERSION")),
        summary: SnapshotSummary {
            files: stats.files_new + stats.files_changed + stats.files_unchanged,
            dirs: stats.dirs,
            total_bytes: stats.total_bytes,
            bytes_added: stats.bytes_added,
        },
    };
    let snapshot_id = repo.save_snapshot(&snapshot)?;
    session.finish()?;
    Ok(BackupReport {
        snapshot_id,
        snapshot,
        parent,
        stats,
    })
}

fn find_parent(
    repo: &Repository,
    host: &str,
    paths: &[String],
) -> Result<Option<(SnapshotId, Snapshot)>> {
    let mut wanted = paths.to_vec();
    wanted.sort();
    Ok(repo
        .snapshots()?
        .snapshots
        .into_iter()
        .rev()
        .find(|(_, s)| {
            let mut theirs = s.paths.clone();
            theirs.sort();
            s.host == host && theirs == wanted
        }))
}

/// Absolute, lexically cleaned, existing paths; a path covered by another is dropped.
/// `path` made absolute and cleaned of `.` and `..` without resolving symlinks, as
/// backup records source paths.
pub fn lexical_absolute(path: &Path) -> std::io::Result<PathBuf> {
    let abs = std::path::absolute(path)?;
    let mut clean = PathBuf::from("/");
    for c in abs.components() {
        match c {
            Component::Normal(n) => clean.push(n),
            Component::ParentDir => {
                clean.pop();
            }
            _ => {}
        }
    }
    Ok(clean)
}

fn normalize_paths(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    if paths.is_empty() {
        return Err(Error::InvalidInput(
            "Nothing to back up: give at least one path".into(),
        ));
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for p in paths {
        let clean = lexical_absolute(p).map_err(|e| Error::io(p, e))?;
        std::fs::symlink_metadata(&clean).map_err(|e| Error::io(&clean, e))?;
        out.push(clean);
    }
    out.sort();
    out.dedup();
    let covered: Vec<PathBuf> = out.clone();
    out.retain(|p| !covered.iter().any(|q| q != p && p.starts_with(q)));
    Ok(out)
}

/// The directories above the backed-up paths: `/home/u/docs` becomes `home` → `u` →
/// `docs`, where only `docs` is walked and the others contribute their own metadata.
enum SourceDir {
    Walk(PathBuf),
    Virtual(PathBuf, BTreeMap<Vec<u8>, SourceDir>),
}

impl SourceDir {
    fn build(paths: &[PathBuf]) -> BTreeMap<Vec<u8>, SourceDir> {
        let mut root = BTreeMap::new();
        for path in paths {
            let names: Vec<&[u8]> = path
                .components()
                .filter_map(|c| match c {
                    Component::Normal(n) => Some(n.as_bytes()),
                    _ => None,
                })
                .collect();
            let mut level = &mut root;
            let mut at = PathBuf::from("/");
            for (i, name) in names.iter().enumerate() {
                at.push(std::ffi::OsStr::from_bytes(name));
                if i + 1 == names.len() {
                    level.insert(name.to_vec(), SourceDir::Walk(at.clone()));
                    break;
                }
                let entry = level
                    .entry(name.to_vec())
                    .or_insert_with(|| SourceDir::Virtual(at.clone(), BTreeMap::new()));
                match entry {
                    SourceDir::Virtual(_, children) => level = children,
                    SourceDir::Walk(_) => break,
                }
            }
        }
        root
    }
}

struct Archiver<'r, 'o> {
    repo: &'r Repository,
    writer: BlobWriter<'r>,
    params: ChunkerParams,
    seed: u64,
    opts: &'o BackupOptions,
    excludes: &'o Excludes,
    monitor: &'o dyn Monitor,
    names: NameCache,
    stats: BackupStats,
    /// The device of the top-level path being walked, for --one-file-system.
    root_device: u64,
    /// The chunker's buffer, kept from file to file.
    chunk_buf: Vec<u8>,
    /// Packs holding the chunks of unchanged files, which this snapshot builds on.
    reused_packs: HashSet<PackId>,
    /// Ignore-file matchers of the directories being walked.
    ignores: IgnoreStack,
}

impl<'r, 'o> Archiver<'r, 'o> {
    fn new(
        repo: &'r Repository,
        opts: &'o BackupOptions,
        excludes: &'o Excludes,
        monitor: &'o dyn Monitor,
    ) -> Result<Self> {
        Ok(Archiver {
            repo,
            writer: repo.blob_writer(),
            params: repo.chunker_params()?,
            seed: repo.key().chunker_seed(),
            opts,
            excludes,
            monitor,
            names: NameCache::default(),
            stats: BackupStats::default(),
            root_device: 0,
            chunk_buf: Vec::new(),
            reused_packs: HashSet::new(),
            ignores: IgnoreStack::default(),
        })
    }

    fn finish(self, tree: BlobId) -> Result<((BlobId, Written), BackupStats)> {
        let mut stats = self.stats;
        let mut report = self.writer.finish()?;
        stats.blobs_added = report.blobs_added;
        stats.raw_bytes_added = report.raw_bytes_added;
        stats.bytes_added = report.stored_bytes_added;
        report.reused_packs.extend(self.reused_packs);
        Ok(((tree, report), stats))
    }

    fn problem(&mut self, path: &Path, error: &dyn std::fmt::Display) {
        self.monitor.problem(path, error);
        self.stats.errors.push(SourceProblem {
            path: path.to_string_lossy().into_owned(),
            error: error.to_string(),
        });
    }

    fn save_tree(&mut self, tree: Tree) -> Result<BlobId> {
        Ok(self.writer.add(BlobKind::Tree, &tree.to_bytes())?.0)
    }

    /// The subtree of the parent snapshot at the same place, if it is a directory there.
    fn parent_subtree(&mut self, parent: Option<&Node>, path: &Path) -> Option<Tree> {
        let Some(NodeKind::Dir { subtree }) = parent.map(|n| &n.kind) else {
            return None;
        };
        match self.repo.read_tree(subtree) {
            Ok(t) => Some(t),
            Err(e) => {
                // Not fatal: the directory is read in full instead.
                self.monitor.problem(
                    path,
                    &format!(
                        "parent snapshot unreadable here, reading all files: {}",
                        crate::error::chain(&e)
                    ),
                );
                None
            }
        }
    }

    fn save_virtual(
        &mut self,
        children: &BTreeMap<Vec<u8>, SourceDir>,
        parent: Option<&Tree>,
    ) -> Result<BlobId> {
        let mut nodes = Vec::new();
        for (name, child) in children {
            let parent_node = parent.and_then(|t| t.find(name));
            let path = match child {
                SourceDir::Walk(p) | SourceDir::Virtual(p, _) => p,
            };
            let md = match std::fs::symlink_metadata(path) {
                Ok(md) => md,
                Err(e) => {
                    self.problem(path, &e);
                    continue;
                }
            };
            match child {
                SourceDir::Walk(p) => {
                    self.root_device = md.dev();
                    if let Some(node) = self.save_entry(name.clone(), p, md, parent_node)? {
                        nodes.push(node);
                    }
                }
                SourceDir::Virtual(p, grandchildren) => {
                    let sub_parent = self.parent_subtree(parent_node, p);
                    let subtree = self.save_virtual(grandchildren, sub_parent.as_ref())?;
                    self.stats.dirs += 1;
                    nodes.push(self.node(name.clone(), p, &md, NodeKind::Dir { subtree }));
                }
            }
        }
        self.save_tree(Tree { nodes })
    }

    fn node(&mut self, name: Vec<u8>, path: &Path, md: &Metadata, kind: NodeKind) -> Node {
        let mut node = fsmeta::node_from_metadata(name, md, kind, &mut self.names);
        match fsmeta::read_xattrs(path) {
            Ok(x) => node.xattrs = x,
            Err(e) => self.problem(path, &format!("extended attributes not saved: {e}")),
        }
        node
    }

    /// Saves one directory entry; `None` when it is excluded or unreadable (reported).
    fn save_entry(
        &mut self,
        name: Vec<u8>,
        path: &Path,
        md: Metadata,
        parent: Option<&Node>,
    ) -> Result<Option<Node>> {
        let ft = md.file_type();
        let kind = if ft.is_dir() {
            if (self.opts.one_file_system && md.dev() != self.root_device)
                || self.is_tagged_dir(path)
            {
                self.stats.excluded += 1;
                return Ok(None);
            }
            let sub_parent = self.parent_subtree(parent, path);
            let subtree = self.save_dir(path, sub_parent.as_ref())?;
            self.stats.dirs += 1;
            NodeKind::Dir { subtree }
        } else if ft.is_file() {
            if self
                .opts
                .exclude_larger_than
                .is_some_and(|max| md.len() > max)
            {
                self.stats.excluded += 1;
                return Ok(None);
            }
            match self.save_file(path, &md, parent)? {
                Some(kind) => kind,
                None => return Ok(None),
            }
        } else if ft.is_symlink() {
            match std::fs::read_link(path) {
                Ok(t) => {
                    self.stats.others += 1;
                    NodeKind::Symlink {
                        target: t.as_os_str().as_bytes().to_vec(),
                    }
                }
                Err(e) => {
                    self.problem(path, &e);
                    return Ok(None);
                }
            }
        } else {
            self.stats.others += 1;
            fsmeta::special_kind(&md)
        };
        Ok(Some(self.node(name, path, &md, kind)))
    }

    fn save_dir(&mut self, dir: &Path, parent: Option<&Tree>) -> Result<BlobId> {
        let mut entries: Vec<(Vec<u8>, PathBuf)> = Vec::new();
        match std::fs::read_dir(dir) {
            Ok(rd) => {
                for entry in rd {
                    match entry {
                        Ok(e) => entries.push((e.file_name().as_bytes().to_vec(), e.path())),
                        Err(e) => self.problem(dir, &format!("listing incomplete: {e}")),
                    }
                }
            }
            Err(e) => self.problem(dir, &format!("directory not read, saved empty: {e}")),
        }
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let present = |n: &std::ffi::OsStr| {
            entries
                .binary_search_by(|e| e.0.as_slice().cmp(n.as_bytes()))
                .is_ok()
        };
        let (pushed, unreadable) = self
            .ignores
            .push_dir(dir, &self.opts.ignore_files, present)?;
        for (file, e) in unreadable {
            self.problem(&file, &format!("ignore file not read, not applied: {e}"));
        }
        let nodes = self.save_entries(entries, parent);
        if pushed {
            self.ignores.pop();
        }
        let nodes = nodes?;
        self.save_tree(Tree { nodes })
    }

    /// Whether a directory is left out by `--exclude-if-present` or `--exclude-caches`.
    fn is_tagged_dir(&self, dir: &Path) -> bool {
        self.opts
            .exclude_if_present
            .iter()
            .any(|name| std::fs::symlink_metadata(dir.join(name)).is_ok())
            || (self.opts.exclude_caches && ignore_files::has_cachedir_tag(dir))
    }

    fn save_entries(
        &mut self,
        entries: Vec<(Vec<u8>, PathBuf)>,
        parent: Option<&Tree>,
    ) -> Result<Vec<Node>> {
        let mut nodes = Vec::with_capacity(entries.len());
        for (name, path) in entries {
            if self.monitor.cancelled() {
                return Err(Error::Interrupted);
            }
            let md = match std::fs::symlink_metadata(&path) {
                Ok(md) => md,
                Err(e) => {
                    self.problem(&path, &e);
                    continue;
                }
            };
            if self.excludes.matches(&path) || self.ignores.is_ignored(&path, md.is_dir()) {
                self.stats.excluded += 1;
                continue;
            }
            let parent_node = parent.and_then(|t| t.find(&name));
            if let Some(node) = self.save_entry(name, &path, md, parent_node)? {
                nodes.push(node);
            }
        }
        Ok(nodes)
    }

    /// A file's node kind, reusing the parent's chunk list when its metadata is unchanged.
    fn save_file(
        &mut self,
        path: &Path,
        md: &Metadata,
        parent: Option<&Node>,
    ) -> Result<Option<NodeKind>> {
        if let Some(p) = parent {
            if let NodeKind::File { size, content } = &p.kind {
                let unchanged = !self.opts.force
                    && *size == md.len()
                    && p.mtime == fsmeta::mtime(md)
                    && p.ctime == fsmeta::ctime(md)
                    && p.inode == md.ino()
                    && p.device == md.dev()
                    && content
                        .iter()
                        .all(|c| self.repo.index().contains_live(&c.blob));
                if unchanged {
                    let index = self.repo.index();
                    self.reused_packs.extend(
                        content
                            .iter()
                            .filter_map(|c| index.get(&c.blob))
                            .map(|l| l.pack),
                    );
                    self.stats.files_unchanged += 1;
                    self.stats.total_bytes += size;
                    self.monitor.bytes_done(*size);
                    self.monitor.file_done(path, *size);
                    return Ok(Some(NodeKind::File {
                        size: *size,
                        content: content.clone(),
                    }));
                }
            }
        }
        let result = match File::open(path) {
            Ok(mut f) => self.chunk(&mut f)?,
            Err(e) => Err(e),
        };
        Ok(match result {
            Ok((content, size)) => {
                if matches!(parent.map(|p| &p.kind), Some(NodeKind::File { .. })) {
                    self.stats.files_changed += 1;
                } else {
                    self.stats.files_new += 1;
                }
                self.stats.total_bytes += size;
                self.monitor.file_done(path, size);
                Some(NodeKind::File { size, content })
            }
            Err(e) => {
                self.problem(path, &e);
                None
            }
        })
    }

    /// Chunks, hashes and stores everything `reader` yields. The outer error is the
    /// repository's (fatal), the inner one the source's (reported, file skipped).
    fn chunk(&mut self, reader: &mut dyn Read) -> Result<std::io::Result<(Vec<ContentRef>, u64)>> {
        let buffer = std::mem::take(&mut self.chunk_buf);
        let mut chunker = Chunker::with_buffer(reader, self.params, self.seed, buffer);
        let mut content = Vec::new();
        loop {
            if self.monitor.cancelled() {
                return Err(Error::Interrupted);
            }
            let chunk = match chunker.next_chunk() {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(e) => return Ok(Err(e)),
            };
            let (blob, _) = self.writer.add(BlobKind::Data, chunk.data)?;
            self.monitor.bytes_done(chunk.data.len() as u64);
            content.push(ContentRef {
                blob,
                offset: 0,
                len: chunk.data.len() as u32,
            });
        }
        let size = chunker.position();
        self.chunk_buf = chunker.into_buffer();
        self.stats.bytes_read += size;
        Ok(Ok((content, size)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_made_absolute_and_covered_ones_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::create_dir_all(a.join("b")).unwrap();
        let got = normalize_paths(&[a.join("b"), a.join("b/../b"), a.clone()]).unwrap();
        assert_eq!(got, vec![a]);
        assert!(normalize_paths(&[dir.path().join("missing")]).is_err());
    }

    #[test]
    fn source_dirs_nest_under_their_parents() {
        let root = SourceDir::build(&[PathBuf::from("/x/y/z"), PathBuf::from("/x/w")]);
        let SourceDir::Virtual(p, children) = &root[&b"x".to_vec()] else {
            panic!()
        };
        assert_eq!(p, Path::new("/x"));
        assert!(matches!(children[&b"w".to_vec()], SourceDir::Walk(_)));
        assert!(matches!(children[&b"y".to_vec()], SourceDir::Virtual(..)));
    }
}

//! `restore`: recreate a snapshot (or part of one) below a target directory, with contents
//! and metadata. Two promises: nothing is written outside the target, whatever names the
//! snapshot holds, and no restored file ever holds wrong bytes (each file is written under
//! a temporary name from verified blobs and renamed into place only when complete).
//!
//! Into an existing target, `Overwrite::IfChanged` makes a restore resumable: a file whose
//! size and mtime already match the snapshot (and, with `verify`, whose contents cut and
//! hash to the snapshot's chunk ids) is left as it is, and the temporary files an
//! interrupted run left behind are removed. `delete` removes what the selection does not
//! hold, never following a symlink (directories are entered only after `lstat` says they
//! are directories, and `remove_dir_all` does not follow links).

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::fsmeta;
use crate::id::BlobId;
use crate::monitor::Monitor;
use crate::ops::backup::SourceProblem;
use crate::ops::browse::{self, Entry};
use crate::ops::restore_filter::{child_path, RestoreFilter, Selection};
use crate::ops::restore_packs::{self, FileDone, FileJob};
use crate::repo::Repository;
use crate::snapshot::Snapshot;
use crate::tree::{is_safe_name, Node, NodeKind};

/// What to do with files that already exist in the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    /// Replace every existing entry.
    Always,
    /// Replace a file only when its size or mtime differ from the snapshot's (or, with
    /// `verify`, its contents); other entries when their type or link target differ.
    IfChanged,
    /// Replace a file only when the snapshot's mtime is newer than the file's.
    IfNewer,
    /// Keep every existing entry.
    Never,
}

/// What to restore and how. Plain data: the CLI fills it from its flags.
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    pub target: PathBuf,
    /// Restore only this path of the snapshot; a directory's contents land directly in
    /// `target`, a file lands in `target` under its name.
    pub subpath: Option<Vec<u8>>,
    /// Re-read every restored file and check it against what was written; with
    /// `Overwrite::IfChanged`, also read existing files to decide whether they changed.
    pub verify: bool,
    /// `None` refuses a target that is not empty.
    pub overwrite: Option<Overwrite>,
    /// Restore owners (needs root).
    pub owners: bool,
    /// Glob patterns selecting what to restore (see `restore_filter`); empty: everything.
    pub includes: Vec<String>,
    /// Glob patterns of what not to restore.
    pub excludes: Vec<String>,
    /// Remove entries of the target's restored directories that the snapshot does not
    /// hold and the filters select.
    pub delete: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RestoreStats {
    pub files_restored: u64,
    pub dirs_restored: u64,
    pub others_restored: u64,
    pub hardlinks_restored: u64,
    pub bytes_restored: u64,
    /// Existing files left alone (`--overwrite never`, or not older with `if-newer`).
    pub files_skipped: u64,
    /// Existing entries left alone because they already match the snapshot.
    pub unchanged: u64,
    /// Files, links and directories removed from the target by `delete`.
    pub deleted: u64,
    /// Temporary files of an interrupted restore that were removed.
    pub temp_files_removed: u64,
    /// Sockets are not restored: the program that made one makes it again.
    pub sockets_skipped: u64,
    pub files_verified: u64,
    /// Packs the restore read file contents from, each once, front to back (a pack whose
    /// blobs the walk needs far apart may be read once for each batch of files).
    pub packs_read: u64,
    /// Bytes read from those packs.
    pub bytes_read: u64,
    pub errors: Vec<SourceProblem>,
    pub duration_ms: u64,
}

pub fn restore(
    repo: &Repository,
    snapshot: &Snapshot,
    opts: &RestoreOptions,
    monitor: &dyn Monitor,
) -> Result<RestoreStats> {
    let started = Instant::now();
    let filter = RestoreFilter::new(&opts.includes, &opts.excludes)?;
    let subpath = opts.subpath.as_deref().unwrap_or(b"/");
    let start = browse::find(repo, snapshot, subpath)?;
    // The snapshot path of the start, for path patterns: `/a/b` however it was typed.
    let start_path: Vec<u8> = browse::path_names(subpath)
        .iter()
        .fold(Vec::new(), |p, n| child_path(&p, n));
    match &start {
        Entry::Root(tree) => filter.check_all_match(repo, Some(tree), None)?,
        Entry::Node(node) => filter.check_all_match(repo, None, Some((node, &start_path)))?,
    }
    let existed = prepare_target(&opts.target, opts.overwrite.is_some())?;
    // A remote store answers each read after a round trip: more files in flight there.
    let writers = if repo.storage().is_remote() {
        REMOTE_WRITERS
    } else {
        WRITERS
    };
    // A rendezvous: the walk makes the next batch while the last one is written.
    let (batch_tx, batch_rx) = crossbeam_channel::bounded::<Vec<FileJob>>(0);
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<FileDone>();
    let mut r = Restorer {
        repo,
        opts,
        monitor,
        filter,
        stats: RestoreStats::default(),
        links: HashMap::new(),
        pending: Vec::new(),
        jobs: Some(batch_tx),
        batch: Vec::new(),
        batch_parts: 0,
        batch_limit: restore_packs::FIRST_BATCH_PARTS,
        done: done_rx,
        dirs: Vec::new(),
        in_flight: HashMap::new(),
    };
    let walked = std::thread::scope(|scope| {
        let fill = scope
            .spawn(move || restore_packs::fill(repo, opts, monitor, writers, batch_rx, &done_tx));
        let walked = r.walk(start, existed, &start_path);
        r.send_batch();
        // Closing the queue lets the writers finish the last batch and stop.
        r.jobs = None;
        if let Ok(reads) = fill.join() {
            r.stats.packs_read = reads.packs;
            r.stats.bytes_read = reads.bytes;
        }
        walked
    });
    r.collect_done();
    // Files the writers never reported (a writer thread panicked) were not restored.
    let mut lost: Vec<(PathBuf, PathBuf)> = r.in_flight.drain().collect();
    lost.sort();
    for (tmp, path) in lost {
        let _ = fs::remove_file(&tmp);
        r.problem(&path, &"not restored: a writer thread stopped unexpectedly");
    }
    // Directory times last: writing into a directory changes its mtime.
    for (path, node) in std::mem::take(&mut r.dirs).into_iter().rev() {
        if let Err(e) = fsmeta::apply(&path, &node, opts.owners) {
            r.problem(&path, &format!("metadata not fully restored: {e}"));
        }
    }
    walked?;
    r.stats.duration_ms = started.elapsed().as_millis() as u64;
    Ok(r.stats)
}

/// Threads writing file contents. Reading a blob is a request to the store (tens of
/// milliseconds to an object store) followed by decryption and decompression: several
/// packs at once keep both the network and the cores busy.
const WRITERS: usize = 8;
/// As many as the remote store's limit on concurrent requests.
const REMOTE_WRITERS: usize = 16;

/// Creates the target if needed; returns whether it was there and not empty.
fn prepare_target(target: &Path, may_overwrite: bool) -> Result<bool> {
    match fs::read_dir(target) {
        Ok(mut entries) => {
            let has_entries = entries.next().is_some();
            if has_entries && !may_overwrite {
                return Err(Error::TargetNotEmpty {
                    target: target.to_path_buf(),
                });
            }
            Ok(has_entries)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir_all(target)
            .map(|_| false)
            .map_err(|e| Error::io(target, e)),
        Err(e) => Err(Error::io(target, e)),
    }
}

/// Whether `name` is one of restore's temporary files (`.cairn-restore-` and 16 hex).
fn is_temp_name(name: &[u8]) -> bool {
    name.strip_prefix(b".cairn-restore-")
        .is_some_and(|h| h.len() == 16 && h.iter().all(u8::is_ascii_hexdigit))
}

/// What `Restorer::clear` found at a path.
enum Existing {
    /// Nothing there (any more): write the entry.
    Go,
    /// An entry that already matches the snapshot: keep it.
    Unchanged,
    /// An entry the overwrite mode keeps.
    Keep,
}

/// A directory entered because it may hold selected entries, created on first need.
struct PendingDir {
    path: PathBuf,
    created: bool,
    existed: bool,
}

struct Restorer<'a> {
    repo: &'a Repository,
    opts: &'a RestoreOptions,
    monitor: &'a dyn Monitor,
    filter: RestoreFilter,
    stats: RestoreStats,
    /// (device, inode) at backup time → first restored path, to recreate hard links.
    links: HashMap<(u64, u64), PathBuf>,
    /// Directories above the current entry that only the filter's search entered.
    pending: Vec<PendingDir>,
    /// Batches of files for the writer threads; `None` once the walk is over.
    jobs: Option<crossbeam_channel::Sender<Vec<FileJob>>>,
    /// The batch being gathered, and how many parts its files have.
    batch: Vec<FileJob>,
    batch_parts: usize,
    /// Parts at which the batch is sent.
    batch_limit: usize,
    done: crossbeam_channel::Receiver<FileDone>,
    /// Restored directories in the order they were created, for their metadata at the end.
    dirs: Vec<(PathBuf, Node)>,
    /// Temporary files the writer threads are filling, and the paths they will take.
    in_flight: HashMap<PathBuf, PathBuf>,
}

impl Restorer<'_> {
    /// Restores from `start` into the target.
    fn walk(&mut self, start: Entry, existed: bool, start_path: &[u8]) -> Result<()> {
        let target = self.opts.target.clone();
        match start {
            Entry::Root(tree) => self.restore_tree(&tree, &target, start_path, false, existed)?,
            Entry::Node(Node {
                kind: NodeKind::Dir { subtree },
                ..
            }) => self.restore_tree(&subtree, &target, start_path, false, existed)?,
            Entry::Node(node) => {
                if self.filter.select(start_path, false, false) == Selection::All {
                    let path = target.join(std::ffi::OsStr::from_bytes(&node.name));
                    self.restore_node(&node, &path, start_path, true)?;
                }
            }
        }
        Ok(())
    }

    /// Hands the gathered files to the writer threads.
    fn send_batch(&mut self) {
        let batch = std::mem::take(&mut self.batch);
        self.batch_parts = 0;
        if batch.is_empty() {
            return;
        }
        let unsent = match &self.jobs {
            Some(jobs) => jobs.send(batch).err().map(|e| e.0),
            None => Some(batch),
        };
        for job in unsent.into_iter().flatten() {
            self.in_flight.remove(&job.tmp);
            self.problem(&job.path, &"not restored: the writer threads stopped");
        }
    }

    /// Counts the files the writers finished and reports the ones they could not write.
    fn collect_done(&mut self) {
        while let Ok(FileDone {
            tmp,
            path,
            size,
            outcome,
        }) = self.done.try_recv()
        {
            self.in_flight.remove(&tmp);
            match outcome {
                Ok(verified) => {
                    self.stats.files_restored += 1;
                    self.stats.bytes_restored += size;
                    self.stats.files_verified += u64::from(verified);
                    self.monitor.file_done(&path, size);
                }
                Err(e) => self.problem(&path, &e),
            }
        }
    }

    fn problem(&mut self, path: &Path, error: &dyn std::fmt::Display) {
        self.monitor.problem(path, error);
        self.stats.errors.push(SourceProblem {
            path: path.to_string_lossy().into_owned(),
            error: error.to_string(),
        });
    }

    /// Restores the entries of `tree` into `dir` (snapshot path `snap`); `inside` when
    /// the filter selected `dir` whole, `existed` when `dir` was already there (then it is
    /// cleaned of temporary files and, with `delete`, of what the snapshot lacks).
    fn restore_tree(
        &mut self,
        tree: &BlobId,
        dir: &Path,
        snap: &[u8],
        inside: bool,
        existed: bool,
    ) -> Result<()> {
        let tree = match self.repo.read_tree(tree) {
            Ok(t) => t,
            Err(e) => {
                self.problem(
                    dir,
                    &format!(
                        "directory contents not restored: {}",
                        crate::error::chain(&e)
                    ),
                );
                return Ok(());
            }
        };
        for node in &tree.nodes {
            if !is_safe_name(&node.name) {
                let name = String::from_utf8_lossy(&node.name).into_owned();
                self.problem(
                    dir,
                    &format!("refused unsafe name {name:?} in the snapshot"),
                );
                continue;
            }
            let path = dir.join(std::ffi::OsStr::from_bytes(&node.name));
            let node_snap = child_path(snap, &node.name);
            let is_dir = matches!(node.kind, NodeKind::Dir { .. });
            match self.filter.select(&node_snap, is_dir, inside) {
                Selection::Skip => {}
                Selection::All => self.restore_node(node, &path, &node_snap, true)?,
                Selection::Search => self.restore_node(node, &path, &node_snap, false)?,
            }
        }
        if existed {
            let names: HashSet<&[u8]> = tree.nodes.iter().map(|n| n.name.as_slice()).collect();
            self.clean_dir(dir, snap, inside, &names);
        }
        Ok(())
    }

    /// Removes leftover temporary files from `dir` and, with `delete`, the entries the
    /// snapshot does not hold but the filter selects. Problems are reported, not fatal.
    fn clean_dir(&mut self, dir: &Path, snap: &[u8], inside: bool, names: &HashSet<&[u8]>) {
        let entries = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) => {
                self.problem(dir, &format!("not cleaned up: {e}"));
                return;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    self.problem(dir, &format!("listing incomplete, not cleaned up: {e}"));
                    continue;
                }
            };
            let name = entry.file_name();
            let name = name.as_bytes();
            if names.contains(name) {
                continue;
            }
            let path = entry.path();
            // lstat: a symlink is removed itself, never followed.
            let Ok(md) = fs::symlink_metadata(&path) else {
                continue;
            };
            // A writer thread may still be filling one of this run's own.
            if is_temp_name(name) && md.is_file() && !self.in_flight.contains_key(&path) {
                match fs::remove_file(&path) {
                    Ok(()) => self.stats.temp_files_removed += 1,
                    Err(e) => self.problem(&path, &format!("temporary file not removed: {e}")),
                }
                continue;
            }
            if !self.opts.delete
                || self
                    .filter
                    .select(&child_path(snap, name), md.is_dir(), inside)
                    != Selection::All
            {
                continue;
            }
            let removed = if md.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            match removed {
                Ok(()) => {
                    self.stats.deleted += 1;
                    self.monitor.file_done(&path, 0);
                }
                Err(e) => self.problem(&path, &format!("not deleted: {e}")),
            }
        }
    }

    /// Creates the directories the filter's search entered and that now get an entry.
    fn create_pending(&mut self) -> io::Result<()> {
        for i in 0..self.pending.len() {
            if !self.pending[i].created {
                let path = self.pending[i].path.clone();
                self.pending[i].existed = self.make_dir(&path)?;
                self.pending[i].created = true;
            }
        }
        Ok(())
    }

    /// Restores one node; problems with it are reported and skipped. `selected` is false
    /// for a directory the filter only searches: it is created when something below is.
    fn restore_node(
        &mut self,
        node: &Node,
        path: &Path,
        snap: &[u8],
        selected: bool,
    ) -> Result<()> {
        if self.monitor.cancelled() {
            return Err(Error::Interrupted);
        }
        if let NodeKind::Dir { subtree } = &node.kind {
            if !selected {
                self.pending.push(PendingDir {
                    path: path.to_path_buf(),
                    created: false,
                    existed: false,
                });
                self.restore_tree(subtree, path, snap, false, false)?;
                let Some(dir) = self.pending.pop() else {
                    return Ok(());
                };
                if dir.created {
                    if dir.existed {
                        // Cleaning needs the tree's names; read it again only here.
                        if let Ok(tree) = self.repo.read_tree(subtree) {
                            let names = tree.nodes.iter().map(|n| n.name.as_slice()).collect();
                            self.clean_dir(path, snap, false, &names);
                        }
                    }
                    self.stats.dirs_restored += 1;
                    self.dirs.push((path.to_path_buf(), node.clone()));
                }
                return Ok(());
            }
        }
        if let Err(e) = self.create_pending() {
            let at = self
                .pending
                .last()
                .map(|d| d.path.clone())
                .unwrap_or_default();
            self.problem(&at, &e);
            return Ok(());
        }
        let done = match &node.kind {
            NodeKind::Dir { subtree } => {
                let existed = match self.make_dir(path) {
                    Ok(existed) => existed,
                    Err(e) => {
                        self.problem(path, &e);
                        return Ok(());
                    }
                };
                self.restore_tree(subtree, path, snap, true, existed)?;
                self.stats.dirs_restored += 1;
                self.dirs.push((path.to_path_buf(), node.clone()));
                Ok::<bool, String>(false)
            }
            NodeKind::File { .. } => self.restore_file(node, path),
            NodeKind::Socket => {
                self.stats.sockets_skipped += 1;
                return Ok(());
            }
            _ => self.restore_special(node, path).map_err(|e| e.to_string()),
        };
        match done {
            Ok(true) => {
                if let Err(e) = fsmeta::apply(path, node, self.opts.owners) {
                    self.problem(path, &format!("metadata not fully restored: {e}"));
                }
            }
            Ok(false) => {}
            Err(e) => self.problem(path, &e),
        }
        Ok(())
    }

    /// Decides about an existing `path` under the overwrite mode: `Go` means it may be
    /// written, and it is gone (or was never there) if `remove`. `same` says whether the
    /// existing entry already matches the snapshot, `older` whether it is older than the
    /// snapshot's.
    fn clear(
        &mut self,
        path: &Path,
        remove: bool,
        same: impl Fn(&fs::Metadata) -> io::Result<bool>,
        older: impl Fn(&fs::Metadata) -> bool,
    ) -> io::Result<Existing> {
        let md = match fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Existing::Go),
            Err(e) => return Err(e),
            Ok(md) => md,
        };
        let replace = match self.opts.overwrite {
            None | Some(Overwrite::Never) => false,
            Some(Overwrite::Always) => true,
            Some(Overwrite::IfChanged) => {
                if same(&md)? {
                    self.stats.unchanged += 1;
                    return Ok(Existing::Unchanged);
                }
                true
            }
            Some(Overwrite::IfNewer) => older(&md),
        };
        if !replace {
            self.stats.files_skipped += 1;
            return Ok(Existing::Keep);
        }
        if remove && md.is_dir() {
            fs::remove_dir_all(path)?;
        } else if remove {
            fs::remove_file(path)?;
        }
        Ok(Existing::Go)
    }

    /// Creates a directory, or reuses one; returns whether it was already there.
    fn make_dir(&mut self, path: &Path) -> io::Result<bool> {
        match fs::symlink_metadata(path) {
            // A directory already there is reused; a symlink is never followed.
            Ok(md) if md.is_dir() => Ok(true),
            Ok(_) if !matches!(self.opts.overwrite, None | Some(Overwrite::Never)) => {
                fs::remove_file(path)?;
                fs::create_dir(path).map(|_| false)
            }
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "exists and is not a directory; --overwrite always replaces it",
            )),
            Err(_) => fs::create_dir(path).map(|_| false),
        }
    }

    fn restore_special(&mut self, node: &Node, path: &Path) -> io::Result<bool> {
        let same = |md: &fs::Metadata| -> io::Result<bool> {
            let ft = md.file_type();
            Ok(match &node.kind {
                NodeKind::Symlink { target } => {
                    ft.is_symlink() && fs::read_link(path)?.as_os_str().as_bytes() == target
                }
                NodeKind::Fifo => ft.is_fifo(),
                NodeKind::CharDevice { rdev } => ft.is_char_device() && md.rdev() == *rdev,
                NodeKind::BlockDevice { rdev } => ft.is_block_device() && md.rdev() == *rdev,
                _ => false,
            })
        };
        let older = |md: &fs::Metadata| node.mtime > fsmeta::mtime(md);
        match self.clear(path, true, same, older)? {
            Existing::Go => {}
            Existing::Unchanged => return Ok(true),
            Existing::Keep => return Ok(false),
        }
        match &node.kind {
            NodeKind::Symlink { target } => {
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), path)?
            }
            NodeKind::Fifo => {
                nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600))?
            }
            NodeKind::CharDevice { rdev } | NodeKind::BlockDevice { rdev } => {
                let kind = if matches!(node.kind, NodeKind::CharDevice { .. }) {
                    nix::sys::stat::SFlag::S_IFCHR
                } else {
                    nix::sys::stat::SFlag::S_IFBLK
                };
                nix::sys::stat::mknod(
                    path,
                    kind,
                    nix::sys::stat::Mode::from_bits_truncate(0o600),
                    *rdev,
                )?
            }
            _ => unreachable!("restore_special handles links, FIFOs and devices"),
        }
        self.stats.others_restored += 1;
        Ok(true)
    }

    /// Whether the regular file at `path` holds what the snapshot's `node` does: same
    /// size and mtime, and with `verify` the same chunk ids when cut and hashed with this
    /// repository's chunker and key — or, for a file that points into parts of blobs
    /// (small files bundled together), the same bytes as those parts.
    fn file_matches(&self, node: &Node, md: &fs::Metadata, path: &Path) -> io::Result<bool> {
        let NodeKind::File { size, content } = &node.kind else {
            return Ok(false);
        };
        if !md.is_file() || md.len() != *size || fsmeta::mtime(md) != node.mtime {
            return Ok(false);
        }
        if !self.opts.verify {
            return Ok(true);
        }
        let (params, seed) = match self.repo.chunker_params() {
            Ok(p) => (p, self.repo.key().chunker_gear()),
            Err(e) => return Err(io::Error::other(crate::error::chain(&e))),
        };
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        if !browse::whole_blobs(self.repo, content) {
            return self.same_bytes(file, content);
        }
        let mut chunker = cairn_chunker::Chunker::new(file, params, seed);
        let mut expected = content.iter();
        while let Some(chunk) = chunker.next_chunk()? {
            let id = self.repo.key().blob_id(chunk.data);
            match expected.next() {
                Some(c) if c.offset == 0 && c.len as usize == chunk.data.len() && c.blob == id => {}
                _ => return Ok(false),
            }
        }
        Ok(expected.next().is_none())
    }

    /// Whether `file` holds exactly the bytes `content` refers to.
    fn same_bytes(&self, mut file: File, content: &[crate::tree::ContentRef]) -> io::Result<bool> {
        let mut mine = Vec::new();
        for c in content {
            let blob = self
                .repo
                .read_blob_shared(&c.blob)
                .map_err(|e| io::Error::other(crate::error::chain(&e)))?;
            let Some(theirs) = blob.get(c.offset as usize..(c.offset + c.len) as usize) else {
                return Ok(false);
            };
            mine.clear();
            (&mut file).take(u64::from(c.len)).read_to_end(&mut mine)?;
            if mine != theirs {
                return Ok(false);
            }
        }
        Ok(file.read(&mut [0u8; 1])? == 0)
    }

    fn restore_file(&mut self, node: &Node, path: &Path) -> Result<bool, String> {
        let NodeKind::File { size, .. } = &node.kind else {
            unreachable!("restore_file takes files")
        };
        let older = |md: &fs::Metadata| node.mtime > fsmeta::mtime(md);
        if node.links > 1 {
            if let Some(first) = self.links.get(&(node.device, node.inode)).cloned() {
                let same = |md: &fs::Metadata| -> io::Result<bool> {
                    let f = fs::symlink_metadata(&first)?;
                    Ok((md.dev(), md.ino()) == (f.dev(), f.ino()))
                };
                match self
                    .clear(path, true, same, older)
                    .map_err(|e| e.to_string())?
                {
                    Existing::Go => {}
                    Existing::Unchanged | Existing::Keep => return Ok(false),
                }
                fs::hard_link(&first, path).map_err(|e| e.to_string())?;
                self.stats.hardlinks_restored += 1;
                return Ok(false);
            }
        }
        let same = |md: &fs::Metadata| self.file_matches(node, md, path);
        // `clear` needs `&mut self`; decide with a shared borrow first.
        let existing = match fs::symlink_metadata(path) {
            Ok(md) if self.opts.overwrite == Some(Overwrite::IfChanged) => {
                Some(same(&md).map_err(|e| format!("cannot compare with the snapshot: {e}"))?)
            }
            _ => None,
        };
        let decision = self
            .clear(path, false, |_| Ok(existing == Some(true)), older)
            .map_err(|e| e.to_string())?;
        match decision {
            Existing::Go => {}
            Existing::Unchanged => {
                if node.links > 1 {
                    self.links
                        .insert((node.device, node.inode), path.to_path_buf());
                }
                // Metadata such as the mode may still differ; the caller applies it.
                return Ok(true);
            }
            Existing::Keep => return Ok(false),
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let tmp = dir.join(format!(".cairn-restore-{:016x}", rand::random::<u64>()));
        let job = FileJob {
            node: node.clone(),
            tmp,
            path: path.to_path_buf(),
        };
        self.collect_done();
        if node.links <= 1 {
            self.in_flight.insert(job.tmp.clone(), job.path.clone());
            self.batch_parts += match &node.kind {
                NodeKind::File { content, .. } => content.len().max(1),
                _ => 1,
            };
            self.batch.push(job);
            if self.batch_parts >= self.batch_limit {
                // Small batches first, so that writing starts as the walk does.
                self.batch_limit = (self.batch_limit * 2).min(restore_packs::BATCH_PARTS);
                self.send_batch();
            }
            return Ok(false);
        }
        // A file with hard links is written here, so that its links can be made at once.
        let verified = restore_packs::place_alone(self.repo, self.opts, self.monitor, &job)?;
        if node.links > 1 {
            self.links
                .insert((node.device, node.inode), path.to_path_buf());
        }
        self.stats.files_restored += 1;
        self.stats.bytes_restored += size;
        self.stats.files_verified += u64::from(verified);
        self.monitor.file_done(path, *size);
        // Metadata was applied to the temporary file before the rename.
        Ok(false)
    }
}

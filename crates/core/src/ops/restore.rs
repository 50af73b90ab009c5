//! `restore`: recreate a snapshot (or part of one) below a target directory, with contents
//! and metadata. Two promises: nothing is written outside the target, whatever names the
//! snapshot holds and whatever other users do to the target while it runs; and no
//! restored file ever holds wrong bytes (each file is written under a temporary name from
//! verified blobs, its mtime set last, and renamed into place only when complete).
//!
//! The first promise rests on `ops::restore_target`: the walk holds each directory open
//! and makes every entry relative to its parent's descriptor, never through a path
//! string, so a directory swapped for a symlink during the restore is not followed.
//!
//! Into an existing target, `Overwrite::IfChanged` makes a restore resumable: a file whose
//! size and mtime already match the snapshot (and, with `verify`, whose contents cut and
//! hash to the snapshot's chunk ids) is left as it is, and the temporary files an
//! interrupted run left behind are removed. `delete` removes what the selection does not
//! hold, never following a symlink (directories are opened with `O_NOFOLLOW` and emptied
//! through their own descriptors).

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rustix::fs::FileType;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::fsmeta::{self, ApplyOptions};
use crate::id::BlobId;
use crate::monitor::Monitor;
use crate::ops::backup::SourceProblem;
use crate::ops::browse::{self, Entry};
use crate::ops::restore_filter::{child_path, RestoreFilter, Selection};
use crate::ops::restore_packs::{self, FileDone, FileJob, TempName};
use crate::ops::restore_target::{effective_ids, Dir};
use crate::repo::Repository;
use crate::snapshot::Snapshot;
use crate::tree::{is_safe_name, Node, NodeKind, Time};

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
    /// Re-read every restored file and check it against what was written, and hash
    /// every blob against its id even where its seal proves it
    /// (`MasterKey::seal_binds_blob_id`); with `Overwrite::IfChanged`, also read existing
    /// files to decide whether they changed.
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
    /// With `delete`, also into a target that shares no name with what is restored.
    pub force: bool,
    /// Make no FIFOs or device nodes (sockets are never made); each one left out is
    /// listed in `RestoreStats::specials_skipped`.
    pub no_special_files: bool,
    /// Clear the setuid and setgid bits of everything but directories (where setgid
    /// only passes the group on); each file changed so is listed in
    /// `RestoreStats::setuid_cleared`.
    pub no_setuid: bool,
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
    /// Their paths.
    pub deleted_paths: Vec<String>,
    /// Temporary files of an interrupted restore that were removed.
    pub temp_files_removed: u64,
    /// Sockets are not restored: the program that made one makes it again.
    pub sockets_skipped: u64,
    /// Sockets, and with `no_special_files` FIFOs and device nodes, not made: each path
    /// and its kind.
    pub specials_skipped: Vec<SkippedEntry>,
    /// Files restored without the setuid/setgid bits the snapshot gives them
    /// (`no_setuid`).
    pub setuid_cleared: Vec<String>,
    /// Things the user should know that did not stop the restore (root restoring into a
    /// tree that another user owns).
    pub warnings: Vec<String>,
    pub files_verified: u64,
    /// Packs the restore read file contents from, each once, front to back (a pack whose
    /// blobs the walk needs far apart may be read once for each batch of files).
    pub packs_read: u64,
    /// Bytes read from those packs.
    pub bytes_read: u64,
    pub errors: Vec<SourceProblem>,
    /// The restore was cancelled (`Monitor::cancelled`) before it was done: what it
    /// wrote is complete, and a run with `Overwrite::IfChanged` finishes it.
    pub interrupted: bool,
    pub duration_ms: u64,
}

/// An entry of the snapshot that restore did not make, and what kind it is.
#[derive(Debug, Clone, Serialize)]
pub struct SkippedEntry {
    pub path: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
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
    check_target(repo, &start, opts)?;
    let (target, existed) = prepare_target(&opts.target, opts.overwrite.is_some())?;
    let target = Arc::new(target);
    raise_open_files_limit();
    // A remote store answers each read after a round trip: more files in flight there.
    let writers = if repo.storage().is_remote() {
        REMOTE_WRITERS
    } else {
        local_writers()
    };
    // A rendezvous: the walk makes the next batch while the last ones are written.
    let (batch_tx, batch_rx) = crossbeam_channel::bounded::<Vec<FileJob>>(0);
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<FileDone>();
    let euid = effective_ids().0;
    let mut r = Restorer {
        repo,
        opts,
        monitor,
        filter,
        stats: RestoreStats::default(),
        target: target.clone(),
        euid,
        umask: process_umask(),
        links: HashMap::new(),
        waiting: HashMap::new(),
        pending: Vec::new(),
        jobs: Some(batch_tx),
        batch: Vec::new(),
        batch_parts: 0,
        batch_limit: restore_packs::FIRST_BATCH_PARTS,
        done: done_rx,
        dirs: Vec::new(),
        in_flight: HashMap::new(),
    };
    r.check_target_link();
    r.check_owner(&target);
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
            r.warn_other_copies(&reads);
        }
        walked
    });
    r.collect_done();
    // Files the writers never reported (a writer thread panicked) were not restored.
    let mut lost: Vec<(TempName, InFlight)> = r.in_flight.drain().collect();
    lost.sort_by(|a, b| a.1.path.cmp(&b.1.path));
    for (tmp, f) in lost {
        let _ = f.dir.remove_file(&tmp.name());
        let error = "not restored: a writer thread stopped unexpectedly";
        r.problem(&f.path, &error);
        r.link_later_names(tmp, Err(error));
    }
    // Directory metadata last, deepest first: writing into a directory changes its mtime,
    // and a directory's final mode may keep restore itself out.
    for d in std::mem::take(&mut r.dirs).into_iter().rev() {
        if let Err(e) = r.apply_dir(&d) {
            r.problem(&d.path, &format!("metadata not fully restored: {e}"));
        }
    }
    match walked {
        Err(Error::Interrupted) => r.stats.interrupted = true,
        walked => walked?,
    }
    // Cancelled after the walk: the writers may have left the last files unfinished.
    r.stats.interrupted |= monitor.cancelled();
    r.stats.duration_ms = started.elapsed().as_millis() as u64;
    Ok(r.stats)
}

/// Refuses a target that is not empty without an overwrite mode, and with `delete`
/// (unless `force`) one that shares no name with what `start` restores into it: a
/// mistyped `--target` would otherwise be emptied without a word. A look by path, before
/// anything is written; `prepare_target` checks emptiness again on the opened directory.
pub(crate) fn check_target(repo: &Repository, start: &Entry, opts: &RestoreOptions) -> Result<()> {
    let target = &opts.target;
    let mut present = Vec::new();
    match std::fs::read_dir(target) {
        Ok(entries) => {
            for e in entries {
                present.push(e.map_err(|e| Error::io(target, e))?.file_name());
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(target, e)),
    }
    if present.is_empty() {
        return Ok(());
    }
    if opts.overwrite.is_none() {
        return Err(Error::TargetNotEmpty {
            target: target.clone(),
        });
    }
    if !opts.delete || opts.force {
        return Ok(());
    }
    let names: HashSet<Vec<u8>> = match start {
        Entry::Root(tree) => repo
            .read_tree(tree)?
            .nodes
            .into_iter()
            .map(|n| n.name)
            .collect(),
        Entry::Node(Node {
            kind: NodeKind::Dir { subtree },
            ..
        }) => repo
            .read_tree(subtree)?
            .nodes
            .into_iter()
            .map(|n| n.name)
            .collect(),
        Entry::Node(node) => HashSet::from([node.name.clone()]),
    };
    if present.iter().any(|n| names.contains(n.as_bytes())) {
        Ok(())
    } else {
        Err(Error::TargetUnrelated {
            target: target.clone(),
        })
    }
}

/// Threads writing file contents from a local repository: two a core, so that one waits
/// on the disk while the other decompresses, and at most eight. On 2 cores, four
/// restored the Linux tree as fast as eight (2.86-3.42 s against 2.91-3.49 s) and the
/// mixed corpus too (1.09-1.20 s against 1.11-1.59 s), at a peak RSS of 72 MiB against
/// 89-96 on the first and 44-50 against 72 on the second: each thread keeps its buffers.
fn local_writers() -> usize {
    let cores = crate::cores().map_or(4, |n| n.get());
    (2 * cores).clamp(4, 8)
}

/// Threads writing file contents from a remote repository, as many as its limit on
/// concurrent requests: reading a blob is a round trip (tens of milliseconds to an object
/// store) followed by decryption and decompression.
const REMOTE_WRITERS: usize = 16;

/// Opens the target, creating it if needed; returns it and whether it was there and not
/// empty. A target this restore made counts as fresh: nothing in it needs a look first.
fn prepare_target(target: &Path, may_overwrite: bool) -> Result<(Dir, bool)> {
    let was_there = std::fs::symlink_metadata(target).is_ok();
    let mut dir = Dir::open_target(target).map_err(|e| Error::io(target, e))?;
    let has_entries = dir.has_entries().map_err(|e| Error::io(target, e))?;
    if has_entries && !may_overwrite {
        return Err(Error::TargetNotEmpty {
            target: target.to_path_buf(),
        });
    }
    dir.fresh = !was_there && !has_entries && dir.uid == effective_ids().0;
    Ok((dir, has_entries))
}

/// The walk holds every directory from the target down to the current one open, and
/// each batch of files in flight holds its files' directories: on a deep tree with
/// small directories that can pass the usual soft limit of 1,024 descriptors. Raise it
/// to the hard limit, as Go and many servers do at start; failing that, restore goes on
/// with what it has (an open that fails is reported like any other problem).
fn raise_open_files_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
}

/// The process's umask, from /proc (reading it with `umask(2)` would change it for a
/// moment under the other threads' feet); `None` if unknown.
fn process_umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(line.trim(), 8).ok()
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

/// An entry found in the target, as `lstat` describes it.
struct Found {
    kind: FileType,
    size: u64,
    mtime: Time,
    rdev: u64,
    dev: u64,
    ino: u64,
    uid: u32,
    nlink: u64,
}

impl From<rustix::fs::Stat> for Found {
    fn from(st: rustix::fs::Stat) -> Found {
        Found {
            kind: FileType::from_raw_mode(st.st_mode),
            size: st.st_size as u64,
            mtime: Time {
                sec: st.st_mtime,
                nsec: st.st_mtime_nsec.clamp(0, 999_999_999) as u32,
            },
            rdev: st.st_rdev,
            dev: st.st_dev,
            ino: st.st_ino,
            uid: st.st_uid,
            // Narrower than 64 bits on some targets.
            #[allow(clippy::useless_conversion)]
            nlink: st.st_nlink.into(),
        }
    }
}

/// A directory entered because it may hold selected entries, created on first need.
struct PendingDir {
    /// The directory it goes in; `None`: the pending directory below it in the stack.
    parent: Option<Arc<Dir>>,
    name: OsString,
    path: PathBuf,
    /// Once created (or found).
    dir: Option<Arc<Dir>>,
    existed: bool,
}

/// A restored directory, for its metadata at the end: opened again beneath the target
/// by `rel`, and only if it is still the directory restore made or entered.
struct DirMeta {
    rel: PathBuf,
    path: PathBuf,
    dev: u64,
    ino: u64,
    node: Node,
}

/// A file the writer threads are filling: the directory of its temporary file, and
/// where it goes.
struct InFlight {
    dir: Arc<Dir>,
    path: PathBuf,
}

/// The first restored name of a file with hard links, which later names link to.
#[derive(Clone)]
struct FirstLink {
    /// Its directory, relative to the target.
    rel_dir: PathBuf,
    name: OsString,
}

/// A file with hard links, found by its (device, inode) at backup time.
enum Linked {
    /// In place under this name (restored, or found unchanged): later names link to it.
    Placed(FirstLink),
    /// Being written by the writer threads as this temporary file, like any other file:
    /// later names wait in `Restorer::waiting` until it has its name.
    Writing(TempName),
}

/// The later names of a file being written, made once it is in place.
struct Waiting {
    key: (u64, u64),
    first: FirstLink,
    /// The first name's path, for messages.
    first_path: PathBuf,
    later: Vec<LaterLink>,
}

/// A later name of a file with hard links, to make in `parent`.
struct LaterLink {
    parent: Arc<Dir>,
    name: OsString,
    path: PathBuf,
    mtime: Time,
}

struct Restorer<'a> {
    repo: &'a Repository,
    opts: &'a RestoreOptions,
    monitor: &'a dyn Monitor,
    filter: RestoreFilter,
    stats: RestoreStats,
    target: Arc<Dir>,
    euid: u32,
    umask: Option<u32>,
    /// (device, inode) at backup time → its first name, to recreate hard links.
    links: HashMap<(u64, u64), Linked>,
    /// Files with hard links being written (by temporary name), and their later names.
    waiting: HashMap<TempName, Waiting>,
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
    dirs: Vec<DirMeta>,
    /// Temporary files the writer threads are filling (by temporary name): their
    /// directory and the path they will take.
    in_flight: HashMap<TempName, InFlight>,
}

impl Restorer<'_> {
    /// Restores from `start` into the target.
    fn walk(&mut self, start: Entry, existed: bool, start_path: &[u8]) -> Result<()> {
        let target = self.target.clone();
        match start {
            Entry::Root(tree)
            | Entry::Node(Node {
                kind: NodeKind::Dir { subtree: tree },
                ..
            }) => self.restore_tree(
                &tree,
                Some(&target),
                &target.path,
                start_path,
                false,
                existed,
            )?,
            Entry::Node(node) => {
                if self.filter.select(start_path, false, false) == Selection::All {
                    let path = target.join(OsStr::from_bytes(&node.name));
                    self.restore_node(&node, Some(&target), &path, start_path, true)?;
                }
            }
        }
        Ok(())
    }

    /// Warns when root restores through a target that is another user's symlink: its own
    /// name is followed, so that user chose where the restore writes.
    fn check_target_link(&mut self) {
        if let Ok(md) = std::fs::symlink_metadata(&self.opts.target) {
            use std::os::unix::fs::MetadataExt;
            if self.euid == 0 && md.file_type().is_symlink() && md.uid() != 0 {
                let to = std::fs::read_link(&self.opts.target).unwrap_or_default();
                self.stats.warnings.push(format!(
                    "restoring as root through {}, a symlink that user id {} owns (to {}): \
                     that user chose where this restore writes; give the directory itself as \
                     the target",
                    self.opts.target.display(),
                    md.uid(),
                    to.display()
                ));
            }
        }
    }

    /// Says so when blobs came from another copy than the index's: what was restored is
    /// right, but the copy prune keeps is missing or damaged.
    fn warn_other_copies(&mut self, reads: &restore_packs::PackReads) {
        if reads.elsewhere == 0 {
            return;
        }
        let packs: Vec<String> = reads.failed_packs.iter().map(|p| p.to_string()).collect();
        self.stats.warnings.push(format!(
            "{} blobs were read from another copy: their copy in pack {} is missing or \
             damaged; what was restored is whole. Run `cairn check --read-data` to see what \
             is damaged and what mends it",
            reads.elsewhere,
            packs.join(", pack ")
        ));
    }

    /// Warns (once) when root works in a directory that another user owns: that user
    /// can race the restore. Nothing escapes the target whatever they do, but what lands
    /// inside it is theirs to move around.
    fn check_owner(&mut self, dir: &Dir) {
        if self.euid == 0 && dir.uid != 0 && self.stats.warnings.is_empty() {
            self.stats.warnings.push(format!(
                "restoring as root into {}, which user id {} owns: that user can move \
                 restored files around while the restore runs (nothing is written outside \
                 the target); consider --no-setuid and --no-special-files, or restoring into \
                 a directory only root can write and moving the result",
                dir.path.display(),
                dir.uid
            ));
        }
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
                    self.link_later_names(tmp, Ok(()));
                }
                Err(e) => {
                    self.problem(&path, &e);
                    self.link_later_names(tmp, Err(&e));
                }
            }
        }
    }

    /// Makes the later names of file `tmp`, if it has hard links, now that it is in place
    /// (`Ok`); if it failed, its later names are reported as not restored, and a name met
    /// after this is restored as a file of its own.
    fn link_later_names(&mut self, tmp: TempName, placed: std::result::Result<(), &str>) {
        let Some(w) = self.waiting.remove(&tmp) else {
            return;
        };
        match placed {
            Ok(()) => {
                for later in w.later {
                    let older = |found: &Found| later.mtime > found.mtime;
                    if let Err(e) = self.restore_link(&w.first, &later.parent, &later.name, older) {
                        self.problem(&later.path, &e);
                    }
                }
                self.links.insert(w.key, Linked::Placed(w.first));
            }
            Err(e) => {
                self.links.remove(&w.key);
                for later in w.later {
                    // A stopped restore is reported once, as the interruption.
                    let error = if e == restore_packs::INTERRUPTED {
                        e.to_string()
                    } else {
                        format!(
                            "not restored: a hard link to {}, which was not restored",
                            w.first_path.display()
                        )
                    };
                    self.problem(&later.path, &error);
                }
            }
        }
    }

    fn problem(&mut self, path: &Path, error: &dyn std::fmt::Display) {
        // Files the user's stop left unfinished are reported once, as the interruption.
        if self.monitor.cancelled() && error.to_string() == restore_packs::INTERRUPTED {
            return;
        }
        self.monitor.problem(path, error);
        self.stats.errors.push(SourceProblem {
            path: path.to_string_lossy().into_owned(),
            error: error.to_string(),
        });
    }

    /// The mode to give `node`: its own, without setuid and setgid bits with
    /// `no_setuid` (directories keep theirs: setgid there only passes the group on). A
    /// file whose capabilities `no_setuid` leaves out is listed with them.
    fn mode_of(&mut self, node: &Node, path: &Path) -> u32 {
        let mode = node.mode & 0o7777;
        if !self.opts.no_setuid
            || matches!(node.kind, NodeKind::Dir { .. } | NodeKind::Symlink { .. })
        {
            return mode;
        }
        let capabilities = node
            .xattrs
            .iter()
            .any(|x| x.name == fsmeta::CAPABILITY_XATTR);
        if mode & 0o6000 != 0 || capabilities {
            self.stats
                .setuid_cleared
                .push(path.to_string_lossy().into_owned());
        }
        mode & !0o6000
    }

    /// Applies a restored directory's metadata through a descriptor opened beneath the
    /// target, if it is still the directory that was restored.
    fn apply_dir(&mut self, d: &DirMeta) -> io::Result<()> {
        let fd = self
            .target
            .reopen_below(&d.rel)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP | libc::ENOTDIR | libc::EXDEV) => io::Error::other(format!(
                    "it, or a directory above it, was replaced by a symlink or file during the \
                     restore ({e}); nothing was changed through it"
                )),
                _ => e,
            })?;
        let st = rustix::fs::fstat(&fd)?;
        if (st.st_dev, st.st_ino) != (d.dev, d.ino) {
            return Err(io::Error::other(
                "was replaced by another directory during the restore",
            ));
        }
        let mode = self.mode_of(&d.node, &d.path);
        fsmeta::apply_to_fd(
            fd.as_fd(),
            &d.node,
            ApplyOptions {
                owners: self.opts.owners,
                mode: Some(mode),
                owner: None,
                no_capabilities: self.opts.no_setuid,
                inode: None,
            },
        )
    }

    /// Restores the entries of `tree` into `dir` (at `path`, snapshot path `snap`);
    /// `dir` is `None` while it is a pending directory not created yet. `inside` when
    /// the filter selected `dir` whole, `existed` when `dir` was already there (then it is
    /// cleaned of temporary files and, with `delete`, of what the snapshot lacks).
    fn restore_tree(
        &mut self,
        tree: &BlobId,
        dir: Option<&Arc<Dir>>,
        path: &Path,
        snap: &[u8],
        inside: bool,
        existed: bool,
    ) -> Result<()> {
        let tree = match self.repo.read_tree(tree) {
            Ok(t) => t,
            Err(e) => {
                self.problem(
                    path,
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
                    path,
                    &format!("refused unsafe name {name:?} in the snapshot"),
                );
                continue;
            }
            let node_path = path.join(OsStr::from_bytes(&node.name));
            let node_snap = child_path(snap, &node.name);
            let is_dir = matches!(node.kind, NodeKind::Dir { .. });
            match self.filter.select(&node_snap, is_dir, inside) {
                Selection::Skip => {}
                Selection::All => self.restore_node(node, dir, &node_path, &node_snap, true)?,
                Selection::Search => self.restore_node(node, dir, &node_path, &node_snap, false)?,
            }
        }
        if existed {
            if let Some(dir) = dir {
                let names: HashSet<&[u8]> = tree.nodes.iter().map(|n| n.name.as_slice()).collect();
                self.clean_dir(dir, snap, inside, &names);
            }
        }
        Ok(())
    }

    /// Removes leftover temporary files from `dir` and, with `delete`, the entries the
    /// snapshot does not hold but the filter selects. Problems are reported, not fatal.
    fn clean_dir(&mut self, dir: &Dir, snap: &[u8], inside: bool, names: &HashSet<&[u8]>) {
        let entries = match dir.entries() {
            Ok(entries) => entries,
            Err(e) => {
                self.problem(&dir.path, &format!("not cleaned up: {e}"));
                return;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    self.problem(
                        &dir.path,
                        &format!("listing incomplete, not cleaned up: {e}"),
                    );
                    continue;
                }
            };
            let name = entry.name.as_bytes();
            if names.contains(name) {
                continue;
            }
            let path = dir.join(&entry.name);
            // The listing's type where the file system gives one, else lstat: a symlink
            // is removed itself, never followed.
            let kind = match entry.kind {
                FileType::Unknown => match dir.stat(&entry.name) {
                    Ok(Some(st)) => FileType::from_raw_mode(st.st_mode),
                    _ => continue,
                },
                kind => kind,
            };
            // A writer thread may still be filling one of this run's own.
            if let Some(tmp) = TempName::parse(name).filter(|_| kind == FileType::RegularFile) {
                if self
                    .in_flight
                    .get(&tmp)
                    .is_some_and(|f| f.dir.path == dir.path)
                {
                    continue;
                }
                match dir.remove_file(&entry.name) {
                    Ok(()) => self.stats.temp_files_removed += 1,
                    Err(e) => self.problem(&path, &format!("temporary file not removed: {e}")),
                }
                continue;
            }
            let is_dir = kind == FileType::Directory;
            if !self.opts.delete
                || self.filter.select(&child_path(snap, name), is_dir, inside) != Selection::All
            {
                continue;
            }
            match dir.remove_all(&entry.name) {
                Ok(()) => {
                    self.stats.deleted += 1;
                    self.stats
                        .deleted_paths
                        .push(path.to_string_lossy().into_owned());
                    self.monitor.file_done(&path, 0);
                }
                Err(e) => self.problem(&path, &format!("not deleted: {e}")),
            }
        }
    }

    /// Creates the directories the filter's search entered and that now get an entry.
    fn create_pending(&mut self) -> io::Result<()> {
        for i in 0..self.pending.len() {
            if self.pending[i].dir.is_some() {
                continue;
            }
            let parent = match &self.pending[i].parent {
                Some(parent) => parent.clone(),
                None => match i.checked_sub(1).and_then(|j| self.pending[j].dir.clone()) {
                    Some(parent) => parent,
                    None => return Err(io::Error::other("parent directory not created")),
                },
            };
            let name = self.pending[i].name.clone();
            let (dir, existed) = self.make_dir(&parent, &name)?;
            self.pending[i].dir = Some(Arc::new(dir));
            self.pending[i].existed = existed;
        }
        Ok(())
    }

    /// Restores one node into `parent` (`None`: the innermost pending directory);
    /// problems with it are reported and skipped. `selected` is false for a directory the
    /// filter only searches: it is created when something below is.
    fn restore_node(
        &mut self,
        node: &Node,
        parent: Option<&Arc<Dir>>,
        path: &Path,
        snap: &[u8],
        selected: bool,
    ) -> Result<()> {
        if self.monitor.cancelled() {
            return Err(Error::Interrupted);
        }
        let name = OsStr::from_bytes(&node.name);
        if let NodeKind::Dir { subtree } = &node.kind {
            if !selected {
                self.pending.push(PendingDir {
                    parent: parent.cloned(),
                    name: name.to_os_string(),
                    path: path.to_path_buf(),
                    dir: None,
                    existed: false,
                });
                self.restore_tree(subtree, None, path, snap, false, false)?;
                let Some(pending) = self.pending.pop() else {
                    return Ok(());
                };
                if let Some(dir) = pending.dir {
                    if pending.existed {
                        // Cleaning needs the tree's names; read it again only here.
                        if let Ok(tree) = self.repo.read_tree(subtree) {
                            let names = tree.nodes.iter().map(|n| n.name.as_slice()).collect();
                            self.clean_dir(&dir, snap, false, &names);
                        }
                    }
                    self.stats.dirs_restored += 1;
                    self.dirs.push(DirMeta {
                        rel: dir.rel.clone(),
                        path: path.to_path_buf(),
                        dev: dir.dev,
                        ino: dir.ino,
                        node: node.clone(),
                    });
                }
                return Ok(());
            }
        }
        if let Err(e) = self.create_pending() {
            let at = self
                .pending
                .iter()
                .find(|d| d.dir.is_none())
                .map(|d| d.path.clone())
                .unwrap_or_default();
            self.problem(&at, &e);
            return Ok(());
        }
        let parent = match parent
            .cloned()
            .or_else(|| self.pending.last().and_then(|d| d.dir.clone()))
        {
            Some(parent) => parent,
            None => {
                self.problem(path, &"not restored: its directory could not be made");
                return Ok(());
            }
        };
        let done = match &node.kind {
            NodeKind::Dir { subtree } => {
                let (dir, existed) = match self.make_dir(&parent, name) {
                    Ok(made) => made,
                    Err(e) => {
                        self.problem(path, &e);
                        return Ok(());
                    }
                };
                let dir = Arc::new(dir);
                self.restore_tree(subtree, Some(&dir), path, snap, true, existed)?;
                self.stats.dirs_restored += 1;
                self.dirs.push(DirMeta {
                    rel: dir.rel.clone(),
                    path: path.to_path_buf(),
                    dev: dir.dev,
                    ino: dir.ino,
                    node: node.clone(),
                });
                Ok::<bool, String>(false)
            }
            NodeKind::File { .. } => self.restore_file(node, &parent, name, path),
            NodeKind::Socket => {
                self.stats.sockets_skipped += 1;
                self.skip_special(path, "socket");
                return Ok(());
            }
            NodeKind::Fifo if self.opts.no_special_files => {
                self.skip_special(path, "fifo");
                return Ok(());
            }
            NodeKind::CharDevice { .. } if self.opts.no_special_files => {
                self.skip_special(path, "character device");
                return Ok(());
            }
            NodeKind::BlockDevice { .. } if self.opts.no_special_files => {
                self.skip_special(path, "block device");
                return Ok(());
            }
            _ => self
                .restore_special(node, &parent, name)
                .map_err(|e| special_error(node, &e)),
        };
        match done {
            Ok(true) => {
                let mode = self.mode_of(node, path);
                let opts = ApplyOptions {
                    owners: self.opts.owners,
                    mode: Some(mode),
                    owner: None,
                    no_capabilities: self.opts.no_setuid,
                    inode: None,
                };
                if let Err(e) = fsmeta::apply_beneath(parent.as_fd(), name, node, opts) {
                    self.problem(path, &format!("metadata not fully restored: {e}"));
                }
            }
            Ok(false) => {}
            Err(e) => self.problem(path, &e),
        }
        Ok(())
    }

    fn skip_special(&mut self, path: &Path, kind: &'static str) {
        self.stats.specials_skipped.push(SkippedEntry {
            path: path.to_string_lossy().into_owned(),
            kind,
        });
    }

    /// Decides about an existing entry under the overwrite mode: `Go` means it is to be
    /// replaced. `same` says whether it already matches the snapshot, `older` whether it
    /// is older than the snapshot's.
    fn decide(
        &mut self,
        found: &Found,
        same: impl FnOnce(&Found) -> io::Result<bool>,
        older: impl FnOnce(&Found) -> bool,
    ) -> io::Result<Existing> {
        let replace = match self.opts.overwrite {
            None | Some(Overwrite::Never) => false,
            Some(Overwrite::Always) => true,
            Some(Overwrite::IfChanged) => {
                if same(found)? {
                    self.stats.unchanged += 1;
                    return Ok(Existing::Unchanged);
                }
                true
            }
            Some(Overwrite::IfNewer) => older(found),
        };
        if !replace {
            self.stats.files_skipped += 1;
            return Ok(Existing::Keep);
        }
        Ok(Existing::Go)
    }

    /// As [`Restorer::decide`] for entry `name` of `parent`, which is removed when it is
    /// to be replaced (`Go`: nothing is there any more).
    fn clear(
        &mut self,
        parent: &Dir,
        name: &OsStr,
        same: impl FnOnce(&Found) -> io::Result<bool>,
        older: impl FnOnce(&Found) -> bool,
    ) -> io::Result<Existing> {
        if parent.fresh {
            return Ok(Existing::Go);
        }
        let Some(found) = parent.stat(name)?.map(Found::from) else {
            return Ok(Existing::Go);
        };
        let decision = self.decide(&found, same, older)?;
        if let Existing::Go = decision {
            parent.remove_all(name)?;
        }
        Ok(decision)
    }

    /// Creates directory `name` in `parent`, or reuses the one there; returns it and
    /// whether it was already there.
    fn make_dir(&mut self, parent: &Dir, name: &OsStr) -> io::Result<(Dir, bool)> {
        let (dir, existed) = match parent.make_dir(name) {
            Ok(made) => made,
            Err(e)
                if e.kind() == io::ErrorKind::AlreadyExists
                    && !matches!(self.opts.overwrite, None | Some(Overwrite::Never)) =>
            {
                parent.remove_file(name)?;
                parent.make_dir(name)?
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "exists and is not a directory; --overwrite always replaces it",
                ))
            }
            Err(e) => return Err(e),
        };
        if existed {
            self.check_owner(&dir);
        }
        Ok((dir, existed))
    }

    fn restore_special(&mut self, node: &Node, parent: &Dir, name: &OsStr) -> io::Result<bool> {
        let same = |found: &Found| -> io::Result<bool> {
            Ok(match &node.kind {
                NodeKind::Symlink { target } => {
                    found.kind == FileType::Symlink && parent.read_link(name)? == *target
                }
                NodeKind::Fifo => found.kind == FileType::Fifo,
                NodeKind::CharDevice { rdev } => {
                    found.kind == FileType::CharacterDevice && found.rdev == *rdev
                }
                NodeKind::BlockDevice { rdev } => {
                    found.kind == FileType::BlockDevice && found.rdev == *rdev
                }
                _ => false,
            })
        };
        let older = |found: &Found| node.mtime > found.mtime;
        match self.clear(parent, name, same, older)? {
            Existing::Go => {}
            Existing::Unchanged => return Ok(true),
            Existing::Keep => return Ok(false),
        }
        match &node.kind {
            NodeKind::Symlink { target } => parent.symlink(target, name)?,
            NodeKind::Fifo => parent.mknod(name, FileType::Fifo, 0)?,
            NodeKind::CharDevice { rdev } => {
                parent.mknod(name, FileType::CharacterDevice, *rdev)?
            }
            NodeKind::BlockDevice { rdev } => parent.mknod(name, FileType::BlockDevice, *rdev)?,
            _ => unreachable!("restore_special handles links, FIFOs and devices"),
        }
        self.stats.others_restored += 1;
        Ok(true)
    }

    fn restore_file(
        &mut self,
        node: &Node,
        parent: &Arc<Dir>,
        name: &OsStr,
        path: &Path,
    ) -> Result<bool, String> {
        let older = |found: &Found| node.mtime > found.mtime;
        let key = (node.device, node.inode);
        if node.links > 1 {
            match self.links.get(&key) {
                Some(Linked::Placed(first)) => {
                    let first = first.clone();
                    return self.restore_link(&first, parent, name, older);
                }
                Some(Linked::Writing(tmp)) => {
                    // Always waiting while writing (`link_later_names` ends both); were
                    // it not, this name is restored as a file of its own.
                    if let Some(w) = self.waiting.get_mut(tmp) {
                        w.later.push(LaterLink {
                            parent: parent.clone(),
                            name: name.to_os_string(),
                            path: path.to_path_buf(),
                            mtime: node.mtime,
                        });
                        return Ok(false);
                    }
                }
                None => {}
            }
        }
        // Nothing to look at in a directory this restore made: saves an lstat per file.
        let found = if parent.fresh {
            None
        } else {
            parent
                .stat(name)
                .map_err(|e| e.to_string())?
                .map(Found::from)
        };
        if let Some(found) = &found {
            let (repo, verify, owners, euid) =
                (self.repo, self.opts.verify, self.opts.owners, self.euid);
            // Restoring owners, a file of anyone's but this process's and the snapshot's
            // owner is suspect (see `file_matches`).
            let suspect = |found: &Found| owners && found.uid != node.uid && found.uid != euid;
            let same = |found: &Found| {
                file_matches(repo, verify, suspect(found), node, found, parent, name)
            };
            let decision = self
                .decide(found, same, older)
                .map_err(|e| format!("cannot compare with the snapshot: {e}"))?;
            match decision {
                // Replaced by the rename once the new file is complete.
                Existing::Go => {}
                Existing::Unchanged => {
                    if node.links > 1 {
                        let first = FirstLink {
                            rel_dir: parent.rel.clone(),
                            name: name.to_os_string(),
                        };
                        self.links.insert(key, Linked::Placed(first));
                    }
                    // Metadata such as the mode may still differ: set on the inode just
                    // compared, which another user may have swapped for another since.
                    let opts = ApplyOptions {
                        owners: self.opts.owners,
                        mode: Some(self.mode_of(node, path)),
                        owner: None,
                        no_capabilities: self.opts.no_setuid,
                        inode: Some((found.dev, found.ino)),
                    };
                    fsmeta::apply_beneath(parent.as_fd(), name, node, opts)
                        .map_err(|e| format!("metadata not fully restored: {e}"))?;
                    return Ok(false);
                }
                Existing::Keep => return Ok(false),
            }
        }
        let mode = self.mode_of(node, path);
        let (create_mode, chmod) = creation_mode(mode, self.umask);
        let job = FileJob {
            node: node.clone(),
            dir: parent.clone(),
            name: name.to_os_string(),
            // Random, not counted: whoever can write into the target cannot tell the
            // next name from one they saw, and take it first.
            tmp: TempName(rand::random()),
            path: path.to_path_buf(),
            create_mode,
            chmod,
        };
        self.collect_done();
        // A file with hard links is written like any other; its later names are made
        // once it is in place (`link_later_names`). Written alone, each in turn on this
        // thread, a tree whose every file has other names (a copy made with `cp -al`, or
        // files linked from outside the backup) restored at a fraction of the speed.
        if node.links > 1 {
            self.links.insert(key, Linked::Writing(job.tmp));
            let first = FirstLink {
                rel_dir: parent.rel.clone(),
                name: name.to_os_string(),
            };
            self.waiting.insert(
                job.tmp,
                Waiting {
                    key,
                    first,
                    first_path: path.to_path_buf(),
                    later: Vec::new(),
                },
            );
        }
        self.in_flight.insert(
            job.tmp,
            InFlight {
                dir: job.dir.clone(),
                path: job.path.clone(),
            },
        );
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
        Ok(false)
    }

    /// Makes `name` in `parent` another name of the file first restored as `first`.
    fn restore_link(
        &mut self,
        first: &FirstLink,
        parent: &Arc<Dir>,
        name: &OsStr,
        older: impl FnOnce(&Found) -> bool,
    ) -> Result<bool, String> {
        // The first name's directory, opened again beneath the target unless it is this
        // one: the walk does not keep every directory open.
        let reopened;
        let from: &dyn AsFd = if first.rel_dir == parent.rel {
            parent.as_ref()
        } else {
            reopened = self
                .target
                .reopen_below(&first.rel_dir)
                .map_err(|e| format!("cannot open the directory of its first name: {e}"))?;
            &reopened
        };
        let same = |found: &Found| -> io::Result<bool> {
            let st = rustix::fs::statat(
                from.as_fd(),
                &first.name,
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )?;
            Ok((found.dev, found.ino) == (st.st_dev, st.st_ino))
        };
        match self
            .clear(parent, name, same, older)
            .map_err(|e| e.to_string())?
        {
            Existing::Go => {}
            Existing::Unchanged | Existing::Keep => return Ok(false),
        }
        parent
            .hard_link(&from.as_fd(), &first.name, name)
            .map_err(|e| e.to_string())?;
        self.stats.hardlinks_restored += 1;
        Ok(false)
    }
}

/// What a special file that could not be made is reported with: for a device node
/// made without root, why, and how to restore the rest without the message.
fn special_error(node: &Node, e: &io::Error) -> String {
    let device = matches!(
        node.kind,
        NodeKind::CharDevice { .. } | NodeKind::BlockDevice { .. }
    );
    if device && e.raw_os_error() == Some(libc::EPERM) {
        format!("device node not made: only root can make one ({e}); --no-special-files leaves device nodes and FIFOs out")
    } else {
        e.to_string()
    }
}

/// The mode to create a file with, and the mode to set once it is written (`None` when
/// the creation mode is already right). Creating it with its own mode saves an
/// `fchmod` per file, but only where that is safe: the umask leaves the bits as they
/// are, the owner can read and write it (a file closed between parts is opened again),
/// and no one else can write it while it is incomplete. Setuid and setgid bits are
/// always set last, after the owner (which clears them).
fn creation_mode(mode: u32, umask: Option<u32>) -> (u32, Option<u32>) {
    match umask {
        Some(umask)
            if mode & 0o7000 == 0
                && mode & 0o600 == 0o600
                && mode & 0o022 == 0
                && mode & umask == 0 =>
        {
            (mode, None)
        }
        _ => (0o600, Some(mode)),
    }
}

/// Whether the regular file `name` of `dir` (which `found` describes) holds what the
/// snapshot's `node` does: same size and mtime, and with `verify` the same chunk ids when
/// cut and hashed with this repository's chunker and key — or, for a file that points
/// into parts of blobs (small files bundled together), the same bytes as those parts.
fn file_matches(
    repo: &Repository,
    verify: bool,
    suspect: bool,
    node: &Node,
    found: &Found,
    dir: &Dir,
    name: &OsStr,
) -> io::Result<bool> {
    let NodeKind::File { size, content } = &node.kind else {
        return Ok(false);
    };
    if found.kind != FileType::RegularFile || found.size != *size || found.mtime != node.mtime {
        return Ok(false);
    }
    // Not taken for the snapshot's file, so that its metadata is never set there: a file
    // with other names the snapshot does not give it (a hard link to a file outside the
    // target), or a `suspect` one: restoring owners, one that neither this process nor
    // the snapshot's owner owns (planted by whoever can write here, with the right size
    // and mtime, to be made root's and setuid). Such a file is replaced by a new one.
    if (found.nlink > 1 && node.links <= 1) || suspect {
        return Ok(false);
    }
    if !verify {
        return Ok(true);
    }
    let (params, seed) = match repo.chunker_params() {
        Ok(p) => (p, repo.key().chunker_gear()),
        Err(e) => return Err(io::Error::other(crate::error::chain(&e))),
    };
    // Non-blocking: should the file have become a FIFO since the lstat, the open must
    // not wait for a writer (and O_NOFOLLOW refuses a symlink).
    let fd = dir.open_file(
        name,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK,
        0,
    )?;
    let file = File::from(fd);
    if !file.metadata()?.is_file() {
        return Ok(false);
    }
    if !browse::whole_blobs(repo, content) {
        return same_bytes(repo, file, content);
    }
    let mut chunker = cairn_chunker::Chunker::new(file, params, seed);
    let mut expected = content.iter();
    while let Some(chunk) = chunker.next_chunk()? {
        let id = repo.key().blob_id(chunk.data);
        match expected.next() {
            Some(c) if c.offset == 0 && c.len as usize == chunk.data.len() && c.blob == id => {}
            _ => return Ok(false),
        }
    }
    Ok(expected.next().is_none())
}

/// Whether `file` holds exactly the bytes `content` refers to.
fn same_bytes(
    repo: &Repository,
    mut file: File,
    content: &[crate::tree::ContentRef],
) -> io::Result<bool> {
    let mut mine = Vec::new();
    for c in content {
        let blob = repo
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_created_with_its_own_mode_only_when_nothing_else_can_touch_it_first() {
        let umask = Some(0o022);
        assert_eq!(creation_mode(0o644, umask), (0o644, None));
        assert_eq!(creation_mode(0o755, umask), (0o755, None));
        // Writable by others, not writable by the owner, setuid, or cut by the umask.
        assert_eq!(creation_mode(0o666, umask), (0o600, Some(0o666)));
        assert_eq!(creation_mode(0o444, umask), (0o600, Some(0o444)));
        assert_eq!(creation_mode(0o4755, umask), (0o600, Some(0o4755)));
        assert_eq!(creation_mode(0o644, Some(0o077)), (0o600, Some(0o644)));
        assert_eq!(creation_mode(0o644, None), (0o600, Some(0o644)));
    }
}

//! `backup`: walk the source paths in name order, read the parent snapshot's trees in step
//! to skip files whose metadata did not change, have worker threads read, chunk and hash
//! the rest (`ingest`), store trees bottom-up, then the index, then the snapshot, last.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::Metadata;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cairn_chunker::ChunkerParams;
use crossbeam_channel::{Receiver, TryRecvError};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::fsmeta::{self, NameCache};
use crate::id::{BlobId, PackId, SnapshotId};
use crate::index::Index;
use crate::monitor::{FileChange, Monitor};
use crate::ops::exclude::{ExcludeOptions, ExcludeReason, Excludes};
use crate::ops::ignore_files::IgnoreStack;
use crate::ops::ingest::{self, Context, FileContent, Outcome, Pool, ResultSlot, Timings, Work};
use crate::ops::walk::{Entry, Lookahead};
use crate::pack::BlobKind;
use crate::repo::Repository;
use crate::session::{Host, Session, SessionKind};
use crate::snapshot::{Snapshot, SnapshotSummary};
use crate::tree::{Node, NodeKind, Tree};
use crate::writer::WriterReport as Written;

/// What to back up and how. Plain data: the CLI fills it from its flags.
#[derive(Debug, Clone, Default)]
pub struct BackupOptions {
    pub paths: Vec<PathBuf>,
    /// What to leave out.
    pub exclude: ExcludeOptions,
    pub tags: Vec<String>,
    pub host: String,
    pub username: String,
    pub one_file_system: bool,
    /// Compare with this snapshot; `None` picks the latest with the same host and paths.
    pub parent: Option<SnapshotId>,
    /// Read every file even when its metadata says it is unchanged.
    pub force: bool,
    /// Threads reading files (0: as many as cores, at least 2, so that one reads while
    /// the other chunks).
    pub read_threads: usize,
    /// Walk, read, compress and pack as a backup does, but write nothing to the
    /// repository: no session, pack, index or snapshot. The report (and the monitor's
    /// `file_change` and `excluded`) say what a backup would do and add. `commands` still
    /// run: their output is what would be stored.
    pub dry_run: bool,
    /// The snapshot's time; `None`: when it is written.
    pub time: Option<jiff::Timestamp>,
    /// Commands whose standard output is stored, each as one file at the snapshot's root
    /// beside the paths' top directories (`backup --stdin-from-command`, a job's
    /// `commands`). They run one after the other, after the walk; a command that cannot
    /// be started or exits unsuccessfully fails the backup, and no snapshot is written.
    pub commands: Vec<CommandSource>,
}

/// A command whose output a backup stores as the file `name` at the snapshot's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSource {
    /// A plain file name (no `/`), distinct from the other commands' and from the first
    /// component of every backed-up path.
    pub name: String,
    /// The program and its arguments, run without a shell, with standard input from
    /// `/dev/null` and standard error passed through.
    pub argv: Vec<std::ffi::OsString>,
}

impl CommandSource {
    /// A command line for `sh -c`, as a config file writes it (`"pg_dump db"`).
    pub fn shell(name: &str, command_line: &str) -> CommandSource {
        CommandSource {
            name: name.to_string(),
            argv: vec!["sh".into(), "-c".into(), command_line.into()],
        }
    }

    /// The command as a person would type it, for messages.
    pub fn display(&self) -> String {
        let words: Vec<_> = self.argv.iter().map(|a| a.to_string_lossy()).collect();
        words.join(" ")
    }
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
    /// Chunks of the files read (small files bundled together count once per bundle
    /// they use), and how many of them the repository already had.
    pub chunks: u64,
    pub chunks_present: u64,
    pub errors: Vec<SourceProblem>,
    /// Packs the backup had built on that were gone (or condemned, after its session
    /// went silent) when it came to commit: their blobs were stored again from the
    /// source.
    pub packs_replaced: u64,
    /// Packs that a backup which did not finish had left in no index, adopted by this
    /// one so that their data need not be uploaded again.
    pub packs_adopted: u64,
    pub duration_ms: u64,
    /// Time spent in each phase, summed over the threads doing it.
    pub phases_ms: PhaseTimes,
}

/// Milliseconds per phase of a backup, summed over threads: with several cores busy, the
/// phases add up to more than the wall time. The largest is what limits the backup.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseTimes {
    /// Listing directories, `lstat`, extended attributes (the walking thread).
    pub walk: u64,
    /// Reading file contents.
    pub read: u64,
    /// Finding chunk boundaries.
    pub chunk: u64,
    /// Computing blob ids.
    pub hash: u64,
    pub compress: u64,
    pub encrypt: u64,
    /// Storing packs and index files.
    pub write: u64,
}

#[derive(Debug)]
pub struct BackupReport {
    /// The snapshot written; `None` for a dry run.
    pub snapshot_id: Option<SnapshotId>,
    /// The snapshot written, or for a dry run the one that would have been.
    pub snapshot: Snapshot,
    pub parent: Option<SnapshotId>,
    pub stats: BackupStats,
    /// `--exclude` patterns that left nothing out, as typed.
    pub excludes_unmatched: Vec<String>,
}

/// Registers a backup session, then (re)reads the trash and the index and records the
/// trash generation it honours: from here on, prune will not delete a pack this backup
/// may build on. Packs that unfinished backups left in no index are adopted.
/// A dry run only reads the index: it writes nothing, so prune need not know of it.
fn begin(repo: &mut Repository, opts: &BackupOptions) -> Result<(Option<Session>, u64)> {
    if opts.dry_run {
        repo.load_index()?;
        return Ok((None, 0));
    }
    let session = Session::start(repo, SessionKind::Backup, &opts.host)?;
    let observed = repo.load_index()?;
    session.observe(observed);
    let adopted = adopt_after_ended_sessions(repo, &session)?;
    Ok((Some(session), adopted))
}

/// A session that ended without finishing may have stored packs after its last index
/// file: index them, so that this backup builds on them instead of uploading them
/// again, then remove the ended sessions' files.
fn adopt_after_ended_sessions(repo: &mut Repository, session: &Session) -> Result<u64> {
    if repo.key().is_write_only() {
        // It can neither judge others' sessions nor read their packs' headers; prune
        // (with a full key) adopts what ended sessions left.
        return Ok(0);
    }
    let survey = session.survey(repo, &Host::this())?;
    let ended: Vec<_> = survey.ended().map(|(v, _)| v.clone()).collect();
    if ended.is_empty() {
        return Ok(0);
    }
    let (adopted, _) = repo.adopt_unindexed_packs(|_| true)?;
    for view in &ended {
        match crate::session::remove(repo, view) {
            // A repository server refuses a backup-only (append) token the removal of
            // other tokens' session files; they are only clutter, which prune removes.
            Err(Error::Storage(cairn_storage::StorageError::Refused { .. })) => {}
            other => other?,
        }
    }
    Ok(adopted.len() as u64)
}

/// Backs up `opts.paths`. The repository may be opened without its index; the backup
/// reads it after registering its session.
pub fn backup(
    repo: &mut Repository,
    opts: &BackupOptions,
    monitor: &dyn Monitor,
) -> Result<BackupReport> {
    let started = Instant::now();
    let paths = match opts.paths.is_empty() && !opts.commands.is_empty() {
        true => Vec::new(),
        false => normalize_paths(&opts.paths)?,
    };
    check_command_names(&opts.commands, &paths)?;
    let (session, adopted) = begin(repo, opts)?;
    let display_paths: Vec<String> = paths
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .chain(opts.commands.iter().map(|c| format!("/{}", c.name)))
        .collect();
    let parent = match opts.parent {
        Some(id) => Some((id, repo.load_snapshot(&id)?)),
        None => find_parent(repo, &opts.host, &display_paths)?,
    };
    let parent_tree = match &parent {
        Some((_, s)) => Some(repo.read_tree(&s.tree)?),
        None => None,
    };
    let excludes = Excludes::of(&opts.exclude)?;
    let root = SourceDir::build(&paths);
    let mut replaced = 0;
    let mut rounds = 0;
    let mut added = BackupStats::default();
    loop {
        rounds += 1;
        let (tree, mut stats) = run(repo, opts, &excludes, monitor, |a| {
            let mut nodes = a.virtual_nodes(&root, parent_tree.as_ref())?;
            for command in &opts.commands {
                nodes.push(a.command_node(command)?);
            }
            nodes.sort_by(|x, y| x.name.cmp(&y.name));
            a.save_tree(Tree { nodes })
        })?;
        added.blobs_added += stats.blobs_added;
        added.raw_bytes_added += stats.raw_bytes_added;
        added.bytes_added += stats.bytes_added;
        (stats.blobs_added, stats.raw_bytes_added, stats.bytes_added) =
            (added.blobs_added, added.raw_bytes_added, added.bytes_added);
        stats.packs_replaced = replaced;
        stats.packs_adopted = adopted;
        let meta = SnapshotMeta {
            parent: parent.as_ref().map(|p| p.0),
            paths: display_paths.clone(),
        };
        match commit(repo, session.as_ref(), tree, stats, meta, opts, started)? {
            Committed::Done(report) => {
                if let Some(session) = session {
                    session.finish();
                }
                if let Some(id) = report.snapshot_id {
                    if let Err(e) = repo.remember_as_writer(id, &report.snapshot) {
                        let dir = repo.writer_cache().map(|c| c.dir().to_path_buf());
                        monitor.problem(
                            &dir.unwrap_or_default(),
                            &format!("the next backup will read and upload everything again: {e}"),
                        );
                    }
                }
                return Ok(BackupReport {
                    excludes_unmatched: excludes.unmatched(),
                    ..*report
                });
            }
            // The source is still there: the next round reads what those packs held. Not
            // so a command's output: it is not run twice.
            Committed::Unsafe(packs) if rounds < MAX_ROUNDS && opts.commands.is_empty() => {
                replaced += packs.len() as u64;
                repo.condemn(packs);
            }
            Committed::Unsafe(packs) => return Err(unsafe_packs_error(repo, &packs)),
        }
    }
}

/// Rounds of storing again what vanished before a backup gives up: a round after the
/// first follows packs gone missing during this very backup, which its live session
/// prevents unless something else deletes them.
const MAX_ROUNDS: usize = 3;

fn unsafe_packs_error(repo: &Repository, packs: &[PackId]) -> Error {
    let names: Vec<String> = packs.iter().take(3).map(|p| p.storage_name()).collect();
    Error::InvalidInput(format!(
        "{} pack(s) this run builds on are gone from {} or condemned by a prune ({}{}), and \
         their data could not be stored again; no snapshot was written. Run it again: it \
         reuses what was uploaded",
        packs.len(),
        repo.storage().location(),
        names.join(", "),
        if packs.len() > 3 { ", ..." } else { "" }
    ))
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
    let (session, adopted) = begin(repo, opts)?;
    let excludes = Excludes::new(&[])?;
    let (tree, mut stats) = run(repo, opts, &excludes, monitor, |archiver| {
        let node = archiver.stream_node(name, reader, Path::new("<stdin>"))?;
        archiver.save_tree(Tree { nodes: vec![node] })
    })?;
    stats.packs_adopted = adopted;
    let meta = SnapshotMeta {
        parent: None,
        paths: vec![format!("/{name}")],
    };
    match commit(repo, session.as_ref(), tree, stats, meta, opts, started)? {
        Committed::Done(report) => {
            if let Some(session) = session {
                session.finish();
            }
            Ok(*report)
        }
        // Standard input cannot be read again.
        Committed::Unsafe(packs) => Err(unsafe_packs_error(repo, &packs)),
    }
}

struct SnapshotMeta {
    parent: Option<SnapshotId>,
    paths: Vec<String>,
}

enum Committed {
    Done(Box<BackupReport>),
    /// No snapshot was written: these packs, which the backup built on, are gone (or
    /// condemned, after its session went silent).
    Unsafe(Vec<PackId>),
}

/// Writes the index and the snapshot, after the commit check; without a session (a dry
/// run) only makes the report.
fn commit(
    repo: &mut Repository,
    session: Option<&Session>,
    (tree, mut written): (BlobId, Written),
    mut stats: BackupStats,
    meta: SnapshotMeta,
    opts: &BackupOptions,
    started: Instant,
) -> Result<Committed> {
    let relied = crate::commit::relied_packs(&written);
    let checked_at = crate::session::boot_time();
    if let Some(session) = session {
        // Durability order: packs are stored (finish waited for them), then the index
        // that names them, then the snapshot that relies on both.
        repo.index_written(&mut written)?;
        let unsafe_packs = crate::commit::check(repo, session, &relied)?;
        if !unsafe_packs.is_empty() {
            return Ok(Committed::Unsafe(unsafe_packs));
        }
    }
    stats.duration_ms = started.elapsed().as_millis() as u64;
    let snapshot = Snapshot {
        time: opts.time.unwrap_or_else(jiff::Timestamp::now),
        host: opts.host.clone(),
        username: opts.username.clone(),
        paths: meta.paths,
        tags: opts.tags.clone(),
        tree,
        parent: meta.parent,
        original: None,
        program_version: format!("cairn {}", env!("CARGO_PKG_VERSION")),
        summary: SnapshotSummary {
            files: stats.files_new + stats.files_changed + stats.files_unchanged,
            dirs: stats.dirs,
            total_bytes: stats.total_bytes,
            bytes_added: stats.bytes_added,
        },
    };
    let snapshot_id = match session {
        None => None,
        Some(session) => {
            match crate::commit::save_snapshot(repo, session, &relied, &snapshot, checked_at)? {
                Ok(id) => Some(id),
                Err(unsafe_packs) => return Ok(Committed::Unsafe(unsafe_packs)),
            }
        }
    };
    Ok(Committed::Done(Box::new(BackupReport {
        snapshot_id,
        snapshot,
        parent: meta.parent,
        stats,
        excludes_unmatched: Vec::new(),
    })))
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

/// Each command's name must be a plain file name, once, and not the name of a top-level
/// directory of `paths` (the snapshot's root holds both).
fn check_command_names(commands: &[CommandSource], paths: &[PathBuf]) -> Result<()> {
    let mut seen = HashSet::new();
    for c in commands {
        if !crate::tree::is_safe_name(c.name.as_bytes()) {
            return Err(Error::InvalidInput(format!(
                "The output of {:?} needs a plain file name, without '/', not {:?}",
                c.display(),
                c.name
            )));
        }
        if c.argv.is_empty() {
            return Err(Error::InvalidInput(format!(
                "No command given for {:?}",
                c.name
            )));
        }
        let top = paths.iter().find(|p| {
            p.components().nth(1).map(|c| c.as_os_str().as_bytes()) == Some(c.name.as_bytes())
        });
        if let Some(p) = top {
            return Err(Error::InvalidInput(format!(
                "The output of {:?} would be /{} in the snapshot, where {} goes; name it \
                 otherwise",
                c.display(),
                c.name,
                p.display()
            )));
        }
        if !seen.insert(&c.name) {
            return Err(Error::InvalidInput(format!(
                "Two commands' outputs are named {:?}; give each its own name",
                c.name
            )));
        }
    }
    Ok(())
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

/// Starts the writer and the file workers, lets `walk` save the root tree through an
/// [`Archiver`], then waits for every blob to be stored.
fn run<F>(
    repo: &Repository,
    opts: &BackupOptions,
    excludes: &Excludes,
    monitor: &dyn Monitor,
    walk: F,
) -> Result<((BlobId, Written), BackupStats)>
where
    F: FnOnce(&mut Archiver) -> Result<BlobId>,
{
    let writer = match opts.dry_run {
        true => crate::writer::BlobWriter::dry_run(repo),
        false => repo.blob_writer(),
    };
    let timings = Timings::default();
    let abort = AtomicBool::new(false);
    let ctx = Context {
        writer: &writer,
        key: repo.key(),
        params: repo.chunker_params()?,
        gear: repo.key().chunker_gear(),
        monitor,
        timings: &timings,
        abort: &abort,
    };
    let threads = match opts.read_threads {
        // At least 4 had been the rule, for reads that wait on the disk; on 2 cores, 2
        // backed up both corpora as fast with the page cache dropped (Linux tree 6.63-6.67 s
        // against 6.53-6.64, mixed 4.40-5.32 against 4.87-5.09) at 74 and 90-97 MiB of peak
        // RSS against 99-102 and 113-116: each reader holds a chunker buffer and a chunk.
        0 => crate::cores().map_or(2, |n| n.get().max(2)),
        n => n,
    };
    let walked = std::thread::scope(|scope| {
        let pool = Pool::start(scope, &ctx, threads);
        let lookahead = Lookahead::start(scope, repo, &timings.walk, threads, opts.force);
        let mut archiver = Archiver {
            repo,
            ctx: &ctx,
            pool,
            opts,
            excludes,
            monitor,
            names: NameCache::default(),
            stats: BackupStats::default(),
            root_device: 0,
            reused_packs: HashSet::new(),
            file_packs: Vec::new(),
            live: LastLive::default(),
            ignores: IgnoreStack::default(),
            lookahead,
            queue: VecDeque::new(),
            queued: 0,
            saved: HashMap::new(),
            bundle: Bundler::new(ctx.params),
            dirs_entered: 0,
        };
        let tree = walk(&mut archiver);
        debug_assert!(tree.is_err() || archiver.queue.is_empty());
        if tree.is_err() {
            // Queued files are dropped; the workers finish what they hold and stop.
            abort.store(true, Ordering::Relaxed);
        }
        tree.map(|t| (t, archiver.stats, archiver.reused_packs))
    });
    let (tree, mut stats, reused) = match walked {
        Ok(walked) => walked,
        Err(e) => return Err(writer.cause(e)),
    };
    let mut report = writer.finish()?;
    stats.blobs_added = report.blobs_added;
    stats.raw_bytes_added = report.raw_bytes_added;
    stats.bytes_added = report.stored_bytes_added;
    let ms = |d: Duration| d.as_millis() as u64;
    stats.phases_ms = PhaseTimes {
        walk: ms(timings.walk.total()),
        read: ms(timings.read.total()),
        chunk: ms(timings.chunk.total()),
        hash: ms(timings.hash.total()),
        compress: ms(report.compress_time),
        encrypt: ms(report.encrypt_time),
        write: ms(report.write_time),
    };
    report.reused_packs.extend(reused);
    Ok(((tree, report), stats))
}

/// Walks the source in name order and builds its trees; file contents come from the
/// workers of `pool`.
struct Archiver<'a> {
    repo: &'a Repository,
    ctx: &'a Context<'a>,
    pool: Pool<'a>,
    opts: &'a BackupOptions,
    excludes: &'a Excludes,
    monitor: &'a dyn Monitor,
    names: NameCache,
    stats: BackupStats,
    /// The device of the top-level path being walked, for --one-file-system.
    root_device: u64,
    /// Packs holding the chunks of unchanged files, which this snapshot builds on.
    reused_packs: HashSet<PackId>,
    /// The packs of the file `reuse` is looking at.
    file_packs: Vec<PackId>,
    /// Where `reuse` finds unchanged files' blobs live.
    live: LastLive,
    /// Ignore-file matchers of the directories being walked.
    ignores: IgnoreStack,
    /// Directory listings made ahead of the walk.
    lookahead: Lookahead<'a>,
    /// Directories waiting for their files' contents, oldest first, each after its
    /// subdirectories.
    queue: VecDeque<Queued>,
    /// How many directories were queued: the next one's number.
    queued: u64,
    /// Trees of queued directories that were saved, by number, until their parent
    /// takes them.
    saved: HashMap<u64, BlobId>,
    /// Small files read since the last bundle was sent, from the directories walked
    /// since.
    bundle: Bundler,
    /// Directories whose entries were saved so far: the next one's id.
    dirs_entered: u64,
}

/// Directories waiting for their files, at most. The walk goes on to the next directories
/// while the workers read these; beyond it, it waits for the oldest. The pool's bounded
/// queue limits how far the walk runs ahead in work; this limits the nodes held.
const WAITING_DIRS: usize = 256;

/// A directory's nodes while some are not complete: files whose contents the workers are
/// reading, subdirectories whose trees wait in the queue.
struct Unfinished {
    /// In the order the walk entered directories (`Archiver::dirs_entered`).
    id: u64,
    nodes: Vec<Option<Node>>,
    /// Files being read, by slot.
    reading: Vec<Reading>,
    /// Results by slot; the channel ends when the last is in.
    results: Receiver<(usize, Outcome)>,
    /// Queued subdirectories.
    subdirs: Vec<QueuedSubdir>,
    /// How many nodes the directory had in the parent snapshot, if it was there.
    parent_nodes: Option<usize>,
    /// How many of `nodes` are the parent snapshot's own, unchanged. When that is all of
    /// them and all the parent's, the directory's tree is the parent's.
    kept: usize,
}

/// A subdirectory waiting in the queue.
struct QueuedSubdir {
    /// Its place among the nodes.
    at: usize,
    number: u64,
    /// Whether its node is the parent snapshot's, which stays so if the tree is the same.
    kept: bool,
}

/// A directory in the queue.
struct Queued {
    number: u64,
    dir: Unfinished,
    /// Its tree in the parent snapshot, to keep when nothing changed.
    parent: Option<BlobId>,
}

/// A directory's nodes in the parent snapshot, taken in name order as the walk meets the
/// same names: a merge of two sorted lists rather than a search for each entry, and the
/// node itself rather than a copy.
struct ParentNodes {
    nodes: std::iter::Peekable<std::vec::IntoIter<Node>>,
    /// How many there were; `None` when the directory was not in the parent snapshot.
    len: Option<usize>,
}

impl ParentNodes {
    fn new(nodes: Option<Vec<Node>>) -> Self {
        let len = nodes.as_ref().map(Vec::len);
        ParentNodes {
            nodes: nodes.unwrap_or_default().into_iter().peekable(),
            len,
        }
    }

    /// The node named `name`. Names must come in increasing order: the nodes before
    /// `name` are dropped.
    fn take(&mut self, name: &[u8]) -> Option<Node> {
        crate::tree::next_named(&mut self.nodes, name)
    }
}

/// A directory's tree: saved, or waiting in the queue under a number.
enum Subtree {
    Saved(BlobId),
    Queued(u64),
}

/// A file of the directory being saved whose content the workers are reading.
struct Reading {
    /// Its place among the directory's nodes.
    node: usize,
    path: PathBuf,
    /// Whether the parent snapshot had a file here (then it counts as changed, not new).
    changed: bool,
}

impl Archiver<'_> {
    fn exclude(&mut self, path: &Path, why: &ExcludeReason) {
        self.stats.excluded += 1;
        self.monitor.excluded(path, why);
    }

    fn problem(&mut self, path: &Path, error: &dyn std::fmt::Display) {
        self.monitor.problem(path, error);
        self.stats.errors.push(SourceProblem {
            path: path.to_string_lossy().into_owned(),
            error: error.to_string(),
        });
    }

    fn save_tree(&mut self, tree: Tree) -> Result<BlobId> {
        let bytes = tree.to_bytes();
        // Before the writer takes the bytes: a directory of a million chunks is a 40 MB
        // tree and 37 MB serialized.
        drop(tree);
        Ok(self.ctx.writer.add_owned(BlobKind::Tree, bytes)?.0)
    }

    /// Counts a file whose content was read.
    fn count_read(&mut self, file: &FileContent, changed: bool) {
        if changed {
            self.stats.files_changed += 1;
        } else {
            self.stats.files_new += 1;
        }
        self.stats.total_bytes += file.size;
        self.stats.bytes_read += file.size;
        self.stats.chunks += file.chunks;
        self.stats.chunks_present += file.chunks - file.chunks_new;
    }

    /// The subtree of the parent snapshot at the same place, if it is a directory there.
    fn parent_subtree(&mut self, parent: Option<&Node>, path: &Path) -> Option<Tree> {
        let read = parent_dir(parent).map(|id| self.repo.read_tree(&id));
        self.usable_parent(path, read)
    }

    /// The parent snapshot's tree of directory `path` as read; an error is reported.
    fn usable_parent(&mut self, path: &Path, read: Option<Result<Tree>>) -> Option<Tree> {
        match read? {
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

    /// A file node holding everything `reader` yields, owned by the user running the
    /// backup and dated now; `label` names the source in errors.
    fn stream_node(&mut self, name: &str, reader: &mut dyn Read, label: &Path) -> Result<Node> {
        let mut buffer = Vec::new();
        let file = ingest::chunk_stream(self.ctx, reader, &mut buffer)?
            .map_err(|e| Error::io(label, e))?;
        self.count_read(&file, false);
        self.monitor.file_done(label, file.size);
        let (size, content) = (file.size, file.content);
        let now = crate::tree::Time::now();
        let (uid, gid) = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        Ok(Node {
            name: name.as_bytes().to_vec(),
            kind: NodeKind::File { size, content },
            mode: 0o644,
            uid,
            gid,
            user: self.names.user(uid).map(str::to_owned),
            group: self.names.group(gid).map(str::to_owned),
            mtime: now,
            ctime: now,
            inode: 0,
            device: 0,
            links: 1,
            xattrs: Vec::new(),
        })
    }

    /// Runs `command` and stores its standard output as a file node; its failure (to
    /// start, or its exit status) is the backup's.
    fn command_node(&mut self, command: &CommandSource) -> Result<Node> {
        use std::process::{Command, Stdio};
        let label = PathBuf::from(format!("/{}", command.name));
        let failed = |status: String| Error::CommandFailed {
            name: command.name.clone(),
            command: command.display(),
            status,
        };
        let (program, args) = command
            .argv
            .split_first()
            .ok_or_else(|| failed("is empty".into()))?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| failed(format!("could not be started: {e}")))?;
        let node = match child.stdout.take() {
            Some(mut out) => self.stream_node(&command.name, &mut out, &label),
            None => Err(failed("gave no output pipe".into())),
        };
        if node.is_err() {
            // Reading stopped early (Ctrl-C, a storage error): the command is not waited
            // for to the end of its output.
            let _ = child.kill();
        }
        let status = child
            .wait()
            .map_err(|e| failed(format!("could not be waited for: {e}")))?;
        let node = node?;
        if !status.success() {
            return Err(failed(format!("failed ({status})")));
        }
        Ok(node)
    }

    fn save_virtual(
        &mut self,
        children: &BTreeMap<Vec<u8>, SourceDir>,
        parent: Option<&Tree>,
    ) -> Result<BlobId> {
        let nodes = self.virtual_nodes(children, parent)?;
        self.save_tree(Tree { nodes })
    }

    /// The nodes of the directories above the backed-up paths (see `SourceDir`), at one
    /// level, their subtrees saved.
    fn virtual_nodes(
        &mut self,
        children: &BTreeMap<Vec<u8>, SourceDir>,
        parent: Option<&Tree>,
    ) -> Result<Vec<Node>> {
        let mut nodes = Vec::new();
        for (name, child) in children {
            let parent_node = parent.and_then(|t| t.find(name));
            let path = match child {
                SourceDir::Walk(p) | SourceDir::Virtual(p, _) => p,
            };
            let entry = Entry::read(name.clone(), path.clone());
            let md = match &entry.md {
                Ok(md) => md.clone(),
                Err(e) => {
                    let e = e.to_string();
                    self.problem(path, &e);
                    continue;
                }
            };
            match child {
                SourceDir::Walk(_) => {
                    self.root_device = md.dev();
                    let parents = ParentNodes::new(parent_node.map(|n| vec![n.clone()]));
                    let dir = self.save_entries(None, vec![entry], parents, false)?;
                    nodes.extend(self.complete(dir)?.0);
                }
                SourceDir::Virtual(p, grandchildren) => {
                    let sub_parent = self.parent_subtree(parent_node, p);
                    let subtree = self.save_virtual(grandchildren, sub_parent.as_ref())?;
                    self.stats.dirs += 1;
                    let node = self.node(entry, &md, NodeKind::Dir { subtree });
                    nodes.push(node);
                }
            }
        }
        Ok(nodes)
    }

    /// The node of `entry` (whose metadata is `md`) holding `kind`.
    fn node(&mut self, entry: Entry, md: &Metadata, kind: NodeKind) -> Node {
        let mut node = fsmeta::node_from_metadata(entry.name, md, kind, &mut self.names);
        match entry.xattrs {
            Ok(x) => node.xattrs = x,
            Err(e) => self.problem(&entry.path, &format!("extended attributes not saved: {e}")),
        }
        node
    }

    /// The kind of an entry that is neither a regular file nor a directory; `None` when it
    /// is unreadable (reported).
    fn other_kind(&mut self, path: &Path, md: &Metadata) -> Option<NodeKind> {
        if md.file_type().is_symlink() {
            match std::fs::read_link(path) {
                Ok(t) => {
                    self.stats.others += 1;
                    Some(NodeKind::Symlink {
                        target: t.as_os_str().as_bytes().to_vec(),
                    })
                }
                Err(e) => {
                    self.problem(path, &e);
                    None
                }
            }
        } else {
            self.stats.others += 1;
            Some(fsmeta::special_kind(md))
        }
    }

    /// Saves subdirectory `path` unless it is left out (`None`); `parent` is its node in
    /// the parent snapshot.
    fn subdir(&mut self, path: &Path, parent: Option<&Node>) -> Result<Option<Subtree>> {
        let subtree = self.save_dir(path, parent_dir(parent))?;
        self.stats.dirs += 1;
        Ok(Some(subtree))
    }

    /// Saves directory `dir`, now if its nodes are complete, else through the queue;
    /// `parent_id` is its tree in the parent snapshot.
    fn save_dir(&mut self, dir: &Path, parent_id: Option<BlobId>) -> Result<Subtree> {
        let listing = self.lookahead.take(dir, parent_id);
        for p in &listing.problems {
            self.problem(dir, p);
        }
        let parent = self.usable_parent(dir, listing.parent);
        let entries = listing.entries;
        let present = |n: &std::ffi::OsStr| {
            entries
                .binary_search_by(|e| e.name.as_slice().cmp(n.as_bytes()))
                .is_ok()
        };
        let (pushed, unreadable) =
            self.ignores
                .push_dir(dir, &self.opts.exclude.ignore_files, present)?;
        for (file, e) in unreadable {
            self.problem(&file, &format!("ignore file not read, not applied: {e}"));
        }
        let parent_id = parent_id.filter(|_| parent.is_some());
        let parents = ParentNodes::new(parent.map(|t| t.nodes));
        let unfinished = self.save_entries(dir.file_name(), entries, parents, true);
        if pushed {
            self.ignores.pop();
        }
        let mut dir = unfinished?;
        if dir.subdirs.is_empty() && self.collect(&mut dir, false)? {
            return Ok(Subtree::Saved(self.finish(dir, parent_id)?));
        }
        let number = self.queued;
        self.queued += 1;
        self.queue.push_back(Queued {
            number,
            dir,
            parent: parent_id,
        });
        self.advance()?;
        Ok(Subtree::Queued(number))
    }

    /// Saves the queued directories that are complete, oldest first, and waits for the
    /// oldest while too many are queued.
    fn advance(&mut self) -> Result<()> {
        while self.finish_oldest(false)? {}
        while self.queue.len() > WAITING_DIRS {
            self.finish_oldest(true)?;
        }
        Ok(())
    }

    /// Saves the oldest queued directory once its files are in, waiting for them if
    /// `wait`; whether it was saved. Its subdirectories were queued before it, so they are
    /// saved already.
    fn finish_oldest(&mut self, wait: bool) -> Result<bool> {
        let Some(mut oldest) = self.queue.pop_front() else {
            return Ok(false);
        };
        if !self.collect(&mut oldest.dir, wait)? {
            self.queue.push_front(oldest);
            return Ok(false);
        }
        let id = self.finish(oldest.dir, oldest.parent)?;
        self.saved.insert(oldest.number, id);
        Ok(true)
    }

    /// Saves the tree of `dir`, or keeps `parent` (its tree in the parent snapshot) when
    /// nothing changed.
    fn finish(&mut self, dir: Unfinished, parent: Option<BlobId>) -> Result<BlobId> {
        let (nodes, unchanged) = self.complete(dir)?;
        // Unchanged since the parent snapshot: its tree is this one, already stored, and
        // need not be serialized and hashed again.
        if let Some(id) = parent.filter(|id| unchanged && self.ctx.writer.has(id)) {
            return Ok(id);
        }
        self.save_tree(Tree { nodes })
    }

    /// The nodes of `dir`, once its files are in and its queued subdirectories saved, and
    /// whether they are the parent snapshot's tree unchanged.
    fn complete(&mut self, mut dir: Unfinished) -> Result<(Vec<Node>, bool)> {
        self.collect(&mut dir, true)?;
        for QueuedSubdir { at, number, kept } in dir.subdirs {
            while self.queue.front().is_some_and(|q| q.number <= number) {
                self.finish_oldest(true)?;
            }
            let Some(id) = self.saved.remove(&number) else {
                return Err(Error::InvalidInput(format!(
                    "internal error: directory {number} of the backup was never saved"
                )));
            };
            if let Some(Node {
                kind: NodeKind::Dir { subtree },
                ..
            }) = &mut dir.nodes[at]
            {
                if kept && *subtree == id {
                    dir.kept += 1;
                }
                *subtree = id;
            }
        }
        let nodes: Vec<Node> = dir.nodes.into_iter().flatten().collect();
        let unchanged = dir.parent_nodes == Some(dir.kept) && dir.kept == nodes.len();
        Ok((nodes, unchanged))
    }

    /// Completes the nodes of `dir`'s files with the results in, waiting for all of them
    /// if `wait`; whether all are in.
    fn collect(&mut self, dir: &mut Unfinished, wait: bool) -> Result<bool> {
        // The files of `dir` still in the bundle have no result to wait for until it is
        // sent. Only at the end of the walk: the bundle ends before the walk is
        // `MAX_BUNDLE_DIRS` directories further, and waits only come after
        // `WAITING_DIRS` more.
        if wait && self.bundle.holds(dir.id) {
            self.send_bundle()?;
        }
        loop {
            let (slot, outcome) = if wait {
                match dir.results.recv() {
                    Ok(result) => result,
                    Err(_) => return Ok(true),
                }
            } else {
                match dir.results.try_recv() {
                    Ok(result) => result,
                    Err(TryRecvError::Empty) => return Ok(false),
                    Err(TryRecvError::Disconnected) => return Ok(true),
                }
            };
            let Some(r) = dir.reading.get(slot) else {
                return Err(outcome.err().unwrap_or(Error::WriterStopped));
            };
            match outcome? {
                Ok(file) => {
                    self.count_read(&file, r.changed);
                    self.monitor.file_done(&r.path, file.size);
                    let change = match r.changed {
                        true => FileChange::Changed,
                        false => FileChange::New,
                    };
                    self.monitor.file_change(&r.path, change);
                    if let Some(n) = &mut dir.nodes[r.node] {
                        n.kind = NodeKind::File {
                            size: file.size,
                            content: file.content,
                        };
                    }
                }
                Err(e) => {
                    dir.nodes[r.node] = None;
                    self.problem(&r.path, &e);
                }
            }
        }
    }

    /// Saves a directory's entries, in order. Files to read go to the workers first
    /// (small ones bundled); then the walk descends into subdirectories (listed ahead by
    /// the lookahead threads) while the workers read. The nodes of files being read and of
    /// queued subdirectories are completed later (`complete`). `name` is the directory's
    /// (`None` for the one holding a path the user named); `parents` are the directory's
    /// nodes in the parent snapshot; `filtered`: whether excludes and ignore files apply
    /// (not to the paths the user named).
    fn save_entries(
        &mut self,
        name: Option<&std::ffi::OsStr>,
        entries: Vec<Entry>,
        mut parents: ParentNodes,
        filtered: bool,
    ) -> Result<Unfinished> {
        let (results_tx, results) = crossbeam_channel::unbounded::<(usize, Outcome)>();
        let id = self.dirs_entered;
        self.dirs_entered += 1;
        let cut = name.is_some_and(|n| self.ends_bundle(n.as_bytes()));
        if self.bundle.enter_dir(cut) {
            self.send_bundle()?;
        }
        let mut nodes: Vec<Option<Node>> = Vec::with_capacity(entries.len());
        let mut kept = 0;
        let mut reading: Vec<Reading> = Vec::new();
        // Entries that are not regular files, saved after the files are queued.
        let mut others: Vec<(usize, Entry, Metadata, Option<Node>)> = Vec::new();
        for entry in entries {
            if self.monitor.cancelled() {
                return Err(Error::Interrupted);
            }
            let md = match &entry.md {
                Ok(md) => md.clone(),
                Err(e) => {
                    let e = e.to_string();
                    self.problem(&entry.path, &e);
                    continue;
                }
            };
            let other_fs = self.opts.one_file_system.then_some(self.root_device);
            let why = (self.opts.exclude).why_excluded(
                self.excludes,
                &self.ignores,
                &entry.path,
                &md,
                !filtered,
                other_fs,
            );
            if let Some(why) = why {
                self.exclude(&entry.path, &why);
                continue;
            }
            let parent_node = parents.take(&entry.name);
            if !md.is_file() {
                if md.is_dir() {
                    self.lookahead
                        .ahead(&entry.path, parent_dir(parent_node.as_ref()));
                }
                nodes.push(None);
                others.push((nodes.len() - 1, entry, md, parent_node));
                continue;
            }
            let parent_node = match parent_node {
                Some(p) if self.reuse(&entry.path, &md, &p) => {
                    let node = if self.is_unchanged(&entry, &md, &p) {
                        kept += 1;
                        p
                    } else {
                        self.node(entry, &md, p.kind)
                    };
                    nodes.push(Some(node));
                    continue;
                }
                p => p,
            };
            let slot = reading.len();
            let path = entry.path.clone();
            reading.push(Reading {
                node: nodes.len(),
                path: path.clone(),
                changed: matches!(parent_node.map(|p| p.kind), Some(NodeKind::File { .. })),
            });
            let placeholder = NodeKind::File {
                size: 0,
                content: Vec::new(),
            };
            let small = md.len() < self.bundle.small;
            let cut = small && self.ends_bundle(&entry.name);
            nodes.push(Some(self.node(entry, &md, placeholder)));
            let to = ResultSlot {
                results: results_tx.clone(),
                slot,
            };
            if !small {
                self.pool.submit(Work::File(to, path))?;
            } else if let Some(work) = self.bundle.add(to, path, md.len(), id, cut) {
                self.pool.submit(work)?;
            }
        }
        drop(results_tx);
        let mut subdirs = Vec::new();
        for (at, entry, md, parent_node) in others {
            let mut queued = None;
            let kind = if md.is_dir() {
                match self.subdir(&entry.path, parent_node.as_ref())? {
                    None => None,
                    Some(Subtree::Saved(subtree)) => Some(NodeKind::Dir { subtree }),
                    Some(Subtree::Queued(number)) => {
                        queued = Some(number);
                        // The parent's id until `complete` sets the tree's: compared so,
                        // the node is the parent's if its metadata is.
                        let subtree = parent_dir(parent_node.as_ref()).unwrap_or(BlobId([0; 32]));
                        Some(NodeKind::Dir { subtree })
                    }
                }
            } else {
                self.other_kind(&entry.path, &md)
            };
            let Some(kind) = kind else { continue };
            let same = parent_node
                .as_ref()
                .is_some_and(|p| p.kind == kind && self.is_unchanged(&entry, &md, p));
            nodes[at] = Some(match parent_node {
                Some(p) if same => p,
                _ => self.node(entry, &md, kind),
            });
            match queued {
                Some(number) => subdirs.push(QueuedSubdir {
                    at,
                    number,
                    kept: same,
                }),
                None => kept += usize::from(same),
            }
        }
        Ok(Unfinished {
            id,
            nodes,
            reading,
            results,
            subdirs,
            parent_nodes: parents.len,
            kept,
        })
    }

    /// Whether a bundle may end after a file named `name`, or before a directory so named
    /// (one name in [`CUT_ODDS`]). The hash is keyed as blob ids are, so where bundles end
    /// (their sizes show it, padded) tells whoever lacks the key nothing about names.
    fn ends_bundle(&self, name: &[u8]) -> bool {
        self.repo.key().blob_id(name).0[0].is_multiple_of(CUT_ODDS)
    }

    /// Sends the bundle being filled, if any, to the workers.
    fn send_bundle(&mut self) -> Result<()> {
        match self.bundle.finish() {
            Some(work) => self.pool.submit(work),
            None => Ok(()),
        }
    }

    /// Whether `entry` has the metadata and extended attributes of `parent`, its node in
    /// the parent snapshot.
    fn is_unchanged(&mut self, entry: &Entry, md: &Metadata, parent: &Node) -> bool {
        entry.xattrs.as_ref().is_ok_and(|x| *x == parent.xattrs)
            && fsmeta::same_metadata(parent, md, &mut self.names)
    }

    /// Whether the file at `path` keeps the content of `parent`, its node in the parent
    /// snapshot: its metadata is unchanged and all its chunks are still stored. Counts it
    /// as unchanged if so.
    fn reuse(&mut self, path: &Path, md: &Metadata, parent: &Node) -> bool {
        let NodeKind::File { size, content } = &parent.kind else {
            return false;
        };
        let unchanged = !self.opts.force
            && *size == md.len()
            && parent.mtime == fsmeta::mtime(md)
            && parent.ctime == fsmeta::ctime(md)
            && parent.inode == md.ino()
            && parent.device == md.dev();
        if !unchanged {
            return false;
        }
        let index = self.repo.index();
        let packs = &mut self.file_packs;
        packs.clear();
        for c in content {
            let Some(pack) = self.live.pack(index, &c.blob) else {
                return false;
            };
            // Consecutive chunks are mostly in one pack.
            if packs.last() != Some(&pack) {
                packs.push(pack);
            }
        }
        self.reused_packs.extend(packs.drain(..));
        self.stats.files_unchanged += 1;
        self.stats.total_bytes += size;
        self.monitor.bytes_done(*size);
        self.monitor.file_done(path, *size);
        self.monitor.file_change(path, FileChange::Unchanged);
        true
    }
}

/// [`Index::live_pack`] that remembers its last answer: the small files of a bundle, one
/// after the other, all name one blob, and the index does not change during the walk.
/// Index lookups went from 2.8% to 1.4% of an unchanged Linux-tree backup's samples.
#[derive(Default)]
struct LastLive(Option<(BlobId, PackId)>);

impl LastLive {
    fn pack(&mut self, index: &Index, blob: &BlobId) -> Option<PackId> {
        match self.0 {
            Some((last, pack)) if last == *blob => Some(pack),
            _ => {
                let pack = index.live_pack(blob)?;
                self.0 = Some((*blob, pack));
                Some(pack)
            }
        }
    }
}

/// The tree of a directory in the parent snapshot, if `parent` is a directory.
fn parent_dir(parent: Option<&Node>) -> Option<BlobId> {
    match parent.map(|n| &n.kind) {
        Some(NodeKind::Dir { subtree }) => Some(*subtree),
        _ => None,
    }
}

/// A bundle may end after a file one time in this many (by a keyed hash of its name), once
/// it holds the average chunk size.
const CUT_ODDS: u8 = 8;

/// Directories a bundle may span: past this many, it is sent. The walk waits for a
/// directory's files only once `WAITING_DIRS` more are queued, so it never waits for a
/// bundle still being filled (except at the end, which sends it).
const MAX_BUNDLE_DIRS: u64 = 64;

/// Directories a bundle spans before it may end at a directory by name (one in
/// [`CUT_ODDS`]): where directories hold few small files (`node_modules`), bundles end
/// by directory names, so that a directory added shifts only the bundles up to the next
/// such end, not every one after it as counting to [`MAX_BUNDLE_DIRS`] would.
const MIN_CUT_DIRS: u64 = 16;

/// Files a bundle may hold: empty and tiny files never fill one, and each waits in the
/// bundle with its path and result channel until it is sent.
const MAX_BUNDLE_FILES: usize = 4096;

/// Groups small files, in the order the walk reads them across directories, into
/// bundles: a bundle ends after a file whose name's keyed hash says so (one in
/// [`CUT_ODDS`]) once it holds the average chunk size, before twice that, before a
/// directory whose name's hash says so once it spans [`MIN_CUT_DIRS`] directories, and
/// after [`MAX_BUNDLE_DIRS`] directories or [`MAX_BUNDLE_FILES`] files. The ends depend
/// on the names and sizes of files and directories only, so a copy of a tree is bundled
/// the same, and a file or directory added or changed shifts the bundles only up to the
/// next end by name.
///
/// Linux 6.1's small files (`bench/compare.sh`'s tree) compressed by `zstd -3` and padded
/// as cairn pads (a scratch script): 195.5 MB in bundles of one directory each, 189.5 MB
/// so, 187.2 MB in bundles of a fixed 2 MiB (ends by size alone, which a file added can
/// shift through the rest of the tree).
struct Bundler {
    /// Files below this size are bundled: the chunker would not cut them anyway.
    small: u64,
    /// A bundle may end once it holds this much.
    target: u64,
    files: Vec<(ResultSlot, PathBuf)>,
    bytes: u64,
    /// The directories of `files`, each once, in walk order.
    dirs: Vec<u64>,
    /// Directories entered since the bundle's first file's.
    spanned: u64,
}

impl Bundler {
    fn new(params: ChunkerParams) -> Self {
        Bundler {
            small: u64::from(params.min_size),
            target: u64::from(params.avg_size),
            files: Vec::new(),
            bytes: 0,
            dirs: Vec::new(),
            spanned: 0,
        }
    }

    /// Counts a directory the walk enters, whose name may end the bundle before it
    /// (`cut`); whether the bundle must be sent first.
    fn enter_dir(&mut self, cut: bool) -> bool {
        if self.files.is_empty() {
            return false;
        }
        self.spanned += 1;
        self.spanned >= MAX_BUNDLE_DIRS || (cut && self.spanned >= MIN_CUT_DIRS)
    }

    /// Whether files of directory `dir` are in the bundle.
    fn holds(&self, dir: u64) -> bool {
        self.dirs.contains(&dir)
    }

    /// Takes a small file of directory `dir`, which may end the bundle after it (`cut`);
    /// returns a bundle ready to be sent.
    fn add(
        &mut self,
        to: ResultSlot,
        path: PathBuf,
        size: u64,
        dir: u64,
        cut: bool,
    ) -> Option<Work> {
        // Ended before twice the target: the file goes to the next bundle.
        let full = (self.bytes + size > 2 * self.target)
            .then(|| self.finish())
            .flatten();
        self.files.push((to, path));
        self.bytes += size;
        if self.dirs.last() != Some(&dir) {
            self.dirs.push(dir);
        }
        let ends = (cut && self.bytes >= self.target) || self.files.len() >= MAX_BUNDLE_FILES;
        if full.is_none() && ends {
            return self.finish();
        }
        full
    }

    /// The bundle being filled, if any.
    fn finish(&mut self) -> Option<Work> {
        self.bytes = 0;
        self.spanned = 0;
        self.dirs.clear();
        if self.files.is_empty() {
            return None;
        }
        Some(Work::Bundle(std::mem::take(&mut self.files)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The remembered answer is the one for the blob asked about: another blob, or one
    /// in a condemned pack, is looked up, and a blob no live pack holds is never
    /// remembered as live.
    #[test]
    fn the_last_live_blob_is_remembered_for_that_blob_only() {
        let entry = |n: u8| crate::pack::PackEntry {
            id: BlobId([n; 32]),
            kind: BlobKind::Data,
            offset: 0,
            length: 1,
            raw_length: 1,
        };
        let (p1, p2, p3) = (PackId([1; 32]), PackId([2; 32]), PackId([3; 32]));
        let mut index = Index::default();
        index.add_pack(p1, &[entry(1)]);
        index.add_pack(p2, &[entry(2)]);
        index.add_pack(p3, &[entry(3)]);
        index.condemn([p3]);
        let mut live = LastLive::default();
        let asked = [1, 1, 2, 1, 3, 3, 4, 2].map(|n| live.pack(&index, &BlobId([n; 32])));
        let expected = [
            Some(p1),
            Some(p1),
            Some(p2),
            Some(p1),
            None,
            None,
            None,
            Some(p2),
        ];
        assert_eq!(asked, expected);
    }

    /// The bundles `Bundler` makes of files (name, size), by name: each file in a
    /// directory of its own named for it if `own_dirs`, else all in one directory.
    fn bundles(files: &[(String, u64)], own_dirs: bool) -> Vec<Vec<String>> {
        let params = ChunkerParams::new(64 << 10, 256 << 10, 1 << 20).unwrap();
        let mut bundler = Bundler::new(params);
        let (results, _rx) = crossbeam_channel::unbounded();
        let mut out = Vec::new();
        let mut take = |work: Option<Work>| {
            if let Some(Work::Bundle(files)) = work {
                out.push(files.iter().map(|(_, p)| p.display().to_string()).collect());
            }
        };
        for (i, (name, size)) in files.iter().enumerate() {
            // The directory's name hashed with a "/" so that a file and its directory cut
            // apart (the real walk hashes the same name the same).
            let dir_cut = blake3::hash(format!("{name}/").as_bytes()).as_bytes()[0];
            if (own_dirs || i == 0) && bundler.enter_dir(dir_cut.is_multiple_of(CUT_ODDS)) {
                take(bundler.finish());
            }
            let dir = if own_dirs { i as u64 } else { 0 };
            let to = ResultSlot {
                results: results.clone(),
                slot: 0,
            };
            let cut = blake3::hash(name.as_bytes()).as_bytes()[0].is_multiple_of(CUT_ODDS);
            take(bundler.add(to, PathBuf::from(name), *size, dir, cut));
        }
        take(bundler.finish());
        out
    }

    fn small_files(n: usize, prefix: &str) -> Vec<(String, u64)> {
        (0..n)
            .map(|i| (format!("{prefix}{i}"), 1000 + (i as u64 * 7919) % 60_000))
            .collect()
    }

    #[test]
    fn bundles_span_directories_up_to_twice_the_average_chunk() {
        let files = small_files(400, "f");
        let sizes: HashMap<&str, u64> = files.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        let made = bundles(&files, true);
        assert!(made.len() < 40, "{} bundles", made.len());
        for b in &made {
            let bytes: u64 = b.iter().map(|n| sizes[n.as_str()]).sum();
            assert!(bytes <= 2 * (256 << 10), "{bytes}");
            assert!(b.len() as u64 <= MAX_BUNDLE_DIRS, "{}", b.len());
        }
        let all: Vec<String> = made.concat();
        assert_eq!(
            all,
            files.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn tiny_files_end_bundles_by_directories_and_empty_ones_by_count() {
        // A file of 100 bytes in each directory: from 16 to 64 directories to a bundle,
        // ended by a directory's name.
        let tiny: Vec<(String, u64)> = (0..2000).map(|i| (format!("t{i}"), 100)).collect();
        let sizes: Vec<u64> = bundles(&tiny, true)
            .iter()
            .map(|b| b.len() as u64)
            .collect();
        let (last, full) = sizes.split_last().unwrap();
        assert!(*last <= MAX_BUNDLE_DIRS);
        assert!(
            full.iter()
                .all(|&n| (MIN_CUT_DIRS..=MAX_BUNDLE_DIRS).contains(&n)),
            "{sizes:?}"
        );
        assert!(full.iter().any(|&n| n < MAX_BUNDLE_DIRS), "{sizes:?}");
        // Empty files of one directory: 4,096 to a bundle.
        let params = ChunkerParams::new(64 << 10, 256 << 10, 1 << 20).unwrap();
        let mut bundler = Bundler::new(params);
        let (results, _rx) = crossbeam_channel::unbounded();
        let mut sent = Vec::new();
        for i in 0..10_000 {
            let to = ResultSlot {
                results: results.clone(),
                slot: i,
            };
            if let Some(Work::Bundle(files)) = bundler.add(to, PathBuf::from("e"), 0, 0, true) {
                sent.push(files.len());
            }
        }
        assert_eq!(sent, [MAX_BUNDLE_FILES, MAX_BUNDLE_FILES]);
    }

    /// Asserts that a file inserted among `files` (after the fifth) changes at most two of
    /// at least `min` bundles: those up to the first end by name after it.
    fn assert_an_insert_changes_few_bundles(files: &[(String, u64)], own_dirs: bool, min: usize) {
        let mut added = files.to_vec();
        added.insert(5, ("new".to_string(), files[5].1));
        let (before, after) = (bundles(files, own_dirs), bundles(&added, own_dirs));
        assert!(after.len() >= min, "{} bundles", after.len());
        let same = after.iter().filter(|b| before.contains(b)).count();
        assert!(
            same + 2 >= after.len(),
            "{same} of {} the same",
            after.len()
        );
    }

    #[test]
    fn a_file_added_changes_the_bundles_only_up_to_the_next_end_by_name() {
        // Files of one size in one directory: bundles ended by size alone would all shift
        // by one file.
        let files: Vec<(String, u64)> = (0..1000).map(|i| (format!("f{i}"), 10_000)).collect();
        assert_an_insert_changes_few_bundles(&files, false, 10);
    }

    #[test]
    fn a_directory_added_changes_the_bundles_only_up_to_the_next_end_by_name() {
        // A tiny file in each directory: bundles ended by counting directories would all
        // shift by one.
        let tiny: Vec<(String, u64)> = (0..2000).map(|i| (format!("t{i}"), 100)).collect();
        assert_an_insert_changes_few_bundles(&tiny, true, 20);
    }

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

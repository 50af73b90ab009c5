//! Filling a restore's files in pack order. The walk (`ops::restore`) hands over files in
//! batches; each batch is planned as a list of packs, in the order the batch first needs
//! them, each with the blobs it needs in offset order. Threads take stretches of those
//! packs (`Stretches`), read each pack's needed blobs with as few reads as neighbours
//! allow, decrypt, decompress and verify each blob once, and write it into every file of
//! the batch that holds it. A file is finished (metadata, verification, rename into place) by the thread
//! that writes its last part. Every file is created, opened and renamed relative to its
//! directory's descriptor (`restore_target::Dir`), never by path.
//!
//! So a pack is read once per batch, front to back, however many files share its blobs,
//! and a remote store gets one request for many neighbouring blobs. A batch holds at most
//! [`BATCH_PARTS`] parts of files, and at most [`BATCHES_WRITTEN`] are written at a time
//! (threads out of reads in one start the next), so memory does not grow with the
//! snapshot.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender};

use crate::error::chain;
use crate::id::{BlobId, PackId};
use crate::index::BlobLocation;
use crate::monitor::Monitor;
use crate::ops::restore::RestoreOptions;
use crate::ops::restore_target::Dir;
use crate::pack::GRID;
use crate::repo::{IdCheck, Repository};
use crate::tree::{ContentRef, Node, NodeKind};

/// A file to write under a temporary name in `dir` (or none) and give `name`.
pub(crate) struct FileJob {
    pub node: Node,
    pub dir: Arc<Dir>,
    pub name: OsString,
    /// Its temporary name's number, which also names it in `in_flight` and `FileDone`.
    pub tmp: TempName,
    /// Where it goes, for messages.
    pub path: PathBuf,
    /// The mode to create it with, and the one to set when it is written (`None`: the
    /// creation mode is right).
    pub create_mode: u32,
    pub chmod: Option<u32>,
}

impl FileJob {
    /// The temporary file's display path.
    pub fn tmp_path(&self) -> PathBuf {
        self.dir.join(&self.tmp.name())
    }
}

/// The temporary name of a file being restored, `.cairn-restore-` and 16 hex digits: a
/// number, so that most files, which never use the name (they are written unnamed),
/// cost no string for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TempName(pub u64);

impl TempName {
    const PREFIX: &'static [u8] = b".cairn-restore-";

    pub fn name(self) -> OsString {
        let mut name = Self::PREFIX.to_vec();
        name.extend_from_slice(format!("{:016x}", self.0).as_bytes());
        OsString::from_vec(name)
    }

    /// The temporary name `name` is, if it is one.
    pub fn parse(name: &[u8]) -> Option<TempName> {
        let hex = name.strip_prefix(Self::PREFIX)?;
        if hex.len() != 16 || !hex.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        let hex = std::str::from_utf8(hex).ok()?;
        u64::from_str_radix(hex, 16).ok().map(TempName)
    }
}

/// A finished file: whether it was verified, or why it was not restored.
pub(crate) struct FileDone {
    pub tmp: TempName,
    pub path: PathBuf,
    pub size: u64,
    pub outcome: Result<bool, String>,
}

/// Parts of files (references into blobs) in a batch. The plan holds a file's node, both
/// its paths and its place in the plan (by the types' sizes, some hundreds of bytes for a
/// file of one part; not measured alone), for up to three batches at a time: two being
/// written ([`BATCHES_WRITTEN`]) and the one the walk is making. Restoring the Linux tree
/// (78,611 files), peak RSS was 75 MiB with batches of 4,096 parts, 101 MiB with 16,384
/// and 111 MiB with 65,536, one batch written at a time; two at a time, 54-61 MiB with
/// 4,096 and 62-71 MiB with 8,192 (57-64 MiB one at a time with 8,192, the size before).
/// Smaller batches read a pack that two batches share twice: 39 pack reads and 217.1 MB
/// for that tree against 28 and 212.5 MB.
pub(crate) const BATCH_PARTS: usize = 4096;

/// Parts in the first batch; each next batch doubles up to [`BATCH_PARTS`]. The first
/// files are written while the walk goes on, and later batches share few packs.
pub(crate) const FIRST_BATCH_PARTS: usize = 1024;

/// Files kept open between the writes of their parts, in all batches being written (files
/// of one part are closed at once); others are opened again for each part.
const OPEN_FILES: usize = 256;

/// Blobs of a pack closer than this are read with one request, the bytes between them
/// read and dropped: cheaper than another request to an object store.
fn max_gap(remote: bool) -> u64 {
    if remote {
        1 << 20
    } else {
        64 << 10
    }
}

/// Longest single read from a pack: the bound on what each thread holds. A local read
/// costs no round trip, and the kernel reads ahead in a file read front to back.
fn max_read(remote: bool) -> u64 {
    if remote {
        4 << 20
    } else {
        1 << 20
    }
}

/// Where the bytes of `blobs` (of one pack, in offset order) start, and how many there
/// are up to the end of the one that ends last.
fn span(blobs: &[BlobPlan]) -> Option<(u64, u64)> {
    let start = u64::from(blobs.first()?.loc.offset);
    let end = blobs
        .iter()
        .map(|b| u64::from(b.loc.offset) + u64::from(b.loc.length))
        .max()?;
    Some((start, end - start))
}

/// The outcome of a file left unfinished because the restore was cancelled: not a
/// problem with that file, and not listed as one.
pub(crate) const INTERRUPTED: &str = "interrupted";

/// What the writers read from the repository's packs.
#[derive(Debug, Default)]
pub(crate) struct PackReads {
    /// Packs read (a pack that two batches need counts twice).
    pub packs: u64,
    /// Bytes read from packs, for all blobs read.
    pub bytes: u64,
    /// Blobs read from another place than the index's, and the packs whose copy of them
    /// was missing or damaged.
    pub elsewhere: u64,
    pub failed_packs: std::collections::BTreeSet<PackId>,
}

impl PackReads {
    fn add(&mut self, other: PackReads) {
        self.packs += other.packs;
        self.bytes += other.bytes;
        self.elsewhere += other.elsewhere;
        self.failed_packs.extend(other.failed_packs);
    }
}

/// Batches being written at a time. A thread out of reads in a batch goes on to the next
/// one while the others write the last reads of the first, instead of waiting for them.
/// Reads are coarse (a bundle of small files is one blob, up to some 1,700 files in one
/// read of the Linux tree): restoring that tree, the first thread out of reads waited
/// 13-530 ms for the last in each of its 12 batches, and a remote store's requests waited
/// with them. The next batch is planned only when a thread needs it, so that most of the
/// time no more plans are held than before. Restores of the Linux tree alternating with
/// the build before, caches dropped: from Garage on loopback 3.36, 3.44, 3.67, 3.87 s
/// against 3.77, 3.86, 3.96, 4.32 s; from a local repository no change measurable on 2
/// cores, which were already about 90% busy (2.56-2.75 s against 2.63-3.14 s).
const BATCHES_WRITTEN: usize = 2;

/// What the writer threads tell `fill` about a batch.
enum Event {
    /// A thread found no read left in it.
    Drained,
    /// The last thread left it, which read this.
    Ended(PackReads),
}

/// Writes every file of every batch that arrives on `batches` with `threads` threads,
/// reporting each on `done`.
pub(crate) fn fill(
    repo: &Repository,
    opts: &RestoreOptions,
    monitor: &dyn Monitor,
    threads: usize,
    batches: Receiver<Vec<FileJob>>,
    done: &Sender<FileDone>,
) -> PackReads {
    let threads = threads.max(1);
    let mut reads = PackReads::default();
    let open_files = AtomicUsize::new(0);
    let (events_tx, events) = crossbeam_channel::unbounded::<Event>();
    std::thread::scope(|s| {
        let workers: Vec<Sender<Arc<Batch>>> = (0..threads)
            .map(|own| {
                let (tx, rx) = crossbeam_channel::unbounded::<Arc<Batch>>();
                let events = events_tx.clone();
                s.spawn(move || {
                    let mut buffers = Buffers::default();
                    // After a panic the thread writes no more, but still leaves every
                    // batch it is given, so that each ends; the panic is raised again
                    // at the end, and the scope passes it on.
                    let mut panicked = None;
                    for batch in rx {
                        if panicked.is_none() {
                            let work = || batch.work(own, &mut buffers);
                            panicked = catch_unwind(AssertUnwindSafe(work)).err();
                        }
                        if panicked.is_some() {
                            batch.poisoned.store(true, Ordering::Relaxed);
                        }
                        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| batch.leave(&events)))
                        {
                            panicked.get_or_insert(panic);
                        }
                    }
                    if let Some(panic) = panicked {
                        resume_unwind(panic);
                    }
                });
                tx
            })
            .collect();
        // Batches not ended, and whether the newest is drained (or there is none).
        let (mut writing, mut drained) = (0, true);
        let mut wait = |writing: &mut usize, drained: &mut bool| match events.recv() {
            Ok(Event::Drained) => *drained = true,
            Ok(Event::Ended(ended)) => {
                reads.add(ended);
                *writing -= 1;
            }
            Err(_) => unreachable!("fill holds a sender"),
        };
        loop {
            while !drained || writing >= BATCHES_WRITTEN {
                wait(&mut writing, &mut drained);
            }
            let Ok(jobs) = batches.recv() else { break };
            let batch = Arc::new(Batch::new(
                repo,
                opts,
                monitor,
                done,
                &open_files,
                jobs,
                threads,
            ));
            (writing, drained) = (writing + 1, false);
            for worker in &workers {
                // A thread gone (only a panic outside `work` and `leave` ends one early)
                // takes no batch: it leaves this one at once.
                if let Err(unsent) = worker.send(Arc::clone(&batch)) {
                    unsent.0.poisoned.store(true, Ordering::Relaxed);
                    unsent.0.leave(&events_tx);
                }
            }
        }
        drop(workers);
        while writing > 0 {
            wait(&mut writing, &mut drained);
        }
    });
    reads
}

/// A batch's reads cut into one stretch of neighbouring reads for each thread, of about
/// equal bytes. A thread takes its own stretch front to back, then the back half of the
/// stretch with the most reads left. So threads mostly write different files and
/// directories at a time: ext4 holds a file's lock for each write into it and a
/// directory's for each name made in it, and threads taking neighbouring reads in turn
/// queued on the one file they all wrote. Each thread also reads its packs front to back,
/// as the kernel reads ahead. The mixed corpus of bench/compare.sh (large files) restored
/// in 1.00-1.09 s against 1.05-1.25 s with reads taken in turn (5 each, alternating,
/// caches dropped), the 2 cores about 85% busy against 70%; the Linux tree as before.
struct Stretches(Mutex<Vec<std::ops::Range<usize>>>);

impl Stretches {
    /// Stretches over reads of these sizes, one for each of `threads` threads (empty ones
    /// where there are fewer reads).
    fn new(sizes: impl ExactSizeIterator<Item = u64>, threads: usize) -> Stretches {
        let sizes: Vec<u64> = sizes.collect();
        let total: u64 = sizes.iter().sum();
        let n = threads.clamp(1, sizes.len().max(1));
        let mut stretches = Vec::with_capacity(n);
        let (mut start, mut bytes) = (0, 0u64);
        for (i, size) in sizes.iter().enumerate() {
            bytes += size;
            // Stretch k ends once it reaches (k + 1) / n of the bytes, leaving at least a
            // read for each stretch after it.
            let k = stretches.len() as u64;
            let left = sizes.len() - (i + 1);
            if stretches.len() + 1 < n
                && (bytes * n as u64 >= total * (k + 1) || left < n - stretches.len())
            {
                stretches.push(start..i + 1);
                start = i + 1;
            }
        }
        stretches.push(start..sizes.len());
        // Threads beyond the reads start with nothing of their own, and take a share of
        // the others'.
        stretches.resize(threads.max(1), sizes.len()..sizes.len());
        Stretches(Mutex::new(stretches))
    }

    /// The next read for the thread of stretch `own`, if any is left.
    fn take(&self, own: usize) -> Option<usize> {
        let mut stretches = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if stretches.get(own)?.is_empty() {
            let (most, left) = stretches
                .iter()
                .enumerate()
                .map(|(i, s)| (i, s.len()))
                .max_by_key(|&(_, len)| len)?;
            if left == 0 {
                return None;
            }
            // The back half, or the last read.
            let from = &mut stretches[most];
            let back = from.end - (left / 2).max(1)..from.end;
            from.end = back.start;
            stretches[own] = back;
        }
        stretches[own].next()
    }
}

/// A writer thread's buffers: the bytes it read from a pack, and a blob decompressed.
#[derive(Default)]
struct Buffers {
    read: Vec<u8>,
    plain: Vec<u8>,
}

/// Buffers up to this size are kept for the next read: a local read of neighbouring
/// blobs (at most 1 MiB) and a default-sized chunk fit. Larger ones (a large chunk read
/// alone) are given back at once, or every thread would keep its largest: peak
/// RSS restoring the mixed corpus rose from 77 to 105-123 MiB when every buffer was kept.
const KEEP_BUFFER: usize = 2 << 20;

impl Buffers {
    fn trim(&mut self) {
        for buffer in [&mut self.read, &mut self.plain] {
            if buffer.capacity() > KEEP_BUFFER {
                *buffer = Vec::new();
            }
        }
    }
}

/// What a writer thread has read of one pack and not yet let go of: `from..to` of pack
/// `pack` (a place in the batch's `packs`).
///
/// A restore reads each pack once. Left in the page cache, the packs' pages push out
/// what the machine is using, and every page read is a fresh one; let go of, they are
/// taken again for the files written. Cold restores of the mixed corpus, release
/// builds in turns (docs/BENCHMARKS.md): 1.31-1.39 s with the pages kept against
/// 0.76-0.86 s let go of 4 MiB behind the reading, 3 s after dropping the cache; 1.48-1.55
/// against 0.70-0.79 s 40 s after, when this VM's host has taken the freed memory back
/// and every fresh page faults there. A scratch build that dropped each range (the
/// trees' too) as soon as it was read took 0.90-1.11 s.
struct Behind {
    pack: usize,
    from: u64,
    to: u64,
}

/// Bytes of a pack a thread lets go of at once: the least it keeps behind its reading.
const LET_GO: u64 = 4 << 20;

/// Where one blob goes: `len` bytes from `from` in the blob to `at` in file `file`.
struct Target {
    file: u32,
    from: u32,
    len: u32,
    at: u64,
}

struct BlobPlan {
    id: BlobId,
    loc: BlobLocation,
    targets: Vec<Target>,
}

struct PackPlan {
    pack: PackId,
    /// In offset order.
    blobs: Vec<BlobPlan>,
}

struct Plan {
    files: Vec<FileState>,
    /// In the order the batch's files first need them.
    packs: Vec<PackPlan>,
}

impl Plan {
    fn new(repo: &Repository, jobs: Vec<FileJob>) -> Plan {
        let mut packs: Vec<PackPlan> = Vec::new();
        let mut pack_of: HashMap<PackId, usize> = HashMap::new();
        let mut blob_of: HashMap<BlobId, (usize, usize)> = HashMap::new();
        let mut files = Vec::with_capacity(jobs.len());
        for (i, job) in jobs.into_iter().enumerate() {
            let (mut at, mut parts, mut error) = (0u64, 0usize, None);
            for part in content(&job.node) {
                let target = Target {
                    file: i as u32,
                    from: part.offset,
                    len: part.len,
                    at,
                };
                at += u64::from(part.len);
                let (p, b) = match blob_of.get(&part.blob) {
                    Some(&pb) => pb,
                    None => {
                        let Some(loc) = repo.index().get(&part.blob) else {
                            error.get_or_insert_with(|| {
                                not_restored(&crate::error::Error::BlobNotInIndex { id: part.blob })
                            });
                            continue;
                        };
                        let p = *pack_of.entry(loc.pack).or_insert_with(|| {
                            packs.push(PackPlan {
                                pack: loc.pack,
                                blobs: Vec::new(),
                            });
                            packs.len() - 1
                        });
                        packs[p].blobs.push(BlobPlan {
                            id: part.blob,
                            loc,
                            targets: Vec::new(),
                        });
                        let pb = (p, packs[p].blobs.len() - 1);
                        blob_of.insert(part.blob, pb);
                        pb
                    }
                };
                packs[p].blobs[b].targets.push(target);
                parts += 1;
            }
            files.push(FileState {
                job,
                remaining: AtomicUsize::new(parts),
                slot: Mutex::new(Slot {
                    error,
                    ..Slot::default()
                }),
            });
        }
        for pack in &mut packs {
            pack.blobs.sort_unstable_by_key(|b| b.loc.offset);
        }
        Plan { files, packs }
    }
}

fn content(node: &Node) -> &[ContentRef] {
    match &node.kind {
        NodeKind::File { content, .. } => content,
        _ => &[],
    }
}

fn not_restored(e: &crate::error::Error) -> String {
    format!("not restored, {}", chain(e))
}

/// A file of the batch as its parts arrive.
struct FileState {
    job: FileJob,
    /// Parts not yet written; the thread that writes the last one finishes the file.
    remaining: AtomicUsize,
    slot: Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    /// The temporary file, while open; shared with the threads writing parts of it.
    file: Option<Arc<File>>,
    created: bool,
    /// The file is unnamed (`O_TMPFILE`): it must stay open until it is linked.
    unnamed: bool,
    /// A named temporary file's device and inode, to know it again when it is opened
    /// again by name (whoever can write into its directory could put another there).
    inode: Option<(u64, u64)>,
    /// The first failure; later parts are not written.
    error: Option<String>,
    /// What was written, for `verify` (see [`part_digest`]).
    digest: [u8; 32],
    /// The end of the last bytes written (zero blocks are skipped): a file that ends
    /// short of its size gets its length set, with no `fstat` to find out.
    end: u64,
}

impl FileState {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        // A panicking writer left the slot as consistent as a failed write would.
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Batch<'a> {
    repo: &'a Repository,
    opts: &'a RestoreOptions,
    monitor: &'a dyn Monitor,
    done: &'a Sender<FileDone>,
    files: Vec<FileState>,
    /// Files open between parts, in every batch being written.
    open_files: &'a AtomicUsize,
    /// Set when the restore is cancelled or the main thread is gone.
    stop: AtomicBool,
    bytes_read: AtomicU64,
    /// For each blob read from another place, the pack of the place that failed.
    elsewhere: Mutex<Vec<PackId>>,
    id_check: IdCheck,
    /// In the order the batch's files first need them.
    packs: Vec<PackPlan>,
    /// The reads, in pack order: a pack's place in `packs` and its blobs that one read
    /// fetches.
    reads: Vec<(usize, std::ops::Range<usize>)>,
    stretches: Stretches,
    /// Whether a thread has left it.
    drained: AtomicBool,
    /// Whether a thread panicked writing it or an earlier batch: the files left
    /// unfinished are the walk's to report, as not restored.
    poisoned: AtomicBool,
    /// Threads that have not left it yet: the last one ends it.
    left: AtomicUsize,
}

impl<'a> Batch<'a> {
    /// Plans `jobs` for `threads` threads, and finishes the files with nothing to write.
    fn new(
        repo: &'a Repository,
        opts: &'a RestoreOptions,
        monitor: &'a dyn Monitor,
        done: &'a Sender<FileDone>,
        open_files: &'a AtomicUsize,
        jobs: Vec<FileJob>,
        threads: usize,
    ) -> Batch<'a> {
        let plan = Plan::new(repo, jobs);
        let remote = repo.storage().is_remote();
        let mut reads = Vec::new();
        for (p, pack) in plan.packs.iter().enumerate() {
            let mut start = 0;
            for run in runs(&pack.blobs, max_gap(remote), max_read(remote)) {
                reads.push((p, start..start + run.len()));
                start += run.len();
            }
        }
        let stretches = Stretches::new(
            reads
                .iter()
                .map(|(p, run)| span(&plan.packs[*p].blobs[run.clone()]).map_or(0, |(_, len)| len)),
            threads,
        );
        let batch = Batch {
            repo,
            opts,
            monitor,
            done,
            files: plan.files,
            open_files,
            stop: AtomicBool::new(false),
            bytes_read: AtomicU64::new(0),
            elsewhere: Mutex::default(),
            // The seal proves a blob's id (format 2 on, the repository's own key);
            // `--verify` hashes every blob all the same.
            id_check: if opts.verify {
                IdCheck::Always
            } else {
                IdCheck::WhereSealDoesNot
            },
            packs: plan.packs,
            reads,
            stretches,
            drained: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            left: AtomicUsize::new(threads),
        };
        // Files whose blobs are all missing from the index, and empty files, have no
        // part to wait for.
        for i in 0..batch.files.len() {
            if batch.files[i].remaining.load(Ordering::Relaxed) == 0 {
                batch.finish(i);
            }
        }
        batch
    }

    /// Takes reads until none is left, writing their blobs: those of stretch `own`
    /// first.
    fn work(&self, own: usize, buffers: &mut Buffers) {
        let mut behind = None;
        loop {
            if self.monitor.cancelled() {
                self.stop.store(true, Ordering::Relaxed);
            }
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            let Some((p, run)) = self.stretches.take(own).and_then(|i| self.reads.get(i)) else {
                break;
            };
            let blobs = &self.packs[*p].blobs[run.clone()];
            self.read_run(self.packs[*p].pack, blobs, buffers);
            if let Some((start, len)) = span(blobs) {
                self.read_behind(&mut behind, *p, start, start + len);
            }
            buffers.trim();
        }
        if let Some(b) = behind {
            self.let_go(&b, b.to);
        }
    }

    /// Notes that this thread has read `start..end` of pack `p`, and lets go of what it
    /// read before, a few megabytes at a time: it reads its stretch in offset order, so
    /// what lies behind its read is done with.
    fn read_behind(&self, behind: &mut Option<Behind>, p: usize, start: u64, end: u64) {
        match behind {
            Some(b) if b.pack == p && (b.from..=b.to + GRID).contains(&start) => {
                b.to = b.to.max(end);
                // The cells before the one this read began in (reads are widened to them).
                let done = start - start % GRID;
                if done >= b.from + LET_GO {
                    self.let_go(b, done);
                    b.from = done;
                }
            }
            _ => {
                if let Some(b) = behind.take() {
                    self.let_go(&b, b.to);
                }
                *behind = Some(Behind {
                    pack: p,
                    from: start,
                    to: end,
                });
            }
        }
    }

    /// Drops what `behind` holds up to `to` from the page cache.
    fn let_go(&self, behind: &Behind, to: u64) {
        let name = self.packs[behind.pack].pack.storage_name();
        self.repo.uncache_pack_range(&name, behind.from, to);
    }

    /// One thread is done with the batch: the first one says so. The last one fails the
    /// files whose parts were not all written (an interrupted restore) and sends what the
    /// batch read, which `fill` waits for.
    fn leave(&self, events: &Sender<Event>) {
        if !self.drained.swap(true, Ordering::AcqRel) {
            let _ = events.send(Event::Drained);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        // After a panic the files are left to the walk, which reports every file not
        // reported as not restored; and the batch ends whatever happens here.
        let unfinished = || {
            if self.poisoned.load(Ordering::Relaxed) {
                return;
            }
            for i in 0..self.files.len() {
                if self.files[i].remaining.swap(0, Ordering::AcqRel) > 0 {
                    self.fail(i, INTERRUPTED.into());
                    self.finish(i);
                }
            }
        };
        let failed_unfinished = catch_unwind(AssertUnwindSafe(unfinished));
        let failed = std::mem::take(&mut *self.elsewhere.lock().unwrap_or_else(|p| p.into_inner()));
        let _ = events.send(Event::Ended(PackReads {
            packs: self.packs.len() as u64,
            bytes: self.bytes_read.load(Ordering::Relaxed),
            elsewhere: failed.len() as u64,
            failed_packs: failed.into_iter().collect(),
        }));
        if let Err(panic) = failed_unfinished {
            resume_unwind(panic);
        }
    }

    /// Reads blobs that lie close together in one pack with one request, and writes each.
    fn read_run(&self, pack: PackId, blobs: &[BlobPlan], buffers: &mut Buffers) {
        let (Some(first), Some((start, len))) = (blobs.first(), span(blobs)) else {
            return;
        };
        let read =
            self.repo
                .read_pack_range_into(&pack.storage_name(), start, len, &mut buffers.read);
        let lead = match read {
            Ok(lead) => {
                let read = buffers.read.len() as u64;
                self.bytes_read.fetch_add(read, Ordering::Relaxed);
                lead
            }
            // A pack cut short or damaged in one place still holds other blobs whole:
            // read them one at a time, and each fails or not on its own.
            Err(_) if blobs.len() > 1 => {
                for blob in blobs {
                    self.read_run(pack, std::slice::from_ref(blob), buffers);
                }
                return;
            }
            Err(e) => {
                let e = crate::error::Error::from(e);
                self.write_from_elsewhere(first, &not_restored(&e));
                return;
            }
        };
        for blob in blobs {
            let at = lead + (u64::from(blob.loc.offset) - start) as usize;
            let sealed = &mut buffers.read[at..at + blob.loc.length as usize];
            let plain = self
                .repo
                .open_blob_in_place(
                    &blob.id,
                    &blob.loc,
                    sealed,
                    self.id_check,
                    Some(&mut buffers.plain),
                )
                .map_err(|e| not_restored(&e));
            match plain {
                Ok(plain) => self.write_blob(blob, Ok(&plain)),
                Err(e) => self.write_from_elsewhere(blob, &e),
            }
        }
    }

    /// Writes a blob whose place in the index failed (`error`) from another place that
    /// holds it, if one does and it is whole; else the failure.
    fn write_from_elsewhere(&self, blob: &BlobPlan, error: &str) {
        match self.repo.read_blob_elsewhere(&blob.id) {
            Some(plain) => {
                let mut failed = self.elsewhere.lock().unwrap_or_else(|p| p.into_inner());
                failed.push(blob.loc.pack);
                drop(failed);
                self.write_blob(blob, Ok(&plain));
            }
            None => self.write_blob(blob, Err(error)),
        }
    }

    /// Writes a blob's plaintext (or its failure) to every place the batch needs it.
    fn write_blob(&self, blob: &BlobPlan, plain: Result<&[u8], &str>) {
        for t in &blob.targets {
            let file = t.file as usize;
            let data = match &plain {
                Ok(plain) => plain
                    .get(t.from as usize..(t.from as usize + t.len as usize))
                    .ok_or_else(|| format!("content reference outside blob {}", blob.id)),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = data.and_then(|data| self.write_part(file, t.at, data)) {
                self.fail(file, e);
            }
            // Counted down only once written: the thread that writes the last part
            // finishes the file.
            if self.files[file].remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.finish(file);
            }
        }
    }

    fn write_part(&self, i: usize, at: u64, data: &[u8]) -> Result<(), String> {
        let state = &self.files[i];
        let file = {
            let mut slot = state.lock();
            if slot.error.is_some() {
                return Ok(());
            }
            if slot.file.is_none() {
                let created = slot.created;
                let (file, unnamed) =
                    open_part_file(&state.job, &mut slot.inode, created, self.opts.verify)?;
                slot.created = true;
                slot.unnamed = unnamed;
                slot.file = Some(Arc::new(file));
                self.open_files.fetch_add(1, Ordering::Relaxed);
            }
            let Some(file) = slot.file.as_ref() else {
                unreachable!("opened above")
            };
            Arc::clone(file)
        };
        // Outside the lock: the threads write their ranges of one large file at once
        // (pwrite at distinct offsets), not in turn.
        let end = write_sparse_at(&file, data, at).map_err(|e| e.to_string())?;
        drop(file);
        let mut slot = state.lock();
        slot.end = slot.end.max(end);
        // Hashing costs a tenth of a restore's CPU time: only for `verify`.
        if self.opts.verify {
            xor_into(&mut slot.digest, &part_digest(at, data));
        }
        self.monitor.bytes_done(data.len() as u64);
        // Open for the next part only while few files are; the last part's writer keeps
        // it open to finish it.
        let last = state.remaining.load(Ordering::Relaxed) <= 1;
        if !last && !slot.unnamed && self.open_files.load(Ordering::Relaxed) > OPEN_FILES {
            slot.file = None;
            self.open_files.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Records the first failure of file `i`.
    fn fail(&self, i: usize, error: String) {
        self.files[i].lock().error.get_or_insert(error);
    }

    /// Completes file `i` (all its parts are written or failed) and reports it.
    fn finish(&self, i: usize) {
        let state = &self.files[i];
        let (file, created, error, digest, end, mut inode) = {
            let mut slot = state.lock();
            let file = slot.file.take();
            if file.is_some() {
                self.open_files.fetch_sub(1, Ordering::Relaxed);
            }
            // Every part is written, so every other handle is gone (were one not, a
            // second descriptor of the same open file does as well).
            let file = file.map(|f| {
                let file = Arc::try_unwrap(f).or_else(|shared| shared.try_clone());
                file.map(|f| (f, slot.unnamed)).map_err(|e| e.to_string())
            });
            (
                file,
                slot.created,
                slot.error.take(),
                slot.digest,
                slot.end,
                slot.inode,
            )
        };
        let job = &state.job;
        let outcome = match error {
            Some(e) => {
                drop(file);
                if created {
                    let _ = job.dir.remove_file(&job.tmp.name());
                }
                Err(e)
            }
            // Closed after its last part to keep few files open, or never opened (empty).
            None => match file
                .unwrap_or_else(|| open_part_file(job, &mut inode, created, self.opts.verify))
            {
                Ok((file, unnamed)) => complete(file, unnamed, job, self.opts, &digest, end),
                Err(e) => Err(e),
            },
        };
        let done = FileDone {
            tmp: job.tmp,
            path: job.path.clone(),
            size: match job.node.kind {
                NodeKind::File { size, .. } => size,
                _ => 0,
            },
            outcome,
        };
        if self.done.send(done).is_err() {
            self.stop.store(true, Ordering::Relaxed);
        }
    }
}

/// Finishes a written temporary file: length (a trailing hole), metadata with the mtime
/// last, verification against `digest`, and its name (linked if the file is unnamed,
/// else renamed into place). On failure a temporary file is removed.
///
/// System calls per file of one part, counted with `strace -c -f` on a release build
/// restoring 5,000 small files in 50 directories as root: 11 on main before restore
/// worked through directory descriptors (1faf43e: three `lstat`s of the final name and an
/// `fstat` for the length, `openat`, `pwrite64`, `fchown`, `fchmod`, `utimensat`,
/// `close`, `rename`; 56,458 calls in all), 6 now (`openat(O_TMPFILE)`, `pwrite64`,
/// `fchown`, `utimensat`, `linkat`, `close`; 31,589 in all; one fewer without root, no
/// `fchown`). No `lstat` in a directory this restore made (nothing else can be there),
/// the length known from the writes, the mode given at creation where that is safe
/// (`restore::creation_mode`). Timed in one run with the binaries interleaved
/// (release builds, warm repository, this shared 2-core VM): 5,000 small files, 8
/// restores each, system time 2.67 s -> 1.56 s and wall time 5.81 s -> 4.36 s in sum; a
/// second set just after a large deletion 11.00 -> 8.99 s system, 16.34 -> 13.26 s wall,
/// where a temporary name and `renameat` instead of O_TMPFILE gave 11.20 and 16.49 s
/// (no better than before: the unnamed file is what pays). Linux 6.1 tree (78,611
/// files), two restores each: system 4.30/4.43 s -> 3.28/3.29 s in one run, 4.58/5.77 s
/// -> 4.67/4.52 s in another; wall time there is the kernel's write path and the VM's
/// noise (3.52-5.91 s before, 3.25-6.14 s after), not measurably changed.
///
/// Writing under the final name with `O_EXCL` would save the link too, but a restore killed mid-file would leave a partial file under the final
/// name, which a later `--overwrite never`, or `if-newer` (its mtime is recent), would
/// keep as if complete: a file gets its name only when complete.
fn complete(
    file: File,
    unnamed: bool,
    job: &FileJob,
    opts: &RestoreOptions,
    digest: &[u8; 32],
    end: u64,
) -> Result<bool, String> {
    let result = (|| {
        let NodeKind::File { size, .. } = &job.node.kind else {
            return Err("not a regular file".to_string());
        };
        let written: u64 = content(&job.node).iter().map(|c| u64::from(c.len)).sum();
        if written != *size {
            return Err(format!(
                "snapshot says {} has {size} bytes but its chunks hold {written}",
                job.path.display()
            ));
        }
        // Zero blocks were skipped: a file that ends in one needs its length set.
        if end != *size {
            file.set_len(*size).map_err(|e| e.to_string())?;
        }
        let apply = crate::fsmeta::ApplyOptions {
            owners: opts.owners,
            mode: job.chmod,
            // The file is new: made by this restore, under a temporary name or none.
            owner: job.dir.new_file_owner(),
            no_capabilities: opts.no_setuid,
            inode: None,
        };
        crate::fsmeta::apply_to_fd(file.as_fd(), &job.node, apply)
            .map_err(|e| format!("metadata not restored: {e}"))?;
        if opts.verify {
            verify(&file, content(&job.node), digest)
                .map_err(|e| format!("verification failed: {e}"))?;
        }
        // Only now, with the new file complete, does it get its name. An unnamed file
        // is linked where nothing is; over an existing entry it is linked under the
        // temporary name and renamed like a named one.
        if unnamed {
            match job.dir.link_file(file.as_fd(), &job.name) {
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => job
                    .dir
                    .link_file(file.as_fd(), &job.tmp.name())
                    .map_err(|e| e.to_string())?,
                r => return r.map(|()| opts.verify).map_err(|e| e.to_string()),
            }
        }
        drop(file);
        // rename replaces a file or symlink atomically; a directory must go first.
        let tmp = job.tmp.name();
        match job.dir.rename(&tmp, &job.name) {
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EISDIR | libc::ENOTEMPTY | libc::EEXIST)
                ) =>
            {
                job.dir
                    .remove_all(&job.name)
                    .and_then(|()| job.dir.rename(&tmp, &job.name))
                    .map_err(|e| e.to_string())?
            }
            r => r.map_err(|e| e.to_string())?,
        }
        Ok(opts.verify)
    })();
    if result.is_err() {
        let _ = job.dir.remove_file(&job.tmp.name());
    }
    result
}

/// Opens the job's temporary file, for reading too with `verify` (it is read back
/// before it is named); `create`: it must not exist yet. Never follows a symlink. A new
/// file of at most one part, which is written at once and never closed before it is
/// complete, is unnamed (`O_TMPFILE`) where the file system allows; returns whether it
/// is.
fn open_tmp(job: &FileJob, create: bool, verify: bool) -> Result<(File, bool), String> {
    use rustix::fs::OFlags;
    let mut flags = if verify { OFlags::RDWR } else { OFlags::WRONLY };
    if create && content(&job.node).len() <= 1 {
        match job.dir.unnamed_file(flags, job.create_mode) {
            Ok(Some(fd)) => return Ok((File::from(fd), true)),
            Ok(None) => {}
            Err(e) => {
                return Err(format!(
                    "cannot create a file in {}: {e}",
                    job.dir.path.display()
                ))
            }
        }
    }
    if create {
        flags |= OFlags::CREATE | OFlags::EXCL;
    }
    match job.dir.open_file(&job.tmp.name(), flags, job.create_mode) {
        Ok(fd) => Ok((File::from(fd), false)),
        Err(e) => {
            let verb = if create { "create" } else { "open" };
            Err(format!("cannot {verb} {}: {e}", job.tmp_path().display()))
        }
    }
}

/// Opens the job's temporary file for a part: creates it (`created` false), noting the
/// inode of a named one in `inode`, or opens it again by name and checks that it is that
/// inode still.
fn open_part_file(
    job: &FileJob,
    inode: &mut Option<(u64, u64)>,
    created: bool,
    verify: bool,
) -> Result<(File, bool), String> {
    let (file, unnamed) = open_tmp(job, !created, verify)?;
    if unnamed {
        return Ok((file, unnamed));
    }
    let st = rustix::fs::fstat(&file).map_err(|e| e.to_string())?;
    match *inode {
        None => *inode = Some((st.st_dev, st.st_ino)),
        Some(known) if known != (st.st_dev, st.st_ino) => {
            return Err(format!(
                "its temporary file {} was replaced by another during the restore",
                job.tmp_path().display()
            ))
        }
        Some(_) => {}
    }
    Ok((file, unnamed))
}

/// Consecutive blobs of a pack (in offset order) that one read should fetch: gaps of at
/// most `gap` bytes, at most `max` bytes in all (a larger blob is read alone).
fn runs(blobs: &[BlobPlan], gap: u64, max: u64) -> impl Iterator<Item = &[BlobPlan]> {
    let mut rest = blobs;
    std::iter::from_fn(move || {
        let first = rest.first()?;
        let start = u64::from(first.loc.offset);
        let mut end = start + u64::from(first.loc.length);
        let mut n = 1;
        while let Some(next) = rest.get(n) {
            let (offset, next_end) = (
                u64::from(next.loc.offset),
                u64::from(next.loc.offset) + u64::from(next.loc.length),
            );
            if offset > end + gap || next_end - start > max {
                break;
            }
            end = end.max(next_end);
            n += 1;
        }
        let (run, tail) = rest.split_at(n);
        rest = tail;
        Some(run)
    })
}

/// Blocks of zeros this long are restored as holes (a file system block).
const SPARSE_BLOCK: usize = 4096;

/// Writes `data` at `at`, leaving out the blocks that are all zeros so that the file
/// system leaves holes there (the file is created empty; `complete` sets its length).
/// Returns the end of the last bytes written (`at` if none were).
pub(crate) fn write_sparse_at(file: &File, data: &[u8], at: u64) -> io::Result<u64> {
    let mut written_end = at;
    let mut start = 0;
    while start < data.len() {
        let block = |from: usize| &data[from..(from + SPARSE_BLOCK).min(data.len())];
        let zero = is_zeros(block(start));
        let mut end = start + block(start).len();
        while end < data.len() && is_zeros(block(end)) == zero {
            end += block(end).len();
        }
        if !zero {
            file.write_all_at(&data[start..end], at + start as u64)?;
            written_end = at + end as u64;
        }
        start = end;
    }
    Ok(written_end)
}

/// Whether `data` is all zero bytes. Folding fixed-size blocks lets the compiler
/// vectorize; a byte-by-byte `all` with its early exit does not.
fn is_zeros(data: &[u8]) -> bool {
    let mut blocks = data.chunks_exact(64);
    blocks.all(|b| b.iter().fold(0u8, |acc, &x| acc | x) == 0)
        && blocks.remainder().iter().all(|&x| x == 0)
}

/// A digest of one part of a file: its position and bytes. The parts of a file arrive in
/// any order; XOR of their digests (see [`xor_into`]) describes the whole file whatever
/// the order, and `verify` computes the same from the file on disk.
pub(crate) fn part_digest(at: u64, data: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&at.to_le_bytes());
    h.update(data);
    *h.finalize().as_bytes()
}

pub(crate) fn xor_into(acc: &mut [u8; 32], digest: &[u8; 32]) {
    for (a, d) in acc.iter_mut().zip(digest) {
        *a ^= d;
    }
}

/// Re-reads `file` part by part and checks it against `expected`, the digest of what was
/// written.
fn verify(file: &File, content: &[ContentRef], expected: &[u8; 32]) -> io::Result<()> {
    let mut digest = [0u8; 32];
    let mut buf = Vec::new();
    let mut at = 0u64;
    for part in content {
        buf.resize(part.len as usize, 0);
        file.read_exact_at(&mut buf, at)?;
        xor_into(&mut digest, &part_digest(at, &buf));
        at += u64::from(part.len);
    }
    let mut extra = [0u8; 1];
    if digest != *expected || file.read_at(&mut extra, at)? != 0 {
        return Err(io::Error::other(
            "the file on disk differs from what was written",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    fn blob(offset: u32, length: u32) -> BlobPlan {
        BlobPlan {
            id: BlobId([offset as u8; 32]),
            loc: BlobLocation {
                pack: PackId([0; 32]),
                kind: crate::pack::BlobKind::Data,
                offset,
                length,
                raw_length: length,
            },
            targets: Vec::new(),
        }
    }

    #[test]
    fn neighbouring_blobs_are_read_together_up_to_the_limits() {
        let blobs = [
            blob(0, 100),
            blob(100, 100),
            // A gap of 1,000 bytes: within 64 KiB.
            blob(1_200, 100),
            // A gap of 100 KiB: a new read.
            blob(103_700, 100),
            // Would make the read longer than 4 MiB.
            blob(103_800, 4 << 20),
        ];
        let lens: Vec<usize> = runs(&blobs, 64 << 10, 4 << 20)
            .map(<[BlobPlan]>::len)
            .collect();
        assert_eq!(lens, [3, 1, 1]);
        let lens: Vec<usize> = runs(&blobs, 1 << 20, 4 << 20)
            .map(<[BlobPlan]>::len)
            .collect();
        assert_eq!(lens, [4, 1]);
        assert_eq!(runs(&[], 0, 0).count(), 0);
    }

    #[test]
    fn a_span_reaches_the_end_of_the_blob_that_ends_last() {
        assert_eq!(span(&[blob(100, 50), blob(200, 10)]), Some((100, 110)));
        // An index may say anything: an earlier blob that ends later still fits.
        assert_eq!(span(&[blob(100, 500), blob(200, 10)]), Some((100, 500)));
        assert_eq!(span(&[]), None);
    }

    #[test]
    fn temporary_names_read_back_as_their_numbers_and_nothing_else_does() {
        for n in [0, 1, 0xdead_beef, u64::MAX] {
            let name = TempName(n).name();
            assert_eq!(name.len(), 31);
            assert_eq!(TempName::parse(name.as_bytes()), Some(TempName(n)));
        }
        for name in [
            &b".cairn-restore-0123456789abcde"[..],
            b".cairn-restore-0123456789abcdef0",
            b".cairn-restore-0123456789abcdeg",
            b".cairn-restore-+123456789abcdef",
            b"cairn-restore-0123456789abcdef",
            b"x.cairn-restore-0123456789abcdef",
        ] {
            assert_eq!(TempName::parse(name), None, "{}", name.escape_ascii());
        }
    }

    #[test]
    fn the_digest_of_a_file_does_not_depend_on_the_order_of_its_parts() {
        let (a, b) = (part_digest(0, b"hello "), part_digest(6, b"world"));
        let (mut one, mut two) = ([0u8; 32], [0u8; 32]);
        xor_into(&mut one, &a);
        xor_into(&mut one, &b);
        xor_into(&mut two, &b);
        xor_into(&mut two, &a);
        assert_eq!(one, two);
        // The same bytes elsewhere are another file.
        let mut moved = [0u8; 32];
        xor_into(&mut moved, &part_digest(0, b"world"));
        xor_into(&mut moved, &part_digest(5, b"hello "));
        assert_ne!(one, moved);
    }

    #[test]
    fn zero_blocks_are_left_as_holes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        let mut data = vec![0u8; 3 * SPARSE_BLOCK];
        data[SPARSE_BLOCK + 7] = 1;
        let end = write_sparse_at(&file, &data, 8192).unwrap();
        assert_eq!(end, 8192 + 2 * SPARSE_BLOCK as u64);
        // The last block was zeros and not written: the file ends at the second block.
        assert_eq!(
            file.metadata().unwrap().len(),
            8192 + 2 * SPARSE_BLOCK as u64
        );
        let mut back = vec![9u8; 2 * SPARSE_BLOCK];
        file.read_exact_at(&mut back, 8192).unwrap();
        assert_eq!(back, data[..2 * SPARSE_BLOCK]);
    }

    fn ranges(stretches: &Stretches) -> Vec<std::ops::Range<usize>> {
        stretches.0.lock().unwrap().clone()
    }

    #[test]
    fn stretches_hold_about_equal_bytes_and_every_thread_gets_one() {
        let sizes = [1u64, 1, 1, 1, 10, 1, 1, 1, 1, 2];
        assert_eq!(ranges(&Stretches::new(sizes.into_iter(), 2)), [0..5, 5..10]);
        // One read larger than a stretch's share still leaves a read for each thread.
        assert_eq!(
            ranges(&Stretches::new([100u64, 1, 1, 1].into_iter(), 3)),
            [0..1, 1..2, 2..4]
        );
        // More threads than reads: a stretch for each read, and empty ones.
        let two = Stretches::new([5u64, 5].into_iter(), 4);
        assert_eq!(ranges(&two), [0..1, 1..2, 2..2, 2..2]);
        // A thread with nothing of its own takes from the others.
        assert_eq!(two.take(3), Some(1));
        assert_eq!(ranges(&two), [0..1, 1..1, 2..2, 2..2]);
        let none = ranges(&Stretches::new([0u64; 0].into_iter(), 4));
        assert!(none.len() == 4 && none.iter().all(|r| r.is_empty()));
    }

    #[test]
    fn a_thread_done_with_its_stretch_takes_the_back_half_of_the_longest() {
        let stretches = Stretches::new([1u64; 12].into_iter(), 3);
        assert_eq!(ranges(&stretches), [0..4, 4..8, 8..12]);
        let mut taken = Vec::new();
        for _ in 0..4 {
            taken.extend(stretches.take(0));
        }
        assert_eq!(taken, [0, 1, 2, 3]);
        taken.extend(stretches.take(2));
        // Thread 0 is done with its own: it takes the back half of thread 1's (4..8),
        // the longest left, and thread 1 keeps the front.
        let stolen = stretches.take(0);
        assert_eq!(stolen, Some(6));
        taken.extend(stolen);
        assert_eq!(ranges(&stretches), [7..8, 4..6, 9..12]);
        // Every read is taken once, whoever takes it.
        for own in (0..3).cycle().take(40) {
            taken.extend(stretches.take(own));
        }
        taken.sort_unstable();
        assert_eq!(taken, (0..12).collect::<Vec<_>>());
        assert_eq!(stretches.take(1), None);
    }
}

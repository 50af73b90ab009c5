//! The floor under a restore: create a tree's directories, files and symbolic links with
//! every core, doing nothing else. It lists SOURCE first (not timed), then creates the
//! same tree under TARGET (which must not exist) and prints how long that took, in wall
//! and CPU time. Each file gets as many bytes as the source file has, copied from one
//! small buffer that stays in the processor's cache, as a restore writes each blob just
//! after decompressing it (bytes read from a 1.3 GB copy of the tree in memory made the
//! kernel's copy 2.6 times as costly, `perf`, and the "floor" slower than a restore).
//! Files are created relative to their directory with `O_CREAT|O_EXCL`, written and
//! closed: no metadata, no temporary names, no decompression, no fsync.
//!
//! `bench/compare.sh` prints it beside the restores: the part of a restore's time that
//! is the kernel creating files and taking their bytes into the page cache.
//!
//! With `--unnamed`, each file is created unnamed (`O_TMPFILE`) and linked into place
//! once written (`linkat` with `AT_EMPTY_PATH`), as restore writes a file of one part so
//! that a killed restore leaves no partial file: what that costs over `O_CREAT`.
//!
//! With `--pieces PIECES`, the bytes come from the source files themselves, as a
//! repository keeps them: `writefloor --store PIECES SOURCE` bundles the small files of
//! each directory in 1 MiB pieces and cuts larger ones in 1 MiB pieces, compresses each
//! with zstd at level 3 where that makes it smaller (cairn's defaults) and writes them to
//! files of up to 16 MiB in the new directory PIECES, with PIECES/index listing them.
//! Timed: each piece read back, decompressed and written, blocks of zeros left as holes,
//! as a restore does. With `--unnamed` too, it is a plain restore that keeps both the
//! guarantee and the repository's size, without decryption, index, planning or
//! metadata. The pieces are stored in a run of their own so that the timed run starts,
//! as a restore does, with the page cache dropped by the caller. (It is not a strict
//! floor: on the mixed corpus of bench/corpus.py cairn's restore took 0.8-1.5 s, 1.1-2.5
//! CPU s, against its 0.9-1.2 s, 1.4-1.7 CPU s, in turns, caches dropped; on the Linux
//! tree 2.4-2.7 s against 1.9-2.1 s.)
//!
//! usage: cargo run --release -p cairn-core --example writefloor -- [--unnamed] [--pieces PIECES] SOURCE TARGET
//!        cargo run --release -p cairn-core --example writefloor -- --store PIECES SOURCE

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use rustix::fs::{AtFlags, Mode, OFlags};

#[path = "shared/cpu.rs"]
mod cpu;
use cpu::cpu_time;

enum Item {
    /// A regular file of this many bytes.
    File(u64),
    Link(PathBuf),
}

/// Bytes written at a time: a blob's size, small enough to stay in the cache.
const PIECE: usize = 256 << 10;

/// With `--store`: files below this size are bundled (cairn's smallest chunk), and pieces
/// end once they hold this much (its average chunk).
const SMALL: usize = 512 << 10;
const STORED_PIECE: usize = 1 << 20;

/// Where a piece is (file `pack` of the pieces directory), and how: zstd level 3 where
/// that is smaller, else raw.
struct Stored {
    pack: u32,
    offset: u64,
    len: usize,
    plain_len: usize,
    zstd: bool,
}

/// A piece packed in memory: its plain length, whether compressed, and its bytes.
type Packed = (usize, bool, Vec<u8>);

/// One piece as a repository keeps it: whether compressed, and the bytes.
fn pack(plain: &[u8]) -> std::io::Result<(bool, Vec<u8>)> {
    let packed = zstd::bulk::compress(plain, 3)?;
    Ok(if packed.len() < plain.len() {
        (true, packed)
    } else {
        (false, plain.to_vec())
    })
}

/// The pieces of one directory's files, in the order of its items, with their plain
/// lengths: each file's bytes lie in one bundle or in pieces of their own.
fn pack_dir(root: &Path, (dir, items): &Dir) -> std::io::Result<Vec<Packed>> {
    let mut pieces = Vec::new();
    let mut bundle = Vec::new();
    let mut add = |plain: &[u8]| -> std::io::Result<()> {
        let (zstd, bytes) = pack(plain)?;
        pieces.push((plain.len(), zstd, bytes));
        Ok(())
    };
    for (name, item) in items {
        let Item::File(len) = item else { continue };
        let path = root.join(dir).join(name);
        let data = fs::read(&path)?;
        if data.len() as u64 != *len {
            return Err(std::io::Error::other(format!("{} changed", path.display())));
        }
        if data.len() < SMALL {
            bundle.extend_from_slice(&data);
            if bundle.len() >= STORED_PIECE {
                add(&std::mem::take(&mut bundle))?;
            }
            continue;
        }
        if !bundle.is_empty() {
            add(&std::mem::take(&mut bundle))?;
        }
        for piece in data.chunks(STORED_PIECE) {
            add(piece)?;
        }
    }
    if !bundle.is_empty() {
        add(&bundle)?;
    }
    Ok(pieces)
}

/// Pieces files hold up to this much, as cairn's packs do.
const PACK: u64 = 16 << 20;

/// `--store PIECES`: packs every directory's files (on every core) and writes the pieces
/// in the order of the directories to new files PIECES/0, PIECES/1, ... of up to 16 MiB,
/// as a local repository's packs, with PIECES/index listing them (a line per piece:
/// directory number, file number, offset, length, plain length, 1 if zstd).
fn store(root: &Path, dirs: &[Dir], order: &[usize], path: &Path) -> std::io::Result<()> {
    let packed: Vec<std::sync::OnceLock<Vec<Packed>>> =
        dirs.iter().map(|_| std::sync::OnceLock::new()).collect();
    let failed = on_every_core(order, |i| match pack_dir(root, &dirs[i]) {
        Ok(pieces) => packed[i].set(pieces).is_ok(),
        Err(err) => {
            eprintln!("writefloor: reading in {}: {err}", dirs[i].0.display());
            false
        }
    });
    if failed > 0 {
        let failed = format!("{failed} directories not read");
        return Err(std::io::Error::other(failed));
    }
    fs::create_dir(path)?;
    let (mut pack, mut offset, mut file) = (0, 0, File::create(path.join("0"))?);
    let mut index = String::new();
    for (i, pieces) in packed.iter().enumerate() {
        for (plain_len, zstd, bytes) in pieces.get().into_iter().flatten() {
            if offset > 0 && offset + bytes.len() as u64 > PACK {
                file.sync_all()?;
                (pack, offset) = (pack + 1, 0);
                file = File::create(path.join(pack.to_string()))?;
            }
            file.write_all(bytes)?;
            let zstd = u8::from(*zstd);
            index += &format!("{i} {pack} {offset} {} {plain_len} {zstd}\n", bytes.len());
            offset += bytes.len() as u64;
        }
    }
    file.sync_all()?;
    fs::write(path.join("index"), index)?;
    File::open(path.join("index"))?.sync_all()?;
    File::open(path)?.sync_all()
}

/// `--pieces PIECES`: the pieces of each directory, from PIECES/index; checked against
/// the tree listed, so that pieces stored from another tree are refused.
fn load_pieces(dirs: &[Dir], path: &Path) -> std::io::Result<Vec<Vec<Stored>>> {
    let index = path.join("index");
    let bad = |what: &str| {
        std::io::Error::other(format!(
            "{}: {what}; store the pieces of this tree again (--store)",
            index.display()
        ))
    };
    let mut pieces: Vec<Vec<Stored>> = dirs.iter().map(|_| Vec::new()).collect();
    for line in fs::read_to_string(&index)?.lines() {
        let fields: Vec<u64> = line
            .split(' ')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| bad("a line is not six numbers"))?;
        let [dir, pack, offset, len, plain_len, zstd] = fields[..] else {
            return Err(bad("a line is not six numbers"));
        };
        pieces
            .get_mut(dir as usize)
            .ok_or_else(|| bad("more directories than the tree has"))?
            .push(Stored {
                pack: u32::try_from(pack).map_err(|_| bad("a file number out of range"))?,
                offset,
                len: len as usize,
                plain_len: plain_len as usize,
                zstd: zstd == 1,
            });
    }
    for ((dir, items), stored) in dirs.iter().zip(&pieces) {
        if stored.iter().map(|p| p.plain_len as u64).sum::<u64>() != bytes_in(items) {
            return Err(bad(&format!("{} holds other bytes", dir.display())));
        }
    }
    Ok(pieces)
}

/// A thread's buffers for stored pieces, kept from one directory to the next as a
/// restore's are: what was read, and what it decompressed to.
struct Buffers {
    /// The pieces directory, and the file of it last read.
    dir: PathBuf,
    open: Option<(u32, File)>,
    zstd: zstd::bulk::Decompressor<'static>,
    read: Vec<u8>,
    plain: Vec<u8>,
}

/// Where the bytes written come from: one cache-hot buffer, or a directory's stored
/// pieces, each read (and decompressed) when the one before is used up.
enum Source<'a> {
    Hot(&'a [u8]),
    Stored {
        pieces: std::slice::Iter<'a, Stored>,
        buffers: &'a mut Buffers,
        /// Whether the piece being written is raw (in `read`); else it is in `plain`.
        raw: bool,
        /// Where the rest of a raw piece is in the file, and how much of it is left.
        raw_next: (u64, usize),
        at: usize,
    },
}

/// A raw piece is read this much at a time and written before the next read. Read whole
/// (1 MiB, this machine's L2 cache), the mixed corpus took 2.1-2.2 s (3.1-3.6 CPU s)
/// against 1.0-1.2 s (1.3-1.5 CPU s) with pieces stored 256 KiB each, in turns, caches
/// dropped: the kernel's copies into and out of the buffer cost three times as much
/// (`perf`).
const RAW_READ: usize = 256 << 10;

impl Source<'_> {
    /// The next bytes, at most `max`.
    fn take(&mut self, max: u64) -> std::io::Result<&[u8]> {
        match self {
            Source::Hot(piece) => Ok(&piece[..max.min(piece.len() as u64) as usize]),
            Source::Stored {
                pieces,
                buffers,
                raw,
                raw_next,
                at,
            } => {
                let Buffers {
                    dir,
                    open,
                    zstd,
                    read,
                    plain,
                } = &mut **buffers;
                if *at == if *raw { read.len() } else { plain.len() } {
                    if raw_next.1 == 0 {
                        let piece = pieces
                            .next()
                            .ok_or_else(|| std::io::Error::other("stored pieces end early"))?;
                        if open.as_ref().is_none_or(|(pack, _)| *pack != piece.pack) {
                            let file = File::open(dir.join(piece.pack.to_string()))?;
                            *open = Some((piece.pack, file));
                        }
                        *raw = !piece.zstd;
                        *raw_next = (piece.offset, piece.len);
                        let Some((_, file)) = open.as_ref() else {
                            unreachable!("opened above")
                        };
                        if piece.zstd {
                            read.resize(piece.len, 0);
                            file.read_exact_at(read, piece.offset)?;
                            plain.clear();
                            plain.reserve(piece.plain_len);
                            zstd.decompress_to_buffer(&read[..], plain)?;
                            *raw_next = (0, 0);
                        }
                    }
                    if *raw {
                        let (offset, left) = *raw_next;
                        let Some((_, file)) = open.as_ref() else {
                            unreachable!("opened with the piece")
                        };
                        read.resize(left.min(RAW_READ), 0);
                        file.read_exact_at(read, offset)?;
                        *raw_next = (offset + read.len() as u64, left - read.len());
                    }
                    *at = 0;
                }
                let current = if *raw { &read[..] } else { &plain[..] };
                let n = (current.len() - *at).min(max as usize);
                *at += n;
                Ok(&current[*at - n..*at])
            }
        }
    }

    /// Whether all-zero blocks are left out as holes, as a restore leaves them: bytes
    /// from the source tree may hold some (disk images); the cache-hot buffer holds none.
    fn sparse(&self) -> bool {
        matches!(self, Source::Stored { .. })
    }
}

/// Writes `data` at `at` in `file`, leaving out its 4 KiB blocks of zeros if `sparse`;
/// returns the end of the last bytes written.
fn write_at(file: &File, data: &[u8], at: u64, sparse: bool) -> std::io::Result<u64> {
    if !sparse {
        file.write_all_at(data, at)?;
        return Ok(at + data.len() as u64);
    }
    // Folded in blocks of 64 bytes, which the compiler vectorizes, as restore does.
    let zeros = |from: usize| {
        let block = &data[from..(from + 4096).min(data.len())];
        let mut words = block.chunks_exact(64);
        words.all(|w| w.iter().fold(0, |acc, &b| acc | b) == 0)
            && words.remainder().iter().all(|&b| b == 0)
    };
    let (mut end, mut start) = (at, 0);
    while start < data.len() {
        // A run of blocks that are all zeros, or none zeros: written with one call.
        let zero = zeros(start);
        let mut stop = (start + 4096).min(data.len());
        while stop < data.len() && zeros(stop) == zero {
            stop = (stop + 4096).min(data.len());
        }
        if !zero {
            file.write_all_at(&data[start..stop], at + start as u64)?;
            end = at + stop as u64;
        }
        start = stop;
    }
    Ok(end)
}

/// A directory (relative to the root) and the files and links in it.
type Dir = (PathBuf, Vec<(OsString, Item)>);

/// The bytes of the files among `items`.
fn bytes_in(items: &[(OsString, Item)]) -> u64 {
    let bytes = |item: &Item| match item {
        Item::File(len) => *len,
        Item::Link(_) => 0,
    };
    items.iter().map(|(_, item)| bytes(item)).sum()
}

/// Every directory under `root`, parents first, with its files and links.
fn load(root: &Path) -> std::io::Result<Vec<Dir>> {
    let mut dirs = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(dir) = todo.pop() {
        let mut items = Vec::new();
        for entry in fs::read_dir(root.join(&dir))? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                todo.push(dir.join(entry.file_name()));
            } else if kind.is_file() {
                items.push((entry.file_name(), Item::File(entry.metadata()?.len())));
            } else if kind.is_symlink() {
                items.push((entry.file_name(), Item::Link(fs::read_link(entry.path())?)));
            }
        }
        dirs.push((dir, items));
    }
    Ok(dirs)
}

/// Creates the files and links of one directory, relative to its descriptor as a
/// restore does, with bytes from `source`; each file unnamed and then linked if `unnamed`.
fn write(
    target: &Path,
    (dir, items): &Dir,
    mut source: Source,
    unnamed: bool,
) -> std::io::Result<()> {
    let fd = rustix::fs::open(
        target.join(dir),
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for (name, item) in items {
        match item {
            Item::File(len) => {
                let mode = Mode::from_raw_mode(0o644);
                let file = File::from(if unnamed {
                    let flags = OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC;
                    rustix::fs::openat(&fd, ".", flags, mode)?
                } else {
                    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC;
                    rustix::fs::openat(&fd, name, flags, mode)?
                });
                let (mut at, mut end) = (0, 0);
                while at < *len {
                    let sparse = source.sparse();
                    let bytes = source.take(*len - at)?;
                    end = write_at(&file, bytes, at, sparse)?.max(end);
                    at += bytes.len() as u64;
                }
                // A file that ends in a hole.
                if end < *len {
                    file.set_len(*len)?;
                }
                if unnamed {
                    rustix::fs::linkat(&file, "", &fd, name, AtFlags::EMPTY_PATH)?;
                }
            }
            Item::Link(to) => rustix::fs::symlinkat(to, &fd, name)?,
        }
    }
    Ok(())
}

/// Runs `work(i)` for every `i` of `order` on every core; how many failed.
fn on_every_core(order: &[usize], work: impl Fn(usize) -> bool + Sync) -> usize {
    let next = AtomicUsize::new(0);
    let failed = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if !work(i) {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    failed.into_inner()
}

fn main() -> ExitCode {
    let mut args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let mut flag = |name: &str, with_value: bool| {
        let i = args.iter().position(|a| a.as_os_str() == name)?;
        args.remove(i);
        match with_value {
            true => (i < args.len()).then(|| args.remove(i)),
            false => Some(PathBuf::new()),
        }
    };
    let unnamed = flag("--unnamed", false).is_some();
    let (store_to, pieces_from) = (flag("--store", true), flag("--pieces", true));
    let usage = "usage: writefloor [--unnamed] [--pieces PIECES] SOURCE TARGET\n       \
                 writefloor --store PIECES SOURCE";
    let (source, target) = match (&store_to, args.as_slice()) {
        (Some(_), [source]) => (source, None),
        (None, [source, target]) => (source, Some(target)),
        _ => {
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    let dirs = match load(source) {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("writefloor: reading {}: {err}", source.display());
            return ExitCode::FAILURE;
        }
    };
    let count: usize = dirs.iter().map(|(_, items)| items.len()).sum();
    let bytes: u64 = dirs.iter().map(|(_, items)| bytes_in(items)).sum();

    // Largest directories first, so that no thread is left alone with a large one at the
    // end: a file counted as 64 KiB (it costs about as much to create as that to write)
    // plus its bytes; by files alone, the mixed corpus's directory of disk images came
    // last.
    let cost = |(_, items): &Dir| (64 << 10) * items.len() as u64 + bytes_in(items);
    let mut order: Vec<usize> = (0..dirs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(cost(&dirs[i])));

    // No target: --store.
    let Some(target) = target else {
        let path = store_to.unwrap_or_default();
        return match store(source, &dirs, &order, &path) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("writefloor: storing {}: {err}", path.display());
                ExitCode::FAILURE
            }
        };
    };
    let pieces = match &pieces_from {
        None => None,
        Some(path) => match load_pieces(&dirs, path).map(|stored| (stored, path)) {
            Ok(pieces) => Some(pieces),
            Err(err) => {
                eprintln!("writefloor: {err}");
                return ExitCode::FAILURE;
            }
        },
    };

    // Not zeros, which a file system might treat specially.
    let piece: Vec<u8> = (0..PIECE).map(|i| (i * 131 % 251) as u8).collect();
    let (started, cpu) = (Instant::now(), cpu_time());
    for (dir, _) in &dirs {
        if let Err(err) = fs::create_dir(target.join(dir)) {
            eprintln!("writefloor: creating {}: {err}", target.join(dir).display());
            return ExitCode::FAILURE;
        }
    }
    thread_local! {
        static BUFFERS: std::cell::RefCell<Option<Buffers>> = const { std::cell::RefCell::new(None) };
    }
    let failed = on_every_core(&order, |i| {
        let written = BUFFERS.with_borrow_mut(|buffers| {
            let source = match &pieces {
                Some((stored, path)) => {
                    if buffers.is_none() {
                        *buffers = Some(Buffers {
                            dir: path.to_path_buf(),
                            open: None,
                            zstd: zstd::bulk::Decompressor::new()?,
                            read: Vec::new(),
                            plain: Vec::new(),
                        });
                    }
                    let Some(buffers) = buffers.as_mut() else {
                        unreachable!("set above")
                    };
                    buffers.read.clear();
                    Source::Stored {
                        pieces: stored[i].iter(),
                        buffers,
                        raw: true,
                        raw_next: (0, 0),
                        at: 0,
                    }
                }
                None => Source::Hot(&piece),
            };
            write(target, &dirs[i], source, unnamed)
        });
        match written {
            Ok(()) => true,
            Err(err) => {
                eprintln!("writefloor: writing in {}: {err}", dirs[i].0.display());
                false
            }
        }
    });
    let (wall, cpu) = (started.elapsed(), cpu_time() - cpu);
    println!(
        "{:.2} {:.2} {} directories, {count} files and links, {bytes} bytes",
        wall.as_secs_f64(),
        cpu.as_secs_f64(),
        dirs.len(),
    );
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

//! The floor under a first backup on one disk: read every file of SOURCE and, at the same
//! time, write BYTES of incompressible data durably under TARGET (which must not exist),
//! doing nothing else. Any backup tool reads the whole tree and writes at least its
//! repository; when both share one device, neither can go faster than this. Prints the
//! wall and CPU time of the whole, and of the read and the write alone as they ran.
//!
//! The reads take READERS threads (64 unless given), each reading one file at a time
//! whole through a 1 MiB buffer: a cold disk reads many files at once faster than a few,
//! but while it writes too, many readers slow the write more than they speed the reads,
//! so `bench/compare.sh` takes the fastest of 2, 8 and 64 readers. The write is
//! the cheapest durable one: a single file, 1 MiB at a time, its writeback started as each
//! MiB is written (as cairn's packs are), one `fsync` at the end and one of TARGET. No
//! chunking, hashing, compression or encryption. The pages read and written are dropped
//! as cairn drops its own (behind each file's reading, after each pack is durable): on
//! a VM that hands free memory back to its host every fresh page faults there, and the
//! mixed corpus's floor took 3.19-3.39 s and 3.4-3.9 CPU s keeping them, 1.12-1.54 s
//! and 0.76-0.90 CPU s dropping them (2 and 8 readers, two runs each, in turns).
//!
//! `bench/compare.sh` runs it with the page cache dropped and BYTES the smallest
//! repository of the first backups: with a corpus that does not compress, the disk alone
//! can put the fastest other tool's first backup within reach of this floor, and then
//! half that tool's time is out of every tool's reach. With BYTES 0 it only reads: the
//! floor under a backup of data the repository holds already (duplicate data).
//!
//! usage: cargo run --release -p cairn-core --example backupfloor -- SOURCE TARGET BYTES [READERS]

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cairn_storage::pagecache::drop_pages;

#[path = "shared/cpu.rs"]
mod cpu;
use cpu::cpu_time;

const PIECE: usize = 1 << 20;

/// Bytes read or written between two drops of pages: a multiple of [`PIECE`], about a
/// pack.
const SEGMENT: u64 = 16 << 20;

/// Threads reading unless told: enough files read at once that more do not read the tree
/// faster. On the project's 2-core VM (virtio disk), cold, nothing written, the Linux 6.1
/// tree (78,579 files, 1.30 GB) took 6.81-10.74 s with 2 threads (one per core, as this
/// did before), 3.88-4.36 with 8, 3.35-3.44 with 16 and 32, 2.83-2.87 with 64,
/// 2.64-2.82 with 128 and 256; the mixed corpus's copy (2,206 files, 1.09 GB) 1.14-1.32
/// s with 2, 0.77-0.95 with 8 to 32. Writing its 0.98 GB repository beside it (the
/// pages not yet dropped), the mixed corpus took 1.78-3.01 s with 2, 1.69-1.85 with 8
/// and 2.53-2.73 with 64 readers (the reads done in 0.77-1.05 s, the write starved).
const READERS: usize = 64;

/// Every regular file under `root`.
fn files(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let (mut out, mut todo) = (Vec::new(), vec![root.to_path_buf()]);
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                todo.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }
    Ok(out)
}

/// Reads the files `next` hands out, whole, until none is left; the bytes read. Each
/// file's pages are dropped behind the reading every [`SEGMENT`], as cairn's `ReadOnce`
/// does (see the top for why).
fn read_all(next: &Mutex<std::vec::IntoIter<PathBuf>>) -> std::io::Result<u64> {
    let (mut buf, mut total) = (vec![0u8; PIECE], 0u64);
    loop {
        let Some(path) = next.lock().ok().and_then(|mut it| it.next()) else {
            return Ok(total);
        };
        let mut file = File::open(&path)?;
        let (mut read, mut dropped) = (0u64, 0u64);
        loop {
            match file.read(&mut buf)? {
                0 => break,
                n => read += n as u64,
            }
            // Up to the last whole segment, whatever lengths the reads returned.
            let end = read - read % SEGMENT;
            if end > dropped {
                drop_pages(&file, dropped, end - dropped);
                dropped = end;
            }
        }
        drop_pages(&file, dropped, 0);
        total += read;
    }
}

/// Writes `bytes` of `piece` over and over to a new file in `dir`, durably. Once a
/// [`SEGMENT`] is written, the writeback of the one before is waited for and its pages
/// dropped, so that the write, like cairn's packs (each made durable and dropped), runs
/// through pages just freed rather than a gigabyte of fresh ones.
fn write_durably(dir: &Path, bytes: u64, piece: &[u8]) -> std::io::Result<()> {
    fs::create_dir(dir)?;
    let mut file = File::create_new(dir.join("floor"))?;
    let (mut done, fd) = (0u64, file.as_raw_fd());
    while done < bytes {
        let n = (bytes - done).min(piece.len() as u64) as usize;
        file.write_all(&piece[..n])?;
        // SAFETY: sync_file_range on a descriptor `file` owns, with integer arguments only.
        unsafe {
            libc::sync_file_range(fd, done as i64, n as i64, libc::SYNC_FILE_RANGE_WRITE);
        }
        done += n as u64;
        if done.is_multiple_of(SEGMENT) && done >= 2 * SEGMENT {
            let before = done - 2 * SEGMENT;
            let wait = libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER;
            // SAFETY: as above.
            unsafe {
                libc::sync_file_range(fd, before as i64, SEGMENT as i64, wait);
            }
            drop_pages(&file, before, SEGMENT);
        }
    }
    file.sync_all()?;
    drop_pages(&file, 0, 0);
    File::open(dir)?.sync_all()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (source, target, bytes, readers) = match args.as_slice() {
        [source, target, bytes] => (source, target, bytes, None),
        [source, target, bytes, readers] => (source, target, bytes, Some(readers)),
        _ => {
            eprintln!("usage: backupfloor SOURCE TARGET BYTES [READERS]");
            return ExitCode::from(2);
        }
    };
    let Ok(bytes) = bytes.parse::<u64>() else {
        eprintln!("backupfloor: BYTES must be a number of bytes, not {bytes:?}");
        return ExitCode::from(2);
    };
    let readers = match readers.map(|r| r.parse::<usize>()) {
        None => READERS,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("backupfloor: READERS must be a number of threads above 0");
            return ExitCode::from(2);
        }
    };
    // Incompressible, in case the device compresses: xorshift, fixed seed.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let piece: Vec<u8> = (0..PIECE / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();

    let (started, cpu) = (Instant::now(), cpu_time());
    let list = match files(Path::new(source)) {
        Ok(list) => list,
        Err(err) => {
            eprintln!("backupfloor: listing {source}: {err}");
            return ExitCode::FAILURE;
        }
    };
    let count = list.len();
    let next = Mutex::new(list.into_iter());
    let (read, wrote) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let r = write_durably(Path::new(target), bytes, &piece);
            (r, started.elapsed())
        });
        let readers: Vec<_> = (0..readers).map(|_| s.spawn(|| read_all(&next))).collect();
        let read: std::io::Result<u64> = readers
            .into_iter()
            .map(|r| {
                r.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("panicked")))
            })
            .sum();
        let read_time = started.elapsed();
        let wrote = writer
            .join()
            .unwrap_or_else(|_| (Err(std::io::Error::other("panicked")), Duration::ZERO));
        (read.map(|n| (n, read_time)), wrote)
    });
    let (wall, cpu) = (started.elapsed(), cpu_time() - cpu);
    let (read_bytes, read_time) = match read {
        Ok(r) => r,
        Err(err) => {
            eprintln!("backupfloor: reading {source}: {err}");
            return ExitCode::FAILURE;
        }
    };
    let write_time = match wrote {
        (Ok(()), t) => t,
        (Err(err), _) => {
            eprintln!("backupfloor: writing under {target}: {err}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{:.2} {:.2} read {read_bytes} bytes in {count} files in {:.2} s with {readers} threads, wrote {bytes} bytes durably in {:.2} s",
        wall.as_secs_f64(),
        cpu.as_secs_f64(),
        read_time.as_secs_f64(),
        write_time.as_secs_f64(),
    );
    ExitCode::SUCCESS
}

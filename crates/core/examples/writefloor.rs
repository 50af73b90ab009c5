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
//! usage: cargo run --release -p cairn-core --example writefloor -- [--unnamed] SOURCE TARGET

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::Write;
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

/// A directory (relative to the root) and the files and links in it.
type Dir = (PathBuf, Vec<(OsString, Item)>);

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
/// restore does; each file unnamed and then linked if `unnamed`.
fn write(target: &Path, (dir, items): &Dir, piece: &[u8], unnamed: bool) -> std::io::Result<()> {
    let fd = rustix::fs::open(
        target.join(dir),
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for (name, item) in items {
        match item {
            Item::File(len) => {
                let mode = Mode::from_raw_mode(0o644);
                let mut file = File::from(if unnamed {
                    let flags = OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC;
                    rustix::fs::openat(&fd, ".", flags, mode)?
                } else {
                    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC;
                    rustix::fs::openat(&fd, name, flags, mode)?
                });
                let mut left = *len;
                while left > 0 {
                    let n = left.min(piece.len() as u64) as usize;
                    file.write_all(&piece[..n])?;
                    left -= n as u64;
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

fn main() -> ExitCode {
    let mut args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let unnamed = args.first().is_some_and(|a| a.as_os_str() == "--unnamed");
    if unnamed {
        args.remove(0);
    }
    let [source, target] = args.as_slice() else {
        eprintln!("usage: writefloor [--unnamed] SOURCE TARGET");
        return ExitCode::from(2);
    };
    let dirs = match load(source) {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("writefloor: reading {}: {err}", source.display());
            return ExitCode::FAILURE;
        }
    };
    let items = dirs.iter().flat_map(|(_, items)| items);
    let (count, bytes) = items.fold((0, 0u64), |(n, b), (_, item)| match item {
        Item::File(len) => (n + 1, b + len),
        Item::Link(_) => (n + 1, b),
    });

    // Largest directories first, so that no thread is left alone with a large one at the
    // end.
    let mut order: Vec<&Dir> = dirs.iter().collect();
    order.sort_by_key(|(_, items)| std::cmp::Reverse(items.len()));

    // Not zeros, which a file system might treat specially.
    let piece: Vec<u8> = (0..PIECE).map(|i| (i * 131 % 251) as u8).collect();
    let (started, cpu) = (Instant::now(), cpu_time());
    for (dir, _) in &dirs {
        if let Err(err) = fs::create_dir(target.join(dir)) {
            eprintln!("writefloor: creating {}: {err}", target.join(dir).display());
            return ExitCode::FAILURE;
        }
    }
    let next = AtomicUsize::new(0);
    let failed = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while let Some(dir) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Err(err) = write(target, dir, &piece, unnamed) {
                        eprintln!("writefloor: writing in {}: {err}", dir.0.display());
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let (wall, cpu) = (started.elapsed(), cpu_time() - cpu);
    println!(
        "{:.2} {:.2} {} directories, {count} files and links, {bytes} bytes",
        wall.as_secs_f64(),
        cpu.as_secs_f64(),
        dirs.len(),
    );
    if failed.load(Ordering::Relaxed) > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

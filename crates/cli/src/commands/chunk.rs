//! `chunk`: show the chunker at work on real files, without a repository; with
//! `--sizes`, compare chunk sizes on them so a user can choose `init --chunk-*` for
//! their data.

use std::cell::Cell;
use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cairn_core::chunker::{Chunker, ChunkerParams};
use cairn_core::compress::{Compression, Compressor};
use serde::Serialize;

use crate::args::{ChunkArgs, GlobalArgs};
use crate::output;

pub fn run(g: &GlobalArgs, a: ChunkArgs) -> Result<u8> {
    if !a.sizes.is_empty() {
        return compare_sizes(g, &a.files, &a.sizes);
    }
    let params =
        crate::args::chunker_params(a.min, a.avg, a.max).context("Invalid --min/--avg/--max")?;
    let mut out = std::io::stdout().lock();
    let (mut count, mut total) = (0u64, 0u64);
    let mut json = Vec::new();
    for path in &a.files {
        let file = File::open(path).with_context(|| format!("Cannot read {}", path.display()))?;
        if a.files.len() > 1 && !g.json {
            writeln!(out, "# {}", path.display())?;
        }
        let mut chunker = Chunker::new(file, params, 0_u64);
        while let Some(c) = chunker
            .next_chunk()
            .with_context(|| format!("Cannot read {}", path.display()))?
        {
            let id = blake3::hash(c.data).to_hex();
            if g.json {
                json.push(serde_json::json!({
                    "file": path.to_string_lossy(),
                    "offset": c.offset,
                    "size_bytes": c.data.len(),
                    "id": id.as_str(),
                }));
            } else {
                writeln!(out, "{} {} {}", c.offset, c.data.len(), id)?;
            }
            count += 1;
            total += c.data.len() as u64;
        }
    }
    let average = total.checked_div(count).unwrap_or(0);
    if g.json {
        crate::output::json(&serde_json::json!({
            "chunks": json,
            "total_bytes": total,
            "average_bytes": average,
        }))?;
    } else {
        writeln!(
            out,
            "total: {count} chunks, {total} bytes, average {average} bytes"
        )?;
    }
    Ok(0)
}

/// What cutting all the files with one set of limits gives.
#[derive(Debug, Default, Serialize)]
struct SizeRow {
    average_bytes: u32,
    min_bytes: u32,
    max_bytes: u32,
    chunks: u64,
    unique_chunks: u64,
    total_bytes: u64,
    unique_bytes: u64,
    /// Total over unique bytes.
    dedup_ratio: Option<f64>,
    /// The unique chunks compressed as a repository does by default (zstd:3).
    compressed_bytes: u64,
    /// Chunker alone: reading the files, hashing and compressing are not timed.
    chunk_mib_per_s: Option<f64>,
}

fn compare_sizes(g: &GlobalArgs, paths: &[PathBuf], sizes: &[ChunkerParams]) -> Result<u8> {
    let files = regular_files(paths)?;
    let mut compressor = Compressor::new(Compression::default());
    let mut buffer = Vec::new();
    let mut rows = Vec::new();
    for &params in sizes {
        let mut row = SizeRow {
            average_bytes: params.avg_size,
            min_bytes: params.min_size,
            max_bytes: params.max_size,
            ..SizeRow::default()
        };
        // Grown up front to the chunker's full size (twice the maximum, at least 4 MiB),
        // so that zeroing a growing buffer is not timed as chunking: it made the first
        // row of a small data set look 20 times slower than the same size again.
        buffer.resize((2 * params.max_size as usize).max(4 << 20), 0);
        let mut seen: HashSet<[u8; 32]> = HashSet::new();
        let (mut elapsed, read_time) = (Duration::ZERO, Cell::new(Duration::ZERO));
        for path in &files {
            let cannot = || format!("Cannot read {}", path.display());
            let file = TimedReader {
                inner: File::open(path).with_context(cannot)?,
                spent: &read_time,
            };
            let mut chunker =
                Chunker::with_buffer(file, params, 0_u64, std::mem::take(&mut buffer));
            loop {
                let started = Instant::now();
                let next = chunker.next_chunk().with_context(cannot)?;
                elapsed += started.elapsed();
                let Some(c) = next else { break };
                let len = c.data.len() as u64;
                row.chunks += 1;
                row.total_bytes += len;
                if seen.insert(*blake3::hash(c.data).as_bytes()) {
                    row.unique_chunks += 1;
                    row.unique_bytes += len;
                    row.compressed_bytes += compressor.compress(c.data).tagged_len() as u64;
                }
            }
            buffer = chunker.into_buffer();
        }
        let chunking = elapsed.saturating_sub(read_time.get()).as_secs_f64();
        row.dedup_ratio =
            (row.unique_bytes > 0).then(|| row.total_bytes as f64 / row.unique_bytes as f64);
        row.chunk_mib_per_s =
            (chunking > 0.0).then(|| row.total_bytes as f64 / (1 << 20) as f64 / chunking);
        rows.push(row);
    }
    if g.json {
        output::json(&serde_json::json!({ "sizes": rows }))?;
    } else {
        print_sizes(&rows, files.len())?;
    }
    Ok(0)
}

fn print_sizes(rows: &[SizeRow], files: usize) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let total = rows.first().map_or(0, |r| r.total_bytes);
    let noun = if files == 1 { "file" } else { "files" };
    writeln!(out, "{files} {noun}, {}", output::size(total))?;
    writeln!(
        out,
        "{:>10} {:>10} {:>10} {:>9} {:>9} {:>11} {:>6} {:>10} {:>6} {:>7}",
        "Avg",
        "Min",
        "Max",
        "Chunks",
        "Unique",
        "Unique size",
        "Dedup",
        "Compressed",
        "Ratio",
        "MiB/s"
    )?;
    for r in rows {
        let ratio = |a: u64, b: u64| {
            if b == 0 {
                "-".to_string()
            } else {
                format!("{:.2}", a as f64 / b as f64)
            }
        };
        writeln!(
            out,
            "{:>10} {:>10} {:>10} {:>9} {:>9} {:>11} {:>6} {:>10} {:>6} {:>7}",
            output::size(r.average_bytes.into()),
            output::size(r.min_bytes.into()),
            output::size(r.max_bytes.into()),
            r.chunks,
            r.unique_chunks,
            output::size(r.unique_bytes),
            ratio(r.total_bytes, r.unique_bytes),
            output::size(r.compressed_bytes),
            ratio(r.unique_bytes, r.compressed_bytes),
            r.chunk_mib_per_s
                .map_or_else(|| "-".into(), |v| format!("{v:.0}")),
        )?;
    }
    Ok(())
}

/// A reader that adds the time spent in `read` to `spent`, so that the chunker's time
/// can be told apart from the disk's.
struct TimedReader<'a, R> {
    inner: R,
    spent: &'a Cell<Duration>,
}

impl<R: Read> Read for TimedReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let started = Instant::now();
        let n = self.inner.read(buf);
        self.spent.set(self.spent.get() + started.elapsed());
        n
    }
}

/// The regular files among `paths` and, for directories, below them, in name order.
/// Symlinks named on the command line are followed; those found in directories are not,
/// as a backup does not.
fn regular_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        let md =
            std::fs::metadata(path).with_context(|| format!("Cannot read {}", path.display()))?;
        if md.is_dir() {
            walk(path, &mut files)?;
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    let cannot = || format!("Cannot list {}", dir.display());
    let mut entries = std::fs::read_dir(dir)
        .with_context(cannot)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(cannot)?;
    entries.sort();
    for path in entries {
        let md = std::fs::symlink_metadata(&path)
            .with_context(|| format!("Cannot read {}", path.display()))?;
        if md.is_dir() {
            walk(&path, files)?;
        } else if md.is_file() {
            files.push(path);
        }
    }
    Ok(())
}

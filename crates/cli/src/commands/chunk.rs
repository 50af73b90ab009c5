//! `chunk`: show the chunker at work on real files, without a repository.

use std::fs::File;
use std::io::Write;

use anyhow::{Context, Result};
use cairn_core::chunker::{Chunker, ChunkerParams};

use crate::args::{ChunkArgs, GlobalArgs};

pub fn run(g: &GlobalArgs, a: ChunkArgs) -> Result<u8> {
    let d = ChunkerParams::DEFAULT;
    let params = ChunkerParams::new(
        a.min.unwrap_or(d.min_size),
        a.avg.unwrap_or(d.avg_size),
        a.max.unwrap_or(d.max_size),
    )
    .context("Invalid --min/--avg/--max")?;
    let mut out = std::io::stdout().lock();
    let (mut count, mut total) = (0u64, 0u64);
    let mut json = Vec::new();
    for path in &a.files {
        let file = File::open(path).with_context(|| format!("Cannot read {}", path.display()))?;
        if a.files.len() > 1 && !g.json {
            writeln!(out, "# {}", path.display())?;
        }
        let mut chunker = Chunker::new(file, params, 0);
        while let Some(c) = chunker
            .next_chunk()
            .with_context(|| format!("Cannot read {}", path.display()))?
        {
            let id = blake3::hash(c.data).to_hex();
            if g.json {
                json.push(serde_json::json!({
                    "file": path.to_string_lossy(),
                    "offset": c.offset,
                    "length": c.data.len(),
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
            "count": count,
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

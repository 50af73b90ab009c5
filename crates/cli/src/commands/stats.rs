//! `stats`: sizes, counts and the dedup and compression ratios of the repository, or of
//! some snapshots.

use std::io::Write;

use anyhow::Result;
use cairn_core::ops::stats::{self, BlobTotals, StatsReport};

use crate::args::{GlobalArgs, StatsArgs};
use crate::{context, output};

pub fn run(g: &GlobalArgs, a: StatsArgs) -> Result<u8> {
    let repo = context::open(g)?;
    let report = stats::stats(&repo, &a.snapshots)?;
    for (id, e) in &report.damaged {
        eprintln!(
            "warning: snapshot {} left out: {}",
            id.short(),
            cairn_core::error::chain(e)
        );
    }
    if report.blobs_missing > 0 {
        eprintln!(
            "warning: {} referenced blobs are not in the index, so not counted; \
             `cairn check` says why",
            report.blobs_missing
        );
    }
    if g.json {
        output::json(&report)?;
    } else if !g.quiet {
        print(&report)?;
    }
    let complete = report.damaged.is_empty() && report.blobs_missing == 0;
    Ok(if complete { 0 } else { 1 })
}

fn print(r: &StatsReport) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "Snapshots:    {}", r.snapshots)?;
    writeln!(out, "Files:        {}   Dirs: {}", r.files, r.dirs)?;
    writeln!(out, "Restore size: {}", output::size(r.restore_bytes))?;
    match r.pack_bytes {
        Some(bytes) => writeln!(out, "Packs:        {}, {}", r.packs, output::size(bytes))?,
        None => writeln!(out, "Packs:        {} hold these blobs", r.packs)?,
    }
    writeln!(out, "Data blobs:   {}", blobs(&r.data))?;
    writeln!(out, "Tree blobs:   {}", blobs(&r.trees))?;
    writeln!(
        out,
        "Compression:  {} (raw / stored)",
        times(r.compression_ratio)
    )?;
    writeln!(
        out,
        "Dedup:        {} (restore size / raw data blobs)",
        times(r.dedup_ratio)
    )?;
    Ok(())
}

fn blobs(t: &BlobTotals) -> String {
    format!(
        "{}: {} stored, {} raw",
        t.count,
        output::size(t.stored_bytes),
        output::size(t.raw_bytes)
    )
}

fn times(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

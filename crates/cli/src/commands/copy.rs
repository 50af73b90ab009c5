use anyhow::{Context, Result};
use cairn_core::ops::copy::{self, CopyOptions};
use cairn_core::ops::select;

use crate::args::{CopyArgs, GlobalArgs};
use crate::progress::Progress;
use crate::{context, output};

pub fn run(g: &GlobalArgs, a: CopyArgs) -> Result<u8> {
    // Ctrl-C stops the copy between blobs, removing its session from the destination.
    crate::signals::install();
    let filter = super::snapshot_filter(&a.filter)?;
    let src = context::open_from(&a.from, true)?;
    let from = src.storage().location();
    let snapshots = a
        .snapshots
        .iter()
        .map(|spec| select::find_snapshot(&src, spec, &filter).map(|(id, _)| id))
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("In the repository {from}"))?;
    let mut dst = context::open_without_index(g)?;
    let opts = CopyOptions {
        snapshots,
        filter,
        host: gethostname::gethostname().to_string_lossy().into_owned(),
    };
    let monitor = Progress::phases(g, "copy");
    let report = copy::copy(&src, &mut dst, &opts, &monitor)
        .with_context(|| format!("Cannot copy from {from} to {}", dst.storage().location()))?;
    monitor.finish();
    if g.json {
        output::json(&serde_json::json!({
            "from": from,
            "repository": dst.storage().location(),
            "copied": report.copied.iter().map(|(s, d)| serde_json::json!({
                "source_id": s.to_hex(), "snapshot_id": d.to_hex(), "snapshot_short_id": d.short(),
            })).collect::<Vec<_>>(),
            "already_present_ids": report.already_present.iter().map(|s| s.to_hex()).collect::<Vec<_>>(),
            "shared_ids": report.shared_ids,
            "blobs_read": report.blobs_read,
            "blobs_added": report.blobs_added,
            "raw_bytes_added": report.raw_bytes_added,
            "bytes_added": report.bytes_added,
            "duration_ms": report.duration_ms,
        }))?;
    } else if !g.quiet {
        for (s, d) in &report.copied {
            println!("copied snapshot {} as {}", s.short(), d.short());
        }
        for s in &report.already_present {
            println!("snapshot {} is already here", s.short());
        }
        println!(
            "{} copied, {} already here; {} added ({} stored) in {}",
            output::count(report.copied.len() as u64, "snapshot", "snapshots"),
            report.already_present.len(),
            output::count(report.blobs_added, "blob", "blobs"),
            output::size(report.bytes_added),
            output::seconds(report.duration_ms),
        );
    }
    Ok(0)
}

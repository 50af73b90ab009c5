//! `find`: entries by name or path glob, size, time and type, across snapshots.

use std::io::Write;

use anyhow::Result;
use cairn_core::ops::find::{self, FindOptions};
use cairn_core::tree::Time;

use crate::args::{FindArgs, GlobalArgs};
use crate::{context, output};

fn file_time(t: jiff::Timestamp) -> Time {
    Time {
        sec: t.as_second(),
        nsec: t.subsec_nanosecond().max(0) as u32,
    }
}

pub fn run(g: &GlobalArgs, a: FindArgs) -> Result<u8> {
    let opts = FindOptions {
        patterns: a.patterns,
        snapshots: a.snapshots,
        filter: super::snapshot_filter(&a.filter)?,
        size: a.size,
        newer: a.newer.map(file_time),
        older: a.older.map(file_time),
        types: a.types.iter().map(|t| t.to_string()).collect(),
    };
    let repo = context::open(g)?;
    let report = find::find(&repo, &opts)?;
    for (id, e) in &report.damaged {
        eprintln!(
            "warning: snapshot {} not searched: {}",
            id.short(),
            output::message(&cairn_core::error::chain(e))
        );
    }
    if g.json {
        let matches: Vec<_> = report
            .matches
            .iter()
            .map(|m| {
                serde_json::json!({
                    "snapshot_id": m.snapshot.to_hex(),
                    "snapshot_short_id": m.snapshot.short(),
                    "snapshot_time": m.snapshot_time,
                    "path": m.path,
                    "type": m.kind,
                    "size_bytes": m.size,
                    "mtime": m.mtime,
                })
            })
            .collect();
        output::json(&serde_json::json!({ "matches": matches, "stats": report.stats }))?;
    } else {
        let mut out = std::io::stdout().lock();
        for m in &report.matches {
            writeln!(
                out,
                "{}  {}  {}  {}  {}",
                m.snapshot.short(),
                output::local_time(m.snapshot_time),
                output::name(m.path.as_bytes()),
                m.size,
                m.mtime
                    .map(output::local_time)
                    .unwrap_or_else(|| "-".into())
            )?;
        }
        if !g.quiet {
            eprintln!(
                "{} in {} ({} read)",
                output::count(report.matches.len() as u64, "match", "matches"),
                output::count(report.stats.snapshots, "snapshot", "snapshots"),
                output::count(report.stats.trees_read, "tree", "trees")
            );
        }
    }
    Ok(if report.damaged.is_empty() { 0 } else { 1 })
}

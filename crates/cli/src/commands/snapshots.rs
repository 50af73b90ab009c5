//! `snapshots`: the snapshots the filters select, optionally grouped, the newest N of
//! each group, in a long or compact table.

use std::io::Write;

use anyhow::Result;
use cairn_core::id::SnapshotId;
use cairn_core::ops::forget::{GroupBy, GroupKey};
use cairn_core::ops::select;
use cairn_core::snapshot::Snapshot;

use crate::args::{GlobalArgs, SnapshotsArgs};
use crate::{context, output};

pub fn run(g: &GlobalArgs, a: SnapshotsArgs) -> Result<u8> {
    let filter = super::snapshot_filter(&a.filter)?;
    let group_by: Option<GroupBy> = a
        .group_by
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let repo = context::open(g)?;
    let list = select::snapshots(&repo, &filter)?;
    for (_, e) in &list.damaged {
        eprintln!(
            "warning: {}",
            crate::output::message(&cairn_core::error::chain(e))
        );
    }
    // `--latest N` counts within groups, by default those of host and paths (as restic).
    let mut groups = group_by.unwrap_or_default().group(&list.snapshots);
    if let Some(n) = a.latest {
        for (_, items) in &mut groups {
            let drop = items.len().saturating_sub(n);
            items.drain(..drop);
        }
    }
    if group_by.is_none() {
        // One table, oldest first, as without --latest.
        let mut all: Vec<_> = groups.into_iter().flat_map(|(_, items)| items).collect();
        all.sort_by_key(|(id, s)| (s.time, *id));
        groups = vec![((None, None, None), all)];
    }
    if g.json {
        let items = |items: &[&(SnapshotId, Snapshot)]| -> Vec<serde_json::Value> {
            items.iter().map(|(id, s)| snapshot_json(id, s)).collect()
        };
        if group_by.is_some() {
            let v: Vec<_> = groups
                .iter()
                .map(|((host, paths, tags), list)| {
                    serde_json::json!({
                        "group": output::group_json(host, paths, tags),
                        "snapshots": items(list),
                    })
                })
                .collect();
            output::json(&serde_json::json!({ "groups": v }))?;
        } else {
            output::json(&serde_json::json!({ "snapshots": items(&groups[0].1) }))?;
        }
        return Ok(0);
    }
    let mut out = std::io::stdout().lock();
    let mut total = 0;
    for (i, (key, items)) in groups.iter().enumerate() {
        if group_by.is_some() {
            if i > 0 {
                writeln!(out)?;
            }
            writeln!(out, "{}:", group_label(key))?;
        }
        print_table(&mut out, items, a.compact)?;
        total += items.len();
    }
    writeln!(
        out,
        "{}",
        output::count(total as u64, "snapshot", "snapshots")
    )?;
    Ok(if list.damaged.is_empty() { 0 } else { 1 })
}

/// A snapshot as every `--json` document shows one (docs/JSON.md): written out here
/// rather than serialized, so that the repository format's field names can change
/// without changing what scripts read.
fn snapshot_json(id: &SnapshotId, s: &Snapshot) -> serde_json::Value {
    serde_json::json!({
        "id": id.to_hex(),
        "short_id": id.short(),
        "time": s.time,
        "host": s.host,
        "username": s.username,
        "paths": s.paths,
        "tags": s.tags,
        "tree_id": s.tree.to_hex(),
        "parent_id": s.parent.map(|p| p.to_hex()),
        "original_id": s.original.map(|p| p.to_hex()),
        "program_version": s.program_version,
        "summary": {
            "files": s.summary.files,
            "dirs": s.summary.dirs,
            "total_bytes": s.summary.total_bytes,
            "bytes_added": s.summary.bytes_added,
        },
    })
}

/// `host h, paths /a, /b, tags x,y`, the fields of the grouping.
pub(crate) fn group_label((host, paths, tags): &GroupKey) -> String {
    let mut key = Vec::new();
    if let Some(h) = host {
        key.push(format!("host {h}"));
    }
    if let Some(p) = paths {
        key.push(format!("paths {}", p.join(", ")));
    }
    if let Some(t) = tags {
        key.push(format!("tags {}", t.join(",")));
    }
    if key.is_empty() {
        "all snapshots".into()
    } else {
        key.join(", ")
    }
}

fn print_table(
    out: &mut dyn Write,
    items: &[&(SnapshotId, Snapshot)],
    compact: bool,
) -> Result<()> {
    if compact {
        writeln!(out, "{:<8}  {:<19}  {:<16}  Tags", "ID", "Time", "Host")?;
        for (id, s) in items {
            writeln!(
                out,
                "{:<8}  {:<19}  {:<16}  {}",
                id.short(),
                output::local_time(s.time),
                s.host,
                s.tags.join(",")
            )?;
        }
        return Ok(());
    }
    writeln!(
        out,
        "{:<8}  {:<19}  {:<16}  {:<12}  {:>10}  Paths",
        "ID", "Time", "Host", "Tags", "Size"
    )?;
    for (id, s) in items {
        let mut paths = s.paths.iter();
        writeln!(
            out,
            "{:<8}  {:<19}  {:<16}  {:<12}  {:>10}  {}",
            id.short(),
            output::local_time(s.time),
            s.host,
            s.tags.join(","),
            output::size(s.summary.total_bytes),
            paths.next().map(String::as_str).unwrap_or("")
        )?;
        for p in paths {
            writeln!(out, "{:>74}{p}", "")?;
        }
    }
    Ok(())
}

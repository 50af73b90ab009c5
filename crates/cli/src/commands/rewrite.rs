//! `tag` and `rewrite`: new versions of existing snapshots.

use anyhow::{Context, Result};
use cairn_core::id::SnapshotId;
use cairn_core::ops::exclude::Excludes;
use cairn_core::ops::rewrite::{self, Replaced, RewriteOptions, TagChange};
use cairn_core::ops::select;
use cairn_core::repo::Repository;
use cairn_core::snapshot::{Snapshot, SnapshotFilter};

use crate::args::{GlobalArgs, RewriteArgs, TagArgs};
use crate::progress::Progress;
use crate::{context, output};

/// The snapshots named (each through the filters' `latest`), or without names every one
/// the filters select.
fn selected(
    repo: &Repository,
    specs: &[String],
    filter: &SnapshotFilter,
) -> Result<Vec<(SnapshotId, Snapshot)>> {
    if specs.is_empty() {
        return Ok(select::snapshots(repo, filter)?.snapshots);
    }
    let mut out: Vec<(SnapshotId, Snapshot)> = Vec::new();
    for spec in specs {
        let found = select::find_snapshot(repo, spec, filter)?;
        if !out.iter().any(|(id, _)| *id == found.0) {
            out.push(found);
        }
    }
    Ok(out)
}

fn tags(list: &[String]) -> Vec<String> {
    list.iter().filter(|t| !t.is_empty()).cloned().collect()
}

pub fn tag(g: &GlobalArgs, a: TagArgs) -> Result<u8> {
    let filter = super::snapshot_filter(&a.filter)?;
    let repo = context::open_without_index(g)?;
    let snapshots = selected(&repo, &a.snapshots, &filter)?;
    let change = TagChange {
        set: a.set.as_deref().map(tags),
        add: tags(&a.add),
        remove: tags(&a.remove),
    };
    let done = rewrite::tag(&repo, &snapshots, &change, a.dry_run)?;
    if g.json {
        let unchanged = snapshots
            .iter()
            .filter(|(id, _)| !done.iter().any(|r| r.old == *id))
            .map(|(id, _)| *id);
        output::json(&replaced_json(&done, unchanged, a.dry_run))?;
    } else if !g.quiet {
        for r in &done {
            let (_, old) = snapshots
                .iter()
                .find(|(id, _)| *id == r.old)
                .context("a changed snapshot was selected")?;
            let now = change.apply(&old.tags).join(", ");
            match r.new {
                Some(new) => println!(
                    "snapshot {} is now {} (tags: {now})",
                    r.old.short(),
                    new.short()
                ),
                None => println!("would change snapshot {} (tags: {now})", r.old.short()),
            }
        }
        println!(
            "{} {}, {} unchanged",
            output::count(done.len() as u64, "snapshot", "snapshots"),
            if a.dry_run { "would change" } else { "changed" },
            snapshots.len() - done.len()
        );
    }
    Ok(0)
}

pub fn rewrite(g: &GlobalArgs, a: RewriteArgs) -> Result<u8> {
    let filter = super::snapshot_filter(&a.filter)?;
    let mut excludes = a.excludes.clone();
    for file in &a.exclude_files {
        excludes.extend(Excludes::read_file(file)?);
    }
    crate::signals::install();
    let mut repo = context::open_without_index(g)?;
    let snapshots = selected(&repo, &a.snapshots, &filter)?;
    let opts = RewriteOptions {
        excludes,
        forget: a.forget,
        dry_run: a.dry_run,
    };
    let monitor = Progress::phases(g, "rewrite");
    let report = rewrite::rewrite(&mut repo, &snapshots, &opts, &monitor)?;
    monitor.finish();
    if g.json {
        let unchanged = report.unchanged.iter().copied();
        output::json(&replaced_json(&report.rewritten, unchanged, a.dry_run))?;
        return Ok(0);
    }
    if g.quiet {
        return Ok(0);
    }
    for r in &report.rewritten {
        match r.new {
            Some(new) => println!(
                "snapshot {} rewritten as {}{}:",
                r.old.short(),
                new.short(),
                if r.removed {
                    ", the original removed"
                } else {
                    ""
                }
            ),
            None => println!("snapshot {} would be rewritten without:", r.old.short()),
        }
        for p in &r.removed_paths {
            println!("  - {}", output::name(p.as_bytes()));
        }
    }
    println!(
        "{} {}, {} unchanged{}",
        output::count(report.rewritten.len() as u64, "snapshot", "snapshots"),
        if a.dry_run {
            "would be rewritten"
        } else {
            "rewritten"
        },
        report.unchanged.len(),
        if !a.dry_run && !a.forget && !report.rewritten.is_empty() {
            "; the originals are kept (remove them with `cairn forget` or --forget)"
        } else {
            ""
        }
    );
    Ok(0)
}

/// `tag` and `rewrite` in one shape (docs/JSON.md): each replaced snapshot's old and new
/// id (`null` in a dry run), and the ids of those selected that needed no change.
fn replaced_json(
    done: &[Replaced],
    unchanged: impl Iterator<Item = SnapshotId>,
    dry_run: bool,
) -> serde_json::Value {
    let rewritten: Vec<_> = done
        .iter()
        .map(|r| {
            serde_json::json!({
                "old_id": r.old.to_hex(),
                "new_id": r.new.map(|n| n.to_hex()),
                "removed": r.removed,
                "removed_paths": r.removed_paths,
            })
        })
        .collect();
    serde_json::json!({
        "rewritten": rewritten,
        "unchanged_ids": unchanged.map(|id| id.to_hex()).collect::<Vec<_>>(),
        "dry_run": dry_run,
    })
}

//! `forget` and `prune`.

use std::io::Write;

use anyhow::Result;
use cairn_core::ops::forget::{self, GroupBy, KeepPolicy};
use cairn_core::ops::prune::{self, PruneOptions, PruneReport};

use crate::args::{ForgetArgs, GlobalArgs};
use crate::context;
use crate::output;
use crate::progress::Progress;

/// A `--keep-within*` duration.
fn within(value: &Option<String>, option: &str) -> Result<Option<jiff::Span>> {
    value
        .as_deref()
        .map(forget::parse_within)
        .transpose()
        .map_err(|e| anyhow::anyhow!("{option}: {e}"))
}

pub fn run(g: &GlobalArgs, a: ForgetArgs) -> Result<u8> {
    let policy = KeepPolicy {
        last: a.keep_last,
        hourly: a.keep_hourly,
        daily: a.keep_daily,
        weekly: a.keep_weekly,
        monthly: a.keep_monthly,
        yearly: a.keep_yearly,
        within: within(&a.keep_within, "--keep-within")?,
        within_hourly: within(&a.keep_within_hourly, "--keep-within-hourly")?,
        within_daily: within(&a.keep_within_daily, "--keep-within-daily")?,
        within_weekly: within(&a.keep_within_weekly, "--keep-within-weekly")?,
        within_monthly: within(&a.keep_within_monthly, "--keep-within-monthly")?,
        within_yearly: within(&a.keep_within_yearly, "--keep-within-yearly")?,
        tags: a.keep_tags.clone(),
    };
    let group_by: GroupBy = a.group_by.parse().map_err(anyhow::Error::msg)?;
    let filter = super::snapshot_filter(&a.filter)?;
    let repo = context::open(g)?;
    let forget_json;
    if !a.snapshots.is_empty() {
        if !policy.is_empty() {
            anyhow::bail!("Give either snapshot ids or a --keep-* policy, not both");
        }
        let mut ids = Vec::new();
        for spec in &a.snapshots {
            // By id alone: a damaged snapshot must still be removable.
            ids.push(match spec.as_str() {
                "latest" => cairn_core::ops::select::find_snapshot(&repo, spec, &filter)?.0,
                _ => repo.resolve_snapshot_id(spec)?,
            });
        }
        if !a.dry_run {
            forget::remove(&repo, &ids)?;
        }
        forget_json = serde_json::json!({
            "groups": [],
            "removed_ids": ids.iter().map(|i| i.to_hex()).collect::<Vec<_>>(),
            "dry_run": a.dry_run,
        });
        if !g.json && !g.quiet {
            let verb = if a.dry_run { "would remove" } else { "removed" };
            for id in &ids {
                println!("{verb} snapshot {}", id.short());
            }
        }
    } else {
        let report = forget::forget(&repo, &policy, group_by, &filter, a.dry_run)?;
        forget_json = report_json(&report);
        if !g.json && !g.quiet {
            let mut out = std::io::stdout().lock();
            for group in &report.groups {
                let key = (group.host.clone(), group.paths.clone(), group.tags.clone());
                writeln!(out, "{}:", super::snapshots::group_label(&key))?;
                for d in &group.snapshots {
                    let verdict = if d.keep {
                        format!("keep ({})", d.reasons.join(", "))
                    } else if a.dry_run {
                        "would remove".into()
                    } else {
                        "removed".into()
                    };
                    writeln!(
                        out,
                        "  {}  {}  {verdict}",
                        d.id.short(),
                        output::local_time(d.time)
                    )?;
                }
            }
            let verb = if a.dry_run { "would remove" } else { "removed" };
            writeln!(
                out,
                "{verb} {}",
                output::count(report.removed.len() as u64, "snapshot", "snapshots")
            )?;
        }
    }
    drop(repo);
    if a.prune && !a.dry_run {
        let report = run_prune(g, a.max_unused, false)?;
        if g.json {
            output::json(&serde_json::json!({"forget": forget_json, "prune": report}))?;
        } else if !g.quiet {
            print_prune(&report);
        }
    } else if g.json {
        output::json(&forget_json)?;
    }
    Ok(0)
}

/// A policy's decisions as docs/JSON.md shows them: each snapshot named by
/// `snapshot_id`, each group by only the fields grouped by.
fn report_json(r: &forget::ForgetReport) -> serde_json::Value {
    let groups: Vec<_> = r
        .groups
        .iter()
        .map(|g| {
            let decisions: Vec<_> = g
                .snapshots
                .iter()
                .map(|d| {
                    serde_json::json!({
                        "snapshot_id": d.id.to_hex(),
                        "snapshot_short_id": d.id.short(),
                        "time": d.time,
                        "keep": d.keep,
                        "reasons": d.reasons,
                    })
                })
                .collect();
            serde_json::json!({
                "group": output::group_json(&g.host, &g.paths, &g.tags),
                "decisions": decisions,
            })
        })
        .collect();
    serde_json::json!({
        "groups": groups,
        "removed_ids": r.removed.iter().map(|i| i.to_hex()).collect::<Vec<_>>(),
        "dry_run": r.dry_run,
    })
}

pub fn prune(g: &GlobalArgs, max_unused: f64, dry_run: bool) -> Result<u8> {
    let report = run_prune(g, max_unused, dry_run)?;
    if g.json {
        output::json(&report)?;
    } else if !g.quiet {
        print_prune(&report);
    }
    Ok(0)
}

fn run_prune(g: &GlobalArgs, max_unused: f64, dry_run: bool) -> Result<PruneReport> {
    if !(0.0..=100.0).contains(&max_unused) {
        anyhow::bail!("--max-unused must be a percentage between 0 and 100");
    }
    let mut repo = context::open(g)?;
    let opts = PruneOptions {
        max_unused_percent: max_unused,
        dry_run,
        host: gethostname::gethostname().to_string_lossy().into_owned(),
    };
    let monitor = Progress::phases(g, "prune");
    let report = prune::prune(&mut repo, &opts, &monitor)?;
    monitor.finish();
    Ok(report)
}

fn print_prune(r: &PruneReport) {
    let would = if r.dry_run { "would be " } else { "" };
    println!(
        "{} {} {}; {} ({}) {} unused",
        output::count(r.snapshots, "snapshot", "snapshots"),
        if r.snapshots == 1 { "needs" } else { "need" },
        output::count(r.blobs_used, "blob", "blobs"),
        output::count(r.blobs_unused, "blob", "blobs"),
        output::size(r.bytes_unused),
        if r.blobs_unused == 1 { "is" } else { "are" }
    );
    if r.writer_packs_verified > 0 {
        println!(
            "{} pack(s) written with write-only keys verified: full keys build on them now",
            r.writer_packs_verified
        );
    }
    if r.packs_repacked > 0 {
        println!(
            "{} packs {would}repacked ({} blobs, {} kept)",
            r.packs_repacked,
            r.blobs_repacked,
            output::size(r.bytes_repacked)
        );
    }
    println!(
        "{} of {} packs {would}deleted, {} freed",
        r.packs_deleted,
        r.packs,
        output::size(r.bytes_freed)
    );
    if r.packs_deferred > 0 {
        println!(
            "{} unused packs are kept until these backups, which may build on them, have ended; run prune again later:",
            r.packs_deferred
        );
        for s in &r.blocking_sessions {
            println!("  {s}");
        }
    }
    if r.packs_rescued > 0 {
        println!(
            "{} packs condemned earlier are needed again and were kept",
            r.packs_rescued
        );
    }
    if r.packs_adopted > 0 {
        println!(
            "{} packs that an unfinished backup left in no index were indexed",
            r.packs_adopted
        );
    }
    if r.packs_unindexed > 0 {
        println!(
            "{} packs are in no index: a running backup may be writing them (they are indexed once \
             older than the grace period), or their header is damaged (see `cairn check`)",
            r.packs_unindexed
        );
    }
    if r.temporaries_deleted > 0 {
        println!(
            "{} temporary files of cut writes deleted",
            r.temporaries_deleted
        );
    }
}

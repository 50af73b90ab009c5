use std::io::Write;

use anyhow::Result;
use cairn_core::ops::check::{self, CheckOptions, Subset};

use crate::args::{CheckArgs, GlobalArgs};
use crate::context;
use crate::output;
use crate::progress::Progress;

pub fn run(g: &GlobalArgs, a: CheckArgs) -> Result<u8> {
    let read_data = match (&a.read_data_subset, a.read_data) {
        (Some(s), _) => Some(s.parse::<Subset>().map_err(anyhow::Error::msg)?),
        (None, true) => Some(Subset::All),
        (None, false) => None,
    };
    let repo = context::open_for_check(g)?;
    let monitor = Progress::phases(g, "check");
    let opts = CheckOptions { read_data };
    let report = match repo.key().is_write_only() {
        true => check::check_structure(&repo, &opts, &monitor)?,
        false => check::check(&repo, &opts, &monitor)?,
    };
    monitor.finish();
    let code = if report.problems.is_empty() { 0 } else { 1 };
    if g.json {
        let mut v = serde_json::to_value(&report)?;
        // Each damaged snapshot with its short id too, as every document names one.
        for p in v["problems"].as_array_mut().into_iter().flatten() {
            for d in p["damages"].as_array_mut().into_iter().flatten() {
                let short = d["snapshot_id"].as_str().and_then(|id| id.get(..8));
                d["snapshot_short_id"] = short.map(String::from).into();
            }
        }
        output::json(&v)?;
        return Ok(code);
    }
    let mut out = std::io::stdout().lock();
    for note in &report.notes {
        writeln!(out, "note: {note}")?;
    }
    for p in &report.problems {
        writeln!(out, "problem: {}: {}", p.object, p.problem)?;
        if p.damaged_paths > 0 {
            writeln!(
                out,
                "  damages {}:",
                output::count(p.damaged_paths, "path", "paths")
            )?;
            for d in &p.damages {
                writeln!(out, "    snapshot {}  {}", d.snapshot.short(), d.path)?;
            }
            if p.damaged_paths > p.damages.len() as u64 {
                writeln!(
                    out,
                    "    ... and {} more",
                    p.damaged_paths - p.damages.len() as u64
                )?;
            }
        }
        writeln!(out, "  repair: {}", p.repair)?;
    }
    if !report.repair_commands.is_empty() {
        // One command a line, so that it can be copied (or parsed) as it is.
        writeln!(out, "To repair, run in this order:")?;
        for c in &report.repair_commands {
            writeln!(out, "  {c}")?;
        }
        if let Some(note) = &report.repair_note {
            writeln!(out, "{note}")?;
        }
    }
    if !g.quiet || code != 0 {
        writeln!(
            out,
            "Checked {} snapshots, {} trees, {} data blobs, {} packs ({} read, {}, {} blobs verified) in {}: {}",
            report.snapshots,
            report.trees,
            report.data_blobs,
            report.packs,
            report.packs_read,
            output::size(report.bytes_read),
            report.blobs_verified,
            output::seconds(report.duration_ms),
            if code == 0 { "no problems found".to_string() } else { output::count(report.problems.len() as u64, "problem", "problems") }
        )?;
    }
    Ok(code)
}

use anyhow::Result;
use cairn_core::ops::repair;

use crate::args::{GlobalArgs, RepairCommand};
use crate::context;
use crate::output;
use crate::progress::Progress;

pub fn run(g: &GlobalArgs, cmd: RepairCommand) -> Result<u8> {
    let mut repo = context::open_uncached(g)?;
    let monitor = Progress::phases(g, "repair");
    match cmd {
        RepairCommand::Index(a) => {
            let r = repair::repair_index(&mut repo, a.read_data, &monitor)?;
            monitor.finish();
            if g.json {
                let mut v = serde_json::to_value(&r)?;
                v["packs_unreadable"] = pairs(&r.packs_unreadable, "pack", "error");
                output::json(&v)?;
            } else if !g.quiet {
                if r.up_to_date {
                    println!(
                        "The index already names the {} packs ({} blobs) as they are: nothing to do",
                        r.packs_indexed, r.blobs_indexed
                    );
                } else {
                    println!(
                        "Indexed {} packs ({} blobs), replacing {} index files",
                        r.packs_indexed, r.blobs_indexed, r.index_files_replaced
                    );
                }
                if r.blobs_damaged > 0 {
                    println!(
                        "Left out {} damaged blobs: `cairn repair snapshots --forget` replaces the snapshots \
                         that need them by repaired ones, and backing those files up again stores them anew",
                        r.blobs_damaged
                    );
                }
                for pack in &r.packs_header_damaged {
                    println!("  header damaged, blobs taken from the old index: {pack}");
                }
                if r.packs_condemned > 0 {
                    println!(
                        "Copied the intact blobs of {} damaged packs to new ones; `cairn prune` deletes the damaged ones",
                        r.packs_condemned
                    );
                }
                for (pack, why) in &r.packs_unreadable {
                    println!("  unreadable, left out: {pack}: {why}");
                }
            }
            Ok(if r.packs_unreadable.is_empty() { 0 } else { 1 })
        }
        RepairCommand::Snapshots(a) => {
            let r = repair::repair_snapshots(&mut repo, a.forget, a.dry_run, &monitor)?;
            monitor.finish();
            if g.json {
                output::json(&serde_json::json!({
                    "snapshots_checked": r.snapshots_checked,
                    "snapshots_repaired": pairs(&r.snapshots_repaired, "old_id", "new_id"),
                    "snapshots_already_repaired":
                        pairs(&r.snapshots_already_repaired, "old_id", "new_id"),
                    "snapshots_duplicate_ids": r.snapshots_duplicate,
                    "snapshots_lost_ids": r.snapshots_lost,
                    "files_damaged": r.files_damaged,
                    "dirs_damaged": r.dirs_damaged,
                    "snapshots_removed": r.snapshots_removed,
                    "dry_run": a.dry_run,
                }))?;
            } else if !g.quiet {
                let verb = if a.dry_run { "would be " } else { "" };
                let removes = a.forget && !a.dry_run;
                for id in &r.snapshots_lost {
                    let fate = if removes {
                        "removed"
                    } else {
                        "remove it with --forget"
                    };
                    println!(
                        "snapshot {} lost its root directory and cannot be repaired; {fate}",
                        &id[..8]
                    );
                }
                for (old, new) in &r.snapshots_already_repaired {
                    let fate = match (a.forget, a.dry_run) {
                        (true, false) => "removed the damaged original",
                        (true, true) => "the damaged original would be removed",
                        (false, _) => "not repaired again; --forget removes the damaged original",
                    };
                    println!(
                        "snapshot {} was already repaired as {}: {fate}",
                        &old[..8],
                        &new[..8]
                    );
                }
                for id in &r.snapshots_duplicate {
                    let fate = if removes {
                        "removed"
                    } else {
                        "--forget removes it"
                    };
                    println!(
                        "snapshot {} is an identical copy of another repaired snapshot; {fate}",
                        &id[..8]
                    );
                }
                for (old, new) in &r.snapshots_repaired {
                    let new = if new.is_empty() {
                        String::new()
                    } else {
                        format!(" as {}", &new[..8])
                    };
                    println!("snapshot {} {verb}repaired{new}", &old[..8]);
                }
                let would_remove = a.forget
                    && !(r.snapshots_lost.is_empty()
                        && r.snapshots_already_repaired.is_empty()
                        && r.snapshots_duplicate.is_empty());
                if r.snapshots_repaired.is_empty() && r.snapshots_removed == 0 && !would_remove {
                    println!("{} snapshots checked: nothing to do", r.snapshots_checked);
                } else {
                    println!(
                        "{} snapshots checked, {} {verb}repaired: {} damaged files kept as NAME.damaged, {} unreadable directories emptied{}",
                        r.snapshots_checked,
                        r.snapshots_repaired.len(),
                        r.files_damaged,
                        r.dirs_damaged,
                        if r.snapshots_removed > 0 { format!(", {} snapshots removed", r.snapshots_removed) } else { String::new() }
                    );
                }
            }
            Ok(if r.snapshots_lost.is_empty() || a.forget {
                0
            } else {
                1
            })
        }
    }
}

/// Pairs as objects with named members, as docs/JSON.md shows them.
fn pairs(list: &[(String, String)], first: &str, second: &str) -> serde_json::Value {
    list.iter()
        .map(|(a, b)| serde_json::json!({ first: a, second: b }))
        .collect()
}

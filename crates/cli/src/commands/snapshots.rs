use std::io::Write;

use anyhow::Result;

use crate::args::GlobalArgs;
use crate::{context, output};

pub fn run(g: &GlobalArgs) -> Result<u8> {
    let repo = context::open(g)?;
    let list = repo.snapshots()?;
    for (_, e) in &list.damaged {
        eprintln!(
            "warning: {}",
            crate::output::message(&cairn_core::error::chain(e))
        );
    }
    if g.json {
        let items: Vec<_> = list
            .snapshots
            .iter()
            .map(|(id, s)| {
                let mut v = serde_json::to_value(s).expect("a snapshot serializes");
                v["id"] = id.to_hex().into();
                v["short_id"] = id.short().into();
                v
            })
            .collect();
        output::json(&items)?;
        return Ok(0);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<8}  {:<19}  {:<16}  {:<12}  {:>10}  Paths",
        "ID", "Time", "Host", "Tags", "Size"
    )?;
    for (id, s) in &list.snapshots {
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
    writeln!(out, "{} snapshots", list.snapshots.len())?;
    Ok(if list.damaged.is_empty() { 0 } else { 1 })
}

use std::os::unix::ffi::OsStrExt;

use anyhow::Result;
use cairn_core::ops::restore::{self, Overwrite, RestoreOptions};

use crate::args::{GlobalArgs, OverwriteArg, RestoreArgs};
use crate::context;
use crate::output::{self, StderrMonitor};

pub fn run(g: &GlobalArgs, a: RestoreArgs) -> Result<u8> {
    let arg = a.snapshot.as_bytes();
    let (spec, subpath) = match arg.iter().position(|&b| b == b':') {
        Some(i) => (&arg[..i], Some(arg[i + 1..].to_vec())),
        None => (arg, None),
    };
    let spec = std::str::from_utf8(spec)
        .map_err(|_| anyhow::anyhow!("{:?} is not a snapshot id", a.snapshot))?;
    let repo = context::open(g)?;
    // From here on, Ctrl-C stops cleanly instead of leaving files behind.
    crate::signals::install();
    let (id, snapshot) = repo.find_snapshot(spec)?;
    let opts = RestoreOptions {
        target: a.target.clone(),
        subpath,
        verify: a.verify,
        overwrite: match a.overwrite {
            Some(OverwriteArg::Always) => Some(Overwrite::Always),
            Some(OverwriteArg::IfChanged) => Some(Overwrite::IfChanged),
            Some(OverwriteArg::IfNewer) => Some(Overwrite::IfNewer),
            Some(OverwriteArg::Never) => Some(Overwrite::Never),
            // --delete means "make the target match", which only makes sense over an
            // existing target; rewriting files that already match would be waste.
            None if a.delete => Some(Overwrite::IfChanged),
            None => None,
        },
        owners: nix_is_root(),
        includes: a.includes.clone(),
        excludes: a.excludes.clone(),
        delete: a.delete,
    };
    let stats = restore::restore(&repo, &snapshot, &opts, &StderrMonitor::new(g))?;
    if g.json {
        let mut v = serde_json::to_value(&stats)?;
        v["snapshot_id"] = id.to_hex().into();
        output::json(&v)?;
    } else if !g.quiet {
        println!(
            "Restored snapshot {} to {}: {} files written ({}), {} dirs, {} links and special files{}{}{}{}{} in {}",
            id.short(),
            a.target.display(),
            stats.files_restored,
            output::size(stats.bytes_restored),
            stats.dirs_restored,
            stats.others_restored + stats.hardlinks_restored,
            if stats.unchanged > 0 { format!(", {} unchanged", stats.unchanged) } else { String::new() },
            if stats.files_skipped > 0 { format!(", {} existing kept", stats.files_skipped) } else { String::new() },
            if a.delete { format!(", {} deleted", stats.deleted) } else { String::new() },
            if stats.temp_files_removed > 0 { format!(", {} leftover temporary files removed", stats.temp_files_removed) } else { String::new() },
            if a.verify { format!(", {} verified", stats.files_verified) } else { String::new() },
            output::seconds(stats.duration_ms),
        );
    }
    if stats.errors.is_empty() {
        Ok(0)
    } else {
        eprintln!(
            "error: {} path(s) could not be restored (listed above); everything else was",
            stats.errors.len()
        );
        Ok(1)
    }
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

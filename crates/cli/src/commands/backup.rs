use std::io::Write;

use anyhow::{Context, Result};
use cairn_core::ops::backup::{self, BackupOptions, BackupReport};
use cairn_core::ops::exclude::Excludes;

use crate::args::{BackupArgs, GlobalArgs};
use crate::output;
use crate::progress::{scan, Progress};
use crate::{context, EXIT_PARTIAL};

pub fn run(g: &GlobalArgs, a: BackupArgs) -> Result<u8> {
    let exclude = super::exclude_options(&a.exclude)?;
    let mut repo = context::open_or_create_default(g)?;
    // From here on, Ctrl-C stops cleanly instead of leaving files behind.
    crate::signals::install();
    let parent = match &a.parent {
        Some(spec) => Some(repo.find_snapshot(spec)?.0),
        None => None,
    };
    let opts = BackupOptions {
        paths: a.paths.clone(),
        exclude,
        tags: a.tags.clone(),
        host: a
            .host
            .clone()
            .unwrap_or_else(|| gethostname::gethostname().to_string_lossy().into_owned()),
        username: username(),
        one_file_system: a.one_file_system,
        parent,
        force: a.force,
        read_threads: a.read_threads.map_or(0, usize::from),
    };
    let monitor = progress(g, &a, &opts)?;
    let report = if a.stdin {
        let name = a
            .stdin_filename
            .as_deref()
            .context("--stdin needs --stdin-filename NAME")?;
        let mut stdin = std::io::stdin().lock();
        backup::backup_stdin(&mut repo, name, &mut stdin, &opts, &monitor)?
    } else {
        backup::backup(&mut repo, &opts, &monitor)?
    };
    monitor.finish();
    for pattern in &report.excludes_unmatched {
        eprintln!(
            "warning: exclude pattern {} matched nothing (with a '/', a pattern matches the \
             end of a path, or from the root if it starts with '/')",
            output::message(&format!("{pattern:?}"))
        );
    }
    for problem in repo.index_problems() {
        eprintln!(
            "warning: {}",
            crate::output::message(&cairn_core::error::chain(problem))
        );
    }
    print(g, &report)?;
    Ok(if report.stats.errors.is_empty() {
        0
    } else {
        EXIT_PARTIAL
    })
}

/// The progress display, with a pre-scan of the paths for its totals unless `--no-scan`,
/// `--stdin`, or nobody watches.
fn progress(g: &GlobalArgs, a: &BackupArgs, opts: &BackupOptions) -> Result<Progress> {
    let mut monitor = Progress::files(g, "backup");
    if monitor.shown() && !a.no_scan && !a.stdin {
        let scan = scan::ScanOptions {
            paths: opts.paths.clone(),
            excludes: Excludes::new(&opts.exclude.excludes)?,
            one_file_system: opts.one_file_system,
            exclude_larger_than: opts.exclude.exclude_larger_than,
        };
        let stop = scan::spawn(scan, monitor.feed());
        monitor.stop_on_finish(stop);
    }
    Ok(monitor)
}

/// The account running the backup: the effective user's name, else `$USER` (a uid
/// without a passwd entry, as in some containers).
pub fn username() -> String {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    match cairn_core::fsmeta::NameCache::default().user(euid) {
        Some(name) => name.to_owned(),
        None => std::env::var("USER").unwrap_or_default(),
    }
}

fn print(g: &GlobalArgs, r: &BackupReport) -> Result<()> {
    let s = &r.stats;
    if g.json {
        let mut v = serde_json::to_value(s)?;
        v["snapshot_id"] = r.snapshot_id.to_hex().into();
        v["short_id"] = r.snapshot_id.short().into();
        v["parent"] = r.parent.map(|p| p.to_hex()).into();
        return output::json(&v);
    }
    if g.quiet {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    if let Some(p) = r.parent {
        writeln!(out, "Parent:   snapshot {}", p.short())?;
    }
    writeln!(
        out,
        "Files:    {} new, {} changed, {} unchanged",
        s.files_new, s.files_changed, s.files_unchanged
    )?;
    writeln!(
        out,
        "Dirs:     {}   Others: {}   Excluded: {}",
        s.dirs, s.others, s.excluded
    )?;
    writeln!(
        out,
        "Read:     {} of {}",
        output::size(s.bytes_read),
        output::size(s.total_bytes)
    )?;
    writeln!(
        out,
        "Chunks:   {} read, {} already stored",
        s.chunks, s.chunks_present
    )?;
    writeln!(
        out,
        "Added:    {} stored ({} before compression, {} new blobs)",
        output::size(s.bytes_added),
        output::size(s.raw_bytes_added),
        s.blobs_added
    )?;
    writeln!(out, "Duration: {}", output::seconds(s.duration_ms))?;
    if g.stats {
        // Summed over threads: with several cores busy they exceed the duration.
        let p = &s.phases_ms;
        writeln!(
            out,
            "Phases:   walk {}, read {}, chunk {}, hash {}, compress {}, encrypt {}, write {} (summed over threads)",
            output::seconds(p.walk),
            output::seconds(p.read),
            output::seconds(p.chunk),
            output::seconds(p.hash),
            output::seconds(p.compress),
            output::seconds(p.encrypt),
            output::seconds(p.write)
        )?;
    }
    writeln!(out, "snapshot {} saved", r.snapshot_id.short())?;
    if !s.errors.is_empty() {
        eprintln!(
            "warning: {} could not be backed up (listed above); {} not in this snapshot",
            output::count(s.errors.len() as u64, "path", "paths"),
            if s.errors.len() == 1 {
                "it is"
            } else {
                "they are"
            }
        );
    }
    Ok(())
}

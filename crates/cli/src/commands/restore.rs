use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use cairn_core::id::SnapshotId;
use cairn_core::ops::browse::{self, Entry};
use cairn_core::ops::restore::{self, Overwrite, RestoreOptions};
use cairn_core::ops::restore_plan::{self, Action};
use cairn_core::repo::Repository;
use cairn_core::snapshot::Snapshot;
use cairn_core::tree::NodeKind;

use crate::args::{GlobalArgs, OverwriteArg, RestoreArgs};
use crate::context;
use crate::output;
use crate::progress::{Feed, Progress};

pub fn run(g: &GlobalArgs, a: RestoreArgs) -> Result<u8> {
    let arg = a.snapshot.as_bytes();
    let (spec, subpath) = match arg.iter().position(|&b| b == b':') {
        Some(i) => (&arg[..i], Some(arg[i + 1..].to_vec())),
        None => (arg, None),
    };
    let spec = std::str::from_utf8(spec)
        .map_err(|_| anyhow::anyhow!("{:?} is not a snapshot id", a.snapshot))?;
    let filter = super::snapshot_filter(&a.filter)?;
    let repo = context::open(g)?;
    // From here on, Ctrl-C stops cleanly instead of leaving files behind.
    crate::signals::install();
    let (id, snapshot) = cairn_core::ops::select::find_snapshot(&repo, spec, &filter)?;
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
        force: a.force,
        no_special_files: a.no_special_files,
        no_setuid: a.no_setuid,
    };
    if a.dry_run {
        return dry_run(g, &a, &repo, id, &snapshot, &opts);
    }
    let monitor = Progress::files(g, "restore");
    let counting = AtomicBool::new(true);
    let stats = std::thread::scope(|scope| {
        if monitor.shown() && opts.includes.is_empty() && opts.excludes.is_empty() {
            match opts.subpath.as_deref() {
                None => monitor.set_totals(snapshot.summary.files, snapshot.summary.total_bytes),
                // Without a cache, counting would download a remote subtree's trees twice.
                Some(path) if !repo.storage().is_remote() || repo.cache().is_some() => {
                    let (repo, snapshot, feed) = (&repo, &snapshot, monitor.feed());
                    let counting = &counting;
                    scope.spawn(move || count_selection(repo, snapshot, path, feed, counting));
                }
                Some(_) => {}
            }
        }
        let stats = restore::restore(&repo, &snapshot, &opts, &monitor)
            .map_err(|e| e.naming_snapshot(&id, &snapshot));
        counting.store(false, Ordering::Relaxed);
        stats
    })?;
    monitor.finish();
    // Listed whatever the output mode: nothing is left out without a word. With --json
    // the same lists are in the summary.
    for w in &stats.warnings {
        eprintln!("warning: {w}");
    }
    if !g.json {
        if a.verbose {
            for path in &stats.deleted_paths {
                eprintln!("deleted {}", output::name(path.as_bytes()));
            }
        }
        for s in &stats.specials_skipped {
            eprintln!("not restored ({}): {}", s.kind, s.path);
        }
        for path in &stats.setuid_cleared {
            eprintln!("setuid/setgid bits cleared (--no-setuid): {path}");
        }
    }
    if g.json {
        let mut v = serde_json::to_value(&stats)?;
        v["snapshot_id"] = id.to_hex().into();
        v["snapshot_short_id"] = id.short().into();
        v["dry_run"] = false.into();
        output::json(&v)?;
    } else if stats.interrupted {
        // Files are renamed into place only when complete: what is there is right, and
        // every mode but `always` (which rewrites all) keeps it and writes the rest.
        let again = match opts.overwrite {
            None | Some(Overwrite::Always) => "run it again with --overwrite if-changed",
            Some(_) => "run the same command again",
        };
        eprintln!(
            "restore interrupted: {} written ({}) to {}, each complete; to finish, {} \
             (files already restored are kept, the rest written)",
            output::count(stats.files_restored, "file", "files"),
            output::size(stats.bytes_restored),
            a.target.display(),
            again,
        );
    } else if !g.quiet {
        println!(
            "Restored snapshot {} to {}: {} written ({}), {}, {}{}{}{}{}{} in {}",
            id.short(),
            a.target.display(),
            output::count(stats.files_restored, "file", "files"),
            output::size(stats.bytes_restored),
            output::count(stats.dirs_restored, "dir", "dirs"),
            output::count(
                stats.others_restored + stats.hardlinks_restored,
                "link or special file",
                "links and special files"
            ),
            if stats.unchanged > 0 {
                format!(", {} unchanged", stats.unchanged)
            } else {
                String::new()
            },
            if stats.files_skipped > 0 {
                format!(", {} existing kept", stats.files_skipped)
            } else {
                String::new()
            },
            if a.delete {
                format!(", {} deleted", stats.deleted)
            } else {
                String::new()
            },
            if stats.temp_files_removed > 0 {
                format!(
                    ", {} leftover temporary files removed",
                    stats.temp_files_removed
                )
            } else {
                String::new()
            },
            if a.verify {
                format!(", {} verified", stats.files_verified)
            } else {
                String::new()
            },
            output::seconds(stats.duration_ms),
        );
    }
    if stats.interrupted {
        Ok(crate::EXIT_INTERRUPTED)
    } else if stats.errors.is_empty() {
        Ok(0)
    } else {
        eprintln!(
            "error: {} could not be restored (listed above); everything else was",
            output::count(stats.errors.len() as u64, "path", "paths")
        );
        Ok(1)
    }
}

/// `--dry-run`: the plan, each path with `-v`, and its counts.
fn dry_run(
    g: &GlobalArgs,
    a: &RestoreArgs,
    repo: &Repository,
    id: SnapshotId,
    snapshot: &Snapshot,
    opts: &RestoreOptions,
) -> Result<u8> {
    let plan =
        restore_plan::plan(repo, snapshot, opts).map_err(|e| e.naming_snapshot(&id, snapshot))?;
    // (action, JSON key, text)
    let counts = [
        (Action::Write, "to_write", "to write"),
        (Action::Unchanged, "unchanged", "unchanged"),
        (Action::Keep, "to_keep", "to keep as they are"),
        (Action::Delete, "to_delete", "to delete"),
    ];
    if g.json {
        let mut v = serde_json::to_value(&plan)?;
        v["snapshot_id"] = id.to_hex().into();
        v["snapshot_short_id"] = id.short().into();
        v["dry_run"] = true.into();
        for (action, key, _) in counts {
            v[key] = plan.count(action).into();
        }
        output::json(&v)?;
        return Ok(0);
    }
    if a.verbose {
        let mut out = std::io::stdout().lock();
        for e in &plan.entries {
            let verb = match e.action {
                Action::Write => "write",
                Action::Unchanged => "unchanged",
                Action::Keep => "keep",
                Action::Delete => "delete",
            };
            writeln!(out, "{verb:<9} {}", output::name(e.path.as_bytes()))?;
        }
    }
    let summary: Vec<String> = counts
        .iter()
        .map(|(action, _, text)| format!("{} {text}", plan.count(*action)))
        .collect();
    println!(
        "Dry run of snapshot {} to {}: {}; nothing was changed",
        id.short(),
        a.target.display(),
        summary.join(", ")
    );
    Ok(0)
}

/// The progress totals of a restore of `SNAPSHOT:PATH`, from its trees, while the restore
/// runs (which reads the same trees, so the second reading is mostly from the cache).
/// With `--include`/`--exclude` there are none: that selection is the core's to make.
/// Gives up when `counting` turns false, and on any error, which the restore reports.
fn count_selection(
    repo: &Repository,
    snapshot: &Snapshot,
    path: &[u8],
    mut feed: Feed,
    counting: &AtomicBool,
) {
    let subtree = match browse::find(repo, snapshot, path) {
        Ok(Entry::Root(tree)) => tree,
        Ok(Entry::Node(node)) => match node.kind {
            NodeKind::Dir { subtree } => subtree,
            NodeKind::File { size, .. } => {
                feed.add(1, size);
                return feed.complete();
            }
            _ => return feed.complete(),
        },
        Err(_) => return,
    };
    let walked = browse::walk(repo, &subtree, path, &mut |_, node| {
        if !counting.load(Ordering::Relaxed) {
            return Err(cairn_core::Error::Interrupted);
        }
        if let NodeKind::File { size, .. } = node.kind {
            feed.add(1, size);
        }
        Ok(())
    });
    if walked.is_ok() {
        feed.complete();
    }
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

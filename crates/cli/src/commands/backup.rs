use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result};
use cairn_core::monitor::{FileChange, Monitor};
use cairn_core::ops::backup::{self, BackupOptions, BackupReport, CommandSource};
use cairn_core::ops::exclude::{ExcludeReason, Excludes};
use serde_json::Value;

use crate::args::{BackupArgs, GlobalArgs};
use crate::output;
use crate::progress::{scan, Progress};
use crate::{context, EXIT_PARTIAL};

pub fn run(g: &GlobalArgs, a: BackupArgs) -> Result<u8> {
    let exclude = super::exclude_options(&a.exclude)?;
    // A dry run writes nothing, not even the default repository on first use.
    let mut repo = match a.dry_run {
        true => context::open_without_index(g)?,
        false => context::open_or_create_default(g)?,
    };
    // From here on, Ctrl-C stops cleanly instead of leaving files behind.
    crate::signals::install();
    let parent = match &a.parent {
        Some(spec) => Some(repo.find_snapshot(spec)?.0),
        None => None,
    };
    let mut commands = Vec::new();
    if a.stdin_from_command {
        let name = a.stdin_filename.clone().unwrap_or_default();
        let argv = a.paths.iter().map(|p| p.clone().into_os_string()).collect();
        commands.push(CommandSource { name, argv });
    }
    let opts = BackupOptions {
        paths: paths(&a)?,
        commands,
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
        dry_run: a.dry_run,
        time: a.time,
    };
    let monitor = Listing::new(g, a.verbose, progress(g, &a, &opts)?);
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
    let entries = monitor.finish();
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
    print(g, &report, entries)?;
    Ok(if report.stats.errors.is_empty() {
        0
    } else {
        EXIT_PARTIAL
    })
}

/// The paths given, then those listed in `--files-from*` files. A listed path that does not
/// exist is an error naming it and its list, as in restic: a list is written by hand or by
/// a script, and a typo in it must not silently back up less.
fn paths(a: &BackupArgs) -> Result<Vec<PathBuf>> {
    // With --stdin-from-command they are the command.
    let mut paths = match a.stdin_from_command {
        true => Vec::new(),
        false => a.paths.clone(),
    };
    let lists = (a.files_from.iter().map(|f| (f, ListFormat::Lines)))
        .chain(
            a.files_from_verbatim
                .iter()
                .map(|f| (f, ListFormat::Verbatim)),
        )
        .chain(a.files_from_raw.iter().map(|f| (f, ListFormat::Raw)));
    for (file, format) in lists {
        let bytes = if file.as_os_str() == "-" {
            let mut bytes = Vec::new();
            std::io::stdin()
                .lock()
                .read_to_end(&mut bytes)
                .context("reading the list of paths from standard input")?;
            bytes
        } else {
            std::fs::read(file)
                .with_context(|| format!("cannot read the list of paths {}", file.display()))?
        };
        for (line, path) in format.paths(&bytes) {
            let path = PathBuf::from(std::ffi::OsStr::from_bytes(path));
            if let Err(e) = std::fs::symlink_metadata(&path) {
                anyhow::bail!(
                    "{}, listed in {} ({} {line}), cannot be backed up: {e}",
                    output::message(&path.display().to_string()),
                    file.display(),
                    if format == ListFormat::Raw {
                        "entry"
                    } else {
                        "line"
                    },
                );
            }
            paths.push(path);
        }
    }
    Ok(paths)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ListFormat {
    /// `--files-from`: lines, trimmed, without blank lines and `#` comments.
    Lines,
    /// `--files-from-verbatim`: lines as they are; only empty ones are skipped.
    Verbatim,
    /// `--files-from-raw`: NUL-separated.
    Raw,
}

impl ListFormat {
    /// The paths of a list, each with its number (of line or entry, from 1).
    fn paths(self, bytes: &[u8]) -> Vec<(usize, &[u8])> {
        let separator = if self == ListFormat::Raw {
            b'\0'
        } else {
            b'\n'
        };
        bytes
            .split(|b| *b == separator)
            .enumerate()
            .map(|(i, p)| (i + 1, p))
            .map(|(i, p)| match self {
                ListFormat::Lines => (i, p.trim_ascii()),
                ListFormat::Verbatim | ListFormat::Raw => (i, p),
            })
            .filter(|(_, p)| {
                let comment = self == ListFormat::Lines && p.starts_with(b"#");
                !p.is_empty() && !comment
            })
            .collect()
    }
}

/// The progress display, with a pre-scan of the paths for its totals unless `--no-scan`,
/// `--stdin`, or nobody watches.
fn progress(g: &GlobalArgs, a: &BackupArgs, opts: &BackupOptions) -> Result<Progress> {
    let mut monitor = Progress::files(g, "backup");
    if monitor.shown() && !a.no_scan && !a.stdin && !opts.paths.is_empty() {
        let scan = scan::ScanOptions {
            paths: opts.paths.clone(),
            excludes: Excludes::of(&opts.exclude)?,
            exclude: opts.exclude.clone(),
            one_file_system: opts.one_file_system,
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

fn print(g: &GlobalArgs, r: &BackupReport, entries: Option<Vec<Value>>) -> Result<()> {
    let s = &r.stats;
    if g.json {
        let mut v = serde_json::to_value(s)?;
        v["snapshot_id"] = r.snapshot_id.map(|id| id.to_hex()).into();
        v["snapshot_short_id"] = r.snapshot_id.map(|id| id.short()).into();
        v["parent_id"] = r.parent.map(|p| p.to_hex()).into();
        v["dry_run"] = r.snapshot_id.is_none().into();
        // `null` without -v: not listed, which `[]` (nothing to list) would not say.
        v["entries"] = entries.into();
        return output::json(&v);
    }
    if g.quiet {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    let would = if r.snapshot_id.is_none() {
        "Would add:"
    } else {
        "Added:   "
    };
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
        "{would} {} stored ({} before compression, {} new blobs)",
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
    match r.snapshot_id {
        Some(id) => writeln!(out, "snapshot {} saved", id.short())?,
        None => writeln!(out, "Dry run: nothing was written to the repository")?,
    }
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

/// The backup's monitor: the progress display, and with `-v` each file new or changed
/// (with `-vv` also unchanged, and each path left out with why) as a line on stdout, or
/// with `--json` gathered for the summary's `entries`.
struct Listing {
    progress: Progress,
    verbose: u8,
    /// With `--json`: the entries, in the order decided.
    json: Option<Mutex<Vec<Value>>>,
}

impl Listing {
    fn new(g: &GlobalArgs, verbose: u8, progress: Progress) -> Listing {
        let json = (g.json && verbose > 0).then(|| Mutex::new(Vec::new()));
        Listing {
            progress,
            verbose: if g.quiet && !g.json { 0 } else { verbose },
            json,
        }
    }

    fn entry(&self, path: &Path, action: &str, text: &str, extra: Value) {
        match &self.json {
            Some(entries) => {
                let mut v = extra;
                v["action"] = action.into();
                v["path"] = path.to_string_lossy().into_owned().into();
                if let Ok(mut entries) = entries.lock() {
                    entries.push(v);
                }
            }
            None => {
                let name = output::name(path.as_os_str().as_bytes());
                let line = format!("{action:<9} {name}{text}\n");
                self.progress.suspend(|| {
                    // A closed stdout (`| head`) shows up when the summary is printed.
                    let _ = std::io::stdout().lock().write_all(line.as_bytes());
                });
            }
        }
    }

    /// Ends the display; the entries gathered for `--json -v`.
    fn finish(self) -> Option<Vec<Value>> {
        self.progress.finish();
        self.json
            .map(|e| e.into_inner().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Monitor for Listing {
    fn problem(&self, path: &Path, error: &dyn std::fmt::Display) {
        self.progress.problem(path, error)
    }

    fn file_started(&self, path: &Path) {
        self.progress.file_started(path)
    }

    fn file_done(&self, path: &Path, bytes: u64) {
        self.progress.file_done(path, bytes)
    }

    fn bytes_done(&self, bytes: u64) {
        self.progress.bytes_done(bytes)
    }

    fn cancelled(&self) -> bool {
        self.progress.cancelled()
    }

    fn progress(&self, what: &str, done: u64, total: u64) {
        self.progress.progress(what, done, total)
    }

    fn file_change(&self, path: &Path, change: FileChange) {
        let (action, level) = match change {
            FileChange::New => ("new", 1),
            FileChange::Changed => ("changed", 1),
            FileChange::Unchanged => ("unchanged", 2),
        };
        if self.verbose >= level {
            self.entry(path, action, "", Value::Object(Default::default()));
        }
    }

    fn excluded(&self, path: &Path, reason: &ExcludeReason) {
        if self.verbose >= 2 {
            let text = format!("  ({})", output::message(&reason.to_string()));
            let extra = serde_json::to_value(reason).unwrap_or_default();
            self.entry(path, "excluded", &text, extra);
        }
    }
}

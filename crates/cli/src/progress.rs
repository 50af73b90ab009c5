//! How far a long command has come, shown to whoever is watching: a progress bar on a
//! terminal (files and bytes done, rate, ETA, the current path), JSON lines on stderr with
//! `--json`, nothing on a pipe or with `-q`.
//!
//! `Progress` is the `Monitor` the long commands hand to the core. It only counts and
//! displays; problems are still printed by `output::StderrMonitor`, above the bar. It never
//! writes to stdout, which holds the command's report (one JSON document with `--json`).

mod events;
pub mod scan;

use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cairn_core::monitor::Monitor;
use indicatif::{HumanCount, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

use crate::args::GlobalArgs;
use crate::output::StderrMonitor;

/// What a command counts: files and bytes (backup, restore), or the units of its phases
/// (`Monitor::progress`: packs, snapshots).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Files,
    Phases,
}

/// Whether the totals are known yet.
const TOTALS_UNKNOWN: u8 = 0;
/// A pre-scan is still adding to them.
const TOTALS_GROWING: u8 = 1;
const TOTALS_COMPLETE: u8 = 2;

/// The counters, shared by the threads that report (the core's workers, the pre-scan) and
/// the ones that display (indicatif's ticker, the JSON events thread).
struct Shared {
    command: &'static str,
    kind: Kind,
    started: Instant,
    files_done: AtomicU64,
    bytes_done: AtomicU64,
    files_total: AtomicU64,
    bytes_total: AtomicU64,
    totals: AtomicU8,
    /// The last file done, for the display.
    current: Mutex<String>,
    phase: Mutex<Option<Phase>>,
}

#[derive(Clone)]
struct Phase {
    what: String,
    done: u64,
    total: u64,
}

impl Shared {
    fn totals(&self) -> Option<(u64, u64)> {
        (self.totals.load(Ordering::Acquire) != TOTALS_UNKNOWN).then(|| {
            (
                self.files_total.load(Ordering::Relaxed),
                self.bytes_total.load(Ordering::Relaxed),
            )
        })
    }
}

/// The bar on the terminal now, if any, so that a warning raised deep inside a command (a
/// blob read from another copy, evidence of a rollback) is printed above it, not through
/// it: those hooks are installed when the repository opens, before any bar exists.
static SHOWN: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Prints `line` on standard error, above the progress bar if one is shown.
pub fn eprint_above_bar(line: &str) {
    let bar = SHOWN.lock().unwrap_or_else(|p| p.into_inner()).clone();
    match bar {
        Some(bar) => bar.suspend(|| eprintln!("{line}")),
        None => eprintln!("{line}"),
    }
}

fn show(bar: &ProgressBar) {
    *SHOWN.lock().unwrap_or_else(|p| p.into_inner()) = Some(bar.clone());
}

pub struct Progress {
    shared: Arc<Shared>,
    /// Made at once for backup and restore; for phases at the first `progress` call, so a
    /// command that reports none shows no empty bar.
    bar: OnceLock<ProgressBar>,
    tty: bool,
    events: Option<events::Events>,
    scan_stop: Option<scan::StopHandle>,
    problems: StderrMonitor,
    /// When the bar's path was last changed: at most 10 times a second, since drawing costs
    /// more than backing up a small file.
    last_message_ms: AtomicU64,
}

impl Progress {
    /// Backup and restore: files and bytes. The totals stay unknown until `totals` or a
    /// pre-scan (`scan::spawn` with `feed`) gives them.
    pub fn files(g: &GlobalArgs, command: &'static str) -> Progress {
        let p = Progress::new(g, command, Kind::Files);
        if p.tty {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(style(&p.shared));
            bar.set_prefix(command);
            bar.enable_steady_tick(Duration::from_millis(200));
            show(&bar);
            let _ = p.bar.set(bar);
        }
        p
    }

    /// check, prune, repair: the phases they report through `Monitor::progress`.
    pub fn phases(g: &GlobalArgs, command: &'static str) -> Progress {
        Progress::new(g, command, Kind::Phases)
    }

    fn new(g: &GlobalArgs, command: &'static str, kind: Kind) -> Progress {
        let shared = Arc::new(Shared {
            command,
            kind,
            started: Instant::now(),
            files_done: AtomicU64::new(0),
            bytes_done: AtomicU64::new(0),
            files_total: AtomicU64::new(0),
            bytes_total: AtomicU64::new(0),
            totals: AtomicU8::new(TOTALS_UNKNOWN),
            current: Mutex::new(String::new()),
            phase: Mutex::new(None),
        });
        let tty = !g.quiet && !g.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
        let events = (g.json && !g.quiet).then(|| events::Events::start(shared.clone()));
        Progress {
            shared,
            bar: OnceLock::new(),
            tty,
            events,
            scan_stop: None,
            problems: StderrMonitor,
            last_message_ms: AtomicU64::new(0),
        }
    }

    /// Known totals (a snapshot's summary): the ETA is meaningful from the start.
    pub fn set_totals(&self, files: u64, bytes: u64) {
        let mut feed = self.feed();
        feed.add(files, bytes);
        feed.complete();
    }

    /// Whether anyone is watching, so that work done only for the display can be skipped.
    pub fn shown(&self) -> bool {
        self.tty || self.events.is_some()
    }

    /// A handle for a thread that counts the totals while the command runs.
    pub fn feed(&self) -> Feed {
        self.shared.totals.store(TOTALS_GROWING, Ordering::Release);
        let bar = self.bar.get().cloned();
        if let Some(bar) = &bar {
            bar.set_style(style(&self.shared));
        }
        Feed {
            shared: self.shared.clone(),
            bar,
            files: 0,
            bytes: 0,
            sent: Instant::now(),
        }
    }

    /// Runs `f` with the bar hidden, to print lines above it.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.bar.get() {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    /// Stops the pre-scan when the command ends.
    pub fn stop_on_finish(&mut self, stop: scan::StopHandle) {
        self.scan_stop = Some(stop);
    }

    /// Clears the bar, and prints the last JSON event. Before the command prints its
    /// report; dropping does the same on the way out of an error.
    pub fn finish(mut self) {
        self.end();
    }

    fn end(&mut self) {
        if let Some(stop) = self.scan_stop.take() {
            stop.stop();
        }
        if let Some(bar) = self.bar.get() {
            bar.finish_and_clear();
            *SHOWN.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        if let Some(events) = self.events.take() {
            events.finish();
        }
    }

    fn elapsed_ms(&self) -> u64 {
        self.shared.started.elapsed().as_millis() as u64
    }

    /// Shows `path` as the file being worked on; with `throttle`, at most every 100 ms
    /// on a terminal (files done come by the thousand a second).
    fn show_current(&self, path: &Path, throttle: bool) {
        if !self.shown() {
            return;
        }
        let now = self.elapsed_ms();
        let last = self.last_message_ms.load(Ordering::Relaxed);
        if throttle && self.events.is_none() && now < last + 100 {
            return;
        }
        self.last_message_ms.store(now, Ordering::Relaxed);
        let text = path.to_string_lossy().into_owned();
        if let Some(bar) = self.bar.get() {
            // Escaped on the terminal; the JSON events keep the name exact.
            let shown =
                crate::output::name(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()));
            bar.set_message(tail(&shown, path_width()));
        }
        if let Ok(mut current) = self.shared.current.lock() {
            *current = text;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.end();
    }
}

impl Monitor for Progress {
    fn problem(&self, path: &Path, error: &dyn std::fmt::Display) {
        match self.bar.get() {
            Some(bar) => bar.suspend(|| self.problems.problem(path, error)),
            None => self.problems.problem(path, error),
        }
    }

    /// Not throttled: only files large enough to be chunked are started, and one may be
    /// read for minutes while nothing else finishes.
    fn file_started(&self, path: &Path) {
        self.show_current(path, false);
    }

    fn file_done(&self, path: &Path, _bytes: u64) {
        self.shared.files_done.fetch_add(1, Ordering::Relaxed);
        self.show_current(path, true);
    }

    fn bytes_done(&self, bytes: u64) {
        self.shared.bytes_done.fetch_add(bytes, Ordering::Relaxed);
        // A phase bar counts the phase's own units (copy's snapshots), not bytes.
        if self.shared.kind == Kind::Files {
            if let Some(bar) = self.bar.get() {
                bar.inc(bytes);
            }
        }
    }

    fn cancelled(&self) -> bool {
        self.problems.cancelled()
    }

    fn progress(&self, what: &str, done: u64, total: u64) {
        if !self.shown() {
            return;
        }
        let new_phase = {
            let Ok(mut phase) = self.shared.phase.lock() else {
                return;
            };
            let new = phase.as_ref().is_none_or(|p| p.what != what);
            *phase = Some(Phase {
                what: what.to_string(),
                done,
                total,
            });
            new
        };
        if !self.tty || self.shared.kind != Kind::Phases {
            return;
        }
        let bar = self.bar.get_or_init(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(phase_style());
            bar.enable_steady_tick(Duration::from_millis(200));
            show(&bar);
            bar
        });
        if new_phase {
            bar.set_prefix(format!("{} {what}", self.shared.command));
            bar.set_length(total);
            bar.reset();
        }
        bar.set_position(done);
    }
}

/// Lets one thread add to the totals as it finds files.
pub struct Feed {
    shared: Arc<Shared>,
    bar: Option<ProgressBar>,
    /// Found and not yet passed on: the totals go out in batches, since the bar's length
    /// is behind a lock.
    files: u64,
    bytes: u64,
    sent: Instant,
}

impl Feed {
    pub fn add(&mut self, files: u64, bytes: u64) {
        self.files += files;
        self.bytes += bytes;
        if self.sent.elapsed() >= Duration::from_millis(50) {
            self.flush();
        }
    }

    fn flush(&mut self) {
        self.shared
            .files_total
            .fetch_add(std::mem::take(&mut self.files), Ordering::Relaxed);
        let bytes = std::mem::take(&mut self.bytes);
        let total = self.shared.bytes_total.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if let Some(bar) = &self.bar {
            bar.set_length(total);
        }
        self.sent = Instant::now();
    }

    /// The totals are final: the display shows an ETA from now on.
    pub fn complete(mut self) {
        self.flush();
        self.shared.totals.store(TOTALS_COMPLETE, Ordering::Release);
        if let Some(bar) = &self.bar {
            bar.set_style(style(&self.shared));
        }
    }
}

/// The bar's look for backup and restore, which depends on what is known of the totals:
///
/// ```text
/// ⠋ backup [#########>-----------] 1.20 GiB/3.41 GiB  1,234/5,678 files  120.5 MiB/s  ETA 19s
///   /home/me/photos/2024/img_0042.jpg
/// ```
///
/// While the pre-scan still counts, the totals get a `+` and there is no ETA; without
/// totals (`--no-scan`, `--stdin`) there is no bar, only counts, rate and elapsed time.
fn style(shared: &Arc<Shared>) -> ProgressStyle {
    let state = shared.totals.load(Ordering::Acquire);
    let template = match state {
        TOTALS_COMPLETE => {
            "{spinner} {prefix} [{bar:25}] {binary_bytes}/{binary_total_bytes}  {files}  \
             {binary_bytes_per_sec}  ETA {eta}\n  {wide_msg}"
        }
        TOTALS_GROWING => {
            "{spinner} {prefix} [{bar:25}] {binary_bytes}/{binary_total_bytes}+  {files}  \
             {binary_bytes_per_sec}  {elapsed}\n  {wide_msg}"
        }
        _ => "{spinner} {prefix} {binary_bytes}  {files}  {binary_bytes_per_sec}  {elapsed}\n  {wide_msg}",
    };
    let counts = shared.clone();
    ProgressStyle::with_template(template)
        .expect("a valid template")
        .progress_chars("#>-")
        .with_key(
            "files",
            move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                let done = HumanCount(counts.files_done.load(Ordering::Relaxed));
                let _ = match counts.totals() {
                    Some((files, _)) => {
                        let more = if counts.totals.load(Ordering::Relaxed) == TOTALS_GROWING {
                            "+"
                        } else {
                            ""
                        };
                        write!(w, "{done}/{}{more} files", HumanCount(files))
                    }
                    None => write!(w, "{done} files"),
                };
            },
        )
}

fn phase_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{spinner} {prefix} [{bar:25}] {human_pos}/{human_len} ({percent}%)  ETA {eta}",
    )
    .expect("a valid template")
    .progress_chars("#>-")
}

/// The columns the path line may use: the terminal's width less its indent.
fn path_width() -> usize {
    let (_, cols) = console::Term::stderr().size();
    usize::from(cols).saturating_sub(3).max(10)
}

/// The end of `text` in at most `width` columns: a path's file name matters more than the
/// directories above it.
fn tail(text: &str, width: usize) -> String {
    if console::measure_text_width(text) <= width {
        return text.to_string();
    }
    let mut kept = 0;
    let mut start = text.len();
    for (i, c) in text.char_indices().rev() {
        let w = console::measure_text_width(c.encode_utf8(&mut [0; 4]));
        if kept + w + 1 > width {
            break;
        }
        kept += w;
        start = i;
    }
    format!("…{}", &text[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_path_is_kept_whole() {
        assert_eq!(tail("/a/b", 10), "/a/b");
    }

    #[test]
    fn a_long_path_keeps_its_end() {
        let t = tail("/home/me/some/deep/directory/file.txt", 12);
        assert_eq!(t, "…ry/file.txt");
        assert_eq!(console::measure_text_width(&t), 12);
    }

    #[test]
    fn wide_characters_count_as_two_columns() {
        let t = tail("/x/日本語のファイル", 9);
        assert!(console::measure_text_width(&t) <= 9, "{t}");
        assert!(t.ends_with("ファイル"), "{t}");
    }
}

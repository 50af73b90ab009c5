//! `cairn daemon`: runs the config file's jobs on their schedules until stopped.
//!
//! - One run per job at a time (the job's lock, which `cairn run` takes too); different
//!   jobs may run at once, each in its own thread.
//! - A run missed while the machine was off or asleep (its slot, counted from the last
//!   run's start kept in the job's state, is past) starts once at startup.
//! - SIGTERM or Ctrl-C stops the runs in flight as Ctrl-C stops `cairn backup` (nothing
//!   committed, the session removed; the next run starts over) and then the daemon;
//!   a second one ends it at once. SIGHUP reads the config file again; a broken file is
//!   logged and the old jobs keep running.
//! - A second daemon for the same config file refuses to start (a lock file).
//! - Logs go to standard output, as text lines or JSON objects (`--log-format`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::args::{DaemonArgs, GlobalArgs};
use crate::jobs::config::{Job, Jobs};
use crate::jobs::metrics::Live;
use crate::jobs::runner::Outcome;
use crate::jobs::state::{self, JobState, Lock};

/// How often the loop looks at the clock and the signals.
const TICK: Duration = Duration::from_millis(100);

pub fn run(g: &GlobalArgs, a: DaemonArgs) -> Result<u8> {
    let log = Logger {
        json: a.log_format == "json",
    };
    let path = crate::config::default_path()?;
    let path = std::path::absolute(&path).unwrap_or(path);
    let lock_path = daemon_lock_path(&path)?;
    let Some(_lock) = Lock::try_take(&lock_path)? else {
        bail!(
            "Another cairn daemon runs for the config file {} ({} holds {}); stop it first",
            path.display(),
            state::holder(&lock_path),
            lock_path.display()
        );
    };
    let jobs = load(&path)?;
    let shared = crate::jobs::http::Shared::default();
    if let Some(addr) = &a.listen {
        let token_file = match &a.token_file {
            Some(f) => f.clone(),
            None => state::state_dir()?.join("daemon.token"),
        };
        let token = token(&token_file)?;
        let bound = crate::jobs::http::spawn(addr, &token, shared.clone())?;
        log.event(
            "listening",
            None,
            &format!(
                "status on http://{bound}/status and /metrics, token in {}",
                token_file.display()
            ),
            json!({"address": bound.to_string(), "token_file": token_file}),
        );
    }
    detach_stdin();
    crate::signals::install();
    crate::signals::install_reload();
    let mut slots: BTreeMap<String, Slot> = BTreeMap::new();
    schedule_jobs(&mut slots, jobs, &log, true);
    log.event(
        "started",
        None,
        &format!(
            "daemon started for {} (pid {}), {} scheduled",
            path.display(),
            std::process::id(),
            slots.values().filter(|s| s.next_ms.is_some()).count()
        ),
        json!({"config": path, "pid": std::process::id()}),
    );
    loop {
        if crate::signals::interrupted() {
            break;
        }
        if crate::signals::take_reload() {
            match load(&path) {
                Ok(jobs) => {
                    schedule_jobs(&mut slots, jobs, &log, false);
                    log.event("reloaded", None, "config file read again", json!({}));
                }
                Err(e) => log.event(
                    "reload_failed",
                    None,
                    &format!("the config file was not reloaded, the old jobs go on: {e:#}"),
                    json!({"error": format!("{e:#}")}),
                ),
            }
        }
        let now = state::now_ms();
        for (name, slot) in slots.iter_mut() {
            if slot.running.as_ref().is_some_and(|h| h.is_finished()) {
                if let Some(handle) = slot.running.take() {
                    finished(name, handle, &log);
                }
                slot.next_ms = next_run(&slot.job, slot.started_ms, now);
                log_next(name, slot, &log);
            }
            let due = slot.next_ms.is_some_and(|next| next <= now);
            if slot.running.is_none() && due && !slot.removed {
                log.event(
                    "job_started",
                    Some(name),
                    &format!("job {name} started"),
                    json!({}),
                );
                slot.started_ms = now;
                let (name, job, g) = (name.clone(), slot.job.clone(), g.clone());
                slot.running = Some(std::thread::spawn(move || {
                    crate::jobs::run_now(&name, &job, &g)
                }));
            }
        }
        slots.retain(|_, s| !s.removed || s.running.is_some());
        if let Ok(mut live) = shared.lock() {
            *live = slots
                .iter()
                .map(|(name, s)| {
                    let view = Live {
                        running: s.running.is_some(),
                        next_ms: s.next_ms.filter(|_| s.running.is_none()),
                    };
                    (name.clone(), view)
                })
                .collect();
        }
        std::thread::sleep(TICK);
    }
    let in_flight = slots.values().filter(|s| s.running.is_some()).count();
    log.event(
        "stopping",
        None,
        &format!("stopping: {in_flight} runs in flight are interrupted"),
        json!({ "in_flight": in_flight }),
    );
    for (name, slot) in slots.iter_mut() {
        if let Some(handle) = slot.running.take() {
            finished(name, handle, &log);
        }
    }
    log.event("stopped", None, "daemon stopped", json!({}));
    Ok(0)
}

/// A job as the daemon sees it.
struct Slot {
    job: Job,
    /// When it runs next (unix ms); None: it has no schedule.
    next_ms: Option<i64>,
    started_ms: i64,
    running: Option<JoinHandle<Result<Outcome>>>,
    /// Gone from the config file: dropped once its run ends.
    removed: bool,
}

fn load(path: &Path) -> Result<Jobs> {
    // The repositories too, so that a broken [repos.NAME] is said now, not at 2 a.m.
    crate::config::ConfigFile::load(path)?;
    Jobs::load(path)
}

/// The daemon's lock: one per config file.
fn daemon_lock_path(config: &Path) -> Result<PathBuf> {
    let hash = blake3::hash(config.as_os_str().as_encoded_bytes());
    Ok(state::state_dir()?.join(format!("daemon-{}.lock", &hash.to_hex()[..16])))
}

/// The status endpoint's token: the first line of `file`, or a new random one written
/// there (0600) if it does not exist.
fn token(file: &Path) -> Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::read_to_string(file) {
        Ok(text) => {
            let token = text.lines().next().unwrap_or("").trim().to_string();
            if token.is_empty() {
                bail!("The token file {} is empty", file.display());
            }
            Ok(token)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let token = hex::encode(rand::random::<[u8; 32]>());
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("Cannot create {}", dir.display()))?;
            }
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(file)
                .with_context(|| format!("Cannot create the token file {}", file.display()))?;
            writeln!(f, "{token}")
                .with_context(|| format!("Cannot write the token file {}", file.display()))?;
            Ok(token)
        }
        Err(e) => Err(e).with_context(|| format!("Cannot read the token file {}", file.display())),
    }
}

/// A daemon never waits for a password on a terminal: a job without a password source
/// fails, and says so, instead of hanging.
fn detach_stdin() {
    // SAFETY: open and dup2 on descriptors this process owns.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::close(null);
        }
    }
}

/// Fits `jobs` into `slots`: new jobs are scheduled, changed ones rescheduled, removed ones
/// dropped after their run. At startup, a run missed since the last one starts at once.
fn schedule_jobs(slots: &mut BTreeMap<String, Slot>, jobs: Jobs, log: &Logger, startup: bool) {
    let now = state::now_ms();
    for slot in slots.values_mut() {
        slot.removed = true;
    }
    for (name, job) in jobs.jobs {
        let same = slots.get(&name).is_some_and(|s| {
            s.job.schedule.as_ref().map(|s| &s.text) == job.schedule.as_ref().map(|s| &s.text)
        });
        let last = JobState::load(&name).last_started_ms;
        let slot = slots.entry(name.clone()).or_insert_with(|| Slot {
            job: job.clone(),
            next_ms: None,
            started_ms: 0,
            running: None,
            removed: false,
        });
        slot.removed = false;
        slot.job = job;
        if same && !startup {
            continue;
        }
        let Some(schedule) = &slot.job.schedule else {
            slot.next_ms = None;
            log.event(
                "unscheduled",
                Some(&name),
                &format!("job {name} has no schedule: run it with `cairn run {name}`"),
                json!({}),
            );
            continue;
        };
        slot.next_ms = match last.and_then(|l| schedule.next_after(l)) {
            Some(due) if startup && due <= now => {
                log.event(
                    "missed",
                    Some(&name),
                    &format!(
                        "job {name} missed its run at {}: running it now",
                        time_text(due)
                    ),
                    json!({"due": time_text(due)}),
                );
                Some(now)
            }
            _ => schedule.first(now).map(|n| n + jitter(&slot.job)),
        };
        if slot.running.is_none() {
            log_next(&name, slot, log);
        }
    }
}

/// The next run after one that started at `started_ms`, `now_ms` being the time it ended:
/// a run that overran its next slot is followed by the slot after now, not a pile-up.
fn next_run(job: &Job, started_ms: i64, now_ms: i64) -> Option<i64> {
    let schedule = job.schedule.as_ref()?;
    let mut next = schedule.next_after(started_ms)?;
    if next <= now_ms {
        next = schedule.next_after(now_ms)?;
    }
    Some(next + jitter(job))
}

fn jitter(job: &Job) -> i64 {
    let max = job.jitter().as_millis() as f64;
    (rand::random::<f64>() * max) as i64
}

fn finished(name: &str, handle: JoinHandle<Result<Outcome>>, log: &Logger) {
    match handle.join() {
        Ok(Ok(o)) => {
            let r = &o.report;
            log.event(
                "job_finished",
                Some(name),
                &format!(
                    "job {name} finished: {} in {} ms{}",
                    r.status,
                    r.duration_ms,
                    r.error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                ),
                json!({
                    "status": r.status, "duration_ms": r.duration_ms, "snapshot_id": r.snapshot,
                    "bytes_added": r.bytes_added, "error": r.error,
                }),
            );
        }
        Ok(Err(e)) => log.event(
            "job_skipped",
            Some(name),
            &format!("job {name} did not run: {e:#}"),
            json!({"error": format!("{e:#}")}),
        ),
        Err(_) => log.event(
            "job_panicked",
            Some(name),
            &format!("job {name} panicked"),
            json!({}),
        ),
    }
}

fn log_next(name: &str, slot: &Slot, log: &Logger) {
    if let Some(next) = slot.next_ms {
        log.event(
            "scheduled",
            Some(name),
            &format!("job {name} runs next at {}", time_text(next)),
            json!({"next": time_text(next)}),
        );
    }
}

fn time_text(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The daemon's log, on standard output.
struct Logger {
    json: bool,
}

impl Logger {
    fn event(&self, event: &str, job: Option<&str>, text: &str, mut fields: serde_json::Value) {
        use std::io::Write;
        let time = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%S%.3fZ")
            .to_string();
        let line = if self.json {
            fields["time"] = time.into();
            fields["event"] = event.into();
            if let Some(job) = job {
                fields["job"] = job.into();
            }
            fields["message"] = text.into();
            fields.to_string()
        } else {
            format!("{time} {text}")
        };
        // A closed standard output must not stop the backups.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}").and_then(|_| out.flush());
    }
}

//! One run of one job, as `cairn run` and the daemon do it:
//!
//! 1. `before` hook; if it fails, the job stops here and counts as failed.
//! 2. Backup to the first repository; each other repository gets the new snapshot by
//!    `copy` from it, so the sources are read once. If the backup to a repository fails,
//!    the next one gets the backup instead; a failure of one repository never stops the
//!    others.
//! 3. For each repository that got the snapshot: forget by the job's `keep` (only this
//!    job's snapshots: its host and paths), then prune and check when due.
//! 4. `on-success` or `on-failure`, then `after` whatever happened; then notifications.
//!
//! Hooks run with `sh -c`, their output appended to the run's log, and see `CAIRN_JOB`,
//! `CAIRN_REPOSITORY` (the first repository), `CAIRN_REPOSITORIES` (all, space-separated),
//! `CAIRN_LOG`, and from step 4 `CAIRN_STATUS` and `CAIRN_SNAPSHOT`. The core is called
//! directly, never a `cairn` child process.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result};
use cairn_core::id::SnapshotId;
use cairn_core::monitor::Monitor;
use cairn_core::ops::backup::{self, BackupOptions};
use cairn_core::ops::check::{self, CheckOptions};
use cairn_core::ops::copy::{self, CopyOptions};
use cairn_core::ops::forget::{self, GroupBy, KeepPolicy};
use cairn_core::ops::prune::{self, PruneOptions};
use cairn_core::ops::stats;

use super::child::{self, Ended};
use super::config::{HookTimeout, Job, Keep};
use super::notify::{self, RepoReport, Report, LOG_TAIL_BYTES};
use super::state::{self, JobState, Status};
use crate::args::{ExcludeArgs, FilterArgs, GlobalArgs};
use crate::context;

/// The log of one run: timestamped lines, hooks' output between them.
pub struct RunLog {
    path: PathBuf,
    file: Mutex<Option<File>>,
}

impl RunLog {
    /// A new log at `path` (emptied); a log that cannot be written is a warning.
    pub fn create(path: PathBuf) -> RunLog {
        let file = File::create(&path)
            .map_err(|e| eprintln!("warning: cannot write the log {}: {e}", path.display()))
            .ok();
        RunLog {
            path,
            file: Mutex::new(file),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn line(&self, msg: &str) {
        if let Ok(mut f) = self.file.lock() {
            if let Some(f) = f.as_mut() {
                let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ");
                let _ = writeln!(f, "{now} {msg}");
            }
        }
    }

    /// A problem worth saying on standard error too.
    pub fn warn(&self, msg: &str) {
        eprintln!("warning: {msg}");
        self.line(&format!("warning: {msg}"));
    }

    /// A descriptor appending to the log, for a hook's output.
    fn output(&self) -> Stdio {
        self.file
            .lock()
            .ok()
            .and_then(|f| f.as_ref().and_then(|f| f.try_clone().ok()))
            .map_or_else(Stdio::null, Stdio::from)
    }

    /// The last `LOG_TAIL_BYTES` of the log.
    pub fn tail(&self) -> String {
        let mut buf = Vec::new();
        if let Ok(mut f) = File::open(&self.path) {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES as u64)));
            let _ = f.read_to_end(&mut buf);
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// The monitor of a job's operations: problems go to the log, and SIGTERM or Ctrl-C
/// stops the operation as it stops `cairn backup`.
struct JobMonitor<'a> {
    log: &'a RunLog,
}

impl Monitor for JobMonitor<'_> {
    fn problem(&self, path: &Path, error: &dyn std::fmt::Display) {
        self.log
            .line(&format!("error: {}: {error}", path.display()));
    }

    fn cancelled(&self) -> bool {
        crate::signals::interrupted()
    }
}

/// The outcome of a run.
pub struct Outcome {
    pub status: Status,
    pub report: Report,
}

/// forget's policy from a job's `keep`.
pub fn keep_policy(keep: &Keep) -> Result<KeepPolicy, String> {
    Ok(KeepPolicy {
        last: keep.last,
        hourly: keep.hourly,
        daily: keep.daily,
        weekly: keep.weekly,
        monthly: keep.monthly,
        yearly: keep.yearly,
        within_hourly: None,
        within_daily: None,
        within_weekly: None,
        within_monthly: None,
        within_yearly: None,
        within: keep
            .within
            .as_deref()
            .map(forget::parse_within)
            .transpose()?,
        tags: keep.tags.clone(),
    })
}

/// Runs the job `name` now, its stores held to its `limits`. The caller holds the job's
/// lock.
pub fn run(name: &str, job: &Job, g: &GlobalArgs) -> Outcome {
    let limits = cairn_core::storage::RateLimits {
        upload: job.limits.upload.map(|s| s.0),
        download: job.limits.download.map(|s| s.0),
    };
    context::with_job_rate_limits(limits, || run_limited(name, job, g))
}

fn run_limited(name: &str, job: &Job, g: &GlobalArgs) -> Outcome {
    let started = Instant::now();
    let started_ms = state::now_ms();
    let log = RunLog::create(
        state::log_path(name)
            .unwrap_or_else(|_| std::env::temp_dir().join(format!("cairn-{name}.log"))),
    );
    let specs = job.repo_specs();
    let host = job
        .host
        .clone()
        .unwrap_or_else(|| gethostname::gethostname().to_string_lossy().into_owned());
    let mut env = vec![
        ("CAIRN_JOB".to_string(), name.to_string()),
        ("CAIRN_LOG".to_string(), log.path().display().to_string()),
        (
            "CAIRN_REPOSITORY".to_string(),
            specs.first().cloned().unwrap_or_default(),
        ),
        ("CAIRN_REPOSITORIES".to_string(), specs.join(" ")),
    ];
    log.line(&format!(
        "job {name} started: {} to {}",
        job.paths.join(" "),
        specs.join(" ")
    ));
    notify::started(&job.notify, &log);
    if job.limits.nice {
        lower_priority(&log);
    }
    let mut state = JobState::load(name);
    let mut report = Report {
        job: name.to_string(),
        host: host.clone(),
        started: jiff::Timestamp::from_millisecond(started_ms)
            .map(|t| t.to_string())
            .unwrap_or_default(),
        ..Report::default()
    };
    let before_ok = match &job.before {
        Some(cmd) => hook(&log, "before", cmd, &env, job.hook_timeout)
            .map_err(|e| report.error = Some(e))
            .is_ok(),
        None => true,
    };
    if before_ok {
        work(job, g, &host, &log, &mut state, &mut report);
    }
    // A stop asked for after the work was done does not undo it.
    let failed = report.error.is_some()
        || report.repositories.len() < specs.len()
        || report.repositories.iter().any(|r| r.status != "success");
    let status = if failed && crate::signals::interrupted() {
        Status::Interrupted
    } else if failed {
        Status::Failure
    } else if report.errors > 0 {
        Status::Partial
    } else {
        Status::Success
    };
    if report.error.is_none() {
        report.error = report
            .repositories
            .iter()
            .find_map(|r| r.error.as_ref().map(|e| format!("{}: {e}", r.repository)));
    }
    report.status = status.as_str().to_string();
    env.push(("CAIRN_STATUS".into(), report.status.clone()));
    env.push((
        "CAIRN_SNAPSHOT".into(),
        report.snapshot.clone().unwrap_or_default(),
    ));
    let ok = matches!(status, Status::Success | Status::Partial);
    let done_hook = if ok {
        ("on-success", &job.on_success)
    } else {
        ("on-failure", &job.on_failure)
    };
    for (what, cmd) in [done_hook, ("after", &job.after)] {
        if let Some(cmd) = cmd {
            // Too late to change the outcome: said in the log, which the notification carries.
            let _ = hook(&log, what, cmd, &env, job.hook_timeout);
        }
    }
    report.duration_ms = started.elapsed().as_millis() as u64;
    log.line(&format!(
        "job {name} finished: {} in {} ms{}",
        report.status,
        report.duration_ms,
        report
            .error
            .as_deref()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default()
    ));
    report.log_tail = log.tail();
    notify::finished(&job.notify, &report, &env, &log);

    state.last_started_ms = Some(started_ms);
    state.status = Some(status);
    state.duration_ms = report.duration_ms;
    state.files = report.files;
    state.bytes_read = report.bytes_read;
    state.bytes_added = report.bytes_added;
    state.errors = report.errors;
    state.snapshot = report.snapshot.clone();
    state.error = report.error.clone();
    if ok {
        state.last_success_ms = Some(started_ms);
    }
    if let Err(e) = state.save(name) {
        log.warn(&format!("{e:#}"));
    }
    Outcome { status, report }
}

/// Runs a hook, for at most `timeout`; the error says which and how it failed.
fn hook(
    log: &RunLog,
    what: &str,
    cmd: &str,
    env: &[(String, String)],
    timeout: Option<HookTimeout>,
) -> Result<(), String> {
    log.line(&format!("{what} hook: {cmd}"));
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(cmd)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.output())
        .stderr(log.output());
    let limit = timeout.map(|t| t.0);
    let e = match child::run(
        &mut command,
        child::Group::for_here(),
        limit,
        child::GRACE,
        |_| {},
    ) {
        Ok(Ended::Exited(s)) if s.success() => return Ok(()),
        Ok(Ended::Exited(s)) => format!("The {what} hook failed ({s})"),
        Ok(Ended::TimedOut) => format!(
            "The {what} hook did not finish within {} s (hook-timeout) and was stopped",
            limit.unwrap_or_default().as_secs()
        ),
        Ok(Ended::Interrupted) => format!("The {what} hook was stopped: a stop was asked for"),
        Err(e) => format!("Cannot run the {what} hook: {e}"),
    };
    log.line(&e);
    Err(e)
}

/// Backup, copies, forget, prune and check, each repository in turn.
fn work(
    job: &Job,
    g: &GlobalArgs,
    host: &str,
    log: &RunLog,
    state: &mut JobState,
    report: &mut Report,
) {
    let monitor = JobMonitor { log };
    // The repository holding the new snapshot, and its id there.
    let mut primary: Option<(GlobalArgs, SnapshotId)> = None;
    for spec in job.repo_specs() {
        if crate::signals::interrupted() {
            break;
        }
        let rg = GlobalArgs {
            repo: Some(spec.clone()),
            ..g.clone()
        };
        let started = Instant::now();
        let result = match &primary {
            None => backup_into(job, &rg, host, &monitor).map(|(id, stats)| {
                report.files = stats.files_new + stats.files_changed + stats.files_unchanged;
                report.bytes_read = stats.bytes_read;
                report.errors = stats.errors.len() as u64;
                for e in &stats.errors {
                    log.line(&format!("could not back up {}: {}", e.path, e.error));
                }
                ("backup", id, stats.bytes_added)
            }),
            Some((src, id)) => {
                copy_into(src, &rg, *id, host, &monitor).map(|(id, added)| ("copy", id, added))
            }
        };
        let repo_state = state.repos.entry(spec.clone()).or_default();
        let mut entry = RepoReport {
            repository: spec.clone(),
            status: "success".into(),
            method: if primary.is_none() { "backup" } else { "copy" }.into(),
            snapshot: None,
            bytes_added: 0,
            error: None,
        };
        match result {
            Ok((method, id, added)) => {
                log.line(&format!(
                    "{method} to {spec}: snapshot {} ({added} bytes added) in {} ms",
                    id.short(),
                    started.elapsed().as_millis()
                ));
                entry.snapshot = Some(id.to_hex());
                entry.bytes_added = added;
                report.bytes_added += added;
                if primary.is_none() {
                    report.snapshot = Some(id.to_hex());
                    primary = Some((rg.clone(), id));
                }
                if let Err(e) = maintain(job, &rg, host, &monitor, log, repo_state) {
                    entry.status = "failure".into();
                    entry.error = Some(format!("{e:#}"));
                }
            }
            Err(e) => {
                entry.status = "failure".into();
                entry.error = Some(format!("{e:#}"));
            }
        }
        if let Some(e) = &entry.error {
            log.line(&format!("{spec} failed: {e}"));
        } else {
            repo_state.last_success_ms = Some(state::now_ms());
        }
        repo_state.status = Some(if entry.error.is_some() {
            Status::Failure
        } else {
            Status::Success
        });
        repo_state.bytes_added = entry.bytes_added;
        report.repositories.push(entry);
    }
}

fn backup_into(
    job: &Job,
    g: &GlobalArgs,
    host: &str,
    monitor: &JobMonitor,
) -> Result<(SnapshotId, cairn_core::ops::backup::BackupStats)> {
    let exclude = crate::commands::exclude_options(&ExcludeArgs {
        excludes: job.exclude.clone(),
        exclude_files: job
            .exclude_file
            .iter()
            .map(|f| super::config::expand_home(f))
            .collect(),
        git_ignore: job.git_ignore,
        exclude_if_present: job.exclude_if_present.iter().map(Into::into).collect(),
        exclude_caches: job.exclude_caches,
        exclude_larger_than: job.exclude_larger_than.map(|s| s.0),
        iexcludes: Vec::new(),
        iexclude_files: Vec::new(),
    })?;
    let mut repo = context::open_without_index(g)?;
    let opts = BackupOptions {
        paths: job.source_paths(),
        exclude,
        tags: job.tags.clone(),
        host: host.to_string(),
        username: crate::commands::backup::username(),
        one_file_system: job.one_file_system,
        parent: None,
        force: false,
        read_threads: job.limits.threads.map_or(0, usize::from),
        dry_run: false,
        time: None,
        commands: job
            .commands
            .iter()
            .map(|(name, line)| backup::CommandSource::shell(name, line))
            .collect(),
    };
    let report = backup::backup(&mut repo, &opts, monitor)?;
    let id = report
        .snapshot_id
        .ok_or_else(|| anyhow::anyhow!("the backup wrote no snapshot"))?;
    Ok((id, report.stats))
}

/// Copies snapshot `id` of the repository of `src` into that of `dst`; the id it has there.
fn copy_into(
    src: &GlobalArgs,
    dst: &GlobalArgs,
    id: SnapshotId,
    host: &str,
    monitor: &JobMonitor,
) -> Result<(SnapshotId, u64)> {
    let from = context::open(src)?;
    let mut to = context::open_without_index(dst)?;
    let opts = CopyOptions {
        snapshots: vec![id],
        filter: Default::default(),
        host: host.to_string(),
    };
    let report = copy::copy(&from, &mut to, &opts, monitor)?;
    let copied = match report.copied.first() {
        Some((_, new)) => *new,
        // Already there (a copy made earlier): the same snapshot under its id there.
        None => report
            .already_present
            .first()
            .copied()
            .context("The copy made no snapshot")?,
    };
    Ok((copied, report.bytes_added))
}

/// Forget by the job's policy, then prune and check when due.
fn maintain(
    job: &Job,
    g: &GlobalArgs,
    host: &str,
    monitor: &JobMonitor,
    log: &RunLog,
    repo_state: &mut state::RepoState,
) -> Result<()> {
    if let Some(keep) = &job.keep {
        let policy = keep_policy(keep).map_err(anyhow::Error::msg)?;
        let filter = crate::commands::snapshot_filter(&FilterArgs {
            hosts: vec![host.to_string()],
            tags: Vec::new(),
            paths: job.source_paths(),
        })?;
        let repo = context::open(g)?;
        let r = forget::forget(&repo, &policy, GroupBy::default(), &filter, false)
            .context("Forget failed")?;
        log.line(&format!("forget: removed {} snapshots", r.removed.len()));
    }
    let now = state::now_ms();
    if job
        .prune
        .is_some_and(|p| p.due(repo_state.last_prune_ms, now))
    {
        let mut repo = context::open(g)?;
        let opts = PruneOptions {
            max_unused_percent: 5.0,
            dry_run: false,
            host: host.to_string(),
        };
        let r = prune::prune(&mut repo, &opts, monitor).context("Prune failed")?;
        log.line(&format!(
            "prune: {} packs deleted, {} bytes freed",
            r.packs_deleted, r.bytes_freed
        ));
        repo_state.last_prune_ms = Some(now);
    }
    if let Some(spec) = job
        .check
        .as_ref()
        .filter(|c| c.every.due(repo_state.last_check_ms, now))
    {
        let read_data = spec
            .read_data_subset
            .as_ref()
            .map(|s| s.0.parse())
            .transpose()
            .map_err(anyhow::Error::msg)?;
        let repo = context::open_uncached(g)?;
        let r =
            check::check(&repo, &CheckOptions { read_data }, monitor).context("Check failed")?;
        repo_state.last_check_ms = Some(now);
        for p in &r.problems {
            log.line(&format!("check: {}: {}", p.object, p.problem));
        }
        if !r.problems.is_empty() {
            anyhow::bail!("check found {} problems (see the log)", r.problems.len());
        }
        log.line("check: no problems found");
    }
    // The repository's size for the metrics: worth a line in the log if it fails, no more.
    match context::open(g).and_then(|repo| Ok(stats::stats(&repo, &[])?)) {
        Ok(s) => repo_state.repository_bytes = s.pack_bytes,
        Err(e) => log.line(&format!("warning: cannot measure the repository: {e:#}")),
    }
    Ok(())
}

/// `limits.nice`: this thread, and the threads it starts, at nice 10 and the lowest
/// best-effort I/O priority. Only the job's thread: the daemon's own loop stays prompt.
fn lower_priority(log: &RunLog) {
    // SAFETY: plain system calls on the calling thread's id.
    unsafe {
        let tid = libc::gettid();
        if libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10) != 0 {
            log.line("warning: cannot lower the CPU priority");
        }
        const IOPRIO_WHO_PROCESS: libc::c_long = 1;
        const BEST_EFFORT_LOWEST: libc::c_long = (2 << 13) | 7;
        if libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            tid as libc::c_long,
            BEST_EFFORT_LOWEST,
        ) != 0
        {
            log.line("warning: cannot lower the I/O priority");
        }
    }
}

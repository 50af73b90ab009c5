//! What cairn remembers of each job between runs, under `$XDG_STATE_HOME/cairn/jobs/`:
//! `NAME.json` (the last run: when, how it went, what it added; when each repository was
//! last pruned and checked), `NAME.lock` (held while the job runs, so that a daemon and a
//! `cairn run` from cron never run one job twice at once) and `NAME.log` (the last run's
//! log, `CAIRN_LOG`).
//!
//! A lost or damaged state file costs a prune or check run earlier than due, or one
//! catch-up run; never data.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// `$XDG_STATE_HOME/cairn` (else `~/.local/state/cairn`).
pub fn state_dir() -> Result<PathBuf> {
    let dir = dirs::state_dir()
        .or_else(|| dirs::home_dir().map(|h| h.join(".local/state")))
        .context("No state directory for the jobs' state: set XDG_STATE_HOME or HOME")?;
    Ok(dir.join("cairn"))
}

fn jobs_dir() -> Result<PathBuf> {
    let dir = state_dir()?.join("jobs");
    fs::create_dir_all(&dir).with_context(|| format!("Cannot create {}", dir.display()))?;
    Ok(dir)
}

/// The log file of a job's last run.
pub fn log_path(job: &str) -> Result<PathBuf> {
    Ok(jobs_dir()?.join(format!("{job}.log")))
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Success,
    /// Done, but some source files could not be read.
    Partial,
    Failure,
    /// Stopped by SIGTERM or Ctrl-C.
    Interrupted,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Success => "success",
            Status::Partial => "partial",
            Status::Failure => "failure",
            Status::Interrupted => "interrupted",
        }
    }
}

/// What is remembered of one repository of a job.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RepoState {
    pub last_prune_ms: Option<i64>,
    pub last_check_ms: Option<i64>,
    pub last_success_ms: Option<i64>,
    pub status: Option<Status>,
    pub bytes_added: u64,
    /// The packs' bytes after the last run: what the repository takes on its storage.
    pub repository_bytes: Option<u64>,
}

/// What is remembered of a job.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JobState {
    /// When the last run started (unix milliseconds): the base of the next scheduled run.
    pub last_started_ms: Option<i64>,
    pub last_success_ms: Option<i64>,
    pub status: Option<Status>,
    pub duration_ms: u64,
    pub files: u64,
    pub bytes_read: u64,
    pub bytes_added: u64,
    pub errors: u64,
    pub snapshot: Option<String>,
    pub error: Option<String>,
    #[serde(default)]
    pub repos: BTreeMap<String, RepoState>,
}

impl JobState {
    /// The job's state; a missing or unreadable file is an empty state (with a warning
    /// for the unreadable one).
    pub fn load(job: &str) -> JobState {
        let Ok(path) = jobs_dir().map(|d| d.join(format!("{job}.json"))) else {
            return JobState::default();
        };
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                eprintln!(
                    "warning: ignoring the damaged state file {} ({e}): prune and check may run early",
                    path.display()
                );
                JobState::default()
            }),
            Err(_) => JobState::default(),
        }
    }

    /// Writes the state atomically.
    pub fn save(&self, job: &str) -> Result<()> {
        let dir = jobs_dir()?;
        let path = dir.join(format!("{job}.json"));
        let write = || -> std::io::Result<()> {
            let mut tmp = tempfile::Builder::new()
                .prefix(".state.")
                .tempfile_in(&dir)?;
            tmp.write_all(&serde_json::to_vec_pretty(self)?)?;
            tmp.as_file().sync_all()?;
            tmp.persist(&path).map_err(|e| e.error)?;
            Ok(())
        };
        write().with_context(|| format!("Cannot write the job state {}", path.display()))
    }
}

/// An exclusive lock on a file, released when dropped (or when the process ends, however
/// it ends: flock locks die with their file descriptor).
pub struct Lock {
    _file: File,
}

impl Lock {
    /// Takes the lock at `path` without waiting; None if another process holds it.
    pub fn try_take(path: &Path) -> Result<Option<Lock>> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).with_context(|| format!("Cannot create {}", dir.display()))?;
        }
        let mut file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .with_context(|| format!("Cannot open the lock file {}", path.display()))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            bail!("Cannot lock {}: {err}", path.display());
        }
        // Who holds it, for the message of the one refused.
        let _ = file.set_len(0);
        let _ = writeln!(file, "{}", std::process::id());
        Ok(Some(Lock { _file: file }))
    }

    /// The lock of one job: held for the whole run.
    pub fn job(job: &str) -> Result<Option<Lock>> {
        Lock::try_take(&jobs_dir()?.join(format!("{job}.lock")))
    }
}

/// The process id written in a lock file, for messages.
pub fn holder(path: &Path) -> String {
    fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .map_or_else(|| "another process".into(), |pid| format!("process {pid}"))
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

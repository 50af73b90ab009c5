//! How the jobs are doing, for machines: per-job JSON (the daemon's `/status`) and the
//! Prometheus text format (the daemon's `/metrics`, and `cairn run --metrics-file` for
//! node_exporter's textfile collector under cron). Both are made from the jobs' state
//! files, so they say the same whoever ran the job.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;

use super::state::{JobState, Status};

/// What the daemon knows of a job beyond its state file.
#[derive(Debug, Clone, Copy, Default)]
pub struct Live {
    pub running: bool,
    /// The next scheduled run (unix ms).
    pub next_ms: Option<i64>,
}

/// One job's state and live view.
pub struct JobView {
    pub name: String,
    pub state: JobState,
    pub live: Live,
}

/// The views of these jobs, their state read now.
pub fn views(jobs: &BTreeMap<String, Live>) -> Vec<JobView> {
    jobs.iter()
        .map(|(name, live)| JobView {
            name: name.clone(),
            state: JobState::load(name),
            live: *live,
        })
        .collect()
}

fn time(ms: Option<i64>) -> serde_json::Value {
    ms.and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or(serde_json::Value::Null, |t| t.to_string().into())
}

/// `{"jobs": {NAME: {...}}}`.
pub fn status_json(views: &[JobView]) -> serde_json::Value {
    let jobs: serde_json::Map<String, serde_json::Value> = views
        .iter()
        .map(|v| {
            let s = &v.state;
            let repos: serde_json::Map<String, serde_json::Value> = s
                .repos
                .iter()
                .map(|(name, r)| {
                    (
                        name.clone(),
                        json!({
                            "status": r.status.map(Status::as_str),
                            "last_success": time(r.last_success_ms),
                            "last_prune": time(r.last_prune_ms),
                            "last_check": time(r.last_check_ms),
                            "bytes_added": r.bytes_added,
                            "repository_bytes": r.repository_bytes,
                        }),
                    )
                })
                .collect();
            (
                v.name.clone(),
                json!({
                    "running": v.live.running,
                    "next_run": time(v.live.next_ms),
                    "last_run": time(s.last_started_ms),
                    "last_success": time(s.last_success_ms),
                    "status": s.status.map(Status::as_str),
                    "duration_ms": s.duration_ms,
                    "files": s.files,
                    "bytes_read": s.bytes_read,
                    "bytes_added": s.bytes_added,
                    "errors": s.errors,
                    "snapshot_id": s.snapshot,
                    "error": s.error,
                    "repositories": repos,
                }),
            )
        })
        .collect();
    json!({ "jobs": jobs })
}

/// The Prometheus text exposition format (version 0.0.4).
pub fn prometheus(views: &[JobView]) -> String {
    let mut out = String::new();
    let secs = |ms: i64| ms as f64 / 1000.0;
    let mut family = |name: &str, help: &str, samples: Vec<(String, f64)>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    };
    let job = |v: &JobView| format!("job=\"{}\"", escape(&v.name));
    let per_job = |f: &dyn Fn(&JobView) -> Option<f64>| -> Vec<(String, f64)> {
        views
            .iter()
            .filter_map(|v| f(v).map(|x| (job(v), x)))
            .collect()
    };
    family(
        "cairn_job_last_run_timestamp_seconds",
        "When the job's last run started.",
        per_job(&|v| v.state.last_started_ms.map(secs)),
    );
    family(
        "cairn_job_last_success_timestamp_seconds",
        "When the job's last successful run started.",
        per_job(&|v| v.state.last_success_ms.map(secs)),
    );
    family(
        "cairn_job_success",
        "1 if the job's last run succeeded (possibly with unreadable files), else 0.",
        per_job(&|v| {
            v.state
                .status
                .map(|s| f64::from(u8::from(matches!(s, Status::Success | Status::Partial))))
        }),
    );
    family(
        "cairn_job_running",
        "1 while the job runs.",
        per_job(&|v| Some(f64::from(u8::from(v.live.running)))),
    );
    family(
        "cairn_job_next_run_timestamp_seconds",
        "When the job runs next.",
        per_job(&|v| v.live.next_ms.map(secs)),
    );
    family(
        "cairn_job_duration_seconds",
        "How long the job's last run took.",
        per_job(&|v| v.state.status.map(|_| v.state.duration_ms as f64 / 1000.0)),
    );
    family(
        "cairn_job_files",
        "Files in the last run's snapshot.",
        per_job(&|v| v.state.status.map(|_| v.state.files as f64)),
    );
    family(
        "cairn_job_read_bytes",
        "Bytes of the sources read by the last run.",
        per_job(&|v| v.state.status.map(|_| v.state.bytes_read as f64)),
    );
    family(
        "cairn_job_added_bytes",
        "Bytes stored by the last run, in all its repositories.",
        per_job(&|v| v.state.status.map(|_| v.state.bytes_added as f64)),
    );
    family(
        "cairn_job_errors",
        "Source paths the last run could not read.",
        per_job(&|v| v.state.status.map(|_| v.state.errors as f64)),
    );
    let per_repo = |f: &dyn Fn(&super::state::RepoState) -> Option<f64>| -> Vec<(String, f64)> {
        views
            .iter()
            .flat_map(|v| {
                v.state.repos.iter().filter_map(move |(repo, r)| {
                    f(r).map(|x| (format!("{},repository=\"{}\"", job(v), escape(repo)), x))
                })
            })
            .collect()
    };
    family(
        "cairn_repository_success",
        "1 if the last run reached this repository of the job, else 0.",
        per_repo(&|r| r.status.map(|s| f64::from(u8::from(s == Status::Success)))),
    );
    family(
        "cairn_repository_last_success_timestamp_seconds",
        "When the job last reached this repository.",
        per_repo(&|r| r.last_success_ms.map(secs)),
    );
    family(
        "cairn_repository_added_bytes",
        "Bytes the last run stored in this repository.",
        per_repo(&|r| r.status.map(|_| r.bytes_added as f64)),
    );
    family(
        "cairn_repository_size_bytes",
        "Bytes of the repository's packs after the last run.",
        per_repo(&|r| r.repository_bytes.map(|b| b as f64)),
    );
    out
}

/// A label value: `\`, `"` and newlines escaped.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes `text` to `path` atomically (the textfile collector may read at any moment).
pub fn write_file(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let write = || -> std::io::Result<()> {
        let mut tmp = tempfile::Builder::new()
            .prefix(".cairn-metrics.")
            .tempfile_in(dir)?;
        tmp.write_all(text.as_bytes())?;
        tmp.as_file()
            .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    };
    write().with_context(|| format!("Cannot write the metrics file {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut state = JobState {
            status: Some(Status::Success),
            ..JobState::default()
        };
        let repo = super::super::state::RepoState {
            status: Some(Status::Success),
            ..Default::default()
        };
        state.repos.insert("/a \"b\"".into(), repo);
        let text = prometheus(&[JobView {
            name: "home".into(),
            state,
            live: Live::default(),
        }]);
        assert!(
            text.contains("cairn_job_success{job=\"home\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("repository=\"/a \\\"b\\\"\""), "{text}");
    }
}

//! Telling someone how a job went, so that a backup never fails silently:
//!
//! - `healthchecks:URL`: a healthchecks.io-style check. `URL/start` when the run starts,
//!   `URL` on success, `URL/fail` on failure, each a POST whose body is the tail of the
//!   run's log (healthchecks keeps the first 100 kB of it).
//! - `webhook:URL`: a POST of the JSON document [`Report`] when the run ends.
//! - `command:CMD`: `sh -c CMD` when the run ends, with the hooks' variables and the
//!   report as JSON on its standard input (for mail, ntfy, gotify, ...).
//!
//! Each request has a timeout and is tried up to three times. A notification that cannot
//! be sent is written to the run's log and to standard error, and never fails the job.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::runner::RunLog;

/// Tries of each request, and the time each may take.
const TRIES: u32 = 3;
const TIMEOUT: Duration = Duration::from_secs(10);
/// The most of the log sent with a ping.
pub const LOG_TAIL_BYTES: usize = 10_000;

/// One entry of a job's `notify`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum Target {
    Healthchecks(String),
    Webhook(String),
    Command(String),
}

impl TryFrom<String> for Target {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        let url = |u: &str| -> Result<String, String> {
            if u.starts_with("http://") || u.starts_with("https://") {
                Ok(u.trim_end_matches('/').to_string())
            } else {
                Err(format!("{u:?} is not an http:// or https:// URL"))
            }
        };
        match s.split_once(':') {
            Some(("healthchecks", u)) => url(u).map(Target::Healthchecks),
            Some(("webhook", u)) => url(u).map(Target::Webhook),
            Some(("command", c)) if !c.trim().is_empty() => Ok(Target::Command(c.to_string())),
            _ => Err(format!(
                "{s:?} is not a notification: use healthchecks:URL, webhook:URL or command:CMD"
            )),
        }
    }
}

/// The document a webhook receives and a notify command reads, one per run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub job: String,
    /// success, partial, failure, interrupted.
    pub status: String,
    pub host: String,
    /// RFC 3339.
    pub started: String,
    pub duration_ms: u64,
    /// The new snapshot's id in the first repository that took the backup.
    pub snapshot: Option<String>,
    pub repositories: Vec<RepoReport>,
    pub files: u64,
    pub bytes_read: u64,
    pub bytes_added: u64,
    /// Source paths that could not be read.
    pub errors: u64,
    pub error: Option<String>,
    pub log_tail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct RepoReport {
    pub repository: String,
    pub status: String,
    /// `backup` (the sources were read into it) or `copy` (from the first repository).
    pub method: String,
    pub snapshot: Option<String>,
    pub bytes_added: u64,
    pub error: Option<String>,
}

fn client() -> Option<reqwest::blocking::Client> {
    reqwest::blocking::Client::builder()
        .timeout(TIMEOUT)
        .user_agent(concat!("cairn/", env!("CARGO_PKG_VERSION")))
        .build()
        .ok()
}

/// POSTs `body` to `url`, retrying; the error of the last try.
fn post(
    client: &reqwest::blocking::Client,
    url: &str,
    body: Vec<u8>,
    json: bool,
) -> Result<(), String> {
    let mut last = String::new();
    for attempt in 0..TRIES {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(500 << attempt));
        }
        let mut req = client.post(url).body(body.clone());
        if json {
            req = req.header("content-type", "application/json");
        }
        match req.send() {
            Ok(resp) if resp.status().is_success() => return Ok(()),
            Ok(resp) => last = format!("the server answered {}", resp.status()),
            Err(e) => last = format!("{e}"),
        }
    }
    Err(format!("{last} ({TRIES} tries)"))
}

/// A run has started: pings `URL/start`.
pub fn started(targets: &[Target], log: &RunLog) {
    let Some(client) = (!targets.is_empty()).then(client).flatten() else {
        return;
    };
    for t in targets {
        if let Target::Healthchecks(url) = t {
            let url = format!("{url}/start");
            if let Err(e) = post(&client, &url, Vec::new(), false) {
                log.warn(&format!("Cannot notify {url}: {e}"));
            }
        }
    }
}

/// A run has ended: every target hears how.
pub fn finished(targets: &[Target], report: &Report, env: &[(String, String)], log: &RunLog) {
    if targets.is_empty() {
        return;
    }
    let ok = matches!(report.status.as_str(), "success" | "partial");
    let json = serde_json::to_vec_pretty(report).unwrap_or_default();
    let client = client();
    for t in targets {
        let (what, result) = match t {
            Target::Healthchecks(url) => {
                let url = if ok {
                    url.clone()
                } else {
                    format!("{url}/fail")
                };
                let r = match &client {
                    Some(c) => post(c, &url, report.log_tail.clone().into_bytes(), false),
                    None => Err("no HTTP client".into()),
                };
                (url, r)
            }
            Target::Webhook(url) => {
                let r = match &client {
                    Some(c) => post(c, url, json.clone(), true),
                    None => Err("no HTTP client".into()),
                };
                (url.clone(), r)
            }
            Target::Command(cmd) => (format!("the command {cmd:?}"), command(cmd, &json, env)),
        };
        if let Err(e) = result {
            log.warn(&format!("Cannot notify {what}: {e}"));
        }
    }
}

fn command(cmd: &str, json: &[u8], env: &[(String, String)]) -> Result<(), String> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its input is fine.
        let _ = stdin.write_all(json);
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("it failed ({status})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_by_prefix() {
        let t = |s: &str| Target::try_from(s.to_string());
        assert_eq!(
            t("healthchecks:https://hc/ping/x/").unwrap(),
            Target::Healthchecks("https://hc/ping/x".into())
        );
        assert_eq!(
            t("webhook:http://h/c").unwrap(),
            Target::Webhook("http://h/c".into())
        );
        assert_eq!(
            t("command:mail -s x me").unwrap(),
            Target::Command("mail -s x me".into())
        );
        assert!(t("slack:https://x").is_err());
        assert!(t("webhook:ftp://x").is_err());
        assert!(t("command: ").is_err());
    }
}

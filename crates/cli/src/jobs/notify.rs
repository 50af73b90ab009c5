//! Telling someone how a job went, so that a backup never fails silently:
//!
//! - `healthchecks:URL`: a healthchecks.io-style check. `URL/start` when the run starts,
//!   `URL` on success, `URL/fail` on failure, each a POST whose body is the tail of the
//!   run's log (healthchecks keeps the first 100 kB of it).
//! - `webhook:URL`: a POST of the JSON document [`Report`] when the run ends; or
//!   `{ webhook = URL, body = TEMPLATE, content-type = TYPE }`, a POST of the template
//!   with `{job}`, `{status}`, ... filled in (ntfy, Gotify, chat webhooks).
//! - `command:CMD`: `sh -c CMD` when the run ends, with the hooks' variables and the
//!   report as JSON on its standard input (for mail, ntfy, gotify, ...), stopped after
//!   [`COMMAND_TIMEOUT`].
//!
//! Each request has a timeout and is tried up to three times. A notification that cannot
//! be sent is written to the run's log and to standard error, and never fails the job.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::child::{self, Ended};
use super::runner::RunLog;

/// Tries of each request, and the time each may take.
const TRIES: u32 = 3;
const TIMEOUT: Duration = Duration::from_secs(10);

/// How long a `command:` notification may run (it mails, it posts): one that hangs must
/// not hold its job, or the daemon's next runs of it, forever.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The most of the log sent with a ping.
pub const LOG_TAIL_BYTES: usize = 10_000;

/// One entry of a job's `notify`: a string, or a table for a webhook with a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Healthchecks(String),
    Webhook(String),
    /// `{ webhook = URL, body = TEMPLATE, content-type = TYPE }`: for ntfy, Gotify and the
    /// like, which want their own body.
    Template {
        url: String,
        body: String,
        content_type: String,
    },
    Command(String),
}

/// The table form of a target.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct TemplateToml {
    webhook: String,
    body: String,
    content_type: Option<String>,
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Target;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"healthchecks:URL\", \"webhook:URL\", \"command:CMD\" or { webhook = URL, body = TEMPLATE }")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Target, E> {
                Target::try_from(s.to_string()).map_err(E::custom)
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(self, map: M) -> Result<Target, M::Error> {
                let t =
                    TemplateToml::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(Target::Template {
                    url: http_url(&t.webhook).map_err(serde::de::Error::custom)?,
                    body: t.body,
                    content_type: t.content_type.unwrap_or_else(|| "text/plain".into()),
                })
            }
        }
        d.deserialize_any(Visitor)
    }
}

fn http_url(u: &str) -> Result<String, String> {
    if u.starts_with("http://") || u.starts_with("https://") {
        Ok(u.trim_end_matches('/').to_string())
    } else {
        Err(format!("{u:?} is not an http:// or https:// URL"))
    }
}

/// `template` with `{job}`, `{status}`, `{host}`, `{snapshot}`, `{error}`, `{duration_ms}`,
/// `{bytes_added}` and `{log_tail}` replaced; inside a JSON body, as JSON string contents.
fn fill(template: &str, report: &Report, json: bool) -> String {
    let value = |s: String| {
        if json {
            let quoted = serde_json::Value::String(s).to_string();
            quoted[1..quoted.len() - 1].to_string()
        } else {
            s
        }
    };
    let fields = [
        ("{job}", report.job.clone()),
        ("{status}", report.status.clone()),
        ("{host}", report.host.clone()),
        ("{snapshot}", report.snapshot.clone().unwrap_or_default()),
        ("{error}", report.error.clone().unwrap_or_default()),
        ("{duration_ms}", report.duration_ms.to_string()),
        ("{bytes_added}", report.bytes_added.to_string()),
        ("{log_tail}", report.log_tail.clone()),
    ];
    let mut out = template.to_string();
    for (name, v) in fields {
        out = out.replace(name, &value(v));
    }
    out
}

impl TryFrom<String> for Target {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        match s.split_once(':') {
            Some(("healthchecks", u)) => http_url(u).map(Target::Healthchecks),
            Some(("webhook", u)) => http_url(u).map(Target::Webhook),
            Some(("command", c)) if !c.trim().is_empty() => Ok(Target::Command(c.to_string())),
            _ => Err(format!(
                "{s:?} is not a notification: use healthchecks:URL, webhook:URL or command:CMD"
            )),
        }
    }
}

/// The document a webhook receives and a notify command reads, one per run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub job: String,
    /// success, partial, failure, interrupted.
    pub status: String,
    pub host: String,
    /// RFC 3339.
    pub started: String,
    pub duration_ms: u64,
    /// The new snapshot's id in the first repository that took the backup.
    #[serde(rename = "snapshot_id")]
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
    #[serde(rename = "snapshot_id")]
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
    content_type: Option<&str>,
) -> Result<(), String> {
    let mut last = String::new();
    for attempt in 0..TRIES {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(500 << attempt));
        }
        let mut req = client.post(url).body(body.clone());
        if let Some(t) = content_type {
            req = req.header("content-type", t);
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
            if let Err(e) = post(&client, &url, Vec::new(), None) {
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
                    Some(c) => post(c, &url, report.log_tail.clone().into_bytes(), None),
                    None => Err("no HTTP client".into()),
                };
                (url, r)
            }
            Target::Webhook(url) => {
                let r = match &client {
                    Some(c) => post(c, url, json.clone(), Some("application/json")),
                    None => Err("no HTTP client".into()),
                };
                (url.clone(), r)
            }
            Target::Template {
                url,
                body,
                content_type,
            } => {
                let body = fill(body, report, content_type.contains("json"));
                let r = match &client {
                    Some(c) => post(c, url, body.into_bytes(), Some(content_type)),
                    None => Err("no HTTP client".into()),
                };
                (url.clone(), r)
            }
            Target::Command(cmd) => (
                format!("the command {cmd:?}"),
                command(cmd, &json, env, COMMAND_TIMEOUT),
            ),
        };
        if let Err(e) = result {
            log.warn(&format!("Cannot notify {what}: {e}"));
        }
    }
}

/// A notification command, given the JSON document on its standard input, for at most
/// `limit`.
fn command(
    cmd: &str,
    json: &[u8],
    env: &[(String, String)],
    limit: Duration,
) -> Result<(), String> {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(cmd)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::null());
    let ended = child::run(
        &mut command,
        child::Group::for_here(),
        Some(limit),
        child::GRACE,
        |c| {
            if let Some(mut stdin) = c.stdin.take() {
                // Written from a thread: a command that reads none of a document larger than
                // the pipe holds must not stop the timeout. One that does not read it is fine.
                let json = json.to_vec();
                std::thread::spawn(move || {
                    let _ = stdin.write_all(&json);
                });
            }
        },
    )
    .map_err(|e| e.to_string())?;
    match ended {
        Ended::Exited(status) if status.success() => Ok(()),
        Ended::Exited(status) => Err(format!("it failed ({status})")),
        Ended::TimedOut => Err(format!(
            "it did not finish within {} s and was stopped",
            limit.as_secs_f64()
        )),
        Ended::Interrupted => Err("it was stopped: a stop was asked for".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command that reads none of a document larger than a pipe holds, and never ends,
    /// is stopped at its limit; one that reads it all succeeds.
    #[test]
    fn a_notification_command_is_bounded_in_time() {
        let json = vec![b'x'; 1 << 20];
        let started = std::time::Instant::now();
        let e = command("sleep 120", &json, &[], Duration::from_millis(300)).unwrap_err();
        assert!(e.contains("did not finish within 0.3 s"), "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        let read = command(
            "wc -c | grep -qx 1048576",
            &json,
            &[],
            Duration::from_secs(30),
        );
        assert_eq!(read, Ok(()));
    }

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

    #[test]
    fn templates_are_filled_and_json_stays_json() {
        let report = Report {
            job: "home".into(),
            status: "failure".into(),
            host: "h".into(),
            duration_ms: 5,
            error: Some("a \"quoted\"\nerror".into()),
            ..Report::default()
        };
        assert_eq!(
            fill("{job}: {status} in {duration_ms} ms", &report, false),
            "home: failure in 5 ms"
        );
        let json = fill(r#"{"message": "{error}"}"#, &report, true);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["message"], "a \"quoted\"\nerror");
    }
}

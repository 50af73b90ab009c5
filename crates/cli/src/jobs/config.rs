//! The `[jobs.NAME]` tables of the config file, read into typed structs. Every key is
//! known (`deny_unknown_fields`) and every value is checked while it is read, so that an
//! error names the file, the line and the key: a misspelt `schedule` or a `keep` that
//! keeps nothing must not turn into a job that silently never runs or deletes everything.
//!
//! The file is read twice: by `crate::config` (the repositories, through `toml_edit`, so
//! that edits keep comments) and here (the jobs). This module never runs anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use toml::Spanned;

use super::notify::Target;
use super::schedule::{Every, Schedule};

/// The whole file, as far as jobs are concerned.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    #[allow(dead_code)] // Read by crate::config.
    default: Option<toml::Value>,
    #[serde(default)]
    repos: BTreeMap<String, toml::Value>,
    #[serde(default)]
    jobs: BTreeMap<String, Spanned<Job>>,
}

/// One `[jobs.NAME]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Job {
    /// What to back up; `~/` is the home directory.
    pub paths: Vec<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
    #[serde(default)]
    pub exclude_file: Vec<String>,
    #[serde(default)]
    pub git_ignore: bool,
    #[serde(default)]
    pub exclude_if_present: Vec<String>,
    #[serde(default)]
    pub exclude_caches: bool,
    pub exclude_larger_than: Option<Size>,
    #[serde(default)]
    pub one_file_system: bool,
    #[serde(default)]
    pub tags: Vec<String>,
    pub host: Option<String>,
    /// `@NAME` of the config file, or an address; backed up to the first, copied to the
    /// others.
    pub repos: Vec<Spanned<String>>,
    pub schedule: Option<Schedule>,
    /// A random delay of up to this much before each scheduled run.
    pub jitter: Option<Every>,
    pub keep: Option<Keep>,
    /// How often prune runs (after a backup, when this much time has passed since the last).
    pub prune: Option<Every>,
    pub check: Option<CheckSpec>,
    pub before: Option<String>,
    pub after: Option<String>,
    pub on_success: Option<String>,
    pub on_failure: Option<String>,
    /// How long each hook may run before it is stopped and counts as failed (none: no
    /// limit).
    pub hook_timeout: Option<HookTimeout>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub notify: Vec<Target>,
    /// `commands = { "db.sql" = "pg_dump db" }`: each command's output (run with `sh
    /// -c`) stored as a file of that name at the snapshot's root; a failing command fails
    /// the backup.
    #[serde(default, deserialize_with = "command_names")]
    pub commands: std::collections::BTreeMap<String, String>,
}

/// `hook-timeout = "30m"`: a time like `30s`, `10m`, `2h`, more than zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct HookTimeout(pub Duration);

impl TryFrom<String> for HookTimeout {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        match crate::args::parse_duration(text.trim()) {
            Ok(d) if !d.is_zero() => Ok(HookTimeout(d)),
            _ => Err(format!(
                "{text:?} is not a hook timeout: use a time like 30s, 10m or 2h"
            )),
        }
    }
}

/// `keep = { daily = 7, ... }`: forget's policy, run after every backup.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Keep {
    pub last: Option<u32>,
    pub hourly: Option<u32>,
    pub daily: Option<u32>,
    pub weekly: Option<u32>,
    pub monthly: Option<u32>,
    pub yearly: Option<u32>,
    /// `30d`, `1y2m`: as `forget --keep-within`.
    pub within: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
}

/// `check = { every = "weekly", read-data-subset = "5%" }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CheckSpec {
    pub every: Every,
    pub read_data_subset: Option<SubsetText>,
}

/// `limits = { threads = 2, nice = true, upload = "20M", download = "50M" }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Threads reading files.
    pub threads: Option<u16>,
    /// Run the job at a lower CPU and I/O priority.
    #[serde(default)]
    pub nice: bool,
    /// Bytes per second to every repository of the job (`20M`: 20 MiB/s), as
    /// `--limit-upload` but for this job alone.
    pub upload: Option<Size>,
    /// Bytes per second from them (copy, check, prune read).
    pub download: Option<Size>,
}

/// A size like `100M`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(try_from = "String")]
pub struct Size(pub u64);

impl TryFrom<String> for Size {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        crate::args::parse_size_u64(&s).map(Size)
    }
}

/// `read-data-subset`, checked as `check --read-data-subset` checks it.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "String")]
pub struct SubsetText(pub String);

impl TryFrom<String> for SubsetText {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse::<cairn_core::ops::check::Subset>()?;
        Ok(SubsetText(s))
    }
}

/// The file names of `commands`, checked as the backup will check them: plain names.
fn command_names<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<std::collections::BTreeMap<String, String>, D::Error> {
    let commands = std::collections::BTreeMap::<String, String>::deserialize(d)?;
    for name in commands.keys() {
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
            return Err(serde::de::Error::custom(format!(
                "{name:?} cannot name a command's output: give a plain file name, such as \"db.sql\""
            )));
        }
    }
    Ok(commands)
}

impl Job {
    pub fn jitter(&self) -> Duration {
        self.jitter.map_or(Duration::ZERO, |j| j.0)
    }

    /// The repository specs, in order.
    pub fn repo_specs(&self) -> Vec<String> {
        self.repos.iter().map(|r| r.get_ref().clone()).collect()
    }

    /// The paths with `~/` expanded.
    pub fn source_paths(&self) -> Vec<PathBuf> {
        self.paths.iter().map(|p| expand_home(p)).collect()
    }
}

pub fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix('~'), dirs::home_dir()) {
        (Some(rest), Some(home)) if rest.is_empty() || rest.starts_with('/') => {
            home.join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(p),
    }
}

/// The jobs of a config file, by name.
#[derive(Debug, Clone)]
pub struct Jobs {
    pub path: PathBuf,
    pub jobs: BTreeMap<String, Job>,
}

impl Jobs {
    /// Reads the jobs of the config file at `path` (none if it does not exist).
    pub fn load(path: &Path) -> Result<Jobs> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("Cannot read the config file {}", path.display()))
            }
        };
        parse(&text, path)
    }

    /// The job called `name`; the error says which there are.
    pub fn get(&self, name: &str) -> Result<&Job> {
        match self.jobs.get(name) {
            Some(job) => Ok(job),
            None if self.jobs.is_empty() => bail!(
                "No job named {name:?}: the config file {} has no [jobs.NAME] tables",
                self.path.display()
            ),
            None => bail!(
                "No job named {name:?} in the config file {}; its jobs: {}",
                self.path.display(),
                self.jobs.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// Parses and checks `text`, read from `path`.
fn parse(text: &str, path: &Path) -> Result<Jobs> {
    let file: FileToml = toml::from_str(text).map_err(|e| {
        let at = e.span().map_or(0, |s| s.start);
        anyhow::anyhow!("{}", located(text, path, at, e.message().trim_end()))
    })?;
    let mut jobs = BTreeMap::new();
    for (name, job) in file.jobs {
        let span = job.span();
        let job = job.into_inner();
        check_job(&name, &job, &file.repos).map_err(|(at, msg)| {
            anyhow::anyhow!("{}", located(text, path, at.unwrap_or(span.start), &msg))
        })?;
        jobs.insert(name, job);
    }
    Ok(Jobs {
        path: path.to_path_buf(),
        jobs,
    })
}

/// What `toml` cannot check alone; an error carries where it is, if more precise than the
/// job's table.
fn check_job(
    name: &str,
    job: &Job,
    repos: &BTreeMap<String, toml::Value>,
) -> Result<(), (Option<usize>, String)> {
    crate::config::check_name(name).map_err(|e| (None, format!("{e:#}")))?;
    if job.paths.is_empty() {
        return Err((
            None,
            format!("The job {name:?} has no `paths`: give the files and directories to back up"),
        ));
    }
    if job.repos.is_empty() {
        return Err((
            None,
            format!(
                "The job {name:?} has no `repos`: give one or more, as \"@NAME\" or an address"
            ),
        ));
    }
    for repo in &job.repos {
        let at = Some(repo.span().start);
        match repo.get_ref().strip_prefix('@') {
            Some(r) if !repos.contains_key(r) => {
                let known = if repos.is_empty() {
                    "the file names no repositories; add one with `cairn config repo add NAME ADDRESS`".to_string()
                } else {
                    format!(
                        "known: {}",
                        repos.keys().cloned().collect::<Vec<_>>().join(", ")
                    )
                };
                return Err((at, format!("No repository named {r:?} ({known})")));
            }
            Some(_) => {}
            None => {
                cairn_core::storage::Location::parse(repo.get_ref())
                    .map_err(|e| (at, e.to_string()))?;
            }
        }
    }
    if let Some(keep) = &job.keep {
        let policy = super::runner::keep_policy(keep).map_err(|e| (None, e))?;
        if policy.is_empty() {
            return Err((None, "`keep` keeps nothing: give at least one of last, hourly, daily, weekly, monthly, yearly, within, tags".into()));
        }
    }
    Ok(())
}

/// `FILE, line N, key K: MESSAGE`, and the line itself.
fn located(text: &str, path: &Path, at: usize, message: &str) -> String {
    let at = at.min(text.len());
    let line = text[..at].matches('\n').count() + 1;
    let content = text.lines().nth(line - 1).unwrap_or("").trim();
    let key = key_at(text, at)
        .map(|k| format!(", key `{k}`"))
        .unwrap_or_default();
    format!(
        "Invalid config file {}, line {line}{key}: {message}\n  {line} | {content}",
        path.display()
    )
}

/// The dotted key whose name or value covers byte `at` of `text`, the deepest one.
fn key_at(text: &str, at: usize) -> Option<String> {
    let doc = toml_edit::Document::parse(text.to_string()).ok()?;
    find_key(doc.as_table(), "", at)
}

fn find_key(table: &dyn toml_edit::TableLike, prefix: &str, at: usize) -> Option<String> {
    let covers = |span: Option<std::ops::Range<usize>>| {
        span.is_some_and(|s| s.contains(&at) || s.start == at)
    };
    let mut found = None;
    for (name, item) in table.iter() {
        let path = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}.{name}")
        };
        if let Some(sub) = item.as_table_like() {
            if let Some(deeper) = find_key(sub, &path, at) {
                return Some(deeper);
            }
        }
        let key_span = table.key(name).and_then(|k| k.span());
        if covers(key_span) || covers(item.span()) {
            found = Some(path);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        format!(
            "{:#}",
            parse(text, Path::new("/c/config.toml")).expect_err(text)
        )
    }

    const REPOS: &str = "[repos.nas]\naddress = \"/srv/nas\"\n\n";

    #[test]
    fn a_full_job_reads() {
        let text = format!(
            "{REPOS}[jobs.home]\npaths = [\"~/\", \"/etc\"]\nexclude = [\"*.tmp\"]\n\
             repos = [\"@nas\", \"/srv/other\"]\nschedule = \"daily 02:30\"\njitter = \"10m\"\n\
             keep = {{ daily = 7, weekly = 4 }}\nprune = \"weekly\"\n\
             check = {{ every = \"weekly\", read-data-subset = \"5%\" }}\n\
             before = \"true\"\nhook-timeout = \"30m\"\nlimits = {{ threads = 2, nice = true }}\n\
             notify = [\"healthchecks:http://127.0.0.1:1/ping\"]\n"
        );
        let jobs = parse(&text, Path::new("c.toml")).unwrap();
        let job = jobs.get("home").unwrap();
        assert_eq!(job.repo_specs(), ["@nas", "/srv/other"]);
        assert_eq!(job.jitter(), Duration::from_secs(600));
        assert_eq!(job.limits.threads, Some(2));
        assert_eq!(
            job.hook_timeout,
            Some(HookTimeout(Duration::from_secs(1800)))
        );
        assert!(jobs.get("away").is_err());
    }

    #[test]
    fn errors_name_the_line_and_the_key() {
        let e = err(&format!(
            "{REPOS}[jobs.home]\npaths = [\"/\"]\nrepos = [\"@nas\"]\nschedule = \"dayly\"\n"
        ));
        assert!(
            e.contains("line 7") && e.contains("jobs.home.schedule"),
            "{e}"
        );
        let e = err(&format!(
            "{REPOS}[jobs.home]\npaths = [\"/\"]\nrepos = [\"@nas\"]\nkeep = {{ daly = 7 }}\n"
        ));
        assert!(e.contains("line 7") && e.contains("daly"), "{e}");
        let e = err(&format!(
            "{REPOS}[jobs.home]\npaths = [\"/\"]\n\nrepos = [\"@nass\"]\n"
        ));
        assert!(
            e.contains("line 7") && e.contains("jobs.home.repos") && e.contains("nass"),
            "{e}"
        );
        let e = err("[jobs.home]\npaths = [\"/\"]\n");
        assert!(e.contains("repos") && e.contains("line 1"), "{e}");
        let e = err(&format!(
            "{REPOS}[jobs.home]\npaths = [\"/\"]\nrepos = [\"@nas\"]\ncommands = {{ \"a/b\" = \"c\" }}\n"
        ));
        assert!(e.contains("plain file name") && e.contains("line 7"), "{e}");
        let e = err(&format!(
            "{REPOS}[jobs.home]\npaths = [\"/\"]\nrepos = [\"@nas\"]\nkeep = {{ tags = [] }}\n"
        ));
        assert!(e.contains("keeps nothing"), "{e}");
        for bad in ["0s", "soon", "-5m"] {
            let e = err(&format!(
                "{REPOS}[jobs.home]\npaths = [\"/\"]\nrepos = [\"@nas\"]\nhook-timeout = \"{bad}\"\n"
            ));
            assert!(
                e.contains("line 7") && e.contains("hook-timeout") && e.contains("30s, 10m or 2h"),
                "{e}"
            );
        }
    }
}

//! `cairn schedule install|remove|status`: systemd units for those who prefer systemd's
//! timers to `cairn daemon`. Each scheduled job gets `cairn-JOB.service` (a oneshot
//! `cairn run JOB`) and `cairn-JOB.timer` (its schedule as `OnCalendar=`, or
//! `OnUnitActiveSec=` for `every`; `Persistent=` catches up a run missed while the
//! machine was off, `RandomizedDelaySec=` is the jitter).
//!
//! Units are written into the user's or the system's unit directory (then systemctl
//! enables the timers), or into `--dir` (then nothing else is done: for packaging, or to
//! look first). Only files that carry cairn's mark are ever removed.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::args::{GlobalArgs, ScheduleArgs, ScheduleCommand};
use crate::jobs::config::{Job, Jobs};
use crate::jobs::schedule::Schedule;

/// The first line of every unit cairn writes: what `remove` looks for.
const MARK: &str = "# Written by `cairn schedule install`; `cairn schedule remove` removes it.";

pub fn run(g: &GlobalArgs, c: ScheduleCommand) -> Result<u8> {
    match c {
        ScheduleCommand::Install(a) => install(g, &a),
        ScheduleCommand::Remove(a) => remove(g, &a),
        ScheduleCommand::Status(a) => status(&a),
    }
}

fn unit_dir(a: &ScheduleArgs) -> Result<PathBuf> {
    if let Some(dir) = &a.dir {
        return Ok(dir.clone());
    }
    if a.system {
        return Ok(PathBuf::from("/etc/systemd/system"));
    }
    let config = dirs::config_dir()
        .context("No config directory for user units: set XDG_CONFIG_HOME, or pass --dir")?;
    Ok(config.join("systemd/user"))
}

fn systemctl(a: &ScheduleArgs, args: &[&str]) -> Result<()> {
    let mut cmd = Command::new("systemctl");
    if !a.system {
        cmd.arg("--user");
    }
    let status = cmd
        .args(args)
        .status()
        .with_context(|| format!("Cannot run systemctl {}", args.join(" ")))?;
    if !status.success() {
        bail!("systemctl {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn install(g: &GlobalArgs, a: &ScheduleArgs) -> Result<u8> {
    let config = crate::config::default_path()?;
    let config = std::path::absolute(&config).unwrap_or(config);
    crate::config::ConfigFile::load(&config)?;
    let jobs = Jobs::load(&config)?;
    let selected: Vec<(&String, &Job)> = jobs
        .jobs
        .iter()
        .filter(|(_, j)| j.schedule.is_some())
        .collect();
    if selected.is_empty() {
        bail!(
            "No job in {} has a schedule: give one a `schedule = \"daily 02:30\"`",
            config.display()
        );
    }
    let exe = std::env::current_exe().context("Cannot find the cairn binary's path")?;
    // The units read the same config file, whoever runs them.
    let xdg_config = config
        .parent()
        .and_then(Path::parent)
        .context("The config file has no directory")?;
    let dir = unit_dir(a)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("Cannot create {}", dir.display()))?;
    let mut timers = Vec::new();
    for (name, job) in selected {
        let Some(schedule) = &job.schedule else {
            continue;
        };
        let timing = timer_timing(schedule).with_context(|| format!("The job {name:?}"))?;
        let service =
            format!(
            "{MARK}\n[Unit]\nDescription=cairn backup job {name}\nWants=network-online.target\n\
             After=network-online.target\n\n[Service]\nType=oneshot\n\
             Environment=\"XDG_CONFIG_HOME={}\"\nExecStart=\"{}\" run {name}\n{}",
            xdg_config.display(),
            exe.display(),
            if job.limits.nice { "Nice=10\nIOSchedulingClass=idle\n" } else { "" },
        );
        let jitter = job.jitter().as_secs();
        let timer = format!(
            "{MARK}\n[Unit]\nDescription=cairn backup job {name}: {}\n\n[Timer]\n{timing}\
             RandomizedDelaySec={jitter}\nUnit=cairn-{name}.service\n\n\
             [Install]\nWantedBy=timers.target\n",
            schedule.text
        );
        write_unit(&dir.join(format!("cairn-{name}.service")), &service)?;
        write_unit(&dir.join(format!("cairn-{name}.timer")), &timer)?;
        timers.push(format!("cairn-{name}.timer"));
    }
    if !g.quiet {
        println!(
            "Wrote {} into {}",
            timers
                .iter()
                .map(|t| t.replace(".timer", ".{service,timer}"))
                .collect::<Vec<_>>()
                .join(", "),
            dir.display()
        );
    }
    if a.dir.is_none() {
        systemctl(a, &["daemon-reload"])?;
        let mut args = vec!["enable", "--now"];
        args.extend(timers.iter().map(String::as_str));
        systemctl(a, &args)?;
        if !g.quiet {
            println!("Enabled and started {}", timers.join(", "));
        }
    }
    Ok(0)
}

fn write_unit(path: &Path, text: &str) -> Result<()> {
    if let Ok(old) = std::fs::read_to_string(path) {
        if !old.starts_with(MARK) {
            bail!(
                "{} exists and was not written by cairn: remove it first",
                path.display()
            );
        }
    }
    std::fs::write(path, text).with_context(|| format!("Cannot write {}", path.display()))
}

/// The `[Timer]` lines of a schedule.
fn timer_timing(schedule: &Schedule) -> Result<String> {
    let t = schedule.text.trim();
    if let Some(every) = t.strip_prefix("every ") {
        let secs = crate::args::parse_duration(every)
            .map_err(anyhow::Error::msg)?
            .as_secs();
        return Ok(format!(
            "OnActiveSec=0\nOnUnitActiveSec={secs}s\nAccuracySec=1s\n"
        ));
    }
    let calendar = match t {
        "hourly" | "daily" | "weekly" | "monthly" => t.to_string(),
        _ => match t.strip_prefix("daily ") {
            Some(at) => format!("*-*-* {}:00", at.trim()),
            None => cron_to_calendar(t)?,
        },
    };
    // Catches up a run missed while the machine was off, as the daemon does.
    Ok(format!("OnCalendar={calendar}\nPersistent=true\n"))
}

/// A 5-field cron expression as systemd's calendar syntax; the forms both share (numbers,
/// `*`, lists, ranges, steps). Others are refused with what to use instead.
fn cron_to_calendar(cron: &str) -> Result<String> {
    let fields: Vec<&str> = cron.split_whitespace().collect();
    let refuse = || {
        anyhow::anyhow!(
            "The schedule {cron:?} cannot be a systemd timer (only 5-field cron expressions \
             of numbers, *, lists, ranges and steps): use `cairn daemon`, or a schedule like \
             daily 02:30"
        )
    };
    let [minute, hour, dom, month, dow] = fields[..] else {
        return Err(refuse());
    };
    if fields.iter().any(|f| {
        f.chars()
            .any(|c| !(c.is_ascii_digit() || "*,/-".contains(c)))
    }) {
        return Err(refuse());
    }
    let field = |f: &str, first: &str| -> String {
        f.split(',')
            .map(|part| match part.split_once('/') {
                Some(("*", step)) => format!("{first}/{step}"),
                _ => part.replace('-', ".."),
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    const DAYS: [&str; 8] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    let day = |n: &str| n.parse::<usize>().ok().and_then(|n| DAYS.get(n).copied());
    let weekdays = if dow == "*" {
        String::new()
    } else {
        let mut parts = Vec::new();
        for part in dow.split(',') {
            let text = match part.split_once('-') {
                Some((a, b)) => format!(
                    "{}..{}",
                    day(a).ok_or_else(refuse)?,
                    day(b).ok_or_else(refuse)?
                ),
                None => day(part).ok_or_else(refuse)?.to_string(),
            };
            parts.push(text);
        }
        format!("{} ", parts.join(","))
    };
    Ok(format!(
        "{weekdays}*-{}-{} {}:{}:00",
        field(month, "1"),
        field(dom, "1"),
        field(hour, "0"),
        field(minute, "0")
    ))
}

/// Units in the directory that cairn wrote.
fn ours(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("cairn-"))
                && std::fs::read_to_string(p).is_ok_and(|t| t.starts_with(MARK))
        })
        .collect();
    found.sort();
    found
}

fn remove(g: &GlobalArgs, a: &ScheduleArgs) -> Result<u8> {
    let dir = unit_dir(a)?;
    let units = ours(&dir);
    let timers = timer_names(&units);
    if a.dir.is_none() && !timers.is_empty() {
        let mut args = vec!["disable", "--now"];
        args.extend(timers.iter().map(String::as_str));
        if let Err(e) = systemctl(a, &args) {
            eprintln!("warning: {e:#}");
        }
    }
    for unit in &units {
        std::fs::remove_file(unit).with_context(|| format!("Cannot remove {}", unit.display()))?;
    }
    if a.dir.is_none() && !units.is_empty() {
        systemctl(a, &["daemon-reload"])?;
    }
    if !g.quiet {
        println!("Removed {} units from {}", units.len(), dir.display());
    }
    Ok(0)
}

/// The file names of the timer units among `units`.
fn timer_names(units: &[std::path::PathBuf]) -> Vec<String> {
    units
        .iter()
        .filter_map(|p| {
            p.file_name()?
                .to_str()
                .filter(|n| n.ends_with(".timer"))
                .map(String::from)
        })
        .collect()
}

fn status(a: &ScheduleArgs) -> Result<u8> {
    let dir = unit_dir(a)?;
    let units = ours(&dir);
    if units.is_empty() {
        println!("No units of cairn in {}", dir.display());
        return Ok(0);
    }
    for unit in &units {
        println!("{}", unit.display());
    }
    if a.dir.is_none() {
        let mut args = vec!["list-timers", "--all"];
        let names = timer_names(&units);
        args.extend(names.iter().map(String::as_str));
        systemctl(a, &args)?;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cron_expressions_become_calendar_events() {
        assert_eq!(cron_to_calendar("30 2 * * *").unwrap(), "*-*-* 2:30:00");
        assert_eq!(
            cron_to_calendar("*/15 8-18 * * 1-5").unwrap(),
            "Mon..Fri *-*-* 8..18:0/15:00"
        );
        assert_eq!(
            cron_to_calendar("0 0 1,15 * 0").unwrap(),
            "Sun *-*-1,15 0:0:00"
        );
        assert!(cron_to_calendar("0 0 L * *").is_err());
        assert!(cron_to_calendar("0 0 0 1 * *").is_err());
    }
}

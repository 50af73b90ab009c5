//! `cairn config repo add/list/remove/default`: edits the config file's named
//! repositories. None of these contacts a repository or runs a password command.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cairn_core::storage::Location;

use crate::args::{ConfigCommand, GlobalArgs, RepoAddArgs, RepoCommand, RepoDefaultArgs};
use crate::config::{ConfigFile, PasswordSource, RepoEntry};
use crate::output;

pub fn run(g: &GlobalArgs, c: ConfigCommand) -> Result<u8> {
    let r = match c {
        ConfigCommand::Repo(r) => r,
        ConfigCommand::Check => return check(g),
    };
    let mut config = ConfigFile::load_default()?;
    match r {
        RepoCommand::Add(a) => add(g, &mut config, a),
        RepoCommand::List => list(g, &config),
        RepoCommand::Remove(a) => remove(g, &mut config, &a.name),
        RepoCommand::Default(a) => default(g, &mut config, a),
    }?;
    Ok(0)
}

/// `cairn config check`: the repositories as `-r @NAME` reads them, then the jobs.
fn check(g: &GlobalArgs) -> Result<u8> {
    let config = ConfigFile::load_default()?;
    let jobs = crate::jobs::config::Jobs::load(config.path())?;
    if g.json {
        output::json(&serde_json::json!({
            "file": config.path(),
            "repository_names": config.repos().map(|r| &r.name).collect::<Vec<_>>(),
            "job_names": jobs.jobs.keys().collect::<Vec<_>>(),
        }))?;
    } else if !g.quiet {
        println!(
            "{} is valid: {}, {}",
            config.path().display(),
            output::count(config.repos().count() as u64, "repository", "repositories"),
            output::count(jobs.jobs.len() as u64, "job", "jobs")
        );
    }
    Ok(0)
}

fn add(g: &GlobalArgs, config: &mut ConfigFile, a: RepoAddArgs) -> Result<()> {
    let password = match (a.password_command, a.password_file) {
        (Some(cmd), _) => Some(PasswordSource::Command(cmd)),
        (None, Some(file)) => {
            let file = absolute(&file)?;
            if !file.exists() {
                eprintln!(
                    "warning: the password file {} does not exist (yet)",
                    file.display()
                );
            }
            Some(PasswordSource::File(file))
        }
        (None, None) => None,
    };
    let rest_token_file = a.rest_token_file.as_deref().map(absolute).transpose()?;
    let entry = RepoEntry {
        name: a.name,
        address: stored_address(&a.address)?,
        password,
        rest_token_file,
    };
    config.add(entry.clone(), a.force)?;
    if a.default {
        config.set_default(Some(&entry.name))?;
    }
    config.save()?;
    if g.json {
        output::json(&entry_json(&entry, config))?;
    } else if !g.quiet {
        println!(
            "Added the repository {} ({}) to {}{}",
            entry.name,
            entry.address,
            config.path().display(),
            if a.default { ", as the default" } else { "" }
        );
    }
    Ok(())
}

/// The address as it should be kept: a relative local path made absolute, since later
/// commands run from other directories.
fn stored_address(address: &str) -> Result<String> {
    if address.starts_with('@') {
        // Refused with its own message by `ConfigFile::add`.
        return Ok(address.to_string());
    }
    match Location::parse(address) {
        Ok(Location::Local(path)) if path.is_relative() => {
            let path = absolute(&path)?;
            path.to_str()
                .map(str::to_string)
                .with_context(|| format!("The path {} is not valid UTF-8", path.display()))
        }
        _ => Ok(address.to_string()),
    }
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("Cannot make {} absolute", path.display()))
}

fn list(g: &GlobalArgs, config: &ConfigFile) -> Result<()> {
    if g.json {
        let items: Vec<_> = config.repos().map(|e| entry_json(e, config)).collect();
        return output::json(&serde_json::json!({ "repositories": items }));
    }
    if config.repos().next().is_none() {
        println!(
            "No named repositories in {}: add one with `cairn config repo add NAME ADDRESS`",
            config.path().display()
        );
        return Ok(());
    }
    let rows: Vec<[String; 4]> = config
        .repos()
        .map(|e| {
            let default = config.default_name() == Some(e.name.as_str());
            [
                if default { "*" } else { "" }.to_string(),
                e.name.clone(),
                e.address.clone(),
                describe_password(e.password.as_ref()),
            ]
        })
        .collect();
    let header = ["", "Name", "Address", "Password"].map(String::from);
    let mut widths = [0; 4];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = std::io::stdout().lock();
    for row in std::iter::once(&header).chain(&rows) {
        let line = format!(
            "{:<w0$} {:<w1$}  {:<w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
        );
        writeln!(out, "{}", line.trim_end())?;
    }
    let marks = if config.default_name().is_some() {
        "; * marks the default"
    } else {
        ""
    };
    writeln!(
        out,
        "{} repositories in {}{marks}",
        rows.len(),
        config.path().display()
    )?;
    Ok(())
}

fn describe_password(source: Option<&PasswordSource>) -> String {
    match source {
        Some(PasswordSource::Command(cmd)) => format!("command: {cmd}"),
        Some(PasswordSource::File(file)) => format!("file: {}", file.display()),
        None => "-".into(),
    }
}

fn entry_json(e: &RepoEntry, config: &ConfigFile) -> serde_json::Value {
    let (command, file) = match &e.password {
        Some(PasswordSource::Command(cmd)) => (Some(cmd.clone()), None),
        Some(PasswordSource::File(file)) => (None, Some(file.display().to_string())),
        None => (None, None),
    };
    serde_json::json!({
        "name": e.name,
        "address": e.address,
        "default": config.default_name() == Some(e.name.as_str()),
        "password_command": command,
        "password_file": file,
        "rest_token_file": e.rest_token_file.as_ref().map(|f| f.display().to_string()),
    })
}

fn remove(g: &GlobalArgs, config: &mut ConfigFile, name: &str) -> Result<()> {
    let was_default = config.remove(name)?;
    config.save()?;
    if g.json {
        output::json(&serde_json::json!({ "removed": name, "was_default": was_default }))?;
    } else if !g.quiet {
        println!(
            "Removed the repository {name} from {} (its data is untouched){}",
            config.path().display(),
            if was_default {
                "; it was the default, so commands without -r use the built-in default repository again"
            } else {
                ""
            }
        );
    }
    Ok(())
}

fn default(g: &GlobalArgs, config: &mut ConfigFile, a: RepoDefaultArgs) -> Result<()> {
    if a.unset {
        config.set_default(None)?;
        config.save()?;
    } else if let Some(name) = &a.name {
        config.set_default(Some(name))?;
        config.save()?;
    }
    let current = config.default_name();
    if g.json {
        output::json(&serde_json::json!({ "default": current }))?;
    } else if !g.quiet {
        match current {
            Some(name) => println!("The default repository is {name}"),
            None => println!(
                "No default repository is named: commands without -r use the built-in default repository"
            ),
        }
    }
    Ok(())
}

//! One file per command: each converts its arguments into core options, calls one core
//! operation, and prints the report for people or as JSON.

pub mod backup;
mod browse;
mod check;
mod chunk;
mod config;
mod copy;
mod daemon;
mod diff;
mod dump;
mod find;
mod forget;
mod generate;
mod init;
mod key;
mod repair;
mod restore;
mod rewrite;
mod run;
mod schedule;
mod serve;
mod snapshots;
mod stats;

use anyhow::{Context, Result};
use cairn_core::ops::exclude::{ExcludeOptions, Excludes};
use cairn_core::snapshot::SnapshotFilter;

use crate::args::{Cli, Command, ExcludeArgs, FilterArgs};

/// The core's exclusion options from backup's flags: patterns given and read from
/// `--exclude-file`s, and the ignore files, `.cairnignore` last so that its patterns win
/// over `.gitignore`'s in one directory.
pub fn exclude_options(a: &ExcludeArgs) -> Result<ExcludeOptions> {
    let mut excludes = a.excludes.clone();
    for file in &a.exclude_files {
        excludes.extend(Excludes::read_file(file)?);
    }
    let mut iexcludes = a.iexcludes.clone();
    for file in &a.iexclude_files {
        iexcludes.extend(Excludes::read_file(file)?);
    }
    let mut ignore_files = Vec::new();
    if a.git_ignore {
        ignore_files.push(".gitignore".into());
    }
    ignore_files.push(".cairnignore".into());
    Ok(ExcludeOptions {
        excludes,
        iexcludes,
        ignore_files,
        exclude_if_present: a.exclude_if_present.clone(),
        exclude_caches: a.exclude_caches,
        exclude_larger_than: a.exclude_larger_than,
    })
}

/// The core's filter for `--host`, `--tag` (split on commas: all of a group) and
/// `--path` (made absolute as backup records paths).
pub fn snapshot_filter(a: &FilterArgs) -> Result<SnapshotFilter> {
    let paths = a
        .paths
        .iter()
        .map(|p| {
            cairn_core::ops::backup::lexical_absolute(p)
                .map(|p| p.to_string_lossy().into_owned())
                .with_context(|| format!("--path {}", p.display()))
        })
        .collect::<Result<_>>()?;
    Ok(SnapshotFilter {
        hosts: a.hosts.clone(),
        tags: a
            .tags
            .iter()
            .map(|t| {
                t.split(',')
                    .filter(|t| !t.is_empty())
                    .map(String::from)
                    .collect()
            })
            .collect(),
        paths,
    })
}

/// Runs the command; returns the exit code.
pub fn run(cli: Cli) -> Result<u8> {
    let g = &cli.global;
    crate::context::set_ca_cert(g.cacert.clone());
    crate::context::set_rate_limits(g.limit_upload, g.limit_download);
    if g.nice {
        crate::nice::lower_priority();
    }
    match cli.command {
        Command::Init(a) => init::run(g, a),
        Command::Backup(a) => backup::run(g, a),
        Command::Snapshots(a) => snapshots::run(g, a),
        Command::Ls(a) => browse::ls(g, a),
        Command::Cat(a) => browse::cat(g, a),
        Command::Dump(a) => dump::run(g, a),
        Command::Mount(a) => crate::mount::run(g, a),
        Command::Restore(a) => restore::run(g, a),
        Command::Diff(a) => diff::run(g, a),
        Command::Find(a) => find::run(g, a),
        Command::Stats(a) => stats::run(g, a),
        Command::Chunk(a) => chunk::run(g, a),
        Command::Check(a) => check::run(g, a),
        Command::Forget(a) => forget::run(g, a),
        Command::Tag(a) => rewrite::tag(g, a),
        Command::Rewrite(a) => rewrite::rewrite(g, a),
        Command::Prune(a) => forget::prune(g, a.max_unused, a.dry_run),
        Command::Repair(r) => repair::run(g, r),
        Command::Config(c) => config::run(g, c),
        Command::Copy(a) => copy::run(g, a),
        Command::Key(k) => key::run(g, k),
        Command::Serve(a) => serve::run(g, a),
        Command::Generate(a) => generate::run(g, a),
        Command::Run(a) => run::run(g, a),
        Command::Daemon(a) => daemon::run(g, a),
        Command::Schedule(c) => schedule::run(g, c),
    }
}

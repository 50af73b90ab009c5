//! `cairn generate`: shell completions (clap_complete) and man pages (clap_mangen), made
//! from the same definitions as `--help`, so they never fall behind the options.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use clap::CommandFactory;

use crate::args::{Cli, GenerateArgs, GlobalArgs};

pub fn run(g: &GlobalArgs, a: GenerateArgs) -> Result<u8> {
    let mut cli = Cli::command();
    if let Some(shell) = a.completions {
        // Into a buffer first: clap_complete panics when its writer fails (`| head`).
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut cli, "cairn", &mut script);
        std::io::stdout()
            .lock()
            .write_all(&script)
            .context("cannot write the completions")?;
    }
    if let Some(dir) = a.man {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let written = write_man_pages(&cli, "cairn", &dir)?;
        if !g.quiet {
            eprintln!("{} man pages written to {}", written, dir.display());
        }
    }
    Ok(0)
}

/// Writes `NAME.1` for `cmd` and, recursively, `NAME-SUB.1` for each subcommand; returns
/// how many pages it wrote.
fn write_man_pages(cmd: &clap::Command, name: &str, dir: &Path) -> Result<usize> {
    let cmd = cmd.clone().display_name(name).bin_name(name);
    let path = dir.join(format!("{name}.1"));
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut page)
        .with_context(|| format!("cannot render the man page {name}"))?;
    std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
    let mut written = 1;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        written += write_man_pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(written)
}

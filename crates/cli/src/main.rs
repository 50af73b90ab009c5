//! The `cairn` binary: parse the command line, run one command from `commands/`, and turn
//! the outcome into an exit code. Everything else lives in cairn-core.

mod args;
mod commands;
mod config;
mod context;
mod mount;
mod output;
mod signals;

use std::process::ExitCode;

/// Exit code when a backup finished but some source files could not be read.
pub const EXIT_PARTIAL: u8 = 3;

/// Exit code after Ctrl-C, as shells report a death by SIGINT.
pub const EXIT_INTERRUPTED: u8 = 130;

fn main() -> ExitCode {
    let cli = args::Cli::parse_args();
    let (stats, json) = (cli.global.stats, cli.global.json);
    let outcome = commands::run(cli);
    if stats {
        output::print_request_counts(&context::request_counts(), json);
    }
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) if signals::interrupted() => {
            eprintln!("error: {err:#}");
            ExitCode::from(EXIT_INTERRUPTED)
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// `cairn cat ... | head` is not an error.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

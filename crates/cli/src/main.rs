//! The `cairn` binary: parse the command line, run one command from `commands/`, and turn
//! the outcome into an exit code. Everything else lives in cairn-core.

mod args;
mod commands;
mod config;
mod context;
mod mount;
mod output;
mod progress;
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

/// `cairn cat ... | head` is not an error: whoever read the output has gone. A broken pipe
/// below a storage error is not that but a cut network connection (S3, SFTP), and a
/// command that lost its repository must fail.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    // cairn_core::Error::Storage is transparent: its source is the storage error's source.
    let from_storage = err.chain().any(|e| {
        e.is::<cairn_core::storage::StorageError>()
            || matches!(
                e.downcast_ref::<cairn_core::Error>(),
                Some(cairn_core::Error::Storage(_))
            )
    });
    !from_storage
        && err.chain().any(|e| {
            e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::storage::StorageError;
    use std::io;

    #[test]
    fn a_broken_pipe_on_stdout_is_success_but_one_to_the_repository_is_not() {
        let stdout = anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(is_broken_pipe(&stdout.context("Cannot print a file")));
        let network = StorageError::Remote {
            op: "write",
            name: "data/00/00".into(),
            location: "s3:http://host/bucket".into(),
            hint: "check the network",
            source: Box::new(io::Error::from(io::ErrorKind::BrokenPipe)),
        };
        assert!(!is_broken_pipe(&anyhow::Error::new(network)));
        let wrapped = cairn_core::Error::Storage(StorageError::Io {
            op: "write",
            name: "data/00/00".into(),
            location: "sftp:host:/repo".into(),
            source: io::Error::from(io::ErrorKind::BrokenPipe),
        });
        assert!(!is_broken_pipe(
            &anyhow::Error::new(wrapped).context("Backup failed")
        ));
    }
}

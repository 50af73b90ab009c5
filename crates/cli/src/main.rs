//! The `cairn` binary: parse the command line, run one command from `commands/`, and turn
//! the outcome into an exit code. Everything else lives in cairn-core.

mod args;
mod commands;
mod config;
mod context;
mod jobs;
mod mount;
mod nice;
mod output;
mod parse;
mod progress;
mod signals;

use std::process::ExitCode;

/// Exit code when a backup finished but some source files could not be read.
pub const EXIT_PARTIAL: u8 = 3;

/// Exit code after Ctrl-C, as shells report a death by SIGINT.
pub const EXIT_INTERRUPTED: u8 = 130;

fn main() -> ExitCode {
    fix_mmap_threshold();
    let cli = parse::command_line();
    let (stats, json) = (cli.global.stats, cli.global.json);
    let outcome = commands::run(cli);
    if stats {
        output::print_request_counts(&context::request_counts(), json);
    }
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            let (kind, code) = if signals::interrupted() {
                ("interrupted", EXIT_INTERRUPTED)
            } else {
                (output::error_kind(&err), 1)
            };
            let message = format!("{err:#}");
            eprintln!("error: {}", output::message(&message));
            if json {
                output::json_error(kind, &message, code);
            }
            ExitCode::from(code)
        }
    }
}

/// Serves blocks of 8 MiB and more (pack buffers, index tables and files) from their own
/// mappings, returned to the system when freed. glibc's default raises this threshold to
/// the size of each large block freed, up to 32 MiB, after which every 18 MiB pack buffer
/// came from the heap and the heap kept it: a first backup of the Linux tree peaked at
/// 130-154 MiB, against 88-93 MiB with the threshold fixed here, restore at 83-85 against
/// 72 MiB, and a backup into a 10-million-blob repository at 632 against 587 MiB
/// (docs/BENCHMARKS.md). Few blocks are that large: that first backup maps 71 in all. A
/// threshold set in the environment (`MALLOC_MMAP_THRESHOLD_`) is left alone.
///
/// Fixing that threshold also fixes the trim threshold at its default, 128 KiB: each free
/// of a chunk-sized block at the top of a heap gave its pages back, and the next block
/// faulted them in again. Kept at 4 MiB, a few chunks' worth: page faults of a first
/// backup of the Linux tree 355,000 → 149,000 and of its restore 283,000 → 65,000 (each
/// about a microsecond of system time), peak RSS 94 → 103 MiB and 103 → 75 MiB (one run
/// each; at 8 MiB, 103,000 and 38,000 faults for 116 and 77 MiB).
fn fix_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        // SAFETY: mallopt only changes the allocator's tuning; called before any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 8 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 4 << 20);
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

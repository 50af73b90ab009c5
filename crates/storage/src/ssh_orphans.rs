//! Ending `ssh` master processes that nothing can reach any more.
//!
//! OpenDAL's SFTP service opens each connection with the `openssh` crate, which starts
//! `ssh -M -f -N -o ControlPersist=yes -S DIR/master` with DIR a fresh
//! `.ssh-connection*` temporary directory, and ends the master (`ssh -O exit`) when the
//! session is dropped. When OpenDAL gives up on a slow connection attempt (its pool
//! waits 10 s) the attempt is dropped after `ssh` has forked but before a session
//! exists: DIR is deleted and the master lives on forever, with no socket to stop it
//! through. Seen once in a dozen SFTP runs on a loaded machine.
//!
//! A master whose control directory is gone can serve no one, so ending it is always
//! safe, whoever started it; cairn does this when it closes an SFTP store.

use std::path::Path;

/// Sends SIGTERM to this user's `ssh` masters whose `.ssh-connection*` control
/// directory no longer exists. Linux only (reads `/proc`); elsewhere does nothing.
/// Returns how many were ended.
pub fn end_orphaned_masters() -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let mut ended = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let owned = std::os::unix::fs::MetadataExt::uid(&match entry.metadata() {
            Ok(m) => m,
            Err(_) => continue,
        }) == uid;
        if !owned {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if is_orphaned_master(&cmdline) {
            // SAFETY: kill with a valid signal number; a process that already exited
            // makes it fail with ESRCH, which is fine.
            if unsafe { libc::kill(pid, libc::SIGTERM) } == 0 {
                ended += 1;
            }
        }
    }
    ended
}

/// Whether a NUL-separated command line is an `openssh`-crate master (`ssh ... -M ...
/// -S DIR/master`) whose control directory `DIR` is gone.
fn is_orphaned_master(cmdline: &[u8]) -> bool {
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let is_ssh = args
        .first()
        .is_some_and(|a| a == b"ssh" || a.ends_with(b"/ssh"));
    if !is_ssh || !args.iter().any(|a| *a == b"-M") {
        return false;
    }
    let Some(socket) = args
        .windows(2)
        .find(|w| w[0] == b"-S")
        .and_then(|w| std::str::from_utf8(w[1]).ok())
    else {
        return false;
    };
    let Some(dir) = Path::new(socket).parent() else {
        return false;
    };
    let from_openssh_crate = dir
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(".ssh-connection"));
    from_openssh_crate && !dir.exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmdline(socket: &str) -> Vec<u8> {
        let args = [
            "ssh",
            "-E",
            "log",
            "-S",
            socket,
            "-M",
            "-f",
            "-N",
            "-o",
            "ControlPersist=yes",
            "host",
        ];
        args.join("\0").into_bytes()
    }

    #[test]
    fn only_masters_of_deleted_control_directories_are_orphans() {
        let live = tempfile::Builder::new()
            .prefix(".ssh-connection")
            .tempdir()
            .unwrap();
        let live_socket = live.path().join("master");
        assert!(!is_orphaned_master(&cmdline(live_socket.to_str().unwrap())));

        let gone = live.path().with_file_name(".ssh-connectionGONE123/master");
        assert!(is_orphaned_master(&cmdline(gone.to_str().unwrap())));

        // A user's own multiplexing master elsewhere is never touched.
        assert!(!is_orphaned_master(&cmdline("/nonexistent/cm-socket")));
        assert!(!is_orphaned_master(
            b"sshd\0-M\0-S\0/x/.ssh-connectionA/master"
        ));
        assert!(!is_orphaned_master(
            b"ssh\0-S\0/x/.ssh-connectionA/master\0host"
        ));
    }
}

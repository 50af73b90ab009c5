//! Ending `ssh` master processes that nothing can reach any more, and only those this
//! process started.
//!
//! OpenDAL's SFTP service opens each connection with the `openssh` crate, which starts
//! `ssh -M -f -N -o ControlPersist=yes -S DIR/master` with DIR a fresh
//! `.ssh-connection*` temporary directory, and ends the master (`ssh -O exit`) when the
//! session is dropped. When OpenDAL gives up on a slow connection attempt (its pool
//! waits 10 s) the attempt is dropped after `ssh` has forked but before a session
//! exists: DIR is deleted and the master lives on forever, with no socket to stop it
//! through. Seen once in a dozen SFTP runs on a loaded machine.
//!
//! Which masters are ours: `ssh -f` daemonizes (the master forks, calls `setsid` and
//! its parent exits), so the master has no trace of cairn in its ancestry, arguments or
//! environment, and any other program of the same user (another cairn, a user's own
//! `ssh -M`, a lookalike) can have the same command line. So before it starts any `ssh`,
//! cairn makes itself the child subreaper of its descendants ([`adopt_orphaned_descendants`],
//! Linux's `PR_SET_CHILD_SUBREAPER`): a master it started, once daemonized, becomes
//! cairn's own child instead of init's. A master is ended only if its parent is this
//! process, it is a session leader (what `-f` makes of it), and its control directory is
//! gone. Masters that another process left behind are never touched: each cairn ends its
//! own before it exits.
//!
//! Must never: signal a process that this process did not start, or reap a child that
//! someone else in this process waits for (the `ssh` that tokio spawned and waits for is
//! not a session leader, so the checks below never pick it).

use std::path::Path;

/// Makes this process the subreaper of its descendants, so that the `ssh` masters it
/// starts stay its children after they daemonize. Call before the first `ssh` starts.
/// Linux only; elsewhere, and if the kernel refuses, masters go to init as before and
/// [`end_orphaned_masters`] finds none of them (it ends nothing rather than guess).
pub fn adopt_orphaned_descendants() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag and touches no
    // memory of ours; it sets a flag on this process and cannot fail in a harmful way.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// Sends SIGTERM to the `ssh` masters this process started whose `.ssh-connection*`
/// control directory no longer exists, and reaps them and the masters of ours that
/// already exited (they are this process's children, see the module doc). Linux only
/// (reads `/proc`); elsewhere does nothing. Returns how many were ended.
pub fn end_orphaned_masters() -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let me = std::process::id() as libc::pid_t;
    let mut ended = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let Some(stat) = std::fs::read(entry.path().join("stat"))
            .ok()
            .and_then(|b| Stat::parse(&b))
        else {
            continue;
        };
        if !stat.is_our_daemonized_ssh(pid, me) {
            continue;
        }
        if stat.state == b'Z' {
            // A master of ours that exited (`ssh -O exit`): only we can reap it.
            reap(pid);
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if is_orphaned_master(&cmdline) {
            // SAFETY: kill with a valid signal number on a child of ours; one that
            // already exited makes it fail with ESRCH, which is fine.
            if unsafe { libc::kill(pid, libc::SIGTERM) } == 0 {
                ended += 1;
                reap(pid);
            }
        }
    }
    ended
}

/// Waits up to a second for child `pid` to exit and collects it, so it does not stay a
/// zombie for the rest of a long command. `ssh` exits at once on SIGTERM.
fn reap(pid: libc::pid_t) {
    for _ in 0..100 {
        let mut status = 0;
        // SAFETY: waitpid on one pid that is our child, with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r != 0 {
            return; // collected, or not ours to wait for (ECHILD)
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The fields of `/proc/PID/stat` that say whose process it is.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    comm: Vec<u8>,
    state: u8,
    ppid: libc::pid_t,
    session: libc::pid_t,
}

impl Stat {
    /// `pid (comm) state ppid pgrp session ...`; comm may hold spaces and parentheses,
    /// so it ends at the last `)`.
    fn parse(stat: &[u8]) -> Option<Stat> {
        let open = stat.iter().position(|&b| b == b'(')?;
        let close = stat.iter().rposition(|&b| b == b')')?;
        let comm = stat.get(open + 1..close)?.to_vec();
        let rest = std::str::from_utf8(stat.get(close + 1..)?).ok()?;
        let mut fields = rest.split_ascii_whitespace();
        let state = *fields.next()?.as_bytes().first()?;
        let ppid = fields.next()?.parse().ok()?;
        let _pgrp = fields.next()?;
        let session = fields.next()?.parse().ok()?;
        Some(Stat {
            comm,
            state,
            ppid,
            session,
        })
    }

    /// An `ssh` that this process adopted after it daemonized: our child, and the leader
    /// of its own session, which an `ssh` we spawned and wait for directly never is.
    fn is_our_daemonized_ssh(&self, pid: libc::pid_t, me: libc::pid_t) -> bool {
        self.comm == b"ssh" && self.ppid == me && self.session == pid
    }
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

    #[test]
    fn stat_lines_parse_whatever_the_command_name() {
        let s = Stat::parse(b"4242 (ssh) S 17 4242 4242 0 -1 4194624 0").unwrap();
        assert_eq!(
            s,
            Stat {
                comm: b"ssh".to_vec(),
                state: b'S',
                ppid: 17,
                session: 4242
            }
        );
        assert!(s.is_our_daemonized_ssh(4242, 17));
        // Someone else's child, or one we spawned and wait for (not a session leader).
        assert!(!s.is_our_daemonized_ssh(4242, 18));
        assert!(!s.is_our_daemonized_ssh(4243, 17));
        let odd = Stat::parse(b"7 (a) b) (c) Z 1 7 7 0").unwrap();
        assert_eq!((odd.comm.as_slice(), odd.state), (&b"a) b) (c"[..], b'Z'));
        assert!(Stat::parse(b"7 (ssh").is_none());
        assert!(Stat::parse(b"").is_none());
    }

    #[test]
    fn a_lookalike_master_this_process_did_not_start_is_left_alone() {
        // A same-user process whose command line is that of an orphaned master (bash
        // under the name `ssh`), but a child of this test, not daemonized: it is not
        // one cairn started through openssh.
        use std::os::unix::process::CommandExt;
        let gone = "/nonexistent/.ssh-connectionGONE/master";
        let mut lookalike = std::process::Command::new("bash")
            .arg0("ssh")
            .args(["-c", "sleep 60; :", "-M", "-S", gone])
            .spawn()
            .unwrap();
        // Until it has exec'd, the child's command line is still this test's (up to a
        // minute: a loaded machine may take seconds to run it).
        let path = format!("/proc/{}/cmdline", lookalike.id());
        let mut cmdline = Vec::new();
        for _ in 0..6000 {
            cmdline = std::fs::read(&path).unwrap_or_default();
            if cmdline.starts_with(b"ssh\0") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        adopt_orphaned_descendants();
        end_orphaned_masters();
        let alive = lookalike.try_wait().unwrap().is_none();
        let _ = lookalike.kill();
        let _ = lookalike.wait();
        assert!(is_orphaned_master(&cmdline), "the lookalike looks like one");
        assert!(alive, "the lookalike was ended");
    }
}

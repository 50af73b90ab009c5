//! A hook's or a notification command's process, bounded in time: a hung `before` hook
//! would otherwise hold its job forever, unseen, since the run never ends and so never
//! notifies.
//!
//! Unattended (no controlling terminal: the daemon under systemd, cron), the child runs in
//! a process group of its own, so that a timeout stops what `sh -c` started too (`pg_dump
//! db | gzip`), not only the shell: SIGTERM to the group, then SIGKILL to what is left of
//! it after a grace period. With a terminal it stays in cairn's group, so that it can
//! still prompt there (`sudo`, an ssh passphrase: a background group reading the terminal
//! is stopped by SIGTTIN) and Ctrl-C reaches it as before; a timeout then stops the shell
//! alone. A stop asked for while the child runs (Ctrl-C, the daemon's SIGTERM) is passed
//! on to it as SIGTERM; one asked for before it started is not, so that an `after` hook
//! still runs in full after an interrupted backup.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// How a bounded child ended.
#[derive(Debug)]
pub enum Ended {
    Exited(ExitStatus),
    /// Still running at its limit: stopped, with its process group.
    TimedOut,
    /// A stop was asked for while it ran: stopped, with its process group.
    Interrupted,
}

/// How long a child stopped with SIGTERM has before SIGKILL.
pub const GRACE: Duration = Duration::from_secs(10);

/// Spawns `cmd` in a new process group and waits for it, at most `limit` (none: no
/// limit); `grace` is the time between SIGTERM and SIGKILL. `started` runs once the child
/// exists (a notification command's input is written there).
pub fn run(
    cmd: &mut Command,
    limit: Option<Duration>,
    grace: Duration,
    started: impl FnOnce(&mut Child),
) -> io::Result<Ended> {
    let interrupted_before = crate::signals::interrupted();
    let own_group = std::fs::File::open("/dev/tty").is_err();
    if own_group {
        cmd.process_group(0);
    }
    let mut child = cmd.spawn()?;
    started(&mut child);
    // Negative: the child's process group, whose id is the child's pid.
    let target = match own_group {
        true => -(child.id() as libc::pid_t),
        false => child.id() as libc::pid_t,
    };
    // A limit too far to reach (`hook-timeout = "99999999999d"`) is none.
    let deadline = limit.and_then(|l| Instant::now().checked_add(l));
    // Short polls first, so that a quick hook costs no more than a blocking wait would.
    let mut nap = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Ended::Exited(status));
        }
        if !interrupted_before && crate::signals::interrupted() {
            stop(&mut child, target, grace)?;
            return Ok(Ended::Interrupted);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            stop(&mut child, target, grace)?;
            return Ok(Ended::TimedOut);
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(50));
    }
}

/// SIGTERM to `target` (the child, or with a negative id its group); SIGKILL to what is
/// left of it after `grace`; the child reaped. A whole group gets the grace period, not
/// only the shell: `pg_dump` may still be cleaning up after `sh` is gone.
fn stop(child: &mut Child, target: libc::pid_t, grace: Duration) -> io::Result<()> {
    signal(target, libc::SIGTERM);
    // A stopped process (SIGTTIN, SIGSTOP) would hold SIGTERM until the end of the grace.
    signal(target, libc::SIGCONT);
    let deadline = Instant::now() + grace;
    let mut reaped = false;
    while Instant::now() < deadline {
        // The shell is a member of its group until reaped: the group is empty only after.
        // A reaped child's pid is not asked about: it may be another process's by now.
        reaped = reaped || child.try_wait()?.is_some();
        if reaped && (target > 0 || !exists(target)) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if !reaped || target < 0 {
        signal(target, libc::SIGKILL);
    }
    if !reaped {
        child.wait()?;
    }
    Ok(())
}

/// Whether any process of the group `-target` is left (kill(2) with signal 0 only
/// checks).
fn exists(target: libc::pid_t) -> bool {
    // SAFETY: signal 0 sends nothing.
    let r = unsafe { libc::kill(target, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

fn signal(target: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) on our child's pid, or with a negative id on its process group; one
    // already gone is ESRCH, which changes nothing.
    unsafe {
        libc::kill(target, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script);
        c
    }

    /// Whether `pid` is a live process (not a zombie), read from /proc.
    fn alive(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => !stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
            Err(_) => false,
        }
    }

    /// Waits a few seconds for the process whose pid is in `pidfile` to end.
    fn assert_gone(pidfile: &std::path::Path) {
        let pid: u32 = std::fs::read_to_string(pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) {
            assert!(
                Instant::now() < deadline,
                "the shell's child {pid} lives on"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn an_exit_status_comes_through_and_no_limit_is_needed() {
        let ended = run(&mut sh("exit 3"), None, GRACE, |_| {}).unwrap();
        assert!(
            matches!(ended, Ended::Exited(s) if s.code() == Some(3)),
            "{ended:?}"
        );
        let ended = run(
            &mut sh("true"),
            Some(Duration::from_secs(30)),
            GRACE,
            |_| {},
        )
        .unwrap();
        assert!(
            matches!(ended, Ended::Exited(s) if s.success()),
            "{ended:?}"
        );
    }

    #[test]
    fn a_child_past_its_limit_is_stopped_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let script = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
        let started = Instant::now();
        let ended = run(
            &mut sh(&script),
            Some(Duration::from_millis(300)),
            GRACE,
            |_| {},
        )
        .unwrap();
        assert!(matches!(ended, Ended::TimedOut), "{ended:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert_gone(&pidfile);
    }

    #[test]
    fn a_child_that_ignores_sigterm_is_killed_after_the_grace_period() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        // The trap is inherited by the background sleep too.
        let script = format!(
            "trap '' TERM; sleep 60 & echo $! > {}; wait; wait",
            pidfile.display()
        );
        let started = Instant::now();
        let limit = Some(Duration::from_millis(200));
        let ended = run(&mut sh(&script), limit, Duration::from_millis(300), |_| {}).unwrap();
        assert!(matches!(ended, Ended::TimedOut), "{ended:?}");
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(500), "no grace: {took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert_gone(&pidfile);
    }
}

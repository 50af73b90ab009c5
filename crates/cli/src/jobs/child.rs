//! A hook's or a notification command's process, bounded in time: a hung `before` hook
//! would otherwise hold its job forever, unseen, since the run never ends and so never
//! notifies.
//!
//! Unattended (cairn not the foreground of a terminal: the daemon under systemd, cron,
//! tmux in the background), the child runs in a process group of its own, so that a
//! timeout stops what `sh -c` started too (`pg_dump db | gzip`), not only the shell:
//! SIGTERM (and SIGCONT) to the group, then SIGKILL to what is left of it after a grace
//! period. A stop asked for while it runs (the daemon's SIGTERM) is passed on to the group
//! the same way; one asked for before it started is not, so that an `after` hook still
//! runs in full after an interrupted backup.
//!
//! In the foreground of a terminal, the child stays in cairn's group (see [`Group`]): a
//! background group that reads the terminal is stopped (SIGTTIN), and a hook may prompt
//! (`sudo`). Ctrl-C reaches it from the terminal as before, so nothing is passed on, and
//! a timeout stops the shell alone.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// How a bounded child ended.
#[derive(Debug)]
pub enum Ended {
    Exited(ExitStatus),
    /// Still running at its limit: stopped (with its process group, if it has one).
    TimedOut,
    /// A stop was asked for while it ran, in a process group of its own: stopped with it.
    Interrupted,
}

/// How long a child stopped with SIGTERM has before SIGKILL.
pub const GRACE: Duration = Duration::from_secs(10);

/// Where a child runs: in a process group of its own, or in cairn's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    Own,
    Cairn,
}

impl Group {
    /// Cairn's group when cairn is the foreground of its terminal (someone may answer a
    /// prompt there), else one of the child's own.
    pub fn for_here() -> Group {
        let Ok(tty) = std::fs::File::open("/dev/tty") else {
            return Group::Own;
        };
        // SAFETY: tcgetpgrp on a descriptor we own; getpgrp cannot fail.
        let foreground = unsafe { libc::tcgetpgrp(tty.as_raw_fd()) == libc::getpgrp() };
        match foreground {
            true => Group::Cairn,
            false => Group::Own,
        }
    }
}

/// Spawns `cmd` in `group` and waits for it, at most `limit` (none: no limit) from when
/// `started` has run (it gets the child: a notification command's input is written
/// there); `grace` is the time between SIGTERM and SIGKILL.
pub fn run(
    cmd: &mut Command,
    group: Group,
    limit: Option<Duration>,
    grace: Duration,
    started: impl FnOnce(&mut Child),
) -> io::Result<Ended> {
    let interrupted_before = crate::signals::interrupted();
    if group == Group::Own {
        cmd.process_group(0);
    }
    let mut child = cmd.spawn()?;
    started(&mut child);
    // Negative: the child's process group, whose id is the child's pid.
    let target = match group {
        Group::Own => -(child.id() as libc::pid_t),
        Group::Cairn => child.id() as libc::pid_t,
    };
    // A limit too far to reach (`hook-timeout = "99999999999d"`) is none.
    let deadline = limit.and_then(|l| Instant::now().checked_add(l));
    // Short polls first, so that a quick hook costs no more than a blocking wait would.
    let mut nap = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Ended::Exited(status));
        }
        // In cairn's group, the terminal's Ctrl-C reached the child too: let it finish
        // what it does on SIGINT.
        if group == Group::Own && !interrupted_before && crate::signals::interrupted() {
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
    // Here a lone child (`target` > 0) is not reaped yet: its pid is still its own.
    signal(target, libc::SIGKILL);
    if !reaped {
        child.wait()?;
    }
    Ok(())
}

/// Whether any live process of the group `-target` is left: from /proc, where a zombie
/// (which `kill(-group, 0)` counts until something reaps it, maybe much later in a
/// container) is not one; without /proc, by kill(2) with signal 0, which only checks.
fn exists(target: libc::pid_t) -> bool {
    let group = -target;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        // SAFETY: signal 0 sends nothing.
        let r = unsafe { libc::kill(target, 0) };
        return r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    };
    entries.flatten().any(|e| {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // "pid (comm) state ppid pgrp ...": comm may hold anything but ends at the last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return false;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("Z");
        let pgrp = fields.nth(1).and_then(|f| f.parse::<libc::pid_t>().ok());
        pgrp == Some(group) && state != "Z" && state != "X"
    })
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

    /// A shell that starts a minute's sleep, writes its pid to `pidfile` and waits.
    fn sleeper(pidfile: &std::path::Path) -> Command {
        sh(&format!("sleep 60 & echo $! > {}; wait", pidfile.display()))
    }

    fn read_pid(pidfile: &std::path::Path) -> u32 {
        let pid = std::fs::read_to_string(pidfile).unwrap();
        pid.trim().parse().unwrap()
    }

    /// Waits a few seconds for the process whose pid is in `pidfile` to end.
    fn assert_gone(pidfile: &std::path::Path) {
        let pid = read_pid(pidfile);
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) {
            assert!(
                Instant::now() < deadline,
                "the shell's child {pid} lives on"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A `started` that waits until the script has written its pid file: the limit counts
    /// from there, so a loaded machine cannot stop the script before it is ready.
    fn when_ready(pidfile: &std::path::Path) -> impl FnOnce(&mut Child) + '_ {
        move |_| {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !std::fs::read_to_string(pidfile).is_ok_and(|p| p.ends_with('\n')) {
                assert!(Instant::now() < deadline, "the script never got ready");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    #[test]
    fn an_exit_status_comes_through_and_no_limit_is_needed() {
        for group in [Group::Own, Group::Cairn] {
            let ended = run(&mut sh("exit 3"), group, None, GRACE, |_| {}).unwrap();
            assert!(
                matches!(ended, Ended::Exited(s) if s.code() == Some(3)),
                "{ended:?}"
            );
            let limit = Some(Duration::from_secs(30));
            let ended = run(&mut sh("true"), group, limit, GRACE, |_| {}).unwrap();
            assert!(
                matches!(ended, Ended::Exited(s) if s.success()),
                "{ended:?}"
            );
        }
    }

    #[test]
    fn a_child_past_its_limit_is_stopped_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let limit = Some(Duration::from_millis(300));
        let started = Instant::now();
        let ended = run(
            &mut sleeper(&pidfile),
            Group::Own,
            limit,
            GRACE,
            when_ready(&pidfile),
        )
        .unwrap();
        assert!(matches!(ended, Ended::TimedOut), "{ended:?}");
        // Well within the grace period: the group ended on SIGTERM.
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{:?}",
            started.elapsed()
        );
        assert_gone(&pidfile);
    }

    /// In cairn's group, only the shell can be stopped: what it started is out of reach.
    #[test]
    fn in_cairns_group_a_child_past_its_limit_is_stopped_alone() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let limit = Some(Duration::from_millis(300));
        let ended = run(
            &mut sleeper(&pidfile),
            Group::Cairn,
            limit,
            GRACE,
            when_ready(&pidfile),
        )
        .unwrap();
        assert!(matches!(ended, Ended::TimedOut), "{ended:?}");
        let pid = read_pid(&pidfile);
        assert!(alive(pid), "the shell's child {pid} was stopped too");
        // SAFETY: the test's own grandchild, alive just now.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }

    #[test]
    fn a_child_that_ignores_sigterm_is_killed_after_the_grace_period() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        // The trap is inherited by the background sleep too; the pid file is written after.
        let script = format!(
            "trap '' TERM; sleep 60 & echo $! > {}; wait; wait",
            pidfile.display()
        );
        let limit = Some(Duration::from_millis(200));
        let grace = Duration::from_millis(300);
        let ready = when_ready(&pidfile);
        let mut limit_start = None;
        let ended = run(&mut sh(&script), Group::Own, limit, grace, |c| {
            ready(c);
            limit_start = Some(Instant::now());
        })
        .unwrap();
        assert!(matches!(ended, Ended::TimedOut), "{ended:?}");
        let took = limit_start.unwrap().elapsed();
        assert!(took >= Duration::from_millis(500), "no grace: {took:?}");
        assert!(took < Duration::from_secs(8), "{took:?}");
        assert_gone(&pidfile);
    }
}

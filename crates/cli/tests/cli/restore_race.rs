//! Root restores into a tree an unprivileged user owns while that user keeps swapping the
//! tree's directories for symlinks to a directory outside it (issue 17: restore walked
//! path strings, so it wrote the user's files through such a symlink and its final
//! `chmod` made a root-only directory `drwxrwxrwx`). Whatever the timing, nothing outside
//! the target may be created, changed or deleted, with and without `--delete`.
//!
//! `CAIRN_RACE_ROUNDS` sets the number of restores (default 200, half of them with
//! `--delete`); `CAIRN_RACE_BIN` runs another `cairn` binary, to show the test fails on
//! a build without the fix.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::common::*;

const NOBODY: u32 = 65534;

fn rounds() -> usize {
    std::env::var("CAIRN_RACE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

fn cstring(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("test paths have no NUL")
}

/// A child process running as `nobody` that swaps each of `dirs` for a symlink to
/// `outside` and back, over and over, until dropped.
struct Attacker {
    pid: libc::pid_t,
}

impl Attacker {
    fn start(dirs: &[PathBuf], outside: &Path) -> Attacker {
        // Everything the child uses is made before the fork: the child of a process with
        // threads may only make system calls (no allocation, no locks).
        let swaps: Vec<(CString, CString)> = dirs
            .iter()
            .map(|d| {
                let mut moved = d.as_os_str().to_os_string();
                moved.push(".moved");
                (cstring(d), cstring(Path::new(&moved)))
            })
            .collect();
        let outside = cstring(outside);
        // SAFETY: the child only makes system calls on memory prepared above, and never
        // returns (it is killed, or dies with the parent).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: see above; every pointer is into CStrings that outlive the loop.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(NOBODY) != 0
                    || libc::setuid(NOBODY) != 0
                {
                    libc::_exit(2);
                }
                loop {
                    for (dir, moved) in &swaps {
                        if libc::rename(dir.as_ptr(), moved.as_ptr()) == 0 {
                            libc::symlink(outside.as_ptr(), dir.as_ptr());
                        }
                    }
                    // Leave the symlinks in place for a moment: restore's later steps
                    // (the final directory pass) must meet them too.
                    for _ in 0..50 {
                        libc::sched_yield();
                    }
                    for (dir, moved) in &swaps {
                        if libc::unlink(dir.as_ptr()) == 0 {
                            libc::rename(moved.as_ptr(), dir.as_ptr());
                        }
                    }
                }
            }
        }
        Attacker { pid }
    }
}

impl Attacker {
    /// Stops the child and waits until it is stopped, so that the test's own setup
    /// between restores does not race it (the test works with path strings).
    fn pause(&self) {
        // SAFETY: plain system calls on the child's pid.
        unsafe {
            libc::kill(self.pid, libc::SIGSTOP);
            libc::waitpid(self.pid, std::ptr::null_mut(), libc::WUNTRACED);
        }
    }

    fn resume(&self) {
        // SAFETY: as above.
        unsafe {
            libc::kill(self.pid, libc::SIGCONT);
        }
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        // SAFETY: plain system calls on the child's pid.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// Everything about `dir` and below that a redirected restore could change: names,
/// types, modes, owners, sizes, contents and mtimes (a file made and removed again
/// still moves its directory's mtime).
fn state(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = fs::symlink_metadata(&p).unwrap();
        let content = if md.is_file() {
            format!("{:?}", fs::read(&p).unwrap())
        } else {
            String::new()
        };
        out.push(format!(
            "{} mode {:o} owner {}:{} size {} mtime {}.{} {content}",
            p.display(),
            md.mode(),
            md.uid(),
            md.gid(),
            md.len(),
            md.mtime(),
            md.mtime_nsec()
        ));
        if md.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out.sort();
    out
}

/// Puts back what the (stopped) attacker left swapped, parents first, so that the test's
/// own setup does not write through its symlinks.
fn heal(swapped: &[PathBuf]) {
    for dir in swapped.iter().rev() {
        if fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
            fs::remove_file(dir).unwrap();
        }
        let mut moved = dir.as_os_str().to_os_string();
        moved.push(".moved");
        if fs::symlink_metadata(&moved).is_ok() && fs::symlink_metadata(dir).is_err() {
            fs::rename(&moved, dir).unwrap();
        }
    }
}

/// Gives every entry below `dir` (not following symlinks) to nobody, as a home
/// directory restored before would be.
fn chown_to_nobody(dir: &Path) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let _ = std::os::unix::fs::lchown(&p, Some(NOBODY), Some(NOBODY));
        if fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
            chown_to_nobody(&p);
        }
    }
}

#[test]
fn restore_as_root_never_writes_outside_a_target_whose_owner_swaps_dirs_for_symlinks() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "SKIPPED restore_as_root_never_writes_outside_a_target_whose_owner_swaps_dirs_for_symlinks: \
             needs root (it restores as root and races as user nobody)"
        );
        return;
    }
    let env = TestEnv::with_repo();
    let src = env.path("src");
    let mut dirs = Vec::new();
    for d in 0..8 {
        for s in 0..2 {
            for f in 0..3 {
                write_file(
                    &src.join(format!("d{d}/s{s}/f{f}")),
                    format!("{d} {s} {f}\n").as_bytes(),
                );
            }
            dirs.push(PathBuf::from(format!("d{d}/s{s}")));
        }
        dirs.push(PathBuf::from(format!("d{d}")));
    }
    // Directories that would make a redirected chmod plain to see.
    for d in &dirs {
        set_mode(&src.join(d), 0o777);
    }
    env.backup(&[&src], &[]);
    let snapshot = format!("latest:{}", src.display());

    // A root-only directory beside the target, with something in it.
    let outside = env.path("outside");
    write_file(&outside.join("canary"), b"root's\n");
    write_file(&outside.join("inner/file"), b"root's too\n");
    for (p, mode) in [
        (&outside, 0o700),
        (&outside.join("inner"), 0o700),
        (&outside.join("canary"), 0o600),
    ] {
        set_mode(p, mode);
    }
    let before = state(&outside);
    // nobody reaches the target (and nothing else of the test's directory).
    set_mode(&env.root, 0o711);
    let target = env.path("target");
    fs::create_dir(&target).unwrap();
    std::os::unix::fs::chown(&target, Some(NOBODY), Some(NOBODY)).unwrap();
    set_mode(&target, 0o755);

    let bin = std::env::var_os("CAIRN_RACE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(cairn_bin);
    // Deepest first, so that a swapped parent does not hide its children's swaps.
    dirs.reverse();
    let swapped: Vec<PathBuf> = dirs.iter().map(|d| target.join(d)).collect();
    let attacker = Attacker::start(&swapped, &outside);
    let rounds = rounds();
    let mut failed_restores = 0;
    for round in 0..rounds {
        let delete = round % 2 == 1;
        attacker.pause();
        heal(&swapped);
        if delete {
            // Over the last round's tree, now the user's, with an extra file to delete.
            chown_to_nobody(&target);
            let _ = fs::write(target.join(format!("d{}/extra", round % 8)), b"x");
        } else {
            for e in fs::read_dir(&target).unwrap() {
                let p = e.unwrap().path();
                let _ = if fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
                    fs::remove_dir_all(&p)
                } else {
                    fs::remove_file(&p)
                };
            }
        }
        attacker.resume();
        let mut cmd = spawnable_program(&env, &bin);
        cmd.arg("-r")
            .arg(&env.repo)
            .args(["restore", "-q"])
            .arg(&snapshot)
            .arg("--target")
            .arg(&target);
        if delete {
            cmd.arg("--delete");
        } else {
            cmd.args(["--overwrite", "always"]);
        }
        let out = cmd.output().unwrap();
        // Exit 1 (entries it could not restore because they were swapped) is expected;
        // a crash is not.
        let code = out.status.code();
        assert!(
            code == Some(0) || code == Some(1),
            "round {round}: cairn restore crashed\n{}",
            describe(&out)
        );
        failed_restores += usize::from(code == Some(1));
        let after = state(&outside);
        let gone: Vec<&String> = before.iter().filter(|l| !after.contains(l)).collect();
        let new: Vec<&String> = after.iter().filter(|l| !before.contains(l)).collect();
        assert!(
            after == before,
            "round {round} ({}): restore changed what is outside its target\nwas: {gone:#?}\nis: {new:#?}\n{}",
            if delete { "--delete" } else { "--overwrite always" },
            describe(&out)
        );
    }
    drop(attacker);
    // The race was on: some restores met a swapped directory.
    eprintln!("{rounds} restores raced, {failed_restores} reported entries they could not restore");
    assert!(
        rounds < 20 || failed_restores > 0,
        "no restore met a swapped directory: the attacker did not race"
    );
    // Nothing is left owned by nobody's doing outside: the target's parent holds only
    // what the test made.
    let mut names: Vec<String> = fs::read_dir(&env.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["config", "data", "home", "outside", "repo", "src", "target"],
        "entries beside the target"
    );
}

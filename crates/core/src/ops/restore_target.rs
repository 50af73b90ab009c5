//! The target of a restore as open directory handles, so that no path a restore writes
//! through can be redirected.
//!
//! Root often restores into trees that other users can write (`--target /home/u`), and
//! such a user can swap a directory restore has just made for a symlink to anywhere.
//! Every call here therefore works relative to a directory file descriptor opened without
//! following symlinks: a child is opened with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` (or `openat` with `O_NOFOLLOW | O_DIRECTORY` per component
//! where the kernel has no `openat2`), and entries are created, renamed and removed with
//! the `*at` calls on the parent's descriptor. A directory once opened stays the same
//! directory whatever is renamed around it, so the worst a racing user can do is make
//! restore write into the wrong place *inside* the target — never outside it.
//!
//! This module must never resolve a path string from the file system root once the
//! target itself is open; paths it keeps are for messages, or relative to the target
//! and resolved beneath it.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

/// An open directory of the target.
pub(crate) struct Dir {
    fd: OwnedFd,
    /// Where it is, for messages only: never used to reach the directory.
    pub path: PathBuf,
    /// Where it is relative to the target, to open it again beneath the target.
    pub rel: PathBuf,
    /// Whether this restore made it: then it was empty, and no other user could add to it
    /// since (it is created 0700 and owned by whoever restores).
    pub fresh: bool,
    pub dev: u64,
    pub ino: u64,
    pub uid: u32,
    gid: u32,
    setgid: bool,
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Flags for opening a directory to work in: read-only (to list it), never through a
/// symlink, not inherited by child processes.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// The process's effective user and group, asked once: they do not change during a
/// restore, and asking for each file was two of its seven system calls (`strace -c`).
pub(crate) fn effective_ids() -> (u32, u32) {
    static IDS: OnceLock<(u32, u32)> = OnceLock::new();
    *IDS.get_or_init(|| {
        (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        )
    })
}

impl Dir {
    /// Opens the target as the user named it (symlinks in that path are the user's
    /// choice and are followed), creating it and its parents if it does not exist.
    pub fn open_target(path: &Path) -> io::Result<Dir> {
        let open = || rustix::fs::open(path, dir_flags() & !OFlags::NOFOLLOW, Mode::empty());
        let fd = match open() {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => {
                std::fs::create_dir_all(path)?;
                open()?
            }
            Err(e) => return Err(e.into()),
        };
        Dir::from_fd(fd, path.to_path_buf(), PathBuf::new(), false)
    }

    fn from_fd(fd: OwnedFd, path: PathBuf, rel: PathBuf, fresh: bool) -> io::Result<Dir> {
        let st = rustix::fs::fstat(&fd)?;
        Ok(Dir {
            fd,
            path,
            rel,
            fresh,
            dev: st.st_dev,
            ino: st.st_ino,
            uid: st.st_uid,
            gid: st.st_gid,
            setgid: st.st_mode & libc::S_ISGID != 0,
        })
    }

    /// The owner and group a file created here gets, where that is certain: in a
    /// directory this restore made, whose mode no one else can change, the restoring
    /// user and, as the kernel does, the directory's group if it is setgid, else the
    /// user's. Lets a restore skip a `chown` that would change nothing.
    pub fn new_file_owner(&self) -> Option<(u32, u32)> {
        self.fresh.then(|| {
            let (uid, gid) = effective_ids();
            (uid, if self.setgid { self.gid } else { gid })
        })
    }

    /// The display path of entry `name` of this directory.
    pub fn join(&self, name: &OsStr) -> PathBuf {
        self.path.join(name)
    }

    /// Whether the directory has any entry besides `.` and `..`.
    pub fn has_entries(&self) -> io::Result<bool> {
        Ok(self.entries()?.next().transpose()?.is_some())
    }

    /// The entries of the directory (without `.` and `..`), read through a descriptor of
    /// its own so that this one's position is not shared.
    pub fn entries(&self) -> io::Result<impl Iterator<Item = io::Result<DirEntry>>> {
        let fd = rustix::fs::openat(&self.fd, c".", dir_flags(), Mode::empty())?;
        let dir = rustix::fs::Dir::new(fd)?;
        Ok(dir.filter_map(|e| match e {
            Ok(e) => {
                let name = e.file_name().to_bytes();
                if name == b"." || name == b".." {
                    None
                } else {
                    Some(Ok(DirEntry {
                        name: OsStr::from_bytes(name).to_os_string(),
                        kind: e.file_type(),
                    }))
                }
            }
            Err(e) => Some(Err(e.into())),
        }))
    }

    /// Creates directory `name` (0700: no one else can enter it before its own mode is
    /// applied at the end) or opens the directory already there, never through a
    /// symlink. Returns it and whether it was already there. Anything else at `name`
    /// is an `AlreadyExists` error (`ENOTDIR`/`ELOOP` from the open).
    pub fn make_dir(&self, name: &OsStr) -> io::Result<(Dir, bool)> {
        let created = match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)) {
            Ok(()) => true,
            Err(rustix::io::Errno::EXIST) => false,
            Err(e) => return Err(e.into()),
        };
        let mut dir = self.open_dir(name).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTDIR) | Some(libc::ELOOP) => io::Error::new(
                io::ErrorKind::AlreadyExists,
                "exists and is not a directory",
            ),
            _ => e,
        })?;
        // What was opened is fresh only if it is the one just made: a directory owned by
        // someone else was put in its place in between.
        dir.fresh = created && dir.uid == effective_ids().0;
        Ok((dir, !created))
    }

    /// Opens the existing directory `name` of this one, never through a symlink.
    pub fn open_dir(&self, name: &OsStr) -> io::Result<Dir> {
        let fd = open_beneath(&self.fd, Path::new(name), dir_flags(), Mode::empty())?;
        Dir::from_fd(fd, self.join(name), self.rel.join(name), false)
    }

    /// Opens directory `rel` (relative to this one) again, never leaving this one and
    /// never through a symlink.
    pub fn reopen_below(&self, rel: &Path) -> io::Result<OwnedFd> {
        if rel.as_os_str().is_empty() {
            return Ok(rustix::fs::openat(
                &self.fd,
                c".",
                dir_flags(),
                Mode::empty(),
            )?);
        }
        open_beneath(&self.fd, rel, dir_flags(), Mode::empty())
    }

    /// `lstat` of entry `name`; `None` if there is none.
    pub fn stat(&self, name: &OsStr) -> io::Result<Option<rustix::fs::Stat>> {
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Opens entry `name` with `flags` (plus `O_NOFOLLOW | O_CLOEXEC`), creating it with
    /// `mode` if `flags` say so.
    pub fn open_file(&self, name: &OsStr, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
        Ok(rustix::fs::openat(
            &self.fd,
            name,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )?)
    }

    /// An unnamed regular file in this directory (`O_TMPFILE`), or `None` where the file
    /// system cannot make one. It becomes visible only through [`Dir::link_file`], so a
    /// restore killed while writing it leaves nothing behind.
    pub fn unnamed_file(&self, flags: OFlags, mode: u32) -> io::Result<Option<OwnedFd>> {
        if TMPFILE.load(Ordering::Relaxed) == NO {
            return Ok(None);
        }
        match rustix::fs::openat(
            &self.fd,
            c".",
            flags | OFlags::TMPFILE | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        ) {
            Ok(fd) => Ok(Some(fd)),
            // No O_TMPFILE in this kernel or file system: named files from now on.
            Err(
                rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR | rustix::io::Errno::INVAL,
            ) => {
                TMPFILE.store(NO, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Gives the unnamed file `fd` the name `name` here; fails with `EEXIST` if the name
    /// is taken (a link never replaces anything).
    pub fn link_file(&self, fd: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
        // AT_EMPTY_PATH links the descriptor itself but needs CAP_DAC_READ_SEARCH (root
        // has it); through /proc any user may. The /proc path costs a path walk per file:
        // 4% of a root restore's CPU time on the Linux tree (`perf`, 78,611 files).
        if EMPTY_PATH_LINK.load(Ordering::Relaxed) != NO {
            match rustix::fs::linkat(fd, c"", &self.fd, name, AtFlags::EMPTY_PATH) {
                // Without the capability the kernel answers ENOENT.
                Err(rustix::io::Errno::NOENT | rustix::io::Errno::PERM) => {
                    EMPTY_PATH_LINK.store(NO, Ordering::Relaxed)
                }
                r => return Ok(r?),
            }
        }
        let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
        Ok(rustix::fs::linkat(
            rustix::fs::CWD,
            proc.as_str(),
            &self.fd,
            name,
            AtFlags::SYMLINK_FOLLOW,
        )?)
    }

    /// Makes a hard link `name` here to entry `from_name` of `from`, never following a
    /// symlink at either end.
    pub fn hard_link(&self, from: &impl AsFd, from_name: &OsStr, name: &OsStr) -> io::Result<()> {
        Ok(rustix::fs::linkat(
            from,
            from_name,
            &self.fd,
            name,
            AtFlags::empty(),
        )?)
    }

    /// Renames entry `from` to `to`, both in this directory.
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        Ok(rustix::fs::renameat(&self.fd, from, &self.fd, to)?)
    }

    /// Removes entry `name` if it is not a directory.
    pub fn remove_file(&self, name: &OsStr) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(&self.fd, name, AtFlags::empty())?)
    }

    /// Removes entry `name` and, if it is a directory, everything in it; a symlink is
    /// removed itself and never followed (each directory is opened with `O_NOFOLLOW`
    /// and emptied through its own descriptor).
    pub fn remove_all(&self, name: &OsStr) -> io::Result<()> {
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Err(rustix::io::Errno::ISDIR | rustix::io::Errno::PERM) => {}
            r => return Ok(r?),
        }
        let sub = match self.open_dir(name) {
            Ok(sub) => sub,
            // Replaced by a non-directory since: remove that.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => {
                return self.remove_file(name)
            }
            Err(e) => return Err(e),
        };
        for entry in sub.entries()? {
            let entry = entry?;
            if entry.kind == rustix::fs::FileType::Directory {
                sub.remove_all(&entry.name)?;
            } else {
                match sub.remove_file(&entry.name) {
                    Err(e) if e.raw_os_error() == Some(libc::EISDIR) => {
                        sub.remove_all(&entry.name)?
                    }
                    r => r?,
                }
            }
        }
        Ok(rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)?)
    }

    pub fn symlink(&self, target: &[u8], name: &OsStr) -> io::Result<()> {
        Ok(rustix::fs::symlinkat(
            OsStr::from_bytes(target),
            &self.fd,
            name,
        )?)
    }

    /// Makes a FIFO or device node `name` (mode 0600 until its metadata is applied).
    pub fn mknod(&self, name: &OsStr, kind: rustix::fs::FileType, rdev: u64) -> io::Result<()> {
        Ok(rustix::fs::mknodat(
            &self.fd,
            name,
            kind,
            Mode::from_raw_mode(0o600),
            rdev,
        )?)
    }

    pub fn read_link(&self, name: &OsStr) -> io::Result<Vec<u8>> {
        Ok(rustix::fs::readlinkat(&self.fd, name, Vec::new())?.into_bytes())
    }
}

/// One entry of a directory listing; `kind` is the type the listing gave (`Unknown`
/// on file systems that do not say).
pub(crate) struct DirEntry {
    pub name: OsString,
    pub kind: rustix::fs::FileType,
}

const UNKNOWN: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;

/// Whether the kernel has `openat2`, learned on first use.
static OPENAT2: AtomicU8 = AtomicU8::new(UNKNOWN);
/// Whether unnamed files (`O_TMPFILE`) work; `NO` once a file system refused one.
static TMPFILE: AtomicU8 = AtomicU8::new(UNKNOWN);
/// Whether `linkat(AT_EMPTY_PATH)` is allowed; `NO` once it was refused.
static EMPTY_PATH_LINK: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Opens `rel` (relative, with no `..`) below `dir`, refusing to pass through a symlink
/// or to leave `dir`: `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or, where
/// the kernel has none (before 5.6, or a seccomp filter that hides it), one
/// `O_DIRECTORY | O_NOFOLLOW` open per component.
pub(crate) fn open_beneath(
    dir: &OwnedFd,
    rel: &Path,
    flags: OFlags,
    mode: Mode,
) -> io::Result<OwnedFd> {
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if OPENAT2.load(Ordering::Relaxed) != NO {
        match rustix::fs::openat2(
            dir,
            rel,
            flags,
            mode,
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            // EPERM: a container's seccomp filter may refuse the call rather than
            // pretend it does not exist. Either way the fallback below is as safe.
            Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM)
                if OPENAT2.load(Ordering::Relaxed) == UNKNOWN =>
            {
                OPENAT2.store(NO, Ordering::Relaxed);
            }
            r => {
                OPENAT2.store(YES, Ordering::Relaxed);
                return Ok(r?);
            }
        }
    }
    let mut names = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(name) => names.push(name),
            Component::CurDir => {}
            // What RESOLVE_BENEATH refuses with EXDEV.
            _ => return Err(io::Error::from_raw_os_error(libc::EXDEV)),
        }
    }
    let Some((last, parents)) = names.split_last() else {
        return Ok(rustix::fs::openat(dir, c".", flags, mode)?);
    };
    let mut held: Option<OwnedFd> = None;
    for name in parents {
        let from = held.as_ref().unwrap_or(dir);
        held = Some(rustix::fs::openat(from, *name, dir_flags(), Mode::empty())?);
    }
    Ok(rustix::fs::openat(
        held.as_ref().unwrap_or(dir),
        *last,
        flags,
        mode,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlink_anywhere_in_a_path_below_the_target_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(outside.join("x")).unwrap();
        let target = Dir::open_target(&tmp.path().join("t")).unwrap();
        let (a, existed) = target.make_dir(OsStr::new("a")).unwrap();
        assert!(!existed && a.fresh);
        std::os::unix::fs::symlink(&outside, tmp.path().join("t/a/link")).unwrap();
        for rel in ["a/link", "a/link/x", "../outside", "a/../../outside"] {
            assert!(
                target.reopen_below(Path::new(rel)).is_err(),
                "{rel} opened through a symlink or above the target"
            );
        }
        assert!(a.open_dir(OsStr::new("link")).is_err());
        let e = a.make_dir(OsStr::new("link")).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        assert!(target.reopen_below(Path::new("a")).is_ok());
    }

    #[test]
    fn the_fallback_walk_refuses_symlinks_and_dot_dot_as_openat2_does() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("t/a/b")).unwrap();
        std::os::unix::fs::symlink("b", tmp.path().join("t/a/l")).unwrap();
        let target = Dir::open_target(&tmp.path().join("t")).unwrap();
        let walk = |rel: &str| {
            // The fallback alone, as on a kernel without openat2.
            let saved = OPENAT2.swap(NO, Ordering::Relaxed);
            let r = open_beneath(&target.fd, Path::new(rel), dir_flags(), Mode::empty());
            OPENAT2.store(saved, Ordering::Relaxed);
            r
        };
        assert!(walk("a/b").is_ok());
        assert!(walk("a/l").is_err());
        assert!(walk("a/l/x").is_err());
        assert!(walk("a/../..").is_err());
    }

    #[test]
    fn remove_all_removes_a_symlink_and_not_what_it_points_to() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        std::fs::create_dir_all(tmp.path().join("t/d/e")).unwrap();
        std::fs::write(tmp.path().join("t/d/e/f"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, tmp.path().join("t/d/link")).unwrap();
        std::os::unix::fs::symlink(&outside, tmp.path().join("t/top")).unwrap();
        let target = Dir::open_target(&tmp.path().join("t")).unwrap();
        target.remove_all(OsStr::new("d")).unwrap();
        target.remove_all(OsStr::new("top")).unwrap();
        assert!(!target.has_entries().unwrap());
        assert!(outside.join("keep").exists());
    }
}

//! Reading file metadata from the local filesystem into tree nodes, and applying it back
//! on restore. Linux/Unix only: modes, owners, nanosecond times, xattrs, device numbers.

use std::collections::HashMap;
use std::fs::Metadata;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::tree::{Node, NodeKind, Time, Xattr};

/// Caches uid → user name and gid → group name lookups for one walk.
#[derive(Default)]
pub struct NameCache {
    users: HashMap<u32, Option<String>>,
    groups: HashMap<u32, Option<String>>,
}

impl NameCache {
    pub fn user(&mut self, uid: u32) -> Option<&str> {
        self.users
            .entry(uid)
            .or_insert_with(|| {
                nix::unistd::User::from_uid(uid.into())
                    .ok()
                    .flatten()
                    .map(|u| u.name)
            })
            .as_deref()
    }

    pub fn group(&mut self, gid: u32) -> Option<&str> {
        self.groups
            .entry(gid)
            .or_insert_with(|| {
                nix::unistd::Group::from_gid(gid.into())
                    .ok()
                    .flatten()
                    .map(|g| g.name)
            })
            .as_deref()
    }
}

/// A node for `md` with an empty xattr list; the caller adds xattrs and the kind.
pub fn node_from_metadata(
    name: Vec<u8>,
    md: &Metadata,
    kind: NodeKind,
    names: &mut NameCache,
) -> Node {
    Node {
        name,
        kind,
        mode: md.mode() & 0o7777,
        uid: md.uid(),
        gid: md.gid(),
        user: names.user(md.uid()).map(str::to_owned),
        group: names.group(md.gid()).map(str::to_owned),
        mtime: mtime(md),
        ctime: ctime(md),
        inode: md.ino(),
        device: md.dev(),
        links: md.nlink(),
        xattrs: Vec::new(),
    }
}

/// Whether `node` holds what [`node_from_metadata`] makes of `md`, its name, kind and
/// xattrs aside: then backup keeps the parent snapshot's node instead of building an
/// equal one (an unchanged backup builds no node at all).
pub fn same_metadata(node: &Node, md: &Metadata, names: &mut NameCache) -> bool {
    // Every field named, so that a field added to `Node` cannot be forgotten here.
    let Node {
        name: _,
        kind: _,
        xattrs: _,
        mode,
        uid,
        gid,
        user,
        group,
        mtime: m,
        ctime: c,
        inode,
        device,
        links,
    } = node;
    *mode == md.mode() & 0o7777
        && *uid == md.uid()
        && *gid == md.gid()
        && *m == mtime(md)
        && *c == ctime(md)
        && *inode == md.ino()
        && *device == md.dev()
        && *links == md.nlink()
        && user.as_deref() == names.user(md.uid())
        && group.as_deref() == names.group(md.gid())
}

/// The kind of an entry that is neither a file, a directory nor a symlink.
pub fn special_kind(md: &Metadata) -> NodeKind {
    use std::os::unix::fs::FileTypeExt;
    let ft = md.file_type();
    if ft.is_fifo() {
        NodeKind::Fifo
    } else if ft.is_socket() {
        NodeKind::Socket
    } else if ft.is_char_device() {
        NodeKind::CharDevice { rdev: md.rdev() }
    } else {
        NodeKind::BlockDevice { rdev: md.rdev() }
    }
}

pub fn mtime(md: &Metadata) -> Time {
    Time {
        sec: md.mtime(),
        nsec: md.mtime_nsec().clamp(0, 999_999_999) as u32,
    }
}

pub fn ctime(md: &Metadata) -> Time {
    Time {
        sec: md.ctime(),
        nsec: md.ctime_nsec().clamp(0, 999_999_999) as u32,
    }
}

/// Extended attributes of `path` itself (symlinks are not followed). A filesystem without
/// xattr support has none.
pub fn read_xattrs(path: &Path) -> io::Result<Vec<Xattr>> {
    use std::os::unix::ffi::OsStrExt;
    let names = match xattr::list(path) {
        Ok(names) => names,
        Err(e) if is_unsupported(&e) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for name in names {
        match xattr::get(path, &name) {
            Ok(Some(value)) => out.push(Xattr {
                name: name.as_bytes().to_vec(),
                value,
            }),
            // Removed between list and get.
            Ok(None) => {}
            Err(e) if is_unsupported(&e) => {}
            Err(e) => return Err(e),
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn is_unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTSUP) | Some(libc::ENODATA))
}

/// How [`apply_to_fd`] and [`apply_beneath`] set an entry's metadata.
#[derive(Debug, Clone, Copy)]
pub struct ApplyOptions {
    /// Set owner and group (needs root).
    pub owners: bool,
    /// The mode to set; `None` when the entry was created with it already.
    pub mode: Option<u32>,
    /// The owner and group the entry has now, where known for certain: the `chown` is
    /// skipped when they are already the node's (it would still dirty the inode).
    pub owner: Option<(u32, u32)>,
    /// Leaves out file capabilities (`security.capability`), which grant privileges as
    /// setuid bits do (`restore --no-setuid`).
    pub no_capabilities: bool,
    /// For [`apply_beneath`]: the entry must still be this inode (device, number), the
    /// one the caller looked at; another put in its place is refused.
    pub inode: Option<(u64, u64)>,
}

/// The extended attribute that holds a file's capabilities.
pub const CAPABILITY_XATTR: &[u8] = b"security.capability";

impl ApplyOptions {
    /// Whether `node`'s owner and group must be set.
    fn chown(&self, node: &Node) -> bool {
        self.owners && self.owner != Some((node.uid, node.gid))
    }
}

/// Applies owner (when `owners`), xattrs, mode and times of `node` to the open file or
/// directory `fd`, in the order that keeps each step from undoing another: chown clears
/// setuid bits, so mode comes after it, and times come last (restore relies on a file's
/// mtime being set only once it is complete). No path is looked up, so nothing can
/// redirect these calls. Returns the first failure after trying every step.
pub fn apply_to_fd(fd: BorrowedFd<'_>, node: &Node, opts: ApplyOptions) -> io::Result<()> {
    use rustix::fs::{Gid, Uid, XattrFlags};
    apply_steps(
        node,
        opts.chown(node),
        opts.no_capabilities,
        || {
            let (uid, gid) = (Uid::from_raw(node.uid), Gid::from_raw(node.gid));
            Ok(rustix::fs::fchown(fd, Some(uid), Some(gid))?)
        },
        |x| {
            Ok(rustix::fs::fsetxattr(
                fd,
                x.name.as_slice(),
                &x.value,
                XattrFlags::empty(),
            )?)
        },
        || match opts.mode {
            Some(mode) => Ok(rustix::fs::fchmod(
                fd,
                rustix::fs::Mode::from_raw_mode(mode),
            )?),
            None => Ok(()),
        },
        || Ok(rustix::fs::futimens(fd, &timestamps(node))?),
    )
}

/// As [`apply_to_fd`], for entry `name` of directory `dir` that cannot be opened for
/// writing: a symlink, FIFO or device node (opening a device may have effects of its
/// own). The entry is opened with `O_PATH | O_NOFOLLOW` and must still be of `node`'s
/// kind, so that one another user put in its place (a hard link to a file of someone
/// else's) is refused; owner and mode are then set through that descriptor, times with
/// `utimensat(dir, name, AT_SYMLINK_NOFOLLOW)`. A symlink has no mode of its own.
pub fn apply_beneath(
    dir: BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    node: &Node,
    opts: ApplyOptions,
) -> io::Result<()> {
    use rustix::fs::{AtFlags, FileType, Gid, OFlags, Uid, XattrFlags};
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&fd)?;
    if opts
        .inode
        .is_some_and(|inode| inode != (st.st_dev, st.st_ino))
    {
        return Err(io::Error::other(
            "was replaced during the restore; its metadata was not applied",
        ));
    }
    let kind = FileType::from_raw_mode(st.st_mode);
    let expected = match node.kind {
        NodeKind::Symlink { .. } => FileType::Symlink,
        NodeKind::Fifo => FileType::Fifo,
        NodeKind::CharDevice { .. } => FileType::CharacterDevice,
        NodeKind::BlockDevice { .. } => FileType::BlockDevice,
        NodeKind::Socket => FileType::Socket,
        NodeKind::File { .. } => FileType::RegularFile,
        NodeKind::Dir { .. } => FileType::Directory,
    };
    if kind != expected {
        return Err(io::Error::other(
            "was replaced by another kind of entry during the restore; its metadata was not applied",
        ));
    }
    let is_link = kind == FileType::Symlink;
    // The descriptor through /proc: it names the opened inode itself (for a symlink, the
    // link, not what it points to), for the calls that take no O_PATH descriptor.
    let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    apply_steps(
        node,
        opts.chown(node),
        opts.no_capabilities,
        || {
            let (uid, gid) = (Uid::from_raw(node.uid), Gid::from_raw(node.gid));
            Ok(rustix::fs::chownat(
                &fd,
                c"",
                Some(uid),
                Some(gid),
                AtFlags::EMPTY_PATH,
            )?)
        },
        |x| match rustix::fs::setxattr(
            proc.as_str(),
            x.name.as_slice(),
            &x.value,
            XattrFlags::empty(),
        ) {
            // Linux allows no user.* attributes on symlinks.
            Err(rustix::io::Errno::PERM) if is_link => Ok(()),
            r => Ok(r?),
        },
        || match opts.mode {
            Some(mode) if !is_link => Ok(rustix::fs::chmodat(
                rustix::fs::CWD,
                proc.as_str(),
                rustix::fs::Mode::from_raw_mode(mode),
                AtFlags::empty(),
            )?),
            _ => Ok(()),
        },
        || {
            Ok(rustix::fs::utimensat(
                dir,
                name,
                &timestamps(node),
                AtFlags::SYMLINK_NOFOLLOW,
            )?)
        },
    )
}

fn timestamps(node: &Node) -> rustix::fs::Timestamps {
    let t = rustix::fs::Timespec {
        tv_sec: node.mtime.sec,
        tv_nsec: node.mtime.nsec.into(),
    };
    rustix::fs::Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// The steps of [`apply`] in their order, each tried even when an earlier one failed.
fn apply_steps(
    node: &Node,
    owners: bool,
    no_capabilities: bool,
    chown: impl FnOnce() -> io::Result<()>,
    mut set_xattr: impl FnMut(&Xattr) -> io::Result<()>,
    chmod: impl FnOnce() -> io::Result<()>,
    times: impl FnOnce() -> io::Result<()>,
) -> io::Result<()> {
    let mut first_err: Option<io::Error> = None;
    let mut note = |r: io::Result<()>| {
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    };
    if owners {
        note(chown());
    }
    for x in &node.xattrs {
        if no_capabilities && x.name == CAPABILITY_XATTR {
            continue;
        }
        note(set_xattr(x));
    }
    note(chmod());
    note(times());
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_has_the_metadata_it_was_made_from_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let md = std::fs::symlink_metadata(&path).unwrap();
        let mut names = NameCache::default();
        let node = node_from_metadata(b"f".to_vec(), &md, NodeKind::Fifo, &mut names);
        assert!(same_metadata(&node, &md, &mut names));

        let changes: [fn(&mut Node); 10] = [
            |n| n.mode ^= 0o100,
            |n| n.uid += 1,
            |n| n.gid += 1,
            |n| n.user = Some("someone-else".into()),
            |n| n.group = Some("others-else".into()),
            |n| n.mtime.nsec ^= 1,
            |n| n.ctime.sec -= 1,
            |n| n.inode += 1,
            |n| n.device += 1,
            |n| n.links += 1,
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut other = node.clone();
            change(&mut other);
            assert!(!same_metadata(&other, &md, &mut names), "change {i}");
        }
    }
}

//! `mount`: the repository as a read-only FUSE filesystem. This is a front end like the
//! CLI's commands, so it lives here and core stays free of FUSE: core gives snapshots,
//! trees and verified blobs, and this module turns them into inodes.
//!
//! Layout: `snapshots/<time>/`, `ids/<short id>/`, `hosts/<host>/<time>/`,
//! `tags/<tag>/<time>/` and a `latest` symlink. The layout follows the repository: when
//! one of its directories is read, the snapshots are listed again (at most once a
//! second), so snapshots made or forgotten while mounted appear and go; a name keeps its
//! inode across listings. Directories of snapshots are read when first looked at; a
//! read fetches only the chunks covering the asked range (found by binary search over
//! the file's chunk offsets), through a small LRU of decrypted chunks.
//! Any error from the repository becomes EIO: a reader gets an error, never wrong bytes.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use cairn_core::id::{BlobId, SnapshotId};
use cairn_core::snapshot::{Snapshot, SnapshotFilter};
use cairn_core::tree::{ContentIndex, Node, NodeKind, Time, Tree};
use cairn_core::Repository;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, Generation, INodeNo, LockOwner, MountOption,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyXattr, Request,
};

use crate::args::{GlobalArgs, MountArgs};

/// Snapshots never change, so the kernel may keep what it learnt for a long time.
const TTL: Duration = Duration::from_secs(60);

/// The layout changes as snapshots are made and forgotten: the kernel asks again after
/// this long, and the snapshots are listed again at most this often.
const LAYOUT_TTL: Duration = Duration::from_secs(1);

/// The LRU of decrypted chunks holds at most this many bytes (and so, with chunks of a
/// few MiB at most, a handful of them): enough for sequential reads and for several
/// readers at once, small enough not to matter next to the page cache.
const CHUNK_CACHE_BYTES: usize = 32 << 20;

/// Trees kept decoded: a few directories being listed at once.
const TREE_CACHE_ENTRIES: usize = 16;

pub fn run(g: &GlobalArgs, a: MountArgs) -> Result<u8> {
    check_mountpoint(&a.mountpoint)?;
    let filter = crate::commands::snapshot_filter(&a.filter)?;
    let repo = crate::context::open(g)?;
    let list = cairn_core::ops::select::snapshots(&repo, &filter)?;
    for (id, e) in &list.damaged {
        eprintln!("warning: snapshot {} is left out: {e}", id.short());
    }
    let fs = SnapshotFs::new(repo, filter, list.snapshots);
    crate::signals::install();
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::FSName("cairn".into()),
        MountOption::Subtype("cairn".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    // Two workers, so that a listing is not stuck behind a slow read.
    config.n_threads = Some(2);
    let session = fuser::spawn_mount(fs, &a.mountpoint, &config).with_context(|| {
        format!(
            "Cannot mount on {} (FUSE needs /dev/fuse and the right to mount: root, or \
             fusermount3 from the fuse3 package)",
            a.mountpoint.display()
        )
    })?;
    eprintln!(
        "Mounted at {}; unmount with Ctrl-C or `fusermount3 -u {}`",
        a.mountpoint.display(),
        a.mountpoint.display()
    );
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if crate::signals::interrupted() {
            if let Err(e) = session.umount_and_join() {
                // Busy (a shell sits in it, a file is open): detach it now, as `umount -l`
                // does, rather than leave a dead mount behind when this process exits.
                detach(&a.mountpoint)
                    .map_err(|_| e)
                    .with_context(|| format!("Cannot unmount {}", a.mountpoint.display()))?;
                eprintln!(
                    "warning: {} was busy and has been detached; files still open there \
                     now fail to read",
                    a.mountpoint.display()
                );
            }
            return Ok(crate::EXIT_INTERRUPTED);
        }
        if session.guard.is_finished() {
            // Unmounted from outside (`umount`, `fusermount3 -u`): the session ended.
            session
                .join()
                .context("The FUSE session ended with an error")?;
            return Ok(0);
        }
    }
}

/// Lazily unmounts `path` (MNT_DETACH).
fn detach(path: &Path) -> std::io::Result<()> {
    let path = std::ffi::CString::new(path.canonicalize()?.as_os_str().as_bytes())?;
    // SAFETY: a valid C string; umount2 reads it and touches no other memory.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A mountpoint must be an empty directory that is not already a mount point.
fn check_mountpoint(path: &Path) -> Result<()> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "Mountpoint {} does not exist; create an empty directory first",
            path.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("Cannot use {}", path.display())),
    };
    if !meta.is_dir() {
        bail!("Mountpoint {} is not a directory", path.display());
    }
    let parent = path.join("..");
    if let Ok(up) = std::fs::metadata(&parent) {
        if up.dev() != meta.dev() || up.ino() == meta.ino() {
            bail!(
                "{} is already a mount point; unmount it first or choose another directory",
                path.display()
            );
        }
    }
    let mut entries =
        std::fs::read_dir(path).with_context(|| format!("Cannot list {}", path.display()))?;
    if entries.next().is_some() {
        bail!(
            "Mountpoint {} is not empty; mount on an empty directory",
            path.display()
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Inodes
// ---------------------------------------------------------------------------------------

const ROOT: u64 = 1;

enum Kind {
    /// A directory of the layout (`snapshots`, `hosts/h`, ...), children fixed at mount.
    Layout { children: Vec<(Vec<u8>, u64)> },
    /// The `latest` link.
    Latest { target: Vec<u8> },
    /// A snapshot's root tree.
    SnapshotRoot { snap: usize },
    /// An entry of a snapshot's tree.
    Entry { snap: usize, node: Arc<Node> },
}

struct Inode {
    parent: u64,
    kind: Kind,
}

struct Inodes {
    /// Index `ino - 1`.
    table: Vec<Inode>,
    /// (parent, name) → inode, for entries of snapshot trees made on first sight.
    by_name: HashMap<(u64, Vec<u8>), u64>,
    /// (snapshot, device, inode) → inode for files with several links, so hard links
    /// share one inode here too.
    hardlinks: HashMap<(usize, u64, u64), u64>,
    /// Chunk start offsets of files that have been read, and the file size at the end.
    offsets: HashMap<u64, Arc<ContentIndex>>,
}

impl Inodes {
    fn add(&mut self, parent: u64, kind: Kind) -> u64 {
        self.table.push(Inode { parent, kind });
        self.table.len() as u64
    }

    fn get(&self, ino: u64) -> Option<&Inode> {
        self.table.get(usize::try_from(ino).ok()?.checked_sub(1)?)
    }
}

/// The mounted filesystem.
struct SnapshotFs {
    /// Written only to read the index files again when new snapshots appear.
    repo: RwLock<Repository>,
    filter: SnapshotFilter,
    /// Every snapshot seen since mounting, in the order first seen: inodes name their
    /// snapshot by its place here, so the list only grows.
    snapshots: RwLock<Vec<(SnapshotId, Snapshot)>>,
    listing: Mutex<Listing>,
    inodes: Mutex<Inodes>,
    chunks: Mutex<ChunkCache>,
    /// Recently read trees: the kernel lists a large directory in many `readdir` calls,
    /// each of which would otherwise read and decrypt its tree again. Most recent last.
    trees: Mutex<Vec<(BlobId, Arc<Tree>)>>,
    uid: u32,
    gid: u32,
    /// Time of the layout directories, in seconds: the newest snapshot's.
    layout_time: AtomicI64,
}

/// The last listing of the repository's snapshots.
struct Listing {
    at: Instant,
    /// The snapshots shown (places in `SnapshotFs::snapshots`), oldest first.
    shown: Vec<usize>,
    /// Snapshots the filter leaves out, or that could not be read: not read again.
    skipped: HashSet<SnapshotId>,
}

impl SnapshotFs {
    fn new(
        repo: Repository,
        filter: SnapshotFilter,
        snapshots: Vec<(SnapshotId, Snapshot)>,
    ) -> Self {
        let mut inodes = Inodes {
            table: Vec::new(),
            by_name: HashMap::new(),
            hardlinks: HashMap::new(),
            offsets: HashMap::new(),
        };
        inodes.add(ROOT, Kind::Layout { children: vec![] });
        let shown = (0..snapshots.len()).collect();
        let fs = SnapshotFs {
            repo: RwLock::new(repo),
            filter,
            snapshots: RwLock::new(snapshots),
            listing: Mutex::new(Listing {
                at: Instant::now(),
                shown,
                skipped: HashSet::new(),
            }),
            inodes: Mutex::new(inodes),
            chunks: Mutex::new(ChunkCache::default()),
            trees: Mutex::new(Vec::new()),
            uid: nix_uid(),
            gid: nix_gid(),
            layout_time: AtomicI64::new(0),
        };
        let shown = fs.lock_listing().shown.clone();
        fs.build_layout(&shown);
        fs
    }

    fn repo(&self) -> RwLockReadGuard<'_, Repository> {
        self.repo.read().unwrap_or_else(|p| p.into_inner())
    }

    fn snapshots(&self) -> RwLockReadGuard<'_, Vec<(SnapshotId, Snapshot)>> {
        self.snapshots.read().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_listing(&self) -> MutexGuard<'_, Listing> {
        self.listing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists the snapshots again if the last listing is older than `LAYOUT_TTL`, and
    /// rebuilds the layout if they changed. A listing that fails keeps the last one.
    fn refresh(&self) {
        let mut listing = self.lock_listing();
        if listing.at.elapsed() < LAYOUT_TTL {
            return;
        }
        listing.at = Instant::now();
        let Ok(ids) = self.repo().snapshot_ids() else {
            return;
        };
        let mut known: HashMap<SnapshotId, usize> = (self.snapshots().iter().enumerate())
            .map(|(i, (id, _))| (*id, i))
            .collect();
        let mut new = Vec::new();
        for id in &ids {
            if known.contains_key(id) || listing.skipped.contains(id) {
                continue;
            }
            match self.repo().load_snapshot(id) {
                Ok(s) if self.filter.matches(&s) => new.push((*id, s)),
                _ => {
                    listing.skipped.insert(*id);
                }
            }
        }
        if !new.is_empty() {
            // Their trees are in index files written since the index was read.
            let loaded = self
                .repo
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .load_index();
            if let Err(e) = loaded {
                self.eio(&e);
            }
            let mut all = self.snapshots.write().unwrap_or_else(|p| p.into_inner());
            for (id, s) in new {
                known.insert(id, all.len());
                all.push((id, s));
            }
        }
        let mut shown: Vec<usize> = ids.iter().filter_map(|id| known.get(id).copied()).collect();
        {
            let all = self.snapshots();
            shown.sort_by_key(|&i| (all[i].1.time, all[i].0));
        }
        if shown != listing.shown {
            listing.shown = shown;
            self.build_layout(&listing.shown);
        }
    }

    /// Makes the layout directories show snapshots `shown` (oldest first), keeping the
    /// inode of every name that stays.
    fn build_layout(&self, shown: &[usize]) {
        let snaps: Vec<(SnapshotId, Snapshot)> = {
            let all = self.snapshots();
            shown.iter().map(|&i| all[i].clone()).collect()
        };
        let names = snapshot_names(&snaps);
        let mut guard = self.inodes();
        let inodes = &mut *guard;
        let fill = |inodes: &mut Inodes, dir: u64, list: Vec<(Vec<u8>, usize)>| {
            let children = list
                .into_iter()
                .map(|(name, snap)| {
                    let ino = snapshot_root(inodes, dir, &name, snap);
                    (name, ino)
                })
                .collect();
            inodes.table[dir as usize - 1].kind = Kind::Layout { children };
        };
        let by_time = layout_dir(inodes, ROOT, b"snapshots");
        let all = names
            .iter()
            .zip(shown)
            .map(|(n, &i)| (n.clone().into_bytes(), i))
            .collect();
        fill(inodes, by_time, all);
        let ids = layout_dir(inodes, ROOT, b"ids");
        let list = snaps
            .iter()
            .zip(shown)
            .map(|((id, _), &i)| (id.short().into_bytes(), i))
            .collect();
        fill(inodes, ids, list);
        let groups = |name: &[u8], key: &dyn Fn(&Snapshot) -> Vec<String>, inodes: &mut Inodes| {
            let mut map: std::collections::BTreeMap<String, Vec<(Vec<u8>, usize)>> =
                Default::default();
            for (k, ((_, s), &i)) in snaps.iter().zip(shown).enumerate() {
                for key in key(s) {
                    map.entry(safe_name(&key))
                        .or_default()
                        .push((names[k].clone().into_bytes(), i));
                }
            }
            let top = layout_dir(inodes, ROOT, name);
            let children = map
                .into_iter()
                .map(|(k, list)| {
                    let dir = layout_dir(inodes, top, k.as_bytes());
                    fill(inodes, dir, list);
                    (k.into_bytes(), dir)
                })
                .collect();
            inodes.table[top as usize - 1].kind = Kind::Layout { children };
            top
        };
        let hosts = groups(b"hosts", &|s| vec![s.host.clone()], inodes);
        let tags = groups(b"tags", &|s| s.tags.clone(), inodes);
        let mut children = vec![
            (b"hosts".to_vec(), hosts),
            (b"ids".to_vec(), ids),
            (b"snapshots".to_vec(), by_time),
            (b"tags".to_vec(), tags),
        ];
        if let Some(last) = names.last() {
            let target = format!("snapshots/{last}").into_bytes();
            let key = (ROOT, b"latest".to_vec());
            let ino = match inodes.by_name.get(&key) {
                Some(&ino) => {
                    inodes.table[ino as usize - 1].kind = Kind::Latest { target };
                    ino
                }
                None => {
                    let ino = inodes.add(ROOT, Kind::Latest { target });
                    inodes.by_name.insert(key, ino);
                    ino
                }
            };
            children.push((b"latest".to_vec(), ino));
        }
        children.sort();
        inodes.table[0].kind = Kind::Layout { children };
        let newest = snaps.last().map_or(0, |(_, s)| s.time.as_second().max(0));
        self.layout_time.store(newest, Ordering::Relaxed);
    }

    /// Whether `ino` is a directory of the layout (its listing follows the repository).
    fn is_layout(&self, ino: u64) -> bool {
        matches!(
            self.inodes().get(ino).map(|i| &i.kind),
            Some(Kind::Layout { .. } | Kind::Latest { .. })
        )
    }

    /// How long the kernel may keep what it learnt of `ino`.
    fn ttl(&self, ino: u64) -> Duration {
        if self.is_layout(ino) {
            LAYOUT_TTL
        } else {
            TTL
        }
    }

    fn inodes(&self) -> MutexGuard<'_, Inodes> {
        // A panic in another request must not take the whole mount down with it.
        self.inodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn attr(&self, ino: u64, inode: &Inode) -> FileAttr {
        let layout_time = UNIX_EPOCH
            + Duration::from_secs(self.layout_time.load(Ordering::Relaxed).max(0) as u64);
        let mut attr = FileAttr {
            ino: INodeNo(ino),
            size: 0,
            blocks: 0,
            atime: layout_time,
            mtime: layout_time,
            ctime: layout_time,
            crtime: layout_time,
            kind: FileType::Directory,
            perm: 0o555,
            nlink: 2,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        };
        match &inode.kind {
            Kind::Layout { .. } => {}
            Kind::Latest { target } => {
                attr.kind = FileType::Symlink;
                attr.perm = 0o777;
                attr.nlink = 1;
                attr.size = target.len() as u64;
            }
            Kind::SnapshotRoot { snap } => {
                let t = system_time(Time {
                    sec: self.snapshots()[*snap].1.time.as_second(),
                    nsec: 0,
                });
                (attr.atime, attr.mtime, attr.ctime, attr.crtime) = (t, t, t, t);
            }
            Kind::Entry { node, .. } => {
                let (kind, size, rdev) = match &node.kind {
                    NodeKind::File { size, .. } => (FileType::RegularFile, *size, 0),
                    NodeKind::Dir { .. } => (FileType::Directory, 0, 0),
                    NodeKind::Symlink { target } => (FileType::Symlink, target.len() as u64, 0),
                    NodeKind::Fifo => (FileType::NamedPipe, 0, 0),
                    NodeKind::Socket => (FileType::Socket, 0, 0),
                    NodeKind::CharDevice { rdev } => (FileType::CharDevice, 0, *rdev),
                    NodeKind::BlockDevice { rdev } => (FileType::BlockDevice, 0, *rdev),
                };
                attr.kind = kind;
                attr.size = size;
                attr.blocks = size.div_ceil(512);
                attr.perm = (node.mode & 0o7777) as u16;
                attr.nlink = u32::try_from(node.links.max(1)).unwrap_or(u32::MAX);
                attr.uid = node.uid;
                attr.gid = node.gid;
                attr.rdev = rdev as u32;
                attr.mtime = system_time(node.mtime);
                attr.atime = attr.mtime;
                attr.ctime = system_time(node.ctime);
                attr.crtime = attr.mtime;
            }
        }
        attr
    }

    /// The tree a directory inode shows, if it is a snapshot directory.
    fn tree_of(&self, inode: &Inode) -> Option<(usize, BlobId)> {
        match &inode.kind {
            Kind::SnapshotRoot { snap } => Some((*snap, self.snapshots()[*snap].1.tree)),
            Kind::Entry { snap, node } => match &node.kind {
                NodeKind::Dir { subtree } => Some((*snap, *subtree)),
                _ => None,
            },
            _ => None,
        }
    }

    /// The children of directory `ino` as (name, inode, attributes), making inodes for
    /// tree entries on first sight.
    fn children(&self, ino: u64) -> Result<Vec<(Vec<u8>, u64, FileAttr)>, Errno> {
        if self.is_layout(ino) {
            self.refresh();
        }
        let tree = {
            let inodes = self.inodes();
            let inode = inodes.get(ino).ok_or(Errno::ENOENT)?;
            if let Kind::Layout { children } = &inode.kind {
                return Ok(children
                    .iter()
                    .filter_map(|(name, child)| {
                        let c = inodes.get(*child)?;
                        Some((name.clone(), *child, self.attr(*child, c)))
                    })
                    .collect());
            }
            self.tree_of(inode).ok_or(Errno::ENOTDIR)?
        };
        let (snap, tree_id) = tree;
        // Read without holding the lock: it may take a network round trip.
        let tree = self.tree(&tree_id)?;
        let mut inodes = self.inodes();
        Ok(tree
            .nodes
            .iter()
            .cloned()
            .map(|node| {
                let child = entry_inode(&mut inodes, ino, snap, node.clone());
                let attr = inodes
                    .get(child)
                    .map(|c| self.attr(child, c))
                    .unwrap_or_else(|| self.attr(ino, &inodes.table[0]));
                (node.name, child, attr)
            })
            .collect())
    }

    fn tree(&self, id: &BlobId) -> Result<Arc<Tree>, Errno> {
        let lock = || self.trees.lock().unwrap_or_else(|p| p.into_inner());
        {
            let mut trees = lock();
            if let Some(i) = trees.iter().position(|(k, _)| k == id) {
                let hit = trees.remove(i);
                let tree = Arc::clone(&hit.1);
                trees.push(hit);
                return Ok(tree);
            }
        }
        let tree = Arc::new(self.repo().read_tree(id).map_err(|e| self.eio(&e))?);
        let mut trees = lock();
        trees.push((*id, Arc::clone(&tree)));
        if trees.len() > TREE_CACHE_ENTRIES {
            trees.remove(0);
        }
        Ok(tree)
    }

    fn lookup_child(&self, parent: u64, name: &[u8]) -> Result<FileAttr, Errno> {
        // A layout directory's names come and go: look in its current listing.
        if !self.is_layout(parent) {
            let inodes = self.inodes();
            if let Some(&ino) = inodes.by_name.get(&(parent, name.to_vec())) {
                if let Some(inode) = inodes.get(ino) {
                    return Ok(self.attr(ino, inode));
                }
            }
        }
        self.children(parent)?
            .into_iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, attr)| attr)
            .ok_or(Errno::ENOENT)
    }

    /// Reads `size` bytes at `offset` of file `ino`, fetching only the chunks that
    /// cover them.
    fn read_range(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let (node, index) = {
            let mut inodes = self.inodes();
            let node = match inodes.get(ino).map(|i| &i.kind) {
                Some(Kind::Entry { node, .. }) => Arc::clone(node),
                Some(_) => return Err(Errno::EISDIR),
                None => return Err(Errno::ENOENT),
            };
            let NodeKind::File { content, .. } = &node.kind else {
                return Err(Errno::EINVAL);
            };
            let index = Arc::clone(
                inodes
                    .offsets
                    .entry(ino)
                    .or_insert_with(|| Arc::new(ContentIndex::new(content))),
            );
            (node, index)
        };
        let NodeKind::File { content, .. } = &node.kind else {
            return Err(Errno::EINVAL);
        };
        // The offset arithmetic is `ContentIndex::pieces`, which the fuzz target
        // `file_pieces` exercises.
        let pieces = index.pieces(content, offset, u64::from(size));
        let mut out = Vec::with_capacity(pieces.iter().map(|p| p.blob_range.len()).sum());
        for piece in pieces {
            let part = &content[piece.part];
            let blob = self.chunk(&part.blob)?;
            let bytes = blob.get(piece.blob_range).ok_or_else(|| {
                eprintln!(
                    "error: {}: content reference outside blob {}",
                    crate::output::name(&node.name),
                    part.blob
                );
                Errno::EIO
            })?;
            out.extend_from_slice(bytes);
        }
        Ok(out)
    }

    fn chunk(&self, id: &BlobId) -> Result<Arc<Vec<u8>>, Errno> {
        if let Some(hit) = self.lock_chunks().get(id) {
            return Ok(hit);
        }
        let blob = Arc::new(self.repo().read_blob(id).map_err(|e| self.eio(&e))?);
        self.lock_chunks().put(*id, Arc::clone(&blob));
        Ok(blob)
    }

    fn lock_chunks(&self) -> MutexGuard<'_, ChunkCache> {
        self.chunks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reports a repository error on stderr (the reader sees only EIO) and returns EIO.
    fn eio(&self, e: &cairn_core::Error) -> Errno {
        eprintln!(
            "error: {}",
            crate::output::message(&cairn_core::error::chain(e))
        );
        Errno::EIO
    }

    fn xattrs(&self, ino: u64) -> Result<Vec<cairn_core::tree::Xattr>, Errno> {
        let inodes = self.inodes();
        match &inodes.get(ino).ok_or(Errno::ENOENT)?.kind {
            Kind::Entry { node, .. } => Ok(node.xattrs.clone()),
            _ => Ok(Vec::new()),
        }
    }
}

/// The inode of tree entry `node` below `parent`, made on first sight.
/// The inode of layout directory `name` in `parent`: the same for the same name in
/// every listing.
fn layout_dir(inodes: &mut Inodes, parent: u64, name: &[u8]) -> u64 {
    let key = (parent, name.to_vec());
    if let Some(&ino) = inodes.by_name.get(&key) {
        if let Some(Kind::Layout { .. }) = inodes.get(ino).map(|i| &i.kind) {
            return ino;
        }
    }
    let ino = inodes.add(parent, Kind::Layout { children: vec![] });
    inodes.by_name.insert(key, ino);
    ino
}

/// The inode of snapshot `snap` as `name` in layout directory `parent`: the same as long
/// as the name names the same snapshot.
fn snapshot_root(inodes: &mut Inodes, parent: u64, name: &[u8], snap: usize) -> u64 {
    let key = (parent, name.to_vec());
    if let Some(&ino) = inodes.by_name.get(&key) {
        if let Some(Kind::SnapshotRoot { snap: s }) = inodes.get(ino).map(|i| &i.kind) {
            if *s == snap {
                return ino;
            }
        }
    }
    let ino = inodes.add(parent, Kind::SnapshotRoot { snap });
    inodes.by_name.insert(key, ino);
    ino
}

fn entry_inode(inodes: &mut Inodes, parent: u64, snap: usize, node: Node) -> u64 {
    let key = (parent, node.name.clone());
    if let Some(&ino) = inodes.by_name.get(&key) {
        return ino;
    }
    let shared = matches!(node.kind, NodeKind::File { .. }) && node.links > 1;
    let link_key = (snap, node.device, node.inode);
    if shared {
        if let Some(&ino) = inodes.hardlinks.get(&link_key) {
            inodes.by_name.insert(key, ino);
            return ino;
        }
    }
    let ino = inodes.add(
        parent,
        Kind::Entry {
            snap,
            node: Arc::new(node),
        },
    );
    inodes.by_name.insert(key, ino);
    if shared {
        inodes.hardlinks.insert(link_key, ino);
    }
    ino
}

/// Directory names of the snapshots: local time to the second, with the short id added
/// to every name that two snapshots would share.
fn snapshot_names(snapshots: &[(SnapshotId, Snapshot)]) -> Vec<String> {
    let times: Vec<String> = snapshots
        .iter()
        .map(|(_, s)| {
            s.time
                .to_zoned(jiff::tz::TimeZone::system())
                .strftime("%Y-%m-%dT%H:%M:%S")
                .to_string()
        })
        .collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for t in &times {
        *count.entry(t).or_default() += 1;
    }
    times
        .iter()
        .zip(snapshots)
        .map(|(t, (id, _))| {
            if count[t.as_str()] > 1 {
                format!("{t}-{}", id.short())
            } else {
                t.clone()
            }
        })
        .collect()
}

/// A host or tag as one directory name.
fn safe_name(s: &str) -> String {
    match s {
        "" => "(none)".into(),
        "." | ".." => s.replace('.', "_"),
        _ => s.replace(['/', '\0'], "_"),
    }
}

fn system_time(t: Time) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(t.nsec));
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::from_secs(t.sec as u64) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + nanos
    }
}

fn nix_uid() -> u32 {
    // SAFETY: getuid cannot fail and touches no memory.
    unsafe { libc::getuid() }
}

fn nix_gid() -> u32 {
    // SAFETY: getgid cannot fail and touches no memory.
    unsafe { libc::getgid() }
}

/// Decrypted chunks, least recently used dropped first, bounded by total bytes.
#[derive(Default)]
struct ChunkCache {
    /// Most recent last; a few entries, so a linear scan is cheap.
    entries: Vec<(BlobId, Arc<Vec<u8>>)>,
    bytes: usize,
}

impl ChunkCache {
    fn get(&mut self, id: &BlobId) -> Option<Arc<Vec<u8>>> {
        let i = self.entries.iter().position(|(k, _)| k == id)?;
        let entry = self.entries.remove(i);
        let blob = Arc::clone(&entry.1);
        self.entries.push(entry);
        Some(blob)
    }

    fn put(&mut self, id: BlobId, blob: Arc<Vec<u8>>) {
        if self.entries.iter().any(|(k, _)| *k == id) {
            return;
        }
        self.bytes += blob.len();
        self.entries.push((id, blob));
        while self.bytes > CHUNK_CACHE_BYTES && self.entries.len() > 1 {
            let (_, old) = self.entries.remove(0);
            self.bytes -= old.len();
        }
    }
}

impl Filesystem for SnapshotFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.lookup_child(parent.0, name.as_bytes()) {
            Ok(attr) => reply.entry(&self.ttl(attr.ino.0), &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let ttl = self.ttl(ino.0);
        let inodes = self.inodes();
        match inodes.get(ino.0) {
            Some(inode) => reply.attr(&ttl, &self.attr(ino.0, inode)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let inodes = self.inodes();
        match inodes.get(ino.0).map(|i| &i.kind) {
            Some(Kind::Latest { target }) => reply.data(target),
            Some(Kind::Entry { node, .. }) => match &node.kind {
                NodeKind::Symlink { target } => reply.data(target),
                _ => reply.error(Errno::EINVAL),
            },
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.read_range(ino.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let children = match self.children(ino.0) {
            Ok(c) => c,
            Err(e) => return reply.error(e),
        };
        let parent = self.inodes().get(ino.0).map_or(ROOT, |i| i.parent);
        let dots = [
            (b".".to_vec(), ino.0, FileType::Directory),
            (b"..".to_vec(), parent, FileType::Directory),
        ];
        let all = dots
            .into_iter()
            .chain(children.into_iter().map(|(n, i, a)| (n, i, a.kind)));
        for (i, (name, child, kind)) in all.enumerate().skip(offset as usize) {
            // The offset given back is where the next call resumes.
            if reply.add(
                INodeNo(child),
                (i + 1) as u64,
                kind,
                OsStr::from_bytes(&name),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let xattrs = match self.xattrs(ino.0) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        match xattrs.iter().find(|x| x.name == name.as_bytes()) {
            None => reply.error(Errno::ENODATA),
            Some(x) => xattr_reply(&x.value, size, reply),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let xattrs = match self.xattrs(ino.0) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        let mut names = Vec::new();
        for x in &xattrs {
            names.extend_from_slice(&x.name);
            names.push(0);
        }
        xattr_reply(&names, size, reply);
    }
}

/// Size 0 asks for the length; otherwise the value, or ERANGE when it does not fit.
fn xattr_reply(value: &[u8], size: u32, reply: ReplyXattr) {
    if size == 0 {
        reply.size(u32::try_from(value.len()).unwrap_or(u32::MAX));
    } else if value.len() <= size as usize {
        reply.data(value);
    } else {
        reply.error(Errno::ERANGE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_cache_drops_least_recently_used_first() {
        let mut cache = ChunkCache::default();
        let big = |b: u8| Arc::new(vec![b; CHUNK_CACHE_BYTES / 2]);
        let id = |b: u8| BlobId([b; 32]);
        cache.put(id(1), big(1));
        cache.put(id(2), big(2));
        assert!(cache.get(&id(1)).is_some());
        cache.put(id(3), big(3));
        assert!(cache.get(&id(2)).is_none(), "2 was least recently used");
        assert!(cache.get(&id(1)).is_some() && cache.get(&id(3)).is_some());
        assert!(cache.bytes <= CHUNK_CACHE_BYTES);
    }

    #[test]
    fn safe_names_are_one_component() {
        assert_eq!(safe_name("a/b"), "a_b");
        assert_eq!(safe_name(""), "(none)");
        assert_eq!(safe_name(".."), "__");
    }
}

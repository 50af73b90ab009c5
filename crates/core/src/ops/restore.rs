//! `restore`: recreate a snapshot (or part of one) below a target directory, with contents
//! and metadata. Two promises: nothing is written outside the target, whatever names the
//! snapshot holds, and no restored file ever holds wrong bytes (each file is written under
//! a temporary name from verified blobs and renamed into place only when complete).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::fsmeta;
use crate::id::BlobId;
use crate::monitor::Monitor;
use crate::ops::backup::SourceProblem;
use crate::ops::browse::{self, Entry};
use crate::repo::Repository;
use crate::snapshot::Snapshot;
use crate::tree::{is_safe_name, Node, NodeKind};

/// What to do with files that already exist in the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    Always,
    Never,
}

#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    pub target: PathBuf,
    /// Restore only this path of the snapshot; its contents land directly in `target`.
    pub subpath: Option<Vec<u8>>,
    /// Re-read every restored file and check it against what was written.
    pub verify: bool,
    /// `None` refuses a target that is not empty.
    pub overwrite: Option<Overwrite>,
    /// Restore owners (needs root).
    pub owners: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RestoreStats {
    pub files_restored: u64,
    pub dirs_restored: u64,
    pub others_restored: u64,
    pub hardlinks_restored: u64,
    pub bytes_restored: u64,
    /// Existing files left alone (`--overwrite never`).
    pub files_skipped: u64,
    /// Sockets are not restored: the program that made one makes it again.
    pub sockets_skipped: u64,
    pub files_verified: u64,
    pub errors: Vec<SourceProblem>,
    pub duration_ms: u64,
}

pub fn restore(
    repo: &Repository,
    snapshot: &Snapshot,
    opts: &RestoreOptions,
    monitor: &dyn Monitor,
) -> Result<RestoreStats> {
    let started = Instant::now();
    let start = browse::find(repo, snapshot, opts.subpath.as_deref().unwrap_or(b"/"))?;
    prepare_target(&opts.target, opts.overwrite.is_some())?;
    let mut r = Restorer {
        repo,
        opts,
        monitor,
        stats: RestoreStats::default(),
        links: HashMap::new(),
    };
    match start {
        Entry::Root(tree) => r.restore_tree(&tree, &opts.target)?,
        Entry::Node(Node {
            kind: NodeKind::Dir { subtree },
            ..
        }) => r.restore_tree(&subtree, &opts.target)?,
        Entry::Node(node) => {
            let path = opts.target.join(std::ffi::OsStr::from_bytes(&node.name));
            r.restore_node(&node, &path)?;
        }
    }
    r.stats.duration_ms = started.elapsed().as_millis() as u64;
    Ok(r.stats)
}

fn prepare_target(target: &Path, may_overwrite: bool) -> Result<()> {
    match fs::read_dir(target) {
        Ok(mut entries) => {
            if entries.next().is_some() && !may_overwrite {
                return Err(Error::TargetNotEmpty {
                    target: target.to_path_buf(),
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(target).map_err(|e| Error::io(target, e))
        }
        Err(e) => Err(Error::io(target, e)),
    }
}

struct Restorer<'a> {
    repo: &'a Repository,
    opts: &'a RestoreOptions,
    monitor: &'a dyn Monitor,
    stats: RestoreStats,
    /// (device, inode) at backup time → first restored path, to recreate hard links.
    links: HashMap<(u64, u64), PathBuf>,
}

impl Restorer<'_> {
    fn problem(&mut self, path: &Path, error: &dyn std::fmt::Display) {
        self.monitor.problem(path, error);
        self.stats.errors.push(SourceProblem {
            path: path.to_string_lossy().into_owned(),
            error: error.to_string(),
        });
    }

    fn restore_tree(&mut self, tree: &BlobId, dir: &Path) -> Result<()> {
        let tree = match self.repo.read_tree(tree) {
            Ok(t) => t,
            Err(e) => {
                self.problem(
                    dir,
                    &format!(
                        "directory contents not restored: {}",
                        crate::error::chain(&e)
                    ),
                );
                return Ok(());
            }
        };
        for node in &tree.nodes {
            if !is_safe_name(&node.name) {
                let name = String::from_utf8_lossy(&node.name).into_owned();
                self.problem(
                    dir,
                    &format!("refused unsafe name {name:?} in the snapshot"),
                );
                continue;
            }
            let path = dir.join(std::ffi::OsStr::from_bytes(&node.name));
            self.restore_node(node, &path)?;
        }
        Ok(())
    }

    /// Restores one node; problems with it are reported and skipped.
    fn restore_node(&mut self, node: &Node, path: &Path) -> Result<()> {
        if self.monitor.cancelled() {
            return Err(Error::Interrupted);
        }
        let done = match &node.kind {
            NodeKind::Dir { subtree } => {
                if let Err(e) = self.make_dir(path) {
                    self.problem(path, &e);
                    return Ok(());
                }
                self.restore_tree(subtree, path)?;
                self.stats.dirs_restored += 1;
                Ok::<bool, String>(true)
            }
            NodeKind::File { .. } => self.restore_file(node, path),
            NodeKind::Socket => {
                self.stats.sockets_skipped += 1;
                return Ok(());
            }
            _ => self.restore_special(node, path).map_err(|e| e.to_string()),
        };
        match done {
            Ok(true) => {
                if let Err(e) = fsmeta::apply(path, node, self.opts.owners) {
                    self.problem(path, &format!("metadata not fully restored: {e}"));
                }
            }
            Ok(false) => {}
            Err(e) => self.problem(path, &e),
        }
        Ok(())
    }

    /// Whether an existing `path` may be replaced; `Ok(false)` means keep it and skip.
    fn clear(&mut self, path: &Path) -> io::Result<bool> {
        match fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
            Err(e) => Err(e),
            Ok(_) if self.opts.overwrite != Some(Overwrite::Always) => {
                self.stats.files_skipped += 1;
                Ok(false)
            }
            Ok(md) if md.is_dir() => fs::remove_dir_all(path).map(|_| true),
            Ok(_) => fs::remove_file(path).map(|_| true),
        }
    }

    fn make_dir(&mut self, path: &Path) -> io::Result<()> {
        match fs::symlink_metadata(path) {
            // A directory already there is reused; a symlink is never followed.
            Ok(md) if md.is_dir() => Ok(()),
            Ok(_) if self.opts.overwrite == Some(Overwrite::Always) => {
                fs::remove_file(path)?;
                fs::create_dir(path)
            }
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "exists and is not a directory; --overwrite always replaces it",
            )),
            Err(_) => fs::create_dir(path),
        }
    }

    fn restore_special(&mut self, node: &Node, path: &Path) -> io::Result<bool> {
        if !self.clear(path)? {
            return Ok(false);
        }
        match &node.kind {
            NodeKind::Symlink { target } => {
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), path)?
            }
            NodeKind::Fifo => {
                nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600))?
            }
            NodeKind::CharDevice { rdev } | NodeKind::BlockDevice { rdev } => {
                let kind = if matches!(node.kind, NodeKind::CharDevice { .. }) {
                    nix::sys::stat::SFlag::S_IFCHR
                } else {
                    nix::sys::stat::SFlag::S_IFBLK
                };
                nix::sys::stat::mknod(
                    path,
                    kind,
                    nix::sys::stat::Mode::from_bits_truncate(0o600),
                    *rdev,
                )?
            }
            _ => unreachable!("restore_special handles links, FIFOs and devices"),
        }
        self.stats.others_restored += 1;
        Ok(true)
    }

    fn restore_file(&mut self, node: &Node, path: &Path) -> Result<bool, String> {
        let NodeKind::File { content, size } = &node.kind else {
            unreachable!("restore_file takes files")
        };
        if node.links > 1 {
            if let Some(first) = self.links.get(&(node.device, node.inode)).cloned() {
                if !self.clear(path).map_err(|e| e.to_string())? {
                    return Ok(false);
                }
                fs::hard_link(&first, path).map_err(|e| e.to_string())?;
                self.stats.hardlinks_restored += 1;
                return Ok(false);
            }
        }
        if fs::symlink_metadata(path).is_ok() && self.opts.overwrite != Some(Overwrite::Always) {
            self.stats.files_skipped += 1;
            return Ok(false);
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let tmp = dir.join(format!(".cairn-restore-{:016x}", rand::random::<u64>()));
        let written = self.write_file(node, content, &tmp, path);
        let result = written.and_then(|hash| {
            fsmeta::apply(&tmp, node, self.opts.owners)
                .map_err(|e| format!("metadata not restored: {e}"))?;
            if self.opts.verify {
                verify(&tmp, &hash).map_err(|e| format!("verification failed: {e}"))?;
                self.stats.files_verified += 1;
            }
            if let Ok(md) = fs::symlink_metadata(path) {
                if md.is_dir() {
                    fs::remove_dir_all(path).map_err(|e| e.to_string())?;
                }
            }
            fs::rename(&tmp, path).map_err(|e| e.to_string())
        });
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        if node.links > 1 {
            self.links
                .insert((node.device, node.inode), path.to_path_buf());
        }
        self.stats.files_restored += 1;
        self.stats.bytes_restored += size;
        self.monitor.file_done(path, *size);
        // Metadata was applied to the temporary file before the rename.
        Ok(false)
    }

    /// Writes the file's blobs to `tmp`; returns the BLAKE3 hash of what was written.
    fn write_file(
        &self,
        node: &Node,
        content: &[crate::tree::ContentRef],
        tmp: &Path,
        path: &Path,
    ) -> Result<blake3::Hash, String> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp)
            .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
        let mut hasher = blake3::Hasher::new();
        let mut written = 0u64;
        for part in content {
            if self.monitor.cancelled() {
                return Err("interrupted".into());
            }
            let blob = self
                .repo
                .read_blob(&part.blob)
                .map_err(|e| format!("not restored, {}", crate::error::chain(&e)))?;
            let range = blob
                .get(part.offset as usize..(part.offset + part.len) as usize)
                .ok_or_else(|| format!("content reference outside blob {}", part.blob))?;
            file.write_all(range).map_err(|e| e.to_string())?;
            hasher.update(range);
            written += range.len() as u64;
        }
        if let NodeKind::File { size, .. } = node.kind {
            if written != size {
                return Err(format!(
                    "snapshot says {} has {size} bytes but its chunks hold {written}",
                    path.display()
                ));
            }
        }
        Ok(hasher.finalize())
    }
}

fn verify(path: &Path, expected: &blake3::Hash) -> io::Result<()> {
    let mut file = File::open(path)?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    if hasher.finalize() != *expected {
        return Err(io::Error::other(
            "the file on disk differs from what was written",
        ));
    }
    Ok(())
}

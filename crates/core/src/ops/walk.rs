//! Directory listings for backup, made ahead of the walk: when the walk enters a
//! directory, helper threads list its subdirectories (`readdir`, then `lstat` and the
//! extended attributes of every entry) and read their trees in the parent snapshot, so
//! the walking thread mostly compares and builds trees. The system calls of many
//! directories are then in flight at once, which is what a cold disk needs, and on a warm
//! cache they run on all cores. The threads take directories in the order asked for,
//! breadth first; the walk goes depth first, and lists a directory no thread has begun
//! itself rather than wait behind the others.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::Metadata;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use crate::error::Result;
use crate::fsmeta;
use crate::id::BlobId;
use crate::repo::Repository;
use crate::tree::{Node, Tree, Xattr};
use crate::writer::PhaseTimer;

/// One directory entry with what backup needs to know of it.
pub struct Entry {
    pub name: Vec<u8>,
    pub path: PathBuf,
    pub md: io::Result<Metadata>,
    pub xattrs: io::Result<Vec<Xattr>>,
}

impl Entry {
    /// `lstat`s `path` and reads its extended attributes.
    pub fn read(name: Vec<u8>, path: PathBuf) -> Entry {
        let md = std::fs::symlink_metadata(&path);
        let xattrs = match &md {
            Ok(_) => fsmeta::read_xattrs(&path),
            Err(_) => Ok(Vec::new()),
        };
        Entry {
            name,
            path,
            md,
            xattrs,
        }
    }
}

/// A directory's entries in name order, problems listing it, and its tree in the parent
/// snapshot.
pub struct Listing {
    pub entries: Vec<Entry>,
    pub problems: Vec<String>,
    pub parent: Option<Result<Tree>>,
}

/// Lists `dir` and reads `parent` (its tree in the parent snapshot). Entries are
/// `lstat`ed relative to the open directory, so the kernel looks up one name, not the
/// whole path. An entry whose inode, device and ctime are those of its node in `parent`
/// keeps that node's extended attributes without reading them: setting or removing an
/// xattr changes the ctime. `reread` (`--force`) reads them all.
pub fn list(
    repo: &Repository,
    dir: &Path,
    parent: Option<BlobId>,
    reread: bool,
    walk: &PhaseTimer,
) -> Listing {
    let parent = parent.map(|id| repo.read_tree(&id));
    let started = Instant::now();
    // As many entries as last time, most often: no regrowing (and moving) of the list.
    // At most 1,024 ahead of time, in case the directory has since shrunk.
    let expected = match &parent {
        Some(Ok(tree)) => tree.nodes.len().min(1024),
        _ => 0,
    };
    let mut entries: Vec<Entry> = Vec::with_capacity(expected);
    let mut problems = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(rd) => {
            for entry in rd {
                match entry {
                    Ok(e) => {
                        let name = e.file_name();
                        entries.push(Entry {
                            path: child_path(dir, &name),
                            name: name.into_vec(),
                            md: e.metadata(),
                            xattrs: Ok(Vec::new()),
                        })
                    }
                    Err(e) => problems.push(format!("listing incomplete: {e}")),
                }
            }
        }
        Err(e) => problems.push(format!("directory not read, saved empty: {e}")),
    }
    entries.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let known: &[Node] = match &parent {
        Some(Ok(tree)) if !reread => &tree.nodes,
        _ => &[],
    };
    let mut known = known.iter().peekable();
    for entry in &mut entries {
        let node = crate::tree::next_named(&mut known, &entry.name);
        let Ok(md) = &entry.md else { continue };
        let same = node.filter(|n| {
            n.inode == md.ino() && n.device == md.dev() && n.ctime == fsmeta::ctime(md)
        });
        entry.xattrs = match same {
            Some(node) => Ok(node.xattrs.clone()),
            None => fsmeta::read_xattrs(&entry.path),
        };
    }
    walk.add(started);
    Listing {
        entries,
        problems,
        parent,
    }
}

/// `dir/name`, allocated once at its length (`Path::join` copies `dir`, then grows the
/// copy for `name`: two allocations per entry).
fn child_path(dir: &Path, name: &OsStr) -> PathBuf {
    let mut path = PathBuf::with_capacity(dir.as_os_str().len() + 1 + name.len());
    path.push(dir);
    path.push(name);
    path
}

/// Directories listed ahead but not yet walked, at most: bounds memory on very wide trees
/// (the rest are listed by the walk itself).
const AHEAD: usize = 1024;

struct Job {
    dir: PathBuf,
    reread: bool,
    parent: Option<BlobId>,
    /// Set by whoever lists the directory: a listing thread, or the walk itself when it
    /// needs the directory before any thread has begun it.
    taken: Arc<AtomicBool>,
    done: Sender<Listing>,
}

/// A listing asked for: taken by a thread when it begins.
struct Waiting {
    taken: Arc<AtomicBool>,
    listing: Receiver<Listing>,
}

/// The listing threads and the listings they owe the walk.
pub struct Lookahead<'a> {
    repo: &'a Repository,
    walk: &'a PhaseTimer,
    /// Read every entry's extended attributes (`--force`).
    reread: bool,
    jobs: Sender<Job>,
    /// Keeps the queue open with no listing thread (`threads` 0, which only tests use:
    /// the walk then lists every directory itself).
    _queue: Receiver<Job>,
    waiting: HashMap<PathBuf, Waiting>,
}

impl<'a> Lookahead<'a> {
    pub fn start<'scope>(
        scope: &'scope std::thread::Scope<'scope, 'a>,
        repo: &'a Repository,
        walk: &'a PhaseTimer,
        threads: usize,
        reread: bool,
    ) -> Lookahead<'a> {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let queue = rx.clone();
        for _ in 0..threads {
            let rx = rx.clone();
            scope.spawn(move || {
                for job in rx {
                    if job.taken.swap(true, Ordering::AcqRel) {
                        continue;
                    }
                    // The walk may have stopped waiting (an error): nothing to do then.
                    let _ = job
                        .done
                        .send(list(repo, &job.dir, job.parent, job.reread, walk));
                }
            });
        }
        Lookahead {
            repo,
            walk,
            reread,
            jobs: tx,
            _queue: queue,
            waiting: HashMap::new(),
        }
    }

    /// Asks for `dir` to be listed ahead, unless enough are already.
    pub fn ahead(&mut self, dir: &Path, parent: Option<BlobId>) {
        if self.waiting.len() >= AHEAD || self.waiting.contains_key(dir) {
            return;
        }
        let (done, listing) = crossbeam_channel::bounded(1);
        let taken = Arc::new(AtomicBool::new(false));
        let job = Job {
            dir: dir.to_path_buf(),
            reread: self.reread,
            parent,
            taken: Arc::clone(&taken),
            done,
        };
        if self.jobs.send(job).is_ok() {
            self.waiting
                .insert(dir.to_path_buf(), Waiting { taken, listing });
        }
    }

    /// The listing of `dir`: the one made ahead, or, if no thread has begun it (the
    /// threads take directories in the order asked for, and the walk goes depth first),
    /// one made now rather than waiting behind the others.
    pub fn take(&mut self, dir: &Path, parent: Option<BlobId>) -> Listing {
        if let Some(w) = self.waiting.remove(dir) {
            if w.taken.swap(true, Ordering::AcqRel) {
                if let Ok(listing) = w.listing.recv() {
                    return listing;
                }
            }
        }
        list(self.repo, dir, parent, self.reread, self.walk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry's path is the directory's joined with its name, however the directory
    /// was written (a trailing slash, `.`, `..`) and whatever bytes the name holds, and it
    /// is the entry that was `lstat`ed (a symlink's own metadata, not its target's).
    #[test]
    fn entries_are_at_the_directory_joined_with_their_names() {
        use std::os::unix::ffi::OsStrExt;
        let repo_dir = tempfile::tempdir().unwrap();
        let repo = crate::repo::test_repository(repo_dir.path());
        let tree = tempfile::tempdir().unwrap();
        let sub = tree.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let names: [&[u8]; 4] = [b"-rf", b"a b", b"\xff\xfe not utf-8", b"\x1b[31mred"];
        for name in names {
            std::fs::write(sub.join(OsStr::from_bytes(name)), name).unwrap();
        }
        std::os::unix::fs::symlink("/etc/passwd", sub.join("link")).unwrap();
        let walk = PhaseTimer::default();
        let trailing = PathBuf::from(format!("{}/", sub.display()));
        for dir in [sub.clone(), trailing, sub.join("."), sub.join("../sub")] {
            let listing = list(&repo, &dir, None, false, &walk);
            assert!(listing.problems.is_empty(), "{:?}", listing.problems);
            assert_eq!(listing.entries.len(), names.len() + 1);
            for entry in &listing.entries {
                assert_eq!(entry.path, dir.join(OsStr::from_bytes(&entry.name)));
                let md = entry.md.as_ref().unwrap();
                let lstat = std::fs::symlink_metadata(&entry.path).unwrap();
                assert_eq!((md.ino(), md.file_type()), (lstat.ino(), lstat.file_type()));
            }
            let link = listing.entries.iter().find(|e| e.name == b"link").unwrap();
            assert!(link.md.as_ref().unwrap().file_type().is_symlink());
        }
    }

    /// The walk needs directories in depth-first order, the threads take them in the
    /// order asked for: a directory no thread has begun is listed by the walk at once,
    /// not after the others. With no thread at all, every `take` would wait forever.
    #[test]
    fn a_directory_no_thread_has_begun_is_listed_by_the_walk_at_once() {
        let repo_dir = tempfile::tempdir().unwrap();
        let repo = crate::repo::test_repository(repo_dir.path());
        let tree = tempfile::tempdir().unwrap();
        for (dir, file) in [("a", "one"), ("b", "two")] {
            std::fs::create_dir(tree.path().join(dir)).unwrap();
            std::fs::write(tree.path().join(dir).join(file), file).unwrap();
        }
        let walk = PhaseTimer::default();
        let (done, finished) = crossbeam_channel::bounded(1);
        std::thread::scope(|scope| {
            let mut lookahead = Lookahead::start(scope, &repo, &walk, 0, false);
            let (a, b) = (tree.path().join("a"), tree.path().join("b"));
            lookahead.ahead(&a, None);
            lookahead.ahead(&b, None);
            let queue = lookahead._queue.clone();
            scope.spawn(move || {
                let names = |l: Listing| l.entries.into_iter().map(|e| e.name).collect::<Vec<_>>();
                let listed = (
                    names(lookahead.take(&b, None)),
                    names(lookahead.take(&a, None)),
                );
                let _ = done.send(listed);
            });
            let listed = finished.recv_timeout(std::time::Duration::from_secs(20));
            // Dropping the jobs ends a wait for them, so that a failure ends the test.
            while queue.try_recv().is_ok() {}
            let listed = listed.expect("the walk waited for a listing no thread would make");
            assert_eq!(listed, (vec![b"two".to_vec()], vec![b"one".to_vec()]));
        });
    }
}

//! Reading snapshots without restoring them: find a path, walk a tree (`ls`), stream one
//! file (`cat`). These read trees, and file contents only for `cat`.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::id::BlobId;
use crate::repo::Repository;
use crate::snapshot::Snapshot;
use crate::tree::{ContentRef, Node, NodeKind, Tree};

/// What a path inside a snapshot names.
#[derive(Debug, Clone)]
pub enum Entry {
    /// The snapshot's root, `/`.
    Root(BlobId),
    Node(Node),
}

/// Splits an absolute or relative snapshot path into its names; `.` and empty parts vanish.
pub fn path_names(path: &[u8]) -> Vec<&[u8]> {
    path.split(|&b| b == b'/')
        .filter(|n| !n.is_empty() && *n != b".")
        .collect()
}

/// Finds `path` in `snapshot`. When a name is missing, the error suggests the nearest
/// names of the directory that should have held it.
pub fn find(repo: &Repository, snapshot: &Snapshot, path: &[u8]) -> Result<Entry> {
    let not_found = |suggestions: Vec<String>| Error::PathNotFound {
        path: String::from_utf8_lossy(path).into_owned(),
        snapshot: format!("{} ({})", snapshot.time, snapshot.paths.join(", ")),
        suggestions,
    };
    let mut found = Entry::Root(snapshot.tree);
    let mut parent = Vec::new();
    for name in path_names(path) {
        let tree_id = match &found {
            Entry::Root(id) => *id,
            Entry::Node(Node {
                kind: NodeKind::Dir { subtree },
                ..
            }) => *subtree,
            Entry::Node(_) => return Err(not_found(Vec::new())),
        };
        let tree = repo.read_tree(&tree_id)?;
        found = match tree.find(name) {
            Some(node) => Entry::Node(node.clone()),
            None => {
                let near = nearest_names(&tree, name, 3)
                    .into_iter()
                    .map(|n| {
                        let mut p = parent.clone();
                        p.push(b'/');
                        p.extend_from_slice(n);
                        String::from_utf8_lossy(&p).into_owned()
                    })
                    .collect();
                return Err(not_found(near));
            }
        };
        parent.push(b'/');
        parent.extend_from_slice(name);
    }
    Ok(found)
}

/// Up to `max` names of `tree` close to `name` (edit distance at most a third of the
/// longer name, at least 2), nearest first; a name that extends `name` counts as close, so
/// `hel` finds `hello.txt`.
fn nearest_names<'t>(tree: &'t Tree, name: &[u8], max: usize) -> Vec<&'t [u8]> {
    // strsim compares sized collections; this runs only when a path is missing.
    let wanted = name.to_vec();
    let mut scored: Vec<(usize, &[u8])> = tree
        .nodes
        .iter()
        .filter_map(|n| {
            let distance = strsim::generic_levenshtein(&n.name, &wanted);
            let limit = (n.name.len().max(name.len()) / 3).max(2);
            let close = distance <= limit || (!name.is_empty() && n.name.starts_with(name));
            close.then_some((distance, n.name.as_slice()))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(max).map(|(_, n)| n).collect()
}

/// Calls `visit` with the path and node of everything below `tree`, depth first, parents
/// before children, names in byte order.
pub fn walk(
    repo: &Repository,
    tree: &BlobId,
    prefix: &[u8],
    visit: &mut dyn FnMut(&[u8], &Node) -> Result<()>,
) -> Result<()> {
    visit_below(repo, tree, prefix, true, visit)
}

/// Calls `visit` with the path and node of each entry of `tree` itself, names in byte
/// order (`ls` without `--recursive`).
pub fn list(
    repo: &Repository,
    tree: &BlobId,
    prefix: &[u8],
    visit: &mut dyn FnMut(&[u8], &Node) -> Result<()>,
) -> Result<()> {
    visit_below(repo, tree, prefix, false, visit)
}

fn visit_below(
    repo: &Repository,
    tree: &BlobId,
    prefix: &[u8],
    recursive: bool,
    visit: &mut dyn FnMut(&[u8], &Node) -> Result<()>,
) -> Result<()> {
    let tree = repo.read_tree(tree)?;
    for node in &tree.nodes {
        let mut path = prefix.to_vec();
        if path.last() != Some(&b'/') {
            path.push(b'/');
        }
        path.extend_from_slice(&node.name);
        visit(&path, node)?;
        if let (true, NodeKind::Dir { subtree }) = (recursive, &node.kind) {
            visit_below(repo, subtree, &path, true, visit)?;
        }
    }
    Ok(())
}

/// Whether `content` refers to whole blobs only (a file cut into chunks), not to parts of
/// blobs (small files bundled together, see `ops::ingest`): only then do equal bytes
/// mean equal references.
pub fn whole_blobs(repo: &Repository, content: &[ContentRef]) -> bool {
    let index = repo.index();
    content
        .iter()
        .all(|c| c.offset == 0 && index.get(&c.blob).is_some_and(|l| l.raw_length == c.len))
}

/// Writes the content of file `node` to `out`, blob by blob, each verified.
pub fn cat(repo: &Repository, node: &Node, path: &str, out: &mut dyn Write) -> Result<u64> {
    let NodeKind::File { content, .. } = &node.kind else {
        return Err(Error::NotAFile {
            path: path.to_string(),
        });
    };
    let mut written = 0;
    for part in content {
        let blob = repo.read_blob_shared(&part.blob)?;
        let range = blob
            .get(part.offset as usize..(part.offset + part.len) as usize)
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "{path}: content reference outside blob {}",
                    part.blob
                ))
            })?;
        out.write_all(range)
            .map_err(|e| Error::io(PathBuf::from("<output>"), e))?;
        written += range.len() as u64;
    }
    Ok(written)
}

/// A file's content as a `Read`, one verified blob at a time, so that a file of any size
/// streams in the memory of its largest chunk. It fails rather than return fewer bytes
/// than the file's recorded size, because archive writers have already written that size.
pub struct FileReader<'a> {
    repo: &'a Repository,
    path: String,
    content: &'a [ContentRef],
    size: u64,
    next_ref: usize,
    blob: Arc<Vec<u8>>,
    /// The unread part of `blob`.
    start: usize,
    end: usize,
    read_total: u64,
}

impl<'a> FileReader<'a> {
    /// A reader of file `node`; `path` names it in errors.
    pub fn new(repo: &'a Repository, node: &'a Node, path: &str) -> Result<Self> {
        let NodeKind::File { size, content } = &node.kind else {
            return Err(Error::NotAFile {
                path: path.to_string(),
            });
        };
        Ok(FileReader {
            repo,
            path: path.to_string(),
            content,
            size: *size,
            next_ref: 0,
            blob: Arc::default(),
            start: 0,
            end: 0,
            read_total: 0,
        })
    }

    /// Loads the next content ref; false at the end of the file.
    fn load_next(&mut self) -> Result<bool> {
        let Some(part) = self.content.get(self.next_ref) else {
            return Ok(false);
        };
        self.next_ref += 1;
        self.blob = self.repo.read_blob_shared(&part.blob)?;
        let (start, end) = (
            part.offset as usize,
            part.offset as usize + part.len as usize,
        );
        if end > self.blob.len() {
            return Err(Error::InvalidInput(format!(
                "{}: content reference outside blob {}",
                self.path, part.blob
            )));
        }
        (self.start, self.end) = (start, end);
        Ok(true)
    }
}

impl Read for FileReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.start == self.end {
            if !self.load_next().map_err(std::io::Error::other)? {
                if self.read_total != self.size {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "{}: the snapshot records {} bytes but its chunks hold {}",
                            self.path, self.size, self.read_total
                        ),
                    ));
                }
                return Ok(0);
            }
        }
        if self.read_total + (self.end - self.start) as u64 > self.size {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{}: its chunks hold more than the {} bytes the snapshot records",
                    self.path, self.size
                ),
            ));
        }
        let n = buf.len().min(self.end - self.start);
        buf[..n].copy_from_slice(&self.blob[self.start..self.start + n]);
        self.start += n;
        self.read_total += n as u64;
        Ok(n)
    }
}

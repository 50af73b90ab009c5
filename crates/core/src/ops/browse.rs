//! Reading snapshots without restoring them: find a path, walk a tree (`ls`), stream one
//! file (`cat`). These read trees, and file contents only for `cat`.

use std::io::Write;
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::id::BlobId;
use crate::repo::Repository;
use crate::snapshot::Snapshot;
use crate::tree::{Node, NodeKind};

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

/// Finds `path` in `snapshot`.
pub fn find(repo: &Repository, snapshot: &Snapshot, path: &[u8]) -> Result<Entry> {
    let not_found = || Error::PathNotFound {
        path: String::from_utf8_lossy(path).into_owned(),
        snapshot: format!("{} ({})", snapshot.time, snapshot.paths.join(", ")),
    };
    let mut found = Entry::Root(snapshot.tree);
    for name in path_names(path) {
        let tree_id = match &found {
            Entry::Root(id) => *id,
            Entry::Node(Node {
                kind: NodeKind::Dir { subtree },
                ..
            }) => *subtree,
            Entry::Node(_) => return Err(not_found()),
        };
        let tree = repo.read_tree(&tree_id)?;
        found = Entry::Node(tree.find(name).ok_or_else(not_found)?.clone());
    }
    Ok(found)
}

/// Calls `visit` with the path and node of everything below `tree`, depth first, parents
/// before children, names in byte order.
pub fn walk(
    repo: &Repository,
    tree: &BlobId,
    prefix: &[u8],
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
        if let NodeKind::Dir { subtree } = &node.kind {
            walk(repo, subtree, &path, visit)?;
        }
    }
    Ok(())
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
        let blob = repo.read_blob(&part.blob)?;
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

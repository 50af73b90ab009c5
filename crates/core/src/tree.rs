//! Trees: one directory's entries with their metadata, stored as a blob and named by its
//! keyed hash, so an unchanged directory is stored once however many snapshots hold it.
//! File contents are lists of byte ranges of data blobs; names are raw bytes, so names
//! that are not UTF-8 survive a round trip.
//!
//! A tree comes from storage, which an attacker may have written (with a key, or through
//! a bug of an older writer), and every reader joins its names to paths: restore and
//! `dump` to the target, mount to its directories, zip to its entries, `copy` into
//! another repository. So parsing, not each reader, refuses a name that is not one plain
//! path component, and names out of order: lookups are binary searches and merges of
//! sorted lists, which a repeated or unsorted name would silently mislead.

use serde::{Deserialize, Serialize};

use crate::id::BlobId;

/// One directory's entries, sorted by name bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tree {
    pub nodes: Vec<Node>,
}

impl Tree {
    pub fn to_bytes(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a tree serializes")
    }

    /// Decodes a tree and checks its names: each is one safe path component
    /// ([`is_safe_name`]) and each sorts strictly after the one before (sorted, no
    /// repeats), as every writer of trees stores them.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, TreeError> {
        let tree: Tree = postcard::from_bytes(bytes)?;
        let mut previous: Option<&[u8]> = None;
        for (index, node) in tree.nodes.iter().enumerate() {
            if !is_safe_name(&node.name) {
                return Err(TreeError::UnsafeName {
                    index,
                    name: node.name.escape_ascii().to_string(),
                });
            }
            if previous.is_some_and(|p| p >= node.name.as_slice()) {
                return Err(TreeError::OutOfOrder {
                    index,
                    name: node.name.escape_ascii().to_string(),
                });
            }
            previous = Some(&node.name);
        }
        Ok(tree)
    }

    pub fn find(&self, name: &[u8]) -> Option<&Node> {
        self.nodes
            .binary_search_by(|n| n.name.as_slice().cmp(name))
            .ok()
            .map(|i| &self.nodes[i])
    }
}

/// From `nodes` in name order, the one named `name`; the nodes before it are dropped.
/// Called with names in increasing order (a sorted listing), it merges the listing with a
/// tree's nodes in one pass instead of a search for each name.
pub fn next_named<N: std::borrow::Borrow<Node>>(
    nodes: &mut std::iter::Peekable<impl Iterator<Item = N>>,
    name: &[u8],
) -> Option<N> {
    while nodes
        .next_if(|n| n.borrow().name.as_slice() < name)
        .is_some()
    {}
    nodes.next_if(|n| n.borrow().name == name)
}

/// Why stored bytes are not a tree. Names are shown with bytes outside printable ASCII
/// escaped (`\x1b`), since the message ends up on a terminal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TreeError {
    #[error("{0}")]
    Decode(#[from] postcard::Error),

    #[error(
        "entry {index} has the unsafe name \"{name}\" (a name must be one path component: \
         not empty, `.` or `..`, without `/` or NUL)"
    )]
    UnsafeName { index: usize, name: String },

    #[error(
        "entry {index} \"{name}\" does not sort after the entry before it (names must be \
         sorted and unique)"
    )]
    OutOfOrder { index: usize, name: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: Vec<u8>,
    pub kind: NodeKind,
    /// Permission bits, including setuid, setgid and sticky (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub user: Option<String>,
    pub group: Option<String>,
    pub mtime: Time,
    pub ctime: Time,
    pub inode: u64,
    pub device: u64,
    /// Hard link count at backup time; above 1, restore links entries with the same
    /// (device, inode) together.
    pub links: u64,
    pub xattrs: Vec<Xattr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeKind {
    File { size: u64, content: Vec<ContentRef> },
    Dir { subtree: BlobId },
    Symlink { target: Vec<u8> },
    Fifo,
    Socket,
    CharDevice { rdev: u64 },
    BlockDevice { rdev: u64 },
}

impl NodeKind {
    /// The word `ls` and `--json` use for this kind.
    pub fn name(&self) -> &'static str {
        match self {
            NodeKind::File { .. } => "file",
            NodeKind::Dir { .. } => "dir",
            NodeKind::Symlink { .. } => "symlink",
            NodeKind::Fifo => "fifo",
            NodeKind::Socket => "socket",
            NodeKind::CharDevice { .. } => "chardev",
            NodeKind::BlockDevice { .. } => "blockdev",
        }
    }
}

/// Where a file's bytes are among its content refs, for reads at any offset (`mount`): the
/// offset in the file at which each ref starts.
#[derive(Debug, Clone)]
pub struct ContentIndex {
    /// `starts[i]` is the file offset of ref `i`; the last entry is the file's length.
    starts: Vec<u64>,
}

/// One piece of a read: bytes `blob_range` of the blob of ref `part`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub part: usize,
    pub blob_range: std::ops::Range<usize>,
}

impl ContentIndex {
    pub fn new(content: &[ContentRef]) -> Self {
        let mut starts = Vec::with_capacity(content.len() + 1);
        let mut at = 0u64;
        starts.push(0);
        for part in content {
            // Cannot overflow: a file would need 2^32 refs of 4 GiB first.
            at += u64::from(part.len);
            starts.push(at);
        }
        ContentIndex { starts }
    }

    /// The file's length: the sum of its refs' lengths.
    pub fn len(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pieces that hold bytes `offset..offset + size` of the file (cut at its end),
    /// in order; empty at or past the end. `content` must be the refs this index was
    /// made from. Refs of length 0 are never returned.
    pub fn pieces(&self, content: &[ContentRef], offset: u64, size: u64) -> Vec<Piece> {
        let end = self.len().min(offset.saturating_add(size));
        let mut out = Vec::new();
        let mut at = offset;
        while at < end {
            // The ref whose range holds `at`: the last start at or before it, which
            // skips refs of length 0. At least `starts[0] = 0` is at or before it.
            let i = self.starts.partition_point(|&s| s <= at) - 1;
            let (Some(part), Some(&next)) = (content.get(i), self.starts.get(i + 1)) else {
                break; // `content` is not the one this index was made from
            };
            let upto = end.min(next);
            // Both within the ref's `len: u32`, so within `usize` too.
            let from = (at - self.starts[i]) as usize;
            let to = (upto - self.starts[i]) as usize;
            let base = part.offset as usize;
            out.push(Piece {
                part: i,
                blob_range: base + from..base + to,
            });
            at = upto;
        }
        out
    }
}

/// `len` bytes of blob `blob` starting at `offset`. A file's content is the concatenation
/// of its refs; today each ref is a whole chunk, but a ref may also point into a chunk
/// shared by several small files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContentRef {
    pub blob: BlobId,
    pub offset: u32,
    pub len: u32,
}

/// A file time: seconds since the Unix epoch and nanoseconds, as `stat` gives them, so
/// that any time a filesystem holds (before 1677 or after 2262 too) survives exactly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

impl Time {
    pub fn now() -> Self {
        let t = jiff::Timestamp::now();
        Time {
            sec: t.as_second(),
            nsec: t.subsec_nanosecond().max(0) as u32,
        }
    }

    /// As a timestamp, when jiff can represent it (years -9999 to 9999).
    pub fn to_timestamp(self) -> Option<jiff::Timestamp> {
        jiff::Timestamp::new(self.sec, self.nsec as i32).ok()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Xattr {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

/// Whether `name` is safe to join to a directory path: one normal component.
/// Restore refuses anything else, so a crafted snapshot cannot write outside its target.
pub fn is_safe_name(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &[u8]) -> Node {
        Node {
            name: name.to_vec(),
            kind: NodeKind::Fifo,
            mode: 0o644,
            uid: 0,
            gid: 0,
            user: None,
            group: None,
            mtime: Time { sec: -5, nsec: 1 },
            ctime: Time::default(),
            inode: 1,
            device: 2,
            links: 1,
            xattrs: vec![],
        }
    }

    #[test]
    fn trees_round_trip_with_non_utf8_names() {
        let tree = Tree {
            nodes: vec![node(b"a"), node("é".as_bytes()), node(&[0xff, 0xfe])],
        };
        assert_eq!(Tree::from_bytes(&tree.to_bytes()).unwrap(), tree);
        assert!(tree.find(&[0xff, 0xfe]).is_some());
        assert!(tree.find(b"b").is_none());
    }

    #[test]
    fn trees_with_unsafe_names_do_not_parse() {
        for bad in [&b""[..], b".", b"..", b"../x", b"a/b", b"/", b"a\0"] {
            let mut tree = Tree {
                nodes: vec![node(b"a"), node(bad)],
            };
            tree.nodes.sort_by(|a, b| a.name.cmp(&b.name));
            let err = Tree::from_bytes(&tree.to_bytes()).unwrap_err();
            assert!(
                matches!(err, TreeError::UnsafeName { .. }),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn trees_with_unsorted_or_repeated_names_do_not_parse() {
        for names in [[&b"b"[..], b"a"], [&b"a"[..], b"a"]] {
            let tree = Tree {
                nodes: names.iter().map(|n| node(n)).collect(),
            };
            let err = Tree::from_bytes(&tree.to_bytes()).unwrap_err();
            assert!(
                matches!(err, TreeError::OutOfOrder { index: 1, .. }),
                "{err}"
            );
        }
        let empty = Tree::default();
        assert_eq!(Tree::from_bytes(&empty.to_bytes()).unwrap(), empty);
    }

    #[test]
    fn an_unsafe_name_is_shown_escaped_in_the_error() {
        let tree = Tree {
            nodes: vec![node(b"\x1b[31m/x")],
        };
        let text = Tree::from_bytes(&tree.to_bytes()).unwrap_err().to_string();
        assert!(text.contains("\\x1b[31m/x"), "{text}");
        assert!(!text.contains('\x1b'), "{text}");
    }

    #[test]
    fn reads_at_any_offset_find_their_pieces() {
        let r = |offset, len| ContentRef {
            blob: BlobId([offset as u8; 32]),
            offset,
            len,
        };
        let content = [r(5, 10), r(0, 0), r(100, 4), r(7, 6)];
        let index = ContentIndex::new(&content);
        assert_eq!(index.len(), 20);
        let p = |part, a, b| Piece {
            part,
            blob_range: a..b,
        };
        assert_eq!(
            index.pieces(&content, 0, 20),
            [p(0, 5, 15), p(2, 100, 104), p(3, 7, 13)]
        );
        assert_eq!(index.pieces(&content, 9, 3), [p(0, 14, 15), p(2, 100, 102)]);
        assert_eq!(index.pieces(&content, 18, 100), [p(3, 11, 13)]);
        assert_eq!(index.pieces(&content, 20, 1), []);
        assert_eq!(index.pieces(&content, u64::MAX, u64::MAX), []);
        assert_eq!(index.pieces(&content[..1], 0, 20), [p(0, 5, 15)]);
    }

    #[test]
    fn unsafe_names_are_recognised() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0"] {
            assert!(!is_safe_name(bad), "{bad:?}");
        }
        assert!(is_safe_name(b"..."));
        assert!(is_safe_name(b".hidden"));
    }
}

//! `find`: entries matching name or path globs and size, time and type filters, across
//! snapshots. Reads trees only. The matches under a tree are remembered by tree id, so a
//! tree that many snapshots share is read and matched once: 1,000 snapshots of an
//! unchanged directory cost about as much as one.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::id::{BlobId, SnapshotId};
use crate::ops::select;
use crate::repo::Repository;
use crate::snapshot::{Snapshot, SnapshotFilter};
use crate::tree::{Node, NodeKind, Time};

/// A file size condition, as find(1) writes it: `+N`, `-N`, `=N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeFilter {
    Larger(u64),
    Smaller(u64),
    Exactly(u64),
}

/// What to look for. Plain data: the CLI fills it from its flags.
#[derive(Debug, Clone, Default)]
pub struct FindOptions {
    /// Globs; an entry matches if any does. With a `/`, a glob matches the absolute path
    /// (`*` stays within a name, `**` spans names; one not starting with `/` or `*` may
    /// start at any directory); without, it matches the name.
    pub patterns: Vec<String>,
    /// Snapshots to search (`latest`, ids, prefixes); empty: all of them.
    pub snapshots: Vec<String>,
    /// Which snapshots "all of them" and `latest` mean.
    pub filter: SnapshotFilter,
    /// Applies to regular files only; other entries never match it.
    pub size: Option<SizeFilter>,
    /// Modified strictly after this time.
    pub newer: Option<Time>,
    /// Modified strictly before this time.
    pub older: Option<Time>,
    /// Type names ([`NodeKind::name`]); empty: any type.
    pub types: Vec<String>,
}

/// One matching entry of one snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    pub snapshot: SnapshotId,
    pub snapshot_time: jiff::Timestamp,
    /// Absolute path as in the snapshot (lossy UTF-8 for names that are not).
    pub path: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// File size; 0 for other types.
    pub size: u64,
    pub mtime: Option<jiff::Timestamp>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct FindStats {
    pub snapshots: u64,
    /// Trees read from the repository.
    pub trees_read: u64,
    /// Trees whose matches were already known from another snapshot (or place).
    pub trees_reused: u64,
}

#[derive(Debug, Default)]
pub struct FindReport {
    /// By snapshot (oldest first), then path.
    pub matches: Vec<Found>,
    pub stats: FindStats,
    /// Snapshot files that could not be read when searching all of them.
    pub damaged: Vec<(SnapshotId, Error)>,
}

/// A match below some tree, with its path relative to that tree.
#[derive(Debug, Clone)]
struct RelMatch {
    rel: Vec<u8>,
    kind: &'static str,
    size: u64,
    mtime: Time,
}

/// Searches the snapshots of `opts` (all by default).
pub fn find(repo: &Repository, opts: &FindOptions) -> Result<FindReport> {
    let matcher = Matcher::new(opts)?;
    let mut report = FindReport::default();
    let snapshots: Vec<(SnapshotId, Snapshot)> = if opts.snapshots.is_empty() {
        let list = select::snapshots(repo, &opts.filter)?;
        report.damaged = list.damaged;
        list.snapshots
    } else {
        let mut chosen = Vec::new();
        for spec in &opts.snapshots {
            let found = select::find_snapshot(repo, spec, &opts.filter)?;
            if !chosen.iter().any(|(id, _)| *id == found.0) {
                chosen.push(found);
            }
        }
        chosen.sort_by_key(|(id, s): &(SnapshotId, Snapshot)| (s.time, *id));
        chosen
    };
    let mut finder = Finder {
        repo,
        matcher: &matcher,
        memo: HashMap::new(),
        stats: FindStats::default(),
    };
    for (id, snapshot) in &snapshots {
        finder.stats.snapshots += 1;
        for m in finder.under(&snapshot.tree, b"")?.iter() {
            let mut path = b"/".to_vec();
            path.extend_from_slice(&m.rel);
            report.matches.push(Found {
                snapshot: *id,
                snapshot_time: snapshot.time,
                path: String::from_utf8_lossy(&path).into_owned(),
                kind: m.kind,
                size: m.size,
                mtime: m.mtime.to_timestamp(),
            });
        }
    }
    report.stats = finder.stats;
    Ok(report)
}

struct Finder<'a> {
    repo: &'a Repository,
    matcher: &'a Matcher,
    /// Keyed by tree id, plus the tree's path when a pattern looks at paths: the same
    /// tree at another place may then match differently.
    memo: HashMap<(BlobId, Vec<u8>), Arc<Vec<RelMatch>>>,
    stats: FindStats,
}

impl Finder<'_> {
    /// The matches below tree `id`, whose path in the snapshot is `/` + `prefix`.
    fn under(&mut self, id: &BlobId, prefix: &[u8]) -> Result<Arc<Vec<RelMatch>>> {
        let key = (
            *id,
            if self.matcher.uses_paths {
                prefix.to_vec()
            } else {
                Vec::new()
            },
        );
        if let Some(found) = self.memo.get(&key) {
            self.stats.trees_reused += 1;
            return Ok(found.clone());
        }
        let tree = self.repo.read_tree(id)?;
        self.stats.trees_read += 1;
        let mut out = Vec::new();
        for node in &tree.nodes {
            let mut rel = prefix.to_vec();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(&node.name);
            if self.matcher.matches(&rel, node) {
                out.push(RelMatch {
                    rel: node.name.clone(),
                    kind: node.kind.name(),
                    size: file_size(node).unwrap_or(0),
                    mtime: node.mtime,
                });
            }
            if let NodeKind::Dir { subtree } = &node.kind {
                for m in self.under(subtree, &rel)?.iter() {
                    let mut sub = node.name.clone();
                    sub.push(b'/');
                    sub.extend_from_slice(&m.rel);
                    out.push(RelMatch {
                        rel: sub,
                        ..m.clone()
                    });
                }
            }
        }
        let out = Arc::new(out);
        self.memo.insert(key, out.clone());
        Ok(out)
    }
}

fn file_size(node: &Node) -> Option<u64> {
    match node.kind {
        NodeKind::File { size, .. } => Some(size),
        _ => None,
    }
}

struct Matcher {
    names: GlobSet,
    paths: GlobSet,
    uses_paths: bool,
    size: Option<SizeFilter>,
    newer: Option<Time>,
    older: Option<Time>,
    types: Vec<String>,
}

/// The type names [`NodeKind::name`] gives.
const TYPES: [&str; 7] = [
    "file", "dir", "symlink", "fifo", "socket", "chardev", "blockdev",
];

impl Matcher {
    fn new(opts: &FindOptions) -> Result<Self> {
        if opts.patterns.is_empty() {
            return Err(Error::InvalidInput(
                "find needs at least one pattern ('*' finds everything)".into(),
            ));
        }
        for t in &opts.types {
            if !TYPES.contains(&t.as_str()) {
                return Err(Error::InvalidInput(format!(
                    "Unknown type {t:?}; use one of {}",
                    TYPES.join(", ")
                )));
            }
        }
        let mut names = GlobSetBuilder::new();
        let mut paths = GlobSetBuilder::new();
        let mut uses_paths = false;
        for raw in &opts.patterns {
            let with_path = raw.contains('/');
            // A relative path pattern (`src/*.rs`) means that path below any directory.
            let pattern = if with_path && !raw.starts_with('/') && !raw.starts_with("**") {
                format!("**/{raw}")
            } else {
                raw.clone()
            };
            let glob = GlobBuilder::new(&pattern)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| Error::BadPattern {
                    pattern: raw.clone(),
                    reason: e.kind().to_string(),
                })?;
            if with_path {
                uses_paths = true;
                paths.add(glob);
            } else {
                names.add(glob);
            }
        }
        let build = |b: GlobSetBuilder| {
            b.build().map_err(|e| Error::BadPattern {
                pattern: opts.patterns.join(" "),
                reason: e.to_string(),
            })
        };
        Ok(Matcher {
            names: build(names)?,
            paths: build(paths)?,
            uses_paths,
            size: opts.size,
            newer: opts.newer,
            older: opts.older,
            types: opts.types.clone(),
        })
    }

    /// Whether `node`, at `/` + `rel` in its snapshot, matches.
    fn matches(&self, rel: &[u8], node: &Node) -> bool {
        if !self.types.is_empty() && !self.types.iter().any(|t| t == node.kind.name()) {
            return false;
        }
        if let Some(filter) = self.size {
            let Some(size) = file_size(node) else {
                return false;
            };
            let ok = match filter {
                SizeFilter::Larger(n) => size > n,
                SizeFilter::Smaller(n) => size < n,
                SizeFilter::Exactly(n) => size == n,
            };
            if !ok {
                return false;
            }
        }
        if self.newer.is_some_and(|t| node.mtime <= t)
            || self.older.is_some_and(|t| node.mtime >= t)
        {
            return false;
        }
        if self
            .names
            .is_match(Path::new(OsStr::from_bytes(&node.name)))
        {
            return true;
        }
        if self.uses_paths {
            let mut abs = b"/".to_vec();
            abs.extend_from_slice(rel);
            return self.paths.is_match(Path::new(OsStr::from_bytes(&abs)));
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, kind: NodeKind, mtime: i64) -> Node {
        Node {
            name: name.as_bytes().to_vec(),
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            user: None,
            group: None,
            mtime: Time {
                sec: mtime,
                nsec: 0,
            },
            ctime: Time::default(),
            inode: 0,
            device: 0,
            links: 1,
            xattrs: Vec::new(),
        }
    }

    fn file(name: &str, size: u64, mtime: i64) -> Node {
        node(
            name,
            NodeKind::File {
                size,
                content: Vec::new(),
            },
            mtime,
        )
    }

    fn matcher(patterns: &[&str], f: impl FnOnce(&mut FindOptions)) -> Matcher {
        let mut opts = FindOptions {
            patterns: patterns.iter().map(|p| p.to_string()).collect(),
            ..FindOptions::default()
        };
        f(&mut opts);
        Matcher::new(&opts).unwrap()
    }

    #[test]
    fn names_and_paths_match_as_documented() {
        let m = matcher(&["*.rs"], |_| {});
        assert!(m.matches(b"a/b/main.rs", &file("main.rs", 1, 0)));
        assert!(!m.matches(b"a/main.rs.bak", &file("main.rs.bak", 1, 0)));
        let m = matcher(&["src/*.rs"], |_| {});
        assert!(m.matches(b"home/u/src/main.rs", &file("main.rs", 1, 0)));
        assert!(!m.matches(b"home/u/src/x/main.rs", &file("main.rs", 1, 0)));
        let m = matcher(&["/home/*/notes.txt"], |_| {});
        assert!(m.matches(b"home/u/notes.txt", &file("notes.txt", 1, 0)));
        assert!(!m.matches(b"srv/home/u/notes.txt", &file("notes.txt", 1, 0)));
    }

    #[test]
    fn filters_combine_with_patterns() {
        let m = matcher(&["*"], |o| {
            o.size = Some(SizeFilter::Larger(10));
            o.newer = Some(Time { sec: 100, nsec: 0 });
            o.older = Some(Time { sec: 200, nsec: 0 });
        });
        assert!(m.matches(b"f", &file("f", 11, 150)));
        assert!(!m.matches(b"f", &file("f", 10, 150)));
        assert!(!m.matches(b"f", &file("f", 11, 100)));
        assert!(!m.matches(b"f", &file("f", 11, 200)));
        let dir = node(
            "d",
            NodeKind::Dir {
                subtree: BlobId([0; 32]),
            },
            150,
        );
        assert!(!m.matches(b"d", &dir), "a size filter takes files only");
        let m = matcher(&["*"], |o| o.types = vec!["dir".into()]);
        assert!(m.matches(b"d", &dir));
        assert!(!m.matches(b"f", &file("f", 1, 0)));
    }

    #[test]
    fn a_pattern_that_does_not_parse_is_named() {
        let opts = FindOptions {
            patterns: vec!["ok".into(), "a[b".into()],
            ..FindOptions::default()
        };
        match Matcher::new(&opts) {
            Err(e @ Error::BadPattern { .. }) => assert!(e.to_string().contains("\"a[b\"")),
            other => panic!("a BadPattern error, got {:?}", other.err()),
        }
    }
}

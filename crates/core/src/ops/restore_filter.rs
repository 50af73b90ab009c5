//! `restore --include/--exclude`: which paths of a snapshot a restore selects. Patterns
//! read as backup's `--exclude` does: one without `/` matches a name anywhere, one with
//! `/` the absolute path in the snapshot (`*` within a component, `**` across). An
//! excluded directory is skipped whole; an included directory brings everything below
//! it; an included file brings the directories above it.
//!
//! A pattern that selects nothing is an error found before anything is written, since
//! a typo would otherwise restore nothing (or everything) without a word.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use globset::{GlobBuilder, GlobMatcher};

use crate::error::{Error, Result};
use crate::id::BlobId;
use crate::repo::Repository;
use crate::tree::{Node, NodeKind};

/// What the filter makes of one entry of the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// Not restored (and, for a directory, nothing below it).
    Skip,
    /// Restored with everything below it.
    All,
    /// A directory that is not selected itself but may hold selected entries: it is
    /// created only if one of them is.
    Search,
}

struct Pattern {
    raw: String,
    glob: GlobMatcher,
    on_path: bool,
}

impl Pattern {
    fn matches(&self, path: &[u8]) -> bool {
        if self.on_path {
            self.glob.is_match(Path::new(OsStr::from_bytes(path)))
        } else {
            let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
            self.glob.is_match(Path::new(OsStr::from_bytes(name)))
        }
    }
}

/// Compiled `--include` and `--exclude` patterns.
#[derive(Default)]
pub struct RestoreFilter {
    includes: Vec<Pattern>,
    excludes: Vec<Pattern>,
}

fn compile(raw: &[String], what: &str) -> Result<Vec<Pattern>> {
    let mut out = Vec::new();
    for r in raw {
        let pattern = r.trim_end_matches('/');
        if pattern.is_empty() {
            return Err(Error::InvalidInput(format!(
                "{what} pattern {r:?} is empty; give a name or a path"
            )));
        }
        let glob = GlobBuilder::new(pattern)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| Error::InvalidInput(format!("{what} pattern {r:?} does not parse: {e}")))?
            .compile_matcher();
        out.push(Pattern {
            raw: r.clone(),
            glob,
            on_path: pattern.contains('/'),
        });
    }
    Ok(out)
}

impl RestoreFilter {
    /// Compiles the patterns; an error names the one that does not parse.
    pub fn new(includes: &[String], excludes: &[String]) -> Result<Self> {
        Ok(RestoreFilter {
            includes: compile(includes, "Include")?,
            excludes: compile(excludes, "Exclude")?,
        })
    }

    /// Whether the filter selects everything.
    pub fn is_empty(&self) -> bool {
        self.includes.is_empty() && self.excludes.is_empty()
    }

    /// The selection of the entry at snapshot path `path`, whose parent's selection was
    /// `All` (`inside = true`) or `Search`.
    pub fn select(&self, path: &[u8], is_dir: bool, inside: bool) -> Selection {
        if self.excludes.iter().any(|p| p.matches(path)) {
            Selection::Skip
        } else if inside
            || self.includes.is_empty()
            || self.includes.iter().any(|p| p.matches(path))
        {
            Selection::All
        } else if is_dir {
            Selection::Search
        } else {
            Selection::Skip
        }
    }

    /// Fails, naming them, if some patterns match nothing below `start` (the node at
    /// snapshot path `start_path`, or the tree `root` when the whole snapshot is
    /// restored). Excluded directories are not looked into. Unreadable trees are passed
    /// over here: the restore itself reports them.
    pub fn check_all_match(
        &self,
        repo: &Repository,
        root: Option<&BlobId>,
        start: Option<(&Node, &[u8])>,
    ) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        let mut seen_inc = vec![false; self.includes.len()];
        let mut seen_exc = vec![false; self.excludes.len()];
        let mut visit = |path: &[u8]| -> bool {
            let mut excluded = false;
            for (i, p) in self.excludes.iter().enumerate() {
                if p.matches(path) {
                    seen_exc[i] = true;
                    excluded = true;
                }
            }
            if !excluded {
                for (i, p) in self.includes.iter().enumerate() {
                    seen_inc[i] |= p.matches(path);
                }
            }
            !excluded
        };
        match (root, start) {
            (Some(tree), _) => walk(repo, tree, b"", &mut visit),
            (None, Some((node, path))) => {
                if visit(path) {
                    if let NodeKind::Dir { subtree } = &node.kind {
                        walk(repo, subtree, path, &mut visit);
                    }
                }
            }
            (None, None) => {}
        }
        let unmatched: Vec<String> = self
            .includes
            .iter()
            .zip(&seen_inc)
            .chain(self.excludes.iter().zip(&seen_exc))
            .filter(|(_, seen)| !**seen)
            .map(|(p, _)| format!("{:?}", p.raw))
            .collect();
        if unmatched.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidInput(format!(
                "Restore filter {} matches nothing in the snapshot; nothing was restored \
                 (`cairn ls` shows what is there)",
                unmatched.join(", ")
            )))
        }
    }
}

/// Calls `visit` on every path below `tree`; descends into a directory when it says so.
fn walk(repo: &Repository, tree: &BlobId, prefix: &[u8], visit: &mut dyn FnMut(&[u8]) -> bool) {
    let Ok(tree) = repo.read_tree(tree) else {
        return;
    };
    for node in &tree.nodes {
        let path = child_path(prefix, &node.name);
        if visit(&path) {
            if let NodeKind::Dir { subtree } = &node.kind {
                walk(repo, subtree, &path, visit);
            }
        }
    }
}

/// `prefix/name` as a snapshot path (`/name` at the root).
pub fn child_path(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(prefix.len() + name.len() + 1);
    path.extend_from_slice(prefix);
    if path.last() != Some(&b'/') {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(inc: &[&str], exc: &[&str]) -> RestoreFilter {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        RestoreFilter::new(&s(inc), &s(exc)).unwrap()
    }

    #[test]
    fn excludes_win_and_includes_select_directories_whole() {
        let filter = f(&["/home/me/docs", "*.txt"], &["*.tmp"]);
        assert_eq!(filter.select(b"/home", true, false), Selection::Search);
        assert_eq!(filter.select(b"/home/me/docs", true, false), Selection::All);
        assert_eq!(
            filter.select(b"/home/me/a.txt", false, false),
            Selection::All
        );
        assert_eq!(
            filter.select(b"/home/me/docs/x.tmp", false, true),
            Selection::Skip
        );
        assert_eq!(
            filter.select(b"/home/me/other", false, false),
            Selection::Skip
        );
    }

    #[test]
    fn bad_and_empty_patterns_are_errors_naming_them() {
        let e = RestoreFilter::new(&["[z-a]".into()], &[]).err().unwrap();
        assert!(e.to_string().contains("[z-a]"), "{e}");
        assert!(RestoreFilter::new(&[], &["/".into()]).is_err());
    }
}

//! `--exclude` patterns, with restic's meaning: a pattern without `/` matches a file or
//! directory name anywhere in the tree; one with `/` matches the end of the absolute path
//! (`py/test` excludes `/data/py/test`), unless it starts with `/`, which anchors it at
//! the root. `*` stays within one component and `**` spans several. An excluded
//! directory is left out whole.
//!
//! Each pattern remembers whether it matched anything, so that a backup can warn about
//! a pattern that left nothing out (a typo, or a path written for another tree).

use std::ffi::OsString;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::ops::ignore_files::{self, IgnoreStack};

/// What a walk of live files leaves out: backup's options, which `diff` with a live
/// directory applies too, so that it shows what the next backup would store.
#[derive(Debug, Clone, Default)]
pub struct ExcludeOptions {
    /// `--exclude` patterns (see the module's description).
    pub excludes: Vec<String>,
    /// `--iexclude` patterns: the same, matched without regard to case.
    pub iexcludes: Vec<String>,
    /// Names of per-directory ignore files in gitignore syntax, in increasing precedence
    /// (the CLI passes `.gitignore` with `--git-ignore`, then `.cairnignore`).
    pub ignore_files: Vec<OsString>,
    /// Leave out a directory that holds a file of one of these names.
    pub exclude_if_present: Vec<OsString>,
    /// Leave out directories tagged with a valid `CACHEDIR.TAG`.
    pub exclude_caches: bool,
    /// Leave out files larger than this many bytes.
    pub exclude_larger_than: Option<u64>,
}

/// Why a walk of live files left a path out: what `backup -vv` prints beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum ExcludeReason {
    /// An `--exclude` or `--iexclude` pattern, as typed.
    Pattern { pattern: String },
    /// A line of a per-directory ignore file.
    IgnoreFile { file: PathBuf, pattern: String },
    /// The directory holds a file named by `--exclude-if-present`.
    IfPresent { file: String },
    /// The directory holds a `CACHEDIR.TAG` (`--exclude-caches`).
    CacheTag,
    /// Larger than `--exclude-larger-than`.
    TooLarge {
        #[serde(rename = "size_bytes")]
        size: u64,
        #[serde(rename = "limit_bytes")]
        limit: u64,
    },
    /// On another filesystem (`--one-file-system`).
    OtherFilesystem,
}

impl std::fmt::Display for ExcludeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExcludeReason::Pattern { pattern } => write!(f, "pattern {pattern:?}"),
            ExcludeReason::IgnoreFile { file, pattern } => {
                write!(f, "{pattern:?} in {}", file.display())
            }
            ExcludeReason::IfPresent { file } => write!(f, "holds {file:?}"),
            ExcludeReason::CacheTag => write!(f, "holds a CACHEDIR.TAG"),
            ExcludeReason::TooLarge { size, limit } => {
                write!(f, "{size} bytes, over the limit of {limit}")
            }
            ExcludeReason::OtherFilesystem => write!(f, "on another filesystem"),
        }
    }
}

impl ExcludeOptions {
    /// Why a directory is left out by `exclude_if_present` or `exclude_caches`, if it is.
    pub fn tagged_dir(&self, dir: &Path) -> Option<ExcludeReason> {
        if let Some(name) = self
            .exclude_if_present
            .iter()
            .find(|name| std::fs::symlink_metadata(dir.join(name)).is_ok())
        {
            let file = name.to_string_lossy().into_owned();
            return Some(ExcludeReason::IfPresent { file });
        }
        (self.exclude_caches && ignore_files::has_cachedir_tag(dir))
            .then_some(ExcludeReason::CacheTag)
    }

    /// Whether a file of `size` bytes is left out by `exclude_larger_than`.
    pub fn is_too_large(&self, size: u64) -> bool {
        self.exclude_larger_than.is_some_and(|max| size > max)
    }

    /// Why a walk of live files leaves out `path` (whose `lstat` is `md`), if it does:
    /// the one decision that backup, `diff` with a live side and the progress pre-scan
    /// share. `named`: the path is one the user gave, to which patterns and ignore files
    /// do not apply. `root_device`: the device of the walked path, with
    /// `--one-file-system`.
    pub fn why_excluded(
        &self,
        excludes: &Excludes,
        ignores: &IgnoreStack,
        path: &Path,
        md: &Metadata,
        named: bool,
        root_device: Option<u64>,
    ) -> Option<ExcludeReason> {
        if !named {
            if let Some(pattern) = excludes.matching(path) {
                return Some(ExcludeReason::Pattern { pattern });
            }
            if let Some((file, pattern)) = ignores.ignored_by(path, md.is_dir()) {
                return Some(ExcludeReason::IgnoreFile { file, pattern });
            }
        }
        if md.is_file() && self.is_too_large(md.len()) {
            let limit = self.exclude_larger_than.unwrap_or_default();
            return Some(ExcludeReason::TooLarge {
                size: md.len(),
                limit,
            });
        }
        if md.is_dir() {
            if root_device.is_some_and(|dev| dev != md.dev()) {
                return Some(ExcludeReason::OtherFilesystem);
            }
            return self.tagged_dir(path);
        }
        None
    }
}

pub struct Excludes {
    names: GlobSet,
    paths: GlobSet,
    /// The patterns as typed, in the order of `names` then `paths`.
    raw: Vec<String>,
    /// Whether pattern `i` of `raw` matched some path.
    hit: Vec<AtomicBool>,
}

impl Excludes {
    pub fn new(patterns: &[String]) -> Result<Self> {
        Self::with_case(patterns, &[])
    }

    /// The `excludes` and `iexcludes` of `opts`.
    pub fn of(opts: &ExcludeOptions) -> Result<Self> {
        Self::with_case(&opts.excludes, &opts.iexcludes)
    }

    /// `patterns` matched as typed and `ipatterns` without regard to case.
    pub fn with_case(patterns: &[String], ipatterns: &[String]) -> Result<Self> {
        let mut names = (GlobSetBuilder::new(), Vec::new());
        let mut paths = (GlobSetBuilder::new(), Vec::new());
        let all = patterns
            .iter()
            .map(|p| (p, false))
            .chain(ipatterns.iter().map(|p| (p, true)));
        for (raw, insensitive) in all {
            let pattern = raw.trim_end_matches('/');
            if pattern.is_empty() {
                continue;
            }
            // Unanchored: a suffix of the path, any number of components deep.
            let full = match pattern.contains('/') {
                true if !pattern.starts_with('/') && !pattern.starts_with("**/") => {
                    format!("**/{pattern}")
                }
                _ => pattern.to_string(),
            };
            let glob = GlobBuilder::new(&full)
                .literal_separator(true)
                .backslash_escape(true)
                .case_insensitive(insensitive)
                .build()
                .map_err(|e| {
                    Error::InvalidInput(format!("Exclude pattern {raw:?} does not parse: {e}"))
                })?;
            let set = if pattern.contains('/') {
                &mut paths
            } else {
                &mut names
            };
            set.0.add(glob);
            set.1.push(raw.clone());
        }
        let build = |b: GlobSetBuilder| {
            b.build()
                .map_err(|e| Error::InvalidInput(format!("Exclude patterns do not parse: {e}")))
        };
        let raw: Vec<String> = names.1.into_iter().chain(paths.1).collect();
        Ok(Excludes {
            names: build(names.0)?,
            paths: build(paths.0)?,
            hit: raw.iter().map(|_| AtomicBool::new(false)).collect(),
            raw,
        })
    }

    /// Reads patterns from an exclude file: one per line, `#` starts a comment line.
    pub fn read_file(path: &Path) -> Result<Vec<String>> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Ok(text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(String::from)
            .collect())
    }

    pub fn matches(&self, path: &Path) -> bool {
        self.matching(path).is_some()
    }

    /// The first pattern, as typed, that matches `path`. Every matching pattern is
    /// marked as having matched.
    pub fn matching(&self, path: &Path) -> Option<String> {
        // Checked first: taking the file name parses the path, for every entry walked.
        if self.raw.is_empty() {
            return None;
        }
        let mark = |found: Vec<usize>, offset: usize| {
            for i in &found {
                self.hit[offset + i].store(true, Ordering::Relaxed);
            }
            found.first().map(|i| offset + i)
        };
        let by_name = path
            .file_name()
            .and_then(|n| mark(self.names.matches(n), 0));
        let by_path = mark(self.paths.matches(path), self.names.len());
        by_name.or(by_path).map(|i| self.raw[i].clone())
    }

    /// The patterns that have matched nothing so far, as typed.
    pub fn unmatched(&self) -> Vec<String> {
        self.raw
            .iter()
            .zip(&self.hit)
            .filter(|(_, hit)| !hit.load(Ordering::Relaxed))
            .map(|(raw, _)| raw.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(p: &[&str]) -> Excludes {
        Excludes::new(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn name_patterns_match_anywhere() {
        let e = ex(&["*.o", "target"]);
        assert!(e.matches(Path::new("/src/a/b.o")));
        assert!(e.matches(Path::new("/src/target")));
        assert!(!e.matches(Path::new("/src/target.rs")));
    }

    #[test]
    fn anchored_path_patterns_match_the_absolute_path() {
        let e = ex(&["/home/*/cache", "/srv/**/tmp"]);
        assert!(e.matches(Path::new("/home/u/cache")));
        assert!(!e.matches(Path::new("/home/u/x/cache")));
        assert!(e.matches(Path::new("/srv/a/b/tmp")));
        assert!(!e.matches(Path::new("/x/home/u/cache")));
    }

    #[test]
    fn unanchored_path_patterns_match_a_suffix_of_the_path() {
        let e = ex(&["py/test", "man/*/man1"]);
        assert!(e.matches(Path::new("/data/py/test")));
        assert!(e.matches(Path::new("/a/b/man/en/man1")));
        assert!(!e.matches(Path::new("/data/py/test2")));
        assert!(!e.matches(Path::new("/data/xpy/test")));
        assert!(!e.matches(Path::new("/a/man/en/x/man1")));
    }

    #[test]
    fn patterns_that_matched_nothing_are_reported() {
        let e = ex(&["*.o", "py/test", "nothing"]);
        assert!(e.matches(Path::new("/data/py/test")));
        assert_eq!(e.unmatched(), ["*.o", "nothing"]);
    }

    #[test]
    fn insensitive_patterns_ignore_case_and_say_which_pattern_matched() {
        let e =
            Excludes::with_case(&["*.o".into()], &["*.JPG".into(), "Cache/TMP".into()]).unwrap();
        assert_eq!(e.matching(Path::new("/a/b.jpg")).as_deref(), Some("*.JPG"));
        assert!(e.matches(Path::new("/a/cache/tmp")));
        assert!(!e.matches(Path::new("/a/B.O")));
        assert_eq!(e.matching(Path::new("/a/b.o")).as_deref(), Some("*.o"));
    }

    #[test]
    fn bad_patterns_are_errors() {
        assert!(Excludes::new(&["[".to_string()]).is_err());
    }
}

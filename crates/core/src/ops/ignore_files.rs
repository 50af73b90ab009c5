//! Per-directory ignore files (`.cairnignore`, and `.gitignore` with `--git-ignore`) and
//! the directory markers of `--exclude-if-present` and `--exclude-caches`.
//!
//! The syntax and its meaning are git's, through the `ignore` crate's `gitignore` module:
//! patterns are relative to the directory holding the file, `!` re-includes, `dir/`
//! matches directories only, `**` spans directories, and a deeper file overrides a
//! shallower one. A matcher is built once per directory that holds an ignore file, never
//! per entry, so a walk pays only for the directories that have one.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::Match;

use crate::error::{Error, Result};

/// The first line of a valid `CACHEDIR.TAG` (https://bford.info/cachedir/).
pub const CACHEDIR_SIGNATURE: &[u8] = b"Signature: 8a477f597d28d172789f06886806bc55";

/// The name of the cache directory tag file.
pub const CACHEDIR_TAG: &str = "CACHEDIR.TAG";

/// Ignore matchers of the directories from the walk's top down to the current one; only
/// directories that hold an ignore file have a level.
#[derive(Default)]
pub struct IgnoreStack {
    levels: Vec<Gitignore>,
}

impl IgnoreStack {
    /// Adds the matcher of `dir`, built from the files among `names` that `present`
    /// says exist there, in order, so that a later file's patterns win over an earlier
    /// one's. Returns whether a level was pushed (pop it when leaving `dir`), and the
    /// ignore files that could not be read (not fatal: more is backed up, not less). A
    /// pattern that does not parse is an error naming the file and line.
    pub fn push_dir(
        &mut self,
        dir: &Path,
        names: &[OsString],
        present: impl Fn(&OsStr) -> bool,
    ) -> Result<(bool, Vec<(PathBuf, io::Error)>)> {
        let mut builder: Option<GitignoreBuilder> = None;
        let mut unreadable = Vec::new();
        for name in names.iter().filter(|n| present(n)) {
            let file = dir.join(name);
            let text = match std::fs::read(&file) {
                Ok(t) => t,
                Err(e) => {
                    unreadable.push((file, e));
                    continue;
                }
            };
            let b = builder.get_or_insert_with(|| GitignoreBuilder::new(dir));
            add_lines(b, &file, &text)?;
        }
        let Some(builder) = builder else {
            return Ok((false, unreadable));
        };
        let matcher = builder.build().map_err(|e| {
            Error::InvalidInput(format!(
                "Ignore files in {} do not parse: {e}",
                dir.display()
            ))
        })?;
        self.levels.push(matcher);
        Ok((true, unreadable))
    }

    /// Removes the level `push_dir` added.
    pub fn pop(&mut self) {
        self.levels.pop();
    }

    /// Whether `path` (absolute, below every level's directory) is ignored: the deepest
    /// level with a matching pattern decides, as in git.
    pub fn is_ignored(&self, path: &Path, is_dir: bool) -> bool {
        self.ignored_by(path, is_dir).is_some()
    }

    /// The ignore file and pattern that leave `path` out, if any (see `is_ignored`).
    pub fn ignored_by(&self, path: &Path, is_dir: bool) -> Option<(PathBuf, String)> {
        for level in self.levels.iter().rev() {
            match level.matched(path, is_dir) {
                Match::Ignore(glob) => {
                    let file = glob.from().map(Path::to_path_buf).unwrap_or_default();
                    return Some((file, glob.original().to_string()));
                }
                Match::Whitelist(_) => return None,
                Match::None => {}
            }
        }
        None
    }
}

/// Adds each line of an ignore file, so that an error can name the file, the line and
/// the pattern. Lines are decoded lossily: git itself treats them as bytes. As in git,
/// an unclosed `[` is taken literally; a reversed range (`[z-a]`) or an unclosed `{` is
/// an error.
fn add_lines(builder: &mut GitignoreBuilder, file: &Path, text: &[u8]) -> Result<()> {
    let text = String::from_utf8_lossy(text);
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    for (i, line) in text.lines().enumerate() {
        if let Err(e) = builder.add_line(Some(file.to_path_buf()), line) {
            let reason = match e {
                ignore::Error::Glob { err, .. } => err,
                other => other.to_string(),
            };
            return Err(Error::IgnorePattern {
                file: file.to_path_buf(),
                line: i as u64 + 1,
                pattern: line.to_string(),
                reason,
            });
        }
    }
    Ok(())
}

/// Whether `dir` holds a `CACHEDIR.TAG` that starts with the standard signature; a tag
/// with any other content does not exclude (the spec's guard against accidents).
pub fn has_cachedir_tag(dir: &Path) -> bool {
    let Ok(file) = File::open(dir.join(CACHEDIR_TAG)) else {
        return false;
    };
    let mut head = Vec::with_capacity(CACHEDIR_SIGNATURE.len());
    match file
        .take(CACHEDIR_SIGNATURE.len() as u64)
        .read_to_end(&mut head)
    {
        Ok(_) => head == CACHEDIR_SIGNATURE,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack_with(dir: &Path, text: &str) -> IgnoreStack {
        std::fs::write(dir.join(".cairnignore"), text).unwrap();
        let mut s = IgnoreStack::default();
        let names = [OsString::from(".cairnignore")];
        let (pushed, bad) = s.push_dir(dir, &names, |_| true).unwrap();
        assert!(pushed && bad.is_empty());
        s
    }

    #[test]
    fn patterns_are_relative_to_the_directory_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let s = stack_with(d, "/top.txt\n*.log\n!keep.log\nbuild/\ndocs/**/draft\n");
        assert!(s.is_ignored(&d.join("top.txt"), false));
        assert!(!s.is_ignored(&d.join("sub/top.txt"), false));
        assert!(s.is_ignored(&d.join("sub/a.log"), false));
        assert!(!s.is_ignored(&d.join("sub/keep.log"), false));
        assert!(s.is_ignored(&d.join("x/build"), true));
        assert!(!s.is_ignored(&d.join("x/build"), false));
        assert!(s.is_ignored(&d.join("docs/a/b/draft"), false));
    }

    #[test]
    fn a_bad_pattern_names_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".cairnignore"), "ok\n[z-a].txt\n").unwrap();
        let err = IgnoreStack::default()
            .push_dir(dir.path(), &[OsString::from(".cairnignore")], |_| true)
            .err()
            .unwrap();
        let msg = err.to_string();
        assert!(msg.contains("[z-a].txt") && msg.contains("line 2"), "{msg}");
    }

    #[test]
    fn only_a_signed_cachedir_tag_counts() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!has_cachedir_tag(dir.path()));
        std::fs::write(dir.path().join(CACHEDIR_TAG), b"Signature: wrong").unwrap();
        assert!(!has_cachedir_tag(dir.path()));
        let mut good = CACHEDIR_SIGNATURE.to_vec();
        good.extend_from_slice(b"\n# made by a test\n");
        std::fs::write(dir.path().join(CACHEDIR_TAG), good).unwrap();
        assert!(has_cachedir_tag(dir.path()));
    }
}

//! `--exclude` patterns, as restic users write them: a pattern without `/` matches a file
//! or directory name anywhere in the tree; one with `/` matches the absolute path, where
//! `*` stays within one component and `**` spans several.

use std::path::Path;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::error::{Error, Result};

pub struct Excludes {
    names: GlobSet,
    paths: GlobSet,
}

impl Excludes {
    pub fn new(patterns: &[String]) -> Result<Self> {
        let mut names = GlobSetBuilder::new();
        let mut paths = GlobSetBuilder::new();
        for raw in patterns {
            let pattern = raw.trim_end_matches('/');
            if pattern.is_empty() {
                continue;
            }
            let glob = GlobBuilder::new(pattern)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| {
                    Error::InvalidInput(format!("Exclude pattern {raw:?} does not parse: {e}"))
                })?;
            if pattern.contains('/') {
                paths.add(glob);
            } else {
                names.add(glob);
            }
        }
        let build = |b: GlobSetBuilder| {
            b.build()
                .map_err(|e| Error::InvalidInput(format!("Exclude patterns do not parse: {e}")))
        };
        Ok(Excludes {
            names: build(names)?,
            paths: build(paths)?,
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
        // Checked first: taking the file name parses the path, for every entry walked.
        if self.names.is_empty() && self.paths.is_empty() {
            return false;
        }
        path.file_name().is_some_and(|n| self.names.is_match(n)) || self.paths.is_match(path)
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
    fn path_patterns_match_the_absolute_path() {
        let e = ex(&["/home/*/cache", "/srv/**/tmp"]);
        assert!(e.matches(Path::new("/home/u/cache")));
        assert!(!e.matches(Path::new("/home/u/x/cache")));
        assert!(e.matches(Path::new("/srv/a/b/tmp")));
    }

    #[test]
    fn bad_patterns_are_errors() {
        assert!(Excludes::new(&["[".to_string()]).is_err());
    }
}

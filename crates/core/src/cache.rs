//! A local cache of the small, often-read parts of a remote repository: index files,
//! snapshot files and tree blobs, so that `snapshots`, `ls` and an incremental backup do
//! not download them again.
//!
//! Entries are kept exactly as the repository stores them (encrypted), so the cache holds
//! nothing readable without the key. Every entry is checked when read: index and snapshot
//! files against their names (the hash of their bytes), tree blobs by decryption and their
//! id. A bad entry is dropped and the repository read instead, so a damaged cache can
//! cost a download but never gives a wrong answer or blames the repository.
//!
//! Layout: `BASE/<repository id>/{index,snapshots}/<name>` and `.../trees/<blob id>`, and
//! `BASE/CACHEDIR.TAG` so that backup tools skip it. Writes are temp file + rename, so
//! several cairn processes can share a cache. Everything here is best effort: a cache
//! that cannot be written is a slower run, not a failed one.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The cache directory of one repository.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
}

const CACHEDIR_TAG: &str = "Signature: 8a477f597d28d172789f06886806bc55\n\
    # This file is a cache directory tag created by cairn.\n\
    # For information about cache directory tags see https://bford.info/cachedir/\n";

impl Cache {
    /// The cache of repository `repo_id` under `base` (e.g. `~/.cache/cairn`), created
    /// if missing.
    pub fn open(base: &Path, repo_id: &str) -> std::io::Result<Cache> {
        let valid = !repo_id.is_empty() && repo_id.bytes().all(|b| b.is_ascii_alphanumeric());
        if !valid {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("repository id {repo_id:?} cannot name a cache directory"),
            ));
        }
        let dir = base.join(repo_id);
        std::fs::create_dir_all(&dir)?;
        let tag = base.join("CACHEDIR.TAG");
        if !tag.exists() {
            write_atomic(&tag, CACHEDIR_TAG.as_bytes())?;
        }
        Ok(Cache { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cached copy of repository file `name` (`index/..` or `snapshots/..`) if it is
    /// whole: its bytes hash to its name.
    pub fn file(&self, name: &str) -> Option<Vec<u8>> {
        let bytes = self.read(name)?;
        let expected = name.rsplit('/').next().unwrap_or(name);
        if blake3::hash(&bytes).to_hex().as_str() == expected {
            Some(bytes)
        } else {
            self.remove(name);
            None
        }
    }

    /// Keeps a copy of a repository file read from storage.
    pub fn put_file(&self, name: &str, bytes: &[u8]) {
        self.put(name, bytes);
    }

    /// Drops cached files of `dir` (`index` or `snapshots`) that are not in `names`, the
    /// repository's current listing: they were removed by forget or prune.
    pub fn retain(&self, dir: &str, names: &[String]) {
        let keep: HashSet<&str> = names.iter().map(String::as_str).collect();
        self.retain_where(dir, |name| keep.contains(name));
    }

    /// The cached sealed bytes of tree blob `id` (hex); the caller verifies them.
    pub fn tree(&self, id: &str) -> Option<Vec<u8>> {
        self.read(&tree_name(id))
    }

    pub fn put_tree(&self, id: &str, sealed: &[u8]) {
        self.put(&tree_name(id), sealed);
    }

    pub fn remove_tree(&self, id: &str) {
        self.remove(&tree_name(id));
    }

    /// Drops cached trees for which `keep(hex id)` is false (blobs prune removed).
    pub fn retain_trees(&self, keep: impl Fn(&str) -> bool) {
        self.retain_where("trees", |name| {
            keep(name.rsplit('/').next().unwrap_or(name))
        });
    }

    fn read(&self, name: &str) -> Option<Vec<u8>> {
        std::fs::read(self.dir.join(name)).ok()
    }

    fn put(&self, name: &str, bytes: &[u8]) {
        let path = self.dir.join(name);
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let _ = write_atomic(&path, bytes);
    }

    fn remove(&self, name: &str) {
        let _ = std::fs::remove_file(self.dir.join(name));
    }

    /// Removes the files below `dir` whose repository name fails `keep`.
    fn retain_where(&self, dir: &str, keep: impl Fn(&str) -> bool) {
        let mut stack = vec![self.dir.join(dir)];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(path);
                    continue;
                }
                let name = path
                    .strip_prefix(&self.dir)
                    .ok()
                    .and_then(|p| p.to_str())
                    .map(str::to_string);
                match name {
                    // Temporary files of writers that died.
                    Some(n) if n.contains("/.tmp-") => {
                        let _ = std::fs::remove_file(&path);
                    }
                    Some(n) if !keep(&n) => {
                        let _ = std::fs::remove_file(&path);
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Trees fan out by the first two hex digits, like packs, to keep directories small.
fn tree_name(id: &str) -> String {
    format!("trees/{}/{id}", id.get(..2).unwrap_or("00"))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(
        ".tmp-{}-{file_name}",
        hex::encode(rand::random::<[u8; 8]>())
    ));
    let result = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|_| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_served_only_when_they_match_their_name() {
        let base = tempfile::tempdir().unwrap();
        let cache = Cache::open(base.path(), "abc123").unwrap();
        let bytes = b"sealed snapshot bytes";
        let name = format!("snapshots/{}", blake3::hash(bytes).to_hex());
        assert_eq!(cache.file(&name), None);
        cache.put_file(&name, bytes);
        assert_eq!(cache.file(&name).as_deref(), Some(&bytes[..]));

        // A damaged entry is dropped, not served.
        std::fs::write(cache.dir().join(&name), b"garbage").unwrap();
        assert_eq!(cache.file(&name), None);
        assert!(!cache.dir().join(&name).exists());
        assert!(base.path().join("CACHEDIR.TAG").exists());
    }

    #[test]
    fn retain_drops_what_the_repository_no_longer_lists() {
        let base = tempfile::tempdir().unwrap();
        let cache = Cache::open(base.path(), "r1").unwrap();
        cache.put_file("index/aa", b"1");
        cache.put_file("index/bb", b"2");
        cache.put_tree("ccdd", b"3");
        cache.put_tree("eeff", b"4");
        cache.retain("index", &["index/bb".to_string()]);
        cache.retain_trees(|id| id == "eeff");
        assert!(!cache.dir().join("index/aa").exists());
        assert!(cache.dir().join("index/bb").exists());
        assert_eq!(cache.tree("ccdd"), None);
        assert_eq!(cache.tree("eeff").as_deref(), Some(&b"4"[..]));
    }

    #[test]
    fn ids_that_could_escape_the_cache_are_refused() {
        let base = tempfile::tempdir().unwrap();
        assert!(Cache::open(base.path(), "../x").is_err());
        assert!(Cache::open(base.path(), "").is_err());
    }
}

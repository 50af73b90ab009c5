//! The deletion delay: what a token deletes (sessions aside) is moved to
//! `DIR/.cairn-serve/deleted/REPO/<unix seconds>/NAME` rather than freed, and freed
//! by the server once the delay (default 7 days) has passed. Until then
//! `cairn serve undelete` puts it back, so even a stolen `maintain` token cannot destroy
//! history at once. Held objects count toward their repository's quota until freed, so
//! deleting cannot make room for a thief's uploads either.
//!
//! Moves are renames within DIR's file system; an undelete links each object back
//! (create-only: a name that exists again is left as it is, and its held copy kept).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::access::{create_private_dirs, STATE_DIR};
use crate::state::charged;
use crate::{Error, Result};

pub fn deleted_root(dir: &Path, repo: &str) -> PathBuf {
    dir.join(STATE_DIR).join("deleted").join(repo)
}

fn object_path(root: &Path, name: &str) -> PathBuf {
    name.split('/').fold(root.to_path_buf(), |p, c| p.join(c))
}

/// Moves object `name` of `repo` out of the repository, into the batch of second `now`.
/// Returns its size; [`Error::NotFound`] if it is not there.
pub fn hold(dir: &Path, repo: &str, name: &str, now: u64) -> Result<u64> {
    let from = object_path(&dir.join(repo), name);
    let size = match fs::metadata(&from) {
        Ok(m) if m.is_file() => m.len(),
        Ok(_) => return Err(Error::NotFound(name.to_string())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::NotFound(name.to_string()))
        }
        Err(e) => return Err(Error::io("look up", &from, e)),
    };
    let root = deleted_root(dir, repo);
    let mut to = object_path(&root.join(now.to_string()), name);
    if to.exists() {
        // Deleted twice within a second (deleted, written again, deleted): keep both.
        let batch = format!("{now}-{}", hex::encode(rand::random::<[u8; 4]>()));
        to = object_path(&root.join(batch), name);
    }
    create_private_dirs(to.parent().unwrap_or(&root))?;
    fs::rename(&from, &to).map_err(|e| Error::io("move to the deleted objects", &from, e))?;
    Ok(size)
}

/// One held object.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Held {
    pub name: String,
    /// Seconds since the Unix epoch, by the server's clock.
    pub deleted_at: u64,
    pub size: u64,
}

/// Every held object of `repo`, oldest first.
pub fn list(dir: &Path, repo: &str) -> Result<Vec<Held>> {
    Ok(held_files(dir, repo)?.into_iter().map(|(_, h)| h).collect())
}

/// Every held object of `repo` with the path of its file, oldest first.
pub(crate) fn held_files(dir: &Path, repo: &str) -> Result<Vec<(PathBuf, Held)>> {
    let mut out = Vec::new();
    for (batch, deleted_at) in batches(dir, repo)? {
        let mut files = Vec::new();
        walk(&batch, "", &mut files)?;
        out.extend(files.into_iter().map(|(name, size)| {
            let path = object_path(&batch, &name);
            let held = Held {
                name,
                deleted_at,
                size,
            };
            (path, held)
        }));
    }
    Ok(out)
}

/// Frees the batches of `repo` older than `delay`; returns what they counted for against
/// its quota ([`charged`]).
pub fn expire(dir: &Path, repo: &str, delay: Duration, now: u64) -> Result<u64> {
    let mut freed = 0;
    for (batch, deleted_at) in batches(dir, repo)? {
        if deleted_at.saturating_add(delay.as_secs()) > now {
            continue;
        }
        let mut files = Vec::new();
        walk(&batch, "", &mut files)?;
        fs::remove_dir_all(&batch).map_err(|e| Error::io("free", &batch, e))?;
        freed += files.iter().map(|(_, size)| charged(*size)).sum::<u64>();
    }
    Ok(freed)
}

/// What [`undelete`] did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct UndeleteReport {
    /// Objects put back in place.
    pub restored: Vec<String>,
    /// Objects whose name exists again in the repository; their held copy stays.
    pub present: Vec<String>,
}

/// Puts every held object of `repo` back.
pub fn undelete(dir: &Path, repo: &str) -> Result<UndeleteReport> {
    let mut report = UndeleteReport::default();
    let repo_root = dir.join(repo);
    for (batch, _) in batches(dir, repo)? {
        let mut files = Vec::new();
        walk(&batch, "", &mut files)?;
        for (name, _) in files {
            let from = object_path(&batch, &name);
            let to = object_path(&repo_root, &name);
            create_private_dirs(to.parent().unwrap_or(&repo_root))?;
            match fs::hard_link(&from, &to) {
                Ok(()) => {
                    fs::remove_file(&from).map_err(|e| Error::io("remove", &from, e))?;
                    report.restored.push(name);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => report.present.push(name),
                Err(e) => return Err(Error::io("put back", &to, e)),
            }
        }
        remove_empty_dirs(&batch);
    }
    Ok(report)
}

/// What the objects held for `repo` count for against its quota ([`charged`]).
pub fn held_bytes(dir: &Path, repo: &str) -> Result<u64> {
    Ok(list(dir, repo)?.iter().map(|h| charged(h.size)).sum())
}

/// Batch directories of `repo` with their deletion second, oldest first.
fn batches(dir: &Path, repo: &str) -> Result<Vec<(PathBuf, u64)>> {
    let root = deleted_root(dir, repo);
    let entries = match fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list", &root, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("list", &root, e))?;
        let name = entry.file_name();
        let Some(secs) = name
            .to_str()
            .and_then(|n| n.split('-').next())
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        out.push((entry.path(), secs));
    }
    out.sort_by_key(|(_, secs)| *secs);
    Ok(out)
}

/// Files below `path` as `(relative name, size)`.
fn walk(path: &Path, prefix: &str, out: &mut Vec<(String, u64)>) -> Result<()> {
    let entries = fs::read_dir(path).map_err(|e| Error::io("list", path, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("list", path, e))?;
        let Some(file) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let name = if prefix.is_empty() {
            file
        } else {
            format!("{prefix}/{file}")
        };
        let meta = entry
            .metadata()
            .map_err(|e| Error::io("look up", &entry.path(), e))?;
        if meta.is_dir() {
            walk(&entry.path(), &name, out)?;
        } else if meta.is_file() && cairn_storage::is_valid_name(&name) {
            out.push((name, meta.len()));
        }
    }
    Ok(())
}

fn remove_empty_dirs(path: &Path) {
    if let Ok(entries) = fs::read_dir(path) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_dirs(&entry.path());
            }
        }
    }
    // Fails, as it should, while anything is left in it.
    let _ = fs::remove_dir(path);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_objects_come_back_until_the_delay_has_passed() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        fs::create_dir_all(dir.join("r/index")).unwrap();
        fs::write(dir.join("r/index/a"), b"12345").unwrap();
        assert_eq!(hold(dir, "r", "index/a", 1000).unwrap(), 5);
        assert!(!dir.join("r/index/a").exists());
        // As quotas count it: a block at least.
        assert_eq!(held_bytes(dir, "r").unwrap(), charged(5));
        // Not yet due.
        assert_eq!(expire(dir, "r", Duration::from_secs(60), 1059).unwrap(), 0);
        let report = undelete(dir, "r").unwrap();
        assert_eq!(report.restored, vec!["index/a".to_string()]);
        assert_eq!(fs::read(dir.join("r/index/a")).unwrap(), b"12345");
        assert!(list(dir, "r").unwrap().is_empty());

        hold(dir, "r", "index/a", 2000).unwrap();
        assert_eq!(
            expire(dir, "r", Duration::from_secs(60), 2060).unwrap(),
            charged(5)
        );
        assert!(list(dir, "r").unwrap().is_empty());
        assert!(undelete(dir, "r").unwrap().restored.is_empty());
    }
}

//! `cairn serve scrub`: re-hashes every hash-named object of the served repositories
//! against its name, on the server, with no key: bit rot and tampering on the server's
//! disks show up without a client reading everything back. Objects held by the deletion
//! delay are checked too: they are what `serve undelete` would put back.

use std::fs::File;
use std::path::Path;

use cairn_storage::{LocalStorage, Storage};

use crate::access::valid_repo_name;
use crate::layout::{self, Kind};
use crate::{deleted, Error, Result};

/// What a scrub found.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ScrubReport {
    pub repositories: u64,
    pub objects_checked: u64,
    pub bytes_checked: u64,
    /// `repository/name` of objects whose bytes do not hash to their names; held
    /// (deleted, not yet freed) objects as `repository/name (deleted at SECONDS)`.
    pub damaged: Vec<String>,
    /// Of `objects_checked`, those held by the deletion delay.
    pub held_checked: u64,
    /// `repository/name` of objects outside the layout (written with an admin token),
    /// which have no hash to check.
    pub unchecked: Vec<String>,
}

/// Scrubs `repo`, or every repository in `dir`.
pub fn scrub(dir: &Path, repo: Option<&str>) -> Result<ScrubReport> {
    let repos = match repo {
        Some(repo) => vec![repo.to_string()],
        None => repositories(dir)?,
    };
    let mut report = ScrubReport::default();
    for repo in repos {
        if !valid_repo_name(&repo) || !dir.join(&repo).is_dir() {
            return Err(Error::Invalid(format!(
                "{} holds no repository {repo:?}",
                dir.display()
            )));
        }
        report.repositories += 1;
        let store = LocalStorage::new(dir.join(&repo));
        for name in store.list("")? {
            match layout::classify(&name) {
                Some(Kind::Hashed { hash, .. }) => {
                    let path = store.root().join(&name);
                    let (actual, len) = hash_file(&path)?;
                    report.objects_checked += 1;
                    report.bytes_checked += len;
                    if actual.to_hex().as_str() != hash {
                        report.damaged.push(format!("{repo}/{name}"));
                    }
                }
                Some(Kind::Config) => {}
                None => report.unchecked.push(format!("{repo}/{name}")),
            }
        }
        for (path, held) in deleted::held_files(dir, &repo)? {
            let Some(Kind::Hashed { hash, .. }) = layout::classify(&held.name) else {
                continue;
            };
            let (actual, len) = hash_file(&path)?;
            report.objects_checked += 1;
            report.held_checked += 1;
            report.bytes_checked += len;
            if actual.to_hex().as_str() != hash {
                report.damaged.push(format!(
                    "{repo}/{} (deleted at {})",
                    held.name, held.deleted_at
                ));
            }
        }
    }
    Ok(report)
}

/// The repositories in `dir`, by name.
pub fn repositories(dir: &Path) -> Result<Vec<String>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("list", dir, e))?;
        if let Some(name) = entry.file_name().to_str() {
            if valid_repo_name(name) && entry.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(name.to_string());
            }
        }
    }
    out.sort();
    Ok(out)
}

fn hash_file(path: &Path) -> Result<(blake3::Hash, u64)> {
    let mut file = File::open(path).map_err(|e| Error::io("read", path, e))?;
    let mut hasher = blake3::Hasher::new();
    let len = std::io::copy(&mut file, &mut hasher).map_err(|e| Error::io("read", path, e))?;
    Ok((hasher.finalize(), len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_bit_is_found_without_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStorage::new(dir.path().join("r"));
        let good = b"a pack".to_vec();
        let h = blake3::hash(&good).to_hex().to_string();
        let name = format!("data/{}/{h}", &h[..2]);
        store.write(&name, &good).unwrap();
        store.write("config", b"{}").unwrap();
        let clean = scrub(dir.path(), None).unwrap();
        assert_eq!((clean.objects_checked, clean.damaged.len()), (1, 0));

        let mut bad = good.clone();
        bad[0] ^= 1;
        std::fs::write(store.root().join(&name), &bad).unwrap();
        let found = scrub(dir.path(), Some("r")).unwrap();
        assert_eq!(found.damaged, vec![format!("r/{name}")]);
    }

    #[test]
    fn objects_held_by_the_deletion_delay_are_scrubbed_too() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStorage::new(dir.path().join("r"));
        let bytes = b"an index file".to_vec();
        let h = blake3::hash(&bytes).to_hex().to_string();
        let name = format!("index/{h}");
        store.write(&name, &bytes).unwrap();
        deleted::hold(dir.path(), "r", &name, 1_000).unwrap();
        let clean = scrub(dir.path(), None).unwrap();
        assert_eq!(
            (
                clean.objects_checked,
                clean.held_checked,
                clean.damaged.len()
            ),
            (1, 1, 0)
        );

        let (path, _) = deleted::held_files(dir.path(), "r").unwrap().remove(0);
        std::fs::write(&path, b"rotten").unwrap();
        let found = scrub(dir.path(), None).unwrap();
        assert_eq!(found.damaged, vec![format!("r/{name} (deleted at 1000)")]);
    }
}

//! What a write-only key remembers of its own backups, on the client. It cannot read the
//! repository's index, trees or snapshots (format 3, `docs/FORMAT.md`), so it
//! deduplicates against the packs it stored itself and finds unchanged files through the
//! trees it wrote itself, both kept here:
//!
//! - `BASE/<repository id>/writer/state`: the packs this client's write-only backups
//!   stored (id and blob entries, as index files list them) and the snapshots they made,
//!   with a MAC under a key derived from the id key, so a changed file is noticed;
//! - `.../writer/trees/<blob id>`: the plaintext of each tree it wrote, checked against
//!   its id (the keyed hash) when read.
//!
//! Nothing here is trusted beyond that: packs gone from the storage are forgotten when a
//! backup starts, and a lost or damaged cache costs one backup that reads and uploads
//! everything again, never a wrong snapshot. The trees hold names and metadata of files
//! this machine backs up, so the directory is the user's alone (0700).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::crypto::MasterKey;
use crate::id::{BlobId, SnapshotId};
use crate::index::IndexedPack;
use crate::snapshot::Snapshot;

/// A write-only key's memory of one repository.
#[derive(Debug, Clone)]
pub struct WriterCache {
    dir: PathBuf,
}

/// What [`WriterCache::load`] and [`WriterCache::save`] keep.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct WriterState {
    pub packs: Vec<IndexedPack>,
    /// Each snapshot as its JSON, oldest first.
    pub snapshots: Vec<(SnapshotId, Vec<u8>)>,
}

impl WriterState {
    /// The snapshots, parsed (a damaged one is left out: the cache is rebuilt, not trusted).
    pub fn snapshots(&self) -> Vec<(SnapshotId, Snapshot)> {
        self.snapshots
            .iter()
            .filter_map(|(id, json)| Some((*id, Snapshot::from_json(json).ok()?)))
            .collect()
    }
}

const STATE_VERSION: u32 = 1;
const MAC_LEN: usize = 32;

impl WriterCache {
    /// The memory of repository `repo_id` under `base` (e.g. `~/.cache/cairn`), created
    /// if missing.
    pub fn open(base: &Path, repo_id: &str) -> std::io::Result<WriterCache> {
        if repo_id.is_empty() || !repo_id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("repository id {repo_id:?} cannot name a cache directory"),
            ));
        }
        let dir = base.join(repo_id).join("writer");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join("trees"))?;
        Ok(WriterCache { dir })
    }

    /// The state; an empty one when there is none or it does not verify.
    pub fn load(&self, key: &MasterKey) -> WriterState {
        let Ok(bytes) = std::fs::read(self.dir.join("state")) else {
            return WriterState::default();
        };
        let Some(body_len) = bytes.len().checked_sub(MAC_LEN) else {
            return WriterState::default();
        };
        let (body, mac) = bytes.split_at(body_len);
        if key.local_mac(body).as_slice() != mac {
            return WriterState::default();
        }
        match postcard::from_bytes::<(u32, WriterState)>(body) {
            Ok((STATE_VERSION, state)) => state,
            _ => WriterState::default(),
        }
    }

    /// Replaces the state, whole or not at all.
    pub fn save(&self, key: &MasterKey, state: &WriterState) -> std::io::Result<()> {
        let mut bytes = postcard::to_stdvec(&(STATE_VERSION, state))
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let mac = key.local_mac(&bytes);
        bytes.extend_from_slice(&mac);
        crate::client_state::write_atomic(&self.dir.join("state"), &bytes)
    }

    /// Keeps a tree this client wrote.
    pub fn put_tree(&self, id: &BlobId, plain: &[u8]) -> std::io::Result<()> {
        let path = self.dir.join("trees").join(id.to_string());
        if path.exists() {
            return Ok(());
        }
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        std::fs::write(&tmp, plain).and_then(|()| std::fs::rename(&tmp, &path))
    }

    /// A tree this client wrote, if it is kept and still hashes to its id.
    pub fn tree(&self, key: &MasterKey, id: &BlobId) -> Option<Vec<u8>> {
        let path = self.dir.join("trees").join(id.to_string());
        let plain = std::fs::read(&path).ok()?;
        if key.blob_id(&plain) == *id {
            Some(plain)
        } else {
            let _ = std::fs::remove_file(&path);
            None
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::{BlobKind, PackEntry};

    #[test]
    fn state_round_trips_and_a_changed_byte_empties_it() {
        let base = tempfile::tempdir().unwrap();
        let key = MasterKey::generate();
        let cache = WriterCache::open(base.path(), "abc").unwrap();
        assert!(cache.load(&key).packs.is_empty());
        let entry = PackEntry {
            id: key.blob_id(b"x"),
            kind: BlobKind::Data,
            offset: 0,
            length: 10,
            raw_length: 1,
        };
        let state = WriterState {
            packs: vec![IndexedPack {
                id: crate::id::PackId([3; 32]),
                entries: vec![entry],
            }],
            snapshots: Vec::new(),
        };
        cache.save(&key, &state).unwrap();
        assert_eq!(cache.load(&key).packs.len(), 1);
        assert!(
            cache.load(&MasterKey::generate()).packs.is_empty(),
            "another key's MAC"
        );
        let path = cache.dir().join("state");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[3] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert!(cache.load(&key).packs.is_empty());
    }

    #[test]
    fn a_tree_is_given_back_only_while_it_hashes_to_its_id() {
        let base = tempfile::tempdir().unwrap();
        let key = MasterKey::generate();
        let cache = WriterCache::open(base.path(), "abc").unwrap();
        let id = key.blob_id(b"tree bytes");
        cache.put_tree(&id, b"tree bytes").unwrap();
        assert_eq!(cache.tree(&key, &id).unwrap(), b"tree bytes");
        std::fs::write(
            cache.dir().join("trees").join(id.to_string()),
            b"tree bytez",
        )
        .unwrap();
        assert!(cache.tree(&key, &id).is_none());
        assert!(WriterCache::open(base.path(), "../x").is_err());
    }
}

//! The index: which pack holds each blob, and where. In memory it is one hash map; on
//! storage it is a set of immutable, sealed index files, each written after the packs it
//! names are durable.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::crypto::MasterKey;
use crate::id::{BlobId, PackId};
use crate::pack::{BlobKind, PackEntry};

const INDEX_VERSION: u32 = 1;

/// The stored form of one index file.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct IndexFile {
    pub version: u32,
    pub packs: Vec<IndexedPack>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IndexedPack {
    pub id: PackId,
    pub entries: Vec<PackEntry>,
}

impl IndexFile {
    pub fn seal(&self, key: &MasterKey) -> Vec<u8> {
        crate::object::seal(
            key,
            &postcard::to_stdvec(self).expect("an index serializes"),
        )
    }

    pub fn open(key: &MasterKey, bytes: &[u8]) -> Result<Self, String> {
        let plain = crate::object::open(key, bytes)?;
        let file: IndexFile = postcard::from_bytes(&plain).map_err(|e| e.to_string())?;
        if file.version != INDEX_VERSION {
            return Err(format!("unknown index version {}", file.version));
        }
        Ok(file)
    }

    pub fn new(packs: Vec<IndexedPack>) -> Self {
        IndexFile {
            version: INDEX_VERSION,
            packs,
        }
    }
}

/// Where to find a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobLocation {
    pub pack: PackId,
    pub kind: BlobKind,
    pub offset: u32,
    pub length: u32,
    pub raw_length: u32,
}

/// Blob id → location, for every blob of every loaded index file.
///
/// Packs that prune has condemned stay readable, but a blob's location is a live pack
/// whenever one holds it, and new backups do not build on blobs only condemned packs hold.
#[derive(Debug, Default)]
pub struct Index {
    blobs: HashMap<BlobId, BlobLocation>,
    condemned: HashSet<PackId>,
}

impl Index {
    pub fn add_pack(&mut self, pack: PackId, entries: &[PackEntry]) {
        self.blobs.reserve(entries.len());
        let condemned = self.condemned.contains(&pack);
        for e in entries {
            let loc = BlobLocation {
                pack,
                kind: e.kind,
                offset: e.offset,
                length: e.length,
                raw_length: e.raw_length,
            };
            match self.blobs.get(&e.id) {
                Some(old) if condemned && !self.condemned.contains(&old.pack) => {}
                _ => {
                    self.blobs.insert(e.id, loc);
                }
            }
        }
    }

    /// Marks packs as condemned; call before adding them for the preference to apply.
    pub fn condemn(&mut self, packs: impl IntoIterator<Item = PackId>) {
        self.condemned.extend(packs);
    }

    pub fn is_condemned(&self, pack: &PackId) -> bool {
        self.condemned.contains(pack)
    }

    /// Whether a live (not condemned) pack holds the blob: what a backup may build on.
    pub fn contains_live(&self, id: &BlobId) -> bool {
        self.blobs
            .get(id)
            .is_some_and(|loc| !self.condemned.contains(&loc.pack))
    }

    pub fn get(&self, id: &BlobId) -> Option<&BlobLocation> {
        self.blobs.get(id)
    }

    pub fn contains(&self, id: &BlobId) -> bool {
        self.blobs.contains_key(id)
    }

    pub fn len(&self) -> usize {
        self.blobs.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&BlobId, &BlobLocation)> {
        self.blobs.iter()
    }

    /// Every pack the index names, with the blobs it says each one holds.
    pub fn by_pack(&self) -> HashMap<PackId, Vec<(BlobId, BlobLocation)>> {
        let mut packs: HashMap<PackId, Vec<(BlobId, BlobLocation)>> = HashMap::new();
        for (id, loc) in &self.blobs {
            packs.entry(loc.pack).or_default().push((*id, *loc));
        }
        packs
    }

    pub fn is_empty(&self) -> bool {
        self.blobs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_files_round_trip_and_reject_damage() {
        let key = MasterKey::generate();
        let entry = PackEntry {
            id: key.blob_id(b"x"),
            kind: BlobKind::Tree,
            offset: 7,
            length: 50,
            raw_length: 10,
        };
        let file = IndexFile::new(vec![IndexedPack {
            id: PackId([1; 32]),
            entries: vec![entry],
        }]);
        let bytes = file.seal(&key);
        let back = IndexFile::open(&key, &bytes).unwrap();
        assert_eq!(back.packs[0].entries, vec![entry]);
        let mut bad = bytes.clone();
        bad[5] ^= 1;
        assert!(IndexFile::open(&key, &bad).is_err());
        assert!(IndexFile::open(&key, &bytes[..bytes.len() - 6]).is_err());
    }
}

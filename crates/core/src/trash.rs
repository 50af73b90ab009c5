//! Trash files: prune's condemnation of packs, the first phase of two-phase deletion.
//!
//! `trash/<id>` lists packs that no snapshot needed when prune looked, each with the time
//! it was condemned. From then on new backups do not build on blobs that only condemned
//! packs hold. A later step deletes a condemned pack once every backup session that could
//! have read the index before the condemnation has ended (see `docs/ARCHITECTURE.md`).

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::id::{PackId, RawId};
use crate::repo::Repository;

/// Trash files are named by the hash of their bytes, like every other file.
pub type TrashId = crate::id::IndexId;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrashFile {
    pub version: u32,
    pub packs: Vec<Condemned>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Condemned {
    pub id: PackId,
    pub condemned_at: jiff::Timestamp,
}

impl TrashFile {
    pub fn new(packs: Vec<Condemned>) -> Self {
        TrashFile { version: 1, packs }
    }
}

fn name_of(id: &RawId) -> String {
    format!("trash/{}", hex::encode(id))
}

/// Writes a trash file; returns its storage name.
pub fn write(repo: &Repository, trash: &TrashFile) -> Result<String> {
    let json = serde_json::to_vec(trash).expect("a trash file serializes");
    let bytes = crate::object::seal(repo.key(), &json);
    let name = name_of(blake3::hash(&bytes).as_bytes());
    match repo.storage().write(&name, &bytes) {
        // Same content, same name: the file is already there.
        Ok(()) | Err(cairn_storage::StorageError::AlreadyExists { .. }) => Ok(name),
        Err(e) => Err(e.into()),
    }
}

/// Every trash file, by storage name; unreadable ones as errors.
pub fn list(repo: &Repository) -> Result<Vec<(String, Result<TrashFile>)>> {
    let mut out = Vec::new();
    for name in repo.storage().list("trash")? {
        let read = (|| {
            let bytes = repo.storage().read(&name)?;
            repo.check_name(&name, &bytes)?;
            let json =
                crate::object::open(repo.key(), &bytes).map_err(|r| repo.corrupt(&name, r))?;
            let trash: TrashFile =
                serde_json::from_slice(&json).map_err(|e| repo.corrupt(&name, e.to_string()))?;
            if trash.version != 1 {
                return Err(repo.corrupt(&name, format!("unknown trash version {}", trash.version)));
            }
            Ok(trash)
        })();
        out.push((name, read));
    }
    Ok(out)
}

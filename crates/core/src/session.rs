//! Backup sessions: a small immutable file a backup writes before it reads the index and
//! removes when it ends, so that prune knows which backups may build on blobs it wants to
//! delete. A session file is not a lock: nothing ever waits for one. A crashed backup's
//! file only postpones deletions until it is older than [`STALE_AFTER`].

use std::sync::Arc;

use cairn_storage::Storage;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::repo::Repository;

/// A session this old is treated as ended: its backup crashed. A backup that runs longer
/// checks, before committing, that every pack it builds on still exists.
pub const STALE_AFTER: jiff::SignedDuration = jiff::SignedDuration::from_hours(24);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionInfo {
    pub started: jiff::Timestamp,
    pub host: String,
    pub pid: u32,
}

/// A registered session; removed from storage when finished or dropped.
pub struct Session {
    storage: Arc<dyn Storage>,
    name: Option<String>,
    pub info: SessionInfo,
}

impl Session {
    pub fn start(repo: &Repository, host: &str) -> Result<Self> {
        let info = SessionInfo {
            started: jiff::Timestamp::now(),
            host: host.to_string(),
            pid: std::process::id(),
        };
        let json = serde_json::to_vec(&info).expect("a session serializes");
        let bytes = crate::object::seal(repo.key(), &json);
        let name = format!("sessions/{}", blake3::hash(&bytes).to_hex());
        repo.storage().write(&name, &bytes)?;
        Ok(Session {
            storage: Arc::clone(repo.storage()),
            name: Some(name),
            info,
        })
    }

    /// How long ago the session started.
    pub fn age(&self) -> jiff::SignedDuration {
        jiff::Timestamp::now().duration_since(self.info.started)
    }

    pub fn finish(mut self) -> Result<()> {
        self.remove()
    }

    fn remove(&mut self) -> Result<()> {
        if let Some(name) = self.name.take() {
            match self.storage.delete(&name) {
                Ok(()) | Err(cairn_storage::StorageError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

/// Sessions registered in the repository: (storage name, info). A session file that
/// cannot be read counts as one that started at the epoch's end of time, i.e. as active
/// until someone removes it, because it might be.
pub fn list(repo: &Repository) -> Result<Vec<(String, Option<SessionInfo>)>> {
    let mut out = Vec::new();
    for name in repo.storage().list("sessions")? {
        let info = repo
            .storage()
            .read(&name)
            .ok()
            .and_then(|b| crate::object::open(repo.key(), &b).ok())
            .and_then(|j| serde_json::from_slice(&j).ok());
        out.push((name, info));
    }
    Ok(out)
}

/// Before a long-running writer commits a snapshot: prune may have taken its session for
/// a crashed one (older than [`STALE_AFTER`]), so make sure every pack its dedup
/// decisions relied on still exists.
pub fn confirm_reused_packs(
    repo: &Repository,
    session: &Session,
    reused: &std::collections::HashSet<crate::id::PackId>,
) -> Result<()> {
    if session.age() <= STALE_AFTER / 2 {
        return Ok(());
    }
    for pack in reused {
        if !repo.storage().exists(&pack.storage_name())? {
            return Err(crate::error::Error::InvalidInput(format!(
                "This run took {:#}, and pack {} that it builds on was deleted by a prune \
                 meanwhile; no snapshot was written. Run it again (it reuses what was uploaded)",
                session.age(),
                pack.storage_name()
            )));
        }
    }
    Ok(())
}

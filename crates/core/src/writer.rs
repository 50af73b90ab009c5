//! Writing new blobs: dedup against the index, then compress and seal on worker threads,
//! then append to packs that are stored as they fill. The caller (backup) only hashes;
//! everything after the dedup decision happens off its thread.
//!
//! ```text
//! add() ──jobs──▶ sealers (one per core) ──sealed blobs──▶ packer ──▶ storage
//! ```
//! Queues are bounded, so memory stays at a few chunks per thread plus one pack.

use std::collections::HashSet;
use std::sync::Arc;
use std::thread::JoinHandle;

use cairn_storage::Storage;
use crossbeam_channel::{bounded, Receiver, Sender};

use crate::cache::Cache;
use crate::compress::{self, Compression};
use crate::crypto::MasterKey;
use crate::error::{Error, Result};
use crate::id::{BlobId, IndexId, PackId};
use crate::index::{IndexFile, IndexedPack};
use crate::pack::{BlobKind, PackWriter};
use crate::repo::Repository;

struct Job {
    id: BlobId,
    kind: BlobKind,
    data: Vec<u8>,
}

struct Sealed {
    id: BlobId,
    kind: BlobKind,
    sealed: Vec<u8>,
    raw_length: u32,
}

/// Packs between interim index files, so that an interrupted backup's packs are found by
/// the next one: at most this many packs (16 MiB each by default) are ever re-uploaded.
const PACKS_PER_INTERIM_INDEX: usize = 16;

/// What a writer stored.
#[derive(Debug, Default)]
pub struct WriterReport {
    /// Every pack written, in order.
    pub packs: Vec<IndexedPack>,
    /// How many of `packs` (from the start) interim index files already name; the caller
    /// writes an index for the rest.
    pub packs_indexed: usize,
    /// Existing packs this writer's dedup decisions rely on.
    pub reused_packs: HashSet<PackId>,
    pub blobs_added: u64,
    /// Plaintext bytes of the new blobs.
    pub raw_bytes_added: u64,
    /// Bytes written to storage (packs, headers included).
    pub stored_bytes_added: u64,
}

pub struct BlobWriter<'r> {
    repo: &'r Repository,
    pending: HashSet<BlobId>,
    jobs: Option<Sender<Job>>,
    sealers: Vec<JoinHandle<()>>,
    packer: Option<JoinHandle<Result<WriterReport>>>,
    blobs_added: u64,
    raw_bytes_added: u64,
    reused_packs: HashSet<PackId>,
}

impl<'r> BlobWriter<'r> {
    pub(crate) fn new(repo: &'r Repository) -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (job_tx, job_rx) = bounded::<Job>(threads * 2);
        let (sealed_tx, sealed_rx) = bounded::<Sealed>(threads * 2);
        let sealers = (0..threads)
            .map(|_| {
                let (rx, tx) = (job_rx.clone(), sealed_tx.clone());
                let key = Arc::clone(repo.key());
                let codec = repo.config().compression;
                std::thread::spawn(move || seal_loop(&key, codec, rx, tx))
            })
            .collect();
        drop(sealed_tx);
        let storage = Arc::clone(repo.storage());
        let key = Arc::clone(repo.key());
        let pack_size = repo.config().pack_size as usize;
        let cache = repo.cache().cloned();
        let packer = std::thread::spawn(move || {
            pack_loop(storage, &key, pack_size, cache.as_ref(), sealed_rx)
        });
        BlobWriter {
            repo,
            pending: HashSet::new(),
            jobs: Some(job_tx),
            sealers,
            packer: Some(packer),
            blobs_added: 0,
            raw_bytes_added: 0,
            reused_packs: HashSet::new(),
        }
    }

    /// Stores `data` unless the repository already has it. Returns its id and whether it
    /// was new.
    pub fn add(&mut self, kind: BlobKind, data: &[u8]) -> Result<(BlobId, bool)> {
        let id = self.repo.key().blob_id(data);
        self.add_with_id(id, kind, data)
    }

    /// As [`add`](Self::add), for a caller that already hashed `data` with the repository's key.
    pub fn add_with_id(
        &mut self,
        id: BlobId,
        kind: BlobKind,
        data: &[u8],
    ) -> Result<(BlobId, bool)> {
        let index = self.repo.index();
        if index.contains_live(&id) {
            if let Some(loc) = index.get(&id) {
                self.reused_packs.insert(loc.pack);
            }
            return Ok((id, false));
        }
        self.store(id, kind, data)
    }

    /// Whether the repository has blob `id` (or this writer stores it): then a caller
    /// that has not read the blob's data yet need not (copy with shared ids).
    pub fn has(&mut self, id: &BlobId) -> bool {
        let index = self.repo.index();
        if index.contains_live(id) {
            if let Some(loc) = index.get(id) {
                self.reused_packs.insert(loc.pack);
            }
            return true;
        }
        self.pending.contains(id)
    }

    /// Stores `data` again even though the index has it (prune's repacking).
    pub fn add_copy(&mut self, kind: BlobKind, data: &[u8]) -> Result<(BlobId, bool)> {
        let id = self.repo.key().blob_id(data);
        self.store(id, kind, data)
    }

    fn store(&mut self, id: BlobId, kind: BlobKind, data: &[u8]) -> Result<(BlobId, bool)> {
        if !self.pending.insert(id) {
            return Ok((id, false));
        }
        self.blobs_added += 1;
        self.raw_bytes_added += data.len() as u64;
        let job = Job {
            id,
            kind,
            data: data.to_vec(),
        };
        let sent = self.jobs.as_ref().map(|tx| tx.send(job).is_ok());
        if sent != Some(true) {
            // The packer stopped on an error; finish() reports it.
            return Err(self.stop());
        }
        Ok((id, true))
    }

    fn stop(&mut self) -> Error {
        match self.join() {
            Err(e) => e,
            Ok(_) => Error::InvalidInput("the blob writer stopped unexpectedly".into()),
        }
    }

    fn join(&mut self) -> Result<WriterReport> {
        self.jobs = None;
        for s in self.sealers.drain(..) {
            let _ = s.join();
        }
        match self.packer.take().map(|p| p.join()) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(Error::InvalidInput(
                "the pack writer thread panicked".into(),
            )),
            None => Err(Error::InvalidInput(
                "the blob writer was already finished".into(),
            )),
        }
    }

    /// Writes the last pack and waits for every pack to be durable. The caller then writes
    /// an index naming them ([`Repository::write_index`]).
    pub fn finish(mut self) -> Result<WriterReport> {
        let mut report = self.join()?;
        report.blobs_added = self.blobs_added;
        report.raw_bytes_added = self.raw_bytes_added;
        report.reused_packs = std::mem::take(&mut self.reused_packs);
        Ok(report)
    }
}

impl Drop for BlobWriter<'_> {
    fn drop(&mut self) {
        if self.packer.is_some() {
            let _ = self.join();
        }
    }
}

fn seal_loop(key: &MasterKey, codec: Compression, jobs: Receiver<Job>, out: Sender<Sealed>) {
    let mut compressor = compress::Compressor::new(codec);
    for job in jobs {
        let tagged = compressor.compress(&job.data);
        let sealed = Sealed {
            id: job.id,
            kind: job.kind,
            sealed: key.seal(&tagged),
            raw_length: job.data.len() as u32,
        };
        if out.send(sealed).is_err() {
            return;
        }
    }
}

/// Packs sealed blobs and stores each pack when it is full. Trees go into packs of their
/// own: a command that needs only trees (ls, find, an incremental backup on a cold
/// cache) then fetches a few tree packs whole rather than one range per tree.
fn pack_loop(
    storage: Arc<dyn Storage>,
    key: &MasterKey,
    pack_size: usize,
    cache: Option<&Cache>,
    blobs: Receiver<Sealed>,
) -> Result<WriterReport> {
    let mut report = WriterReport::default();
    let store = |pack: PackWriter, report: &mut WriterReport| -> Result<()> {
        let (id, bytes, entries) = pack.finish(key);
        storage.write(&id.storage_name(), &bytes)?;
        report.stored_bytes_added += bytes.len() as u64;
        if let Some(cache) = cache {
            // Only once the pack is stored, so the cache never holds what the
            // repository lacks.
            for e in entries.iter().filter(|e| e.kind == BlobKind::Tree) {
                let (start, end) = (e.offset as usize, (e.offset + e.length) as usize);
                if let Some(sealed) = bytes.get(start..end) {
                    cache.put_tree(&e.id.to_string(), sealed);
                }
            }
        }
        report.packs.push(IndexedPack { id, entries });
        if report.packs.len() - report.packs_indexed >= PACKS_PER_INTERIM_INDEX {
            let file = IndexFile::new(report.packs[report.packs_indexed..].to_vec());
            let bytes = file.seal(key);
            storage.write(&IndexId::of_bytes(&bytes).storage_name(), &bytes)?;
            report.packs_indexed = report.packs.len();
        }
        Ok(())
    };
    let new_pack = |kind: BlobKind| match kind {
        BlobKind::Data => PackWriter::new(pack_size + pack_size / 8),
        // Trees are a small part of a repository: let their buffer grow as needed.
        BlobKind::Tree => PackWriter::new(0),
    };
    let mut data = new_pack(BlobKind::Data);
    let mut trees = new_pack(BlobKind::Tree);
    for blob in blobs {
        let pack = match blob.kind {
            BlobKind::Data => &mut data,
            BlobKind::Tree => &mut trees,
        };
        pack.add(blob.id, blob.kind, &blob.sealed, blob.raw_length);
        if pack.len() >= pack_size {
            let full = std::mem::replace(pack, new_pack(blob.kind));
            store(full, &mut report)?;
        }
    }
    // Data before trees, as a crash between the two leaves no tree whose data is missing.
    for pack in [data, trees] {
        if !pack.is_empty() {
            store(pack, &mut report)?;
        }
    }
    Ok(report)
}

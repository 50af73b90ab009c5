//! Writing new blobs: dedup against the index, then compress and seal on worker threads,
//! then append to packs that are stored as they fill. The caller (backup) only hashes;
//! everything after the dedup decision happens off its thread.
//!
//! ```text
//! add() ──jobs──▶ sealers (one per core) ──sealed blobs──▶ packer ──▶ storage
//! ```
//! Queues are bounded, so memory stays at a few chunks per thread plus one pack. `add`
//! takes `&self`: backup's file workers share one writer.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    /// Time the sealer threads spent compressing, summed over threads.
    pub compress_time: Duration,
    /// Time the sealer threads spent encrypting, summed over threads.
    pub encrypt_time: Duration,
    /// Time spent storing packs and interim index files.
    pub write_time: Duration,
}

/// Nanoseconds summed over threads, for per-phase timings.
#[derive(Debug, Default)]
pub struct PhaseTimer(AtomicU64);

impl PhaseTimer {
    /// Adds the time since `since`.
    pub fn add(&self, since: Instant) {
        self.add_duration(since.elapsed());
    }

    pub fn add_duration(&self, d: Duration) {
        self.0.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

/// Compression and encryption time of all sealers.
#[derive(Default)]
struct SealTimes {
    compress: PhaseTimer,
    encrypt: PhaseTimer,
}

pub struct BlobWriter<'r> {
    repo: &'r Repository,
    pending: Mutex<HashSet<BlobId>>,
    jobs: Option<Sender<Job>>,
    sealers: Vec<JoinHandle<()>>,
    packer: Option<JoinHandle<Result<WriterReport>>>,
    blobs_added: AtomicU64,
    raw_bytes_added: AtomicU64,
    reused_packs: Mutex<HashSet<PackId>>,
    seal_times: Arc<SealTimes>,
}

impl<'r> BlobWriter<'r> {
    pub(crate) fn new(repo: &'r Repository) -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (job_tx, job_rx) = bounded::<Job>(threads * 2);
        let (sealed_tx, sealed_rx) = bounded::<Sealed>(threads * 2);
        let seal_times = Arc::new(SealTimes::default());
        let sealers = (0..threads)
            .map(|_| {
                let (rx, tx) = (job_rx.clone(), sealed_tx.clone());
                let key = Arc::clone(repo.key());
                let codec = repo.config().compression;
                let times = Arc::clone(&seal_times);
                std::thread::spawn(move || seal_loop(&key, codec, &times, rx, tx))
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
            pending: Mutex::default(),
            jobs: Some(job_tx),
            sealers,
            packer: Some(packer),
            blobs_added: AtomicU64::new(0),
            raw_bytes_added: AtomicU64::new(0),
            reused_packs: Mutex::default(),
            seal_times,
        }
    }

    /// Stores `data` unless the repository already has it. Returns its id and whether it
    /// was new.
    pub fn add(&self, kind: BlobKind, data: &[u8]) -> Result<(BlobId, bool)> {
        let id = self.repo.key().blob_id(data);
        self.add_with_id(id, kind, data)
    }

    /// As [`add`](Self::add), for a caller that already hashed `data` with the repository's key.
    pub fn add_with_id(&self, id: BlobId, kind: BlobKind, data: &[u8]) -> Result<(BlobId, bool)> {
        if self.in_repository(&id) {
            return Ok((id, false));
        }
        self.store(id, kind, data)
    }

    /// Whether the repository has blob `id` (or this writer stores it): then a caller
    /// that has not read the blob's data yet need not (copy with shared ids).
    pub fn has(&self, id: &BlobId) -> bool {
        self.in_repository(id) || self.lock_pending().contains(id)
    }

    /// Whether a live pack holds `id`; if so, this writer's result relies on that pack.
    fn in_repository(&self, id: &BlobId) -> bool {
        let index = self.repo.index();
        if !index.contains_live(id) {
            return false;
        }
        if let Some(loc) = index.get(id) {
            let mut reused = self.reused_packs.lock().unwrap_or_else(|p| p.into_inner());
            reused.insert(loc.pack);
        }
        true
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashSet<BlobId>> {
        // A panicking holder left the set consistent: an insert either happened or not.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `data` again even though the index has it (prune's repacking).
    pub fn add_copy(&self, kind: BlobKind, data: &[u8]) -> Result<(BlobId, bool)> {
        let id = self.repo.key().blob_id(data);
        self.store(id, kind, data)
    }

    fn store(&self, id: BlobId, kind: BlobKind, data: &[u8]) -> Result<(BlobId, bool)> {
        if !self.lock_pending().insert(id) {
            return Ok((id, false));
        }
        self.blobs_added.fetch_add(1, Ordering::Relaxed);
        self.raw_bytes_added
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        let job = Job {
            id,
            kind,
            data: data.to_vec(),
        };
        let sent = self.jobs.as_ref().map(|tx| tx.send(job).is_ok());
        if sent != Some(true) {
            // The packer stopped on an error; finish() reports it.
            return Err(Error::WriterStopped);
        }
        Ok((id, true))
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
        report.blobs_added = *self.blobs_added.get_mut();
        report.raw_bytes_added = *self.raw_bytes_added.get_mut();
        report.reused_packs = std::mem::take(
            self.reused_packs
                .get_mut()
                .unwrap_or_else(|p| p.into_inner()),
        );
        report.compress_time = self.seal_times.compress.total();
        report.encrypt_time = self.seal_times.encrypt.total();
        Ok(report)
    }

    /// Why `add` failed with [`Error::WriterStopped`]: stops the writer and returns the
    /// error that stopped it (or `stopped` itself when there was none).
    pub fn cause(mut self, stopped: Error) -> Error {
        if !matches!(stopped, Error::WriterStopped) {
            return stopped;
        }
        match self.join() {
            Err(e) => e,
            Ok(_) => stopped,
        }
    }
}

impl Drop for BlobWriter<'_> {
    fn drop(&mut self) {
        if self.packer.is_some() {
            let _ = self.join();
        }
    }
}

fn seal_loop(
    key: &MasterKey,
    codec: Compression,
    times: &SealTimes,
    jobs: Receiver<Job>,
    out: Sender<Sealed>,
) {
    let mut compressor = compress::Compressor::new(codec);
    for job in jobs {
        let started = Instant::now();
        let tagged = compressor.compress(&job.data);
        times.compress.add(started);
        let started = Instant::now();
        let sealed = key.seal(&tagged);
        times.encrypt.add(started);
        let sealed = Sealed {
            id: job.id,
            kind: job.kind,
            sealed,
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
        let started = Instant::now();
        storage.write(&id.storage_name(), &bytes)?;
        report.write_time += started.elapsed();
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
            let started = Instant::now();
            storage.write(&IndexId::of_bytes(&bytes).storage_name(), &bytes)?;
            report.write_time += started.elapsed();
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

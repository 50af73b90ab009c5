//! The repository: opening and creating one, its key and config, reading blobs, trees and
//! snapshots, and writing snapshots. How bytes reach the disk is the storage layer's job;
//! how packs are filled is [`crate::writer`]'s.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use cairn_chunker::ChunkerParams;
use cairn_storage::{Storage, StorageError};

use crate::cache::Cache;
use crate::compress::{self, Compression};
use crate::config::{ChunkerConfig, Config, ConfigError, FORMAT_VERSION};
use crate::crypto::{Cipher, MasterKey, Purpose};
use crate::error::{Error, Result};
use crate::id::{BlobId, IndexId, PackId, SnapshotId};
use crate::index::{BlobLocation, Index, IndexBuilder, IndexFile, IndexedPack};
use crate::keyfile::KdfParams;
use crate::keys::{Access, Credentials};
use crate::pack::{self, BlobKind, PackEntry};
use crate::snapshot::Snapshot;
use crate::tree::Tree;
use crate::window::{PackWindows, RecentBlobs};
use crate::writer::{BlobWriter, WriterReport};
use crate::writer_cache::{WriterCache, WriterState};

/// Settings fixed when a repository is created.
#[derive(Debug, Clone)]
pub struct InitOptions {
    pub chunker: ChunkerParams,
    pub compression: Compression,
    pub pack_size: u64,
    pub kdf: KdfParams,
    pub host: String,
    /// The repository format: [`FORMAT_VERSION`], or 1 to make an old repository in tests.
    pub format: u32,
    /// Name blobs and cut chunks as this key does (`init --copy-chunker-params`), so the
    /// new repository deduplicates with the one it belongs to.
    pub ids_from: Option<Arc<MasterKey>>,
    /// The AEAD (format 2); `None` picks [`Cipher::fastest_here`].
    pub cipher: Option<Cipher>,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            chunker: ChunkerParams::DEFAULT,
            compression: Compression::default(),
            // 16 MiB: few enough files for object stores, small enough to rewrite in prune.
            pack_size: 16 << 20,
            kdf: KdfParams::default(),
            host: String::new(),
            format: FORMAT_VERSION,
            ids_from: None,
            cipher: None,
        }
    }
}

/// An open repository: storage, config, master key and the loaded index.
pub struct Repository {
    storage: Arc<dyn Storage>,
    config: Config,
    key: Arc<MasterKey>,
    index: Index,
    /// Index files that could not be read; their blobs are missing from `index`.
    index_problems: Vec<Error>,
    /// Local copies of index, snapshot and tree data (set for remote repositories).
    cache: Option<Cache>,
    /// Tree blobs by pack, built on the first tree the cache misses; reset whenever
    /// the index changes.
    tree_packs: std::sync::OnceLock<HashMap<PackId, Vec<(BlobId, BlobLocation)>>>,
    /// Recently read windows of packs (see [`crate::window`]).
    windows: PackWindows,
    /// Where the last blob the index places in each pack ends; reset with the index.
    pack_ends: std::sync::OnceLock<HashMap<PackId, u64>>,
    /// Recently read plaintext blobs, for readers of many small files.
    recent_blobs: RecentBlobs,
    /// The key file that opened it and this client's state of it ([`crate::keys`]).
    access: Access,
    /// A write-only key's memory of its own packs, trees and snapshots.
    writer_cache: Option<WriterCache>,
    /// Told of each blob read from another copy because its place in the index failed.
    on_read_around: Option<Box<ReadAround>>,
}

/// Told that blob `id` was read from another copy than its place in the index, in pack
/// `pack`, because reading that place failed with the error: what was read is right, but
/// the copy prune keeps is missing or damaged (`check --read-data` finds out more).
pub type ReadAround = dyn Fn(&BlobId, PackId, &Error) + Send + Sync;

/// All readable snapshots, oldest first, and the ones that could not be read.
pub struct SnapshotList {
    pub snapshots: Vec<(SnapshotId, Snapshot)>,
    /// Snapshot files that cannot be read, and why.
    pub damaged: Vec<(SnapshotId, Error)>,
}

/// How many of its own snapshots a write-only key remembers.
const WRITER_SNAPSHOTS_KEPT: usize = 100;

/// Threads reading `count` snapshot files. A local one takes about 15 µs (opened, read,
/// decrypted, parsed: `cairn snapshots` took 5 ms with 98 snapshots and 18-22 ms with
/// 1,000), so a thread pays for itself only from a few hundred on: with 1,000 it took
/// 16-21 ms on two threads (2 cores), at 3 MiB more peak RSS, and with 98 no less. A
/// remote store's time is spent waiting for answers (the cache holds the files after the
/// first read), so there each thread takes a few requests, up to 16 at once as restore
/// sends: 120 snapshots on Garage on loopback, cache empty, 125-158 ms on one thread,
/// 108-131 ms on sixteen; each request further away waits longer, and the waits now
/// overlap.
fn snapshot_readers(count: usize, remote: bool) -> usize {
    let (most, each) = match remote {
        true => (16, 4),
        false => (crate::cores().map_or(1, |n| n.get()), 256),
    };
    most.min(count.div_ceil(each)).max(1)
}

/// `f` of each item, in order, computed by `threads` threads each taking a run of items.
fn map_in_parallel<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    if threads <= 1 || items.len() <= 1 {
        return items.iter().map(f).collect();
    }
    let run = items.len().div_ceil(threads);
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = items
            .chunks(run)
            .map(|part| s.spawn(move || part.iter().map(f).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

/// What a write-only key was asked to do and cannot.
fn write_only(what: &str) -> Error {
    Error::WriteOnlyKey {
        action: what.to_string(),
    }
}

impl Repository {
    /// Creates a repository in empty storage and opens it.
    pub fn init(
        storage: Arc<dyn Storage>,
        credentials: impl Into<Credentials>,
        opts: &InitOptions,
    ) -> Result<Self> {
        let credentials = credentials.into();
        let location = storage.location();
        if storage.exists("config")? || !storage.list("keys")?.is_empty() {
            return Err(Error::RepositoryExists { location });
        }
        let mut key = match &opts.ids_from {
            Some(other) => MasterKey::sharing_ids_with(other),
            None => MasterKey::generate_for(opts.format),
        };
        let cipher = match (key.format(), opts.cipher) {
            (1, _) => None,
            (_, chosen) => Some(chosen.unwrap_or_else(Cipher::fastest_here)),
        };
        key.use_cipher(cipher.unwrap_or_default())
            .expect("format 1 keeps the default cipher");
        let key_file = crate::keys::write_key_file(
            storage.as_ref(),
            &key,
            &credentials.secret,
            opts.kdf,
            &opts.host,
        )?;
        let mut config = Config {
            version: key.format(),
            id: hex::encode(rand::random::<[u8; 16]>()),
            chunker: ChunkerConfig::fastcdc(opts.chunker),
            hash: "blake3-keyed".into(),
            compression: opts.compression,
            pack_size: opts.pack_size,
            cipher,
            mac: None,
        };
        config.sign(&key);
        key.bind_repository(&config.id)
            .expect("a new key is bound to nothing yet");
        // The config is written last: it is what makes the directory a repository.
        let bytes = serde_json::to_vec_pretty(&config).expect("a config serializes");
        storage.write("config", &bytes)?;
        let access = Access::new(key_file, credentials.state.as_ref(), &config.id);
        Ok(Self::assemble(storage, config, key, access))
    }

    fn assemble(storage: Arc<dyn Storage>, config: Config, key: MasterKey, access: Access) -> Self {
        let windows = PackWindows::new(storage.is_remote());
        Repository {
            storage,
            config,
            key: Arc::new(key),
            index: Index::default(),
            index_problems: Vec::new(),
            cache: None,
            tree_packs: std::sync::OnceLock::new(),
            windows,
            recent_blobs: RecentBlobs::default(),
            pack_ends: std::sync::OnceLock::new(),
            writer_cache: None,
            on_read_around: None,
            access,
        }
    }

    /// Calls `report` for every blob read from another copy than its place in the index
    /// (see [`ReadAround`]). Readers go on with the other copy, which is whole; the report
    /// is so that the user learns of the damage.
    pub fn on_read_around(&mut self, report: Box<ReadAround>) {
        self.on_read_around = Some(report);
    }

    /// Opens a repository with `credentials` (a password, at least) and loads its index.
    pub fn open(storage: Arc<dyn Storage>, credentials: impl Into<Credentials>) -> Result<Self> {
        let mut repo = Self::open_without_index(storage, credentials)?;
        repo.load_index()?;
        Ok(repo)
    }

    /// Opens a repository without reading its index yet ([`load_index`](Self::load_index)):
    /// a backup first registers its session, then reads the index.
    pub fn open_without_index(
        storage: Arc<dyn Storage>,
        credentials: impl Into<Credentials>,
    ) -> Result<Self> {
        let config = read_config(storage.as_ref())?;
        let (mut key, access) = crate::keys::open(storage.as_ref(), &config, credentials.into())?;
        config
            .authenticate(&key)
            .map_err(|e| config_error(storage.as_ref(), e))?;
        key.use_cipher(config.cipher())
            .and_then(|()| key.bind_repository(&config.id))
            .map_err(|e| config_error(storage.as_ref(), ConfigError::Malformed(e)))?;
        Ok(Self::assemble(storage, config, key, access))
    }

    /// (Re)reads the trash and every index file. Each file is added to the index as it is
    /// read and then dropped, so loading holds the index and one file, not every file.
    /// Returns the trash generation whose condemnations the index now honours: `None`
    /// when a trash file could not be read (its condemnations are unknown).
    pub fn load_index(&mut self) -> Result<Option<u64>> {
        if self.key.is_write_only() {
            self.load_writer_index()?;
            return Ok(None);
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let trash = crate::trash::read(self)?;
            let observed = trash.observed();
            self.access.saw_trash(observed);
            let mut index = IndexBuilder::default();
            index.condemn(trash.packs.keys().copied());
            let mut problems = trash.problems;
            let mut vanished = false;
            for (_, name) in self.index_file_names()? {
                match self.read_index_file(&name) {
                    Ok(f) => index.add_file(&f),
                    // Replaced by prune between the listing and the read: list again, to
                    // read the file that replaced it.
                    Err(Error::Storage(StorageError::NotFound { .. })) if attempt < 4 => {
                        vanished = true;
                        break;
                    }
                    Err(e) => problems.push(e),
                }
            }
            if vanished {
                continue;
            }
            self.install_index(index.finish());
            self.index_problems = problems;
            return Ok(observed);
        }
    }

    /// A write-only key reads no index file (it cannot open them): its index is the packs
    /// its own earlier backups stored, as its client remembers them, less those no longer
    /// stored (forgotten, as prune may have re-sealed and deleted them) and those prune's
    /// notices name as condemned ([`crate::trash::noticed`]).
    fn load_writer_index(&mut self) -> Result<()> {
        let state = self.writer_state();
        let stored: std::collections::HashSet<PackId> = self.list_packs()?.into_iter().collect();
        // Read after the backup's session was registered: a prune that may delete a pack
        // once it has listed sessions wrote its notice before that.
        let condemned = crate::trash::noticed(self)?;
        let mut index = IndexBuilder::default();
        let usable = |p: &&IndexedPack| stored.contains(&p.id) && !condemned.contains(&p.id);
        for p in state.packs.iter().filter(usable) {
            index.add_pack(p.id, &p.entries);
        }
        self.install_index(index.finish());
        self.index_problems.clear();
        Ok(())
    }

    /// What this client remembers as a write-only key (empty without a cache).
    fn writer_state(&self) -> WriterState {
        self.writer_cache
            .as_ref()
            .map(|c| c.load(&self.key))
            .unwrap_or_default()
    }

    /// Gives a write-only key its memory of this repository ([`WriterCache`]); without
    /// one, each of its backups reads and uploads everything.
    pub fn set_writer_cache(&mut self, cache: WriterCache) {
        self.writer_cache = Some(cache);
    }

    pub fn writer_cache(&self) -> Option<&WriterCache> {
        self.writer_cache.as_ref()
    }

    /// After a write-only key's snapshot: remembers every pack its index now names (its
    /// own, earlier and new) and the snapshot, for the next backup to build on.
    pub fn remember_as_writer(&self, id: SnapshotId, snapshot: &Snapshot) -> std::io::Result<()> {
        let Some(cache) = &self.writer_cache else {
            return Ok(());
        };
        let mut state = cache.load(&self.key);
        let groups = self.index.by_pack();
        state.packs = groups
            .packs()
            .map(|p| IndexedPack {
                id: *p,
                entries: groups.blobs(p),
            })
            .collect();
        state.snapshots.push((id, snapshot.to_json()));
        // The parent of the next backup is among the last ones; older ones go.
        let keep = state.snapshots.len().saturating_sub(WRITER_SNAPSHOTS_KEPT);
        state.snapshots.drain(..keep);
        cache.save(&self.key, &state)
    }

    /// Rebuilds the in-memory index from the trash and index files already read.
    pub fn set_index<'a>(
        &mut self,
        trash: &crate::trash::Trash,
        files: impl Iterator<Item = &'a IndexFile>,
    ) {
        let mut index = IndexBuilder::default();
        index.condemn(trash.packs.keys().copied());
        for file in files {
            index.add_file(file);
        }
        self.install_index(index.finish());
        self.index_problems.clear();
    }

    fn install_index(&mut self, index: Index) {
        self.index = index;
        self.tree_packs = std::sync::OnceLock::new();
        self.pack_ends = std::sync::OnceLock::new();
    }

    fn read_index_file(&self, name: &str) -> Result<IndexFile> {
        let bytes = self.read_cacheable_file(name)?;
        IndexFile::open(&self.key, &bytes).map_err(|reason| self.corrupt(name, reason))
    }

    /// Reads an index or snapshot file from the cache or, failing that, from storage
    /// (checked against its name, then cached).
    fn read_cacheable_file(&self, name: &str) -> Result<Vec<u8>> {
        if let Some(bytes) = self.cache.as_ref().and_then(|c| c.file(name)) {
            return Ok(bytes);
        }
        let bytes = self.storage.read(name)?;
        self.check_name(name, &bytes)?;
        if let Some(cache) = &self.cache {
            cache.put_file(name, &bytes);
        }
        Ok(bytes)
    }

    /// Writes an index or snapshot file, and keeps a copy once it is stored.
    fn write_cacheable_file(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.storage.write(name, bytes)?;
        if let Some(cache) = &self.cache {
            cache.put_file(name, bytes);
        }
        Ok(())
    }

    /// Lists `dir` (`index` or `snapshots`) in storage, and forgets cached files that are
    /// gone from it.
    fn list_cacheable(&self, dir: &str) -> Result<Vec<String>> {
        let names = self.storage.list(dir)?;
        if let Some(cache) = &self.cache {
            cache.retain(dir, &names);
        }
        Ok(names)
    }

    /// Keeps index, snapshot and tree data in `cache` from now on.
    pub fn set_cache(&mut self, cache: Cache) {
        self.cache = Some(cache);
    }

    pub fn cache(&self) -> Option<&Cache> {
        self.cache.as_ref()
    }

    /// Files are named by the hash of their bytes: a mismatch is damage, found without a key.
    pub(crate) fn check_name(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let expected = name.rsplit('/').next().unwrap_or(name);
        let actual = blake3::hash(bytes).to_hex();
        if actual.as_str() != expected {
            return Err(self.corrupt(name, "its content does not match its name".into()));
        }
        Ok(())
    }

    pub(crate) fn corrupt(&self, name: &str, reason: String) -> Error {
        Error::CorruptObject {
            location: self.storage.location(),
            name: name.to_string(),
            reason,
        }
    }

    /// Marks packs condemned in the in-memory index (see [`crate::trash`]).
    pub fn condemn(&mut self, packs: impl IntoIterator<Item = PackId>) {
        self.index.condemn(packs);
    }

    /// Marks packs as writers' in the in-memory index (and in the index files written
    /// from it).
    pub fn mark_writer_packs(&mut self, packs: impl IntoIterator<Item = PackId>) {
        self.index.mark_writer(packs);
    }

    /// Counts writers' packs as the repository's own from now on, in memory and in the
    /// index files written from it: prune read them and every blob verified.
    pub fn trust_writer_packs(&mut self, packs: impl IntoIterator<Item = PackId>) {
        self.index.trust_writer(packs);
    }

    /// Adds the packs of an index file to the in-memory index, its writers' packs marked.
    pub fn absorb_file(&mut self, file: &IndexFile) {
        self.tree_packs = std::sync::OnceLock::new();
        self.pack_ends = std::sync::OnceLock::new();
        self.index.add_file(file);
    }

    /// Adds packs written by this process to the in-memory index.
    pub fn absorb(&mut self, packs: &[IndexedPack]) {
        self.tree_packs = std::sync::OnceLock::new();
        self.pack_ends = std::sync::OnceLock::new();
        for p in packs {
            self.index.add_pack(p.id, &p.entries);
        }
    }

    /// Indexes the packs in storage that no index or trash file names, among those
    /// `wanted` accepts: packs a backup or repack stored but did not get to index (it was
    /// killed, or stopped). A stored pack is whole and durable (writes are atomic), so
    /// naming it in an index is always safe. Packs whose header cannot be read are left
    /// alone; `check` reports them. Returns the packs adopted and the index file that
    /// names them.
    pub fn adopt_unindexed_packs(
        &mut self,
        wanted: impl Fn(&PackId) -> bool,
    ) -> Result<(Vec<IndexedPack>, Option<IndexId>)> {
        let mut adopted = Vec::new();
        for pack in self.list_packs()? {
            if self.index.knows_pack(&pack) || !wanted(&pack) {
                continue;
            }
            if let Ok((entries, by_writer)) = self.read_pack_header_and_sealer(&pack) {
                if by_writer {
                    self.index.mark_writer([pack]);
                }
                adopted.push(IndexedPack { id: pack, entries });
            }
        }
        let file = self.write_index(adopted.clone())?;
        self.absorb(&adopted);
        Ok((adopted, file))
    }

    /// After [`BlobWriter::finish`]: writes an index file naming the writer's packs that
    /// no interim index file names (they are durable), then adds every blob it stored to
    /// the in-memory index.
    pub fn index_written(&mut self, written: &mut WriterReport) -> Result<()> {
        self.write_index(std::mem::take(&mut written.unindexed))?;
        self.tree_packs = std::sync::OnceLock::new();
        self.pack_ends = std::sync::OnceLock::new();
        self.index.absorb(std::mem::take(&mut written.stored));
        Ok(())
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn key(&self) -> &Arc<MasterKey> {
        &self.key
    }

    /// How it was opened: the key file, and this client's state of it.
    pub fn access(&self) -> &Access {
        &self.access
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Index files that could not be read when the repository was opened.
    pub fn index_problems(&self) -> &[Error] {
        &self.index_problems
    }

    pub fn chunker_params(&self) -> Result<ChunkerParams> {
        let c = &self.config.chunker;
        Ok(ChunkerParams::new(c.min_size, c.avg_size, c.max_size)?)
    }

    /// Starts writing new blobs into packs.
    pub fn blob_writer(&self) -> BlobWriter<'_> {
        BlobWriter::new(self)
    }

    /// Reads, decrypts, decompresses and verifies one blob. Never returns wrong bytes: the
    /// plaintext must hash to the blob's id.
    pub fn read_blob(&self, id: &BlobId) -> Result<Vec<u8>> {
        self.read_sealed_blob(id, true).map(|(_, plain)| plain)
    }

    /// A blob's verified plaintext, kept among the last few read: for readers of files,
    /// whose small files share bundles (restore, dump, mount, diff).
    pub fn read_blob_shared(&self, id: &BlobId) -> Result<Arc<Vec<u8>>> {
        let fetch = || self.read_blob(id).ok();
        match self.recent_blobs.get(*id, fetch) {
            Some(blob) => Ok(blob),
            // Read again for the error: failures are not kept.
            None => self.read_blob(id).map(Arc::new),
        }
    }

    /// The blob as stored (sealed) and its verified plaintext: from its place in the
    /// index or, if that cannot be read or is damaged and `elsewhere`, from another
    /// place the index files give (the error is the first place's).
    fn read_sealed_blob(&self, id: &BlobId, elsewhere: bool) -> Result<(Vec<u8>, Vec<u8>)> {
        let loc = self
            .index
            .get(id)
            .ok_or(Error::BlobNotInIndex { id: *id })?;
        let first = self.read_sealed_at(id, &loc);
        let Err(error) = first else { return first };
        if !elsewhere {
            return Err(error);
        }
        match self.read_sealed_elsewhere(id) {
            Some(found) => {
                if let Some(report) = &self.on_read_around {
                    report(id, loc.pack, &error);
                }
                Ok(found)
            }
            None => Err(error),
        }
    }

    /// Blob `id` as stored and its verified plaintext, from the first place other than
    /// its place in the index that is whole; `None` where there is none.
    fn read_sealed_elsewhere(&self, id: &BlobId) -> Option<(Vec<u8>, Vec<u8>)> {
        (self.index.other_places(id)).find_map(|other| self.read_sealed_at(id, &other).ok())
    }

    /// The verified plaintext of blob `id` from a place other than its place in the
    /// index, for a reader whose read of that place failed; `None` where there is none,
    /// or none is whole.
    pub(crate) fn read_blob_elsewhere(&self, id: &BlobId) -> Option<Vec<u8>> {
        self.read_sealed_elsewhere(id).map(|(_, plain)| plain)
    }

    fn read_sealed_at(&self, id: &BlobId, loc: &BlobLocation) -> Result<(Vec<u8>, Vec<u8>)> {
        let sealed = match self.read_through_window(loc) {
            Some(sealed) => sealed,
            None => self.read_pack_range(
                &loc.pack.storage_name(),
                loc.offset as u64,
                loc.length as u64,
            )?,
        };
        let plain = self.open_blob(id, loc, &sealed)?;
        Ok((sealed, plain))
    }

    /// Decrypts, decompresses and verifies blob `id` from `sealed`, the bytes of its pack
    /// that `loc` names.
    pub(crate) fn open_blob(
        &self,
        id: &BlobId,
        loc: &BlobLocation,
        sealed: &[u8],
    ) -> Result<Vec<u8>> {
        let mut buf = sealed.to_vec();
        self.open_blob_in_place(id, loc, &mut buf, IdCheck::Always, None)
            .map(Cow::into_owned)
    }

    /// [`open_blob`](Self::open_blob) where the sealed bytes lie: they are decrypted in
    /// place, and a blob stored raw is returned within them, not copied. `check` says
    /// whether the plaintext is hashed against `id` even where the seal already proves
    /// it ([`MasterKey::seal_binds_blob_id`]); a compressed blob is decompressed into
    /// `scratch` where given (a buffer its caller reuses), else into a new buffer.
    pub(crate) fn open_blob_in_place<'a>(
        &self,
        id: &BlobId,
        loc: &BlobLocation,
        sealed: &'a mut [u8],
        check: IdCheck,
        scratch: Option<&'a mut Vec<u8>>,
    ) -> Result<Cow<'a, [u8]>> {
        let hash = check == IdCheck::Always || !self.key.seal_binds_blob_id(sealed);
        let damaged = |reason: String| Error::BlobDamaged {
            id: *id,
            pack: loc.pack,
            reason,
        };
        let tagged = (self.key)
            .open_in_place(loc.kind.purpose(*id), sealed)
            .map_err(|e| damaged(e.to_string()))?;
        let raw_len = loc.raw_length as usize;
        let plain = match scratch {
            Some(out) => compress::decompress_reusing(tagged, raw_len, out).map(Cow::Borrowed),
            None => compress::decompress_borrowed(tagged, raw_len),
        }
        .map_err(|e| damaged(e.to_string()))?;
        if hash && self.key.blob_id(&plain) != *id {
            return Err(damaged("its content does not match its id".into()));
        }
        Ok(plain)
    }

    /// A blob's sealed bytes from the windows of its pack around it; `None` when it spans
    /// more than two windows, or a window could not be read (the caller's own read then
    /// reports why).
    fn read_through_window(&self, loc: &BlobLocation) -> Option<Vec<u8>> {
        let pack_end = *self
            .pack_ends
            .get_or_init(|| {
                let mut ends: HashMap<PackId, u64> = HashMap::new();
                for (_, l) in self.index.iter() {
                    let e = ends.entry(l.pack).or_default();
                    // In u64: an index entry near 4 GiB must not wrap.
                    *e = (*e).max(u64::from(l.offset) + u64::from(l.length));
                }
                ends
            })
            .get(&loc.pack)?;
        let name = loc.pack.storage_name();
        let fetch = |start, len| self.read_pack_range(&name, start, len).ok();
        (self.windows).read(loc.pack, loc.offset, loc.length, pack_end, fetch)
    }

    /// A tree blob's plaintext, from the cache when it holds a verified copy; from
    /// another place than its place in the index only if `elsewhere`.
    fn read_tree_bytes(&self, id: &BlobId, elsewhere: bool) -> Result<Vec<u8>> {
        if self.key.is_write_only() {
            return self
                .writer_cache
                .as_ref()
                .and_then(|c| c.tree(&self.key, id))
                .ok_or_else(|| write_only(&format!("read tree {id}")));
        }
        let Some(cache) = &self.cache else {
            return self.read_sealed_blob(id, elsewhere).map(|(_, plain)| plain);
        };
        let hex = id.to_string();
        let loc = self
            .index
            .get(id)
            .ok_or(Error::BlobNotInIndex { id: *id })?;
        if let Some(sealed) = cache.tree(&hex) {
            match self.open_blob(id, &loc, &sealed) {
                Ok(plain) => return Ok(plain),
                Err(_) => cache.remove_tree(&hex),
            }
        }
        if let Some(plain) = self.cache_tree_pack(cache, id, &loc) {
            return Ok(plain);
        }
        let (sealed, plain) = self.read_sealed_blob(id, elsewhere)?;
        cache.put_tree(&hex, &sealed);
        Ok(plain)
    }

    /// On a cold cache, fetches every tree of `loc.pack` with one request and caches
    /// them, if the pack holds mostly trees (cairn writes trees into packs of their own);
    /// returns tree `id`'s plaintext. `None` leaves the caller to fetch the one blob.
    fn cache_tree_pack(&self, cache: &Cache, id: &BlobId, loc: &BlobLocation) -> Option<Vec<u8>> {
        let trees = self
            .tree_packs
            .get_or_init(|| {
                let mut packs: HashMap<PackId, Vec<(BlobId, BlobLocation)>> = HashMap::new();
                for (id, l) in self.index.iter() {
                    if l.kind == BlobKind::Tree {
                        packs.entry(l.pack).or_default().push((*id, l));
                    }
                }
                packs
            })
            .get(&loc.pack)?;
        let start = trees.iter().map(|(_, l)| l.offset).min()? as u64;
        let end = (trees.iter())
            .map(|(_, l)| u64::from(l.offset) + u64::from(l.length))
            .max()?;
        let wanted: u64 = trees.iter().map(|(_, l)| l.length as u64).sum();
        // A pack of data with a few trees in it: fetching the span would mostly be data.
        if trees.len() < 2 || end - start > 2 * wanted + (64 << 10) {
            return None;
        }
        let span = self
            .read_pack_range(&loc.pack.storage_name(), start, end - start)
            .ok()?;
        let mut found = None;
        for (tid, l) in trees {
            let from = (l.offset as u64 - start) as usize;
            let Some(sealed) = span.get(from..from + l.length as usize) else {
                continue;
            };
            // Damaged trees are left out; the caller's own read reports them.
            if let Ok(plain) = self.open_blob(tid, l, sealed) {
                cache.put_tree(&tid.to_string(), sealed);
                if tid == id {
                    found = Some(plain);
                }
            }
        }
        found
    }

    pub fn read_tree(&self, id: &BlobId) -> Result<Tree> {
        self.read_tree_from(id, true)
    }

    /// [`read_tree`](Self::read_tree) from the tree's place in the index only, as `check`
    /// reads it: a damaged copy there is damage to report (and prune counts only that
    /// place), whatever other copies hold.
    pub fn read_tree_at_its_place(&self, id: &BlobId) -> Result<Tree> {
        self.read_tree_from(id, false)
    }

    fn read_tree_from(&self, id: &BlobId, elsewhere: bool) -> Result<Tree> {
        let bytes = self.read_tree_bytes(id, elsewhere)?;
        Tree::from_bytes(&bytes).map_err(|e| Error::BlobDamaged {
            id: *id,
            pack: self
                .index
                .get(id)
                .map(|l| l.pack)
                .unwrap_or(crate::id::PackId([0; 32])),
            reason: format!("tree does not parse: {e}"),
        })
    }

    /// Every pack file in storage.
    pub fn list_packs(&self) -> Result<Vec<PackId>> {
        Ok(self
            .storage
            .list("data")?
            .iter()
            .filter_map(|n| n.rsplit('/').next()?.parse().ok())
            .collect())
    }

    /// Every pack in storage with its time by the storage's clock.
    pub fn list_packs_modified(&self) -> Result<Vec<(PackId, std::time::SystemTime)>> {
        Ok(self
            .storage
            .list_modified("data")?
            .into_iter()
            .filter_map(|(n, t)| Some((n.rsplit('/').next()?.parse().ok()?, t)))
            .collect())
    }

    /// Reads a pack's header from its tail, without reading its blobs.
    pub fn read_pack_header(&self, pack: &PackId) -> Result<Vec<PackEntry>> {
        Ok(self.read_pack_header_and_sealer(pack)?.0)
    }

    /// `len` bytes at `start` of the pack stored as `name`, read as [`pack::grid_span`]
    /// widens every read of a pack.
    pub(crate) fn read_pack_range(
        &self,
        name: &str,
        start: u64,
        len: u64,
    ) -> cairn_storage::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        let at = self.read_pack_range_into(name, start, len, &mut bytes)?;
        bytes.truncate(at + len as usize);
        bytes.drain(..at);
        Ok(bytes)
    }

    /// [`read_pack_range`](Self::read_pack_range) into `buf`, without moving the bytes:
    /// they start at the offset returned.
    pub(crate) fn read_pack_range_into(
        &self,
        name: &str,
        start: u64,
        len: u64,
        buf: &mut Vec<u8>,
    ) -> cairn_storage::Result<usize> {
        let (from, wide) = pack::grid_span(&self.key, start, len);
        match self.storage.read_range_into(name, from, wide, buf) {
            // A pack cut short off the grid (damaged) still holds the blobs before the
            // cut: read up to its end, which shows nothing its size does not. Only a size
            // inside the range asked for: a store that claims a larger one is not believed.
            Err(StorageError::Truncated { size, .. })
                if start + len <= size && size < from + wide =>
            {
                self.storage.read_range_into(name, from, size - from, buf)?
            }
            read => read?,
        }
        Ok((start - from) as usize)
    }

    /// Advice that the bytes from `start` to `end` of the pack stored as `name`, read with
    /// [`read_pack_range_into`](Self::read_pack_range_into), will not be read again: a
    /// local store drops them (as widened to the grid) from the page cache.
    pub(crate) fn uncache_pack_range(&self, name: &str, start: u64, end: u64) {
        let (from, wide) = pack::grid_span(&self.key, start, end - start);
        self.storage.uncache(name, from, wide);
    }

    /// [`read_pack_header`](Self::read_pack_header), and whether a writer sealed the pack.
    pub fn read_pack_header_and_sealer(&self, pack: &PackId) -> Result<(Vec<PackEntry>, bool)> {
        let name = pack.storage_name();
        let total = self.storage.size(&name)?;
        if total < 4 {
            return Err(self.corrupt(
                &name,
                format!("only {total} bytes long, too short for a pack"),
            ));
        }
        if let Some(problem) = pack::off_grid(&self.key, total) {
            return Err(self.corrupt(&name, problem));
        }
        let trailer = self.read_pack_range(&name, total - 4, 4)?;
        let trailer: [u8; 4] = trailer[..].try_into().expect("read_range returns 4 bytes");
        let (start, len) =
            pack::header_range(total, trailer).map_err(|r| self.corrupt(&name, r))?;
        let sealed = self.read_pack_range(&name, start, len)?;
        let entries =
            pack::open_header(&self.key, &sealed, start).map_err(|r| self.corrupt(&name, r))?;
        Ok((entries, self.key.sealed_by_writer(&sealed)))
    }

    /// Every index file, read again from storage; unreadable ones come back as errors.
    pub fn index_files(&self) -> Result<Vec<(IndexId, Result<IndexFile>)>> {
        Ok(self
            .index_file_names()?
            .into_iter()
            .map(|(id, name)| (id, self.read_index_file(&name)))
            .collect())
    }

    fn index_file_names(&self) -> Result<Vec<(IndexId, String)>> {
        Ok(self
            .list_cacheable("index")?
            .into_iter()
            .filter_map(|name| Some((name.strip_prefix("index/")?.parse().ok()?, name)))
            .collect())
    }

    /// Writes an index file naming `packs`; they must already be durable. The packs the
    /// in-memory index knows as writers' are named so in it.
    pub fn write_index(&self, packs: Vec<IndexedPack>) -> Result<Option<IndexId>> {
        if packs.is_empty() {
            return Ok(None);
        }
        let mut file = IndexFile::new(packs);
        file.writer_packs = file
            .packs
            .iter()
            .map(|p| p.id)
            .filter(|p| self.index.is_writer_pack(p))
            .collect();
        let bytes = file.seal(&self.key);
        let id = IndexId::of_bytes(&bytes);
        self.write_cacheable_file(&id.storage_name(), &bytes)?;
        Ok(Some(id))
    }

    /// Writes a snapshot: the commit point of a backup.
    pub fn save_snapshot(&self, snapshot: &Snapshot) -> Result<SnapshotId> {
        let bytes = crate::object::seal(&self.key, Purpose::Snapshot, &snapshot.to_json());
        let id = SnapshotId::of_bytes(&bytes);
        self.write_cacheable_file(&id.storage_name(), &bytes)?;
        Ok(id)
    }

    pub fn load_snapshot(&self, id: &SnapshotId) -> Result<Snapshot> {
        if self.key.is_write_only() {
            return self
                .writer_state()
                .snapshots()
                .into_iter()
                .find(|(s, _)| s == id)
                .map(|(_, s)| s)
                .ok_or_else(|| write_only(&format!("read snapshot {}", id.short())));
        }
        let name = id.storage_name();
        let bytes = self.read_cacheable_file(&name)?;
        let json = crate::object::open(&self.key, Purpose::Snapshot, &bytes)
            .map_err(|r| self.corrupt(&name, r))?;
        Snapshot::from_json(&json).map_err(|e| self.corrupt(&name, e.to_string()))
    }

    pub fn snapshot_ids(&self) -> Result<Vec<SnapshotId>> {
        let ids: Vec<SnapshotId> = self
            .list_cacheable("snapshots")?
            .iter()
            .filter_map(|n| n.strip_prefix("snapshots/")?.parse().ok())
            .collect();
        self.access.saw_snapshots(&ids);
        Ok(ids)
    }

    /// Every snapshot, oldest first.
    pub fn snapshots(&self) -> Result<SnapshotList> {
        let mut list = SnapshotList {
            snapshots: Vec::new(),
            damaged: Vec::new(),
        };
        if self.key.is_write_only() {
            // Its own, as its client remembers them: it cannot open any other.
            list.snapshots = self.writer_state().snapshots();
            return Ok(list);
        }
        let ids = self.snapshot_ids()?;
        let readers = snapshot_readers(ids.len(), self.storage.is_remote());
        for (id, loaded) in ids
            .iter()
            .zip(map_in_parallel(&ids, readers, |id| self.load_snapshot(id)))
        {
            match loaded {
                Ok(s) => list.snapshots.push((*id, s)),
                Err(e) => list.damaged.push((*id, e)),
            }
        }
        list.snapshots.sort_by_key(|(id, s)| (s.time, *id));
        Ok(list)
    }

    /// Whether `storage` holds a repository of a format this version reads, without a key:
    /// lets a caller say "not a repository" before asking for a password.
    pub fn check_config(storage: &dyn Storage) -> Result<()> {
        read_config(storage).map(|_| ())
    }

    /// Resolves `latest`, a full id or a unique prefix of one.
    pub fn find_snapshot(&self, spec: &str) -> Result<(SnapshotId, Snapshot)> {
        if spec == "latest" {
            return self
                .snapshots()?
                .snapshots
                .pop()
                .ok_or_else(|| Error::SnapshotNotFound {
                    spec: spec.to_string(),
                });
        }
        let id = self.resolve_snapshot_id(spec)?;
        Ok((id, self.load_snapshot(&id)?))
    }

    /// Resolves a full id or a unique prefix without reading the snapshot, so that a
    /// damaged one can still be named (to remove it).
    pub fn resolve_snapshot_id(&self, spec: &str) -> Result<SnapshotId> {
        let not_found = || Error::SnapshotNotFound {
            spec: spec.to_string(),
        };
        let spec_lower = spec.to_ascii_lowercase();
        if spec.is_empty() || !spec_lower.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(not_found());
        }
        let matches: Vec<SnapshotId> = self
            .snapshot_ids()?
            .into_iter()
            .filter(|id| id.to_hex().starts_with(&spec_lower))
            .collect();
        match matches.as_slice() {
            [] => Err(not_found()),
            [id] => Ok(*id),
            many => Err(Error::SnapshotAmbiguous {
                spec: spec.to_string(),
                candidates: many.iter().map(|id| id.short()).collect(),
            }),
        }
    }
}

fn read_config(storage: &dyn Storage) -> Result<Config> {
    let location = storage.location();
    let bytes = match storage.read("config") {
        Ok(b) => b,
        Err(StorageError::NotFound { .. }) => return Err(Error::NotARepository { location }),
        Err(e) => return Err(e.into()),
    };
    Config::parse(&bytes).map_err(|e| config_error(storage, e))
}

fn config_error(storage: &dyn Storage, e: ConfigError) -> Error {
    let location = storage.location();
    match e {
        ConfigError::UnsupportedVersion(found) => Error::UnsupportedVersion {
            location,
            found,
            supported: FORMAT_VERSION,
        },
        ConfigError::Malformed(reason) => Error::CorruptObject {
            location,
            name: "config".into(),
            reason,
        },
        ConfigError::NotAuthentic(reason) => Error::ConfigNotAuthentic { location, reason },
    }
}

/// Whether a blob's plaintext is hashed against its id when it is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IdCheck {
    /// Always: every reader but restore's pack path, and restore with `--verify`.
    Always,
    /// Only where the seal does not already prove the id: restore, where hashing every
    /// blob again cost 12% of the CPU time of restoring the Linux tree (`perf`, format 3,
    /// AEGIS-256, 2026-11-27).
    WhereSealDoesNot,
}

/// A repository in `dir` with a key that derives in a moment, for unit tests.
#[cfg(test)]
pub(crate) fn test_repository(dir: &std::path::Path) -> Repository {
    let opts = InitOptions {
        kdf: KdfParams {
            memory_kib: 8,
            iterations: 1,
            parallelism: 1,
        },
        ..InitOptions::default()
    };
    let storage = Arc::new(cairn_storage::LocalStorage::new(dir));
    Repository::init(storage, b"pw", &opts).expect("a test repository")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_mapped_in_parallel_come_back_in_order_whatever_the_threads() {
        for count in [0usize, 1, 2, 7, 37] {
            let items: Vec<usize> = (0..count).collect();
            for threads in 1..=6 {
                let got = map_in_parallel(&items, threads, |i| i * 10);
                let want: Vec<usize> = items.iter().map(|i| i * 10).collect();
                assert_eq!(got, want, "{count} items on {threads} threads");
            }
        }
    }

    /// Enough snapshots to be read on several threads (where there are several cores),
    /// one of them tampered with: every intact one is listed, in time order, and the
    /// tampered one is reported damaged under its own id, not a neighbour's.
    #[test]
    fn snapshots_read_on_several_threads_are_each_listed_or_reported_as_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let repo = test_repository(dir.path());
        let count = 300;
        let start = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let ids: Vec<SnapshotId> = (0..count)
            .map(|i| {
                let snapshot = Snapshot {
                    time: start + jiff::SignedDuration::from_secs(i),
                    host: format!("host-{i}"),
                    username: "u".into(),
                    paths: vec!["/p".into()],
                    tags: Vec::new(),
                    tree: BlobId([0; 32]),
                    parent: None,
                    original: None,
                    program_version: "test".into(),
                    summary: Default::default(),
                };
                repo.save_snapshot(&snapshot).unwrap()
            })
            .collect();
        let tampered = ids[123];
        let path = dir.path().join(tampered.storage_name());
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();

        let list = repo.snapshots().unwrap();
        let damaged: Vec<SnapshotId> = list.damaged.iter().map(|(id, _)| *id).collect();
        assert_eq!(damaged, [tampered]);
        let hosts: Vec<&str> = list
            .snapshots
            .iter()
            .map(|(_, s)| s.host.as_str())
            .collect();
        let want: Vec<String> = (0..count)
            .filter(|&i| i != 123)
            .map(|i| format!("host-{i}"))
            .collect();
        assert_eq!(hosts, want);
        for (id, s) in &list.snapshots {
            let i: usize = s.host["host-".len()..].parse().unwrap();
            assert_eq!(*id, ids[i], "snapshot {i} listed under another id");
        }
    }

    #[test]
    fn snapshots_are_read_on_one_thread_locally_unless_there_are_hundreds() {
        assert_eq!(snapshot_readers(0, false), 1);
        assert_eq!(snapshot_readers(98, false), 1);
        let cores = crate::cores().map_or(1, |n| n.get());
        assert_eq!(snapshot_readers(1000, false), cores.min(4));
        // A remote store: a thread for every few requests, at most 16.
        assert_eq!(snapshot_readers(3, true), 1);
        assert_eq!(snapshot_readers(20, true), 5);
        assert_eq!(snapshot_readers(1000, true), 16);
    }

    /// A blob sealed with the repository's key under an id its plaintext does not have:
    /// what only a faulty sealer holding the key could make (no attacker can).
    fn sealed_under_a_wrong_id(repo: &Repository, plain: &[u8]) -> (BlobId, BlobLocation, Vec<u8>) {
        let id = repo.key().blob_id(b"what the id names");
        let tagged = compress::compress(Compression::default(), plain);
        let sealed = repo.key().seal(Purpose::DataBlob(id), &tagged);
        let loc = BlobLocation {
            pack: PackId([0; 32]),
            kind: BlobKind::Data,
            offset: 0,
            length: sealed.len() as u32,
            raw_length: plain.len() as u32,
        };
        (id, loc, sealed)
    }

    /// Restore leaves out the hash of a blob's plaintext only where the seal proves the
    /// id (format 2 on): in format 1, and with `--verify` (`IdCheck::Always`), a blob
    /// whose plaintext does not have its id is refused; a changed byte is refused always.
    #[test]
    fn a_blobs_id_is_taken_from_its_seal_only_where_the_seal_proves_it() {
        let plain = b"what the blob holds, in a restore".repeat(50);
        for format in [1, FORMAT_VERSION] {
            let dir = tempfile::tempdir().unwrap();
            let opts = InitOptions {
                kdf: KdfParams {
                    memory_kib: 8,
                    iterations: 1,
                    parallelism: 1,
                },
                format,
                ..InitOptions::default()
            };
            let storage = Arc::new(cairn_storage::LocalStorage::new(dir.path()));
            let repo = Repository::init(storage, b"pw", &opts).unwrap();
            let (id, loc, sealed) = sealed_under_a_wrong_id(&repo, &plain);
            let open = |sealed: &[u8], check| {
                let mut sealed = sealed.to_vec();
                let mut scratch = Vec::new();
                repo.open_blob_in_place(&id, &loc, &mut sealed, check, Some(&mut scratch))
                    .map(Cow::into_owned)
            };
            assert!(
                matches!(
                    open(&sealed, IdCheck::Always),
                    Err(Error::BlobDamaged { .. })
                ),
                "format {format}: hashed, the plaintext does not give the id"
            );
            match (format, open(&sealed, IdCheck::WhereSealDoesNot)) {
                (1, Err(Error::BlobDamaged { .. })) => {}
                (1, other) => panic!("format 1 binds no id in its seal: {other:?}"),
                (_, Ok(opened)) => assert_eq!(opened, plain, "the seal vouches for it"),
                (_, Err(e)) => panic!("format {format}: {e}"),
            }
            for i in [0, sealed.len() / 2, sealed.len() - 1] {
                let mut changed = sealed.clone();
                changed[i] ^= 1;
                assert!(
                    open(&changed, IdCheck::WhereSealDoesNot).is_err(),
                    "format {format}: byte {i} changed"
                );
            }
        }
    }
}

//! The index: which pack holds each blob, and where. On storage it is a set of immutable,
//! sealed index files, each written after the packs it names are durable.
//!
//! In memory it must stay small, since every backup holds all of it: 48 bytes per blob
//! (a 10-million-blob repository's index takes 480 MB), so no hash map (whose buckets,
//! spare capacity and 32-byte pack id per blob cost over 100). Blobs sit in a table sorted
//! by id; packs are numbered in a pack table and each blob names its pack by number. Blobs
//! added after loading go to a second, smaller sorted table that is merged into the main
//! one when it grows past a fraction of it, so adding a pack costs about the pack's size
//! rather than the index's. Loading (see [`IndexBuilder`]) collects every entry, sorts
//! once and keeps each blob's preferred entry, so it never holds two copies of the index.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::crypto::{MasterKey, Purpose, WRITERS_FORMAT};
use crate::id::{BlobId, PackId};
use crate::pack::{BlobKind, PackEntry};

/// Index files of format 1 and 2 repositories.
const INDEX_VERSION: u32 = 1;
/// Format 3's: version 1 followed by the packs that writers sealed.
const WRITERS_INDEX_VERSION: u32 = 2;

/// One index file, as read or to be written.
#[derive(Debug, Default)]
pub struct IndexFile {
    pub version: u32,
    pub packs: Vec<IndexedPack>,
    /// Packs among `packs` that a writer (a write-only key) sealed and prune has not yet
    /// verified: their blobs are opened with the writer's key and checked against their
    /// ids, and full keys do not deduplicate against them. Every pack of a file a writer
    /// sealed is one.
    pub writer_packs: HashSet<PackId>,
}

/// The stored form, version 1.
#[derive(Serialize, Deserialize)]
struct StoredV1 {
    version: u32,
    packs: Vec<IndexedPack>,
}

/// The stored form, version 2.
#[derive(Serialize, Deserialize)]
struct StoredV2 {
    version: u32,
    packs: Vec<IndexedPack>,
    writer_packs: Vec<PackId>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IndexedPack {
    pub id: PackId,
    pub entries: Vec<PackEntry>,
}

impl IndexFile {
    /// The file's stored form. Takes the file, so that its entries are dropped once
    /// serialized, before they are compressed and sealed. A writer's own files list no
    /// writer packs: every pack in them is one.
    pub fn seal(self, key: &MasterKey) -> Vec<u8> {
        let plain = if key.format() >= WRITERS_FORMAT {
            let mut writer_packs: Vec<PackId> = if key.is_write_only() {
                Vec::new()
            } else {
                self.writer_packs.into_iter().collect()
            };
            writer_packs.sort();
            let stored = StoredV2 {
                version: WRITERS_INDEX_VERSION,
                packs: self.packs,
                writer_packs,
            };
            postcard::to_stdvec(&stored).expect("an index serializes")
        } else {
            let stored = StoredV1 {
                version: INDEX_VERSION,
                packs: self.packs,
            };
            postcard::to_stdvec(&stored).expect("an index serializes")
        };
        crate::object::seal(key, Purpose::Index, &plain)
    }

    pub fn open(key: &MasterKey, bytes: &[u8]) -> Result<Self, String> {
        let plain = crate::object::open(key, Purpose::Index, bytes)?;
        let (version, _) = postcard::take_from_bytes::<u32>(&plain).map_err(|e| e.to_string())?;
        let (packs, listed) = match version {
            INDEX_VERSION => {
                let stored: StoredV1 = postcard::from_bytes(&plain).map_err(|e| e.to_string())?;
                (stored.packs, Vec::new())
            }
            WRITERS_INDEX_VERSION if key.format() >= WRITERS_FORMAT => {
                let stored: StoredV2 = postcard::from_bytes(&plain).map_err(|e| e.to_string())?;
                (stored.packs, stored.writer_packs)
            }
            v => return Err(format!("unknown index version {v}")),
        };
        let writer_packs = if key.sealed_by_writer(bytes) {
            packs.iter().map(|p| p.id).collect()
        } else {
            listed.into_iter().collect()
        };
        Ok(IndexFile {
            version,
            packs,
            writer_packs,
        })
    }

    pub fn new(packs: Vec<IndexedPack>) -> Self {
        IndexFile {
            version: INDEX_VERSION,
            packs,
            writer_packs: HashSet::new(),
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

/// The kind bit of [`Entry::pack`]: set for trees.
const TREE: u32 = 1 << 31;

/// One blob as the in-memory index keeps it: 48 bytes (a unit test holds it to that).
#[derive(Debug, Clone, Copy)]
struct Entry {
    id: BlobId,
    /// The pack's number in [`Packs`], with [`TREE`] set for a tree.
    pack: u32,
    offset: u32,
    length: u32,
    raw_length: u32,
}

impl Entry {
    fn new(e: &PackEntry, pack: u32) -> Self {
        let kind = match e.kind {
            BlobKind::Data => 0,
            BlobKind::Tree => TREE,
        };
        Entry {
            id: e.id,
            pack: pack | kind,
            offset: e.offset,
            length: e.length,
            raw_length: e.raw_length,
        }
    }

    fn pack_number(&self) -> u32 {
        self.pack & !TREE
    }

    fn kind(&self) -> BlobKind {
        if self.pack & TREE == 0 {
            BlobKind::Data
        } else {
            BlobKind::Tree
        }
    }
}

/// The packs the index knows, numbered in the order it learnt of them.
#[derive(Debug, Default)]
struct Packs {
    ids: Vec<PackId>,
    condemned: Vec<bool>,
    /// Sealed by a writer: readable, but no backup of a full key builds on it.
    writer: Vec<bool>,
    /// Listed as the repository's own by a file a full key sealed: no writer's file can
    /// make it a writer's (a thief with a writer's key could otherwise list any pack in
    /// one, and full keys would stop building on it).
    own: Vec<bool>,
    numbers: HashMap<PackId, u32>,
}

impl Packs {
    fn number(&mut self, id: PackId) -> u32 {
        if let Some(&n) = self.numbers.get(&id) {
            return n;
        }
        // The top bit of an entry's pack number is its kind. Two billion packs would
        // take an index file of over 64 GB to name, so this cannot come from a disk.
        let n = u32::try_from(self.ids.len())
            .ok()
            .filter(|&n| n < TREE)
            .expect("fewer than 2^31 packs");
        self.ids.push(id);
        self.condemned.push(false);
        self.writer.push(false);
        self.own.push(false);
        self.numbers.insert(id, n);
        n
    }

    fn condemn(&mut self, id: PackId) {
        let n = self.number(id);
        self.condemned[n as usize] = true;
    }

    fn is_condemned(&self, id: &PackId) -> bool {
        self.numbers
            .get(id)
            .is_some_and(|&n| self.condemned[n as usize])
    }

    fn mark_writer(&mut self, id: PackId) {
        let n = self.number(id);
        self.writer[n as usize] = true;
    }

    /// Counts the pack as the repository's own, whatever writers' files say.
    fn mark_own(&mut self, id: PackId) {
        let n = self.number(id);
        self.own[n as usize] = true;
    }

    /// Marks the packs of `file`: a writer's where it says so, else the repository's own.
    fn mark_file(&mut self, file: &IndexFile) {
        for p in &file.packs {
            match file.writer_packs.contains(&p.id) {
                true => self.mark_writer(p.id),
                false => self.mark_own(p.id),
            }
        }
    }

    fn writer_at(&self, n: usize) -> bool {
        self.writer[n] && !self.own[n]
    }

    /// Whether a file that lists `pack` as a writer's speaks for it: not where a full
    /// key's file counts it as the repository's own (a thief's writer file could
    /// otherwise place blobs in it at offsets of its choosing, on equal standing).
    fn writer_speaks_for(&self, file: &IndexFile, pack: &PackId) -> bool {
        !file.writer_packs.contains(pack)
            || !self
                .numbers
                .get(pack)
                .is_some_and(|&n| self.own[n as usize])
    }

    fn is_writer(&self, id: &PackId) -> bool {
        self.numbers
            .get(id)
            .is_some_and(|&n| self.writer_at(n as usize))
    }

    /// Whether a backup may build on the blob at `e`: not in a condemned pack, nor in a
    /// writer's (a writer's word is not a full key's; prune re-seals what is needed).
    fn is_live(&self, e: &Entry) -> bool {
        let n = e.pack_number() as usize;
        !self.condemned[n] && !self.writer_at(n)
    }

    /// How strongly a blob's location is `e`, highest first: a live pack over a condemned
    /// or a writer's one, then the pack learnt of last (as if each pack added overwrote
    /// the locations that packs of its standing gave before).
    fn rank(&self, e: &Entry) -> (bool, u32) {
        (self.is_live(e), e.pack_number())
    }

    /// Sorts `entries` by id and keeps each id's highest-ranked entry; returns the other
    /// locations, sorted as [`Index::spares`] keeps them.
    fn sort_and_keep_preferred(&self, entries: &mut Vec<Entry>) -> Vec<Entry> {
        entries.sort_unstable_by(|a, b| self.order(a, b));
        let mut spares = Vec::new();
        entries.dedup_by(|later, kept| {
            let same = later.id == kept.id;
            if same && !at_same_place(later, kept) {
                spares.push(*later);
            }
            same
        });
        spares.dedup_by(|later, kept| at_same_place(later, kept));
        spares
    }

    /// By id, then highest-ranked first, then by place (so that one place's copies are
    /// neighbours, for `dedup_by`).
    fn order(&self, a: &Entry, b: &Entry) -> std::cmp::Ordering {
        a.id.cmp(&b.id)
            .then_with(|| self.rank(b).cmp(&self.rank(a)))
            .then_with(|| (a.pack, a.offset, a.length).cmp(&(b.pack, b.offset, b.length)))
    }

    fn location(&self, e: &Entry) -> BlobLocation {
        BlobLocation {
            pack: self.ids[e.pack_number() as usize],
            kind: e.kind(),
            offset: e.offset,
            length: e.length,
            raw_length: e.raw_length,
        }
    }
}

/// Whether two entries name the same bytes: one id at one place of one pack.
fn at_same_place(a: &Entry, b: &Entry) -> bool {
    a.id == b.id && a.pack == b.pack && a.offset == b.offset && a.length == b.length
}

/// Entries sorted by id, each id once, and where each run of ids sharing their first
/// `bits` bits starts. Ids are keyed hashes, hence evenly spread: a lookup binary-searches
/// about 32 entries, and the starts cost under an eighth of a byte per entry.
#[derive(Debug)]
struct Table {
    entries: Vec<Entry>,
    /// `starts[b]..starts[b + 1]` holds the ids whose first `bits` bits are `b`.
    starts: Vec<u32>,
    bits: u32,
}

impl Default for Table {
    fn default() -> Self {
        Table::from_sorted(Vec::new())
    }
}

fn bucket(id: &BlobId, bits: u32) -> usize {
    if bits == 0 {
        return 0;
    }
    let prefix = u64::from_be_bytes(id.0[..8].try_into().expect("ids are 32 bytes"));
    (prefix >> (64 - bits)) as usize
}

impl Table {
    fn from_sorted(entries: Vec<Entry>) -> Self {
        let mut table = Table {
            entries,
            starts: Vec::new(),
            bits: 0,
        };
        table.index_starts();
        table
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn index_starts(&mut self) {
        let n = self.entries.len();
        let log2 = usize::BITS - 1 - n.max(1).leading_zeros();
        self.bits = log2.saturating_sub(5).min(24);
        let position = |i: usize| u32::try_from(i).expect("fewer than 2^32 blobs");
        self.starts.clear();
        self.starts.reserve_exact((1 << self.bits) + 1);
        let mut i = 0;
        for b in 0..1usize << self.bits {
            while i < n && bucket(&self.entries[i].id, self.bits) < b {
                i += 1;
            }
            self.starts.push(position(i));
        }
        self.starts.push(position(n));
    }

    fn find(&self, id: &BlobId) -> Option<usize> {
        let b = bucket(id, self.bits);
        let (lo, hi) = (self.starts[b] as usize, self.starts[b + 1] as usize);
        self.entries[lo..hi]
            .binary_search_by(|e| e.id.cmp(id))
            .ok()
            .map(|i| lo + i)
    }

    /// Merges in `new`, sorted and with no id already here, in place from the back: the
    /// table grows by `new` only, never to a second copy of itself.
    fn merge(&mut self, new: &[Entry]) {
        let old = self.entries.len();
        // Grows the table; the merge below overwrites these values.
        self.entries.extend_from_slice(new);
        let (mut i, mut j, mut w) = (old, new.len(), old + new.len());
        while j > 0 {
            w -= 1;
            if i > 0 && self.entries[i - 1].id > new[j - 1].id {
                self.entries[w] = self.entries[i - 1];
                i -= 1;
            } else {
                self.entries[w] = new[j - 1];
                j -= 1;
            }
        }
        self.index_starts();
    }
}

/// Blobs added to a loaded index wait in a table of their own until it holds this share
/// of the main table (or [`MIN_RECENT`] blobs); merging then moves the main table once, so
/// each blob added is moved about this many times, and adding a pack costs at most this
/// share of the index.
const RECENT_SHARE: usize = 8;

/// Entries [`Index::absorb`] moves at a time: 3 MiB, small beside the tables it moves
/// them between, and few enough slices that merging each into the recent table is cheap.
#[cfg(not(test))]
const ABSORB_SLICE: usize = 1 << 16;
/// Small, so that unit tests move many slices.
#[cfg(test)]
const ABSORB_SLICE: usize = 3;

#[cfg(not(test))]
const MIN_RECENT: usize = 1 << 16;
/// Small, so that unit tests merge often.
#[cfg(test)]
const MIN_RECENT: usize = 4;

/// Blob id → location, for every blob of every loaded index file.
///
/// Packs that prune has condemned stay readable, but a blob's location is a live pack
/// whenever one holds it, and new backups do not build on blobs only condemned packs hold.
/// Among packs of the same standing, the one the index learnt of last holds the blob.
#[derive(Debug, Default)]
pub struct Index {
    packs: Packs,
    main: Table,
    /// Blobs added since the last merge into `main`; no id is in both.
    recent: Table,
    /// Other places that index files or packs added give for blobs located elsewhere, by
    /// id and then rank: readers try them when the blob's place cannot be read or is
    /// damaged (a pack lost or rotten where a concurrent backup or a repack stored the
    /// blob again). Usually empty: copies of one blob in two packs are rare, and an entry
    /// that index files repeat is kept once.
    spares: Vec<Entry>,
}

impl Index {
    pub fn add_pack(&mut self, pack: PackId, entries: &[PackEntry]) {
        let number = self.packs.number(pack);
        let mut new: Vec<Entry> = entries.iter().map(|e| Entry::new(e, number)).collect();
        let spares = self.packs.sort_and_keep_preferred(&mut new);
        self.add_spares(spares);
        self.insert(new);
    }

    /// Keeps `more` among the spare places, each place once. Places already kept cost a
    /// search each, not a sort: prune adds every index file again, and each names again
    /// the places it gave before.
    fn add_spares(&mut self, mut more: Vec<Entry>) {
        let spares = &self.spares;
        more.retain(|e| {
            let start = spares.partition_point(|s| s.id < e.id);
            !(spares[start..].iter())
                .take_while(|s| s.id == e.id)
                .any(|s| at_same_place(s, e))
        });
        if more.is_empty() {
            return;
        }
        self.spares.extend(more);
        let packs = &self.packs;
        self.spares.sort_unstable_by(|a, b| packs.order(a, b));
        self.spares
            .dedup_by(|later, kept| at_same_place(later, kept));
    }

    /// Adds every blob `other` locates, each as [`add_pack`](Self::add_pack) would add
    /// its location there; `other`'s condemned packs are condemned here too. Its entries
    /// move over a slice at a time and its table shrinks as they go, so the two indexes
    /// never hold a second copy of them: a backup that added millions of blobs hands
    /// them to the repository's index this way.
    pub fn absorb(&mut self, other: Index) {
        let Index {
            packs: theirs,
            main,
            recent,
            spares,
        } = other;
        // Their pack numbers, as this index numbers the same packs.
        let numbers: Vec<u32> = theirs
            .ids
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                let n = self.packs.number(id) as usize;
                self.packs.condemned[n] |= theirs.condemned[i];
                self.packs.writer[n] |= theirs.writer[i];
                self.packs.own[n] |= theirs.own[i];
                n as u32
            })
            .collect();
        for mut entries in [recent.entries, main.entries] {
            while !entries.is_empty() {
                // The tail is sorted by id, each id once, as `insert` wants it.
                let mut slice = entries.split_off(entries.len().saturating_sub(ABSORB_SLICE));
                entries.shrink_to_fit();
                for e in &mut slice {
                    e.pack = numbers[e.pack_number() as usize] | (e.pack & TREE);
                }
                self.insert(slice);
            }
        }
        let spares = spares
            .into_iter()
            .map(|mut e| {
                e.pack = numbers[e.pack_number() as usize] | (e.pack & TREE);
                e
            })
            .collect();
        self.add_spares(spares);
    }

    /// Adds `new`, sorted by id with each id once: an id the index has keeps the
    /// higher-ranked of its two locations, and the others go to the recent table.
    fn insert(&mut self, mut new: Vec<Entry>) {
        let Index {
            packs,
            main,
            recent,
            ..
        } = self;
        let mut spares = Vec::new();
        new.retain(|e| {
            let old = if let Some(i) = recent.find(&e.id) {
                &mut recent.entries[i]
            } else if let Some(i) = main.find(&e.id) {
                &mut main.entries[i]
            } else {
                return true;
            };
            if !at_same_place(e, old) {
                let (kept, spare) = match packs.rank(e) >= packs.rank(old) {
                    true => (*e, *old),
                    false => (*old, *e),
                };
                *old = kept;
                spares.push(spare);
            }
            false
        });
        self.add_spares(spares);
        let Index { main, recent, .. } = self;
        if new.is_empty() {
            return;
        }
        recent.merge(&new);
        if recent.len() >= MIN_RECENT.max(main.len() / RECENT_SHARE) {
            main.merge(&std::mem::take(recent).entries);
        }
    }

    /// Marks packs as condemned; call before adding them for the preference to apply.
    pub fn condemn(&mut self, packs: impl IntoIterator<Item = PackId>) {
        for p in packs {
            self.packs.condemn(p);
        }
    }

    pub fn is_condemned(&self, pack: &PackId) -> bool {
        self.packs.is_condemned(pack)
    }

    /// Marks packs as sealed by writers; call before adding them for the preference to
    /// apply.
    pub fn mark_writer(&mut self, packs: impl IntoIterator<Item = PackId>) {
        for p in packs {
            self.packs.mark_writer(p);
        }
    }

    /// Unmarks writers' packs whose every blob was verified. Locations already chosen
    /// stay; a blob's location moves to such a pack only as packs are added again.
    pub fn trust_writer(&mut self, packs: impl IntoIterator<Item = PackId>) {
        for p in packs {
            if let Some(&n) = self.packs.numbers.get(&p) {
                self.packs.writer[n as usize] = false;
            }
        }
    }

    /// Whether a writer sealed the pack (see [`IndexFile::writer_packs`]).
    pub fn is_writer_pack(&self, pack: &PackId) -> bool {
        self.packs.is_writer(pack)
    }

    /// Adds every pack of `file`, marking its packs first as writers' or the
    /// repository's own, as it says (a pack that any file a full key sealed counts as its
    /// own stays so); a pack it lists as a writer's that is the repository's own keeps
    /// the entries it has.
    pub fn add_file(&mut self, file: &IndexFile) {
        self.packs.mark_file(file);
        for p in &file.packs {
            if self.packs.writer_speaks_for(file, &p.id) {
                self.add_pack(p.id, &p.entries);
            }
        }
    }

    /// Whether an index or trash file read into this index named the pack (even if every
    /// blob it holds is located elsewhere).
    pub fn knows_pack(&self, pack: &PackId) -> bool {
        self.packs.numbers.contains_key(pack)
    }

    fn entry(&self, id: &BlobId) -> Option<&Entry> {
        match self.recent.find(id) {
            Some(i) => Some(&self.recent.entries[i]),
            None => self.main.find(id).map(|i| &self.main.entries[i]),
        }
    }

    /// Whether a live (not condemned) pack holds the blob: what a backup may build on.
    pub fn contains_live(&self, id: &BlobId) -> bool {
        self.entry(id).is_some_and(|e| self.packs.is_live(e))
    }

    /// The live pack holding the blob, if any: [`Self::contains_live`] and the pack of
    /// [`Self::get`] in one search.
    pub fn live_pack(&self, id: &BlobId) -> Option<PackId> {
        let e = self.entry(id).filter(|e| self.packs.is_live(e))?;
        Some(self.packs.location(e).pack)
    }

    pub fn get(&self, id: &BlobId) -> Option<BlobLocation> {
        self.entry(id).map(|e| self.packs.location(e))
    }

    /// The blob's other places, besides [`get`](Self::get)'s, strongest first: where to
    /// read it when that one fails.
    pub fn other_places(&self, id: &BlobId) -> impl Iterator<Item = BlobLocation> + '_ {
        let preferred = self.entry(id).copied();
        let (id, start) = (*id, self.spares.partition_point(|e| e.id < *id));
        self.spares[start..]
            .iter()
            .take_while(move |e| e.id == id)
            // A spare place can become the preferred one again (its pack added again
            // after the other was condemned).
            .filter(move |e| !preferred.is_some_and(|p| at_same_place(e, &p)))
            .map(|e| self.packs.location(e))
    }

    pub fn contains(&self, id: &BlobId) -> bool {
        self.entry(id).is_some()
    }

    pub fn len(&self) -> usize {
        self.main.len() + self.recent.len()
    }

    /// Every blob, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&BlobId, BlobLocation)> {
        self.main
            .entries
            .iter()
            .chain(&self.recent.entries)
            .map(|e| (&e.id, self.packs.location(e)))
    }

    /// Every pack the index names, with the blobs it says each one holds.
    pub fn by_pack(&self) -> PackGroups<'_> {
        PackGroups::new(self)
    }

    /// The entry at `position`, counting `main` then `recent`.
    fn at(&self, position: usize) -> &Entry {
        match position.checked_sub(self.main.len()) {
            None => &self.main.entries[position],
            Some(i) => &self.recent.entries[i],
        }
    }

    /// Where the blob's entry is, counting `main` then `recent`: a number below
    /// [`len`](Self::len) that stays the blob's while the index is unchanged.
    fn position(&self, id: &BlobId) -> Option<usize> {
        match self.recent.find(id) {
            Some(i) => Some(self.main.len() + i),
            None => self.main.find(id),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The index's blobs grouped by pack, as [`Index::by_pack`] gives them: 4 bytes a blob
/// (each blob's position in the index) and 4 a pack, where a map from pack id to its
/// blobs' locations took over 80 bytes a blob (2.3 GiB for `check` of 10 million blobs).
pub struct PackGroups<'a> {
    index: &'a Index,
    /// Positions in the index, grouped by pack number.
    positions: Vec<u32>,
    /// `starts[n]..starts[n + 1]` are pack number `n`'s positions.
    starts: Vec<u32>,
}

impl<'a> PackGroups<'a> {
    fn new(index: &'a Index) -> Self {
        let position = |i: usize| u32::try_from(i).expect("fewer than 2^32 blobs");
        let packs = index.packs.ids.len();
        // A counting sort: count each pack's blobs, then place each position.
        let mut starts = vec![0u32; packs + 1];
        for i in 0..index.len() {
            starts[index.at(i).pack_number() as usize + 1] += 1;
        }
        for n in 0..packs {
            starts[n + 1] += starts[n];
        }
        let mut next = starts.clone();
        let mut positions = vec![0u32; index.len()];
        for i in 0..index.len() {
            let slot = &mut next[index.at(i).pack_number() as usize];
            positions[*slot as usize] = position(i);
            *slot += 1;
        }
        PackGroups {
            index,
            positions,
            starts,
        }
    }

    fn positions(&self, number: usize) -> &[u32] {
        &self.positions[self.starts[number] as usize..self.starts[number + 1] as usize]
    }

    /// The packs that hold at least one blob, in no particular order.
    pub fn packs(&self) -> impl Iterator<Item = &'a PackId> + '_ {
        let ids = &self.index.packs.ids;
        (0..ids.len())
            .filter(|&n| !self.positions(n).is_empty())
            .map(move |n| &ids[n])
    }

    /// How many packs hold at least one blob.
    pub fn len(&self) -> usize {
        self.packs().count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, pack: &PackId) -> bool {
        self.blob_count(pack) > 0
    }

    /// How many of the index's blobs the pack holds.
    pub fn blob_count(&self, pack: &PackId) -> usize {
        self.index
            .packs
            .numbers
            .get(pack)
            .map_or(0, |&n| self.positions(n as usize).len())
    }

    /// The blobs the index locates in `pack`, in no particular order; empty for a pack it
    /// locates none in.
    pub fn blobs(&self, pack: &PackId) -> Vec<PackEntry> {
        let Some(&n) = self.index.packs.numbers.get(pack) else {
            return Vec::new();
        };
        self.positions(n as usize)
            .iter()
            .map(|&i| {
                let e = self.index.at(i as usize);
                PackEntry {
                    id: e.id,
                    kind: e.kind(),
                    offset: e.offset,
                    length: e.length,
                    raw_length: e.raw_length,
                }
            })
            .collect()
    }
}

/// A set of blob ids that takes one bit for each blob of the index, however many it
/// holds, plus a hash set for ids the index does not hold: what `check` uses to remember
/// every blob it has seen (a hash set of 10 million ids takes over 500 MB; this, 1.2 MB).
pub struct BlobSet<'a> {
    index: &'a Index,
    bits: Vec<u64>,
    unindexed: HashSet<BlobId>,
    len: usize,
}

/// The word of a [`BlobSet`]'s bits that holds position `i`, and its bit there.
fn word_and_bit(i: usize) -> (usize, u64) {
    (i / 64, 1 << (i % 64))
}

impl<'a> BlobSet<'a> {
    pub fn new(index: &'a Index) -> Self {
        BlobSet {
            index,
            bits: vec![0; index.len().div_ceil(64)],
            unindexed: Default::default(),
            len: 0,
        }
    }

    /// Adds `id`; returns whether it was new.
    pub fn insert(&mut self, id: &BlobId) -> bool {
        let new = match self.index.position(id) {
            Some(i) => {
                let (word, bit) = word_and_bit(i);
                let new = self.bits[word] & bit == 0;
                self.bits[word] |= bit;
                new
            }
            None => self.unindexed.insert(*id),
        };
        self.len += usize::from(new);
        new
    }

    pub fn contains(&self, id: &BlobId) -> bool {
        match self.index.position(id) {
            Some(i) => {
                let (word, bit) = word_and_bit(i);
                self.bits[word] & bit != 0
            }
            None => self.unindexed.contains(id),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Builds an [`Index`] from whole index files: it collects every entry, then sorts once
/// and keeps each blob's preferred entry, so loading never holds the index twice (only
/// the duplicates that index files share, until the end).
#[derive(Debug, Default)]
pub struct IndexBuilder {
    packs: Packs,
    entries: Vec<Entry>,
    /// Entries of packs files list as writers', kept apart until every file is in: a
    /// full key's file may yet count the pack as the repository's own, and then these
    /// are dropped.
    writers: Vec<Entry>,
}

impl IndexBuilder {
    /// Marks packs as condemned; unlike [`Index::condemn`], before or after adding them.
    pub fn condemn(&mut self, packs: impl IntoIterator<Item = PackId>) {
        for p in packs {
            self.packs.condemn(p);
        }
    }

    pub fn add_pack(&mut self, pack: PackId, entries: &[PackEntry]) {
        let number = self.packs.number(pack);
        self.entries
            .extend(entries.iter().map(|e| Entry::new(e, number)));
    }

    /// Adds every pack of `file`, marking its packs as [`Index::add_file`] does (before
    /// or after adding); what it lists for a pack as a writer's counts only if no file
    /// counts that pack as the repository's own.
    pub fn add_file(&mut self, file: &IndexFile) {
        self.packs.mark_file(file);
        for p in &file.packs {
            if file.writer_packs.contains(&p.id) {
                let number = self.packs.number(p.id);
                self.writers
                    .extend(p.entries.iter().map(|e| Entry::new(e, number)));
            } else {
                self.add_pack(p.id, &p.entries);
            }
        }
    }

    /// The index, as if every pack had been condemned first and then added in order.
    pub fn finish(self) -> Index {
        let IndexBuilder {
            packs,
            mut entries,
            writers,
        } = self;
        entries.extend(
            writers
                .into_iter()
                .filter(|e| !packs.own[e.pack_number() as usize]),
        );
        let spares = packs.sort_and_keep_preferred(&mut entries);
        entries.shrink_to_fit();
        Index {
            packs,
            main: Table::from_sorted(entries),
            recent: Table::default(),
            spares,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn an_entry_takes_48_bytes() {
        assert_eq!(std::mem::size_of::<Entry>(), 48);
    }

    fn blob(n: u8) -> BlobId {
        BlobId(*blake3::hash(&[n]).as_bytes())
    }

    fn entry(id: BlobId, offset: u32) -> PackEntry {
        PackEntry {
            id,
            kind: if offset.is_multiple_of(2) {
                BlobKind::Data
            } else {
                BlobKind::Tree
            },
            offset,
            length: offset + 1,
            raw_length: offset + 2,
        }
    }

    #[test]
    fn a_live_pack_holds_a_blob_over_a_condemned_one_whatever_the_order() {
        let (old, new) = (PackId([1; 32]), PackId([2; 32]));
        let mut index = Index::default();
        index.condemn([old]);
        index.add_pack(new, &[entry(blob(1), 10)]);
        index.add_pack(old, &[entry(blob(1), 20), entry(blob(2), 30)]);
        assert_eq!(index.get(&blob(1)).map(|l| l.pack), Some(new));
        assert!(index.contains_live(&blob(1)));
        assert_eq!(index.get(&blob(2)).map(|l| l.pack), Some(old));
        assert!(index.contains(&blob(2)) && !index.contains_live(&blob(2)));
        assert_eq!(index.len(), 2);
    }

    /// A pack that names a blob at two places (a planted entry beside the true one) and
    /// says so again: each place is kept once, whatever the order, loaded or added.
    #[test]
    fn every_other_place_of_a_blob_is_kept_once_even_two_in_one_pack() {
        let (a, b) = (PackId([1; 32]), PackId([2; 32]));
        let places = |index: &Index| {
            let mut got: Vec<(PackId, u32)> = (index.other_places(&blob(1)))
                .map(|l| (l.pack, l.offset))
                .collect();
            got.sort_by_key(|(p, o)| (p.0, *o));
            (index.get(&blob(1)).map(|l| (l.pack, l.offset)), got)
        };
        let twice = [entry(blob(1), 10), entry(blob(1), 30)];
        let want = (Some((b, 20)), vec![(a, 10), (a, 30)]);
        let mut added = Index::default();
        let mut loaded = IndexBuilder::default();
        for _ in 0..2 {
            added.add_pack(a, &twice);
            added.add_pack(b, &[entry(blob(1), 20)]);
            added.add_pack(a, &[entry(blob(1), 30), entry(blob(1), 10)]);
            loaded.add_pack(a, &twice);
            loaded.add_pack(b, &[entry(blob(1), 20)]);
            loaded.add_pack(a, &[entry(blob(1), 30), entry(blob(1), 10)]);
        }
        assert_eq!(places(&added), want);
        assert_eq!(places(&loaded.finish()), want);
    }

    #[test]
    fn adding_the_packs_again_after_condemning_moves_blobs_to_live_copies() {
        // What prune does after condemning packs: the blob was located in the pack
        // condemned later, and must now be located in the other copy.
        let (a, b) = (PackId([1; 32]), PackId([2; 32]));
        let mut index = Index::default();
        index.add_pack(a, &[entry(blob(1), 10)]);
        index.add_pack(b, &[entry(blob(1), 20)]);
        assert_eq!(index.get(&blob(1)).map(|l| l.pack), Some(b));
        index.condemn([b]);
        assert!(!index.contains_live(&blob(1)));
        index.add_pack(a, &[entry(blob(1), 10)]);
        index.add_pack(b, &[entry(blob(1), 20)]);
        assert_eq!(index.get(&blob(1)).map(|l| l.pack), Some(a));
        assert!(index.contains_live(&blob(1)));
    }

    #[test]
    fn lookups_find_every_blob_of_a_large_index_and_no_other() {
        let id = |n: u32| BlobId(*blake3::hash(&n.to_le_bytes()).as_bytes());
        let pack_of = |n: u32| PackId([(n / 1000) as u8; 32]);
        let entries = |packs: std::ops::Range<u32>| {
            packs.map(move |p| {
                let blobs = (p * 1000..(p + 1) * 1000).map(|n| entry(id(n), n));
                (pack_of(p * 1000), blobs.collect::<Vec<_>>())
            })
        };
        let mut builder = IndexBuilder::default();
        for (pack, blobs) in entries(0..20) {
            builder.add_pack(pack, &blobs);
        }
        let mut index = builder.finish();
        for (pack, blobs) in entries(20..30) {
            index.add_pack(pack, &blobs);
        }
        assert_eq!(index.len(), 30_000);
        for n in 0..30_000 {
            assert_eq!(
                index.get(&id(n)).map(|l| (l.pack, l.offset)),
                Some((pack_of(n), n))
            );
        }
        assert!((30_000..40_000).all(|n| !index.contains(&id(n))));
    }

    /// The rule [`Index`] documents, kept the obvious way: one hash map of locations.
    #[derive(Default)]
    struct Model {
        /// Packs in the order the index learnt of them.
        order: Vec<PackId>,
        condemned: HashSet<PackId>,
        blobs: HashMap<BlobId, BlobLocation>,
        /// Every pack each blob was added in.
        places: HashMap<BlobId, HashSet<PackId>>,
    }

    impl Model {
        fn learn(&mut self, pack: PackId) {
            if !self.order.contains(&pack) {
                self.order.push(pack);
            }
        }

        fn rank(&self, pack: &PackId) -> (bool, usize) {
            let seen = self.order.iter().position(|p| p == pack);
            (!self.condemned.contains(pack), seen.expect("a known pack"))
        }

        fn condemn(&mut self, pack: PackId) {
            self.learn(pack);
            self.condemned.insert(pack);
        }

        fn add_pack(&mut self, pack: PackId, entries: &[PackEntry]) {
            self.learn(pack);
            for e in entries {
                self.places.entry(e.id).or_default().insert(pack);
                let keep_old = self
                    .blobs
                    .get(&e.id)
                    .is_some_and(|old| self.rank(&old.pack) > self.rank(&pack));
                if !keep_old {
                    let loc = BlobLocation {
                        pack,
                        kind: e.kind,
                        offset: e.offset,
                        length: e.length,
                        raw_length: e.raw_length,
                    };
                    self.blobs.insert(e.id, loc);
                }
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Condemn(u8),
        Add(u8, Vec<u8>),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let op = prop_oneof![
            1 => (0..6u8).prop_map(Op::Condemn),
            4 => (0..6u8, prop::collection::vec(0..60u8, 0..25))
                .prop_map(|(p, blobs)| Op::Add(p, blobs)),
        ];
        prop::collection::vec(op, 0..40)
    }

    /// Entries of pack `p`: one per blob, as a pack header has them, and where a blob is
    /// in a pack never changes (an index file may name a pack again, never differently).
    fn pack_entries(p: u8, blobs: &[u8]) -> Vec<PackEntry> {
        let mut seen = HashSet::new();
        blobs
            .iter()
            .filter(|b| seen.insert(**b))
            .map(|&b| entry(blob(b), u32::from(p) * 100 + u32::from(b)))
            .collect()
    }

    fn assert_same(index: &Index, model: &Model) {
        assert_eq!(index.len(), model.blobs.len());
        assert_eq!(index.is_empty(), model.blobs.is_empty());
        for b in 0..60 {
            let id = blob(b);
            let want = model.blobs.get(&id).copied();
            assert_eq!(index.get(&id), want, "blob {b}");
            assert_eq!(index.contains(&id), want.is_some());
            let live = want.is_some_and(|l| !model.condemned.contains(&l.pack));
            assert_eq!(index.contains_live(&id), live, "blob {b}");
            // Its other places: every other pack it was added in, each once.
            let mut places: Vec<PackId> = index.other_places(&id).map(|l| l.pack).collect();
            places.extend(want.map(|l| l.pack));
            let distinct: HashSet<PackId> = places.iter().copied().collect();
            assert_eq!(distinct.len(), places.len(), "blob {b}: {places:?}");
            assert_eq!(
                Some(&distinct).filter(|d| !d.is_empty()),
                model.places.get(&id)
            );
        }
        for p in 0..6 {
            let pack = PackId([p; 32]);
            assert_eq!(index.is_condemned(&pack), model.condemned.contains(&pack));
        }
        let listed: HashMap<BlobId, BlobLocation> = index.iter().map(|(i, l)| (*i, l)).collect();
        assert_eq!(listed, model.blobs);
        let by_pack = index.by_pack();
        let mut grouped: HashMap<PackId, HashSet<BlobId>> = HashMap::new();
        for (id, l) in &model.blobs {
            grouped.entry(l.pack).or_default().insert(*id);
        }
        let packs: HashSet<PackId> = by_pack.packs().copied().collect();
        assert_eq!(packs, grouped.keys().copied().collect());
        assert_eq!(by_pack.len(), grouped.len());
        for p in 0..7 {
            let pack = PackId([p; 32]);
            let blobs = by_pack.blobs(&pack);
            let want = grouped.get(&pack).map_or(0, HashSet::len);
            assert_eq!((blobs.len(), by_pack.blob_count(&pack)), (want, want));
            assert_eq!(by_pack.contains(&pack), want > 0);
            for e in blobs {
                let l = model.blobs[&e.id];
                assert_eq!(l.pack, pack);
                assert_eq!(
                    (e.kind, e.offset, e.length, e.raw_length),
                    (l.kind, l.offset, l.length, l.raw_length)
                );
            }
        }
        // A set of every third blob, and of ids the index may not hold.
        let mut set = BlobSet::new(index);
        for b in (0..70).step_by(3) {
            assert!(set.insert(&blob(b)), "blob {b} is new");
            assert!(!set.insert(&blob(b)), "blob {b} is not new the second time");
        }
        assert_eq!(set.len(), (0..70).step_by(3).count());
        for b in 0..70 {
            assert_eq!(set.contains(&blob(b)), b % 3 == 0, "blob {b}");
        }
    }

    proptest! {
        #[test]
        fn the_index_agrees_with_a_hash_map_after_any_adds_and_condemnations(ops in ops()) {
            let mut index = Index::default();
            let mut model = Model::default();
            for op in &ops {
                apply(&mut index, &mut model, op);
                assert_same(&index, &model);
            }
        }

        #[test]
        fn building_at_once_equals_condemning_then_adding_one_pack_at_a_time(ops in ops()) {
            let mut builder = IndexBuilder::default();
            // Packs are numbered as the builder learns of them; then all condemnations
            // apply before any pack is added.
            let mut model = Model::default();
            for op in &ops {
                match op {
                    Op::Condemn(p) => {
                        builder.condemn([PackId([*p; 32])]);
                        model.condemn(PackId([*p; 32]));
                    }
                    Op::Add(p, blobs) => {
                        builder.add_pack(PackId([*p; 32]), &pack_entries(*p, blobs));
                        model.learn(PackId([*p; 32]));
                    }
                }
            }
            for op in &ops {
                if let Op::Add(p, blobs) = op {
                    model.add_pack(PackId([*p; 32]), &pack_entries(*p, blobs));
                }
            }
            let mut index = builder.finish();
            assert_same(&index, &model);
            // And packs added after loading go on from there.
            let more = pack_entries(9, &(0..30).map(|b| b * 2).collect::<Vec<_>>());
            index.add_pack(PackId([9; 32]), &more);
            model.add_pack(PackId([9; 32]), &more);
            assert_same(&index, &model);
        }
    }

    /// Applies `op` to both the index and the model.
    fn apply(index: &mut Index, model: &mut Model, op: &Op) {
        match op {
            Op::Condemn(p) => {
                index.condemn([PackId([*p; 32])]);
                model.condemn(PackId([*p; 32]));
            }
            Op::Add(p, blobs) => {
                let entries = pack_entries(*p, blobs);
                index.add_pack(PackId([*p; 32]), &entries);
                model.add_pack(PackId([*p; 32]), &entries);
            }
        }
    }

    fn build(ops: &[Op]) -> (Index, Model) {
        let mut index = Index::default();
        let mut model = Model::default();
        for op in ops {
            apply(&mut index, &mut model, op);
        }
        (index, model)
    }

    proptest! {
        #[test]
        fn absorbing_an_index_adds_each_of_its_locations_as_add_pack_would(
            ours in ops(),
            theirs in ops(),
        ) {
            let (mut index, mut model) = build(&ours);
            let (other, other_model) = build(&theirs);
            // The packs `other` knows, in its order, with its condemnations; then each
            // blob's location there, one at a time.
            for pack in &other_model.order {
                model.learn(*pack);
                if other_model.condemned.contains(pack) {
                    model.condemned.insert(*pack);
                }
            }
            for (id, packs) in &other_model.places {
                model.places.entry(*id).or_default().extend(packs);
            }
            for (id, l) in &other_model.blobs {
                let e = PackEntry {
                    id: *id,
                    kind: l.kind,
                    offset: l.offset,
                    length: l.length,
                    raw_length: l.raw_length,
                };
                model.add_pack(l.pack, &[e]);
            }
            index.absorb(other);
            assert_same(&index, &model);
        }
    }

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

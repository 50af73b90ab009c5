//! The in-memory storage, with its own clock and listings that see each name as it was
//! at some moment, and what readers build from it: the index and the trash.

use super::*;

/// One file, kept after deletion so that a paginated listing can see it as it was.
pub(super) struct Entry<T> {
    pub(super) created: u64,
    pub(super) deleted: Option<u64>,
    pub(super) body: T,
}

/// A directory: names are random numbers, listed in name order like hashes.
pub(super) struct Dir<T> {
    pub(super) files: BTreeMap<u64, Entry<T>>,
}

impl<T> Default for Dir<T> {
    fn default() -> Self {
        Dir {
            files: BTreeMap::new(),
        }
    }
}

impl<T> Dir<T> {
    pub(super) fn get(&self, name: u64) -> Option<&T> {
        self.files
            .get(&name)
            .filter(|e| e.deleted.is_none())
            .map(|e| &e.body)
    }

    pub(super) fn exists(&self, name: u64) -> bool {
        self.get(name).is_some()
    }

    pub(super) fn live(&self) -> impl Iterator<Item = (u64, &T)> {
        self.files
            .iter()
            .filter(|(_, e)| e.deleted.is_none())
            .map(|(n, e)| (*n, &e.body))
    }

    /// A listing that began at `from` and ends at `to`: pages are read one after the
    /// other, so each name is seen as it was at a later moment than the names before it.
    /// A listing takes at most [`MAX_LISTING`], less than a heartbeat interval (what
    /// `session.rs` assumes).
    pub(super) fn list(&self, from: u64, to: u64, rng: &mut StdRng) -> Vec<(u64, u64)> {
        let from = from.max(to.saturating_sub(MAX_LISTING));
        let mut moments: Vec<u64> = (0..self.files.len())
            .map(|_| rng.gen_range(from..=to.max(from)))
            .collect();
        moments.sort_unstable();
        self.files
            .iter()
            .zip(moments)
            .filter(|((_, e), t)| e.created <= *t && e.deleted.is_none_or(|d| *t < d))
            .map(|((n, e), _)| (*n, e.created))
            .collect()
    }
}

#[derive(Debug, Clone)]
pub(super) struct TrashFile {
    pub(super) generation: u64,
    /// Pack → the generation that condemned it.
    pub(super) packs: Vec<(u64, u64)>,
    /// A notice for writers (`trash::notice_bytes`): the packs, in plaintext, that the
    /// trash file written after it condemns. Full keys pass over it.
    pub(super) notice: bool,
}

pub(super) type IndexFile = Vec<(u64, Vec<u32>)>;

#[derive(Default)]
pub(super) struct Storage {
    pub(super) now: u64,
    pub(super) packs: Dir<Vec<u32>>,
    pub(super) index: Dir<IndexFile>,
    pub(super) trash: Dir<TrashFile>,
    pub(super) snapshots: Dir<Vec<u32>>,
    pub(super) sessions: Dir<SessionInfo>,
    /// Blob → how many stored packs hold it.
    pub(super) holders: HashMap<u32, u32>,
}

/// Names a new file and advances the clock by the write's duration.
pub(super) fn write<T>(dir: &mut Dir<T>, now: &mut u64, rng: &mut StdRng, body: T) -> u64 {
    *now += rng.gen_range(1..=800);
    let mut name = rng.gen::<u64>();
    while dir.files.contains_key(&name) {
        name = rng.gen();
    }
    dir.files.insert(
        name,
        Entry {
            created: *now,
            deleted: None,
            body,
        },
    );
    name
}

/// Deletes quietly (a missing file is fine, as `delete_quietly` is).
pub(super) fn delete<'a, T>(
    dir: &'a mut Dir<T>,
    now: &mut u64,
    rng: &mut StdRng,
    name: u64,
) -> Option<&'a T> {
    *now += rng.gen_range(1..=800);
    match dir.files.get_mut(&name) {
        Some(e) if e.deleted.is_none() => {
            e.deleted = Some(*now);
            Some(&e.body)
        }
        _ => None,
    }
}

impl Storage {
    pub(super) fn write_pack(&mut self, rng: &mut StdRng, blobs: Vec<u32>) -> u64 {
        for b in &blobs {
            *self.holders.entry(*b).or_default() += 1;
        }
        write(&mut self.packs, &mut self.now, rng, blobs)
    }

    pub(super) fn delete_pack(&mut self, rng: &mut StdRng, pack: u64) {
        if let Some(blobs) = delete(&mut self.packs, &mut self.now, rng, pack) {
            for b in blobs.clone() {
                *self.holders.get_mut(&b).expect("counted") -= 1;
            }
        }
    }
}

pub(super) fn sys(t: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(EPOCH_MS + t)
}

pub(super) fn pack_id(p: u64) -> PackId {
    let mut raw = [0u8; 32];
    raw[..8].copy_from_slice(&p.to_be_bytes());
    PackId(raw)
}

pub(super) fn pack_of(id: &PackId) -> u64 {
    u64::from_be_bytes(id.0[..8].try_into().expect("8 bytes"))
}

// ---------------------------------------------------------------------------------------
// What readers build: the in-memory index and the trash as read

/// `index::Index` as far as the protocol sees it: a blob's location is a live pack over
/// a condemned one, then the pack numbered last (numbers in order of first sight).
#[derive(Default, Clone)]
pub(super) struct Idx {
    pub(super) numbers: HashMap<u64, u32>,
    pub(super) condemned: HashSet<u64>,
    pub(super) holders: HashMap<u32, Vec<u64>>,
}

impl Idx {
    pub(super) fn number(&mut self, p: u64) -> u32 {
        let n = self.numbers.len() as u32;
        *self.numbers.entry(p).or_insert(n)
    }

    pub(super) fn condemn(&mut self, p: u64) {
        self.number(p);
        self.condemned.insert(p);
    }

    pub(super) fn add_pack(&mut self, p: u64, blobs: &[u32]) {
        self.number(p);
        for b in blobs {
            let h = self.holders.entry(*b).or_default();
            if !h.contains(&p) {
                h.push(p);
            }
        }
    }

    pub(super) fn get(&self, b: u32) -> Option<u64> {
        self.holders
            .get(&b)?
            .iter()
            .max_by_key(|p| (!self.condemned.contains(p), self.numbers[p]))
            .copied()
    }

    pub(super) fn contains_live(&self, b: u32) -> bool {
        self.get(b).is_some_and(|p| !self.condemned.contains(&p))
    }

    pub(super) fn knows_pack(&self, p: u64) -> bool {
        self.numbers.contains_key(&p)
    }
}

#[derive(Default, Clone)]
pub(super) struct Trash {
    pub(super) files: Vec<u64>,
    pub(super) packs: HashMap<u64, u64>,
    pub(super) generation: u64,
    pub(super) problems: bool,
    /// The notices read, and the packs they name: all a writer can read of the trash.
    pub(super) notices: Vec<u64>,
    pub(super) noticed: HashSet<u64>,
}

impl Trash {
    pub(super) fn observed(&self) -> Option<u64> {
        (!self.problems).then_some(self.generation)
    }
}

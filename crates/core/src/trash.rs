//! Trash files: condemned packs, the first phase of two-phase deletion, numbered by
//! generations.
//!
//! Each trash file has a generation and lists every pack still condemned when it was
//! written, each with the generation that condemned it: the newest file is the whole
//! trash, so a reader that sees it knows every pending condemnation up to its
//! generation, whatever other files a listing missed. From the moment a pack is condemned,
//! backups that read the trash do not build on blobs that only condemned packs hold. A
//! pack condemned in generation `g` is deleted only once every live session has observed
//! `g` (see `docs/ARCHITECTURE.md`). One maintenance session at a time writes trash
//! files, so generations only grow.
//!
//! A write-only key cannot open trash files, so beside each one prune writes a *notice*:
//! the same condemned pack ids in plain text, which every writer reads after registering
//! its session and does not build on (format 3). Anyone who can write may add a notice,
//! but a false one only makes writers store data again; none can be removed but by
//! prune.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::crypto::Purpose;
use crate::error::{Error, Result};
use crate::id::{PackId, RawId};
use crate::repo::Repository;

/// Trash files are named by the hash of their bytes, like every other file.
pub type TrashId = crate::id::IndexId;

const VERSION: u32 = 2;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrashFile {
    pub version: u32,
    /// Version 1 files have none: generation 0.
    #[serde(default)]
    pub generation: u64,
    pub packs: Vec<Condemned>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Condemned {
    pub id: PackId,
    #[serde(default)]
    pub generation: u64,
    /// By the condemning host's clock: shown to people, never compared.
    pub condemned_at: jiff::Timestamp,
}

impl TrashFile {
    /// Parses a trash file's plaintext (what `object::open` returns), refusing versions
    /// this cairn does not know.
    pub fn from_json(json: &[u8]) -> std::result::Result<TrashFile, String> {
        let trash: TrashFile = serde_json::from_slice(json).map_err(|e| e.to_string())?;
        if trash.version != 1 && trash.version != VERSION {
            return Err(format!("unknown trash version {}", trash.version));
        }
        Ok(trash)
    }
}

/// The trash as one reader saw it.
#[derive(Debug, Default)]
pub struct Trash {
    /// Storage names of the files read.
    pub files: Vec<String>,
    /// Condemned pack → the generation that condemned it.
    pub packs: HashMap<PackId, Condemned>,
    /// The highest generation seen (0 before the first condemnation).
    pub generation: u64,
    /// Files that could not be read: then this reader does not know every condemnation.
    pub problems: Vec<Error>,
    /// Storage names of the notices read (see the module's documentation).
    pub notices: Vec<String>,
    /// The packs those notices name.
    pub noticed: HashSet<PackId>,
}

impl Trash {
    /// The generation whose condemnations this reader knows all of: `None` when a trash
    /// file could not be read.
    pub fn observed(&self) -> Option<u64> {
        self.problems.is_empty().then_some(self.generation)
    }

    pub fn is_condemned(&self, pack: &PackId) -> bool {
        self.packs.contains_key(pack)
    }

    /// Takes in trash file `name`. A pack named twice counts with its highest
    /// generation: the one fewer sessions have observed.
    pub fn add(&mut self, name: String, file: TrashFile) {
        self.generation = self.generation.max(file.generation);
        for c in file.packs {
            let kept = self.packs.entry(c.id).or_insert(c);
            if c.generation > kept.generation {
                *kept = c;
            }
        }
        self.files.push(name);
    }
}

fn name_of(id: &RawId) -> String {
    format!("trash/{}", hex::encode(id))
}

/// Reads every trash file. A file that vanishes between the listing and the read was
/// replaced by a newer one: the listing is taken again (a few times) so that the newer
/// one is seen.
pub fn read(repo: &Repository) -> Result<Trash> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut trash = Trash::default();
        let mut vanished = false;
        for name in repo.storage().list("trash")? {
            match read_file(repo, &name) {
                // Only prune writes trash, with a full key: a writer's "trash" is a
                // writer's word (or a thief's), and condemns nothing.
                Ok(Read::Ignored) => {}
                Ok(Read::Notice(packs)) => {
                    trash.noticed.extend(packs);
                    trash.notices.push(name);
                }
                Ok(Read::Trash(file)) => trash.add(name, file),
                Err(Error::Storage(cairn_storage::StorageError::NotFound { .. }))
                    if attempt < 4 =>
                {
                    vanished = true;
                    break;
                }
                Err(e) => trash.problems.push(e),
            }
        }
        if !vanished {
            return Ok(trash);
        }
    }
}

/// What a file in `trash/` is.
enum Read {
    Trash(TrashFile),
    /// A notice for writers (see the module's documentation), and the packs it names.
    Notice(Vec<PackId>),
    /// Sealed by a writer: nothing.
    Ignored,
}

fn read_file(repo: &Repository, name: &str) -> Result<Read> {
    let bytes = repo.storage().read(name)?;
    repo.check_name(name, &bytes)?;
    if let Some(packs) = parse_notice(&bytes) {
        return Ok(Read::Notice(packs));
    }
    if repo.key().sealed_by_writer(&bytes) {
        return Ok(Read::Ignored);
    }
    let json = crate::object::open(repo.key(), Purpose::Trash, &bytes)
        .map_err(|r| repo.corrupt(name, r))?;
    TrashFile::from_json(&json)
        .map(Read::Trash)
        .map_err(|r| repo.corrupt(name, r))
}

/// How a notice starts; a pack id in hex follows on each line.
const NOTICE: &[u8] = b"cairn: condemned packs\n";

fn notice_bytes(packs: &[Condemned]) -> Vec<u8> {
    let mut bytes = NOTICE.to_vec();
    for c in packs {
        bytes.extend_from_slice(c.id.to_string().as_bytes());
        bytes.push(b'\n');
    }
    bytes
}

/// The packs a notice names; `None` if `bytes` is not a notice. Lines that are not pack
/// ids are skipped: a notice is a hint, and only ever makes a writer store more.
fn parse_notice(bytes: &[u8]) -> Option<Vec<PackId>> {
    let rest = bytes.strip_prefix(NOTICE)?;
    Some(
        rest.split(|&b| b == b'\n')
            .filter_map(|line| std::str::from_utf8(line).ok()?.parse().ok())
            .collect(),
    )
}

/// Every pack the notices in `trash/` name: what a write-only key must not build on.
/// It cannot open the trash files themselves: [`read`] counts them as problems, which
/// tell a writer nothing it could use.
pub fn noticed(repo: &Repository) -> Result<HashSet<PackId>> {
    Ok(read(repo)?.noticed)
}

/// Writes a trash file; returns its storage name.
fn write(repo: &Repository, trash: &TrashFile) -> Result<String> {
    let json = serde_json::to_vec(trash).expect("a trash file serializes");
    let bytes = crate::object::seal(repo.key(), Purpose::Trash, &json);
    let name = name_of(blake3::hash(&bytes).as_bytes());
    match repo.storage().write(&name, &bytes) {
        // Same content, same name: the file is already there.
        Ok(()) | Err(cairn_storage::StorageError::AlreadyExists { .. }) => Ok(name),
        Err(e) => Err(e.into()),
    }
}

/// Replaces the trash as `trash` holds it with one file of generation `generation`
/// listing `packs`, then deletes the files it replaces; `trash` then describes the new
/// file. Only a maintenance session that no other one runs beside calls this.
pub fn replace(
    repo: &Repository,
    trash: &mut Trash,
    generation: u64,
    packs: Vec<Condemned>,
) -> Result<()> {
    let mut packs = packs;
    packs.sort_by_key(|c| c.id);
    // The notice first: a prune stopped between the two leaves writers avoiding packs
    // that are not condemned, never building on ones that are. Only where write-only
    // keys exist.
    let mut notice_name = None;
    if repo.key().format() >= crate::crypto::WRITERS_FORMAT {
        let notice = notice_bytes(&packs);
        let name = name_of(blake3::hash(&notice).as_bytes());
        match repo.storage().write(&name, &notice) {
            Ok(()) | Err(cairn_storage::StorageError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        notice_name = Some(name);
    }
    let name = write(
        repo,
        &TrashFile {
            version: VERSION,
            generation,
            packs: packs.clone(),
        },
    )?;
    for old in trash.files.iter().chain(&trash.notices) {
        if *old != name && Some(old) != notice_name.as_ref() {
            cairn_storage::delete_if_present(repo.storage().as_ref(), old)?;
        }
    }
    trash.files = vec![name];
    trash.notices = notice_name.into_iter().collect();
    trash.packs = packs.into_iter().map(|c| (c.id, c)).collect();
    trash.generation = generation;
    Ok(())
}

/// Condemns `packs` in a new generation, keeping every pending condemnation (one of
/// generation 0 among `packs` is condemned anew). The new
/// generation is above the trash's and above `floor`, the highest any session has
/// observed (a trash file deleted by hand must not make generations start again).
/// Returns the new generation.
pub fn condemn(repo: &Repository, trash: &mut Trash, packs: &[PackId], floor: u64) -> Result<u64> {
    // Only a planted session file claims a generation this high; wrapping round to 0
    // would let every live session's condemnations count as seen.
    let generation = trash.generation.max(floor).checked_add(1).ok_or_else(|| {
        crate::error::Error::InvalidInput(format!(
            "a session file claims trash generation {}, so no later one exists; \
                 delete the session files in sessions/ that no running command wrote",
            trash.generation.max(floor)
        ))
    })?;
    let now = jiff::Timestamp::now();
    let mut all = trash.packs.clone();
    for &id in packs {
        // Generation 0 (found missing) says nothing of who has seen it: anew.
        if all.get(&id).is_none_or(|c| c.generation == 0) {
            all.insert(
                id,
                Condemned {
                    id,
                    generation,
                    condemned_at: now,
                },
            );
        }
    }
    replace(repo, trash, generation, all.into_values().collect())?;
    Ok(generation)
}

/// [`condemn`] from a fresh read of the trash, refusing when a trash file cannot be read
/// (its generation, and so the next one, would be unknown).
pub fn condemn_with_care(repo: &Repository, packs: &[PackId], floor: u64) -> Result<u64> {
    let mut trash = read(repo)?;
    if let Some(e) = trash.problems.first() {
        return Err(Error::InvalidInput(format!(
            "Cannot condemn packs: a trash file cannot be read ({}); if it is damaged, \
             delete it (its packs are then simply kept) and run this again",
            crate::error::chain(e)
        )));
    }
    condemn(repo, &mut trash, packs, floor)
}

/// Records packs found missing (deleted by hand, lost by the storage) as condemned in
/// generation 0, so that readers locate their blobs in copies stored again and prune drops
/// them from the index. Any session may write this: generation 0 tells a reader that sees
/// only this file nothing about other condemnations, and the next prune that rewrites the
/// trash replaces such files.
pub fn mark_missing(repo: &Repository, packs: &[PackId]) -> Result<()> {
    let now = jiff::Timestamp::now();
    let mut packs: Vec<Condemned> = packs
        .iter()
        .map(|&id| Condemned {
            id,
            generation: 0,
            condemned_at: now,
        })
        .collect();
    packs.sort_by_key(|c| c.id);
    write(
        repo,
        &TrashFile {
            version: VERSION,
            generation: 0,
            packs,
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::repo::test_repository as repository;

    fn pack(n: u8) -> PackId {
        PackId([n; 32])
    }

    /// Each trash file prune writes comes with a notice naming the same packs, which full
    /// keys pass over and which replaces the notice before it; a notice anyone planted
    /// adds packs for writers to avoid.
    #[test]
    fn notices_name_what_the_trash_condemns_for_writers() {
        let dir = tempfile::tempdir().unwrap();
        let repo = repository(dir.path());
        let mut trash = read(&repo).unwrap();
        condemn(&repo, &mut trash, &[pack(1)], 0).unwrap();
        condemn(&repo, &mut trash, &[pack(2)], 0).unwrap();
        assert_eq!(
            repo.storage().list("trash").unwrap().len(),
            2,
            "a file and a notice"
        );
        let again = read(&repo).unwrap();
        assert!(again.problems.is_empty(), "{:?}", again.problems);
        assert_eq!((again.files.len(), again.notices.len()), (1, 1));
        assert_eq!(noticed(&repo).unwrap(), HashSet::from([pack(1), pack(2)]));

        let planted = notice_bytes(&[Condemned {
            id: pack(3),
            generation: 9,
            condemned_at: jiff::Timestamp::now(),
        }]);
        let name = name_of(blake3::hash(&planted).as_bytes());
        repo.storage().write(&name, &planted).unwrap();
        assert!(noticed(&repo).unwrap().contains(&pack(3)));
        assert!(read(&repo).unwrap().problems.is_empty());

        let mut trash = read(&repo).unwrap();
        replace(&repo, &mut trash, 2, Vec::new()).unwrap();
        assert_eq!(noticed(&repo).unwrap(), HashSet::new());
        assert_eq!(repo.storage().list("trash").unwrap().len(), 2);
    }

    /// A planted session file may claim the last generation there is: prune stops, it
    /// does not wrap round to generation 0 (which every live session has observed).
    #[test]
    fn no_generation_comes_after_the_last_one() {
        let dir = tempfile::tempdir().unwrap();
        let repo = repository(dir.path());
        let mut trash = read(&repo).unwrap();
        let err = condemn(&repo, &mut trash, &[pack(1)], u64::MAX).unwrap_err();
        assert!(err.to_string().contains("sessions/"), "{err}");
        assert!(repo.storage().list("trash").unwrap().is_empty());
        assert_eq!(
            condemn(&repo, &mut trash, &[pack(1)], u64::MAX - 1).unwrap(),
            u64::MAX
        );
    }

    #[test]
    fn generations_grow_and_each_file_carries_every_pending_condemnation() {
        let dir = tempfile::tempdir().unwrap();
        let mut repo = repository(dir.path());
        let mut trash = read(&repo).unwrap();
        assert_eq!(trash.observed(), Some(0));
        assert_eq!(condemn(&repo, &mut trash, &[pack(1)], 0).unwrap(), 1);
        assert_eq!(condemn(&repo, &mut trash, &[pack(2)], 0).unwrap(), 2);
        // One file, the whole trash (and its notice for writers).
        let again = read(&repo).unwrap();
        assert_eq!((again.files.len(), again.notices.len()), (1, 1));
        assert_eq!(again.observed(), Some(2));
        assert_eq!(again.packs[&pack(1)].generation, 1);
        assert_eq!(again.packs[&pack(2)].generation, 2);
        // Nothing pending any more: the generation stays.
        replace(&repo, &mut trash, 2, Vec::new()).unwrap();
        assert_eq!(read(&repo).unwrap().observed(), Some(2));
        assert_eq!(repo.load_index().unwrap(), Some(2));
        // Sessions have observed 7 (the trash was deleted by hand since): above that.
        assert_eq!(condemn(&repo, &mut trash, &[pack(3)], 7).unwrap(), 8);
    }

    #[test]
    fn an_unreadable_trash_file_leaves_the_reader_observing_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut repo = repository(dir.path());
        let mut trash = read(&repo).unwrap();
        condemn(&repo, &mut trash, &[pack(1)], 0).unwrap();
        let name = repo.storage().list("trash").unwrap().remove(0);
        let path = dir.path().join(&name);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let damaged = read(&repo).unwrap();
        assert_eq!(damaged.observed(), None);
        assert_eq!(damaged.problems.len(), 1);
        // A backup then honours no generation, so prune deletes nothing while it runs.
        assert_eq!(repo.load_index().unwrap(), None);
        assert!(!crate::ops::prune::may_delete(0, None));
        assert!(condemn_with_care(&repo, &[pack(2)], 0).is_err());
    }
}

//! Index files are anyone's who can write to the repository: a thief with a writer's
//! key (or a full key) and an append-only token can add one but delete nothing. Prune,
//! run later by the owner, must not take such a file's word that a pack holds less than
//! it does, or that a blob a snapshot needs is safe elsewhere: each case below would
//! have it delete the only pack holding a snapshot's data.

mod common;

use std::sync::Arc;

use cairn_core::crypto::MasterKey;
use cairn_core::id::{BlobId, IndexId, PackId};
use cairn_core::index::{IndexFile, IndexedPack};
use cairn_core::monitor::NullMonitor;
use cairn_core::ops::prune::{prune, PruneOptions};
use cairn_core::pack::{BlobKind, PackEntry};
use cairn_core::storage::LocalStorage;
use cairn_core::tree::Tree;
use cairn_core::Repository;
use common::{node, one_blob_file, snapshot};

/// The file's bytes: more than a pack's minimum size and incompressible, so that its
/// blob fills a pack of its own.
fn contents() -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..(1 << 20) + 4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A repository with one snapshot of one file, whose blob has a pack of its own (packs
/// of the smallest size, 1 MiB); returns the file's blob and its pack.
fn repository(dir: &std::path::Path) -> (Repository, BlobId, PackId) {
    let mut repo = common::repo(dir, Some(1 << 20));
    let writer = repo.blob_writer();
    let bytes = contents();
    let (data, _) = writer.add(BlobKind::Data, &bytes).unwrap();
    let file = one_blob_file(data, bytes.len());
    let tree = Tree {
        nodes: vec![node(b"f", file)],
    };
    let (tree, _) = writer.add(BlobKind::Tree, &tree.to_bytes()).unwrap();
    let mut report = writer.finish().unwrap();
    repo.index_written(&mut report).unwrap();
    repo.save_snapshot(&snapshot(tree)).unwrap();
    let pack = repo.index().get(&data).unwrap().pack;
    assert_ne!(repo.index().get(&tree).unwrap().pack, pack, "a pack each");
    (repo, data, pack)
}

/// Stores an index file naming `packs`, sealed with `key`, under a name that sorts
/// before every other index file (so that it is read first).
fn plant_index(repo: &Repository, key: &MasterKey, packs: Vec<IndexedPack>) {
    let first = repo
        .storage()
        .list("index")
        .unwrap()
        .into_iter()
        .min()
        .unwrap();
    loop {
        let file = IndexFile::new(packs.clone());
        let bytes = file.seal(key);
        let name = IndexId::of_bytes(&bytes).storage_name();
        if name < first {
            repo.storage().write(&name, &bytes).unwrap();
            return;
        }
    }
}

/// Prunes as the owner would, then checks that the pack is still stored and the
/// snapshot restores whole.
fn prune_keeps(dir: &std::path::Path, pack: PackId) {
    let mut repo = open(dir);
    let report = prune(&mut repo, &PruneOptions::default(), &NullMonitor).unwrap();
    assert!(repo.list_packs().unwrap().contains(&pack), "{report:?}");
    let repo = open(dir);
    let snap = repo
        .load_snapshot(&repo.snapshot_ids().unwrap()[0])
        .unwrap();
    let target = common::restore_whole(&repo, &snap);
    assert!(std::fs::read(target.path().join("f")).unwrap() == contents());
}

fn writer_key(repo: &Repository) -> MasterKey {
    let key = repo.config().write_only_key(repo.key()).unwrap();
    key.bind_repository(&repo.config().id).unwrap();
    key
}

#[test]
fn a_writers_index_file_that_lists_a_pack_as_empty_does_not_get_it_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _, pack) = repository(dir.path());
    let thief = writer_key(&repo);
    let empty = IndexedPack {
        id: pack,
        entries: vec![],
    };
    plant_index(&repo, &thief, vec![empty]);
    prune_keeps(dir.path(), pack);
}

#[test]
fn a_full_keys_index_file_that_lists_a_pack_as_empty_does_not_get_it_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _, pack) = repository(dir.path());
    let empty = IndexedPack {
        id: pack,
        entries: vec![],
    };
    plant_index(&repo, repo.key(), vec![empty]);
    prune_keeps(dir.path(), pack);
}

/// Plants an index file, sealed with `key`, that places blob `data` at the start of
/// every pack but `pack`, where it is not.
fn place_elsewhere(repo: &Repository, key: &MasterKey, data: BlobId, pack: PackId) {
    let elsewhere: Vec<IndexedPack> = repo
        .list_packs()
        .unwrap()
        .into_iter()
        .filter(|p| *p != pack)
        .map(|id| IndexedPack {
            id,
            entries: vec![PackEntry {
                id: data,
                kind: BlobKind::Data,
                offset: 0,
                length: 60,
                raw_length: contents().len() as u32,
            }],
        })
        .collect();
    let bytes = IndexFile::new(elsewhere).seal(key);
    let name = IndexId::of_bytes(&bytes).storage_name();
    repo.storage().write(&name, &bytes).unwrap();
}

fn open(dir: &std::path::Path) -> Repository {
    Repository::open(Arc::new(LocalStorage::new(dir)), b"pw".as_slice()).unwrap()
}

/// A full key's index file that places the blob in another pack, where it is not: the
/// pack that does hold it looks unneeded, but its header says what it holds, and the
/// copy the index points to does not open.
#[test]
fn a_full_keys_index_file_that_places_a_needed_blob_elsewhere_does_not_get_its_pack_deleted() {
    // Where two packs of one standing locate a blob, the one learnt of last wins: that
    // depends on the random names of the index files, so the repository is made again
    // until the planted location is the one the index keeps.
    for _ in 0..40 {
        let dir = tempfile::tempdir().unwrap();
        let (repo, data, pack) = repository(dir.path());
        place_elsewhere(&repo, repo.key(), data, pack);
        if open(dir.path()).index().get(&data).unwrap().pack == pack {
            continue;
        }
        prune_keeps(dir.path(), pack);
        return;
    }
    panic!("the planted location never won in 40 repositories");
}

/// A writer's index file cannot place a blob in a pack of the full key's at all.
#[test]
fn a_writers_index_file_places_no_blob_in_a_pack_of_the_full_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, data, pack) = repository(dir.path());
    place_elsewhere(&repo, &writer_key(&repo), data, pack);
    assert_eq!(open(dir.path()).index().get(&data).unwrap().pack, pack);
    prune_keeps(dir.path(), pack);
}

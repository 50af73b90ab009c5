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
use cairn_core::ops::restore::{restore, RestoreOptions};
use cairn_core::pack::{BlobKind, PackEntry};
use cairn_core::storage::LocalStorage;
use cairn_core::tree::{ContentRef, NodeKind, Tree};
use cairn_core::Repository;
use common::{node, snapshot};

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
    let file = NodeKind::File {
        size: bytes.len() as u64,
        content: vec![ContentRef {
            blob: data,
            offset: 0,
            len: bytes.len() as u32,
        }],
    };
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
    let mut repo = Repository::open(Arc::new(LocalStorage::new(dir)), b"pw".as_slice()).unwrap();
    let report = prune(&mut repo, &PruneOptions::default(), &NullMonitor).unwrap();
    assert!(repo.list_packs().unwrap().contains(&pack), "{report:?}");
    let repo = Repository::open(Arc::new(LocalStorage::new(dir)), b"pw".as_slice()).unwrap();
    let snap = repo
        .load_snapshot(&repo.snapshot_ids().unwrap()[0])
        .unwrap();
    let target = tempfile::tempdir().unwrap();
    let opts = RestoreOptions {
        target: target.path().join("t"),
        ..RestoreOptions::default()
    };
    let stats = restore(&repo, &snap, &opts, &NullMonitor).unwrap();
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    assert!(std::fs::read(target.path().join("t/f")).unwrap() == contents());
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

/// An index file that places the blob in another pack, where it is not: the pack that
/// does hold it looks unneeded, but its header says what it holds, and the copy the
/// index points to does not open.
#[test]
fn an_index_file_that_places_a_needed_blob_elsewhere_does_not_get_its_pack_deleted() {
    for by_writer in [false, true] {
        // Where two packs of one standing locate a blob, the one learnt of last wins:
        // that depends on the random names of the index files, so the repository is
        // made again until the planted location is the one the index keeps.
        let mut tested = false;
        for _ in 0..40 {
            let dir = tempfile::tempdir().unwrap();
            let (repo, data, pack) = repository(dir.path());
            let key = if by_writer {
                writer_key(&repo)
            } else {
                repo.key().as_ref().clone()
            };
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
            let bytes = IndexFile::new(elsewhere).seal(&key);
            let name = IndexId::of_bytes(&bytes).storage_name();
            repo.storage().write(&name, &bytes).unwrap();
            let reopened =
                Repository::open(Arc::new(LocalStorage::new(dir.path())), b"pw".as_slice())
                    .unwrap();
            if reopened.index().get(&data).unwrap().pack == pack {
                continue;
            }
            drop(reopened);
            prune_keeps(dir.path(), pack);
            tested = true;
            break;
        }
        // A writer's file does not place blobs in a full key's pack at all now.
        assert!(tested || by_writer, "the planted location never won");
    }
}

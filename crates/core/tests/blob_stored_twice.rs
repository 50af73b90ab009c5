//! A blob stored in two packs (two backups that ran at once, or a repack that a prune
//! left half done) is read from the other pack when the one the index prefers is gone or
//! damaged: restore and every reader take the copy that is whole.

mod common;

use std::sync::Arc;

use cairn_core::id::BlobId;
use cairn_core::ops::restore::{restore, RestoreOptions, RestoreStats};
use cairn_core::pack::BlobKind;
use cairn_core::snapshot::Snapshot;
use cairn_core::storage::LocalStorage;
use cairn_core::tree::Tree;
use cairn_core::Repository;
use common::{node, one_blob_file, restore_whole, snapshot};

/// Stores `data` as the one file `f` of a tree, as a backup would; returns the snapshot.
fn back_up(repo: &mut Repository, data: &[u8]) -> (BlobId, Snapshot) {
    let writer = repo.blob_writer();
    let (blob, _) = writer.add(BlobKind::Data, data).unwrap();
    let file = one_blob_file(blob, data.len());
    let tree = Tree {
        nodes: vec![node(b"f", file)],
    };
    let (tree, _) = writer.add(BlobKind::Tree, &tree.to_bytes()).unwrap();
    let mut report = writer.finish().unwrap();
    repo.index_written(&mut report).unwrap();
    (blob, snapshot(tree))
}

/// A repository where two backups, each opened before the other wrote its index, stored
/// the same file: its blob is in two packs. Returns it opened afresh, the blob, the
/// snapshot and the data.
fn stored_twice(dir: &std::path::Path) -> (Repository, BlobId, Snapshot, Vec<u8>) {
    let data: Vec<u8> = (0..300_000u32)
        .flat_map(|i| (i * 7919).to_le_bytes())
        .collect();
    let open = || Repository::open(Arc::new(LocalStorage::new(dir)), b"pw".as_slice()).unwrap();
    let mut first = common::repo(dir, None);
    let mut second = open();
    let (blob, snap) = back_up(&mut first, &data);
    let (again, _) = back_up(&mut second, &data);
    assert_eq!(blob, again);
    let repo = open();
    let places = repo.index().other_places(&blob).count();
    assert_eq!(places, 1, "the blob is in two packs");
    (repo, blob, snap, data)
}

/// Restores `snap` into a new directory: it, and what the restore says.
fn restore_into(repo: &Repository, snap: &Snapshot) -> (tempfile::TempDir, RestoreStats) {
    let target = tempfile::tempdir().unwrap();
    let opts = RestoreOptions {
        target: target.path().to_path_buf(),
        ..Default::default()
    };
    let stats = restore(repo, snap, &opts, &cairn_core::monitor::NullMonitor).unwrap();
    (target, stats)
}

fn pack_path(dir: &std::path::Path, repo: &Repository, blob: &BlobId) -> std::path::PathBuf {
    let pack = repo.index().get(blob).unwrap().pack;
    dir.join(pack.storage_name())
}

#[test]
fn a_blob_whose_pack_is_gone_is_read_from_its_other_copy() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, blob, snap, data) = stored_twice(dir.path());
    let gone = repo.index().get(&blob).unwrap().pack;
    std::fs::remove_file(pack_path(dir.path(), &repo, &blob)).unwrap();

    let (target, stats) = restore_into(&repo, &snap);
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    assert_eq!(std::fs::read(target.path().join("f")).unwrap(), data);
    // Whole, and the user is told which pack lost its copy.
    let warnings = stats.warnings.join("\n");
    assert!(
        warnings.contains("another copy") && warnings.contains(&gone.to_string()),
        "{warnings}"
    );
    assert_eq!(repo.read_blob(&blob).unwrap(), data);
}

#[test]
fn every_reader_is_told_when_a_blob_was_read_from_another_copy() {
    let dir = tempfile::tempdir().unwrap();
    let (mut repo, blob, _, data) = stored_twice(dir.path());
    let gone = repo.index().get(&blob).unwrap().pack;
    let told = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = Arc::clone(&told);
    repo.on_read_around(Box::new(move |id, pack, error| {
        sink.lock().unwrap().push((*id, pack, error.to_string()));
    }));
    // (Not read before: the storage keeps a pack it read open.)
    std::fs::remove_file(pack_path(dir.path(), &repo, &blob)).unwrap();
    assert_eq!(repo.read_blob(&blob).unwrap(), data);
    let told = told.lock().unwrap();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!((told[0].0, told[0].1), (blob, gone));
}

#[test]
fn a_blob_damaged_in_its_pack_is_read_from_its_other_copy() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, blob, snap, data) = stored_twice(dir.path());
    let loc = repo.index().get(&blob).unwrap();
    let path = pack_path(dir.path(), &repo, &blob);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[loc.offset as usize + loc.length as usize / 2] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();

    let target = restore_whole(&repo, &snap);
    assert_eq!(std::fs::read(target.path().join("f")).unwrap(), data);
    assert_eq!(repo.read_blob(&blob).unwrap(), data);
}

#[test]
fn with_both_copies_gone_the_restore_names_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, blob, snap, _) = stored_twice(dir.path());
    let other = repo.index().other_places(&blob).next().unwrap();
    let first = repo.index().get(&blob).unwrap().pack;
    std::fs::remove_file(pack_path(dir.path(), &repo, &blob)).unwrap();
    std::fs::remove_file(dir.path().join(other.pack.storage_name())).unwrap();

    assert!(repo.read_blob(&blob).is_err());
    let (target, stats) = restore_into(&repo, &snap);
    let errors = format!("{:?}", stats.errors);
    assert!(errors.contains(&first.to_string()), "{errors}");
    assert!(!target.path().join("f").exists());
}

/// `check` reads a tree at its place in the index, the copy prune keeps: a damaged one
/// is damage to report, though readers (restore here) take the copy that is whole.
#[test]
fn check_reports_a_damaged_tree_whose_other_copy_is_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _, snap, data) = stored_twice(dir.path());
    repo.save_snapshot(&snap).unwrap();
    let loc = repo.index().get(&snap.tree).unwrap();
    assert_eq!(repo.index().other_places(&snap.tree).count(), 1);
    let path = pack_path(dir.path(), &repo, &snap.tree);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[loc.offset as usize + loc.length as usize / 2] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();

    let opts = cairn_core::ops::check::CheckOptions::default();
    let report =
        cairn_core::ops::check::check(&repo, &opts, &cairn_core::monitor::NullMonitor).unwrap();
    let problems = format!("{:?}", report.problems);
    assert!(problems.contains(&snap.tree.to_string()), "{problems}");
    let target = restore_whole(&repo, &snap);
    assert_eq!(std::fs::read(target.path().join("f")).unwrap(), data);
}

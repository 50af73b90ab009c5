//! A tree is data from storage: one whose entry is named `../x` must be refused by every
//! reader, not only by restore, and the refusal must name the tree blob so that `check`
//! and a person can find it.

mod common;

use cairn_core::id::BlobId;
use cairn_core::monitor::NullMonitor;
use cairn_core::ops::browse;
use cairn_core::ops::copy::{copy, CopyOptions};
use cairn_core::ops::diff::{diff, DiffOptions, DiffSide};
use cairn_core::ops::find::{find, FindOptions};
use cairn_core::ops::restore::{restore, RestoreOptions};
use cairn_core::pack::BlobKind;
use cairn_core::snapshot::Snapshot;
use cairn_core::tree::{NodeKind, Tree};
use cairn_core::Repository;
use common::{node, one_blob_file, repo, snapshot};

/// A saved snapshot whose root holds a directory `d` whose tree holds a file named `name`
/// (sealed by the library's own writer, as a client with the key could). Returns the
/// snapshot and the id of `d`'s tree.
fn crafted(repo: &mut Repository, name: &[u8]) -> (Snapshot, BlobId) {
    let data = b"payload".to_vec();
    let writer = repo.blob_writer();
    let (blob, _) = writer.add(BlobKind::Data, &data).unwrap();
    let file = one_blob_file(blob, data.len());
    let bad = Tree {
        nodes: vec![node(name, file)],
    };
    let (bad, _) = writer.add(BlobKind::Tree, &bad.to_bytes()).unwrap();
    let root = Tree {
        nodes: vec![node(b"d", NodeKind::Dir { subtree: bad })],
    };
    let (root, _) = writer.add(BlobKind::Tree, &root.to_bytes()).unwrap();
    let mut report = writer.finish().unwrap();
    repo.index_written(&mut report).unwrap();
    let snapshot = snapshot(root);
    repo.save_snapshot(&snapshot).unwrap();
    (snapshot, bad)
}

fn assert_names(what: &str, message: &str, tree: &BlobId) {
    assert!(
        message.contains(&tree.to_string()) && message.contains("unsafe name"),
        "{what} does not refuse tree {tree} for its unsafe name: {message}"
    );
}

#[test]
fn a_tree_holding_a_climbing_name_is_refused_by_every_reader() {
    let dir = tempfile::tempdir().unwrap();
    let mut repo = repo(&dir.path().join("repo"), None);
    let (snap, bad) = crafted(&mut repo, b"../x");

    let err = repo.read_tree(&bad).unwrap_err();
    assert_names("read_tree", &err.to_string(), &bad);

    // ls, dump and zip walk the snapshot with browse::walk.
    let err = browse::walk(&repo, &snap.tree, b"/", &mut |_, _| Ok(())).unwrap_err();
    assert_names("browse::walk", &err.to_string(), &bad);
    // cat and dump of one path look the path up tree by tree.
    let Err(err) = browse::find(&repo, &snap, b"/d/x") else {
        panic!("browse::find of /d/x is refused");
    };
    assert_names("browse::find", &err.to_string(), &bad);

    let err = find(
        &repo,
        &FindOptions {
            patterns: vec!["*".into()],
            ..FindOptions::default()
        },
    )
    .unwrap_err();
    assert_names("find", &err.to_string(), &bad);

    // A second snapshot whose `d` is an empty directory: diff reads both `d` trees.
    let empty = {
        let w = repo.blob_writer();
        let (empty, _) = w.add(BlobKind::Tree, &Tree::default().to_bytes()).unwrap();
        let root = Tree {
            nodes: vec![node(b"d", NodeKind::Dir { subtree: empty })],
        };
        let (root, _) = w.add(BlobKind::Tree, &root.to_bytes()).unwrap();
        let mut r = w.finish().unwrap();
        repo.index_written(&mut r).unwrap();
        snapshot(root)
    };
    let side = |snapshot: &Snapshot| DiffSide::Snapshot {
        id: cairn_core::id::SnapshotId([0; 32]),
        snapshot: snapshot.clone(),
    };
    let err = diff(
        &repo,
        &side(&empty),
        &side(&snap),
        &DiffOptions::default(),
        &NullMonitor,
    )
    .unwrap_err();
    assert_names("diff", &cairn_core::error::chain(&err), &bad);

    let mut dst = common::repo(&dir.path().join("dst"), None);
    let err = copy(&repo, &mut dst, &CopyOptions::default(), &NullMonitor).unwrap_err();
    assert_names("copy", &cairn_core::error::chain(&err), &bad);
    assert!(dst.snapshot_ids().unwrap().is_empty(), "copy saved nothing");

    let target = dir.path().join("a/target");
    let stats = restore(
        &repo,
        &snap,
        &RestoreOptions {
            target: target.clone(),
            ..RestoreOptions::default()
        },
        &NullMonitor,
    )
    .unwrap();
    assert_eq!(stats.errors.len(), 1, "{:?}", stats.errors);
    assert_names("restore", &format!("{:?}", stats.errors), &bad);
    assert!(!dir.path().join("a/x").exists());
}

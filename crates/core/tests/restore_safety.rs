//! A snapshot is data from storage, which an attacker may have written: restore must never
//! write outside its target, whatever names and links the snapshot holds.

mod common;

use cairn_core::monitor::NullMonitor;
use cairn_core::ops::restore::{restore, Overwrite, RestoreOptions};
use cairn_core::pack::BlobKind;
use cairn_core::snapshot::Snapshot;
use cairn_core::tree::{ContentRef, Node, NodeKind, Tree};
use cairn_core::Repository;
use common::{node, repo, snapshot};

/// Stores `root` (a tree whose nodes may reference `file_data`) and returns a snapshot of it.
fn snapshot_of(repo: &mut Repository, build: impl FnOnce(ContentRef) -> Vec<Node>) -> Snapshot {
    let data = b"payload".to_vec();
    let writer = repo.blob_writer();
    let (blob, _) = writer.add(BlobKind::Data, &data).unwrap();
    let mut nodes = build(ContentRef {
        blob,
        offset: 0,
        len: data.len() as u32,
    });
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let (tree, _) = writer
        .add(BlobKind::Tree, &Tree { nodes }.to_bytes())
        .unwrap();
    let mut report = writer.finish().unwrap();
    repo.index_written(&mut report).unwrap();
    snapshot(tree)
}

fn file(content: ContentRef) -> NodeKind {
    NodeKind::File {
        size: content.len as u64,
        content: vec![content],
    }
}

#[test]
fn names_that_climb_out_of_the_target_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut repo = repo(&dir.path().join("repo"), None);
    let snapshot = snapshot_of(&mut repo, |c| {
        vec![
            node(b"..", file(c)),
            node(b"../escaped", file(c)),
            node(b"/abs", file(c)),
            node(b"", file(c)),
            node(b"fine", file(c)),
        ]
    });
    let target = dir.path().join("a/b/target");
    let opts = RestoreOptions {
        target: target.clone(),
        ..RestoreOptions::default()
    };
    let stats = restore(&repo, &snapshot, &opts, &NullMonitor).unwrap();
    // Parsing refuses a tree holding an unsafe name (tests/unsafe_tree_names.rs), so
    // the whole directory is reported once and nothing of it is written.
    assert_eq!(
        stats.files_restored, 0,
        "nothing of the refused tree is restored"
    );
    assert_eq!(
        stats.errors.len(),
        1,
        "the refused tree is reported: {:?}",
        stats.errors
    );
    assert!(!target.join("fine").exists());
    assert!(!dir.path().join("a/b/escaped").exists());
    assert!(!dir.path().join("a/escaped").exists());
    let listing: Vec<_> = std::fs::read_dir(dir.path().join("a/b")).unwrap().collect();
    assert_eq!(listing.len(), 1, "nothing but the target in its parent");
}

#[test]
fn an_existing_symlink_in_the_target_is_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let mut repo = repo(&dir.path().join("repo"), None);
    // The snapshot holds a directory "d" with a file; the target already has "d" as a
    // symlink to a directory outside it.
    let sub = {
        let data = b"payload".to_vec();
        let w = repo.blob_writer();
        let (blob, _) = w.add(BlobKind::Data, &data).unwrap();
        let c = ContentRef {
            blob,
            offset: 0,
            len: 7,
        };
        let (sub, _) = w
            .add(
                BlobKind::Tree,
                &Tree {
                    nodes: vec![node(b"f", file(c))],
                }
                .to_bytes(),
            )
            .unwrap();
        let mut r = w.finish().unwrap();
        repo.index_written(&mut r).unwrap();
        sub
    };
    let snapshot = snapshot_of(&mut repo, |_| {
        vec![node(b"d", NodeKind::Dir { subtree: sub })]
    });
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let target = dir.path().join("target");
    std::fs::create_dir(&target).unwrap();
    std::os::unix::fs::symlink(&outside, target.join("d")).unwrap();

    for mode in [Overwrite::Never, Overwrite::Always] {
        let opts = RestoreOptions {
            target: target.clone(),
            overwrite: Some(mode),
            ..RestoreOptions::default()
        };
        restore(&repo, &snapshot, &opts, &NullMonitor).unwrap();
        assert!(
            std::fs::read_dir(&outside).unwrap().next().is_none(),
            "{mode:?} wrote through the symlink"
        );
    }
    // With `always` the symlink was replaced by the real directory.
    assert!(std::fs::symlink_metadata(target.join("d"))
        .unwrap()
        .is_dir());
    assert_eq!(std::fs::read(target.join("d/f")).unwrap(), b"payload");
}

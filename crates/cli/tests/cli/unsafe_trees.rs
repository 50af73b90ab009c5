//! A repository whose tree holds an entry named `../x` (written with the library, as a
//! client holding the key could): every command that reads trees refuses it with an error
//! naming the tree blob, and nothing is written outside a target.

use std::path::Path;
use std::sync::Arc;

use cairn_core::id::BlobId;
use cairn_core::pack::BlobKind;
use cairn_core::snapshot::{Snapshot, SnapshotSummary};
use cairn_core::storage::LocalStorage;
use cairn_core::tree::{ContentRef, Node, NodeKind, Tree};
use cairn_core::Repository;

use crate::common::*;

fn node(name: &[u8], kind: NodeKind) -> Node {
    Node {
        name: name.to_vec(),
        kind,
        mode: 0o644,
        uid: 0,
        gid: 0,
        user: None,
        group: None,
        mtime: Default::default(),
        ctime: Default::default(),
        inode: 0,
        device: 0,
        links: 1,
        xattrs: vec![],
    }
}

/// Saves in `repo` (made by `cairn init` with [`PASSWORD`]) a snapshot whose root holds
/// a directory `d` whose tree holds a file named `name`; returns that tree's id.
pub(crate) fn plant_tree_with_name(repo: &Path, name: &[u8]) -> BlobId {
    let storage = Arc::new(LocalStorage::new(repo));
    let mut repo = Repository::open(storage, PASSWORD.as_bytes()).unwrap();
    let data = b"payload".to_vec();
    let w = repo.blob_writer();
    let (blob, _) = w.add(BlobKind::Data, &data).unwrap();
    let file = NodeKind::File {
        size: data.len() as u64,
        content: vec![ContentRef {
            blob,
            offset: 0,
            len: data.len() as u32,
        }],
    };
    let bad = Tree {
        nodes: vec![node(name, file)],
    };
    let (bad, _) = w.add(BlobKind::Tree, &bad.to_bytes()).unwrap();
    let root = Tree {
        nodes: vec![node(b"d", NodeKind::Dir { subtree: bad })],
    };
    let (root, _) = w.add(BlobKind::Tree, &root.to_bytes()).unwrap();
    let mut report = w.finish().unwrap();
    repo.index_written(&mut report).unwrap();
    repo.save_snapshot(&Snapshot {
        time: jiff::Timestamp::now(),
        host: "h".into(),
        username: "u".into(),
        paths: vec!["/".into()],
        tags: vec![],
        tree: root,
        parent: None,
        original: None,
        program_version: "test".into(),
        summary: SnapshotSummary::default(),
    })
    .unwrap();
    bad
}

#[test]
fn every_reader_refuses_a_tree_with_a_climbing_name_and_names_the_tree() {
    let env = TestEnv::with_repo();
    let bad = plant_tree_with_name(&env.repo, b"../x").to_string();
    let pw = env.path("password");
    std::fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    let other = env.path("other");
    let out = env
        .bare_cmd()
        .arg("-r")
        .arg(&other)
        .arg("init")
        .output()
        .unwrap();
    assert_success(&out, "cairn init other");

    let restore_parent = env.path("restores");
    let zip = env.path("out.zip");
    let target = restore_parent.join("target");
    let runs: Vec<(&str, assert_cmd::Command)> = vec![
        ("ls", {
            let mut c = env.cmd();
            c.args(["ls", "-R", "latest"]);
            c
        }),
        ("find", {
            let mut c = env.cmd();
            c.args(["find", "*"]);
            c
        }),
        ("dump (tar)", {
            let mut c = env.cmd();
            c.args(["dump", "latest", "/"]);
            c
        }),
        ("dump --archive zip", {
            let mut c = env.cmd();
            c.args(["dump", "latest", "/", "--archive", "zip", "--output"])
                .arg(&zip);
            c
        }),
        ("cat", {
            let mut c = env.cmd();
            c.args(["cat", "latest", "/d/x"]);
            c
        }),
        ("copy", {
            let mut c = env.bare_cmd();
            c.arg("-r")
                .arg(&other)
                .args(["copy", "--from-repo"])
                .arg(&env.repo)
                .arg("--from-password-file")
                .arg(&pw);
            c
        }),
        ("restore", {
            let mut c = env.cmd();
            c.args(["restore", "latest", "--target"]).arg(&target);
            c
        }),
    ];
    for (what, mut cmd) in runs {
        let out = cmd.output().unwrap();
        assert!(
            !out.status.success(),
            "cairn {what} succeeded: {}",
            describe(&out)
        );
        let err = stderr(&out);
        assert!(
            err.contains(&bad) && err.contains("unsafe name"),
            "cairn {what} does not name tree {bad} and its unsafe name: {err}"
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("../x"),
            "cairn {what} printed the name: {}",
            describe(&out)
        );
    }
    let beside: Vec<_> = std::fs::read_dir(&restore_parent)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        beside.iter().all(|n| n == "target"),
        "restore wrote beside its target: {beside:?}"
    );
    let out = env
        .bare_cmd()
        .arg("-r")
        .arg(&other)
        .args(["snapshots", "--json"])
        .output()
        .unwrap();
    assert_success(&out, "cairn snapshots of the copy's destination");
    assert_eq!(
        parse_json(&out.stdout, "snapshots")["snapshots"]
            .as_array()
            .map(Vec::len),
        Some(0)
    );
}

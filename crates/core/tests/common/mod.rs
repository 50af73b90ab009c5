//! What the core's integration tests share: a repository that opens fast, plain nodes,
//! and a snapshot of a stored tree.

// Each test binary compiles this module and uses part of it.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use cairn_core::id::BlobId;
use cairn_core::keyfile::KdfParams;
use cairn_core::snapshot::{Snapshot, SnapshotSummary};
use cairn_core::storage::LocalStorage;
use cairn_core::tree::{Node, NodeKind};
use cairn_core::{InitOptions, Repository};

/// A new repository in `dir` with the cheapest key derivation, and packs of `pack_size`
/// bytes (the default if `None`).
pub fn repo(dir: &Path, pack_size: Option<u64>) -> Repository {
    let defaults = InitOptions::default();
    let opts = InitOptions {
        kdf: KdfParams {
            memory_kib: 64,
            iterations: 1,
            parallelism: 1,
        },
        pack_size: pack_size.unwrap_or(defaults.pack_size),
        ..defaults
    };
    Repository::init(Arc::new(LocalStorage::new(dir)), b"pw", &opts).unwrap()
}

/// A node owned by root, mode 0644, with no times or links to speak of.
pub fn node(name: &[u8], kind: NodeKind) -> Node {
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

/// A file `len` bytes long, made of the whole of blob `blob`.
pub fn one_blob_file(blob: BlobId, len: usize) -> NodeKind {
    NodeKind::File {
        size: len as u64,
        content: vec![cairn_core::tree::ContentRef {
            blob,
            offset: 0,
            len: len as u32,
        }],
    }
}

/// A snapshot of the stored tree `tree`, taken now.
pub fn snapshot(tree: BlobId) -> Snapshot {
    Snapshot {
        time: jiff::Timestamp::now(),
        host: "h".into(),
        username: "u".into(),
        paths: vec!["/".into()],
        tags: vec![],
        tree,
        parent: None,
        original: None,
        program_version: "test".into(),
        summary: SnapshotSummary::default(),
    }
}

/// Restores `snap` into a new directory, which it returns; every file must be restored.
pub fn restore_whole(repo: &Repository, snap: &Snapshot) -> tempfile::TempDir {
    let target = tempfile::tempdir().unwrap();
    let opts = cairn_core::ops::restore::RestoreOptions {
        target: target.path().to_path_buf(),
        ..Default::default()
    };
    let stats =
        cairn_core::ops::restore::restore(repo, snap, &opts, &cairn_core::monitor::NullMonitor)
            .unwrap();
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    target
}

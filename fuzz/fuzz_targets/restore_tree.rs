//! Restore of a snapshot whose tree the fuzzer wrote (structure-aware): hostile content
//! refs (offsets past their blob, empty refs, sizes that disagree with the refs, several
//! files sharing an inode) go through restore's planning of pack reads and its writing,
//! and nothing may land outside the target. Kinds that would make device nodes, and
//! xattrs and mode bits beyond rwx, are toned down: the target runs as root on a CI
//! machine.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cairn_core::id::BlobId;
use cairn_core::keyfile::KdfParams;
use cairn_core::monitor::NullMonitor;
use cairn_core::ops::restore::{restore, RestoreOptions};
use cairn_core::pack::BlobKind;
use cairn_core::snapshot::{Snapshot, SnapshotSummary};
use cairn_core::storage::LocalStorage;
use cairn_core::tree::{ContentRef, NodeKind, Tree};
use cairn_core::{InitOptions, Repository};
use cairn_fuzz::structured::ArbTree;
use libfuzzer_sys::fuzz_target;

/// Data blobs every tree may point into.
const BLOBS: usize = 4;

struct World {
    _dir: tempfile::TempDir,
    root: PathBuf,
    repo: Repository,
    blobs: Vec<(BlobId, u32)>,
    empty_dir: BlobId,
}

fn world() -> &'static Mutex<World> {
    static WORLD: OnceLock<Mutex<World>> = OnceLock::new();
    WORLD.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a tempdir");
        let root = dir.path().to_path_buf();
        let opts = InitOptions {
            kdf: KdfParams {
                memory_kib: 64,
                iterations: 1,
                parallelism: 1,
            },
            ..InitOptions::default()
        };
        let mut repo =
            Repository::init(Arc::new(LocalStorage::new(root.join("repo"))), b"pw", &opts)
                .expect("a repository");
        let w = repo.blob_writer();
        let blobs = (0..BLOBS)
            .map(|i| {
                let data: Vec<u8> = (0..(1usize << (4 + 3 * i))).map(|b| b as u8).collect();
                (
                    w.add(BlobKind::Data, &data).expect("add").0,
                    data.len() as u32,
                )
            })
            .collect();
        let empty_dir = w
            .add(BlobKind::Tree, &Tree::default().to_bytes())
            .expect("add")
            .0;
        let mut report = w.finish().expect("finish");
        repo.index_written(&mut report).expect("index");
        Mutex::new(World {
            _dir: dir,
            root,
            repo,
            blobs,
            empty_dir,
        })
    })
}

fuzz_target!(|arb: ArbTree| {
    let mut world = world().lock().unwrap_or_else(|p| p.into_inner());
    let mut tree = arb.tree();
    for node in &mut tree.nodes {
        node.mode &= 0o777;
        node.xattrs.clear();
        match &mut node.kind {
            NodeKind::File { content, .. } => {
                for c in content.iter_mut() {
                    let (blob, len) = world.blobs[c.blob.0[0] as usize % BLOBS];
                    // Mostly inside the blob, sometimes past it.
                    *c = ContentRef {
                        blob,
                        offset: c.offset % (len + 8),
                        len: c.len % (len + 8),
                    };
                }
            }
            NodeKind::Dir { subtree } => *subtree = world.empty_dir,
            NodeKind::CharDevice { .. } | NodeKind::BlockDevice { .. } => {
                node.kind = NodeKind::Fifo
            }
            _ => {}
        }
    }
    let w = world.repo.blob_writer();
    let Ok((root, _)) = w.add(BlobKind::Tree, &tree.to_bytes()) else {
        return;
    };
    let Ok(mut report) = w.finish() else { return };
    if world.repo.index_written(&mut report).is_err() {
        return;
    }
    let snapshot = Snapshot {
        time: jiff::Timestamp::UNIX_EPOCH,
        host: "h".into(),
        username: "u".into(),
        paths: vec!["/".into()],
        tags: vec![],
        tree: root,
        parent: None,
        original: None,
        program_version: "fuzz".into(),
        summary: SnapshotSummary::default(),
    };
    let parent = world.root.join("restores");
    let target = parent.join("target");
    std::fs::create_dir_all(&parent).expect("create the parent");
    let opts = RestoreOptions {
        target: target.clone(),
        verify: true,
        ..RestoreOptions::default()
    };
    let _ = restore(&world.repo, &snapshot, &opts, &NullMonitor);
    let outside: Vec<_> = std::fs::read_dir(&parent)
        .expect("list the parent")
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != "target")
        .collect();
    assert!(
        outside.is_empty(),
        "restore wrote outside its target: {outside:?}"
    );
    let _ = std::fs::remove_dir_all(&target);
});

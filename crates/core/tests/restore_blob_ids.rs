//! Restore takes a blob's id from its seal where the seal proves it (format 2 on, the
//! repository key's own blobs) and hashes the plaintext otherwise, or always with
//! `verify`. A blob stored under an id its plaintext does not have is what only a faulty
//! sealer holding the key could make; these tests make one through the writer's
//! `add_with_id` and restore it each way.

mod common;

use std::sync::Arc;

use cairn_core::config::FORMAT_VERSION;
use cairn_core::keyfile::KdfParams;
use cairn_core::monitor::NullMonitor;
use cairn_core::ops::restore::{restore, RestoreOptions};
use cairn_core::pack::BlobKind;
use cairn_core::storage::LocalStorage;
use cairn_core::tree::{ContentRef, NodeKind, Tree};
use cairn_core::{InitOptions, Repository};
use common::{node, snapshot};

const DATA: &[u8] = b"the bytes the blob holds";

/// A repository of `format` whose snapshot holds one file, `f`, made of a blob stored
/// under the id of other bytes.
fn repository_with_a_misnamed_blob(
    dir: &std::path::Path,
    format: u32,
) -> (Repository, cairn_core::snapshot::Snapshot) {
    let opts = InitOptions {
        kdf: KdfParams {
            memory_kib: 64,
            iterations: 1,
            parallelism: 1,
        },
        format,
        ..InitOptions::default()
    };
    let mut repo = Repository::init(Arc::new(LocalStorage::new(dir)), b"pw", &opts).unwrap();
    let wrong = repo.key().blob_id(b"other bytes");
    let writer = repo.blob_writer();
    writer.add_with_id(wrong, BlobKind::Data, DATA).unwrap();
    let content = ContentRef {
        blob: wrong,
        offset: 0,
        len: DATA.len() as u32,
    };
    let file = NodeKind::File {
        size: DATA.len() as u64,
        content: vec![content],
    };
    let (tree, _) = writer
        .add(
            BlobKind::Tree,
            &Tree {
                nodes: vec![node(b"f", file)],
            }
            .to_bytes(),
        )
        .unwrap();
    let mut report = writer.finish().unwrap();
    repo.index_written(&mut report).unwrap();
    (repo, snapshot(tree))
}

/// Whether restoring with `verify` wrote `f`; a file not written must be reported, naming
/// the blob.
fn restores(repo: &Repository, snap: &cairn_core::snapshot::Snapshot, verify: bool) -> bool {
    let target = tempfile::tempdir().unwrap();
    let opts = RestoreOptions {
        target: target.path().join("t"),
        verify,
        ..RestoreOptions::default()
    };
    let stats = restore(repo, snap, &opts, &NullMonitor).unwrap();
    let path = target.path().join("t/f");
    if path.exists() {
        assert_eq!(std::fs::read(&path).unwrap(), DATA);
        assert!(stats.errors.is_empty(), "{:?}", stats.errors);
        return true;
    }
    let wrong = repo.key().blob_id(b"other bytes").to_string();
    assert!(
        stats
            .errors
            .iter()
            .any(|e| format!("{e:?}").contains(&wrong[..8])),
        "the unrestored file names the blob: {:?}",
        stats.errors
    );
    false
}

#[test]
fn a_misnamed_blob_is_refused_where_its_seal_does_not_bind_the_id_and_with_verify() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, snap) = repository_with_a_misnamed_blob(&dir.path().join("v1"), 1);
    assert!(!restores(&repo, &snap, false), "format 1: always hashed");
    assert!(!restores(&repo, &snap, true), "format 1 with verify");

    let (repo, snap) = repository_with_a_misnamed_blob(&dir.path().join("v"), FORMAT_VERSION);
    assert!(
        restores(&repo, &snap, false),
        "format {FORMAT_VERSION}: the seal vouches for the id the sealer gave"
    );
    assert!(
        !restores(&repo, &snap, true),
        "format {FORMAT_VERSION} with verify: hashed"
    );
}

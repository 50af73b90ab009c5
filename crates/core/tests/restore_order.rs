//! A restore writes files in the order of the packs that hold their blobs, so a file's
//! parts arrive in any order and many files are half written at once.

mod common;

use cairn_core::monitor::NullMonitor;
use cairn_core::ops::restore::{restore, RestoreOptions};
use cairn_core::pack::BlobKind;
use cairn_core::tree::{ContentRef, Node, NodeKind, Tree};
use common::{node, repo, snapshot};

/// Incompressible bytes unlike any other file's, from `tag` and `i`.
fn data(tag: &str, i: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    blake3::Hasher::new()
        .update(format!("{tag}{i}").as_bytes())
        .finalize_xof()
        .fill(&mut out);
    out
}

#[test]
fn files_whose_parts_arrive_out_of_order_and_all_at_once_are_restored_exactly() {
    let dir = tempfile::tempdir().unwrap();
    // Small packs: the parts of a file lie in different packs.
    let mut repo = repo(&dir.path().join("repo"), Some(256 << 10));
    // Every file's small second part is stored before any first part, all in one pack.
    // The files need that pack second, so it is read second, and hundreds of files are
    // half written at once: more than a restore keeps open, so some are closed and
    // opened again between parts. The first part comes again at the end (deduplicated).
    const FILES: usize = 3000;
    let writer = repo.blob_writer();
    let add = |bytes: &[u8]| ContentRef {
        blob: writer.add(BlobKind::Data, bytes).unwrap().0,
        offset: 0,
        len: bytes.len() as u32,
    };
    let seconds: Vec<ContentRef> = (0..FILES).map(|i| add(&data("second", i, 20))).collect();
    let firsts: Vec<ContentRef> = (0..FILES).map(|i| add(&data("first", i, 3000))).collect();
    let mut nodes: Vec<Node> = (0..FILES)
        .map(|i| {
            let content = vec![firsts[i], seconds[i], firsts[i]];
            node(
                format!("f{i:04}").as_bytes(),
                NodeKind::File {
                    size: content.iter().map(|c| u64::from(c.len)).sum(),
                    content,
                },
            )
        })
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let (tree, _) = writer
        .add(BlobKind::Tree, &Tree { nodes }.to_bytes())
        .unwrap();
    let mut report = writer.finish().unwrap();
    repo.index_written(&mut report).unwrap();
    let packs = repo.list_packs().unwrap().len();
    assert!(packs > 20, "{packs} packs");
    let snapshot = snapshot(tree);
    let target = dir.path().join("target");
    let opts = RestoreOptions {
        target: target.clone(),
        verify: true,
        ..RestoreOptions::default()
    };
    let stats = restore(&repo, &snapshot, &opts, &NullMonitor).unwrap();
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    assert_eq!(stats.files_restored, FILES as u64);
    assert_eq!(stats.files_verified, FILES as u64);
    for i in 0..FILES {
        let mut expected = data("first", i, 3000);
        expected.extend(data("second", i, 20));
        expected.extend(data("first", i, 3000));
        let name = format!("f{i:04}");
        assert_eq!(
            std::fs::read(target.join(&name)).unwrap(),
            expected,
            "{name}"
        );
    }
    // Each blob was read once, though every first part is written twice.
    assert!(stats.bytes_read < 2 * 3000 * FILES as u64, "{stats:?}");
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), FILES);
}

//! A restore writes files in the order of the packs that hold their blobs, so a file's
//! parts arrive in any order and many files are half written at once.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_core::id::BlobId;
use cairn_core::monitor::NullMonitor;
use cairn_core::ops::restore::{restore, RestoreOptions};
use cairn_core::pack::BlobKind;
use cairn_core::storage::LocalStorage;
use cairn_core::tree::{ContentRef, Node, NodeKind, Tree};
use cairn_core::Repository;
use common::{node, repo, snapshot, store_files, OnRead, Watched};

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

/// Reads of one object wait until a file appears, for at most `PATIENCE` (noting whether
/// any waited that long), and then, with `then_panic`, panic.
#[derive(Debug)]
struct HeldBack {
    object: String,
    until: PathBuf,
    then_panic: bool,
    waited_in_vain: AtomicBool,
}

const PATIENCE: Duration = Duration::from_secs(20);

impl OnRead for HeldBack {
    fn read(&self, name: &str, _: Option<(u64, u64)>) -> cairn_core::storage::Result<()> {
        if name != self.object {
            return Ok(());
        }
        let started = Instant::now();
        while !self.until.exists() {
            if started.elapsed() > PATIENCE {
                self.waited_in_vain.store(true, Ordering::Relaxed);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!self.then_panic, "a read of {name} panics");
        Ok(())
    }
}

/// One-part files `f0000`... in a repository of 1 MiB packs (the smallest allowed, some
/// 350 files each), more than the first batch holds (1,024 parts): the last file is in
/// the second batch, and the first file's pack is read in the first only. Returns the
/// repository, its reads of the first file's pack held back until the last file is
/// restored into `dir/target`, the tree to restore and that target.
fn first_pack_held_back(dir: &Path, then_panic: bool) -> (Arc<Watched<HeldBack>>, BlobId, PathBuf) {
    let repo_dir = dir.join("repo");
    let mut repo = repo(&repo_dir, Some(1 << 20));
    let files: Vec<Vec<u8>> = (0..FILES).map(|i| data("batch", i, 3000)).collect();
    let (tree, blobs) = store_files(&mut repo, &files);
    let pack = |blob| repo.index().get(blob).unwrap().pack;
    let first = pack(&blobs[0]);
    assert_ne!(
        first,
        pack(&blobs[FILES - 1]),
        "the last file needs the first pack"
    );
    let target = dir.join("target");
    let storage = Arc::new(Watched {
        inner: LocalStorage::new(&repo_dir),
        hook: HeldBack {
            object: first.storage_name(),
            until: target.join(format!("f{:04}", FILES - 1)),
            then_panic,
            waited_in_vain: AtomicBool::new(false),
        },
    });
    (storage, tree, target)
}

const FILES: usize = 1100;

/// Restores `tree` into `target` from the repository `storage` holds, failing the test if
/// that takes a minute.
fn restore_within_a_minute(
    storage: Arc<Watched<HeldBack>>,
    tree: BlobId,
    target: &Path,
) -> cairn_core::ops::restore::RestoreStats {
    let repo = Repository::open(storage, b"pw".as_slice()).unwrap();
    let opts = RestoreOptions {
        target: target.to_path_buf(),
        ..RestoreOptions::default()
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(restore(&repo, &snapshot(tree), &opts, &NullMonitor).unwrap());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the restore ends within a minute")
}

/// Threads with no read left in a batch write the next one while another still waits on
/// a read of the first: one slow read (a remote request, a cold pack) does not hold up
/// the rest of the restore.
#[test]
fn a_slow_read_holds_back_no_other_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, tree, target) = first_pack_held_back(dir.path(), false);
    let stats = restore_within_a_minute(storage.clone(), tree, &target);
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    assert_eq!(stats.files_restored, FILES as u64);
    assert!(
        !storage.hook.waited_in_vain.load(Ordering::Relaxed),
        "the last file was not written while a read of the first batch waited"
    );
    for i in [0, FILES - 1] {
        let name = format!("f{i:04}");
        assert_eq!(
            std::fs::read(target.join(&name)).unwrap(),
            data("batch", i, 3000)
        );
    }
}

/// A writer thread that panics (a bug) while the next batch waits for it ends the restore
/// all the same: the files it was writing are listed as not restored, every other file
/// is restored.
#[test]
fn a_writer_thread_that_panics_ends_the_restore_with_its_files_listed() {
    let dir = tempfile::tempdir().unwrap();
    // The read panics once the second batch is written, which is then queued for the
    // panicking thread too.
    let (storage, tree, target) = first_pack_held_back(dir.path(), true);
    let stats = restore_within_a_minute(storage.clone(), tree, &target);
    assert!(!storage.hook.waited_in_vain.load(Ordering::Relaxed));
    assert!(!stats.errors.is_empty());
    for e in &stats.errors {
        assert!(e.error.contains("writer thread stopped"), "{e:?}");
    }
    assert_eq!(stats.files_restored as usize + stats.errors.len(), FILES);
    let mut listed = 0;
    for i in 0..FILES {
        let name = format!("f{i:04}");
        match std::fs::read(target.join(&name)) {
            Ok(bytes) => assert_eq!(bytes, data("batch", i, 3000), "{name}"),
            Err(_) => listed += 1,
        }
    }
    assert_eq!(listed, stats.errors.len());
    // Nothing else was left in the target: no temporary file.
    assert_eq!(
        std::fs::read_dir(&target).unwrap().count(),
        stats.files_restored as usize
    );
}

//! A write-only key cannot read the trash, so it learns what prune condemned from the
//! notices prune writes beside each trash file. Without them, a writer's backup that
//! registered its session after a prune listed the sessions built on a condemned pack of
//! its own, which that prune then deleted under the new snapshot.

mod common;

use std::sync::Arc;

use cairn_core::keyfile::KdfParams;
use cairn_core::keys::{self, Secret};
use cairn_core::monitor::{Monitor, NullMonitor};
use cairn_core::ops::backup::{backup, BackupOptions};
use cairn_core::ops::prune::{prune, PruneOptions};
use cairn_core::storage::LocalStorage;
use cairn_core::writer_cache::WriterCache;
use cairn_core::Repository;

const WRITER: &str = "the laptop's write-only password";

/// The writer's repository, with its memory of earlier backups in `state`.
fn open_writer(dir: &std::path::Path, state: &std::path::Path) -> Repository {
    let storage = Arc::new(LocalStorage::new(dir));
    let mut repo = Repository::open_without_index(storage, Secret::from_text(WRITER)).unwrap();
    let id = repo.config().id.clone();
    repo.set_writer_cache(WriterCache::open(state, &id).unwrap());
    repo
}

fn back_up(repo: &mut Repository, src: &std::path::Path) {
    let opts = BackupOptions {
        paths: vec![src.to_path_buf()],
        host: "laptop".into(),
        ..BackupOptions::default()
    };
    backup(repo, &opts, &NullMonitor).unwrap();
}

/// Runs a writer's backup as the prune starts deleting packs: after it listed sessions
/// and snapshots for the last time.
struct BackupMidPrune<'a> {
    dir: &'a std::path::Path,
    state: &'a std::path::Path,
    src: &'a std::path::Path,
    done: std::sync::atomic::AtomicBool,
}

impl Monitor for BackupMidPrune<'_> {
    fn progress(&self, what: &str, _done: u64, _total: u64) {
        if what == "deleting packs" && !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
            back_up(&mut open_writer(self.dir, self.state), self.src);
        }
    }
}

#[test]
fn a_writers_backup_that_starts_while_prune_deletes_does_not_build_on_a_condemned_pack() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let owner = common::repo(dir.path(), None);
    let cheap = KdfParams {
        memory_kib: 64,
        iterations: 1,
        parallelism: 1,
    };
    keys::add_write_only(&owner, &Secret::from_text(WRITER), cheap, "laptop").unwrap();
    let src = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(src.path().join("f"), &bytes).unwrap();

    // The writer backs up; the owner forgets that snapshot, so its packs hold nothing
    // needed and the next prune condemns them and, no session being live, deletes them.
    back_up(&mut open_writer(dir.path(), state.path()), src.path());
    let mut owner =
        Repository::open(Arc::new(LocalStorage::new(dir.path())), b"pw".as_slice()).unwrap();
    let first = owner.snapshot_ids().unwrap();
    cairn_core::ops::forget::remove(&owner, &first).unwrap();

    // Meanwhile the writer backs up the same file again, remembering its packs.
    let monitor = BackupMidPrune {
        dir: dir.path(),
        state: state.path(),
        src: src.path(),
        done: Default::default(),
    };
    let report = prune(&mut owner, &PruneOptions::default(), &monitor).unwrap();
    assert!(monitor.done.into_inner(), "the writer backed up mid-prune");
    assert!(report.packs_deleted > 0, "{report:?}");

    // The owner restores the writer's new snapshot whole.
    let owner =
        Repository::open(Arc::new(LocalStorage::new(dir.path())), b"pw".as_slice()).unwrap();
    let ids = owner.snapshot_ids().unwrap();
    assert_eq!(ids.len(), 1);
    let snap = owner.load_snapshot(&ids[0]).unwrap();
    let target = common::restore_whole(&owner, &snap);
    let restored = walk_files(target.path());
    assert_eq!(restored, vec![bytes]);
}

/// The contents of every regular file below `dir`.
fn walk_files(dir: &std::path::Path) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk_files(&path));
        } else {
            out.push(std::fs::read(&path).unwrap());
        }
    }
    out
}

//! A pack a backup found missing is condemned in generation 0. If it is stored after all
//! (put back by hand, or by `cairn serve undelete`), sessions that read the trash before
//! may build on it: prune condemns it anew, in a new generation, and deletes it only
//! once every live session has observed that one.

mod common;

use std::sync::Arc;

use cairn_core::monitor::NullMonitor;
use cairn_core::ops::prune::{prune, PruneOptions};
use cairn_core::pack::BlobKind;
use cairn_core::session::{Session, SessionKind};
use cairn_core::storage::LocalStorage;
use cairn_core::Repository;

#[test]
fn a_pack_marked_missing_but_stored_waits_for_live_sessions_like_one_condemned_now() {
    let dir = tempfile::tempdir().unwrap();
    let mut repo = common::repo(dir.path(), None);
    let writer = repo.blob_writer();
    writer
        .add(BlobKind::Data, b"no snapshot needs this")
        .unwrap();
    let mut report = writer.finish().unwrap();
    repo.index_written(&mut report).unwrap();
    let pack = repo.list_packs().unwrap()[0];
    cairn_core::trash::mark_missing(&repo, &[pack]).unwrap();

    let open = || Repository::open(Arc::new(LocalStorage::new(dir.path())), b"pw".as_slice());
    // A backup that read the trash (generation 0) and is still running.
    let backup = open().unwrap();
    let session = Session::start(&backup, SessionKind::Backup, "laptop").unwrap();
    session.observe(Some(0));

    let mut owner = open().unwrap();
    let report = prune(&mut owner, &PruneOptions::default(), &NullMonitor).unwrap();
    assert!(owner.list_packs().unwrap().contains(&pack), "{report:?}");
    assert_eq!(report.packs_deferred, 1, "{report:?}");

    // Once the backup is over, the next prune deletes it.
    session.finish();
    let mut owner = open().unwrap();
    let report = prune(&mut owner, &PruneOptions::default(), &NullMonitor).unwrap();
    assert!(!owner.list_packs().unwrap().contains(&pack), "{report:?}");
}

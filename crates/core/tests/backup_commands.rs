//! `BackupOptions::commands`: several commands' outputs, each a file at the snapshot's
//! root beside the backed-up paths, in one snapshot; a failing command writes none.

mod common;

use cairn_core::monitor::NullMonitor;
use cairn_core::ops::backup::{backup, BackupOptions, CommandSource};
use cairn_core::ops::browse::{self, Entry};

fn cat(
    repo: &cairn_core::repo::Repository,
    snap: &cairn_core::snapshot::Snapshot,
    path: &str,
) -> Vec<u8> {
    let Entry::Node(node) = browse::find(repo, snap, path.as_bytes()).unwrap() else {
        panic!("{path} is a file")
    };
    let mut out = Vec::new();
    browse::cat(repo, &node, path, &mut out).unwrap();
    out
}

#[test]
fn several_commands_and_a_path_make_one_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f.txt"), b"a file\n").unwrap();
    let mut repo = common::repo(&dir.path().join("repo"), None);
    let opts = BackupOptions {
        paths: vec![src.clone()],
        commands: vec![
            CommandSource::shell("db.sql", "echo dump of db; echo line two"),
            CommandSource {
                name: "big.bin".into(),
                argv: vec![
                    "head".into(),
                    "-c".into(),
                    "3000000".into(),
                    "/dev/zero".into(),
                ],
            },
        ],
        host: "h".into(),
        ..Default::default()
    };
    let report = backup(&mut repo, &opts, &NullMonitor).unwrap();
    let snap = repo.load_snapshot(&report.snapshot_id.unwrap()).unwrap();
    assert!(
        snap.paths.contains(&"/db.sql".to_string()),
        "{:?}",
        snap.paths
    );
    assert!(
        snap.paths.contains(&"/big.bin".to_string()),
        "{:?}",
        snap.paths
    );
    assert_eq!(cat(&repo, &snap, "/db.sql"), b"dump of db\nline two\n");
    assert_eq!(cat(&repo, &snap, "/big.bin"), vec![0u8; 3_000_000]);
    let f = format!("{}/f.txt", src.display());
    assert_eq!(cat(&repo, &snap, &f), b"a file\n");
    assert_eq!(report.stats.files_new, 3);
}

#[test]
fn a_failing_command_fails_the_backup_and_writes_no_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let mut repo = common::repo(&dir.path().join("repo"), None);
    let opts = BackupOptions {
        commands: vec![
            CommandSource::shell("ok.txt", "echo fine"),
            CommandSource::shell("bad.sql", "echo half a dump; exit 3"),
        ],
        host: "h".into(),
        ..Default::default()
    };
    let err = backup(&mut repo, &opts, &NullMonitor)
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad.sql") && err.contains("3"), "{err}");
    assert!(repo.snapshot_ids().unwrap().is_empty());

    let twice = BackupOptions {
        commands: vec![
            CommandSource::shell("a", "true"),
            CommandSource::shell("a", "true"),
        ],
        host: "h".into(),
        ..Default::default()
    };
    let err = backup(&mut repo, &twice, &NullMonitor)
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"a\""), "{err}");
}

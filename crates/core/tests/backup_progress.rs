//! What backup tells its `Monitor` while it works: the progress bar's current path comes
//! from these calls.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cairn_core::monitor::Monitor;
use cairn_core::ops::backup::{backup, BackupOptions};

/// Every `file_started` and `file_done` call, in order.
#[derive(Default)]
struct Recorder(Mutex<Vec<(&'static str, PathBuf)>>);

impl Monitor for Recorder {
    fn file_started(&self, path: &Path) {
        self.0.lock().unwrap().push(("started", path.to_path_buf()));
    }

    fn file_done(&self, path: &Path, _bytes: u64) {
        self.0.lock().unwrap().push(("done", path.to_path_buf()));
    }
}

#[test]
fn a_file_large_enough_to_chunk_is_announced_before_it_is_done() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // Above the default 512 KiB minimum chunk: read and chunked on its own.
    let big = src.join("big.bin");
    let data: Vec<u8> = (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&big, &data).unwrap();
    let small = src.join("small.txt");
    std::fs::write(&small, b"a small file\n").unwrap();

    let mut repo = common::repo(&dir.path().join("repo"), None);
    let opts = BackupOptions {
        paths: vec![src.clone()],
        host: "h".into(),
        username: "u".into(),
        ..Default::default()
    };
    let recorder = Recorder::default();
    backup(&mut repo, &opts, &recorder).unwrap();

    let events = recorder.0.into_inner().unwrap();
    let at = |kind: &str, path: &Path| events.iter().position(|(k, p)| *k == kind && p == path);
    let started =
        at("started", &big).unwrap_or_else(|| panic!("the large file is announced: {events:?}"));
    let done =
        at("done", &big).unwrap_or_else(|| panic!("the large file is reported done: {events:?}"));
    assert!(started < done, "{events:?}");
    assert_eq!(
        at("started", &small),
        None,
        "small files are read in bundles and only reported done: {events:?}"
    );
    assert!(at("done", &small).is_some(), "{events:?}");
}

//! `cairn backup`: summaries, change detection, dedup, excludes, stdin, unreadable files
//! and the options that shape a snapshot.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::common::*;

/// src/a.txt, src/b.bin (1 MB random), src/sub/c.txt. Returns (src, total file bytes).
fn three_file_tree(env: &TestEnv) -> (PathBuf, u64) {
    let src = env.path("src");
    write_file(&src.join("a.txt"), b"alpha\n");
    write_file(&src.join("b.bin"), &random_bytes(1_000_000, 11));
    write_file(&src.join("sub/c.txt"), b"charlie charlie\n");
    (src, 6 + 1_000_000 + 16)
}

#[test]
fn first_backup_summary_counts_new_files_dirs_and_bytes() {
    let env = TestEnv::with_repo();
    let (src, total) = three_file_tree(&env);
    let s = env.backup(&[&src], &[]);
    assert!(
        is_hex(s["snapshot_id"].as_str().unwrap_or(""), 64),
        "64-hex snapshot_id: {s}"
    );
    assert_eq!(json_u64(&s, "files_new"), 3, "{s}");
    assert_eq!(json_u64(&s, "files_changed"), 0, "{s}");
    assert_eq!(json_u64(&s, "files_unchanged"), 0, "{s}");
    assert!(
        json_u64(&s, "dirs") >= 2,
        "src and src/sub are counted: {s}"
    );
    assert_eq!(json_u64(&s, "bytes_read"), total, "{s}");
    let added = json_u64(&s, "bytes_added");
    assert!(
        (1_000_000..1_200_000).contains(&added),
        "random data does not compress, so about 1 MB is added: {s}"
    );
    json_u64(&s, "duration_ms");
    assert_eq!(s["errors"], serde_json::json!([]), "{s}");
}

#[test]
fn second_backup_of_an_unchanged_tree_finds_every_file_unchanged_and_adds_only_metadata() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("one.bin"), &random_bytes(2_000_000, 1));
    write_file(&src.join("two.bin"), &random_bytes(1_000_000, 2));
    write_file(&src.join("deep/er/three.txt"), b"three\n");
    env.backup(&[&src], &[]);

    let s = env.backup(&[&src], &[]);
    assert_eq!(json_u64(&s, "files_unchanged"), 3, "{s}");
    assert_eq!(json_u64(&s, "files_new"), 0, "{s}");
    assert_eq!(json_u64(&s, "files_changed"), 0, "{s}");
    // At most a new tree, when a directory's metadata changed: one pack, which format 4
    // pads to 64 KiB.
    assert!(
        json_u64(&s, "bytes_added") <= 64 * 1024,
        "only metadata is added: {s}"
    );
    assert_eq!(env.snapshots().len(), 2, "both backups made a snapshot");
}

#[test]
fn changes_deep_in_a_tree_reach_every_tree_above_them() {
    // A second backup keeps the parent snapshot's nodes and trees where nothing changed;
    // each change below must still give new trees up to the root.
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("a/b/c/deep.txt"), b"deep\n");
    write_file(&src.join("a/b/other.txt"), b"other\n");
    write_file(&src.join("a/top.txt"), b"top\n");
    write_file(&src.join("gone/soon.txt"), b"soon\n");
    fs::create_dir_all(src.join("e")).unwrap();
    let first = env.backup(&[&src], &[]);

    // Content three levels down: `c`'s own metadata stays as it was.
    write_file(&src.join("a/b/c/deep.txt"), b"deeper\n");
    // A directory's metadata alone.
    set_mode(&src.join("a/b"), 0o700);
    // An entry removed, and one added.
    fs::remove_file(src.join("gone/soon.txt")).unwrap();
    std::os::unix::fs::symlink("../a/top.txt", src.join("e/link")).unwrap();
    let second = env.backup(&[&src], &[]);
    assert_eq!(json_u64(&second, "files_changed"), 1, "{second}");
    assert_eq!(json_u64(&second, "files_unchanged"), 2, "{second}");
    let third = env.backup(&[&src], &[]);
    assert_eq!(json_u64(&third, "files_unchanged"), 3, "{third}");
    let snapshots = env.snapshots();
    let tree = |backup: &serde_json::Value| {
        let s = snapshots.iter().find(|s| s["id"] == backup["snapshot_id"]);
        s.map(|s| s["tree_id"].clone())
            .unwrap_or_else(|| panic!("{backup} in {snapshots:?}"))
    };
    assert_ne!(tree(&first), tree(&second));
    // Nothing changed in the source since the second backup, so its trees are the
    // second's: at most the trees of the directories above it are new, whose metadata
    // other processes change (tests running beside this one add entries to /tmp).
    let above = env.root.components().count() as u64;
    assert!(
        tree(&second) == tree(&third) || json_u64(&third, "blobs_added") <= above,
        "nothing changed since the second: {third}"
    );

    let target = env.path("restored");
    env.restore(third["snapshot_id"].as_str().unwrap_or(""), &target, &[]);
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);
}

#[test]
fn backup_after_editing_one_file_and_adding_another_reports_one_changed_and_one_new() {
    let env = TestEnv::with_repo();
    let (src, _) = three_file_tree(&env);
    env.backup(&[&src], &[]);

    write_file(&src.join("a.txt"), b"alpha, edited\n");
    set_mtime(&src.join("a.txt"), 1_700_000_000, 5);
    write_file(&src.join("sub/new.txt"), b"new\n");
    let s = env.backup(&[&src], &[]);
    assert_eq!(json_u64(&s, "files_changed"), 1, "{s}");
    assert_eq!(json_u64(&s, "files_new"), 1, "{s}");
    assert_eq!(json_u64(&s, "files_unchanged"), 2, "{s}");

    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);
}

#[test]
fn a_same_size_edit_with_an_unchanged_mtime_is_still_detected() {
    // An edit that keeps size and mtime (e.g. a tool that restores mtime) changes ctime;
    // a backup that trusted size+mtime alone would silently keep the old bytes.
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f.txt"), b"version one\n");
    set_mtime(&src.join("f.txt"), 1_600_000_000, 0);
    env.backup(&[&src], &[]);

    write_file(&src.join("f.txt"), b"version two\n");
    set_mtime(&src.join("f.txt"), 1_600_000_000, 0);
    let s = env.backup(&[&src], &[]);
    assert_eq!(json_u64(&s, "files_changed"), 1, "{s}");
    let out = env
        .cmd()
        .arg("cat")
        .arg("latest")
        .arg(src.join("f.txt"))
        .output()
        .unwrap();
    assert_success(&out, "cairn cat");
    assert_eq!(out.stdout, b"version two\n");
}

#[test]
fn a_file_stored_twice_is_stored_once() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    let data = random_bytes(2_000_000, 5);
    write_file(&src.join("copy1.bin"), &data);
    write_file(&src.join("sub/copy2.bin"), &data);
    let s = env.backup(&[&src], &[]);
    let added = json_u64(&s, "bytes_added");
    assert!(
        (2_000_000..2_400_000).contains(&added),
        "two identical 2 MB files add about 2 MB: {s}"
    );
}

#[test]
fn force_rereads_every_file_and_still_adds_no_data() {
    let env = TestEnv::with_repo();
    let (src, total) = three_file_tree(&env);
    env.backup(&[&src], &[]);
    let s = env.backup(&[&src], &["--force"]);
    assert!(
        json_u64(&s, "bytes_read") >= total,
        "--force reads all {total} bytes: {s}"
    );
    // At most a new tree: one pack, which format 4 pads to 64 KiB.
    assert!(
        json_u64(&s, "bytes_added") <= 64 * 1024,
        "re-read data deduplicates: {s}"
    );
    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);
}

#[test]
fn an_explicit_parent_lets_unchanged_files_be_skipped() {
    let env = TestEnv::with_repo();
    let (src, _) = three_file_tree(&env);
    let first = env.backup_id(&[&src], &[]);
    // A snapshot of something else in between, so "latest" is not the natural parent.
    let other = env.path("other");
    write_file(&other.join("x"), b"x");
    env.backup(&[&other], &[]);

    let s = env.backup(&[&src], &["--parent", &first]);
    assert_eq!(json_u64(&s, "files_unchanged"), 3, "{s}");
    assert_eq!(json_u64(&s, "files_new"), 0, "{s}");
}

#[test]
fn relative_source_paths_are_stored_as_absolute_paths() {
    let env = TestEnv::with_repo();
    let (src, _) = three_file_tree(&env);
    // The command runs in env.root, so "src" is relative.
    let out = env.cmd().args(["backup", "src"]).output().unwrap();
    assert_success(&out, "cairn backup src");
    let snaps = env.snapshots();
    assert_eq!(
        snaps[0]["paths"],
        serde_json::json!([src.to_str().unwrap()]),
        "{snaps:?}"
    );
}

#[test]
fn tags_and_host_given_to_backup_are_recorded_in_the_snapshot() {
    let env = TestEnv::with_repo();
    let (src, _) = three_file_tree(&env);
    env.backup(
        &[&src],
        &[
            "--tag",
            "daily",
            "--tag",
            "laptop",
            "--host",
            "backup-host-7",
        ],
    );
    let snaps = env.snapshots();
    let tags: BTreeSet<&str> = snaps[0]["tags"]
        .as_array()
        .unwrap_or_else(|| panic!("tags array in {}", snaps[0]))
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tags, BTreeSet::from(["daily", "laptop"]));
    assert_eq!(snaps[0]["host"], "backup-host-7");
}

#[test]
fn the_host_defaults_to_the_machine_hostname() {
    let env = TestEnv::with_repo();
    let (src, _) = three_file_tree(&env);
    env.backup(&[&src], &[]);
    let hostname = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(env.snapshots()[0]["host"], hostname.trim());
}

/// Tree for exclude tests; returns src.
fn exclude_tree(env: &TestEnv) -> PathBuf {
    let src = env.path("src");
    for f in [
        "keep.txt",
        "skip.tmp",
        "sub/keep.txt",
        "sub/skip.tmp",
        "sub/deeper/keep.txt",
        "sub/deeper/x.tmp",
        "node_modules/pkg/index.js",
        "sub/node_modules/f.js",
        "other/keep.txt",
    ] {
        write_file(&src.join(f), f.as_bytes());
    }
    src
}

fn restored_file_set(env: &TestEnv, src: &Path) -> BTreeSet<String> {
    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    files_below(&restored_path(&target, src))
        .into_keys()
        .map(|p| p.to_str().unwrap().to_string())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn an_exclude_without_a_slash_matches_a_file_or_dir_name_anywhere() {
    let env = TestEnv::with_repo();
    let src = exclude_tree(&env);
    env.backup(
        &[&src],
        &["--exclude", "*.tmp", "--exclude", "node_modules"],
    );
    assert_eq!(
        restored_file_set(&env, &src),
        set(&[
            "keep.txt",
            "sub/keep.txt",
            "sub/deeper/keep.txt",
            "other/keep.txt"
        ])
    );
}

#[test]
fn an_exclude_with_a_slash_matches_the_absolute_path() {
    let env = TestEnv::with_repo();
    let src = exclude_tree(&env);
    let sub_tmp = format!("{}/sub/*.tmp", src.display());
    env.backup(&[&src], &["--exclude", &sub_tmp, "--exclude", "**/deeper"]);
    let files = restored_file_set(&env, &src);
    assert!(
        !files.contains("sub/skip.tmp"),
        "{sub_tmp} excludes sub/skip.tmp: {files:?}"
    );
    assert!(
        files.contains("skip.tmp"),
        "{sub_tmp} keeps the top-level skip.tmp: {files:?}"
    );
    assert!(
        !files.iter().any(|f| f.starts_with("sub/deeper")),
        "**/deeper excludes the deeper directory: {files:?}"
    );
    assert!(
        files.contains("sub/keep.txt") && files.contains("node_modules/pkg/index.js"),
        "{files:?}"
    );
}

#[test]
fn a_relative_pattern_with_a_slash_matches_the_end_of_the_path_and_a_leading_slash_anchors() {
    // As restic: "sub/skip.tmp" matches .../src/sub/skip.tmp; "/sub/skip.tmp" only a
    // top-level /sub, which is not there.
    for (pattern, kept) in [("sub/skip.tmp", false), ("/sub/skip.tmp", true)] {
        let env = TestEnv::with_repo();
        let src = exclude_tree(&env);
        env.backup(&[&src], &["--exclude", pattern]);
        let files = restored_file_set(&env, &src);
        assert_eq!(files.contains("sub/skip.tmp"), kept, "{pattern}: {files:?}");
    }
}

#[test]
fn an_exclude_file_supplies_one_pattern_per_line() {
    let env = TestEnv::with_repo();
    let src = exclude_tree(&env);
    let patterns = env.path("excludes.txt");
    write_file(&patterns, b"*.tmp\nnode_modules\n");
    let patterns2 = env.path("excludes2.txt");
    write_file(&patterns2, format!("{}/other\n", src.display()).as_bytes());
    env.backup(
        &[&src],
        &[
            "--exclude-file",
            patterns.to_str().unwrap(),
            "--exclude-file",
            patterns2.to_str().unwrap(),
        ],
    );
    assert_eq!(
        restored_file_set(&env, &src),
        set(&["keep.txt", "sub/keep.txt", "sub/deeper/keep.txt"])
    );
}

#[test]
fn stdin_is_stored_as_one_file_with_the_given_name() {
    let env = TestEnv::with_repo();
    let data = random_bytes(3_000_000, 9);
    let out = env
        .cmd()
        .args([
            "backup",
            "--json",
            "--stdin",
            "--stdin-filename",
            "dump.sql",
        ])
        .write_stdin(data.clone())
        .output()
        .unwrap();
    assert_success(&out, "cairn backup --stdin");

    let out = env
        .cmd()
        .args(["ls", "--json", "-R", "latest"])
        .output()
        .unwrap();
    assert_success(&out, "cairn ls --json latest");
    let entries = parse_json(&out.stdout, "cairn ls --json");
    let path = entries["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "file")
        .map(|e| e["path"].as_str().unwrap().to_string())
        .find(|p| p.ends_with("dump.sql"))
        .unwrap_or_else(|| panic!("a file named dump.sql in {entries}"));

    let out = env.cmd().args(["cat", "latest", &path]).output().unwrap();
    assert_success(&out, "cairn cat latest dump.sql");
    assert!(out.stdout == data, "cat returns the bytes read from stdin");

    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    let files = files_below(&target);
    assert_eq!(files.len(), 1, "one file restored: {:?}", files.keys());
    let (name, contents) = files.into_iter().next().unwrap();
    assert!(name.ends_with("dump.sql"), "{name:?}");
    assert!(contents == data, "restored stdin file has the same bytes");
}

#[test]
fn quiet_backup_prints_nothing_on_stdout() {
    let env = TestEnv::with_repo();
    let (src, _) = three_file_tree(&env);
    let out = env
        .cmd()
        .arg("-q")
        .arg("backup")
        .arg(&src)
        .output()
        .unwrap();
    assert_success(&out, "cairn -q backup");
    assert!(out.stdout.is_empty(), "no output: {}", stdout(&out));
    assert_eq!(env.snapshots().len(), 1);
}

#[test]
fn text_summary_mentions_the_snapshot_id() {
    let env = TestEnv::with_repo();
    let (src, _) = three_file_tree(&env);
    let out = env.cmd().arg("backup").arg(&src).output().unwrap();
    assert_success(&out, "cairn backup");
    let snaps = env.snapshots();
    let short = snaps[0]["short_id"].as_str().unwrap();
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert!(all.contains(short), "summary names snapshot {short}: {all}");
}

/// Runs `cairn ARGS` as user nobody; None if setpriv is not available.
fn cairn_as_nobody(env: &TestEnv, args: &[&std::ffi::OsStr]) -> Option<std::process::Output> {
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| Path::new(p).exists())?;
    let bin = cairn_bin();
    let mut cmd = assert_cmd::Command::from_std(detached(setpriv));
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bin)
        .arg("-r")
        .arg(&env.repo)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", env.root.join("home"))
        .env("XDG_DATA_HOME", env.root.join("data"))
        .env("XDG_CONFIG_HOME", env.root.join("config"))
        .env("CAIRN_PASSWORD", PASSWORD)
        .current_dir(&env.root)
        .timeout(COMMAND_TIMEOUT);
    Some(cmd.output().unwrap())
}

/// A tree with one unreadable file, opened up for nobody. Returns (src, unreadable).
fn tree_with_unreadable_file(env: &TestEnv) -> (PathBuf, PathBuf) {
    let src = env.path("src");
    write_file(&src.join("readable.txt"), b"fine\n");
    write_file(
        &src.join("sub/also-readable.bin"),
        &random_bytes(300_000, 4),
    );
    let secret = src.join("sub/unreadable.txt");
    write_file(&secret, b"nobody may read this\n");
    env.make_world_accessible();
    set_mode(&secret, 0o000);
    (src, secret)
}

#[test]
fn an_unreadable_file_is_reported_skipped_and_gives_exit_code_3() {
    let env = TestEnv::with_repo();
    let (src, secret) = tree_with_unreadable_file(&env);
    let Some(out) = cairn_as_nobody(&env, &["backup".as_ref(), src.as_os_str()]) else {
        eprintln!("SKIPPED: setpriv is not installed, cannot drop root to test unreadable files");
        return;
    };
    assert_exit(&out, 3, "backup with an unreadable file");
    assert!(
        stderr(&out).contains(secret.to_str().unwrap()),
        "stderr names {}: {}",
        secret.display(),
        stderr(&out)
    );

    // The snapshot was still written and holds everything else.
    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    let restored = restored_path(&target, &src);
    assert_eq!(fs::read(restored.join("readable.txt")).unwrap(), b"fine\n");
    assert_eq!(
        fs::read(restored.join("sub/also-readable.bin")).unwrap(),
        random_bytes(300_000, 4)
    );
    assert!(
        !restored.join("sub/unreadable.txt").exists(),
        "the unreadable file is not restored with made-up contents"
    );
}

#[test]
fn an_unreadable_file_is_listed_in_the_json_errors() {
    let env = TestEnv::with_repo();
    let (src, secret) = tree_with_unreadable_file(&env);
    let Some(out) = cairn_as_nobody(
        &env,
        &["backup".as_ref(), "--json".as_ref(), src.as_os_str()],
    ) else {
        eprintln!("SKIPPED: setpriv is not installed, cannot drop root to test unreadable files");
        return;
    };
    assert_exit(&out, 3, "backup --json with an unreadable file");
    let s = parse_json(&out.stdout, "cairn backup --json");
    let errors = s["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("errors array: {s}"));
    assert_eq!(errors.len(), 1, "{s}");
    assert_eq!(errors[0]["path"], secret.to_str().unwrap(), "{s}");
    assert!(!errors[0]["error"].as_str().unwrap_or("").is_empty(), "{s}");
    assert_eq!(json_u64(&s, "files_new"), 2, "{s}");
}

/// Unmounts on drop, so a failing test does not leave a mount behind.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn one_file_system_does_not_descend_into_other_mounts() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("here.txt"), b"same fs\n");
    let mnt = src.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&mnt)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("SKIPPED: cannot mount a tmpfs here (no privilege in this container)");
        return;
    }
    let _guard = Mount(mnt.clone());
    write_file(&mnt.join("there.txt"), b"other fs\n");

    env.backup(&[&src], &["--one-file-system"]);
    let target = env.path("restored-ofs");
    env.restore("latest", &target, &[]);
    let restored = restored_path(&target, &src);
    assert!(restored.join("here.txt").exists());
    assert!(
        !restored.join("mnt/there.txt").exists(),
        "--one-file-system skipped the tmpfs"
    );

    env.backup(&[&src], &[]);
    let target = env.path("restored-all");
    env.restore("latest", &target, &[]);
    assert_eq!(
        fs::read(restored_path(&target, &src).join("mnt/there.txt")).unwrap(),
        b"other fs\n",
        "without --one-file-system the mount is included"
    );
}

#[test]
fn a_file_dated_after_2262_does_not_break_the_next_backup() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("future.txt"), b"from the future\n");
    set_mtime(&src.join("future.txt"), 16_725_225_600, 0); // 2500-01-01
    env.backup(&[&src], &[]);
    let s = env.backup(&[&src], &[]);
    assert_eq!(json_u64(&s, "files_unchanged"), 1, "{s}");
}

#[test]
fn a_file_replaced_by_another_with_the_same_size_and_mtime_is_seen_as_changed() {
    // `mv` of a same-size file with a preserved mtime changes only inode and ctime.
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f.bin"), b"AAAAAAAA");
    set_mtime(&src.join("f.bin"), 1_600_000_000, 0);
    env.backup(&[&src], &[]);
    let staged = env.path("staged.bin");
    write_file(&staged, b"BBBBBBBB");
    set_mtime(&staged, 1_600_000_000, 0);
    fs::rename(&staged, src.join("f.bin")).unwrap();
    let s = env.backup(&[&src], &[]);
    assert_eq!(json_u64(&s, "files_changed"), 1, "{s}");
    let out = env
        .cmd()
        .arg("cat")
        .arg("latest")
        .arg(src.join("f.bin"))
        .output()
        .unwrap();
    assert_success(&out, "cairn cat");
    assert_eq!(out.stdout, b"BBBBBBBB");
}

#[test]
fn renaming_a_big_file_adds_only_metadata() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("before.bin"), &random_bytes(3_000_000, 12));
    env.backup(&[&src], &[]);
    fs::rename(src.join("before.bin"), src.join("after.bin")).unwrap();
    let s = env.backup(&[&src], &[]);
    // Only the new tree is added: one pack, which format 4 pads to 64 KiB.
    assert!(
        json_u64(&s, "bytes_added") <= 64 * 1024,
        "the data deduplicates: {s}"
    );
}

#[test]
fn a_missing_source_path_is_an_error_that_names_it() {
    let env = TestEnv::with_repo();
    let missing = env.path("no-such-dir");
    let out = env.cmd().arg("backup").arg(&missing).output().unwrap();
    assert_exit(&out, 1, "cairn backup of a missing path");
    assert!(
        stderr(&out).contains(missing.to_str().unwrap()),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_unreadable_directory_is_reported_skipped_and_gives_exit_code_3() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("readable.txt"), b"fine\n");
    let closed = src.join("closed");
    write_file(&closed.join("inside.txt"), b"hidden\n");
    env.make_world_accessible();
    set_mode(&closed, 0o000);
    let Some(out) = cairn_as_nobody(&env, &["backup".as_ref(), src.as_os_str()]) else {
        eprintln!("SKIPPED: setpriv is not installed, cannot drop root to test unreadable dirs");
        return;
    };
    assert_exit(&out, 3, "backup with an unreadable directory");
    assert!(
        stderr(&out).contains(closed.to_str().unwrap()),
        "{}",
        stderr(&out)
    );
    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    assert_eq!(
        fs::read(restored_path(&target, &src).join("readable.txt")).unwrap(),
        b"fine\n"
    );
}

#[test]
fn a_backup_killed_midway_leaves_a_repository_that_backs_up_and_restores() {
    let env = TestEnv::with_small_chunk_repo();
    let src = env.path("src");
    write_file(&src.join("big.bin"), &random_bytes(40_000_000, 13));
    // Held to 4 MB/s, the backup lasts ten seconds: still running when the test, however
    // late a loaded machine runs it, sees the first pack.
    let mut child = detached(cairn_bin())
        .arg("-r")
        .arg(&env.repo)
        .args(["--limit-upload", "4000", "backup"])
        .arg(&src)
        .env("CAIRN_PASSWORD", PASSWORD)
        .env("HOME", env.root.join("home"))
        .env("XDG_DATA_HOME", env.root.join("data"))
        .env("XDG_CONFIG_HOME", env.root.join("config"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once it has written some packs.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while env.repo_files("data").is_empty() && std::time::Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let finished = child.try_wait().unwrap().is_some();
    child.kill().ok();
    child.wait().unwrap();
    assert!(!finished, "the backup finished before it could be killed");
    assert!(
        env.snapshots().is_empty(),
        "a killed backup leaves no snapshot"
    );

    write_file(&src.join("small.txt"), b"after the crash\n");
    env.backup(&[&src], &[]);
    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);
}

#[test]
fn two_concurrent_backups_both_make_restorable_snapshots() {
    let env = TestEnv::with_small_chunk_repo();
    let one = env.path("one");
    let two = env.path("two");
    write_file(&one.join("x.bin"), &random_bytes(20_000_000, 14));
    write_file(&two.join("y.bin"), &random_bytes(20_000_000, 15));
    let (r1, r2) = std::thread::scope(|s| {
        let a = s.spawn(|| env.cmd().arg("backup").arg(&one).output().unwrap());
        let b = s.spawn(|| env.cmd().arg("backup").arg(&two).output().unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_success(&r1, "first concurrent backup");
    assert_success(&r2, "second concurrent backup");
    let snaps = env.snapshots();
    assert_eq!(snaps.len(), 2);
    for s in snaps {
        let id = s["id"].as_str().unwrap();
        let target = env.path(&format!("restored-{id}"));
        env.restore(id, &target, &[]);
        let source = std::path::PathBuf::from(s["paths"][0].as_str().unwrap());
        assert_trees_equal(&source, &restored_path(&target, &source), Compare::ALL);
    }
}

//! `cairn restore` with `--include`, `--exclude`, a single file, `--overwrite
//! if-changed|if-newer`, `--delete`, and resuming an interrupted restore.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::common::*;

/// src/a.txt, src/b.log, src/docs/{x.txt,y.md}, src/docs/deep/z.txt, src/cache/junk.bin.
fn tree(env: &TestEnv) -> PathBuf {
    let src = env.path("src");
    write_file(&src.join("a.txt"), b"a");
    write_file(&src.join("b.log"), b"b");
    write_file(&src.join("docs/x.txt"), b"x");
    write_file(&src.join("docs/y.md"), b"y");
    write_file(&src.join("docs/deep/z.txt"), b"z");
    write_file(&src.join("cache/junk.bin"), &random_bytes(10_000, 1));
    src
}

fn restore_json(env: &TestEnv, spec: &str, target: &Path, extra: &[&str]) -> serde_json::Value {
    let out = env.restore(spec, target, &[&["--json"], extra].concat());
    parse_json(&out.stdout, "cairn restore --json")
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = files_below(dir)
        .keys()
        .map(|p| p.display().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn restore_filter_include_by_name_creates_only_the_parents_of_matches() {
    let env = TestEnv::with_repo();
    let src = tree(&env);
    env.backup(&[&src], &[]);
    let target = env.path("t");
    let spec = format!("latest:{}", src.display());
    let s = restore_json(&env, &spec, &target, &["--include", "*.txt"]);
    assert_eq!(names(&target), ["a.txt", "docs/deep/z.txt", "docs/x.txt"]);
    assert!(
        !target.join("cache").exists(),
        "no empty dirs for unselected parts"
    );
    assert_eq!(json_u64(&s, "files_restored"), 3, "{s}");
}

#[test]
fn restore_filter_include_a_directory_path_brings_all_below_it() {
    let env = TestEnv::with_repo();
    let src = tree(&env);
    env.backup(&[&src], &[]);
    let target = env.path("t");
    let include = format!("{}/docs", src.display());
    env.restore("latest", &target, &["--include", &include]);
    let r = restored_path(&target, &src);
    assert_eq!(names(&r), ["docs/deep/z.txt", "docs/x.txt", "docs/y.md"]);
}

#[test]
fn restore_filter_exclude_skips_a_directory_whole_and_names_anywhere() {
    let env = TestEnv::with_repo();
    let src = tree(&env);
    env.backup(&[&src], &[]);
    let target = env.path("t");
    env.restore(
        "latest",
        &target,
        &["--exclude", "cache", "--exclude", "*.md"],
    );
    let r = restored_path(&target, &src);
    assert_eq!(
        names(&r),
        ["a.txt", "b.log", "docs/deep/z.txt", "docs/x.txt"]
    );
    assert!(!r.join("cache").exists());
}

#[test]
fn restore_filter_include_and_exclude_combine() {
    let env = TestEnv::with_repo();
    let src = tree(&env);
    env.backup(&[&src], &[]);
    let target = env.path("t");
    let spec = format!("latest:{}", src.display());
    env.restore(&spec, &target, &["-i", "docs", "-e", "deep"]);
    assert_eq!(names(&target), ["docs/x.txt", "docs/y.md"]);
}

#[test]
fn restore_filter_that_matches_nothing_fails_and_writes_nothing() {
    let env = TestEnv::with_repo();
    let src = tree(&env);
    env.backup(&[&src], &[]);
    let target = env.path("t");
    let out = env
        .cmd()
        .args(["restore", "latest", "--target"])
        .arg(&target)
        .args(["--include", "*.txt", "--include", "*.nope"])
        .output()
        .unwrap();
    assert_exit(&out, 1, "restore with an include that matches nothing");
    assert!(stderr(&out).contains("*.nope"), "{}", describe(&out));
    assert_eq!(count_files(&target), 0, "nothing is written");

    let out = env
        .cmd()
        .args(["restore", "latest", "--target"])
        .arg(&target)
        .args(["--exclude", "no-such-name"])
        .output()
        .unwrap();
    assert_exit(&out, 1, "restore with an exclude that matches nothing");
    assert!(stderr(&out).contains("no-such-name"), "{}", describe(&out));
}

#[test]
fn restore_filter_a_bad_pattern_is_an_error_naming_it() {
    let env = TestEnv::with_repo();
    let src = tree(&env);
    env.backup(&[&src], &[]);
    let target = env.path("t");
    let out = env
        .cmd()
        .args(["restore", "latest", "--target"])
        .arg(&target)
        .args(["--include", "[z-a]"])
        .output()
        .unwrap();
    assert_exit(&out, 1, "restore with a bad pattern");
    assert!(stderr(&out).contains("[z-a]"), "{}", describe(&out));
    assert_eq!(count_files(&target), 0);
}

#[test]
fn restore_filter_single_file_lands_in_the_target_under_its_name() {
    let env = TestEnv::with_repo();
    let src = tree(&env);
    set_mtime(&src.join("docs/x.txt"), 1_600_000_000, 5);
    env.backup(&[&src], &[]);
    let target = env.path("t");
    let spec = format!("latest:{}", src.join("docs/x.txt").display());
    let s = restore_json(&env, &spec, &target, &[]);
    assert_eq!(names(&target), ["x.txt"]);
    assert_eq!(fs::read(target.join("x.txt")).unwrap(), b"x");
    assert_eq!(
        fs::metadata(target.join("x.txt")).unwrap().mtime(),
        1_600_000_000
    );
    assert_eq!(json_u64(&s, "files_restored"), 1, "{s}");
    // Into a target that already holds other files, with an overwrite mode.
    write_file(&target.join("other"), b"other");
    fs::remove_file(target.join("x.txt")).unwrap();
    env.restore(&spec, &target, &["--overwrite", "if-changed"]);
    assert_eq!(names(&target), ["other", "x.txt"]);
}

#[test]
fn restore_filter_overwrite_if_changed_writes_only_changed_files() {
    let env = TestEnv::with_repo();
    let src = tree(&env);
    env.backup(&[&src], &[]);
    let target = env.path("t");
    let spec = format!("latest:{}", src.display());
    env.restore(&spec, &target, &[]);
    let ino = |p: &str| fs::metadata(target.join(p)).unwrap().ino();
    let before_a = ino("a.txt");
    let before_x = ino("docs/x.txt");
    // Same size, other bytes, other mtime: changed.
    write_file(&target.join("b.log"), b"B");
    let s = restore_json(&env, &spec, &target, &["--overwrite", "if-changed"]);
    assert_eq!(json_u64(&s, "files_restored"), 1, "{s}");
    assert_eq!(json_u64(&s, "unchanged"), 5, "{s}");
    assert_eq!(fs::read(target.join("b.log")).unwrap(), b"b");
    assert_eq!(ino("a.txt"), before_a, "an unchanged file is not rewritten");
    assert_eq!(ino("docs/x.txt"), before_x);
}

#[test]
fn restore_filter_if_changed_with_verify_catches_same_size_and_mtime_edits() {
    let env = TestEnv::with_repo();
    let src = tree(&env);
    env.backup(&[&src], &[]);
    let target = env.path("t");
    let spec = format!("latest:{}", src.display());
    env.restore(&spec, &target, &[]);
    let junk = target.join("cache/junk.bin");
    let mtime = fs::metadata(&junk).unwrap();
    let mut data = fs::read(&junk).unwrap();
    data[5000] ^= 0xff;
    fs::write(&junk, &data).unwrap();
    set_mtime(&junk, mtime.mtime(), mtime.mtime_nsec());

    let s = restore_json(&env, &spec, &target, &["--overwrite", "if-changed"]);
    assert_eq!(
        json_u64(&s, "files_restored"),
        0,
        "size and mtime alone cannot see it: {s}"
    );
    let s = restore_json(
        &env,
        &spec,
        &target,
        &["--overwrite", "if-changed", "--verify"],
    );
    assert_eq!(json_u64(&s, "files_restored"), 1, "{s}");
    assert_eq!(json_u64(&s, "unchanged"), 5, "{s}");
    assert_trees_equal(&src, &target, Compare::CONTENTS);
}

#[test]
fn restore_filter_overwrite_if_newer_replaces_only_older_files() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("old-here.txt"), b"snapshot");
    write_file(&src.join("new-here.txt"), b"snapshot");
    set_mtime(&src.join("old-here.txt"), 1_600_000_000, 0);
    set_mtime(&src.join("new-here.txt"), 1_600_000_000, 0);
    env.backup(&[&src], &[]);
    let target = env.path("t");
    write_file(&target.join("old-here.txt"), b"local, older");
    set_mtime(&target.join("old-here.txt"), 1_500_000_000, 0);
    write_file(&target.join("new-here.txt"), b"local, newer");
    set_mtime(&target.join("new-here.txt"), 1_700_000_000, 0);
    let spec = format!("latest:{}", src.display());
    let s = restore_json(&env, &spec, &target, &["--overwrite", "if-newer"]);
    assert_eq!(fs::read(target.join("old-here.txt")).unwrap(), b"snapshot");
    assert_eq!(
        fs::read(target.join("new-here.txt")).unwrap(),
        b"local, newer"
    );
    assert_eq!(json_u64(&s, "files_restored"), 1, "{s}");
    assert_eq!(json_u64(&s, "files_skipped"), 1, "{s}");
}

#[test]
fn restore_filter_delete_removes_extras_but_nothing_outside_the_target() {
    let env = TestEnv::with_repo();
    let src = tree(&env);
    env.backup(&[&src], &[]);
    let outside = env.path("outside");
    write_file(&outside.join("precious"), b"must stay");
    write_file(&outside.join("sub/deep"), b"must stay too");
    let target = env.path("t");
    write_file(&target.join("extra.txt"), b"not in the snapshot");
    write_file(&target.join("docs/extra-dir/f"), b"not in the snapshot");
    std::os::unix::fs::symlink(&outside, target.join("link-out")).unwrap();
    std::os::unix::fs::symlink(outside.join("precious"), target.join("docs/link-file")).unwrap();

    let spec = format!("latest:{}", src.display());
    let s = restore_json(&env, &spec, &target, &["--delete"]);
    assert_eq!(json_u64(&s, "deleted"), 4, "{s}");
    assert_trees_equal(&src, &target, Compare::CONTENTS);
    assert_eq!(fs::read(outside.join("precious")).unwrap(), b"must stay");
    assert_eq!(
        fs::read(outside.join("sub/deep")).unwrap(),
        b"must stay too"
    );
}

#[test]
fn restore_filter_delete_with_filters_removes_only_selected_extras() {
    let env = TestEnv::with_repo();
    let src = tree(&env);
    env.backup(&[&src], &[]);
    let target = env.path("t");
    write_file(
        &target.join("stale.txt"),
        b"selected by *.txt, not in the snapshot",
    );
    write_file(&target.join("keep.bin"), b"not selected: stays");
    let spec = format!("latest:{}", src.display());
    // --force: the target shares no name with the snapshot, which --delete refuses alone.
    let s = restore_json(
        &env,
        &spec,
        &target,
        &["--delete", "--force", "--include", "*.txt"],
    );
    assert_eq!(json_u64(&s, "deleted"), 1, "{s}");
    assert_eq!(
        names(&target),
        ["a.txt", "docs/deep/z.txt", "docs/x.txt", "keep.bin"]
    );
}

#[test]
fn restore_filter_interrupted_restore_resumes_writing_only_what_is_missing_or_wrong() {
    let env = TestEnv::with_repo();
    let src = tree(&env);
    env.backup(&[&src], &[]);
    let target = env.path("t");
    let spec = format!("latest:{}", src.display());
    env.restore(&spec, &target, &[]);
    // What an interrupted run leaves: a truncated file, a missing one, a temporary file.
    let junk = target.join("cache/junk.bin");
    let f = fs::OpenOptions::new().write(true).open(&junk).unwrap();
    f.set_len(100).unwrap();
    drop(f);
    fs::remove_file(target.join("docs/y.md")).unwrap();
    write_file(
        &target.join("docs/.cairn-restore-0123456789abcdef"),
        b"partial",
    );
    let inodes = |t: &Path| -> Vec<(PathBuf, u64)> {
        ["a.txt", "b.log", "docs/x.txt", "docs/deep/z.txt"]
            .iter()
            .map(|p| (PathBuf::from(p), fs::metadata(t.join(p)).unwrap().ino()))
            .collect()
    };
    let before = inodes(&target);

    let s = restore_json(&env, &spec, &target, &["--overwrite", "if-changed"]);
    assert_eq!(json_u64(&s, "files_restored"), 2, "{s}");
    assert_eq!(json_u64(&s, "unchanged"), 4, "{s}");
    assert_eq!(json_u64(&s, "temp_files_removed"), 1, "{s}");
    assert_eq!(inodes(&target), before, "correct files are not rewritten");
    assert_trees_equal(&src, &target, Compare::CONTENTS);
}

/// Ctrl-C stops a restore with one line that says what was written and how to finish,
/// not an error per unfinished file, and exit code 130; the run it suggests finishes.
#[test]
fn restore_interrupted_says_so_once_and_the_suggested_rerun_finishes() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_random_files(&src, 3000, 20_000, 7);
    env.backup(&[&src], &[]);
    let target = env.path("t");
    let mut restore = spawnable(&env);
    restore
        .arg("restore")
        .arg("latest")
        .arg("--target")
        .arg(&target)
        // 60 MB at 4 MB/s: fifteen seconds, still running when it is interrupted.
        .args(["--limit-download", "4000"]);
    let out = interrupt_when(
        &mut restore,
        "the restore wrote nothing",
        std::time::Duration::from_millis(20),
        || count_files(&target) > 0,
    );
    assert_exit(&out, 130, "an interrupted restore");
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("restore interrupted: "), "{err}");
    assert!(err.contains("--overwrite if-changed"), "{err}");
    assert!(!err.contains("nothing was committed"), "{err}");
    let out = env.restore("latest", &target, &["--overwrite", "if-changed"]);
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::CONTENTS);
}

//! `cairn diff`: changes between two snapshots, or a snapshot and a live directory, read
//! from trees (and file contents only for --content).

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::*;

/// `cairn diff --json ARGS...`, which must exit 0; returns (changes by path, summary).
fn diff_json(env: &TestEnv, args: &[&std::ffi::OsStr]) -> (Vec<Value>, Value) {
    let out = env
        .cmd()
        .args(["diff", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert_success(&out, "cairn diff --json");
    let v = parse_json(&out.stdout, "cairn diff --json");
    let changes = v["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("changes is an array: {v}"))
        .clone();
    (changes, v["summary"].clone())
}

fn change<'a>(changes: &'a [Value], path: &Path) -> &'a Value {
    let p = path.to_str().unwrap();
    changes
        .iter()
        .find(|c| c["path"] == p)
        .unwrap_or_else(|| panic!("a change for {p} in {changes:#?}"))
}

fn paths(changes: &[Value]) -> Vec<String> {
    changes
        .iter()
        .map(|c| c["path"].as_str().unwrap().to_string())
        .collect()
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

/// A source with one entry for each kind of change to come, backed up once.
fn before(env: &TestEnv) -> PathBuf {
    let src = env.path("src");
    write_file(&src.join("same.txt"), b"unchanged\n");
    write_file(&src.join("content.txt"), b"line 1\nline 2\nline 3\n");
    write_file(&src.join("mode.txt"), b"mode\n");
    write_file(&src.join("touched.txt"), b"touched\n");
    write_file(&src.join("gone.txt"), b"12345");
    write_file(&src.join("becomes-dir"), b"file first\n");
    write_file(&src.join("olddir/inner.txt"), b"inner\n");
    write_file(&src.join("keep/deep/a.txt"), b"deep\n");
    std::os::unix::fs::symlink("same.txt", src.join("link")).unwrap();
    for (i, f) in ["same.txt", "content.txt", "mode.txt", "touched.txt"]
        .iter()
        .enumerate()
    {
        set_mtime(&src.join(f), 1_600_000_000 + i as i64, 0);
    }
    src
}

/// Applies one change of each kind to `before`'s tree.
fn change_everything(src: &Path) {
    write_file(&src.join("content.txt"), b"line 1\nline two\nline 3\n");
    set_mode(&src.join("mode.txt"), 0o600);
    set_mtime(&src.join("touched.txt"), 1_700_000_000, 0);
    fs::remove_file(src.join("gone.txt")).unwrap();
    write_file(&src.join("new.txt"), b"brand new file\n");
    fs::remove_file(src.join("becomes-dir")).unwrap();
    write_file(&src.join("becomes-dir/child.txt"), b"child\n");
    fs::remove_dir_all(src.join("olddir")).unwrap();
    fs::remove_file(src.join("link")).unwrap();
    std::os::unix::fs::symlink("content.txt", src.join("link")).unwrap();
}

#[test]
fn diff_reports_every_kind_of_change_between_two_snapshots() {
    let env = TestEnv::with_repo();
    let src = before(&env);
    let a = env.backup_id(&[&src], &[]);
    change_everything(&src);
    let b = env.backup_id(&[&src], &[]);

    let (changes, summary) = diff_json(&env, &[os(&a), os(&b)]);
    let kind = |p: &str| change(&changes, &src.join(p))["change"].clone();
    assert_eq!(kind("content.txt"), "modified");
    assert_eq!(kind("mode.txt"), "metadata");
    assert_eq!(
        change(&changes, &src.join("mode.txt"))["metadata"],
        serde_json::json!(["mode"])
    );
    assert_eq!(kind("touched.txt"), "metadata");
    assert_eq!(
        change(&changes, &src.join("touched.txt"))["metadata"],
        serde_json::json!(["mtime"])
    );
    assert_eq!(kind("gone.txt"), "removed");
    assert_eq!(kind("new.txt"), "added");
    assert_eq!(kind("becomes-dir"), "type_changed");
    let t = change(&changes, &src.join("becomes-dir"));
    assert_eq!(
        (t["old_type"].as_str(), t["new_type"].as_str()),
        (Some("file"), Some("dir"))
    );
    assert_eq!(kind("becomes-dir/child.txt"), "added");
    assert_eq!(kind("olddir"), "removed");
    assert_eq!(kind("olddir/inner.txt"), "removed");
    assert_eq!(kind("link"), "metadata");
    // A new symlink also has a new mtime.
    let link = change(&changes, &src.join("link"));
    assert!(
        link["metadata"]
            .as_array()
            .unwrap()
            .contains(&"link_target".into()),
        "{link}"
    );
    let listed = paths(&changes);
    for quiet in ["same.txt", "keep", "keep/deep/a.txt"] {
        let p = src.join(quiet).to_str().unwrap().to_string();
        assert!(!listed.contains(&p), "{quiet} did not change: {listed:?}");
    }
    assert_eq!(json_u64(&summary, "added"), 2, "{summary}"); // new.txt, child.txt
    assert_eq!(json_u64(&summary, "removed"), 3, "{summary}"); // gone, olddir, inner
    assert_eq!(json_u64(&summary, "modified"), 1, "{summary}");
    assert_eq!(json_u64(&summary, "type_changed"), 1, "{summary}");
    assert_eq!(json_u64(&summary, "metadata_only"), 3, "{summary}");
    // gone.txt (5) + olddir/inner.txt (6) + becomes-dir as a file (11).
    assert_eq!(json_u64(&summary, "bytes_removed"), 5 + 6 + 11, "{summary}");
    // new.txt (15) + child.txt (6) + content.txt grew by 2.
    assert_eq!(json_u64(&summary, "bytes_added"), 15 + 6 + 2, "{summary}");

    // The human form uses the letters restic users know.
    let out = env.cmd().args(["diff", &a, &b]).output().unwrap();
    assert_success(&out, "cairn diff");
    let text = stdout(&out);
    let line_of = |p: &str| {
        let full = src.join(p).to_str().unwrap().to_string();
        text.lines()
            .find(|l| l.split("  ").nth(1) == Some(full.as_str()))
            .unwrap_or_else(|| panic!("a line for {full} in:\n{text}"))
            .to_string()
    };
    assert!(line_of("content.txt").starts_with("M "), "{text}");
    assert!(line_of("mode.txt").starts_with("U "), "{text}");
    assert!(line_of("gone.txt").starts_with("- "), "{text}");
    assert!(line_of("new.txt").starts_with("+ "), "{text}");
    assert!(line_of("becomes-dir").starts_with("T "), "{text}");
    assert!(text.contains("2 added, 3 removed, 1 modified"), "{text}");

    // Reversed, additions become removals.
    let (back, _) = diff_json(&env, &[os(&b), os(&a)]);
    assert_eq!(change(&back, &src.join("new.txt"))["change"], "removed");
    assert_eq!(change(&back, &src.join("gone.txt"))["change"], "added");
}

#[test]
fn diff_of_unchanged_subtrees_reads_no_tree_below_them() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    for d in 0..20 {
        write_file(
            &src.join(format!("big/d{d}/f.txt")),
            format!("{d}\n").as_bytes(),
        );
    }
    write_file(&src.join("small.txt"), b"v1\n");
    let a = env.backup_id(&[&src], &[]);
    write_file(&src.join("small.txt"), b"v2 longer\n");
    let b = env.backup_id(&[&src], &[]);

    let (changes, summary) = diff_json(&env, &[os(&a), os(&b)]);
    assert_eq!(
        paths(&changes),
        vec![src.join("small.txt").to_str().unwrap()]
    );
    // Root, and the directories down to src on each side; `big` (21 trees) is skipped.
    let depth = src.components().count() as u64; // "/" counts as one
    assert_eq!(json_u64(&summary, "trees_read"), 2 * depth, "{summary}");
    assert_eq!(json_u64(&summary, "trees_skipped"), 1, "{summary}");

    let (same, summary) = diff_json(&env, &[os(&a), os(&a)]);
    assert!(same.is_empty(), "{same:?}");
    assert_eq!(json_u64(&summary, "trees_read"), 0, "{summary}");
}

#[test]
fn diff_restricted_to_a_path_shows_only_changes_below_it() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("sub/a.txt"), b"a\n");
    write_file(&src.join("other.txt"), b"o\n");
    let a = env.backup_id(&[&src], &[]);
    write_file(&src.join("sub/a.txt"), b"a changed\n");
    write_file(&src.join("other.txt"), b"o changed\n");
    write_file(&src.join("sub/b.txt"), b"b\n");
    let b = env.backup_id(&[&src], &[]);

    let sub = src.join("sub");
    let (changes, summary) = diff_json(&env, &[os(&a), os(&b), sub.as_os_str()]);
    let mut got = paths(&changes);
    got.sort();
    assert_eq!(
        got,
        vec![
            sub.join("a.txt").to_str().unwrap().to_string(),
            sub.join("b.txt").to_str().unwrap().to_string()
        ]
    );
    assert_eq!(json_u64(&summary, "added"), 1);
    // A single file works too.
    let (one, _) = diff_json(&env, &[os(&a), os(&b), src.join("other.txt").as_os_str()]);
    assert_eq!(paths(&one), vec![src.join("other.txt").to_str().unwrap()]);
}

#[test]
fn diff_against_a_live_directory_compares_size_and_mtime_without_reading() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("same.txt"), b"same\n");
    write_file(&src.join("grown.txt"), b"short\n");
    write_file(&src.join("sneaky.txt"), b"aaaa\n");
    write_file(&src.join("removed.txt"), b"bye\n");
    write_file(&src.join("sub/keep.txt"), b"keep\n");
    set_mtime(&src.join("sneaky.txt"), 1_600_000_000, 0);
    env.backup_id(&[&src], &[]);

    write_file(&src.join("grown.txt"), b"much longer now\n");
    // Same size, same mtime, other bytes: like backup, diff trusts the metadata.
    write_file(&src.join("sneaky.txt"), b"bbbb\n");
    set_mtime(&src.join("sneaky.txt"), 1_600_000_000, 0);
    fs::remove_file(src.join("removed.txt")).unwrap();
    write_file(&src.join("sub/added.txt"), b"hi\n");
    set_mode(&src.join("same.txt"), 0o600);

    let (changes, _) = diff_json(&env, &[os("latest"), src.as_os_str()]);
    let kind = |p: &str| change(&changes, &src.join(p))["change"].clone();
    assert_eq!(kind("grown.txt"), "modified");
    assert_eq!(kind("removed.txt"), "removed");
    assert_eq!(kind("sub/added.txt"), "added");
    assert_eq!(kind("same.txt"), "metadata");
    let listed = paths(&changes);
    assert!(
        !listed
            .iter()
            .any(|p| p.ends_with("sneaky.txt") || p.ends_with("keep.txt")),
        "{listed:?}"
    );

    // The live side first: the same changes, reversed.
    let (back, _) = diff_json(&env, &[src.as_os_str(), os("latest")]);
    assert_eq!(
        change(&back, &src.join("sub/added.txt"))["change"],
        "removed"
    );
    // A relative live path, with --content reading the live file.
    let out = env
        .cmd()
        .args(["diff", "--content", "latest", "./src"])
        .output()
        .unwrap();
    assert_success(&out, "cairn diff --content latest ./src");
    let text = stdout(&out);
    assert!(
        text.contains("-short\n") && text.contains("+much longer now\n"),
        "{text}"
    );
}

#[test]
fn diff_content_prints_a_unified_diff_of_text_and_skips_binaries() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    let lines: String = (1..=20).map(|i| format!("line {i}\n")).collect();
    write_file(&src.join("notes.txt"), lines.as_bytes());
    write_file(&src.join("blob.bin"), &random_bytes(3000, 1));
    let a = env.backup_id(&[&src], &[]);
    write_file(
        &src.join("notes.txt"),
        lines.replace("line 10\n", "line ten\n").as_bytes(),
    );
    write_file(&src.join("blob.bin"), &random_bytes(3000, 2));
    let b = env.backup_id(&[&src], &[]);

    let out = env
        .cmd()
        .args(["diff", "--content", &a, &b])
        .output()
        .unwrap();
    assert_success(&out, "cairn diff --content");
    let text = stdout(&out);
    let notes = src.join("notes.txt");
    assert!(
        text.contains(&format!("--- {}:{}", &a[..8], notes.display()))
            && text.contains(&format!("+++ {}:{}", &b[..8], notes.display())),
        "{text}"
    );
    assert!(text.contains("-line 10\n+line ten\n"), "{text}");
    assert!(
        text.contains(" line 7\n") && !text.contains(" line 1\n"),
        "3 lines of context: {text}"
    );
    assert!(text.contains("binary file; no content diff"), "{text}");

    let (changes, _) = diff_json(&env, &[os("--content"), os(&a), os(&b)]);
    let n = change(&changes, &notes);
    assert!(
        n["content_diff"].as_str().unwrap().contains("+line ten"),
        "{n}"
    );
    let bin = change(&changes, &src.join("blob.bin"));
    assert_eq!(bin["content_note"], "binary", "{bin}");
    assert!(bin["content_diff"].is_null(), "{bin}");
}

#[test]
fn diff_json_has_one_object_per_change_and_a_summary() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f.txt"), b"12345");
    let a = env.backup_id(&[&src], &[]);
    write_file(&src.join("f.txt"), b"1234567890");
    let b = env.backup_id(&[&src], &[]);
    let (changes, summary) = diff_json(&env, &[os(&a), os(&b)]);
    assert_eq!(changes.len(), 1, "{changes:?}");
    let c = &changes[0];
    assert_eq!(c["path"], src.join("f.txt").to_str().unwrap());
    assert_eq!(c["change"], "modified");
    assert_eq!(c["letter"], "M");
    assert_eq!(
        (json_u64(c, "old_size_bytes"), json_u64(c, "new_size_bytes")),
        (5, 10)
    );
    assert_eq!(
        (c["old_type"].as_str(), c["new_type"].as_str()),
        (Some("file"), Some("file"))
    );
    assert!(c["metadata"].is_array(), "{c}");
    for field in [
        "added",
        "removed",
        "modified",
        "metadata_only",
        "type_changed",
    ] {
        assert!(summary[field].is_u64(), "{field} in {summary}");
    }
    assert_eq!(json_u64(&summary, "bytes_added"), 5);
    assert_eq!(json_u64(&summary, "bytes_removed"), 0);
}

#[test]
fn diff_with_an_unknown_snapshot_lists_existing_ones() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f"), b"x");
    let a = env.backup_id(&[&src], &[]);
    let out = env
        .cmd()
        .args(["diff", "latest", "abcdef0123"])
        .output()
        .unwrap();
    assert_exit(&out, 1, "cairn diff with an unknown snapshot");
    let err = stderr(&out);
    assert!(err.contains("\"abcdef0123\""), "names the snapshot: {err}");
    assert!(err.contains(&a[..8]), "lists the existing one: {err}");
}

#[test]
fn diff_of_a_missing_path_suggests_the_closest_names() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("report.txt"), b"r");
    write_file(&src.join("zebra"), b"z");
    env.backup_id(&[&src], &[]);
    let wrong = src.join("reprot.txt");
    let out = env
        .cmd()
        .args(["diff", "latest", "latest"])
        .arg(&wrong)
        .output()
        .unwrap();
    assert_exit(&out, 1, "cairn diff with a missing path");
    let err = stderr(&out);
    assert!(
        err.contains(wrong.to_str().unwrap()),
        "names the path: {err}"
    );
    let suggestions = err
        .split("did you mean")
        .nth(1)
        .unwrap_or_else(|| panic!("{err}"));
    let first = src.join("report.txt");
    assert!(
        suggestions
            .trim_start()
            .starts_with(first.to_str().unwrap())
            && !suggestions.contains("zebra"),
        "report.txt is suggested, zebra is not: {err}"
    );
}

/// With a live directory, diff leaves out what backup would (`.cairnignore` always,
/// `--exclude`, `--exclude-caches`, `--exclude-larger-than` when given), so it shows what
/// the next backup with the same options would add.
#[test]
fn diff_against_a_live_directory_leaves_out_what_backup_would() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join(".cairnignore"), b"*.log\n");
    write_file(&src.join("kept.txt"), b"kept\n");
    let options = [
        "--exclude",
        "build/out",
        "--exclude-caches",
        "--exclude-larger-than",
        "1K",
    ];
    env.backup_id(&[&src], &options);

    write_file(&src.join("new.txt"), b"new\n");
    write_file(&src.join("debug.log"), b"ignored by .cairnignore\n");
    write_file(&src.join("build/out/a.o"), b"excluded by pattern\n");
    write_file(
        &src.join("cache/CACHEDIR.TAG"),
        b"Signature: 8a477f597d28d172789f06886806bc55\n",
    );
    write_file(&src.join("cache/blob"), b"in a tagged cache\n");
    write_file(&src.join("big.bin"), &[7u8; 2000]);

    let mut args = vec![os("latest"), src.as_os_str()];
    args.extend(options.iter().map(|o| os(o)));
    let (changes, _) = diff_json(&env, &args);
    let added: Vec<String> = paths(&changes);
    assert_eq!(
        added,
        [
            src.join("build").display().to_string(),
            src.join("new.txt").display().to_string()
        ],
        "only what the next backup stores (build/ itself is not excluded): {changes:?}"
    );

    // Without the options, only .cairnignore applies.
    let (changes, _) = diff_json(&env, &[os("latest"), src.as_os_str()]);
    let listed = paths(&changes);
    assert!(
        listed.iter().any(|p| p.ends_with("cache/blob")),
        "{listed:?}"
    );
    assert!(listed.iter().any(|p| p.ends_with("big.bin")), "{listed:?}");
    assert!(!listed.iter().any(|p| p.ends_with(".log")), "{listed:?}");
}

/// A change smaller than the rounding of both sizes is shown exactly, not as
/// `38.6 KiB → 38.6 KiB`.
#[test]
fn diff_shows_a_change_hidden_by_rounding_in_bytes() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f.bin"), &random_bytes(39_526, 1));
    write_file(&src.join("g.bin"), &random_bytes(39_526, 2));
    let a = env.backup_id(&[&src], &[]);
    write_file(&src.join("f.bin"), &random_bytes(39_534, 1));
    write_file(&src.join("g.bin"), &random_bytes(39_520, 2));
    let b = env.backup_id(&[&src], &[]);
    let out = env.cmd().args(["diff", &a, &b]).output().unwrap();
    assert_success(&out, "cairn diff");
    let text = stdout(&out);
    assert!(text.contains("(38.6 KiB → 38.6 KiB, +8 B;"), "{text}");
    assert!(text.contains("(38.6 KiB → 38.6 KiB, -6 B;"), "{text}");
}

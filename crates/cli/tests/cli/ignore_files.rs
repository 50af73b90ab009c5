//! `cairn backup` with `.cairnignore` files, `--git-ignore`, `--exclude-if-present`,
//! `--exclude-caches` and `--exclude-larger-than`: what is left out of the snapshot, what
//! is kept, the `excluded` count, and bad patterns.

use std::collections::BTreeSet;
use std::path::Path;

use crate::common::*;

/// Paths in the latest snapshot below `src`, relative to it, with a trailing `/` on dirs.
fn snapshot_paths(env: &TestEnv, src: &Path) -> BTreeSet<String> {
    let out = env
        .cmd()
        .args(["ls", "--json", "-R", "latest"])
        .output()
        .unwrap();
    assert_success(&out, "cairn ls --json latest");
    let v = parse_json(&out.stdout, "cairn ls --json");
    let prefix = format!("{}/", src.display());
    v["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("an array: {v}"))
        .iter()
        .filter_map(|e| {
            let p = e["path"].as_str()?.strip_prefix(&prefix)?.to_string();
            Some(if e["type"] == "dir" {
                format!("{p}/")
            } else {
                p
            })
        })
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn ignore_cairnignore_nested_with_negation_dir_only_and_double_star() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(
        &src.join(".cairnignore"),
        b"# comment\n*.log\n/top-only.txt\nbuild/\ndocs/**/draft.md\n",
    );
    write_file(&src.join("a.log"), b"ignored");
    write_file(&src.join("top-only.txt"), b"ignored at the top");
    write_file(&src.join("keep.txt"), b"kept");
    write_file(&src.join("build/out.o"), b"ignored with its dir");
    // `build` as a file is not a directory, so `build/` does not match it.
    write_file(&src.join("sub/build"), b"a file named build");
    write_file(
        &src.join("sub/top-only.txt"),
        b"kept: the pattern is anchored",
    );
    write_file(&src.join("docs/a/b/draft.md"), b"ignored");
    write_file(&src.join("docs/a/final.md"), b"kept");
    // A deeper file re-includes what the upper one ignores, and adds its own pattern.
    write_file(&src.join("sub/.cairnignore"), b"!important.log\n*.tmp\n");
    write_file(&src.join("sub/important.log"), b"re-included");
    write_file(&src.join("sub/other.log"), b"still ignored");
    write_file(&src.join("sub/x.tmp"), b"ignored below sub");
    write_file(
        &src.join("y.tmp"),
        b"kept: sub's pattern applies only below sub",
    );

    let s = env.backup(&[&src], &[]);
    assert_eq!(
        snapshot_paths(&env, &src),
        set(&[
            ".cairnignore",
            "keep.txt",
            "sub/",
            "sub/.cairnignore",
            "sub/build",
            "sub/important.log",
            "sub/top-only.txt",
            "docs/",
            "docs/a/",
            "docs/a/b/",
            "docs/a/final.md",
            "y.tmp",
        ])
    );
    // a.log, top-only.txt, build/, docs/a/b/draft.md, sub/other.log, sub/x.tmp
    assert_eq!(json_u64(&s, "excluded"), 6, "{s}");
}

#[test]
fn ignore_gitignore_is_honoured_only_with_git_ignore() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join(".gitignore"), b"target/\n*.bak\n");
    write_file(&src.join("target/debug/big"), b"build output");
    write_file(&src.join("notes.bak"), b"backup copy");
    write_file(&src.join("main.rs"), b"fn main() {}");

    env.backup(&[&src], &[]);
    let all = snapshot_paths(&env, &src);
    assert!(
        all.contains("target/debug/big") && all.contains("notes.bak"),
        "without --git-ignore, .gitignore is an ordinary file: {all:?}"
    );

    let s = env.backup(&[&src], &["--git-ignore"]);
    assert_eq!(snapshot_paths(&env, &src), set(&[".gitignore", "main.rs"]));
    assert_eq!(json_u64(&s, "excluded"), 2, "{s}");
}

#[test]
fn ignore_cairnignore_wins_over_gitignore_in_the_same_directory() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join(".gitignore"), b"*.env\n");
    write_file(&src.join(".cairnignore"), b"!prod.env\n");
    write_file(&src.join("prod.env"), b"back this up anyway");
    write_file(&src.join("dev.env"), b"ignored");
    env.backup(&[&src], &["--git-ignore"]);
    assert_eq!(
        snapshot_paths(&env, &src),
        set(&[".cairnignore", ".gitignore", "prod.env"])
    );
}

#[test]
fn ignore_exclude_if_present_skips_the_whole_directory() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("skip-me/.nobackup"), b"");
    write_file(&src.join("skip-me/deep/data"), b"not backed up");
    write_file(&src.join("other/.also"), b"");
    write_file(&src.join("other/data"), b"not backed up either");
    write_file(&src.join("keep/data"), b"backed up");
    let s = env.backup(
        &[&src],
        &[
            "--exclude-if-present",
            ".nobackup",
            "--exclude-if-present",
            ".also",
        ],
    );
    assert_eq!(snapshot_paths(&env, &src), set(&["keep/", "keep/data"]));
    assert_eq!(json_u64(&s, "excluded"), 2, "{s}");
}

#[test]
fn ignore_exclude_caches_needs_the_cachedir_signature() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(
        &src.join("real-cache/CACHEDIR.TAG"),
        b"Signature: 8a477f597d28d172789f06886806bc55\n# This file is a cache directory tag.\n",
    );
    write_file(&src.join("real-cache/blob"), b"cached");
    write_file(
        &src.join("fake-cache/CACHEDIR.TAG"),
        b"Signature: 00000000000000000000000000000000\n",
    );
    write_file(&src.join("fake-cache/blob"), b"not a cache after all");
    write_file(&src.join("plain.txt"), b"plain");

    env.backup(&[&src], &[]);
    assert!(
        snapshot_paths(&env, &src).contains("real-cache/blob"),
        "without --exclude-caches a tagged directory is backed up"
    );
    let s = env.backup(&[&src], &["--exclude-caches"]);
    assert_eq!(
        snapshot_paths(&env, &src),
        set(&[
            "fake-cache/",
            "fake-cache/CACHEDIR.TAG",
            "fake-cache/blob",
            "plain.txt"
        ])
    );
    assert_eq!(json_u64(&s, "excluded"), 1, "{s}");
}

#[test]
fn ignore_exclude_larger_than_leaves_out_big_files_but_not_directories() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("small.bin"), &random_bytes(1000, 1));
    write_file(&src.join("exact.bin"), &random_bytes(1024, 2));
    write_file(&src.join("big.bin"), &random_bytes(1025, 3));
    write_file(&src.join("dir/huge.bin"), &random_bytes(200_000, 4));
    let s = env.backup(&[&src], &["--exclude-larger-than", "1K"]);
    assert_eq!(
        snapshot_paths(&env, &src),
        set(&["dir/", "exact.bin", "small.bin"])
    );
    assert_eq!(json_u64(&s, "excluded"), 2, "{s}");
}

#[test]
fn ignore_excluded_count_is_in_the_human_summary() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join(".cairnignore"), b"*.o\n");
    write_file(&src.join("a.o"), b"");
    write_file(&src.join("b.o"), b"");
    write_file(&src.join("c.c"), b"");
    let out = env.cmd().arg("backup").arg(&src).output().unwrap();
    assert_success(&out, "cairn backup");
    assert!(stdout(&out).contains("Excluded: 2"), "{}", describe(&out));
}

#[test]
fn ignore_a_bad_pattern_names_file_line_and_pattern_and_makes_no_snapshot() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("sub/.cairnignore"), b"*.o\n\n[z-a].txt\n");
    write_file(&src.join("sub/f"), b"f");
    let out = env.cmd().arg("backup").arg(&src).output().unwrap();
    assert_exit(&out, 1, "backup with a bad .cairnignore");
    let err = stderr(&out);
    let file = src.join("sub/.cairnignore");
    assert!(
        err.contains(&file.display().to_string())
            && err.contains("line 3")
            && err.contains("[z-a].txt"),
        "the error names the file, the line and the pattern:\n{err}"
    );
    assert!(env.snapshots().is_empty(), "no snapshot is written");
}

#[test]
fn ignore_an_unreadable_ignore_file_is_reported_and_the_backup_is_partial() {
    if nix::unistd::geteuid().is_root() {
        // root reads a mode-000 file anyway; nothing to test.
        eprintln!("SKIPPED: running as root");
        return;
    }
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join(".cairnignore"), b"*.o\n");
    write_file(&src.join("a.o"), b"");
    set_mode(&src.join(".cairnignore"), 0o000);
    let out = env.cmd().arg("backup").arg(&src).output().unwrap();
    assert_exit(&out, 3, "backup with an unreadable .cairnignore");
    assert!(stderr(&out).contains(".cairnignore"), "{}", describe(&out));
}

/// r21.2: `--exclude py/test --exclude 'man/*/man1'` were anchored at `/` and silently
/// matched nothing; restic excludes both. A pattern that matches nothing is warned about.
#[test]
fn exclude_patterns_with_a_slash_match_the_end_of_the_path() {
    let env = TestEnv::with_repo();
    let src = env.path("data");
    write_file(&src.join("py/test/t.py"), b"t");
    write_file(&src.join("py/main.py"), b"m");
    write_file(&src.join("man/en/man1/ls.1"), b"l");
    write_file(&src.join("man/en/man5/fs.5"), b"f");
    write_file(&src.join("keep"), b"k");
    let list = env.path("excludes");
    std::fs::write(&list, "man/*/man1\n").unwrap();
    let out = env
        .cmd()
        .arg("backup")
        .arg(&src)
        .args(["--exclude", "py/test", "--exclude", "/nowhere/x"])
        .arg("--exclude-file")
        .arg(&list)
        .output()
        .unwrap();
    assert_success(&out, "backup with excludes");
    assert_eq!(
        snapshot_paths(&env, &src),
        set(&[
            "keep",
            "man/",
            "man/en/",
            "man/en/man5/",
            "man/en/man5/fs.5",
            "py/",
            "py/main.py"
        ])
    );
    let err = stderr(&out);
    assert!(
        err.contains("\"/nowhere/x\" matched nothing") && !err.contains("py/test\" matched"),
        "{err}"
    );
}

//! `cairn find`: entries by name or path glob and filters, across snapshots, reading each
//! shared tree once.

use std::path::Path;

use serde_json::Value;

use crate::common::*;

/// `cairn find --json ARGS...`, which must exit 0; returns (matches, stats).
fn find_json(env: &TestEnv, args: &[&str]) -> (Vec<Value>, Value) {
    let out = env
        .cmd()
        .args(["find", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert_success(&out, &format!("cairn find --json {args:?}"));
    let v = parse_json(&out.stdout, "cairn find --json");
    let matches = v["matches"]
        .as_array()
        .unwrap_or_else(|| panic!("matches is an array: {v}"))
        .clone();
    (matches, v["stats"].clone())
}

/// (short snapshot id, path) of each match, in order.
fn found(matches: &[Value]) -> Vec<(String, String)> {
    matches
        .iter()
        .map(|m| {
            (
                m["snapshot_short_id"].as_str().unwrap().to_string(),
                m["path"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn p(src: &Path, rel: &str) -> String {
    src.join(rel).to_str().unwrap().to_string()
}

#[test]
fn find_by_name_glob_searches_every_snapshot() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("a.txt"), b"a");
    write_file(&src.join("b.rs"), b"b");
    write_file(&src.join("sub/c.txt"), b"c");
    let one = env.backup_id(&[&src], &[]);
    write_file(&src.join("d.txt"), b"d");
    let two = env.backup_id(&[&src], &[]);

    let (matches, stats) = find_json(&env, &["*.txt"]);
    let (s1, s2) = (one[..8].to_string(), two[..8].to_string());
    let mut expected = vec![
        (s1.clone(), p(&src, "a.txt")),
        (s1.clone(), p(&src, "sub/c.txt")),
        (s2.clone(), p(&src, "a.txt")),
        (s2.clone(), p(&src, "d.txt")),
        (s2.clone(), p(&src, "sub/c.txt")),
    ];
    let mut got = found(&matches);
    // The two snapshots may share a second; compare as sets of (snapshot, path).
    got.sort();
    expected.sort();
    assert_eq!(got, expected);
    assert_eq!(json_u64(&stats, "snapshots"), 2, "{stats}");
    let m = &matches[0];
    assert_eq!(m["type"], "file", "{m}");
    assert_eq!(json_u64(m, "size_bytes"), 1, "{m}");
    assert!(
        m["mtime"].is_string() && m["snapshot_time"].is_string(),
        "{m}"
    );
    assert!(is_hex(m["snapshot_id"].as_str().unwrap(), 64), "{m}");

    // Several patterns: a match of any one counts.
    let (both, _) = find_json(&env, &["--snapshot", &one, "b.rs", "c.*"]);
    let mut got: Vec<String> = found(&both).into_iter().map(|(_, p)| p).collect();
    got.sort();
    assert_eq!(got, vec![p(&src, "b.rs"), p(&src, "sub/c.txt")]);

    // The human form: short id, snapshot time, path, size, mtime.
    let out = env.cmd().args(["find", "d.txt"]).output().unwrap();
    assert_success(&out, "cairn find d.txt");
    let text = stdout(&out);
    let line = text
        .lines()
        .next()
        .unwrap_or_else(|| panic!("a match: {text}"));
    assert!(line.starts_with(&s2), "{line}");
    assert!(
        line.contains(&format!("  {}  1  ", p(&src, "d.txt"))),
        "{line}"
    );
}

#[test]
fn find_with_a_slash_globs_the_full_path() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("sub/c.txt"), b"c");
    write_file(&src.join("c.txt"), b"c");
    write_file(&src.join("sub/deeper/c.txt"), b"c");
    env.backup_id(&[&src], &[]);

    let paths = |args: &[&str]| -> Vec<String> {
        let (m, _) = find_json(&env, args);
        found(&m).into_iter().map(|(_, p)| p).collect()
    };
    assert_eq!(paths(&["sub/*.txt"]), vec![p(&src, "sub/c.txt")]);
    assert_eq!(
        paths(&["sub/**/*.txt"]),
        vec![p(&src, "sub/c.txt"), p(&src, "sub/deeper/c.txt")]
    );
    let absolute = format!("{}/*.txt", src.display());
    assert_eq!(paths(&[&absolute]), vec![p(&src, "c.txt")]);
}

#[test]
fn find_filters_by_size_time_and_type() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("tiny"), &[1; 100]);
    write_file(&src.join("middle"), &[2; 5000]);
    write_file(&src.join("large"), &random_bytes(2 << 20, 3));
    write_file(&src.join("dir/inner"), b"x");
    std::os::unix::fs::symlink("tiny", src.join("link")).unwrap();
    set_mtime(&src.join("tiny"), 1_262_304_000, 0); // 2010-01-01
    set_mtime(&src.join("middle"), 1_577_836_800, 0); // 2020-01-01
    set_mtime(&src.join("large"), 1_735_689_600, 0); // 2025-01-01
    set_mtime(&src.join("dir/inner"), 1_735_689_600, 0);
    env.backup_id(&[&src], &[]);

    let names = |args: &[&str]| -> Vec<String> {
        let (m, _) = find_json(&env, args);
        let mut v: Vec<String> = found(&m)
            .into_iter()
            .map(|(_, p)| p.rsplit('/').next().unwrap().to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&["*", "--size", "+1M"]), vec!["large"]);
    assert_eq!(names(&["*", "--size", "-1K"]), vec!["inner", "tiny"]);
    assert_eq!(names(&["*", "--size", "=5000"]), vec!["middle"]);
    assert_eq!(
        names(&["*", "--size", "4K", "--type", "f"]),
        Vec::<String>::new()
    );
    // A day of margin either way keeps the test free of the local time zone.
    assert_eq!(
        names(&[
            "*",
            "--type",
            "f",
            "--newer",
            "2019-12-30",
            "--older",
            "2020-01-03"
        ]),
        vec!["middle"]
    );
    assert_eq!(
        names(&["*", "--type", "f", "--older", "2015-06-01T12:00:00"]),
        vec!["tiny"]
    );
    assert_eq!(
        names(&["*", "--type", "f", "--newer", "3650d"]),
        vec!["inner", "large", "middle"]
    );
    assert_eq!(names(&["d*", "--type", "d"]), vec!["dir"]);
    assert_eq!(names(&["*", "-t", "l"]), vec!["link"]);
}

#[test]
fn find_with_snapshot_searches_only_those() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    let f = src.join("f.txt");
    let mut ids = Vec::new();
    for i in 0..3 {
        write_file(&f, format!("version {i}\n").as_bytes());
        set_mtime(&f, 1_600_000_000 + i, 0);
        ids.push(env.backup_id(&[&src], &[]));
    }
    let shorts = |args: &[&str]| -> Vec<String> {
        let (m, _) = find_json(&env, args);
        let mut v: Vec<String> = found(&m).into_iter().map(|(s, _)| s).collect();
        v.sort();
        v
    };
    assert_eq!(
        shorts(&["f.txt", "--snapshot", &ids[1]]),
        vec![ids[1][..8].to_string()]
    );
    let mut two = vec![ids[0][..8].to_string(), ids[2][..8].to_string()];
    two.sort();
    assert_eq!(shorts(&["f.txt", "-s", &ids[0][..10], "-s", "latest"]), two);
    assert_eq!(shorts(&["f.txt"]).len(), 3);
}

#[test]
fn find_reads_a_tree_shared_by_many_snapshots_once() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    for d in 0..10 {
        write_file(&src.join(format!("d{d}/file.txt")), b"same");
    }
    let ids: Vec<String> = (0..5).map(|_| env.backup_id(&[&src], &[])).collect();
    let (one, one_stats) = find_json(&env, &["file.txt", "--snapshot", &ids[0]]);
    let mut args = vec!["file.txt"];
    for id in &ids {
        args.extend(["--snapshot", id.as_str()]);
    }
    let (all, all_stats) = find_json(&env, &args);
    assert_eq!(one.len(), 10);
    assert_eq!(all.len(), 50, "every snapshot reports its matches");
    assert_eq!(json_u64(&all_stats, "snapshots"), 5);
    let one_reads = json_u64(&one_stats, "trees_read");
    assert!(
        one_reads >= 11,
        "src and its ten directories at least: {one_stats}"
    );
    // The directories above the source (/, /tmp, the tempdir) change between backups
    // when other programs touch /tmp, so each later snapshot may add those few trees;
    // everything from the source down is read once for all five snapshots.
    let above = src.ancestors().count() as u64 - 1;
    let all_reads = json_u64(&all_stats, "trees_read");
    assert!(
        all_reads <= one_reads + 4 * above,
        "one: {one_stats}, all: {all_stats}"
    );
    assert!(json_u64(&all_stats, "trees_reused") >= 4, "{all_stats}");

    // A path pattern remembers trees by place as well, and still reads each once.
    args[0] = "d*/file.txt";
    let (by_path, path_stats) = find_json(&env, &args);
    assert_eq!(by_path.len(), 50);
    assert!(
        json_u64(&path_stats, "trees_read") <= one_reads + 4 * above,
        "{path_stats}"
    );
}

#[test]
fn find_with_a_pattern_that_does_not_parse_names_it() {
    let env = TestEnv::with_repo();
    let out = env.cmd().args(["find", "ok", "a[b"]).output().unwrap();
    assert_exit(&out, 1, "cairn find with a bad pattern");
    let err = stderr(&out);
    assert!(
        err.contains("\"a[b\"") && err.contains("does not parse"),
        "{err}"
    );
}

#[test]
fn find_with_an_unknown_snapshot_lists_existing_ones() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f"), b"x");
    let id = env.backup_id(&[&src], &[]);
    let out = env
        .cmd()
        .args(["find", "f", "--snapshot", "0000000"])
        .output()
        .unwrap();
    assert_exit(&out, 1, "cairn find --snapshot with an unknown id");
    let err = stderr(&out);
    assert!(
        err.contains("\"0000000\"") && err.contains(&id[..8]),
        "{err}"
    );
}

#[test]
fn find_rejects_bad_filters_before_opening_the_repository() {
    let env = TestEnv::new(); // no repository at all
    for args in [
        &["find", "x", "--size", "+1X"][..],
        &["find", "x", "--newer", "yesterday"],
        &["find", "x", "--type", "q"],
    ] {
        let out = env.cmd().args(args).output().unwrap();
        assert_exit(&out, 2, &format!("cairn {args:?}"));
        assert!(
            !stderr(&out).contains("not a cairn repository"),
            "{}",
            stderr(&out)
        );
    }
}

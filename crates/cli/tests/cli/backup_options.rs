//! `cairn backup`'s everyday options beyond the basics: `--dry-run`, `-v`/`-vv`,
//! `--files-from*`, `--iexclude*`, `--time` and `--stdin-from-command`.

use std::fs;
use std::path::PathBuf;

use crate::common::*;

/// src/a.txt, src/b.bin (300 KB random), src/sub/c.txt.
fn small_tree(env: &TestEnv) -> PathBuf {
    let src = env.path("src");
    write_file(&src.join("a.txt"), b"alpha\n");
    write_file(&src.join("b.bin"), &random_bytes(300_000, 3));
    write_file(&src.join("sub/c.txt"), b"charlie\n");
    src
}

/// `cairn backup ARGS...`, which must exit 0; its stdout.
fn backup_out(env: &TestEnv, args: &[&str]) -> String {
    let out = env.cmd().arg("backup").args(args).output().unwrap();
    assert_success(&out, &format!("cairn backup {args:?}"));
    stdout(&out)
}

#[test]
fn dry_run_writes_nothing_and_says_what_a_backup_would_add() {
    let env = TestEnv::with_repo();
    let src = small_tree(&env);
    let s = src.to_str().unwrap();
    let before = env.repo_files("");

    let out = env
        .cmd()
        .args(["backup", "--dry-run", "--json", s])
        .output()
        .unwrap();
    assert_success(&out, "backup --dry-run --json");
    let v = parse_json(&out.stdout, "backup --dry-run --json");
    assert_eq!(v["dry_run"], true, "{v}");
    assert!(v["snapshot_id"].is_null(), "no snapshot: {v}");
    assert_eq!(json_u64(&v, "files_new"), 3, "{v}");
    assert!(
        json_u64(&v, "bytes_added") > 300_000,
        "it says what it would add: {v}"
    );
    assert_eq!(
        env.repo_files(""),
        before,
        "no pack, index, snapshot or session file was left behind"
    );

    // Against a real parent: one file changed, one new, one unchanged.
    env.backup(&[&src], &[]);
    write_file(&src.join("a.txt"), b"alpha, longer now\n");
    write_file(&src.join("sub/d.txt"), b"delta\n");
    let before = env.repo_files("");
    let text = backup_out(&env, &["-n", "-vv", s]);
    assert!(text.contains(&format!("changed   {}/a.txt", s)), "{text}");
    assert!(
        text.contains(&format!("new       {}/sub/d.txt", s)),
        "{text}"
    );
    assert!(text.contains(&format!("unchanged {}/b.bin", s)), "{text}");
    assert!(text.contains("nothing was written"), "{text}");
    assert_eq!(
        env.repo_files(""),
        before,
        "the second dry run wrote nothing"
    );
    assert_eq!(env.snapshots().len(), 1);
}

#[test]
fn verbose_lists_new_and_changed_files_and_vv_also_unchanged_ones() {
    let env = TestEnv::with_repo();
    let src = small_tree(&env);
    let s = src.to_str().unwrap();
    let first = backup_out(&env, &["-v", s]);
    for name in ["a.txt", "b.bin", "sub/c.txt"] {
        assert!(first.contains(&format!("new       {s}/{name}")), "{first}");
    }
    write_file(&src.join("sub/c.txt"), b"charlie again\n");
    let second = backup_out(&env, &["-v", s]);
    assert!(
        second.contains(&format!("changed   {s}/sub/c.txt")),
        "{second}"
    );
    assert!(
        !second.contains("unchanged "),
        "-v leaves unchanged files out: {second}"
    );
    assert!(!second.contains("b.bin"), "{second}");

    let out = env
        .cmd()
        .args(["backup", "--json", "-vv", s])
        .output()
        .unwrap();
    assert_success(&out, "backup --json -vv");
    let v = parse_json(&out.stdout, "backup --json -vv");
    let entries = v["entries"].as_array().expect("entries with --json -v");
    assert_eq!(entries.len(), 3, "{v}");
    assert!(entries
        .iter()
        .all(|e| e["action"] == "unchanged" && e["path"].as_str().unwrap().starts_with(s)));
}

#[test]
fn vv_names_each_excluded_path_and_what_excluded_it() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("keep.txt"), b"keep\n");
    write_file(&src.join("obj.o"), b"object\n");
    write_file(&src.join(".cairnignore"), b"*.log\n");
    write_file(&src.join("run.log"), b"log\n");
    write_file(&src.join("big.bin"), &vec![7u8; 5000]);
    let mut tag = b"Signature: 8a477f597d28d172789f06886806bc55".to_vec();
    tag.push(b'\n');
    write_file(&src.join("cache/CACHEDIR.TAG"), &tag);
    write_file(&src.join("cache/blob"), b"cached\n");
    let s = src.to_str().unwrap();
    let text = backup_out(
        &env,
        &[
            "-vv",
            "--exclude",
            "*.o",
            "--exclude-caches",
            "--exclude-larger-than",
            "4K",
            s,
        ],
    );
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with("excluded") && l.contains(&format!("{s}/{name}")))
            .unwrap_or_else(|| panic!("no excluded line for {name}: {text}"))
            .to_string()
    };
    assert!(line("obj.o").contains("pattern \"*.o\""), "{text}");
    assert!(
        line("run.log").contains(&format!("\"*.log\" in {s}/.cairnignore")),
        "{text}"
    );
    assert!(line("cache").contains("CACHEDIR.TAG"), "{text}");
    assert!(line("big.bin").contains("5000 bytes"), "{text}");
    assert!(
        !text.contains("cache/blob"),
        "an excluded directory is one line: {text}"
    );
    assert!(text.contains(&format!("new       {s}/keep.txt")), "{text}");
}

/// The paths of the only snapshot.
fn snapshot_paths(env: &TestEnv) -> Vec<String> {
    let snaps = env.snapshots();
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    let paths = snaps[0]["paths"].as_array().expect("paths");
    paths
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn files_from_lists_add_paths_in_each_format() {
    let env = TestEnv::with_repo();
    let d = env.path("src");
    for name in ["a", "b", " spaced", "# hashed", "new\nline", "given"] {
        write_file(&d.join(name), name.as_bytes());
    }
    let p = |name: &str| d.join(name).to_str().unwrap().to_string();
    let lines = env.path("lines.txt");
    fs::write(
        &lines,
        format!("# a comment\n\n  {}  \n{}\n", p("a"), p("b")),
    )
    .unwrap();
    let verbatim = env.path("verbatim.txt");
    fs::write(&verbatim, format!("{}\n{}\n", p(" spaced"), p("# hashed"))).unwrap();
    let raw = env.path("raw.bin");
    fs::write(&raw, format!("{}\0", p("new\nline"))).unwrap();
    let out = env
        .cmd()
        .arg("backup")
        .arg(p("given"))
        .arg("--files-from")
        .arg(&lines)
        .arg("--files-from-verbatim")
        .arg(&verbatim)
        .arg("--files-from-raw")
        .arg(&raw)
        .output()
        .unwrap();
    assert_success(&out, "backup --files-from*");
    let mut got = snapshot_paths(&env);
    got.sort();
    let mut want: Vec<String> = ["a", "b", " spaced", "# hashed", "new\nline", "given"]
        .iter()
        .map(|n| p(n))
        .collect();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn a_listed_path_that_does_not_exist_is_an_error_naming_it() {
    let env = TestEnv::with_repo();
    write_file(&env.path("src/here"), b"x");
    let list = env.path("list.txt");
    let missing = env.path("src/not-here");
    fs::write(
        &list,
        format!(
            "{}\n{}\n",
            env.path("src/here").display(),
            missing.display()
        ),
    )
    .unwrap();
    let out = env
        .cmd()
        .arg("backup")
        .arg("--files-from")
        .arg(&list)
        .output()
        .unwrap();
    assert_exit(&out, 1, "backup --files-from with a missing path");
    let err = stderr(&out);
    assert!(
        err.contains(&missing.display().to_string()) && err.contains("line 2"),
        "{err}"
    );
    assert!(env.snapshots().is_empty(), "no snapshot");
}

#[test]
fn iexclude_leaves_out_names_whatever_their_case() {
    let env = TestEnv::with_repo();
    let d = env.path("src");
    for name in [
        "keep.txt",
        "photo.jpg",
        "PHOTO2.JPG",
        "Thumbs.db",
        "sub/TMP/x",
    ] {
        write_file(&d.join(name), b"x");
    }
    let list = env.path("iexcludes");
    fs::write(&list, "# case does not matter here\nthumbs.DB\n").unwrap();
    let s = d.to_str().unwrap();
    let out = backup_out(
        &env,
        &[
            "-vv",
            "--iexclude",
            "*.JPG",
            "--iexclude",
            "sub/tmp",
            "--iexclude-file",
            list.to_str().unwrap(),
            s,
        ],
    );
    for gone in ["photo.jpg", "PHOTO2.JPG", "Thumbs.db", "sub/TMP"] {
        assert!(
            out.contains(&format!("excluded  {s}/{gone}")),
            "{gone}: {out}"
        );
    }
    assert!(out.contains(&format!("new       {s}/keep.txt")), "{out}");
    // The case-sensitive --exclude stays so.
    let out = backup_out(&env, &["-vv", "--exclude", "*.JPG", s]);
    assert!(
        out.contains(&format!("new       {s}/photo.jpg")),
        "case-sensitive: {out}"
    );
    assert!(out.contains(&format!("excluded  {s}/PHOTO2.JPG")), "{out}");
}

#[test]
fn time_sets_the_snapshots_time() {
    let env = TestEnv::with_repo();
    write_file(&env.path("src/f"), b"x");
    let src = env.path("src");
    env.backup(&[&src], &["--time", "2021-02-03T04:05:06Z"]);
    let t = env.snapshots()[0]["time"].as_str().unwrap().to_string();
    assert!(t.starts_with("2021-02-03T04:05:06"), "{t}");

    env.backup(&[&src], &["--time", "2019-12-31 23:59:58"]);
    let times: Vec<String> = env
        .snapshots()
        .iter()
        .map(|s| s["time"].as_str().unwrap().to_string())
        .collect();
    assert!(
        times
            .iter()
            .any(|t| t.starts_with("2019-12-31") || t.starts_with("2020-01-01")),
        "local time, any zone: {times:?}"
    );
    let out = env
        .cmd()
        .args(["backup", "--time", "yesterday"])
        .arg(&src)
        .output()
        .unwrap();
    assert_exit(&out, 2, "a time that does not parse is a usage error");
    assert!(stderr(&out).contains("yesterday"), "{}", stderr(&out));
}

/// `cairn backup --stdin-from-command --stdin-filename NAME -- ARGV...`.
fn from_command(env: &TestEnv, name: &str, argv: &[&str]) -> std::process::Output {
    let mut cmd = env.cmd();
    cmd.args([
        "backup",
        "--stdin-from-command",
        "--stdin-filename",
        name,
        "--",
    ]);
    cmd.args(argv).output().unwrap()
}

#[test]
fn stdin_from_command_stores_the_output_and_a_failure_writes_no_snapshot() {
    let env = TestEnv::with_repo();
    let out = from_command(
        &env,
        "db.sql",
        &["sh", "-c", "echo CREATE TABLE t; echo INSERT 1"],
    );
    assert_success(&out, "backup --stdin-from-command");
    assert_eq!(snapshot_paths(&env), ["/db.sql"]);
    let cat = env
        .cmd()
        .args(["cat", "latest", "/db.sql"])
        .output()
        .unwrap();
    assert_success(&cat, "cat /db.sql");
    assert_eq!(cat.stdout, b"CREATE TABLE t\nINSERT 1\n");

    let out = from_command(&env, "db.sql", &["sh", "-c", "echo half a dump; exit 3"]);
    assert_exit(&out, 1, "a failing command");
    let err = stderr(&out);
    assert!(
        err.contains("db.sql") && err.contains("exit status: 3"),
        "{err}"
    );
    assert_eq!(env.snapshots().len(), 1, "no second snapshot");

    let out = from_command(&env, "x", &["/nonexistent/program"]);
    assert_exit(&out, 1, "a command that cannot start");
    assert!(
        stderr(&out).contains("could not be started"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_dry_run_does_not_create_the_default_repository() {
    let env = TestEnv::new();
    let src = small_tree(&env);
    let out = unconfigured(&env)
        .args(["backup", "--dry-run"])
        .arg(&src)
        .output()
        .unwrap();
    assert_exit(&out, 1, "backup --dry-run without a repository");
    assert!(
        stderr(&out).contains("does not exist yet"),
        "{}",
        stderr(&out)
    );
    assert!(!default_repo(&env).exists(), "nothing was created");
}

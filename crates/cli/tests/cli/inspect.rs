//! Looking into a repository: `snapshots`, `ls`, `cat`, and how SNAPSHOT arguments
//! (full id, prefix, `latest`) are resolved.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::common::*;

/// src/a.txt (mode 0640, 12345 bytes, mtime 2021-06-15), src/sub/c.txt, a symlink and a FIFO.
fn small_tree(env: &TestEnv) -> PathBuf {
    let src = env.path("src");
    write_file(&src.join("a.txt"), &compressible_bytes(12345, 1));
    set_mode(&src.join("a.txt"), 0o640);
    set_mtime(&src.join("a.txt"), 1_623_758_400, 0); // 2021-06-15T12:00:00Z
    write_file(&src.join("sub/c.txt"), b"charlie\n");
    std::os::unix::fs::symlink("a.txt", src.join("link")).unwrap();
    mkfifo(&src.join("pipe"));
    src
}

#[test]
fn snapshots_json_describes_each_snapshot() {
    let env = TestEnv::with_repo();
    let src = small_tree(&env);
    let before = jiff::Timestamp::now();
    let id = env.backup_id(&[&src], &["--tag", "t1"]);
    let after = jiff::Timestamp::now();

    let snaps = env.snapshots();
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    let s = &snaps[0];
    assert_eq!(s["id"], id.as_str(), "{s}");
    assert!(is_hex(&id, 64), "{s}");
    assert_eq!(s["short_id"], &id[..8], "{s}");
    let time: jiff::Timestamp = s["time"]
        .as_str()
        .unwrap_or_else(|| panic!("time string in {s}"))
        .parse()
        .unwrap_or_else(|e| panic!("time is RFC 3339 ({e}): {s}"));
    let slack = jiff::SignedDuration::from_secs(2);
    assert!(
        time >= before - slack && time <= after + slack,
        "time {time} lies between {before} and {after}"
    );
    assert!(s["host"].as_str().is_some_and(|h| !h.is_empty()), "{s}");
    // The account that ran the backup, though the tests run cairn without $USER.
    let me = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let me = String::from_utf8_lossy(&me.stdout).trim().to_string();
    assert!(!me.is_empty());
    assert_eq!(s["username"], me.as_str(), "{s}");
    assert_eq!(s["tags"], serde_json::json!(["t1"]), "{s}");
    assert_eq!(
        s["paths"],
        serde_json::json!([src.to_str().unwrap()]),
        "{s}"
    );
    assert!(!s["tree_id"].is_null(), "tree field present: {s}");
}

#[test]
fn snapshots_table_lists_every_snapshot_by_short_id() {
    let env = TestEnv::with_repo();
    let src = small_tree(&env);
    let a = env.backup_id(&[&src], &[]);
    let b = env.backup_id(&[&src], &[]);
    assert_ne!(a, b, "two backups make two snapshots");
    let out = env.cmd().arg("snapshots").output().unwrap();
    assert_success(&out, "cairn snapshots");
    let text = stdout(&out);
    assert!(text.contains(&a[..8]) && text.contains(&b[..8]), "{text}");
    assert!(
        text.contains(src.to_str().unwrap()),
        "the table shows the path: {text}"
    );
}

#[test]
fn snapshots_of_an_empty_repository_is_an_empty_array() {
    let env = TestEnv::with_repo();
    assert!(env.snapshots().is_empty());
}

fn cat(env: &TestEnv, snapshot: &str, path: &Path) -> std::process::Output {
    env.cmd()
        .arg("cat")
        .arg(snapshot)
        .arg(path)
        .output()
        .unwrap()
}

#[test]
fn latest_a_full_id_and_a_unique_prefix_each_select_the_right_snapshot() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    let f = src.join("f.txt");
    write_file(&f, b"first\n");
    let first = env.backup_id(&[&src], &[]);
    write_file(&f, b"second version\n");
    let second = env.backup_id(&[&src], &[]);

    let check = |snapshot: &str, expected: &[u8]| {
        let out = cat(&env, snapshot, &f);
        assert_success(&out, &format!("cairn cat {snapshot}"));
        assert_eq!(out.stdout, expected, "cat {snapshot} {}", f.display());
    };
    check("latest", b"second version\n");
    check(&first, b"first\n");
    check(&second, b"second version\n");
    check(&first[..8], b"first\n");
    // The shortest prefix that tells the two apart.
    let common = first
        .bytes()
        .zip(second.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    check(&first[..common + 1], b"first\n");
    check(&second[..common + 1], b"second version\n");
}

#[test]
fn a_prefix_shared_by_two_snapshots_is_refused_as_ambiguous() {
    // With 17 snapshots, two must share their first hex digit.
    let env = TestEnv::with_repo();
    let src = env.path("src");
    let f = src.join("f.txt");
    let mut ids = Vec::new();
    for i in 0..17 {
        write_file(&f, format!("version {i}\n").as_bytes());
        set_mtime(&f, 1_600_000_000 + i, 0);
        ids.push(env.backup_id(&[&src], &[]));
    }
    let digit = (0..16)
        .map(|d| format!("{d:x}"))
        .find(|d| ids.iter().filter(|id| id.starts_with(d.as_str())).count() >= 2)
        .expect("pigeonhole: a shared first digit");
    let out = cat(&env, &digit, &f);
    assert_exit(&out, 1, &format!("cairn cat {digit} (ambiguous)"));
    assert!(
        stderr(&out).to_lowercase().contains("ambiguous"),
        "{}",
        stderr(&out)
    );
    assert!(
        out.stdout.is_empty(),
        "no contents for an ambiguous snapshot"
    );
}

fn ls_lines(env: &TestEnv, args: &[&str]) -> Vec<String> {
    let out = env.cmd().arg("ls").args(args).output().unwrap();
    assert_success(&out, &format!("cairn ls {args:?}"));
    stdout(&out).lines().map(str::to_string).collect()
}

#[test]
fn ls_prints_every_path_of_the_snapshot_as_an_absolute_path() {
    let env = TestEnv::with_repo();
    let src = small_tree(&env);
    env.backup(&[&src], &[]);
    let lines: BTreeSet<String> = ls_lines(&env, &["-R", "latest"]).into_iter().collect();
    let s = src.to_str().unwrap();
    for rel in ["a.txt", "sub", "sub/c.txt", "link", "pipe"] {
        let p = format!("{s}/{rel}");
        assert!(lines.contains(&p), "ls lists {p}: {lines:#?}");
    }
    for line in &lines {
        let allowed = line.starts_with(&format!("{s}/"))
            || line == s
            || s.starts_with(&format!("{line}/"))
            || line == "/";
        assert!(
            allowed,
            "ls prints only the source, its parents and its contents, not {line:?}"
        );
    }
}

#[test]
fn ls_with_a_path_lists_only_that_subtree() {
    let env = TestEnv::with_repo();
    let src = small_tree(&env);
    env.backup(&[&src], &[]);
    let sub = format!("{}/sub", src.display());
    let lines = ls_lines(&env, &["latest", &sub, "--recursive"]);
    assert!(lines.contains(&format!("{sub}/c.txt")), "{lines:#?}");
    for line in &lines {
        assert!(line.starts_with(&sub), "{line:?} lies outside {sub}");
    }
}

#[test]
fn ls_long_shows_mode_owner_size_and_mtime() {
    let env = TestEnv::with_repo();
    let src = small_tree(&env);
    env.backup(&[&src], &[]);
    let lines = ls_lines(&env, &["-l", "-R", "latest"]);
    let a = format!("{}/a.txt", src.display());
    let line = lines
        .iter()
        .find(|l| l.ends_with(&a))
        .unwrap_or_else(|| panic!("a line for {a}: {lines:#?}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert!(fields.contains(&"12345"), "size 12345 in {line:?}");
    assert!(
        line.contains("rw-r-----") || line.contains("640"),
        "mode 0640 in {line:?}"
    );
    let owner_is_root = line.contains("root")
        || fields
            .iter()
            .any(|f| f.split([':', '/']).all(|part| part == "0"));
    assert!(owner_is_root, "owner root (or uid 0) in {line:?}");
    assert!(line.contains("2021"), "mtime in 2021 in {line:?}");
}

#[test]
fn ls_json_gives_path_type_and_size() {
    let env = TestEnv::with_repo();
    let src = small_tree(&env);
    env.backup(&[&src], &[]);
    let out = env
        .cmd()
        .args(["ls", "--json", "-R", "latest"])
        .output()
        .unwrap();
    assert_success(&out, "cairn ls --json");
    let v = parse_json(&out.stdout, "cairn ls --json");
    let entries = v["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("an array: {v}"));
    let find = |rel: &str| {
        let p = format!("{}/{rel}", src.display());
        entries
            .iter()
            .find(|e| e["path"] == p.as_str())
            .unwrap_or_else(|| panic!("an entry for {p} in {v}"))
            .clone()
    };
    assert_eq!(find("a.txt")["type"], "file");
    assert_eq!(find("a.txt")["size_bytes"], 12345);
    assert_eq!(find("sub/c.txt")["size_bytes"], 8);
    assert_eq!(find("sub")["type"], "dir");
    assert_eq!(find("link")["type"], "symlink");
    assert_eq!(find("pipe")["type"], "fifo");
}

#[test]
fn cat_prints_a_multi_chunk_file_byte_for_byte() {
    let env = TestEnv::with_small_chunk_repo();
    let src = env.path("src");
    let data = random_bytes(2_500_000, 21);
    write_file(&src.join("big.bin"), &data);
    write_file(&src.join("empty"), b"");
    env.backup(&[&src], &[]);

    let out = cat(&env, "latest", &src.join("big.bin"));
    assert_success(&out, "cairn cat big.bin");
    assert!(
        out.stdout == data,
        "cat output equals the file ({} bytes vs {})",
        out.stdout.len(),
        data.len()
    );
    let out = cat(&env, "latest", &src.join("empty"));
    assert_success(&out, "cairn cat empty");
    assert!(out.stdout.is_empty());
}

/// Runs `cairn -r REPO ARGS...`, reads `n` bytes of its stdout, closes the pipe and
/// waits; returns the bytes read and the exit status with stderr.
fn read_then_close_pipe(
    env: &TestEnv,
    args: &[&OsStr],
    n: usize,
) -> (Vec<u8>, std::process::Output) {
    let mut cmd = detached(cairn_bin());
    cmd.arg("-r")
        .arg(&env.repo)
        .args(args)
        .env("CAIRN_PASSWORD", PASSWORD)
        .env("HOME", env.root.join("home"))
        .env("XDG_DATA_HOME", env.root.join("data"))
        .env("XDG_CONFIG_HOME", env.root.join("config"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut head = vec![0u8; n];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    drop(child.stdout.take());
    (head, child.wait_with_output().unwrap())
}

#[test]
fn cat_into_a_pipe_closed_early_exits_successfully() {
    // `cairn cat ... | head` must not report the broken pipe as a failure.
    let env = TestEnv::with_small_chunk_repo();
    let src = env.path("src");
    write_file(&src.join("big.bin"), &random_bytes(8_000_000, 3));
    env.backup(&[&src], &[]);
    let file = src.join("big.bin");
    let (head, out) = read_then_close_pipe(
        &env,
        &["cat".as_ref(), "latest".as_ref(), file.as_os_str()],
        100,
    );
    assert!(out.status.success(), "cat | head: {}", describe(&out));
    assert_eq!(head, random_bytes(100, 3));
}

#[test]
fn ls_into_a_pipe_closed_early_exits_successfully() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    for i in 0..3000 {
        write_file(&src.join(format!("file-{i:05}")), b"x");
    }
    env.backup(&[&src], &[]);
    for args in [
        &["ls", "-R", "latest"][..],
        &["ls", "-l", "-R", "latest"],
        &["ls", "--json", "-R", "latest"],
    ] {
        let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        let (_, out) = read_then_close_pipe(&env, &args, 10);
        assert!(
            out.status.success(),
            "cairn {args:?} | head -c 10: {}",
            describe(&out)
        );
    }
}

#[test]
fn cat_ls_and_restore_accept_paths_that_are_not_utf8() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    let odd_dir = src.join(non_utf8_name());
    write_file(&odd_dir.join(non_utf8_name()), b"odd name\n");
    env.backup(&[&src], &[]);
    let odd_file = odd_dir.join(non_utf8_name());

    let out = cat(&env, "latest", &odd_file);
    assert_success(&out, "cairn cat of a non-UTF-8 path");
    assert_eq!(out.stdout, b"odd name\n");

    let out = env
        .cmd()
        .args(["ls", "latest"])
        .arg(&odd_dir)
        .output()
        .unwrap();
    assert_success(&out, "cairn ls of a non-UTF-8 path");
    // Listed with the bytes that are not UTF-8 escaped (see `escapes.rs`).
    let shown = odd_file
        .to_str()
        .map(str::to_string)
        .unwrap_or_else(|| odd_file.as_os_str().as_bytes().escape_ascii().to_string());
    assert!(
        stdout(&out).lines().any(|l| l == shown),
        "{shown} in {}",
        stdout(&out)
    );

    let mut spec = std::ffi::OsString::from("latest:");
    spec.push(&odd_dir);
    let target = env.path("restored");
    let out = env
        .cmd()
        .arg("restore")
        .arg(&spec)
        .arg("--target")
        .arg(&target)
        .output()
        .unwrap();
    assert_success(&out, "cairn restore latest:NON-UTF-8-DIR");
    assert_eq!(
        fs::read(target.join(non_utf8_name())).unwrap(),
        b"odd name\n"
    );
}

#[test]
fn cat_of_a_directory_fails() {
    let env = TestEnv::with_repo();
    let src = small_tree(&env);
    env.backup(&[&src], &[]);
    let out = cat(&env, "latest", &src.join("sub"));
    assert_exit(&out, 1, "cairn cat of a directory");
    assert!(out.stdout.is_empty(), "nothing on stdout: {}", stdout(&out));
}

#[test]
fn cat_of_a_path_not_in_the_snapshot_fails_and_names_it() {
    let env = TestEnv::with_repo();
    let src = small_tree(&env);
    env.backup(&[&src], &[]);
    let missing = src.join("no-such-file.txt");
    let out = cat(&env, "latest", &missing);
    assert_exit(&out, 1, "cairn cat of a missing path");
    assert!(
        stderr(&out).contains("no-such-file.txt"),
        "{}",
        stderr(&out)
    );
    // A file that exists on disk but was created after the backup is not in it either.
    write_file(&missing, b"too late");
    assert_exit(
        &cat(&env, "latest", &missing),
        1,
        "cairn cat of a file newer than the snapshot",
    );
    let _ = fs::remove_file(&missing);
}

/// r21.12: `ls` was always recursive (25,253 lines for one directory); like ls(1) it
/// lists one level, and `--recursive` everything below.
#[test]
fn ls_lists_one_level_unless_recursive() {
    let env = TestEnv::with_repo();
    let src = small_tree(&env);
    env.backup(&[&src], &[]);
    let s = src.display().to_string();
    let mut lines = ls_lines(&env, &["latest", &s]);
    lines.sort();
    let want: Vec<String> = ["a.txt", "link", "pipe", "sub"]
        .iter()
        .map(|n| format!("{s}/{n}"))
        .collect();
    assert_eq!(lines, want, "the directory's entries, not sub/c.txt");
    // The root lists its top directory only.
    let top = ls_lines(&env, &["latest"]);
    assert_eq!(top.len(), 1, "{top:?}");
    // A file lists itself.
    assert_eq!(
        ls_lines(&env, &["latest", &format!("{s}/a.txt")]),
        [format!("{s}/a.txt")]
    );
    let all = ls_lines(&env, &["latest", &s, "-R"]);
    assert!(all.contains(&format!("{s}/sub/c.txt")), "{all:?}");
}

//! forget and prune through the binary: retention decisions, space really freed, and
//! deletions deferred while a backup that may build on them is running.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use crate::common::*;

fn data_bytes(env: &TestEnv) -> u64 {
    env.repo_files("data")
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

fn json_of(env: &TestEnv, args: &[&str]) -> serde_json::Value {
    let out = env.cmd().args(args).arg("--json").output().unwrap();
    assert_success(&out, &format!("cairn {args:?}"));
    parse_json(&out.stdout, &format!("cairn {args:?} --json"))
}

#[test]
fn forget_keep_last_then_prune_frees_the_space_of_the_forgotten_data() {
    let env = TestEnv::with_small_chunk_repo();
    let src = env.path("src");
    write_file(&src.join("old.bin"), &random_bytes(3_000_000, 1));
    let first = env.backup_id(&[&src], &[]);
    std::fs::remove_file(src.join("old.bin")).unwrap();
    write_file(&src.join("new.bin"), &random_bytes(1_000_000, 2));
    let kept = copy_of(&env, &src, "kept");
    let second = env.backup_id(&[&src], &[]);
    let before = data_bytes(&env);

    let forget = json_of(&env, &["forget", "--keep-last", "1"]);
    let removed: Vec<&str> = forget["removed_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(removed, vec![first.as_str()]);

    let prune = json_of(&env, &["prune"]);
    assert!(json_u64(&prune, "packs_deleted") > 0, "{prune}");
    assert_eq!(json_u64(&prune, "packs_deferred"), 0, "{prune}");
    let after = data_bytes(&env);
    assert!(
        after < before - 2_500_000,
        "prune freed the forgotten 3 MB: {before} -> {after} bytes"
    );
    let out = env.cmd().args(["check", "--read-data"]).output().unwrap();
    assert_success(&out, "check after prune");
    let target = env.path("restored");
    env.restore(&second, &target, &[]);
    assert_trees_equal(&kept, &restored_path(&target, &src), Compare::CONTENTS);
}

fn copy_of(env: &TestEnv, src: &Path, name: &str) -> std::path::PathBuf {
    let copy = env.path(name);
    copy_tree(src, &copy);
    copy
}

#[test]
fn forget_dry_run_explains_and_removes_nothing() {
    let env = TestEnv::with_small_chunk_repo();
    let src = env.path("src");
    write_file(&src.join("a"), b"one");
    env.backup(&[&src], &[]);
    write_file(&src.join("a"), b"two");
    env.backup(&[&src], &[]);
    let out = env
        .cmd()
        .args(["forget", "--keep-last", "1", "--dry-run"])
        .output()
        .unwrap();
    assert_success(&out, "forget --dry-run");
    let text = stdout(&out);
    assert!(
        text.contains("keep (last)") && text.contains("would remove"),
        "{text}"
    );
    assert_eq!(env.snapshots().len(), 2, "a dry run removes nothing");
    let out = env.cmd().args(["forget"]).output().unwrap();
    assert_exit(&out, 1, "forget without a policy");
    assert!(stderr(&out).contains("--keep-last"), "{}", stderr(&out));
}

/// `prune --dry-run` says how much the run would free, as much as the run then frees.
#[test]
fn prune_dry_run_reports_the_bytes_the_run_frees() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_random_files(&src, 3, 10_000, 5);
    env.backup(&[&src], &[]);
    std::fs::remove_dir_all(&src).unwrap();
    write_random_files(&src, 2, 10_000, 50);
    env.backup(&[&src], &[]);
    let out = env
        .cmd()
        .args(["forget", "--keep-last", "1"])
        .output()
        .unwrap();
    assert_success(&out, "forget --keep-last 1");
    let prune = |extra: &[&str]| {
        let out = env
            .cmd()
            .args(["prune", "--json"])
            .args(extra)
            .output()
            .unwrap();
        assert_success(&out, "cairn prune");
        parse_json(&out.stdout, "cairn prune --json")
    };
    let dry = prune(&["--dry-run"]);
    let run = prune(&[]);
    assert!(json_u64(&run, "bytes_freed") > 30_000, "{run}");
    for key in ["packs_deleted", "bytes_freed"] {
        assert_eq!(
            json_u64(&dry, key),
            json_u64(&run, key),
            "{key}: {dry} {run}"
        );
    }
}

#[test]
fn prune_defers_deletions_while_a_backup_is_running_and_does_them_after() {
    let env = TestEnv::with_small_chunk_repo();
    let src = env.path("src");
    write_file(&src.join("doomed.bin"), &random_bytes(2_000_000, 3));
    env.backup(&[&src], &[]);
    write_file(&src.join("doomed.bin"), &random_bytes(500_000, 4));
    env.backup(&[&src], &[]);
    let forget = json_of(&env, &["forget", "--keep-last", "1"]);
    assert_eq!(forget["removed_ids"].as_array().unwrap().len(), 1);

    // A backup from standard input stays running, with its session registered, until its
    // input closes.
    let mut running = std::process::Command::new(cairn_bin());
    running
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", env.path("home"))
        .env("CAIRN_PASSWORD", PASSWORD)
        .arg("-r")
        .arg(&env.repo)
        .args(["backup", "--json", "--stdin", "--stdin-filename", "stream"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = running.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while env.repo_files("sessions").is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the running backup registered no session"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    let before = data_bytes(&env);
    let prune = json_of(&env, &["prune"]);
    assert!(json_u64(&prune, "packs_deferred") > 0, "{prune}");
    assert_eq!(json_u64(&prune, "packs_deleted"), 0, "{prune}");
    assert!(
        !prune["blocking_sessions"].as_array().unwrap().is_empty(),
        "{prune}"
    );
    assert_eq!(
        data_bytes(&env),
        before,
        "nothing deleted while the backup runs"
    );

    child
        .stdin
        .as_mut()
        .unwrap()
        .write_all(&random_bytes(100_000, 5))
        .unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert_success(&out, "the stdin backup");
    assert!(
        env.repo_files("sessions").is_empty(),
        "the session ended with the backup"
    );

    let prune = json_of(&env, &["prune"]);
    assert!(json_u64(&prune, "packs_deleted") > 0, "{prune}");
    assert_eq!(json_u64(&prune, "packs_deferred"), 0, "{prune}");
    assert!(data_bytes(&env) < before, "the deferred packs are gone now");
    let (_, check) = check_report(&env, &[]);
    assert_eq!(
        json_u64(&check, "packs_condemned"),
        0,
        "no condemnation is left over: {check}"
    );
    let out = env.cmd().args(["check", "--read-data"]).output().unwrap();
    assert_success(&out, "check after the deferred prune");
}

#[test]
fn ctrl_c_stops_a_backup_cleanly_leaving_a_stopped_session_and_no_snapshot() {
    let env = TestEnv::with_small_chunk_repo();
    let src = env.path("src");
    write_random_files(&src, 40, 1_000_000, 100);
    let mut backup = std::process::Command::new(cairn_bin());
    backup
        .env("CAIRN_PASSWORD", PASSWORD)
        .env("HOME", env.path("home"))
        .arg("-r")
        .arg(&env.repo)
        // 40 MB at 2 MB/s: twenty seconds, still running when it is interrupted.
        .args(["--limit-upload", "2000", "backup"])
        .arg(&src);
    let out = interrupt_once_a_session_appears(&mut backup, &env.repo.join("sessions"));
    assert_eq!(out.status.code(), Some(130), "{}", describe(&out));
    assert!(stderr(&out).contains("Interrupted"), "{}", stderr(&out));
    // The session's last file says it stopped: it defers nothing, and the next backup
    // adopts the packs it left in no index and removes it.
    assert!(
        env.repo_files("sessions").len() <= 1,
        "one session file at most, saying it stopped"
    );
    assert!(env.snapshots().is_empty(), "no snapshot was written");
    let out = env.cmd().args(["check", "--read-data"]).output().unwrap();
    assert_success(&out, "check after an interrupted backup");
    let left = data_bytes(&env);
    let next = env.backup(&[&src], &[]);
    assert!(
        env.repo_files("sessions").is_empty(),
        "the next backup removed the stopped session"
    );
    // What the stopped backup uploaded is not uploaded again.
    assert!(
        json_u64(&next, "bytes_added") + left < 41_000_000,
        "{left} bytes were left, and the next backup added: {next}"
    );
}

/// Cut writes leave `.tmp-*` files that no listing shows; prune removes those older than
/// the grace period by the storage's clock (their mtime), and leaves younger ones, which
/// may be writes in progress.
#[test]
fn prune_removes_temporary_files_older_than_the_grace_period_only() {
    let env = TestEnv::with_small_chunk_repo();
    let src = env.path("src");
    write_file(&src.join("a.bin"), &random_bytes(200_000, 1));
    env.backup(&[&src], &[]);
    let dir = env.repo.join("data/00");
    std::fs::create_dir_all(&dir).unwrap();
    let old = dir.join(".tmp-0123456789abcdef");
    let young = env.repo.join("index/.tmp-fedcba9876543210");
    std::fs::write(&old, b"half a pack").unwrap();
    std::fs::write(&young, b"half an index").unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    let out = env
        .cmd()
        .env("CAIRN_GRACE_SECS", "600")
        .args(["prune", "--json"])
        .output()
        .unwrap();
    assert_success(&out, "prune");
    let report = parse_json(&out.stdout, "prune --json");
    assert_eq!(json_u64(&report, "temporaries_deleted"), 1, "{report}");
    assert!(!old.exists(), "the hour-old temporary file is gone");
    assert!(young.exists(), "the fresh one may be a write in progress");
    let out = env.cmd().args(["check", "--read-data"]).output().unwrap();
    assert_success(&out, "check after prune");
}

#[test]
fn forget_keep_within_daily_keeps_the_newest_of_each_day_inside_the_span() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f"), b"x");
    let times = [
        "2026-01-01T10:00:00Z",
        "2026-01-01T20:00:00Z",
        "2026-01-02T10:00:00Z",
        "2026-01-09T10:00:00Z",
        "2026-02-01T10:00:00Z",
    ];
    for t in times {
        env.backup(&[&src], &["--time", t]);
    }
    let out = env
        .cmd()
        .args(["forget", "--keep-within-daily", "1m"])
        .output()
        .unwrap();
    assert_success(&out, "forget --keep-within-daily 1m");
    let mut left: Vec<String> = env
        .snapshots()
        .iter()
        .map(|s| s["time"].as_str().unwrap().to_string())
        .collect();
    left.sort();
    // A month back from Feb 1 10:00 is Jan 1 10:00: Jan 1 is inside, and its newest
    // (20:00) is kept.
    assert_eq!(left, &times[1..], "{}", stdout(&out));
    assert!(stdout(&out).contains("within-daily"), "{}", stdout(&out));

    let out = env
        .cmd()
        .args(["forget", "--keep-within-weekly", "7d"])
        .output()
        .unwrap();
    assert_success(&out, "forget --keep-within-weekly 7d");
    assert_eq!(env.snapshots().len(), 1);
    let out = env
        .cmd()
        .args(["forget", "--keep-within-hourly", "5x"])
        .output()
        .unwrap();
    assert_exit(&out, 1, "a bad duration");
    assert!(
        stderr(&out).contains("--keep-within-hourly"),
        "{}",
        stderr(&out)
    );
}

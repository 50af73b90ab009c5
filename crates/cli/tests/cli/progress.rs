//! Progress display: nothing on a pipe; with `--json`, JSON lines on stderr whose last
//! figures add up to the command's own report, while stdout stays one JSON document; a
//! bar on a terminal.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::*;

/// Short enough that even a small backup emits events.
const INTERVAL_MS: &str = "5";

/// A few files of different sizes in two directories: (src, file count).
fn tree(env: &TestEnv) -> (PathBuf, u64) {
    let src = env.path("src");
    write_file(&src.join("big.bin"), &random_bytes(3_000_000, 1));
    write_file(&src.join("mid.bin"), &random_bytes(700_000, 2));
    for i in 0..20 {
        write_file(
            &src.join(format!("sub/small{i}.txt")),
            format!("{i}\n").as_bytes(),
        );
    }
    write_file(&src.join("skipped.o"), &random_bytes(500_000, 3));
    (src, 23)
}

/// Held to this rate (KiB/s) in each direction, the tree's 4 MB take at least a second to
/// store or read back, two hundred intervals: an idle machine restored it in 9 ms, and a
/// loaded one may leave the event thread unscheduled for a good part of a second.
const RATE_KIB: &str = "4000";

/// Runs `cairn --json ARGS` with a short progress interval and a transfer rate that makes
/// the command last many intervals: (stdout document, events).
fn run_json(env: &TestEnv, args: &[&str], extra: &[&Path]) -> (Value, Vec<Value>) {
    let out = env
        .cmd()
        .env("CAIRN_PROGRESS_INTERVAL_MS", INTERVAL_MS)
        .args(["--limit-upload", RATE_KIB, "--limit-download", RATE_KIB])
        .arg("--json")
        .args(args)
        .args(extra)
        .output()
        .unwrap();
    assert_success(&out, &format!("cairn --json {args:?}"));
    let report = parse_json(&out.stdout, "stdout of a command with progress events");
    let events: Vec<Value> = stderr(&out)
        .lines()
        .map(|l| parse_json(l.as_bytes(), "a stderr line with --json"))
        .collect();
    (report, events)
}

/// Checks what holds for every event stream, and returns the last event.
fn last_event<'a>(events: &'a [Value], command: &str) -> &'a Value {
    assert!(
        events.len() >= 2,
        "a command longer than the interval prints events: {events:?}"
    );
    let mut previous = (0, 0, 0);
    for e in events {
        assert_eq!(e["event"], "progress", "{e}");
        assert_eq!(e["command"], command, "{e}");
        let now = (
            json_u64(e, "elapsed_ms"),
            json_u64(e, "files_done"),
            json_u64(e, "bytes_done"),
        );
        assert!(
            now.0 >= previous.0 && now.1 >= previous.1 && now.2 >= previous.2,
            "time and counts never go back: {e} after {previous:?}"
        );
        previous = now;
    }
    let (last, rest) = events.split_last().unwrap();
    assert_eq!(last["final"], true, "the last event is marked: {last}");
    assert!(
        rest.iter().all(|e| e["final"] == false),
        "only the last event is final: {events:?}"
    );
    last
}

#[test]
fn a_backup_on_a_pipe_prints_no_progress() {
    let env = TestEnv::with_repo();
    let (src, _) = tree(&env);
    for args in [vec!["backup"], vec!["-q", "--json", "backup"]] {
        let out = env
            .cmd()
            .env("CAIRN_PROGRESS_INTERVAL_MS", "1")
            .args(&args)
            .arg(&src)
            .output()
            .unwrap();
        assert_success(&out, &format!("cairn {args:?}"));
        assert_eq!(
            stderr(&out),
            "",
            "cairn {args:?} on a pipe prints nothing on stderr"
        );
    }
}

#[test]
fn backup_json_events_end_at_the_backups_files_and_bytes() {
    let env = TestEnv::with_small_chunk_repo();
    let (src, files) = tree(&env);
    let (report, events) = run_json(&env, &["backup", "--exclude", "*.o"], &[&src]);
    let last = last_event(&events, "backup");
    let total_bytes = json_u64(&report, "total_bytes");
    let backed_up = json_u64(&report, "files_new");
    assert_eq!(
        backed_up,
        files - 1,
        "the excluded file is left out: {report}"
    );
    assert_eq!(json_u64(last, "bytes_done"), total_bytes, "{last}");
    assert_eq!(json_u64(last, "files_done"), backed_up, "{last}");
    // The pre-scan (which applies --exclude) is done long before the backup is; should it
    // still be counting, its totals can only be short.
    if last["totals_complete"] == true {
        assert_eq!(json_u64(last, "files_total"), backed_up, "{last}");
        assert_eq!(json_u64(last, "bytes_total"), total_bytes, "{last}");
    } else {
        assert!(json_u64(last, "bytes_total") <= total_bytes, "{last}");
    }
    let current = last["current"].as_str().unwrap_or_default();
    assert!(
        current.starts_with(src.to_str().unwrap()),
        "the current path is a backed-up file: {last}"
    );

    // Unchanged files count at once: the second backup's bytes add up as well. A new file
    // makes it last many intervals (unchanged files alone take a few milliseconds).
    write_file(&src.join("new.bin"), &random_bytes(2_000_000, 4));
    let (report, events) = run_json(&env, &["backup", "--exclude", "*.o"], &[&src]);
    let last = last_event(&events, "backup");
    assert_eq!(json_u64(&report, "files_unchanged"), backed_up, "{report}");
    assert_eq!(json_u64(&report, "files_new"), 1, "{report}");
    assert_eq!(
        json_u64(last, "bytes_done"),
        json_u64(&report, "total_bytes"),
        "{last}"
    );
    assert_eq!(json_u64(last, "files_done"), backed_up + 1, "{last}");
}

/// Issue 21, problem 14: the pre-scan counted what ignore files and cache tags leave out,
/// so the bar ended short of its total.
#[test]
fn the_prescan_leaves_out_what_ignore_files_and_cache_tags_leave_out() {
    let env = TestEnv::with_small_chunk_repo();
    let (src, _) = tree(&env);
    // Leaves out skipped.o and sub/small1.txt, sub/small10..19.txt.
    write_file(&src.join(".cairnignore"), b"*.o\nsmall1*.txt\n");
    let mut tag = b"Signature: 8a477f597d28d172789f06886806bc55".to_vec();
    tag.push(b'\n');
    write_file(&src.join("cache/CACHEDIR.TAG"), &tag);
    for i in 0..5 {
        write_file(&src.join(format!("cache/c{i}")), &random_bytes(100_000, i));
    }
    let (report, events) = run_json(&env, &["backup", "--exclude-caches"], &[&src]);
    let last = last_event(&events, "backup");
    let backed_up = json_u64(&report, "files_new");
    // big, mid, .cairnignore and small0, small2..9.
    assert_eq!(backed_up, 12, "{report}");
    let total_bytes = json_u64(&report, "total_bytes");
    assert!(json_u64(last, "files_total") <= backed_up, "{last}");
    assert!(json_u64(last, "bytes_total") <= total_bytes, "{last}");
    if last["totals_complete"] == true {
        assert_eq!(json_u64(last, "files_total"), backed_up, "{last}");
        assert_eq!(json_u64(last, "bytes_total"), total_bytes, "{last}");
    }
}

#[test]
fn backup_no_scan_reports_no_totals() {
    let env = TestEnv::with_small_chunk_repo();
    let (src, files) = tree(&env);
    let (report, events) = run_json(&env, &["backup", "--no-scan"], &[&src]);
    let last = last_event(&events, "backup");
    for e in &events {
        assert!(
            e["files_total"].is_null() && e["bytes_total"].is_null(),
            "{e}"
        );
        assert_eq!(e["totals_complete"], false, "{e}");
    }
    assert_eq!(json_u64(last, "files_done"), files, "{last}");
    assert_eq!(
        json_u64(last, "bytes_done"),
        json_u64(&report, "total_bytes")
    );
}

#[test]
fn restore_json_events_take_their_totals_from_the_snapshot() {
    let env = TestEnv::with_small_chunk_repo();
    let (src, files) = tree(&env);
    let id = env.backup_id(&[&src], &[]);
    let target = env.path("target");
    let (report, events) = run_json(
        &env,
        &["restore", &id, "--target", target.to_str().unwrap()],
        &[],
    );
    let last = last_event(&events, "restore");
    let bytes = json_u64(&report, "bytes_restored");
    assert_eq!(json_u64(&report, "files_restored"), files, "{report}");
    assert_eq!(json_u64(last, "bytes_done"), bytes, "{last}");
    assert_eq!(json_u64(last, "files_done"), files, "{last}");
    assert_eq!(json_u64(last, "files_total"), files, "{last}");
    assert_eq!(json_u64(last, "bytes_total"), bytes, "{last}");
    assert_eq!(last["totals_complete"], true, "{last}");
}

#[test]
fn restore_of_a_subtree_counts_only_that_subtree() {
    let env = TestEnv::with_small_chunk_repo();
    let (src, _) = tree(&env);
    let id = env.backup_id(&[&src], &[]);
    let target = env.path("target");
    let spec = format!("{id}:{}", src.display());
    let (report, events) = run_json(
        &env,
        &["restore", &spec, "--target", target.to_str().unwrap()],
        &[],
    );
    let last = last_event(&events, "restore");
    assert_eq!(
        json_u64(last, "bytes_done"),
        json_u64(&report, "bytes_restored")
    );
    // The count runs beside the restore and may be cut short by its end, never too high.
    if last["totals_complete"] == true {
        assert_eq!(json_u64(last, "files_total"), 23, "{last}");
    }
    assert!(json_u64(last, "files_total") <= 23, "{last}");

    let one = format!("{id}:{}", src.join("mid.bin").display());
    let target = env.path("one");
    let (_, events) = run_json(
        &env,
        &["restore", &one, "--target", target.to_str().unwrap()],
        &[],
    );
    if let Some(last) = events.last() {
        assert_eq!(json_u64(last, "bytes_done"), 700_000, "{last}");
        if last["totals_complete"] == true {
            assert_eq!(json_u64(last, "files_total"), 1, "{last}");
            assert_eq!(json_u64(last, "bytes_total"), 700_000, "{last}");
        }
    }
}

#[test]
fn check_json_events_name_their_phase() {
    let env = TestEnv::with_small_chunk_repo();
    let (src, _) = tree(&env);
    env.backup(&[&src], &[]);
    let (report, events) = run_json(&env, &["check", "--read-data"], &[]);
    assert_eq!(report["problems"], serde_json::json!([]), "{report}");
    for e in &events {
        assert_eq!(e["event"], "progress", "{e}");
        assert_eq!(e["command"], "check", "{e}");
        assert!(json_u64(e, "done") <= json_u64(e, "total"), "{e}");
    }
    assert!(
        events
            .iter()
            .any(|e| e["phase"] == "packs" || e["phase"] == "snapshots"),
        "check reports its phases: {events:?}"
    );
}

/// On a terminal (a pseudo-terminal from `script`), a bar is drawn on stderr and cleared
/// before the summary, which arrives whole.
#[test]
fn a_backup_on_a_terminal_draws_a_bar() {
    let Ok(script) = which("script") else {
        eprintln!("skipped: no `script` to run cairn on a pseudo-terminal");
        return;
    };
    let env = TestEnv::with_small_chunk_repo();
    let (src, _) = tree(&env);
    let command = format!(
        "{} -r {} backup {}",
        cairn_bin().display(),
        env.repo.display(),
        src.display()
    );
    // The isolated environment of every test, for `script` instead of cairn.
    let like = spawnable_bare(&env);
    let mut cmd = detached(script);
    cmd.env_clear()
        .envs(like.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .env("TERM", "xterm")
        .current_dir(&env.root)
        .args(["-qec", &command, "/dev/null"]);
    let out = assert_cmd::Command::from_std(cmd)
        .timeout(COMMAND_TIMEOUT)
        .output()
        .unwrap();
    assert_success(&out, "cairn backup under script");
    let screen = stdout(&out);
    assert!(
        screen.contains("backup") && screen.contains(" files"),
        "a bar with the file count: {screen:?}"
    );
    assert!(screen.contains("\x1b[2K"), "the bar is cleared: {screen:?}");
    assert!(
        screen.contains("Files:    23 new") && screen.contains(" saved"),
        "the summary follows whole: {screen:?}"
    );
}

fn which(program: &str) -> Result<PathBuf, ()> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .ok_or(())
}

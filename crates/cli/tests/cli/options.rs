//! Global options: where the repository and the password come from, and that they are
//! accepted on either side of the subcommand.

use crate::common::*;

#[test]
fn global_options_are_accepted_after_the_subcommand() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f"), b"f");
    let out = env
        .bare_cmd()
        .arg("backup")
        .arg(&src)
        .arg("--repo")
        .arg(&env.repo)
        .arg("--json")
        .output()
        .unwrap();
    assert_success(&out, "cairn backup SRC --repo REPO --json");
    parse_json(&out.stdout, "backup with --json after the subcommand");
    let out = env
        .bare_cmd()
        .arg("snapshots")
        .arg("-r")
        .arg(&env.repo)
        .arg("--json")
        .output()
        .unwrap();
    assert_success(&out, "cairn snapshots -r REPO --json");
    let snaps = parse_json(&out.stdout, "snapshots --json");
    assert_eq!(
        snaps["snapshots"].as_array().map(Vec::len),
        Some(1),
        "{snaps}"
    );
}

#[test]
fn the_repository_can_come_from_cairn_repository() {
    let env = TestEnv::new();
    let out = env
        .bare_cmd()
        .env("CAIRN_REPOSITORY", &env.repo)
        .arg("init")
        .output()
        .unwrap();
    assert_success(&out, "CAIRN_REPOSITORY=... cairn init");
    assert!(
        env.repo.join("config").is_file(),
        "the repository is created at CAIRN_REPOSITORY"
    );
    let src = env.path("src");
    write_file(&src.join("f"), b"f");
    let out = env
        .bare_cmd()
        .env("CAIRN_REPOSITORY", &env.repo)
        .arg("backup")
        .arg(&src)
        .output()
        .unwrap();
    assert_success(&out, "CAIRN_REPOSITORY=... cairn backup");
    assert_eq!(
        env.snapshots().len(),
        1,
        "-r and CAIRN_REPOSITORY name the same repository"
    );
}

#[test]
fn the_repo_option_wins_over_cairn_repository() {
    let env = TestEnv::with_repo();
    let out = env
        .cmd()
        .env("CAIRN_REPOSITORY", env.path("nowhere"))
        .arg("snapshots")
        .output()
        .unwrap();
    assert_success(
        &out,
        "cairn -r REPO snapshots with CAIRN_REPOSITORY elsewhere",
    );
}

#[test]
fn a_password_file_opens_a_repository_made_with_the_same_password() {
    let env = TestEnv::new();
    let pw = env.path("pw.txt");
    write_file(&pw, b"s3cret from a file");
    let out = env
        .cmd()
        .env_remove("CAIRN_PASSWORD")
        .arg("--password-file")
        .arg(&pw)
        .arg("init")
        .output()
        .unwrap();
    assert_success(&out, "cairn --password-file init");
    let out = env
        .cmd()
        .env("CAIRN_PASSWORD", "s3cret from a file")
        .arg("snapshots")
        .output()
        .unwrap();
    assert_success(&out, "the same password from CAIRN_PASSWORD");
    let out = env
        .cmd()
        .env_remove("CAIRN_PASSWORD")
        .arg("snapshots")
        .arg("--password-file")
        .arg(&pw)
        .output()
        .unwrap();
    assert_success(&out, "cairn snapshots --password-file");
}

#[test]
fn a_password_command_supplies_the_first_line_of_its_output() {
    let env = TestEnv::with_repo();
    let command = format!("echo '{PASSWORD}'; echo 'second line is ignored'");
    let out = env
        .cmd()
        .env_remove("CAIRN_PASSWORD")
        .args(["--password-command", &command, "snapshots"])
        .output()
        .unwrap();
    assert_success(&out, "cairn --password-command snapshots");

    let out = env
        .cmd()
        .env_remove("CAIRN_PASSWORD")
        .args(["--password-command", "echo not-the-password", "snapshots"])
        .output()
        .unwrap();
    assert_exit(&out, 1, "a password command printing a wrong password");
    assert!(
        stderr(&out).to_lowercase().contains("password"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn no_password_for_an_explicit_repository_is_an_error_not_a_hang() {
    let env = TestEnv::with_repo();
    let out = env
        .cmd()
        .env_remove("CAIRN_PASSWORD")
        .arg("snapshots")
        .output()
        .unwrap();
    assert_exit(
        &out,
        1,
        "cairn -r REPO snapshots without any password and without a terminal",
    );
    assert!(
        stderr(&out).to_lowercase().contains("password"),
        "{}",
        stderr(&out)
    );
}

/// r21.8: global options were mixed into each command's options, `CAIRN_PASSWORD`
/// appeared nowhere, and exit code 2 was undocumented.
#[test]
fn help_groups_global_options_and_lists_the_environment_and_exit_codes() {
    let env = TestEnv::new();
    for args in [
        &["--help"][..],
        &["restore", "--help"],
        &["backup", "--help"],
    ] {
        let out = env.bare_cmd().args(args).output().unwrap();
        assert_success(&out, &format!("cairn {args:?}"));
        let text = stdout(&out);
        assert!(text.contains("Environment:"), "{args:?}: {text}");
        assert!(text.contains("  CAIRN_PASSWORD "), "{args:?}: {text}");
        assert!(text.contains("2 usage error"), "{args:?}: {text}");
        if args.len() > 1 {
            let (own, global) = text.split_once("Global options:").expect("a heading");
            assert!(global.contains("--password-file"), "{text}");
            assert!(!own.contains("--password-file"), "{text}");
        }
    }
}

/// Rate limits hold a transfer to at least bytes/rate seconds: a lower bound the limiter
/// enforces by waiting, so a slow machine cannot make this fail.
#[test]
fn limit_upload_and_download_hold_transfers_to_their_rate() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("random.bin"), &random_bytes(600_000, 21));
    let started = std::time::Instant::now();
    env.backup(&[&src], &["--limit-upload", "200"]);
    let upload = started.elapsed();
    // 600,000 bytes of packs at 200 KiB/s: at least 2.9 s.
    assert!(upload.as_secs_f64() >= 2.8, "backup took {upload:?}");

    let target = env.path("restored");
    let started = std::time::Instant::now();
    env.restore("latest", &target, &["--limit-download", "200"]);
    let download = started.elapsed();
    assert!(download.as_secs_f64() >= 2.8, "restore took {download:?}");
    assert_eq!(
        std::fs::read(restored_path(&target, &src.join("random.bin"))).unwrap(),
        random_bytes(600_000, 21)
    );
}

/// `--nice` lowers the priority of cairn and of what it starts: the command of
/// `--stdin-from-command` reports its own.
#[test]
fn nice_lowers_the_cpu_and_io_priority() {
    let env = TestEnv::with_repo();
    let out = env
        .cmd()
        .args([
            "--nice",
            "backup",
            "--stdin-from-command",
            "--stdin-filename",
            "prio",
        ])
        .args([
            "--",
            "sh",
            "-c",
            "cat /proc/self/stat; ionice 2>/dev/null || true",
        ])
        .output()
        .unwrap();
    assert_success(&out, "cairn --nice backup");
    let cat = env.cmd().args(["cat", "latest", "/prio"]).output().unwrap();
    assert_success(&cat, "cat /prio");
    let text = String::from_utf8_lossy(&cat.stdout).to_string();
    let stat = text.lines().next().unwrap_or_default();
    // Fields after "pid (comm)": state is field 3, nice field 19.
    let after = &stat[stat.rfind(')').expect("a stat line") + 1..];
    let nice: i32 = after.split_whitespace().nth(16).unwrap().parse().unwrap();
    assert_eq!(nice, 19, "{stat}");
    if let Some(io) = text.lines().nth(1) {
        assert!(io.starts_with("idle"), "ionice says {io:?}");
    }
}

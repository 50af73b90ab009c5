//! The whole cycle against real remote stores: a Garage S3 node and an OpenSSH server on
//! loopback, started by `scripts/test`. Without them these tests say so and pass, unless
//! `CAIRN_TEST_SERVICES=required` (as `scripts/test` sets).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use assert_cmd::Command;
use cairn_storage::{Location, Storage};
use serde_json::Value;

use crate::common::*;

fn address(var: &str) -> Option<String> {
    unique_address(var, "cycle")
}

/// A fresh repository address below the server address in `var` (`WHAT-RANDOM`), or
/// `None` when the servers are not running and not required.
pub(crate) fn unique_address(var: &str, what: &str) -> Option<String> {
    server_address(var).map(|v| format!("{v}/{what}-{:016x}", rand_u64()))
}

/// The value of `var`, set by `scripts/services.sh`; `None` (the test is skipped) when it
/// is not set, unless `CAIRN_TEST_SERVICES=required`.
pub(crate) fn server_address(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            assert!(
                std::env::var("CAIRN_TEST_SERVICES").as_deref() != Ok("required"),
                "{var} is not set, but the test servers are required: run the tests with scripts/test"
            );
            eprintln!("{var} is not set: skipped (run scripts/test to start the servers)");
            None
        }
    }
}

/// A test environment whose repository is a fresh one below the server address in
/// `var` (`WHAT-RANDOM`, not yet initialised): every command it makes (`env.cmd()`,
/// `spawnable(&env)`, `env.init`, ...) reaches it with what it needs from the
/// environment. `None` when the servers are not running and not required.
pub(crate) fn remote_test_env(var: &str, what: &str) -> Option<TestEnv> {
    let address = unique_address(var, what)?;
    let mut env = TestEnv::new();
    env.vars = remote_vars(&address);
    env.repo = PathBuf::from(address);
    Some(env)
}

/// Whether `env`'s repository is a remote one (see [`remote_test_env`]).
pub(crate) fn is_remote(env: &TestEnv) -> bool {
    env.repo
        .to_str()
        .is_some_and(|a| a.starts_with("s3:") || a.starts_with("sftp:"))
}

/// The files of the remote repository at `address` below `dir` (`data`, `sessions`,
/// ...), as the storage layer lists them: S3 through the S3 API; SFTP in the directory
/// the test server serves, which is on this machine (the test process has no `ssh`
/// setup of its own). One store per address, kept for the test binary's life.
pub(crate) fn remote_files(address: &str, dir: &str) -> Vec<String> {
    static STORES: Mutex<BTreeMap<String, Arc<dyn Storage>>> = Mutex::new(BTreeMap::new());
    let store = STORES
        .lock()
        .unwrap()
        .entry(address.to_string())
        .or_insert_with(|| match Location::parse(address) {
            Ok(Location::S3(config)) => Arc::new(
                cairn_storage::RemoteStorage::s3(&config, address.to_string())
                    .expect("open the S3 store"),
            ),
            Ok(Location::Sftp(config)) => {
                Arc::new(cairn_storage::LocalStorage::new(Path::new(&config.path)))
            }
            other => panic!("{address} is a remote address: {other:?}"),
        })
        .clone();
    store
        .list(dir)
        .unwrap_or_else(|e| panic!("list {dir} of {address}: {e}"))
}

fn rand_u64() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    t ^ (std::process::id() as u64) << 32
}

/// What a command needs from the environment to reach `address`: the S3 credentials and
/// region, and for SFTP an `ssh` on PATH that reads the test server's client config (as a
/// user's ~/.ssh/config).
pub(crate) fn remote_vars(address: &str) -> Vec<(String, String)> {
    let mut vars = Vec::new();
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_DEFAULT_REGION",
    ] {
        if let Ok(v) = std::env::var(var) {
            vars.push((var.to_string(), v));
        }
    }
    if address.starts_with("sftp:") {
        if let Ok(bin) = std::env::var("CAIRN_TEST_SSH_BIN") {
            let path = std::env::var("PATH").unwrap_or_default();
            vars.push(("PATH".to_string(), format!("{bin}:{path}")));
        }
    }
    vars
}

/// Runs `cairn --stats --json ARGS` and returns the requests it counted by kind.
fn requests(env: &TestEnv, address: &str, args: &[&str]) -> Value {
    let out = remote_cmd(env, address)
        .args(["--stats", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert_success(&out, &format!("cairn --stats {args:?}"));
    let line = stderr(&out)
        .lines()
        .rev()
        .find(|l| l.contains("\"requests\""))
        .unwrap_or_else(|| panic!("--stats printed request counts: {}", describe(&out)))
        .to_string();
    let stats = parse_json(line.as_bytes(), "--stats line");
    assert_eq!(stats["repository"], address, "{stats}");
    stats
}

/// `cairn -r ADDRESS ...` with what the remote needs from the environment.
pub(crate) fn remote_cmd(env: &TestEnv, address: &str) -> Command {
    let mut cmd = env.bare_cmd();
    cmd.envs(remote_vars(address));
    cmd.arg("-r").arg(address);
    cmd
}

/// `remote_cmd` as a plain `std::process::Command`, for a command a test spawns.
pub(crate) fn remote_spawnable(env: &TestEnv, address: &str) -> std::process::Command {
    let mut cmd = spawnable_bare(env);
    cmd.envs(remote_vars(address));
    cmd.arg("-r").arg(address);
    cmd
}

pub(crate) fn run(env: &TestEnv, address: &str, args: &[&str]) -> std::process::Output {
    let out = remote_cmd(env, address).args(args).output().unwrap();
    assert_success(&out, &format!("cairn -r {address} {args:?}"));
    out
}

fn cycle(address: &str) {
    let env = TestEnv::new();
    let src = build_rich_tree(&env.path("src"));
    run(
        &env,
        address,
        &[
            "init",
            "--pack-size",
            "1M",
            "--chunk-min",
            "16K",
            "--chunk-avg",
            "64K",
            "--chunk-max",
            "256K",
        ],
    );
    write_file(&src.join("big.bin"), &random_bytes(3_000_000, 7));
    run(&env, address, &["backup", src.to_str().unwrap()]);
    std::fs::remove_file(src.join("big.bin")).unwrap();
    write_file(&src.join("new.bin"), &random_bytes(500_000, 8));
    let kept = env.path("kept");
    copy_tree(&src, &kept);
    let stats = requests(&env, address, &["backup", src.to_str().unwrap()]);
    // About one PUT per pack plus a few (the session's first file and the one recording
    // the trash generation it read, a tree pack, the index, the snapshot), none per
    // blob: new.bin alone is about eight chunks.
    let puts = json_u64(&stats["requests"], "put");
    let packs = json_u64(&stats, "bytes_sent") / 900_000 + 1;
    assert!(puts <= packs + 5, "{puts} PUTs for {packs} packs: {stats}");
    let snaps = run(&env, address, &["snapshots", "--json"]);
    let snaps = &parse_json(&snaps.stdout, "snapshots --json")["snapshots"];
    assert!(
        json_u64(&snaps[1]["summary"], "files") > 0 && snaps[1]["parent_id"] == snaps[0]["id"],
        "the second backup used its parent: {snaps}"
    );

    // The local cache: with it, `ls` downloads only the config and the key file; with
    // an empty one, also the index, the snapshot and the trees.
    let warm = requests(&env, address, &["ls", "-R", "latest"]);
    assert_eq!(json_u64(&warm["requests"], "get"), 2, "{warm}");
    std::fs::remove_dir_all(env.path("home/.cache/cairn")).unwrap();
    let cold = requests(&env, address, &["ls", "-R", "latest"]);
    assert!(json_u64(&cold["requests"], "get") > 2, "{warm} then {cold}");

    let check = |what: &str| {
        let out = remote_cmd(&env, address)
            .args(["check", "--read-data"])
            .output()
            .unwrap();
        assert_success(&out, &format!("check --read-data {what}"));
    };
    check("after two backups");
    let restore_and_compare = |target: &Path| {
        run(
            &env,
            address,
            &["restore", "latest", "--target", target.to_str().unwrap()],
        );
        assert_trees_equal(&kept, &restored_path(target, &src), Compare::ALL);
    };
    restore_and_compare(&env.path("restore-1"));

    // Copy into a local repository and back into a new remote one.
    let password = env.path("password");
    std::fs::write(&password, format!("{PASSWORD}\n")).unwrap();
    env.init(&[]);
    let out = env
        .cmd()
        .envs(remote_vars(address))
        .args(["copy", "--from-repo", address, "--from-password-file"])
        .arg(&password)
        .output()
        .unwrap();
    assert_success(&out, "copy from the remote repository");
    let local = env.path("restore-local");
    env.restore("latest", &local, &[]);
    assert_trees_equal(&kept, &restored_path(&local, &src), Compare::ALL);
    let back = format!("{address}-copy");
    run(&env, &back, &["init"]);
    let out = remote_cmd(&env, &back)
        .args(["copy", "--from-repo"])
        .arg(&env.repo)
        .arg("--from-password-file")
        .arg(&password)
        .output()
        .unwrap();
    assert_success(&out, "copy into a remote repository");
    let copied = env.path("restore-copied");
    run(
        &env,
        &back,
        &["restore", "latest", "--target", copied.to_str().unwrap()],
    );
    assert_trees_equal(&kept, &restored_path(&copied, &src), Compare::ALL);

    let out = run(
        &env,
        address,
        &["forget", "--keep-last", "1", "--prune", "--json"],
    );
    let report = parse_json(&out.stdout, "forget --prune --json");
    assert!(
        json_u64(&report["prune"], "packs_deleted") > 0,
        "prune freed the forgotten data: {report}"
    );
    check("after forget --prune");
    restore_and_compare(&env.path("restore-2"));
}

#[test]
fn the_whole_cycle_works_on_garage_s3() {
    if let Some(address) = address("CAIRN_TEST_S3") {
        cycle(&address);
    }
}

#[test]
fn the_whole_cycle_works_over_sftp() {
    if let Some(address) = address("CAIRN_TEST_SFTP") {
        cycle(&address);
    }
}

#[test]
fn wrong_s3_credentials_are_a_clear_error() {
    let Some(address) = address("CAIRN_TEST_S3") else {
        return;
    };
    let env = TestEnv::new();
    let out = remote_cmd(&env, &address)
        .env("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        .arg("init")
        .output()
        .unwrap();
    assert_exit(&out, 1, "init with a wrong secret key");
    let err = stderr(&out);
    assert!(
        err.contains(&address) && err.contains("credentials"),
        "{err}"
    );
}

/// cairn ends the `ssh` masters it leaked itself (see `cairn_storage::ssh_orphans`), but
/// never another program's: a same-user process whose command line is that of an
/// `openssh`-crate master with a deleted control directory outlives SFTP commands.
#[test]
fn an_sftp_command_leaves_other_programs_ssh_masters_alone() {
    use std::os::unix::process::CommandExt;
    let Some(address) = address("CAIRN_TEST_SFTP") else {
        return;
    };
    let gone = std::env::temp_dir().join(".ssh-connectionNOTCAIRNS/master");
    let mut lookalike = std::process::Command::new("bash")
        .arg0("ssh")
        .args(["-c", "sleep 300; :", "-E", "/dev/null", "-M", "-S"])
        .arg(&gone)
        .args(["-f", "-N", "-o", "ControlPersist=yes", "host"])
        .spawn()
        .unwrap();
    // Until it has exec'd, its command line is still this test's.
    let cmdline = format!("/proc/{}/cmdline", lookalike.id());
    while !fs_read(&cmdline).starts_with(b"ssh\0") {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let env = TestEnv::new();
    for args in [&["init"][..], &["snapshots"]] {
        let out = remote_cmd(&env, &address).args(args).output().unwrap();
        assert_success(&out, &format!("cairn {args:?} over SFTP"));
    }
    let alive = lookalike.try_wait().unwrap().is_none();
    let _ = lookalike.kill();
    let _ = lookalike.wait();
    assert!(alive, "cairn ended a process it did not start");
}

fn fs_read(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_default()
}

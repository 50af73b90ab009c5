//! Keys and local state: `cairn key list | add | remove | passwd`, the default
//! repository's random key, key files planted by whoever can write to the storage, the
//! modes of a local repository's files, and the client-side record that notices when the
//! storage goes back in time.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

fn run(cmd: &mut assert_cmd::Command, what: &str) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert_success(&out, what);
    out
}

fn password_file(env: &TestEnv, name: &str, password: &str) -> PathBuf {
    let path = env.path(name);
    fs::write(&path, format!("{password}\n")).unwrap();
    path
}

fn key_list(env: &TestEnv, password: &str) -> Vec<Value> {
    let out = run(
        env.cmd()
            .env("CAIRN_PASSWORD", password)
            .args(["key", "list", "--json"]),
        "cairn key list --json",
    );
    match parse_json(&out.stdout, "key list --json") {
        Value::Object(mut doc) => match doc.remove("keys") {
            Some(Value::Array(items)) => items,
            other => panic!("key list --json has a keys array, got {other:?}"),
        },
        other => panic!("key list --json prints an array, got {other}"),
    }
}

fn current_key(keys: &[Value]) -> String {
    let current: Vec<&Value> = keys.iter().filter(|k| k["current"] == true).collect();
    assert_eq!(current.len(), 1, "one key is current: {keys:?}");
    current[0]["id"].as_str().unwrap().to_string()
}

fn opens_with(env: &TestEnv, password: &str) -> bool {
    env.cmd()
        .env("CAIRN_PASSWORD", password)
        .arg("snapshots")
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn several_passwords_open_one_repository_and_the_key_in_use_or_the_last_is_never_removed() {
    let env = TestEnv::with_repo();
    let second = password_file(&env, "second.pw", "a second password");
    let out = run(
        env.cmd()
            .args(["key", "add", "--json", "--new-password-file"])
            .arg(&second),
        "cairn key add",
    );
    let added = parse_json(&out.stdout, "key add --json")["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(opens_with(&env, PASSWORD) && opens_with(&env, "a second password"));
    assert!(!opens_with(&env, "a third password"));

    let by_first = key_list(&env, PASSWORD);
    assert_eq!(by_first.len(), 2, "{by_first:?}");
    let first = current_key(&by_first);
    assert_ne!(first, added);
    for k in &by_first {
        assert!(k["kdf"].as_str().unwrap().starts_with("argon2id"), "{k}");
        assert!(k["created"].is_string() && k["host"].is_string(), "{k}");
    }
    assert_eq!(current_key(&key_list(&env, "a second password")), added);

    // The key in use is refused, by a full id or a prefix.
    let out = env
        .cmd()
        .args(["key", "remove", &first[..8]])
        .output()
        .unwrap();
    assert_exit(&out, 1, "cairn key remove of the key in use");
    assert!(
        stderr(&out).contains("cairn key passwd"),
        "{}",
        stderr(&out)
    );
    assert!(opens_with(&env, PASSWORD));

    // Removed with the other password, the first one no longer opens.
    run(
        env.cmd()
            .env("CAIRN_PASSWORD", "a second password")
            .args(["key", "remove", &first]),
        "cairn key remove with another key's password",
    );
    assert!(!opens_with(&env, PASSWORD));
    assert_eq!(env.repo_files("keys").len(), 1);
    let out = env
        .cmd()
        .env("CAIRN_PASSWORD", "a second password")
        .args(["key", "remove", &added])
        .output()
        .unwrap();
    assert_exit(&out, 1, "cairn key remove of the only key");
    assert_eq!(env.repo_files("keys").len(), 1);
}

#[test]
fn passwd_replaces_the_key_in_use_and_the_old_password_stops_opening() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_random_files(&src, 3, 10_000, 1);
    env.backup(&[&src], &[]);
    let new = password_file(&env, "new.pw", "the new password");
    let out = run(
        env.cmd()
            .args(["key", "passwd", "--json", "--new-password-file"])
            .arg(&new),
        "cairn key passwd",
    );
    let report = parse_json(&out.stdout, "key passwd --json");
    assert_ne!(report["id"], report["removed_id"]);
    assert!(
        !opens_with(&env, PASSWORD),
        "the old password no longer opens"
    );
    assert!(opens_with(&env, "the new password"));
    let keys = key_list(&env, "the new password");
    assert_eq!(keys.len(), 1);
    assert_eq!(Some(current_key(&keys).as_str()), report["id"].as_str());
    let target = env.path("restored");
    run(
        env.cmd()
            .env("CAIRN_PASSWORD", "the new password")
            .args(["restore", "latest", "--target"])
            .arg(&target),
        "restore with the new password",
    );
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::CONTENTS);
}

fn default_key(env: &TestEnv) -> PathBuf {
    env.root.join("config/cairn/default.key")
}

fn stored_key_files(repo: &Path) -> Vec<Value> {
    let mut files: Vec<PathBuf> = fs::read_dir(repo.join("keys"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| parse_json(&fs::read(p).unwrap(), "a key file"))
        .collect()
}

fn first_default_backup(env: &TestEnv) -> PathBuf {
    let src = env.path("src");
    write_random_files(&src, 3, 10_000, 2);
    run(
        unconfigured(env).arg("backup").arg(&src),
        "first backup into the default repository",
    );
    src
}

#[test]
fn the_default_repository_key_needs_no_stretching_and_a_password_can_be_added() {
    let env = TestEnv::new();
    first_default_backup(&env);
    let stored = stored_key_files(&default_repo(&env));
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["kdf"], "blake3", "{}", stored[0]);
    assert!(stored[0].get("params").is_none(), "{}", stored[0]);

    // A password for the default repository, e.g. to restore on another machine.
    let pw = password_file(&env, "added.pw", "typed by a person");
    run(
        unconfigured(&env)
            .args(["key", "add", "--new-password-file"])
            .arg(&pw),
        "cairn key add on the default repository",
    );
    let stored = stored_key_files(&default_repo(&env));
    let kdfs: Vec<&str> = stored.iter().map(|k| k["kdf"].as_str().unwrap()).collect();
    assert!(
        kdfs.contains(&"blake3") && kdfs.contains(&"argon2id"),
        "{kdfs:?}"
    );
    run(
        env.bare_cmd()
            .arg("-r")
            .arg(default_repo(&env))
            .env("CAIRN_PASSWORD", "typed by a person")
            .arg("snapshots"),
        "the default repository opened with the added password",
    );
    // A copy of the key file opens it too, given as a password file (another machine).
    run(
        env.bare_cmd()
            .env_remove("CAIRN_PASSWORD")
            .arg("-r")
            .arg(default_repo(&env))
            .arg("--password-file")
            .arg(default_key(&env))
            .arg("snapshots"),
        "the default repository opened with a copy of its key file",
    );
    let out = run(
        unconfigured(&env).args(["key", "list"]),
        "cairn key list on the default repository",
    );
    let text = stdout(&out);
    assert!(
        text.contains("blake3") && text.contains("argon2id"),
        "{text}"
    );
    // The key the first backup made names the host it was made on.
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let made = text.lines().find(|l| l.contains("blake3")).unwrap();
    assert!(made.contains(&host), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with('*')).count(),
        1,
        "{text}"
    );
}

#[test]
fn passwd_on_the_default_repository_gives_it_a_new_random_key() {
    let env = TestEnv::new();
    let src = first_default_backup(&env);
    let old = fs::read_to_string(default_key(&env)).unwrap();
    run(
        unconfigured(&env).args(["key", "passwd"]),
        "cairn key passwd on the default repository",
    );
    let new = fs::read_to_string(default_key(&env)).unwrap();
    assert_ne!(old, new);
    assert_eq!(new.trim().len(), 64, "{new:?}");
    let mode = fs::metadata(default_key(&env))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let stored = stored_key_files(&default_repo(&env));
    assert_eq!(stored.len(), 1, "the old key file is removed");
    assert_eq!(stored[0]["kdf"], "blake3");
    let leftovers: Vec<_> = fs::read_dir(env.root.join("config/cairn"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, ["default.key"], "no staged key file left");

    let target = env.path("restored");
    run(
        unconfigured(&env)
            .args(["restore", "latest", "--target"])
            .arg(&target),
        "restore with the new key",
    );
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::CONTENTS);
    let out = env
        .bare_cmd()
        .arg("-r")
        .arg(default_repo(&env))
        .env("CAIRN_PASSWORD", old.trim())
        .arg("snapshots")
        .output()
        .unwrap();
    assert_exit(&out, 1, "the old key after passwd");
}

/// Runs `cmd` to its end: its output, and the CPU time the process and its threads spent.
// The child is reaped by wait4, which std's `Child` does not know of.
#[allow(clippy::zombie_processes)]
fn output_and_cpu_time(cmd: &mut std::process::Command) -> (std::process::Output, Duration) {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            pipe.read_to_end(&mut bytes).unwrap();
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 reaps our own child, which nothing else
    // waits for (`child` is dropped without a wait).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut usage) }, pid);
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    let output = std::process::Output {
        status: std::process::ExitStatus::from_raw(status),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    (output, time(usage.ru_utime) + time(usage.ru_stime))
}

/// Writes into `keys/` a copy of `template` (a key file) with other Argon2 costs and salt,
/// named by its hash as cairn names key files: what anyone who can write there can do.
fn plant_key_file(repo: &Path, template: &Value, costs: (u64, u64, u64), n: u64) {
    let mut planted = template.clone();
    planted["params"] = serde_json::json!({
        "memory_kib": costs.0, "iterations": costs.1, "parallelism": costs.2
    });
    planted["host"] = format!("planted-{n}").into();
    let bytes = serde_json::to_vec_pretty(&planted).unwrap();
    let name = blake3::hash(&bytes).to_hex();
    fs::write(repo.join("keys").join(name.as_str()), bytes).unwrap();
}

#[test]
fn planted_key_files_with_huge_costs_are_not_paid_for_when_the_remembered_key_opens() {
    let env = TestEnv::with_repo();
    // `init` remembered the key file it wrote; `snapshots` opens with it: one derivation.
    let (out, one_derivation) = output_and_cpu_time(spawnable(&env).arg("snapshots"));
    assert_success(&out, "cairn snapshots");
    let template = stored_key_files(&env.repo).remove(0);
    assert_eq!(template["params"]["memory_kib"], 65536, "{template}");
    // The most the old caps accepted: minutes of Argon2 and 4 GiB per command.
    plant_key_file(&env.repo, &template, (4 << 20, 64, 64), 0);
    // Within the caps and cheaper than the real key, so tried before it by a client that
    // remembers nothing: more of them than a command may pay for.
    for n in 1..=70 {
        plant_key_file(&env.repo, &template, (32 << 10, 3, 4), n);
    }

    // In CPU time, which a loaded machine does not stretch as it does wall time. Trying
    // the planted files first would cost the search budget, 32 times the real key's work.
    let (out, cpu) = output_and_cpu_time(spawnable(&env).arg("snapshots"));
    assert_success(&out, "cairn snapshots with planted key files");
    assert!(
        cpu < 4 * one_derivation,
        "one derivation, not 70: {cpu:?} of CPU time, against {one_derivation:?} without the planted files"
    );

    // A client that remembers nothing pays a bounded amount and says why it stopped.
    let started = Instant::now();
    let out = env
        .cmd()
        .env("XDG_STATE_HOME", env.path("another-client"))
        .arg("snapshots")
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap();
    assert_exit(&out, 1, "cairn snapshots by a new client");
    let err = stderr(&out);
    assert!(err.contains("Stopped trying the key files"), "{err}");
    assert!(
        err.contains("remove the key files you do not know"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(100));
    // The one over the caps was refused unread, so it is not among those left untried
    // for cost; the real key (dearer than the planted ones) was not reached.
    let untried = err.split(" left (").nth(1).unwrap_or("");
    assert!(!untried.is_empty(), "{err}");
}

#[test]
fn a_new_local_repository_is_readable_by_its_owner_only() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_random_files(&src, 3, 10_000, 3);
    env.backup(&[&src], &[]);
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&env.repo), 0o700);
    for dir in ["keys", "data", "index", "snapshots"] {
        assert_eq!(mode(&env.repo.join(dir)), 0o700, "{dir}");
        for file in env.repo_files(dir) {
            assert_eq!(mode(&file), 0o600, "{}", file.display());
        }
    }
    assert_eq!(mode(&env.repo.join("config")), 0o600);
}

/// Two backups of different data, so forgetting the first leaves packs for prune.
fn two_backups(env: &TestEnv) {
    let src = env.path("src");
    write_random_files(&src, 4, 200_000, 4);
    env.backup(&[&src], &[]);
    fs::remove_dir_all(&src).unwrap();
    write_random_files(&src, 4, 200_000, 5);
    env.backup(&[&src], &[]);
}

fn forget_and_prune(env: &TestEnv) -> String {
    let out = run(
        env.cmd()
            .args(["forget", "--keep-last", "1", "--prune", "--max-unused", "0"]),
        "cairn forget --keep-last 1 --prune",
    );
    stderr(&out)
}

#[test]
fn an_older_copy_of_the_repository_put_back_in_its_place_is_warned_of() {
    let env = TestEnv::with_small_chunk_repo();
    two_backups(&env);
    assert_eq!(env.snapshots().len(), 2);
    let old = env.path("old-copy");
    copy_tree(&env.repo, &old);
    forget_and_prune(&env);
    assert_eq!(env.snapshots().len(), 1);

    // Whoever can write to the storage puts the old copy back.
    fs::remove_dir_all(&env.repo).unwrap();
    copy_tree(&old, &env.repo);
    let out = run(
        env.cmd().arg("snapshots"),
        "cairn snapshots after the rollback",
    );
    let err = stderr(&out);
    assert!(err.contains("rolled back"), "a warning on stderr: {err}");
    assert!(err.contains("are back in the repository"), "{err}");
    assert!(err.contains("trash is at generation"), "{err}");
    // JSON output stays clean; the warning is on stderr there too.
    let out = run(
        env.cmd().args(["snapshots", "--json"]),
        "cairn snapshots --json after the rollback",
    );
    parse_json(&out.stdout, "snapshots --json");
    assert!(stderr(&out).contains("rolled back"), "{}", stderr(&out));
}

/// A warning raised while the progress bar is on the terminal (rollback evidence, from a
/// backup's listing of the snapshots) is printed above the bar: the bar's line is erased
/// first, so the warning does not start in the middle of it (before, it followed the bar's
/// text on the same line). The terminal is `script`'s.
#[test]
fn a_warning_during_a_backup_on_a_terminal_is_printed_above_the_bar() {
    let env = TestEnv::with_small_chunk_repo();
    two_backups(&env);
    let old = env.path("old-copy");
    copy_tree(&env.repo, &old);
    forget_and_prune(&env);
    fs::remove_dir_all(&env.repo).unwrap();
    copy_tree(&old, &env.repo);

    let typescript = env.path("typescript");
    let line = format!(
        "'{}' -r '{}' backup '{}'",
        cairn_bin().display(),
        env.repo.display(),
        env.path("src").display()
    );
    let out = spawnable_program(&env, "script")
        // A terminal that draws: `console` hides the bar where TERM is unset or dumb.
        .env("TERM", "xterm")
        .args(["-qfec", &line])
        .arg(&typescript)
        .output()
        .unwrap();
    assert_success(&out, "cairn backup on script's terminal");
    let shown = fs::read(&typescript).unwrap();
    let warning = b"warning: the storage may have been rolled back";
    let at = shown
        .windows(warning.len())
        .position(|w| w == warning)
        .unwrap_or_else(|| panic!("no warning: {}", String::from_utf8_lossy(&shown)));
    // What the terminal shows before the warning on its line: the text after the last
    // carriage return, less escape sequences (cursor moves, erasures).
    let line_start = shown[..at]
        .iter()
        .rposition(|&b| b == b'\r' || b == b'\n')
        .map_or(0, |i| i + 1);
    let mut visible = Vec::new();
    let mut rest = shown[line_start..at].iter().copied().peekable();
    while let Some(b) = rest.next() {
        if b == 0x1b {
            // ESC [ parameters, then one final byte in @..~.
            if rest.next_if_eq(&b'[').is_some() {
                while rest.next().is_some_and(|c| !(0x40..=0x7e).contains(&c)) {}
            }
        } else {
            visible.push(b);
        }
    }
    assert!(
        visible.iter().all(|b| b.is_ascii_whitespace()),
        "the warning shares its line with {:?}",
        String::from_utf8_lossy(&visible)
    );
}

#[test]
fn no_rollback_no_warning() {
    let env = TestEnv::with_small_chunk_repo();
    two_backups(&env);
    let err = forget_and_prune(&env);
    assert!(!err.contains("warning"), "{err}");
    for args in [
        &["snapshots"][..],
        &["check"],
        &["forget", "--keep-last", "1"],
    ] {
        let out = run(env.cmd().args(args), &format!("cairn {args:?}"));
        assert!(
            !stderr(&out).contains("warning"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    let src = env.path("src");
    env.backup(&[&src], &[]);
    let out = run(env.cmd().arg("snapshots"), "cairn snapshots");
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
}

#[test]
fn an_unwritable_state_directory_is_one_warning_and_the_command_succeeds() {
    let env = TestEnv::with_repo();
    let blocked = env.path("blocked-state");
    fs::write(&blocked, b"a file where a directory should be").unwrap();
    let out = run(
        env.cmd().env("XDG_STATE_HOME", &blocked).arg("snapshots"),
        "cairn snapshots with an unwritable state directory",
    );
    let err = stderr(&out);
    assert_eq!(err.matches("warning:").count(), 1, "{err}");
    assert!(err.contains("cannot record"), "{err}");
}

#[test]
fn a_default_repository_made_before_still_opens_and_passwd_gives_it_a_key_without_stretching() {
    let env = TestEnv::new();
    // As cairn made it before: the key file's secret used as a password, stretched.
    let secret = "0123456789abcdef".repeat(4);
    fs::create_dir_all(env.root.join("config/cairn")).unwrap();
    fs::write(default_key(&env), format!("{secret}\n")).unwrap();
    run(
        env.bare_cmd()
            .env("CAIRN_PASSWORD", &secret)
            .arg("-r")
            .arg(default_repo(&env))
            .arg("init"),
        "a default repository as made before",
    );
    assert_eq!(stored_key_files(&default_repo(&env))[0]["kdf"], "argon2id");
    let src = first_default_backup(&env);
    run(
        unconfigured(&env).args(["key", "passwd"]),
        "cairn key passwd on an old default repository",
    );
    let stored = stored_key_files(&default_repo(&env));
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["kdf"], "blake3");
    let target = env.path("restored");
    run(
        unconfigured(&env)
            .args(["restore", "latest", "--target"])
            .arg(&target),
        "restore after the key was replaced",
    );
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::CONTENTS);
}

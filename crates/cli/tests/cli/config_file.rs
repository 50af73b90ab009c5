//! Named repositories from the config file: `cairn config repo add/list/remove/default`
//! edit `$XDG_CONFIG_HOME/cairn/config.toml`, and `-r @NAME`, `CAIRN_REPOSITORY=@NAME` or
//! the file's default open the named repository with its entry's password.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::*;

fn config_path(env: &TestEnv) -> PathBuf {
    env.root.join("config/cairn/config.toml")
}

/// `cairn` with neither a repository nor a password in the environment: whatever it
/// opens, it found through the config file.
fn cairn(env: &TestEnv) -> assert_cmd::Command {
    let mut cmd = env.bare_cmd();
    cmd.env_remove("CAIRN_PASSWORD")
        .env_remove("CAIRN_REPOSITORY");
    cmd
}

fn run_ok(cmd: &mut assert_cmd::Command, what: &str) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert_success(&out, what);
    out
}

fn run_fails(cmd: &mut assert_cmd::Command, what: &str) -> String {
    let out = cmd.output().unwrap();
    assert_exit(&out, 1, what);
    stderr(&out)
}

fn add(env: &TestEnv, args: &[&str]) {
    run_ok(
        cairn(env).args(["config", "repo", "add"]).args(args),
        &format!("cairn config repo add {args:?}"),
    );
}

fn list_json(env: &TestEnv) -> Vec<Value> {
    let out = run_ok(
        cairn(env).args(["config", "repo", "list", "--json"]),
        "cairn config repo list --json",
    );
    match parse_json(&out.stdout, "config repo list --json") {
        Value::Object(mut doc) => match doc.remove("repositories") {
            Some(Value::Array(items)) => items,
            other => panic!("config repo list --json has a repositories array, got {other:?}"),
        },
        other => panic!("config repo list --json prints an array, got {other}"),
    }
}

fn entry<'a>(list: &'a [Value], name: &str) -> &'a Value {
    list.iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("{name} is listed: {list:?}"))
}

fn password_file(env: &TestEnv, name: &str, password: &str) -> PathBuf {
    let path = env.path(name);
    write_file(&path, format!("{password}\n").as_bytes());
    path
}

fn source_tree(env: &TestEnv) -> PathBuf {
    let src = env.path("src");
    write_file(&src.join("a.txt"), b"alpha\n");
    write_file(&src.join("sub/b.bin"), &random_bytes(100_000, 7));
    src
}

/// Backs up `src` with `cairn ARGS backup`, then lists and restores it the same way, and
/// checks the snapshot landed in the test's repository.
fn backup_list_restore(env: &TestEnv, args: &[&str], src: &Path, what: &str) {
    let before = count_files(&env.repo.join("snapshots"));
    run_ok(
        cairn(env).args(args).arg("backup").arg(src),
        &format!("{what}: backup"),
    );
    assert_eq!(
        count_files(&env.repo.join("snapshots")),
        before + 1,
        "{what}: the snapshot is in the named repository"
    );
    let out = run_ok(
        cairn(env).args(args).args(["snapshots", "--json"]),
        &format!("{what}: snapshots"),
    );
    let snaps = parse_json(&out.stdout, "snapshots --json");
    assert_eq!(
        snaps["snapshots"].as_array().map(Vec::len),
        Some(before + 1),
        "{snaps}"
    );
    let target = env.path(&format!("restored-{before}"));
    run_ok(
        cairn(env)
            .args(args)
            .args(["restore", "latest", "--target"])
            .arg(&target),
        &format!("{what}: restore"),
    );
    assert_trees_equal(src, &restored_path(&target, src), Compare::CONTENTS);
}

#[test]
fn config_repo_add_list_default_remove_round_trip() {
    let env = TestEnv::new();
    let pw = password_file(&env, "pw", PASSWORD);
    add(
        &env,
        &[
            "nas",
            "sftp://backup@nas/srv/cairn",
            "--password-command",
            "pass show cairn",
        ],
    );
    add(
        &env,
        &[
            "usb",
            "/media/usb/cairn",
            "--password-file",
            pw.to_str().unwrap(),
            "--default",
        ],
    );

    let mode = fs::metadata(config_path(&env))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "the config file is private");

    let list = list_json(&env);
    assert_eq!(list.len(), 2, "{list:?}");
    assert_eq!(
        entry(&list, "nas")["address"],
        "sftp://backup@nas/srv/cairn"
    );
    assert_eq!(entry(&list, "nas")["password_command"], "pass show cairn");
    assert_eq!(entry(&list, "nas")["default"], false);
    assert_eq!(entry(&list, "usb")["password_file"], pw.to_str().unwrap());
    assert_eq!(entry(&list, "usb")["default"], true);

    let out = run_ok(
        cairn(&env).args(["config", "repo", "list"]),
        "config repo list",
    );
    let text = stdout(&out);
    let usb_line = text
        .lines()
        .find(|l| l.contains("usb"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        usb_line.contains("/media/usb/cairn") && usb_line.contains('*'),
        "{text}"
    );
    let nas_line = text
        .lines()
        .find(|l| l.contains("nas"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        nas_line.contains("pass show cairn") && !nas_line.contains('*'),
        "{text}"
    );

    run_ok(
        cairn(&env).args(["config", "repo", "default", "nas"]),
        "config repo default nas",
    );
    let out = run_ok(
        cairn(&env).args(["config", "repo", "default"]),
        "config repo default",
    );
    assert!(stdout(&out).contains("nas"), "{}", stdout(&out));
    assert_eq!(entry(&list_json(&env), "nas")["default"], true);
    assert_eq!(entry(&list_json(&env), "usb")["default"], false);

    let err = run_fails(
        cairn(&env).args(["config", "repo", "default", "nope"]),
        "config repo default of an unknown name",
    );
    assert!(err.contains("nope") && err.contains("nas, usb"), "{err}");

    run_ok(
        cairn(&env).args(["config", "repo", "remove", "nas"]),
        "config repo remove nas",
    );
    let list = list_json(&env);
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(
        entry(&list, "usb")["default"],
        false,
        "removing the default clears it"
    );
    let out = run_ok(
        cairn(&env).args(["config", "repo", "default", "--json"]),
        "default --json",
    );
    assert_eq!(
        parse_json(&out.stdout, "default --json")["default"],
        Value::Null
    );

    let err = run_fails(
        cairn(&env).args(["config", "repo", "remove", "nas"]),
        "config repo remove of a removed name",
    );
    assert!(err.contains("\"nas\"") && err.contains("usb"), "{err}");

    run_ok(
        cairn(&env).args(["config", "repo", "default", "usb"]),
        "default usb",
    );
    run_ok(
        cairn(&env).args(["config", "repo", "default", "--unset"]),
        "default --unset",
    );
    assert_eq!(entry(&list_json(&env), "usb")["default"], false);
}

#[test]
fn config_repo_add_checks_names_and_replaces_only_with_force() {
    let env = TestEnv::new();
    // An unreachable host: adding must not try to connect.
    add(&env, &["nas", "sftp://backup@nas.invalid/srv/cairn"]);
    let err = run_fails(
        cairn(&env).args(["config", "repo", "add", "nas", "/elsewhere"]),
        "adding an existing name",
    );
    assert!(err.contains("--force"), "{err}");
    assert_eq!(
        entry(&list_json(&env), "nas")["address"],
        "sftp://backup@nas.invalid/srv/cairn"
    );

    add(&env, &["nas", "/elsewhere", "--force"]);
    assert_eq!(entry(&list_json(&env), "nas")["address"], "/elsewhere");

    for bad in ["my nas", "a.b", "@x", ""] {
        let err = run_fails(
            cairn(&env).args(["config", "repo", "add", bad, "/x"]),
            &format!("adding the name {bad:?}"),
        );
        assert!(err.contains("name"), "{err}");
    }
    assert_eq!(list_json(&env).len(), 1);

    // A relative path is kept absolute: later commands run from other directories.
    add(&env, &["here", "rel/repo"]);
    assert_eq!(
        entry(&list_json(&env), "here")["address"],
        env.root.join("rel/repo").to_str().unwrap()
    );
}

#[test]
fn config_repo_list_json_gives_every_field() {
    let env = TestEnv::new();
    assert_eq!(
        list_json(&env),
        Vec::<Value>::new(),
        "no config file: no entries"
    );
    add(&env, &["plain", "/srv/plain"]);
    let list = list_json(&env);
    assert_eq!(
        list,
        vec![serde_json::json!({
            "name": "plain",
            "address": "/srv/plain",
            "default": false,
            "password_command": null,
            "password_file": null,
            "rest_token_file": null,
        })]
    );
}

#[test]
fn config_at_name_uses_the_entrys_password_file() {
    let env = TestEnv::with_repo();
    let pw = password_file(&env, "pw", PASSWORD);
    add(
        &env,
        &[
            "main",
            env.repo.to_str().unwrap(),
            "--password-file",
            pw.to_str().unwrap(),
        ],
    );
    let src = source_tree(&env);
    backup_list_restore(
        &env,
        &["-r", "@main"],
        &src,
        "-r @main with a password file",
    );

    // The same through the environment.
    let mut cmd = cairn(&env);
    cmd.env("CAIRN_REPOSITORY", "@main")
        .args(["snapshots", "--json"]);
    let out = run_ok(&mut cmd, "CAIRN_REPOSITORY=@main snapshots");
    assert_eq!(
        parse_json(&out.stdout, "snapshots")["snapshots"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
}

#[test]
fn config_at_name_uses_the_entrys_password_command() {
    let env = TestEnv::with_repo();
    let pw = password_file(&env, "secret", PASSWORD);
    let command = format!("cat '{}'", pw.display());
    add(
        &env,
        &[
            "main",
            env.repo.to_str().unwrap(),
            "--password-command",
            &command,
        ],
    );
    let src = source_tree(&env);
    backup_list_restore(
        &env,
        &["-r", "@main"],
        &src,
        "-r @main with a password command",
    );

    // The command really is what gives the password.
    fs::remove_file(&pw).unwrap();
    let err = run_fails(
        cairn(&env).args(["-r", "@main", "snapshots"]),
        "password command fails",
    );
    assert!(err.contains("password command"), "{err}");
}

#[test]
fn config_explicit_password_overrides_the_entrys() {
    let env = TestEnv::with_repo();
    let wrong = password_file(&env, "wrong", "not the password");
    let right = password_file(&env, "right", PASSWORD);
    add(
        &env,
        &[
            "main",
            env.repo.to_str().unwrap(),
            "--password-file",
            wrong.to_str().unwrap(),
        ],
    );

    run_fails(
        cairn(&env).args(["-r", "@main", "snapshots"]),
        "the entry's wrong password is used when nothing else is given",
    );
    let mut with_env = cairn(&env);
    with_env.env("CAIRN_PASSWORD", PASSWORD);
    run_ok(
        with_env.args(["-r", "@main", "snapshots"]),
        "CAIRN_PASSWORD wins",
    );
    run_ok(
        cairn(&env)
            .args(["-r", "@main", "snapshots", "--password-file"])
            .arg(&right),
        "--password-file wins",
    );
    let command = format!("cat '{}'", right.display());
    run_ok(
        cairn(&env).args(["-r", "@main", "snapshots", "--password-command", &command]),
        "--password-command wins",
    );
}

#[test]
fn config_default_name_is_used_without_dash_r() {
    let env = TestEnv::with_repo();
    let pw = password_file(&env, "pw", PASSWORD);
    add(
        &env,
        &[
            "main",
            env.repo.to_str().unwrap(),
            "--password-file",
            pw.to_str().unwrap(),
            "--default",
        ],
    );
    let src = source_tree(&env);
    backup_list_restore(&env, &[], &src, "no -r with a default in the config file");
    assert!(
        !env.root.join("data/cairn/default").exists(),
        "the built-in default repository is not created"
    );
    assert!(
        !env.root.join("config/cairn/default.key").exists(),
        "nor its key file"
    );

    // Without a default, the built-in default repository is back.
    run_ok(
        cairn(&env).args(["config", "repo", "default", "--unset"]),
        "default --unset",
    );
    run_ok(
        cairn(&env).arg("backup").arg(&src),
        "backup into the built-in default",
    );
    assert_eq!(
        count_files(&env.root.join("data/cairn/default/snapshots")),
        1
    );
    assert_eq!(
        count_files(&env.repo.join("snapshots")),
        1,
        "the named one is untouched"
    );
}

#[test]
fn config_unknown_name_error_names_the_file_and_the_known_names() {
    let env = TestEnv::with_repo();
    let path = config_path(&env);

    let err = run_fails(
        cairn(&env).args(["-r", "@nas", "snapshots"]),
        "-r @nas with no config file",
    );
    assert!(
        err.contains(path.to_str().unwrap()),
        "names the config file: {err}"
    );
    assert!(
        err.contains("cairn config repo add nas"),
        "says how to add it: {err}"
    );

    add(&env, &["alpha", "/srv/a"]);
    add(&env, &["beta", "/srv/b"]);
    let err = run_fails(
        cairn(&env).args(["-r", "@nas", "snapshots"]),
        "-r @nas, unknown",
    );
    assert!(
        err.contains(path.to_str().unwrap()),
        "names the config file: {err}"
    );
    assert!(
        err.contains("\"nas\"") && err.contains("alpha, beta"),
        "lists the names: {err}"
    );

    // A default naming no entry (a hand edit) is an error, not a silent fallback.
    fs::write(
        &path,
        "default = \"gone\"\n[repos.alpha]\naddress = \"/srv/a\"\n",
    )
    .unwrap();
    let err = run_fails(cairn(&env).arg("snapshots"), "a dangling default");
    assert!(err.contains("\"gone\"") && err.contains("alpha"), "{err}");
}

#[test]
fn config_malformed_file_is_an_error_naming_the_file() {
    let env = TestEnv::with_repo();
    let path = config_path(&env);
    write_file(
        &path,
        b"[repos.nas]\naddress = \"/srv/nas\"\n[repos.usb\naddress = 1\n",
    );
    for args in [
        &["-r", "@nas", "snapshots"][..],
        &["snapshots"][..],
        &["config", "repo", "list"][..],
        &["config", "repo", "add", "x", "/x"][..],
    ] {
        let err = run_fails(
            cairn(&env).args(args),
            &format!("{args:?} with a malformed config file"),
        );
        assert!(
            err.contains(path.to_str().unwrap()),
            "{args:?} names the file: {err}"
        );
        assert!(
            err.contains("line 3"),
            "{args:?} says where the TOML is wrong: {err}"
        );
    }
    assert_eq!(
        fs::read(&path).unwrap(),
        b"[repos.nas]\naddress = \"/srv/nas\"\n[repos.usb\naddress = 1\n",
        "the file is left as it was"
    );

    // A misspelt setting is named.
    write_file(
        &path,
        b"[repos.nas]\naddress = \"/srv/nas\"\npassword_file = \"/pw\"\n",
    );
    let err = run_fails(
        cairn(&env).args(["-r", "@nas", "snapshots"]),
        "a misspelt setting",
    );
    assert!(
        err.contains(path.to_str().unwrap()) && err.contains("password_file"),
        "{err}"
    );

    // An explicit address does not read the config file.
    run_ok(
        env.cmd().arg("snapshots"),
        "-r PATH with a malformed config file",
    );
}

#[test]
fn config_comments_survive_add_and_remove() {
    let env = TestEnv::new();
    let path = config_path(&env);
    let hand_written = "\
# My backups, kept by hand.

# The NAS in the basement.
[repos.nas]
address = \"sftp://backup@nas/srv/cairn\"   # through the VPN
password-command = \"pass show cairn\"

# The old disk: remove once it is copied.
[repos.old]
address = \"/mnt/old\"
";
    write_file(&path, hand_written.as_bytes());
    add(&env, &["usb", "/media/usb", "--default"]);
    run_ok(
        cairn(&env).args(["config", "repo", "remove", "old"]),
        "remove old",
    );

    let text = fs::read_to_string(&path).unwrap();
    for kept in [
        "# My backups, kept by hand.",
        "# The NAS in the basement.\n[repos.nas]\naddress = \"sftp://backup@nas/srv/cairn\"   # through the VPN\npassword-command = \"pass show cairn\"\n",
    ] {
        assert!(text.contains(kept), "{kept:?} is still in the file:\n{text}");
    }
    assert!(!text.contains("/mnt/old"), "old is gone:\n{text}");
    assert!(
        !text.contains("The old disk"),
        "with its own comment:\n{text}"
    );
    let list = list_json(&env);
    let names: Vec<&str> = list.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["nas", "usb"]);
    assert_eq!(entry(&list, "usb")["default"], true);

    // Replacing an entry keeps its comments too.
    add(&env, &["nas", "sftp://backup@nas2/srv/cairn", "--force"]);
    let text = fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("# The NAS in the basement.\n[repos.nas]\naddress = \"sftp://backup@nas2/srv/cairn\"   # through the VPN\n"),
        "{text}"
    );
    assert!(
        !text.contains("pass show cairn"),
        "--force replaces the whole entry:\n{text}"
    );
}

#[test]
fn config_repo_add_stores_only_the_password_options_given_to_it() {
    let env = TestEnv::new();
    let pw = password_file(&env, "env-pw", PASSWORD);
    let mut cmd = cairn(&env);
    cmd.env("CAIRN_PASSWORD_FILE", &pw)
        .env("CAIRN_PASSWORD_COMMAND", "echo nope")
        .args(["config", "repo", "add", "nas", "/srv/nas"]);
    run_ok(
        &mut cmd,
        "config repo add with password variables in the environment",
    );
    let list = list_json(&env);
    assert_eq!(
        entry(&list, "nas")["password_file"],
        Value::Null,
        "{list:?}"
    );
    assert_eq!(
        entry(&list, "nas")["password_command"],
        Value::Null,
        "{list:?}"
    );

    let typed = password_file(&env, "typed-pw", PASSWORD);
    let mut cmd = cairn(&env);
    cmd.env("CAIRN_PASSWORD_FILE", &pw)
        .env("CAIRN_PASSWORD_COMMAND", "echo nope")
        .args([
            "config",
            "repo",
            "add",
            "usb",
            "/srv/usb",
            "--password-file",
        ])
        .arg(&typed);
    run_ok(
        &mut cmd,
        "config repo add --password-file with password variables set",
    );
    let list = list_json(&env);
    assert_eq!(
        entry(&list, "usb")["password_file"],
        typed.to_str().unwrap(),
        "{list:?}"
    );
    assert_eq!(
        entry(&list, "usb")["password_command"],
        Value::Null,
        "{list:?}"
    );
}

/// r21.10: a CAIRN_PASSWORD left in the environment silently won over an `@NAME`
/// entry's password file; the "wrong password" error now says which source it used.
#[test]
fn an_environment_password_over_an_entry_is_said_and_named_when_wrong() {
    let env = TestEnv::with_repo();
    let pw = env.path("nas.pass");
    fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    add(
        &env,
        &[
            "nas",
            env.repo.to_str().unwrap(),
            "--password-file",
            pw.to_str().unwrap(),
        ],
    );
    let out = cairn(&env)
        .env("CAIRN_PASSWORD", "stale password")
        .args(["-r", "@nas", "snapshots"])
        .output()
        .unwrap();
    assert_exit(&out, 1, "a wrong CAIRN_PASSWORD over the entry's file");
    let err = stderr(&out);
    assert!(
        err.contains("not the config file's password file")
            && err.contains("Wrong password")
            && err.contains("came from CAIRN_PASSWORD"),
        "{err}"
    );
}

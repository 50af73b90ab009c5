//! `--host`, `--tag` and `--path` on every command that takes a snapshot: `latest` is
//! the newest of the snapshots they select, and lists show only those.

use serde_json::Value;

use crate::common::*;

/// Two trees backed up as two hosts, alpha's first: `latest` alone is beta's.
fn two_hosts(env: &TestEnv) -> (std::path::PathBuf, std::path::PathBuf) {
    let a = env.path("srv/alpha");
    let b = env.path("srv/beta");
    write_file(&a.join("newfile.txt"), b"alpha's file\n");
    write_file(&b.join("other.txt"), b"beta's file\n");
    env.backup(&[&a], &["--host", "alpha", "--tag", "daily,db"]);
    env.backup(&[&b], &["--host", "beta", "--tag", "daily"]);
    (a, b)
}

fn run(env: &TestEnv, args: &[&str]) -> std::process::Output {
    let out = env.cmd().args(args).output().unwrap();
    assert_success(&out, &format!("cairn {args:?}"));
    out
}

fn hosts_of(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|s| s["host"].as_str().unwrap().to_string())
        .collect()
}

/// r21.1: after a backup of another host, `restore latest:PATH` failed with "is not in
/// snapshot" and the mount's `latest` was the other host's.
#[test]
fn latest_is_the_newest_snapshot_the_filters_select() {
    let env = TestEnv::with_repo();
    let (a, b) = two_hosts(&env);
    let file = a.join("newfile.txt");
    let file = file.to_str().unwrap();

    let out = run(&env, &["cat", "--host", "alpha", "latest", file]);
    assert_eq!(out.stdout, b"alpha's file\n");
    let out = env.cmd().args(["cat", "latest", file]).output().unwrap();
    assert_exit(&out, 1, "cat latest without a filter is beta's snapshot");

    let target = env.path("restored");
    let spec = format!("latest:{file}");
    env.restore(&spec, &target, &["--host", "alpha"]);
    assert_eq!(
        std::fs::read(target.join("newfile.txt")).unwrap(),
        b"alpha's file\n"
    );

    let out = run(&env, &["ls", "--tag", "daily,db", "latest", "--recursive"]);
    assert!(stdout(&out).contains("newfile.txt"), "{}", stdout(&out));
    let out = run(
        &env,
        &["ls", "--path", b.to_str().unwrap(), "latest", "--recursive"],
    );
    assert!(stdout(&out).contains("other.txt"), "{}", stdout(&out));
    let out = run(&env, &["dump", "--host", "alpha", "latest", file]);
    assert_eq!(out.stdout, b"alpha's file\n");

    let out = run(&env, &["find", "--json", "--host", "beta", "*.txt"]);
    let found = parse_json(&out.stdout, "find --json");
    let paths: Vec<&str> = found["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    assert!(
        paths.len() == 1 && paths[0].ends_with("other.txt"),
        "{paths:?}"
    );

    // `diff latest DIR` compares with the filtered latest: nothing changed in alpha's tree.
    let out = run(
        &env,
        &["diff", "--host", "alpha", "latest", a.to_str().unwrap()],
    );
    assert!(
        stdout(&out).starts_with("0 added, 0 removed"),
        "{}",
        stdout(&out)
    );

    // No snapshot selected: the error says which filter.
    let out = env
        .cmd()
        .args(["ls", "--host", "gamma", "latest"])
        .output()
        .unwrap();
    assert_exit(&out, 1, "ls --host gamma latest");
    assert!(stderr(&out).contains("--host gamma"), "{}", stderr(&out));
}

#[test]
fn snapshots_filters_groups_and_shows_the_latest_of_each_group() {
    let env = TestEnv::with_repo();
    let (a, _) = two_hosts(&env);
    env.backup(&[&a], &["--host", "alpha"]);

    let json = |args: &[&str]| {
        let mut all = vec!["snapshots", "--json"];
        all.extend_from_slice(args);
        parse_json(&run(&env, &all).stdout, "snapshots --json")
    };
    let hosts_of = |doc: &Value| hosts_of(&doc["snapshots"]);
    assert_eq!(hosts_of(&json(&["--host", "alpha"])), ["alpha", "alpha"]);
    assert_eq!(hosts_of(&json(&["--tag", "db"])), ["alpha"]);
    assert_eq!(hosts_of(&json(&["--tag", "db", "--tag", "daily"])).len(), 2);
    assert_eq!(hosts_of(&json(&["--latest", "1"])), ["beta", "alpha"]);

    let groups = json(&["--group-by", "host"]);
    let groups = groups["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{groups:?}");
    assert_eq!(groups[0]["group"]["host"], "alpha");
    assert_eq!(groups[0]["snapshots"].as_array().unwrap().len(), 2);

    let out = run(
        &env,
        &["snapshots", "--compact", "--latest", "1", "--host", "beta"],
    );
    let text = stdout(&out);
    assert!(text.ends_with("1 snapshot\n"), "{text}");
    assert!(
        !text.contains("Paths"),
        "compact has no paths column: {text}"
    );
}

#[test]
fn forget_and_copy_act_only_on_the_selected_snapshots() {
    let env = TestEnv::with_repo();
    two_hosts(&env);

    let out = run(
        &env,
        &[
            "forget",
            "--host",
            "beta",
            "--keep-last",
            "1",
            "--group-by",
            "",
        ],
    );
    assert!(
        stdout(&out).contains("removed 0 snapshots"),
        "{}",
        stdout(&out)
    );
    run(&env, &["forget", "--host", "alpha", "latest"]);
    assert_eq!(hosts_of(&Value::Array(env.snapshots())), ["beta"]);

    let other = env.path("other");
    let other_cmd = || {
        let mut c = env.bare_cmd();
        c.arg("-r").arg(&other);
        c
    };
    assert_success(&other_cmd().arg("init").output().unwrap(), "init other");
    let pw = env.path("pw");
    std::fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    let copy = |host: &str| {
        let out = other_cmd()
            .args(["copy", "--json", "--from-repo"])
            .arg(&env.repo)
            .arg("--from-password-file")
            .arg(&pw)
            .args(["--host", host])
            .output()
            .unwrap();
        assert_success(&out, "copy --host");
        parse_json(&out.stdout, "copy --json")
    };
    assert_eq!(copy("alpha")["copied"].as_array().unwrap().len(), 0);
    assert_eq!(copy("beta")["copied"].as_array().unwrap().len(), 1);
}

/// r21.5: `--tag a,b` made one tag "a,b", and `forget --keep-tag a` then removed it.
#[test]
fn backup_tags_split_on_commas() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f"), b"f");
    env.backup(&[&src], &["--tag", "a,b", "--tag", "c"]);
    let tags = &env.snapshots()[0]["tags"];
    assert_eq!(tags, &serde_json::json!(["a", "b", "c"]));
    env.backup(&[&src], &[]);
    run(&env, &["forget", "--keep-tag", "a"]);
    assert_eq!(env.snapshots().len(), 1, "the tagged snapshot is kept");
}

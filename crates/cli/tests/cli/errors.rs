//! Mistakes a user makes: each exits 1 with a message on stderr naming what is wrong,
//! and changes nothing.

use std::fs;

use crate::common::*;

fn backed_up_env() -> (TestEnv, std::path::PathBuf) {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f.txt"), b"contents\n");
    env.backup(&[&src], &[]);
    (env, src)
}

#[test]
fn a_wrong_password_is_refused_with_a_message_about_the_password() {
    let (env, src) = backed_up_env();
    for args in [vec!["snapshots"], vec!["backup", src.to_str().unwrap()]] {
        let out = env
            .cmd()
            .env("CAIRN_PASSWORD", "not the password")
            .args(&args)
            .output()
            .unwrap();
        assert_exit(&out, 1, &format!("cairn {args:?} with a wrong password"));
        assert!(
            stderr(&out).to_lowercase().contains("password"),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(
        env.snapshots().len(),
        1,
        "the failed backup wrote no snapshot"
    );
}

#[test]
fn a_repo_path_that_is_not_a_repository_is_named_in_the_error() {
    let env = TestEnv::new();
    let not_repo = env.path("just a dir");
    write_file(&not_repo.join("some file"), b"x");
    let out = env
        .bare_cmd()
        .arg("-r")
        .arg(&not_repo)
        .arg("snapshots")
        .output()
        .unwrap();
    assert_exit(&out, 1, "cairn -r NOT_A_REPO snapshots");
    assert!(
        stderr(&out).contains(not_repo.to_str().unwrap()),
        "{}",
        stderr(&out)
    );

    let missing = env.path("does-not-exist");
    let out = env
        .bare_cmd()
        .arg("-r")
        .arg(&missing)
        .arg("snapshots")
        .output()
        .unwrap();
    assert_exit(&out, 1, "cairn -r MISSING snapshots");
    assert!(
        stderr(&out).contains(missing.to_str().unwrap()),
        "{}",
        stderr(&out)
    );
    assert!(
        !missing.exists(),
        "reading commands do not create a repository"
    );
}

#[test]
fn a_repository_of_a_newer_format_version_is_refused() {
    let (env, src) = backed_up_env();
    let path = env.repo.join("config");
    let mut config = parse_json(&fs::read(&path).unwrap(), "config");
    config["version"] = serde_json::json!(99);
    fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();

    for args in [vec!["snapshots"], vec!["backup", src.to_str().unwrap()]] {
        let out = env.cmd().args(&args).output().unwrap();
        assert_exit(
            &out,
            1,
            &format!("cairn {args:?} on a version-99 repository"),
        );
        assert!(
            stderr(&out).to_lowercase().contains("version"),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(env.repo_files("snapshots").len(), 1, "nothing was written");
}

#[test]
fn restore_into_a_non_empty_target_without_overwrite_is_refused() {
    let (env, src) = backed_up_env();
    let target = env.path("target");
    write_file(&target.join("precious.txt"), b"mine\n");
    let out = env
        .cmd()
        .args(["restore", "latest", "--target"])
        .arg(&target)
        .output()
        .unwrap();
    assert_exit(&out, 1, "restore into a non-empty target");
    assert!(stderr(&out).contains("--overwrite"), "{}", stderr(&out));
    assert_eq!(fs::read(target.join("precious.txt")).unwrap(), b"mine\n");
    assert!(
        !restored_path(&target, &src).exists(),
        "nothing was restored"
    );
}

#[test]
fn a_snapshot_id_that_matches_nothing_is_named_in_the_error() {
    let (env, src) = backed_up_env();
    let id = env.snapshots()[0]["id"].as_str().unwrap().to_string();
    // A prefix that differs from the only snapshot in its first digit.
    let bogus = if id.starts_with('0') {
        "1abc2def"
    } else {
        "0abc2def"
    };
    let target = env.path("target");
    let runs: Vec<Vec<std::ffi::OsString>> = vec![
        vec![
            "restore".into(),
            bogus.into(),
            "--target".into(),
            target.clone().into(),
        ],
        vec!["cat".into(), bogus.into(), src.join("f.txt").into()],
        vec!["ls".into(), bogus.into()],
    ];
    for args in runs {
        let out = env.cmd().args(&args).output().unwrap();
        assert_exit(&out, 1, &format!("cairn {args:?}"));
        assert!(
            stderr(&out).contains(bogus),
            "stderr names {bogus}: {}",
            stderr(&out)
        );
    }
    assert!(
        !target.exists() || fs::read_dir(&target).unwrap().next().is_none(),
        "nothing restored"
    );
}

#[test]
fn latest_in_an_empty_repository_is_an_error() {
    let env = TestEnv::with_repo();
    let out = env.cmd().args(["ls", "latest"]).output().unwrap();
    assert_exit(&out, 1, "cairn ls latest with no snapshots");
    assert!(!stderr(&out).trim().is_empty());
}

#[test]
fn backup_without_any_source_path_is_an_error() {
    let env = TestEnv::with_repo();
    let out = env.cmd().arg("backup").output().unwrap();
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        env.repo_files("snapshots").is_empty(),
        "no snapshot written"
    );
}

/// Plain HTTP to an S3 server off this machine is refused before any request, with a
/// message that says how to opt in; the address is from TEST-NET-1 (RFC 5737), and is
/// never contacted.
#[test]
fn s3_over_plain_http_needs_an_opt_in() {
    let env = TestEnv::new();
    for command in [&["init"][..], &["snapshots"]] {
        let out = env
            .bare_cmd()
            .env_remove("CAIRN_S3_ALLOW_HTTP")
            .args(["-r", "s3:http://192.0.2.1:9000/bucket/repo"])
            .args(command)
            .timeout(std::time::Duration::from_secs(20))
            .output()
            .unwrap();
        assert_exit(&out, 1, &format!("cairn {command:?} on s3:http://"));
        let err = stderr(&out);
        assert!(
            err.contains("plain HTTP") && err.contains("CAIRN_S3_ALLOW_HTTP=1"),
            "{err}"
        );
    }
}

/// r21.9: `-r /nonexistent snapshots` asked for a password, then said it was not a
/// repository.
#[test]
fn a_missing_repository_is_named_before_any_password_is_asked() {
    let env = TestEnv::new();
    let out = unconfigured(&env)
        .arg("-r")
        .arg(env.path("nonexistent"))
        .arg("snapshots")
        .output()
        .unwrap();
    assert_exit(&out, 1, "snapshots of a missing repository");
    let err = stderr(&out);
    assert!(
        err.contains("is not a cairn repository") && !err.contains("password"),
        "{err}"
    );
}

/// A path missing from a snapshot is reported with the snapshot's id, which the user can
/// type back, not its time, by every command that looks a path up.
#[test]
fn a_missing_path_error_names_the_snapshot_by_its_id() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("a.txt"), b"a");
    let id = env.backup_id(&[&src], &[]);
    let missing = src.join("b.txt");
    let missing = missing.to_str().unwrap();
    let target = env.path("t");
    let spec = format!("latest:{missing}");
    let target = target.to_str().unwrap();
    for args in [
        vec!["ls", "latest", missing],
        vec!["cat", "latest", missing],
        vec!["dump", "latest", missing],
        vec!["restore", &spec, "--target", target],
        vec!["restore", &spec, "--target", target, "--dry-run"],
    ] {
        let out = env.cmd().args(&args).output().unwrap();
        assert_exit(&out, 1, &args.join(" "));
        let err = stderr(&out);
        assert!(
            err.contains(&format!("is not in snapshot {}", &id[..8])),
            "{args:?}: {err}"
        );
    }
}

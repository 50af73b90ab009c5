//! The zero-configuration path: `cairn backup DIR` with no repository and no password
//! creates a default repository and a random key, and later commands find both.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::*;

/// Every file under $XDG_CONFIG_HOME/cairn.
fn config_files(env: &TestEnv) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&env.root.join("config/cairn"), &mut out);
    out
}

/// The key file: the file under $XDG_CONFIG_HOME/cairn whose path the first backup printed.
fn key_file(env: &TestEnv, first_backup_stderr: &str) -> PathBuf {
    let named: Vec<PathBuf> = config_files(env)
        .into_iter()
        .filter(|p| first_backup_stderr.contains(p.to_str().unwrap()))
        .collect();
    assert_eq!(
        named.len(),
        1,
        "stderr names exactly one file under $XDG_CONFIG_HOME/cairn as the key \
         (files there: {:?}); stderr: {first_backup_stderr}",
        config_files(env)
    );
    named[0].clone()
}

fn first_backup(env: &TestEnv) -> (PathBuf, std::process::Output) {
    let src = build_rich_tree(&env.path("src"));
    let out = unconfigured(env).arg("backup").arg(&src).output().unwrap();
    assert_success(&out, "cairn backup DIR with no repository and no password");
    (src, out)
}

#[test]
fn first_backup_creates_the_default_repository_and_a_private_key_file() {
    let env = TestEnv::new();
    let (_, out) = first_backup(&env);
    let repo = default_repo(&env);
    let config = parse_json(
        &fs::read(repo.join("config")).unwrap(),
        "default repository config",
    );
    assert_eq!(config["version"], cairn_core::config::FORMAT_VERSION);
    assert_eq!(
        count_files(&repo.join("snapshots")),
        1,
        "one snapshot in the default repository"
    );

    let err = stderr(&out);
    let key = key_file(&env, &err);
    let mode = fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the key file {} is private", key.display());
    assert!(
        !fs::read(&key).unwrap().is_empty(),
        "the key file holds a key"
    );

    let lower = err.to_lowercase();
    assert!(
        ["without", "lose", "lost", "cannot", "can't"]
            .iter()
            .any(|w| lower.contains(w)),
        "stderr warns that the backup cannot be restored without the key: {err}"
    );
}

#[test]
fn later_commands_use_the_default_repository_without_asking_for_a_password() {
    let env = TestEnv::new();
    let (src, out) = first_backup(&env);
    let key_path = key_file(&env, &stderr(&out));
    let key = fs::read(&key_path).unwrap();

    write_file(&src.join("later.txt"), b"second backup\n");
    let out = unconfigured(&env).arg("backup").arg(&src).output().unwrap();
    assert_success(&out, "second cairn backup with the default repository");
    assert_eq!(fs::read(&key_path).unwrap(), key, "the key is not replaced");

    let out = unconfigured(&env)
        .args(["snapshots", "--json"])
        .output()
        .unwrap();
    assert_success(&out, "cairn snapshots with the default repository");
    let snaps = parse_json(&out.stdout, "snapshots --json");
    assert_eq!(
        snaps["snapshots"].as_array().map(Vec::len),
        Some(2),
        "{snaps}"
    );

    let target = env.path("restored");
    let out = unconfigured(&env)
        .args(["restore", "latest", "--target"])
        .arg(&target)
        .output()
        .unwrap();
    assert_success(&out, "cairn restore latest with the default repository");
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);
}

#[test]
fn without_its_key_file_the_default_repository_cannot_be_opened() {
    let env = TestEnv::new();
    first_backup(&env);
    for file in config_files(&env) {
        fs::remove_file(file).unwrap();
    }
    let out = unconfigured(&env).arg("snapshots").output().unwrap();
    assert_exit(&out, 1, "cairn snapshots after the key file was deleted");
    assert!(!stderr(&out).trim().is_empty());
    assert_eq!(
        count_files(&default_repo(&env).join("snapshots")),
        1,
        "the repository is untouched"
    );
}

#[test]
fn the_default_repository_is_not_used_when_a_repository_is_given() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f"), b"f");
    env.backup(&[&src], &[]);
    assert!(
        !default_repo(&env).exists(),
        "an explicit -r does not create the default repository"
    );
    assert!(config_files(&env).is_empty(), "nor a key file");
}

/// r21.4: with CAIRN_PASSWORD set and no repository given (a cron job that lost its
/// CAIRN_REPOSITORY), the default repository was created without a word.
#[test]
fn creating_the_default_repository_is_said_whatever_the_password_source() {
    let env = TestEnv::new();
    let src = env.path("src");
    write_file(&src.join("f"), b"f");
    let out = unconfigured(&env)
        .env("CAIRN_PASSWORD", PASSWORD)
        .arg("backup")
        .arg(&src)
        .output()
        .unwrap();
    assert_success(&out, "backup into the default repository");
    let err = stderr(&out);
    assert!(
        err.contains("Created the default repository")
            && err.contains(default_repo(&env).to_str().unwrap()),
        "{err}"
    );
}

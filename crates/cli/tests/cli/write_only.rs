//! Keys that write but cannot read (format 3, `cairn key add --write-only`), as a user
//! meets them: a machine backs up with one, incrementally, and can do nothing else; the
//! owner's full key restores everything it wrote; prune verifies the writer's packs once,
//! after which full keys deduplicate against them.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::*;

const WRITER_PASSWORD: &str = "the laptop's write-only password";

/// `cairn key add --write-only` with `password`, run by `owner` (a full key).
pub(crate) fn add_write_only_key(owner: &TestEnv, password: &str) {
    let pw = owner.path("write-only.pw");
    fs::write(&pw, password).unwrap();
    let out = owner
        .cmd()
        .args(["key", "add", "--write-only", "--new-password-file"])
        .arg(&pw)
        .output()
        .unwrap();
    assert_success(&out, "key add --write-only");
    assert!(stdout(&out).contains("write-only"), "{}", stdout(&out));
}

/// A repository with a write-only key; returns the writer's environment (the same
/// repository and cache, the write-only password).
fn with_writer(env: &TestEnv) -> TestEnv {
    add_write_only_key(env, WRITER_PASSWORD);
    as_writer(env)
}

fn as_writer(env: &TestEnv) -> TestEnv {
    let mut writer = TestEnv::new();
    writer.repo = env.repo.clone();
    writer.vars = env.vars.clone();
    writer
        .vars
        .push(("CAIRN_PASSWORD".into(), WRITER_PASSWORD.into()));
    writer
}

/// A copy of `src` as it is now, to compare a restore with later.
fn keep_copy(env: &TestEnv, src: &Path, name: &str) -> PathBuf {
    let copy = env.path(name);
    copy_tree(src, &copy);
    copy
}

#[test]
fn a_write_only_key_backs_up_incrementally_and_can_do_nothing_else() {
    let env = TestEnv::with_small_chunk_repo();
    let writer = with_writer(&env);
    let src = env.path("src");
    write_random_files(&src, 6, 300_000, 1);
    fs::write(src.join("notes.txt"), "first").unwrap();
    let first = writer.backup(&[&src], &[]);
    let first_copy = keep_copy(&env, &src, "first");
    assert!(first["blobs_added"].as_u64().unwrap() > 6, "{first}");

    // The second backup finds unchanged files through its own memory of the first.
    fs::write(src.join("notes.txt"), "second").unwrap();
    let second = writer.backup(&[&src], &[]);
    assert_eq!(second["files_unchanged"], 6, "{second}");
    assert_eq!(second["files_changed"], 1, "{second}");
    assert_eq!(
        second["bytes_read"], 6,
        "only the changed file is read: {second}"
    );

    // Everything but backing up is refused, naming the kind of key.
    let restore_target = env.path("never");
    let target = restore_target.to_str().unwrap();
    for args in [
        &["snapshots"][..],
        &["ls", "latest"],
        &["restore", "latest", "--target", target],
        &["dump", "latest", "/"],
        &["find", "notes.txt"],
        &["diff", "latest", "latest"],
        &["stats"],
        &["forget", "--keep-last", "1"],
        &["prune"],
        &["repair", "index"],
    ] {
        let out = writer.cmd().args(args).output().unwrap();
        assert_exit(&out, 1, &format!("{args:?} with a write-only key"));
        assert!(
            stderr(&out).contains("write-only key"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert!(!restore_target.exists());
    let keys = env.cmd().args(["key", "list", "--json"]).output().unwrap();
    let keys = parse_json(&keys.stdout, "key list --json")["keys"].clone();
    let full_key = keys
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["current"] == true)
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        keys.as_array()
            .unwrap()
            .iter()
            .filter(|k| k["write_only"] == true)
            .count(),
        1,
        "key list says which key is write-only: {keys}"
    );
    let out = writer
        .cmd()
        .args(["key", "remove", &full_key])
        .output()
        .unwrap();
    assert_exit(&out, 1, "a write-only key removing the full key");
    assert_eq!(
        parse_json(
            &env.cmd()
                .args(["key", "list", "--json"])
                .output()
                .unwrap()
                .stdout,
            "key list"
        )["keys"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // It can check every file against its name, and finds a flipped byte.
    let out = writer
        .cmd()
        .args(["check", "--read-data"])
        .output()
        .unwrap();
    assert_success(&out, "check --read-data with a write-only key");
    assert!(stdout(&out).contains("write-only key"), "{}", stdout(&out));
    let snapshot_file = env.repo_files("snapshots").remove(0);
    let original = fs::read(&snapshot_file).unwrap();
    let mut damaged = original.clone();
    damaged[40] ^= 1;
    fs::write(&snapshot_file, &damaged).unwrap();
    let out = writer.cmd().arg("check").output().unwrap();
    assert_exit(
        &out,
        1,
        "check of a damaged snapshot file with a write-only key",
    );
    assert!(
        stdout(&out).contains("problem: snapshots/"),
        "{}",
        stdout(&out)
    );
    fs::write(&snapshot_file, &original).unwrap();

    // The owner's full key reads all of it.
    assert_check_clean(&env, &["--read-data"], "writer's packs");
    let ids: Vec<String> = [&first, &second]
        .iter()
        .map(|s| s["snapshot_id"].as_str().unwrap().to_string())
        .collect();
    assert_snapshot_restores(&env, &ids[0], &src, &first_copy, Compare::CONTENTS);
    assert_snapshot_restores(&env, &ids[1], &src, &src, Compare::CONTENTS);

    // Prune verifies the writer's packs; then a full key's backup of the same files
    // builds on them, and the writer still does too.
    let out = env.cmd().arg("prune").output().unwrap();
    assert_success(&out, "prune with the full key");
    assert!(
        stdout(&out).contains("write-only keys verified"),
        "{}",
        stdout(&out)
    );
    // A copy elsewhere has no parent snapshot: every byte is read and deduplicated.
    let elsewhere = keep_copy(&env, &src, "elsewhere");
    let full = env.backup(&[&elsewhere], &[]);
    assert_eq!(full["bytes_read"], full["total_bytes"], "{full}");
    assert!(
        full["raw_bytes_added"].as_u64().unwrap() < 100_000,
        "only trees are new, the data is the writer's: {full}"
    );
    let third = writer.backup(&[&src], &[]);
    assert_eq!(third["files_unchanged"], 7, "{third}");
    assert_check_clean(&env, &["--read-data"], "after prune");
}

/// Whoever can write to the storage cannot make a write-only key follow other settings:
/// it compares the config with the settings it was made with.
#[test]
fn a_write_only_key_refuses_a_config_whose_settings_changed() {
    let env = TestEnv::with_repo();
    let writer = with_writer(&env);
    let src = env.path("src");
    write_random_files(&src, 1, 10_000, 2);
    writer.backup(&[&src], &[]);
    let path = env.repo.join("config");
    let original = fs::read(&path).unwrap();
    let mut config: serde_json::Value = serde_json::from_slice(&original).unwrap();
    config["pack_size"] = 1_048_576.into();
    fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    let out = writer.cmd().arg("backup").arg(&src).output().unwrap();
    assert_exit(&out, 1, "a write-only backup after the config changed");
    assert!(
        stderr(&out).contains("not the ones this write-only key was made for"),
        "{}",
        stderr(&out)
    );
    fs::write(&path, &original).unwrap();
    writer.backup(&[&src], &[]);
}

/// The client's memory is a convenience: without it, the next backup reads and uploads
/// everything again, and nothing is wrong.
#[test]
fn a_lost_client_memory_costs_one_full_upload_and_nothing_else() {
    let env = TestEnv::with_small_chunk_repo();
    let writer = with_writer(&env);
    let src = env.path("src");
    write_random_files(&src, 3, 200_000, 3);
    writer.backup(&[&src], &[]);
    let cache = writer.path("home/.cache/cairn");
    assert!(
        cache.is_dir(),
        "the writer keeps its memory under the cache"
    );
    fs::remove_dir_all(&cache).unwrap();
    let again = writer.backup(&[&src], &[]);
    assert_eq!(again["files_new"], 3, "{again}");
    assert_eq!(again["bytes_read"], 600_000, "{again}");
    assert_check_clean(&env, &["--read-data"], "after the memory was lost");
    assert_snapshot_restores(&env, "latest", &src, &src, Compare::CONTENTS);
}

/// Packs the writer remembers but that are gone from the storage (a full key forgot its
/// snapshots and pruned) are forgotten when its next backup starts: it stores the data
/// again rather than writing a snapshot that names missing packs.
#[test]
fn a_writer_forgets_packs_that_prune_deleted_and_stores_their_data_again() {
    let env = TestEnv::with_small_chunk_repo();
    let writer = with_writer(&env);
    let src = env.path("src");
    write_random_files(&src, 3, 200_000, 4);
    let first = writer.backup(&[&src], &[]);
    let out = env
        .cmd()
        .env("CAIRN_GRACE_SECS", "0")
        .args(["forget", "--prune"])
        .arg(first["snapshot_id"].as_str().unwrap())
        .output()
        .unwrap();
    assert_success(&out, "forget --prune of the writer's only snapshot");
    assert!(env.repo_files("data").is_empty(), "its packs are gone");
    let again = writer.backup(&[&src], &[]);
    assert_eq!(again["files_unchanged"], 0, "{again}");
    assert_eq!(again["bytes_read"], 600_000, "{again}");
    // Forgotten at the start, not found gone by the check before the snapshot (which
    // would also store them again, a round later).
    assert_eq!(again["packs_replaced"], 0, "{again}");
    assert_check_clean(
        &env,
        &["--read-data"],
        "after the writer stored its data again",
    );
    assert_snapshot_restores(&env, "latest", &src, &src, Compare::CONTENTS);
}

/// Format 2 repositories have no recovery key pair: the error says how to get one.
#[test]
fn a_format_2_repository_says_how_to_get_write_only_keys() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/repos/v2");
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(fixture.join("manifest.json")).unwrap()).unwrap();
    let mut env = TestEnv::new();
    copy_tree(&fixture.join("repo"), &env.repo);
    env.vars.push((
        "CAIRN_PASSWORD".into(),
        manifest["password"].as_str().unwrap().into(),
    ));
    let pw = env.path("w.pw");
    fs::write(&pw, "x").unwrap();
    let out = env
        .cmd()
        .args(["key", "add", "--write-only", "--new-password-file"])
        .arg(&pw)
        .output()
        .unwrap();
    assert_exit(&out, 1, "write-only key on format 2");
    assert!(
        stderr(&out).contains("format 3") && stderr(&out).contains("cairn copy"),
        "{}",
        stderr(&out)
    );
}

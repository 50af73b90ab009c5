//! `tag` and `rewrite`: new versions of existing snapshots, keeping their time and naming
//! their original.

use std::path::Path;

use serde_json::Value;

use crate::common::*;

fn by_id<'a>(snaps: &'a [Value], id: &str) -> Option<&'a Value> {
    snaps.iter().find(|s| s["id"] == id)
}

fn tags_of(s: &Value) -> Vec<String> {
    let tags = s["tags"].as_array().cloned().unwrap_or_default();
    tags.iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

fn run_ok(env: &TestEnv, args: &[&str]) -> String {
    let out = env.cmd().args(args).output().unwrap();
    assert_success(&out, &format!("cairn {args:?}"));
    stdout(&out)
}

#[test]
fn tag_adds_removes_and_sets_tags_keeping_time_and_naming_the_original() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f.txt"), b"tagged\n");
    let first = env.backup_id(&[&src], &["--tag", "daily"]);
    let second = env.backup_id(&[&src], &["--tag", "daily,keep"]);
    let before = env.snapshots();
    let first_time = by_id(&before, &first).unwrap()["time"].clone();

    run_ok(
        &env,
        &["tag", &first, "--add", "audit,daily", "--remove", "nothing"],
    );
    let snaps = env.snapshots();
    assert_eq!(snaps.len(), 2, "the original is replaced: {snaps:?}");
    assert!(by_id(&snaps, &first).is_none(), "the original is gone");
    let new = snaps
        .iter()
        .find(|s| s["original_id"] == first.as_str())
        .unwrap_or_else(|| panic!("a snapshot names {first} as original: {snaps:?}"));
    assert_eq!(tags_of(new), ["daily", "audit"]);
    assert_eq!(new["time"], first_time, "the time is kept");
    let new_id = new["id"].as_str().unwrap().to_string();

    // By filter: every snapshot tagged daily loses it.
    run_ok(&env, &["tag", "--tag", "daily", "--remove", "daily"]);
    let snaps = env.snapshots();
    assert_eq!(snaps.len(), 2);
    assert!(
        snaps
            .iter()
            .all(|s| !tags_of(s).contains(&"daily".to_string())),
        "{snaps:?}"
    );
    assert!(
        snaps.iter().any(|s| s["original_id"] == first.as_str()),
        "a second change still names the first original: {snaps:?}"
    );
    assert!(by_id(&snaps, &new_id).is_none());
    assert!(snaps.iter().any(|s| s["original_id"] == second.as_str()));

    // Nothing to change: nothing written.
    let files = env.repo_files("snapshots");
    run_ok(&env, &["tag", "--tag", "keep", "--add", "keep"]);
    assert_eq!(env.repo_files("snapshots"), files);

    let out = run_ok(&env, &["tag", "latest", "--set", "only", "--dry-run"]);
    assert!(out.contains("would change"), "{out}");
    assert_eq!(
        env.repo_files("snapshots"),
        files,
        "a dry run writes nothing"
    );
    run_ok(&env, &["tag", "latest", "--set", "only"]);
    let latest = env.snapshots().last().cloned().unwrap();
    assert_eq!(tags_of(&latest), ["only"]);

    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    assert_eq!(
        std::fs::read(restored_path(&target, &src.join("f.txt"))).unwrap(),
        b"tagged\n"
    );
    assert_check_clean(&env, &[], "after tag");

    let out = env.cmd().args(["tag", "latest"]).output().unwrap();
    assert_exit(&out, 2, "tag without --add, --remove or --set");
}

#[test]
fn rewrite_removes_a_path_from_snapshots_and_prune_frees_its_data() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("keep/notes.txt"), b"notes\n");
    write_file(&src.join("keep/id_rsa"), &random_bytes(200_000, 9));
    write_file(&src.join("other.txt"), b"other\n");
    let id = env.backup_id(&[&src], &[]);
    let secret = format!("{}/keep/id_rsa", src.display());
    let before = env.repo_files("");

    let out = run_ok(
        &env,
        &["rewrite", &id, "--exclude", "keep/id_rsa", "--dry-run"],
    );
    assert!(out.contains(&secret), "{out}");
    let out = run_ok(&env, &["rewrite", "--exclude", "id_rsa", "-n", "--json"]);
    let v = parse_json(out.as_bytes(), "rewrite --dry-run --json");
    assert_eq!(v["rewritten"][0]["old_id"], id.as_str(), "{v}");
    assert_eq!(
        v["rewritten"][0]["removed_paths"][0],
        secret.as_str(),
        "{v}"
    );
    assert!(v["rewritten"][0]["new_id"].is_null(), "{v}");
    assert_eq!(env.repo_files(""), before, "a dry run writes nothing");

    // Without --forget both stay.
    run_ok(&env, &["rewrite", &id, "--exclude", "keep/id_rsa"]);
    let snaps = env.snapshots();
    assert_eq!(snaps.len(), 2);
    let new = snaps
        .iter()
        .find(|s| s["original_id"] == id.as_str())
        .expect("the new version");
    assert_eq!(new["time"], by_id(&snaps, &id).unwrap()["time"]);
    let new_id = new["id"].as_str().unwrap().to_string();
    let cat = env.cmd().args(["cat", &new_id, &secret]).output().unwrap();
    assert_exit(&cat, 1, "the secret is not in the new version");
    let cat = env
        .cmd()
        .args(["cat", &new_id, &format!("{}/keep/notes.txt", src.display())])
        .output()
        .unwrap();
    assert_success(&cat, "the rest is");
    assert_eq!(cat.stdout, b"notes\n");
    assert_eq!(
        new["summary"]["files"], 2,
        "the summary counts what is left: {new}"
    );

    // With --forget the original goes, and prune frees the secret's data.
    run_ok(&env, &["forget", &new_id]);
    run_ok(&env, &["rewrite", "--exclude", "id_rsa", "--forget"]);
    let snaps = env.snapshots();
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    assert_eq!(snaps[0]["original_id"], id.as_str());
    let out = env.cmd().args(["prune", "--json"]).output().unwrap();
    assert_success(&out, "prune");
    let prune = parse_json(&out.stdout, "prune --json");
    assert!(json_u64(&prune, "blobs_unused") >= 1, "{prune}");
    assert!(json_u64(&prune, "bytes_unused") >= 200_000, "{prune}");
    assert_check_clean(&env, &["--read-data"], "after rewrite and prune");
    let find = run_ok(&env, &["find", "id_rsa"]);
    assert!(!find.contains("id_rsa"), "{find}");
    assert_snapshot_restores_without(&env, &src, Path::new("keep/id_rsa"));
}

#[test]
fn rewrite_frees_a_directory_whose_small_files_shared_blobs_with_other_directories_and_snapshots() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    // Small files of neighbouring directories, walked one after the other, share blobs.
    write_file(&src.join("a/kept.txt"), &random_bytes(100_000, 1));
    write_file(&src.join("b/secret/key"), &random_bytes(150_000, 2));
    write_file(&src.join("c/kept.txt"), &random_bytes(100_000, 3));
    write_file(&src.join("other.txt"), b"other\n");
    env.backup_id(&[&src], &[]);
    // Deleted from disk before the next backup, which keeps the other files' parts of
    // the bundles the secret is in: that snapshot must let go of them too.
    std::fs::remove_dir_all(src.join("b/secret")).unwrap();
    env.backup_id(&[&src], &[]);

    run_ok(&env, &["rewrite", "--exclude", "b/secret", "--forget"]);
    assert_prune_frees_and_the_rest_restores(
        &env,
        &src,
        "b/secret",
        150_000,
        &["a/kept.txt", "c/kept.txt"],
    );
}

#[test]
fn rewrite_keeps_the_other_small_files_of_a_removed_files_bundle_in_one_blob() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    let kept: Vec<String> = (0..40).map(|i| format!("d{}/f{i}.txt", i % 4)).collect();
    for (i, name) in kept.iter().enumerate() {
        write_file(&src.join(name), &random_bytes(2_000, 10 + i as u64));
    }
    write_file(&src.join("d1/secret.txt"), &random_bytes(3_000, 99));
    write_file(&src.join("other.txt"), b"other\n");
    env.backup_id(&[&src], &[]);
    let data_blobs = || {
        let stats = parse_json(
            run_ok(&env, &["stats", "latest", "--json"]).as_bytes(),
            "stats",
        );
        json_u64(&stats["data"], "blobs")
    };
    let before = data_blobs();
    assert!(
        before <= 2,
        "the small files share bundles: {before} data blobs"
    );

    run_ok(&env, &["rewrite", "--exclude", "d1/secret.txt", "--forget"]);
    // A blob for each kept file would be 41.
    let after = data_blobs();
    assert!(
        after <= before,
        "{after} data blobs after the rewrite, {before} before"
    );
    let kept: Vec<&str> = kept.iter().map(String::as_str).collect();
    assert_prune_frees_and_the_rest_restores(&env, &src, "d1/secret.txt", 3_000, &kept);
}

/// After a rewrite that removed `gone`: prune frees at least `freed` bytes (the removed
/// bytes are held by no blob a kept file uses), the repository checks clean, and the
/// latest snapshot restores without `gone` and with each of `kept` as in `src`.
fn assert_prune_frees_and_the_rest_restores(
    env: &TestEnv,
    src: &Path,
    gone: &str,
    freed: u64,
    kept: &[&str],
) {
    let out = env.cmd().args(["prune", "--json"]).output().unwrap();
    assert_success(&out, "prune");
    let prune = parse_json(&out.stdout, "prune --json");
    assert!(json_u64(&prune, "bytes_unused") >= freed, "{prune}");
    assert_check_clean(env, &["--read-data"], "after rewrite and prune");
    assert_snapshot_restores_without(env, src, Path::new(gone));
    let root = restored_path(&env.path("restored-without"), src);
    for name in kept {
        assert_eq!(
            std::fs::read(root.join(name)).unwrap(),
            std::fs::read(src.join(name)).unwrap(),
            "{name}"
        );
    }
}

/// The latest snapshot restores to `src` less `gone`.
fn assert_snapshot_restores_without(env: &TestEnv, src: &Path, gone: &Path) {
    let target = env.path("restored-without");
    env.restore("latest", &target, &[]);
    let root = restored_path(&target, src);
    assert!(!root.join(gone).exists());
    assert_eq!(std::fs::read(root.join("other.txt")).unwrap(), b"other\n");
}

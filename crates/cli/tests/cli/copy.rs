//! `cairn copy --from-repo` and `init --copy-chunker-params`: snapshots move between
//! repositories with their own passwords and keys, only missing data is sent, and the
//! copies restore exactly.

use std::path::Path;

use assert_cmd::Command;
use serde_json::Value;

use crate::common::*;

const OTHER_PASSWORD: &str = "a different password";

/// A second repository beside `env.repo`, with its own password.
fn other_cmd(env: &TestEnv) -> Command {
    let mut cmd = env.bare_cmd();
    cmd.env("CAIRN_PASSWORD", OTHER_PASSWORD)
        .arg("-r")
        .arg(env.path("other"));
    cmd
}

fn run_other(env: &TestEnv, args: &[&str]) -> std::process::Output {
    let out = other_cmd(env).args(args).output().unwrap();
    assert_success(&out, &format!("cairn -r other {args:?}"));
    out
}

/// `cairn -r other copy --json --from-repo REPO ARGS...`; the source's password comes
/// from a file, as a user would give it.
fn copy_into_other(env: &TestEnv, args: &[&str]) -> Value {
    let pw = env.path("source-password");
    std::fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    let out = other_cmd(env)
        .args(["copy", "--json", "--from-repo"])
        .arg(&env.repo)
        .arg("--from-password-file")
        .arg(&pw)
        .args(args)
        .output()
        .unwrap();
    assert_success(&out, "cairn copy");
    parse_json(&out.stdout, "copy --json")
}

fn other_snapshots(env: &TestEnv) -> Vec<Value> {
    let out = run_other(env, &["snapshots", "--json"]);
    match parse_json(&out.stdout, "snapshots --json") {
        Value::Object(mut doc) => match doc.remove("snapshots") {
            Some(Value::Array(items)) => items,
            other => panic!("snapshots --json has a snapshots array: {other:?}"),
        },
        v => panic!("snapshots --json is an array: {v}"),
    }
}

fn restore_other(env: &TestEnv, snapshot: &str, target: &Path) {
    run_other(
        env,
        &["restore", snapshot, "--target", target.to_str().unwrap()],
    );
}

/// Two snapshots in the source: a rich tree, then with a file changed and one added.
fn two_snapshots(env: &TestEnv) -> (std::path::PathBuf, std::path::PathBuf) {
    env.init(&SMALL_CHUNKS);
    let src = build_rich_tree(&env.path("src"));
    write_file(&src.join("big.bin"), &random_bytes(400_000, 1));
    env.backup(&[&src], &[]);
    let first = env.path("first");
    copy_tree(&src, &first);
    write_file(&src.join("big.bin"), &random_bytes(400_000, 2));
    write_file(&src.join("added.txt"), b"only in the second snapshot\n");
    env.backup(&[&src], &["--tag", "second"]);
    (src, first)
}

#[test]
fn copy_moves_every_snapshot_to_a_repository_with_other_keys() {
    let env = TestEnv::new();
    let (src, first) = two_snapshots(&env);
    run_other(&env, &["init"]);

    let report = copy_into_other(&env, &[]);
    assert_eq!(report["copied"].as_array().unwrap().len(), 2, "{report}");
    assert_eq!(report["shared_ids"], false, "{report}");
    assert!(json_u64(&report, "blobs_added") > 0, "{report}");

    let copies = other_snapshots(&env);
    assert_eq!(copies.len(), 2);
    let originals = env.snapshots();
    for (copy, original) in copies.iter().zip(&originals) {
        for field in ["time", "host", "paths", "tags", "username"] {
            assert_eq!(copy[field], original[field], "{field} is kept");
        }
        assert_ne!(
            copy["tree_id"], original["tree_id"],
            "trees are named by the new id key"
        );
    }
    // The second copy's parent is the copy of the first, not an id from the source.
    assert_eq!(copies[1]["parent_id"], copies[0]["id"]);

    restore_other(&env, copies[0]["id"].as_str().unwrap(), &env.path("r1"));
    assert_trees_equal(&first, &restored_path(&env.path("r1"), &src), Compare::ALL);
    restore_other(&env, "latest", &env.path("r2"));
    assert_trees_equal(&src, &restored_path(&env.path("r2"), &src), Compare::ALL);
    let out = run_other(&env, &["check", "--read-data"]);
    assert!(
        stdout(&out).contains("no problems found"),
        "{}",
        describe(&out)
    );

    // Copying again sends nothing.
    let again = copy_into_other(&env, &[]);
    assert_eq!(again["copied"].as_array().unwrap().len(), 0, "{again}");
    assert_eq!(again["already_present_ids"].as_array().unwrap().len(), 2);
    assert_eq!(json_u64(&again, "bytes_added"), 0, "{again}");
}

#[test]
fn copy_of_one_snapshot_stores_only_what_the_destination_lacks() {
    let env = TestEnv::new();
    let (src, _) = two_snapshots(&env);
    run_other(&env, &["init"]);
    let first_id = env.snapshots()[0]["id"].as_str().unwrap().to_string();
    let first = copy_into_other(&env, &[&first_id[..8]]);
    assert_eq!(first["copied"].as_array().unwrap().len(), 1, "{first}");
    let added_first = json_u64(&first, "raw_bytes_added");

    let second = copy_into_other(&env, &["latest"]);
    assert_eq!(second["copied"].as_array().unwrap().len(), 1, "{second}");
    let added_second = json_u64(&second, "raw_bytes_added");
    // The second snapshot shares everything but big.bin and added.txt with the first.
    assert!(
        added_second < added_first && added_second < 500_000,
        "only the changed data was added: {added_first} then {added_second}"
    );
    restore_other(&env, "latest", &env.path("r"));
    assert_trees_equal(&src, &restored_path(&env.path("r"), &src), Compare::ALL);
}

#[test]
fn init_copy_chunker_params_makes_a_repository_that_deduplicates_with_the_source() {
    let env = TestEnv::new();
    let (src, _) = two_snapshots(&env);
    let pw = env.path("source-password");
    std::fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    let out = other_cmd(&env)
        .args(["init", "--copy-chunker-params", "--from-repo"])
        .arg(&env.repo)
        .arg("--from-password-file")
        .arg(&pw)
        .output()
        .unwrap();
    assert_success(&out, "init --copy-chunker-params");
    let config = |repo: &Path| -> Value {
        serde_json::from_slice(&std::fs::read(repo.join("config")).unwrap()).unwrap()
    };
    assert_eq!(
        config(&env.path("other"))["chunker"],
        config(&env.repo)["chunker"]
    );

    // The same files backed up into the new repository are the same chunks, so a copy
    // afterwards finds all data by id without reading any of it. (Both backups read every
    // file: small files are bundled among the files a backup reads, and the source's
    // incremental second snapshot bundled only the changed ones.)
    env.backup(&[&src], &["--force"]);
    let out = other_cmd(&env)
        .args(["backup", "--json"])
        .arg(&src)
        .output()
        .unwrap();
    assert_success(&out, "backup into the new repository");
    let report = copy_into_other(&env, &["latest"]);
    assert_eq!(report["shared_ids"], true, "{report}");
    assert_eq!(report["copied"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(
        json_u64(&report, "blobs_read"),
        0,
        "all of the latest snapshot's data was there already: {report}"
    );
    restore_other(&env, "latest", &env.path("r"));
    assert_trees_equal(&src, &restored_path(&env.path("r"), &src), Compare::ALL);

    // The keys encrypt apart: the source's password does not open the new repository.
    let out = other_cmd(&env)
        .env("CAIRN_PASSWORD", PASSWORD)
        .arg("snapshots")
        .output()
        .unwrap();
    assert_exit(&out, 1, "the source's password on the new repository");
}

#[test]
fn copy_without_the_source_password_is_a_clear_error() {
    let env = TestEnv::new();
    two_snapshots(&env);
    run_other(&env, &["init"]);
    let wrong = env.path("wrong");
    std::fs::write(&wrong, "not it\n").unwrap();
    let out = other_cmd(&env)
        .args(["copy", "--from-repo"])
        .arg(&env.repo)
        .arg("--from-password-file")
        .arg(&wrong)
        .output()
        .unwrap();
    assert_exit(&out, 1, "copy with a wrong source password");
    let err = stderr(&out);
    assert!(
        err.contains("Wrong password") && err.contains(env.repo.to_str().unwrap()),
        "{err}"
    );

    let out = other_cmd(&env).arg("copy").output().unwrap();
    assert_exit(&out, 1, "copy without --from-repo");
    assert!(stderr(&out).contains("--from-repo"), "{}", stderr(&out));
    assert!(other_snapshots(&env).is_empty(), "nothing was copied");
}

#[test]
fn ctrl_c_stops_a_copy_and_leaves_a_stopped_session_and_no_snapshot_behind() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_random_files(&src, 60, 1_000_000, 300);
    env.backup(&[&src], &[]);
    run_other(&env, &["init"]);
    let pw = env.path("source-password");
    std::fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    // Different keys: every blob is read, decrypted and sealed again, which takes a while.
    let mut copy = std::process::Command::new(cairn_bin());
    copy.env("CAIRN_PASSWORD", OTHER_PASSWORD)
        .env("HOME", env.path("home"))
        .arg("-r")
        .arg(env.path("other"))
        .args(["copy", "--from-repo"])
        .arg(&env.repo)
        .arg("--from-password-file")
        .arg(&pw)
        // 60 MB at 2 MB/s: thirty seconds, still running when it is interrupted.
        .args(["--limit-upload", "2000"]);
    let sessions = env.path("other/sessions");
    let out = interrupt_once_a_session_appears(&mut copy, &sessions);
    assert_eq!(out.status.code(), Some(130), "{}", describe(&out));
    assert!(stderr(&out).contains("Interrupted"), "{}", stderr(&out));
    // The session's last file says it stopped: it defers nothing, and the next backup
    // or prune adopts the packs it left in no index and removes it.
    assert!(
        std::fs::read_dir(&sessions).unwrap().count() <= 1,
        "one session file at most, saying it stopped"
    );
    assert!(other_snapshots(&env).is_empty(), "no snapshot was written");
    run_other(&env, &["check", "--read-data"]);
}

//! Whoever can write to the storage cannot forge repository objects or change the
//! settings (format 2). Each test first shows the attack on a format 1 repository (the
//! `testdata/repos/v1` fixture, which stays readable), then that it fails on a new one.

use std::fs;
use std::path::Path;

use serde_json::Value;

use crate::common::*;

const V1_PASSWORD: &str = "cairn fixture password";

/// A copy of the format 1 fixture in `env.repo`, opened with its password from now on.
fn v1_repo(env: &TestEnv) -> Vec<(&'static str, &'static str)> {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/repos/v1/repo");
    copy_tree(&fixture, &env.repo);
    vec![("CAIRN_PASSWORD", V1_PASSWORD)]
}

fn run(env: &TestEnv, vars: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    env.cmd()
        .envs(vars.iter().copied())
        .args(args)
        .output()
        .unwrap()
}

fn edit_config(env: &TestEnv, edit: impl FnOnce(&mut Value)) {
    let path = env.repo.join("config");
    let mut config: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    edit(&mut config);
    fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
}

/// A file whose data blob, sealed, also parses as a sealed snapshot under format 1: the
/// blob's plaintext is `tag 0 (raw) || file`, and a sealed object is `raw_len:u32le ||
/// tag || payload`. So the file is the raw length's upper three bytes (its low byte is
/// the blob's tag, 0), `0` (raw), then that many bytes of snapshot JSON.
fn forged_snapshot_file() -> Vec<u8> {
    let json = serde_json::json!({
        "time": "2099-01-01T00:00:00Z", "host": "attacker", "username": "root",
        "paths": ["/"], "tags": [], "tree": "00".repeat(32), "parent": null,
        "program_version": "cairn 9", "summary": {"files": 0, "dirs": 0, "total_bytes": 0, "bytes_added": 0}
    })
    .to_string();
    // The raw length's low byte is the blob's tag (0): pad the JSON to a multiple of 256.
    let len = json.len().div_ceil(256) * 256;
    let mut file = (len as u32).to_le_bytes()[1..].to_vec();
    file.push(0);
    file.extend_from_slice(json.as_bytes());
    file.resize(4 + len, b' ');
    file
}

/// Backs up the crafted file alone, then copies the blob it became into `snapshots/`
/// under the name of its hash, as someone with write access to the storage can.
fn plant_blob_as_snapshot(env: &TestEnv, vars: &[(&str, &str)]) {
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    write_file(&src.join("innocent.bin"), &forged_snapshot_file());
    let packs_before = env.repo_files("data");
    let out = run(env, vars, &["backup", src.to_str().unwrap()]);
    assert_success(&out, "backup of the crafted file");
    let new_packs: Vec<_> = env
        .repo_files("data")
        .into_iter()
        .filter(|p| !packs_before.contains(p))
        .collect();
    assert!(!new_packs.is_empty());
    // The data pack's body (everything before its header) is the one blob; the tree
    // pack's body is planted too, which does no harm.
    for pack in new_packs {
        let pack = fs::read(pack).unwrap();
        let n = pack.len();
        let header_len = u32::from_le_bytes(pack[n - 4..].try_into().unwrap()) as usize;
        let body = &pack[..n - 4 - header_len];
        let name = blake3::hash(body).to_hex();
        fs::write(env.repo.join("snapshots").join(name.as_str()), body).unwrap();
    }
}

fn snapshot_hosts(env: &TestEnv, vars: &[(&str, &str)]) -> Vec<String> {
    let out = run(env, vars, &["snapshots", "--json"]);
    parse_json(&out.stdout, "snapshots --json")["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["host"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_data_blob_copied_into_snapshots_is_not_taken_for_a_snapshot() {
    // Format 1: the attack works (its config is not authenticated either, so it can be
    // told to store blobs raw).
    let env = TestEnv::new();
    let vars = v1_repo(&env);
    edit_config(&env, |c| {
        c["compression"] = serde_json::json!({"codec": "none"})
    });
    plant_blob_as_snapshot(&env, &vars);
    assert!(
        snapshot_hosts(&env, &vars).contains(&"attacker".to_string()),
        "format 1 takes the planted blob for a snapshot"
    );

    // Format 2: the blob does not open as a snapshot; `forget --keep-last 1` keeps the
    // real one.
    let env = TestEnv::new();
    env.init(&["--compression", "none"]);
    plant_blob_as_snapshot(&env, &[]);
    assert_eq!(snapshot_hosts(&env, &[]).len(), 1);
    assert!(!snapshot_hosts(&env, &[]).contains(&"attacker".to_string()));
    let out = run(&env, &[], &["forget", "--keep-last", "1"]);
    let real = snapshot_hosts(&env, &[]);
    assert_eq!(
        real.len(),
        1,
        "the real snapshot survives: {}",
        describe(&out)
    );
    let check = run(&env, &[], &["check"]);
    assert!(
        stdout(&check).contains("snapshots/") || stderr(&check).contains("snapshots/"),
        "check names the planted file: {}",
        describe(&check)
    );
}

#[test]
fn changed_settings_are_refused_not_followed() {
    // Format 1 follows a config changed on the storage: 64-byte chunks.
    let env = TestEnv::new();
    let vars = v1_repo(&env);
    edit_config(&env, |c| {
        c["chunker"] = serde_json::json!({"algorithm": "fastcdc-2020", "min_size": 64, "avg_size": 256, "max_size": 1024});
    });
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    write_file(&src.join("f"), &random_bytes(300_000, 1));
    let out = run(&env, &vars, &["backup", "--json", src.to_str().unwrap()]);
    assert_success(&out, "format 1 backup");

    // Format 2 refuses every command, naming the config and what to do.
    let env = TestEnv::with_repo();
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    write_file(&src.join("f"), &random_bytes(300_000, 1));
    env.backup(&[&src], &[]);
    let original = fs::read(env.repo.join("config")).unwrap();
    for edit in [
        serde_json::json!({"chunker": {"algorithm": "fastcdc-2020", "min_size": 64, "avg_size": 256, "max_size": 1024}}),
        serde_json::json!({"compression": {"codec": "none"}}),
        serde_json::json!({"pack_size": 1048576}),
        serde_json::json!({"version": 1}),
        serde_json::json!({"version": 2}),
    ] {
        fs::write(env.repo.join("config"), &original).unwrap();
        edit_config(&env, |c| {
            for (k, v) in edit.as_object().unwrap() {
                c[k] = v.clone();
            }
        });
        for args in [
            &["backup", src.to_str().unwrap()][..],
            &["snapshots"],
            &[
                "restore",
                "latest",
                "--target",
                env.path("t").to_str().unwrap(),
            ],
        ] {
            let out = env.cmd().args(args).output().unwrap();
            assert_exit(&out, 1, &format!("{args:?} with config edit {edit}"));
            let err = stderr(&out);
            assert!(
                err.contains("config")
                    && err.contains("not the one this repository was created with"),
                "{args:?} after {edit}: {err}"
            );
        }
    }
    fs::write(env.repo.join("config"), &original).unwrap();
    assert_eq!(env.snapshots().len(), 1);
}

#[test]
fn new_repositories_are_of_the_current_format_and_hide_exact_sizes() {
    let env = TestEnv::with_repo();
    let config: Value =
        serde_json::from_slice(&fs::read(env.repo.join("config")).unwrap()).unwrap();
    assert_eq!(config["version"], cairn_core::config::FORMAT_VERSION);
    assert!(is_hex(config["mac"].as_str().unwrap(), 64), "{config}");
    // Files of sizes that differ by a few bytes make packs of one size (Padmé).
    let mut sizes = Vec::new();
    for (i, len) in [70_001usize, 70_003, 70_017].into_iter().enumerate() {
        let src = env.path(&format!("src{i}"));
        fs::create_dir_all(&src).unwrap();
        write_file(&src.join("f"), &random_bytes(len, 7 + i as u64));
        let before = env.repo_files("data");
        env.backup(&[&src], &[]);
        let data: Vec<u64> = env
            .repo_files("data")
            .into_iter()
            .filter(|p| !before.contains(p))
            .map(|p| fs::metadata(p).unwrap().len())
            .max()
            .into_iter()
            .collect();
        sizes.extend(data);
    }
    assert_eq!(sizes.len(), 3);
    assert!(sizes.iter().all(|s| *s == sizes[0]), "pack sizes {sizes:?}");
}

/// Each cipher `init` offers backs up, checks and restores; the choice is recorded in the
/// config, and changing or removing it there is refused like any other setting.
#[test]
fn each_cipher_works_and_the_choice_cannot_be_changed_on_the_storage() {
    for (cipher, other) in [
        ("aegis-256", "xchacha20-poly1305"),
        ("xchacha20-poly1305", "aegis-256"),
    ] {
        let env = TestEnv::new();
        env.init(&["--cipher", cipher]);
        let config: Value =
            serde_json::from_slice(&fs::read(env.repo.join("config")).unwrap()).unwrap();
        assert_eq!(config["cipher"], cipher, "{config}");
        let src = env.path("src");
        fs::create_dir_all(&src).unwrap();
        write_file(&src.join("random"), &random_bytes(3_000_000, 3));
        write_file(&src.join("text"), &compressible_bytes(500_000, 4));
        env.backup(&[&src], &[]);
        assert_check_clean(&env, &["--read-data"], cipher);
        assert_snapshot_restores(&env, "latest", &src, &src, Compare::CONTENTS);
        let original = fs::read(env.repo.join("config")).unwrap();
        for edit in [Some(other), None] {
            edit_config(&env, |c| match edit {
                Some(other) => c["cipher"] = other.into(),
                None => drop(c.as_object_mut().unwrap().remove("cipher")),
            });
            let out = env.cmd().arg("snapshots").output().unwrap();
            assert_exit(&out, 1, &format!("{cipher} config edited to {edit:?}"));
            assert!(
                stderr(&out).contains("not the one this repository was created with"),
                "{}",
                stderr(&out)
            );
            fs::write(env.repo.join("config"), &original).unwrap();
        }
    }
    let env = TestEnv::new();
    let out = env
        .cmd()
        .args(["init", "--cipher", "rot13"])
        .output()
        .unwrap();
    assert_exit(&out, 2, "init with an unknown cipher");
    assert!(stderr(&out).contains("aegis-256"), "{}", stderr(&out));
}

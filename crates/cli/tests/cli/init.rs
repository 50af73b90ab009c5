//! `cairn init`: repository creation, chunk-size validation and compression choices.

use std::fs;

use crate::common::*;

#[test]
fn version_prints_cairn_and_a_version_number() {
    let env = TestEnv::new();
    let out = env.bare_cmd().arg("--version").output().unwrap();
    assert_success(&out, "cairn --version");
    let text = stdout(&out);
    assert!(text.starts_with("cairn "), "version output: {text:?}");
    assert!(
        text.trim()
            .split(' ')
            .nth(1)
            .is_some_and(|v| v.split('.').count() == 3),
        "version output has a x.y.z version: {text:?}"
    );
}

#[test]
fn init_writes_a_plaintext_config_of_the_current_version_and_one_key() {
    let env = TestEnv::with_repo();
    let config = parse_json(
        &fs::read(env.repo.join("config")).unwrap(),
        "repository config",
    );
    assert_eq!(
        config["version"].as_u64(),
        Some(cairn_core::config::FORMAT_VERSION as u64),
        "config: {config}"
    );
    let keys = env.repo_files("keys");
    assert_eq!(keys.len(), 1, "exactly one key file: {keys:?}");
    let name = keys[0].file_name().unwrap().to_str().unwrap();
    assert!(is_hex(name, 64), "key file is named by a 64-hex id: {name}");
}

#[test]
fn init_json_prints_the_repository_id_and_path() {
    let env = TestEnv::new();
    let out = env.cmd().args(["init", "--json"]).output().unwrap();
    assert_success(&out, "cairn init --json");
    let v = parse_json(&out.stdout, "cairn init --json");
    let id = v["repository_id"]
        .as_str()
        .unwrap_or_else(|| panic!("string id in {v}"));
    assert!(!id.is_empty(), "non-empty id in {v}");
    let repository = v["repository"]
        .as_str()
        .unwrap_or_else(|| panic!("string repository in {v}"));
    assert_eq!(
        fs::canonicalize(repository).unwrap(),
        env.repo,
        "repository field names the created repository"
    );
}

#[test]
fn init_refuses_a_directory_that_already_holds_a_repository_and_leaves_it_intact() {
    let env = TestEnv::with_repo();
    let config_before = fs::read(env.repo.join("config")).unwrap();
    let keys_before = env.repo_files("keys");

    let out = env.cmd().arg("init").output().unwrap();
    assert_exit(&out, 1, "second cairn init on the same directory");
    assert!(
        !stderr(&out).trim().is_empty(),
        "an error message on stderr"
    );

    assert_eq!(
        fs::read(env.repo.join("config")).unwrap(),
        config_before,
        "config untouched"
    );
    assert_eq!(env.repo_files("keys"), keys_before, "keys untouched");
    let out = env.cmd().arg("snapshots").output().unwrap();
    assert_success(&out, "the original password still opens the repository");
}

fn assert_init_rejects(sizes: [&str; 3], words: [&str; 2]) {
    let env = TestEnv::new();
    let out = env
        .cmd()
        .arg("init")
        .args([
            "--chunk-min",
            sizes[0],
            "--chunk-avg",
            sizes[1],
            "--chunk-max",
            sizes[2],
        ])
        .output()
        .unwrap();
    assert_exit(&out, 1, &format!("cairn init with chunk sizes {sizes:?}"));
    let err = stderr(&out).to_lowercase();
    for word in words {
        assert!(err.contains(word), "stderr mentions {word:?}: {err}");
    }
    assert!(
        !env.repo.join("config").exists(),
        "no repository is created with invalid chunk sizes"
    );
}

#[test]
fn init_rejects_a_minimum_chunk_size_not_below_the_average() {
    assert_init_rejects(["1M", "1M", "8M"], ["min", "avg"]);
}

#[test]
fn init_rejects_an_average_chunk_size_not_below_the_maximum() {
    assert_init_rejects(["64K", "1M", "1M"], ["avg", "max"]);
}

#[test]
fn init_rejects_a_max_minus_min_span_not_above_the_average() {
    // max - min = 1M = avg.
    assert_init_rejects(["512K", "1M", "1536K"], ["min", "avg"]);
}

#[test]
fn init_accepts_sizes_written_with_k_m_mib_and_plain_bytes() {
    for sizes in [
        ["4096", "16K", "64K"],
        ["256K", "1M", "4M"],
        ["256K", "1MiB", "4MiB"],
        ["16384", "65536", "262144"],
    ] {
        let env = TestEnv::new();
        let out = env
            .cmd()
            .arg("init")
            .args([
                "--chunk-min",
                sizes[0],
                "--chunk-avg",
                sizes[1],
                "--chunk-max",
                sizes[2],
            ])
            .output()
            .unwrap();
        assert_success(&out, &format!("cairn init with chunk sizes {sizes:?}"));
    }
}

#[test]
fn small_chunk_sizes_make_a_one_byte_edit_in_a_big_file_add_little_data() {
    // With the defaults (min 512K) one edit costs at least 512 KiB; with max 64K it costs
    // a couple of chunks, which shows the sizes given to init are the ones used.
    let env = TestEnv::new();
    env.init(&[
        "--chunk-min",
        "4096",
        "--chunk-avg",
        "16K",
        "--chunk-max",
        "64K",
        "--compression",
        "none",
    ]);
    let src = env.path("src");
    let mut data = random_bytes(4_000_000, 7);
    write_file(&src.join("big.bin"), &data);
    let first = env.backup(&[&src], &[]);
    assert!(
        json_u64(&first, "bytes_added") >= 4_000_000,
        "first backup stores the file: {first}"
    );

    data[2_000_000] ^= 0xff;
    write_file(&src.join("big.bin"), &data);
    set_mtime(&src.join("big.bin"), 1_700_000_000, 1);
    let second = env.backup(&[&src], &[]);
    assert_eq!(json_u64(&second, "files_changed"), 1, "{second}");
    let added = json_u64(&second, "bytes_added");
    assert!(
        added < 256 * 1024,
        "a one-byte edit added {added} bytes: {second}"
    );

    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    assert_eq!(
        fs::read(restored_path(&target, &src).join("big.bin")).unwrap(),
        data
    );
}

#[test]
fn every_compression_choice_round_trips_and_compressors_shrink_text() {
    let data = compressible_bytes(2_000_000, 3);
    let mut added = Vec::new();
    for compression in ["none", "zstd", "zstd:19", "lz4"] {
        let env = TestEnv::new();
        env.init(&["--compression", compression]);
        let src = env.path("src");
        write_file(&src.join("text.log"), &data);
        let summary = env.backup(&[&src], &[]);
        added.push((compression, json_u64(&summary, "bytes_added")));
        let target = env.path("restored");
        env.restore("latest", &target, &[]);
        assert_eq!(
            fs::read(restored_path(&target, &src).join("text.log")).unwrap(),
            data,
            "restored bytes with --compression {compression}"
        );
    }
    let none = added[0].1;
    assert!(
        none >= data.len() as u64,
        "uncompressed repository holds the whole file: {added:?}"
    );
    for (compression, bytes) in &added[1..] {
        assert!(
            *bytes * 2 < none,
            "--compression {compression} should at least halve text ({added:?})"
        );
    }
}

//! `cairn stats`: counts, sizes and the dedup and compression ratios of a repository or
//! of chosen snapshots, checked against the files on disk and other commands' output.

use serde_json::Value;

use crate::common::*;

/// `cairn stats --json ARGS...`, which must exit 0.
fn stats_json(env: &TestEnv, args: &[&str]) -> Value {
    let out = env
        .cmd()
        .args(["stats", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert_success(&out, &format!("cairn stats --json {args:?}"));
    parse_json(&out.stdout, "cairn stats --json")
}

fn nested_u64(v: &Value, outer: &str, field: &str) -> u64 {
    json_u64(&v[outer], field)
}

fn ratio(v: &Value, field: &str) -> f64 {
    v[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is a number in {v}"))
}

#[test]
fn backing_up_the_same_data_again_doubles_restore_size_but_not_unique_data() {
    let env = TestEnv::with_small_chunk_repo();
    let src = env.path("src");
    write_file(&src.join("a.bin"), &random_bytes(1_200_000, 61));
    write_file(&src.join("sub/b.log"), &compressible_bytes(400_000, 62));
    env.backup(&[&src], &[]);
    let once = stats_json(&env, &[]);
    env.backup(&[&src], &["--force"]);
    let twice = stats_json(&env, &[]);

    assert_eq!(json_u64(&once, "snapshots"), 1);
    assert_eq!(json_u64(&twice, "snapshots"), 2);
    assert_eq!(json_u64(&once, "restore_bytes"), 1_600_000);
    assert_eq!(json_u64(&twice, "restore_bytes"), 3_200_000);
    assert_eq!(
        nested_u64(&twice, "data", "raw_bytes"),
        nested_u64(&once, "data", "raw_bytes"),
        "the second backup stored no new data"
    );
    assert_eq!(
        nested_u64(&once, "data", "raw_bytes"),
        1_600_000,
        "unique data is the two files once"
    );
    let (d1, d2) = (ratio(&once, "dedup_ratio"), ratio(&twice, "dedup_ratio"));
    assert!(
        (d2 - 2.0 * d1).abs() < 1e-9,
        "dedup ratio doubles: {d1} then {d2}"
    );
}

#[test]
fn compressible_data_has_a_compression_ratio_above_one_and_random_data_does_not() {
    let env = TestEnv::with_small_chunk_repo();
    let text = env.path("text");
    write_file(&text.join("log.txt"), &compressible_bytes(2_000_000, 63));
    let text_id = env.backup_id(&[&text], &[]);
    let noise = env.path("noise");
    write_file(&noise.join("r.bin"), &random_bytes(2_000_000, 64));
    let noise_id = env.backup_id(&[&noise], &[]);

    let t = stats_json(&env, &[&text_id]);
    assert!(ratio(&t, "compression_ratio") > 2.0, "text compresses: {t}");
    assert!(nested_u64(&t, "data", "stored_bytes") < nested_u64(&t, "data", "raw_bytes"));
    let n = stats_json(&env, &[&noise_id]);
    assert!(
        ratio(&n, "compression_ratio") <= 1.0,
        "random data is stored raw (plus the encryption overhead): {n}"
    );
}

#[test]
fn counts_agree_with_the_files_on_disk_and_with_snapshots_and_check() {
    let env = TestEnv::with_small_chunk_repo();
    let src = env.path("src");
    build_rich_tree(&src);
    env.backup(&[&src], &[]);
    write_file(&src.join("later.bin"), &random_bytes(500_000, 65));
    env.backup(&[&src], &[]);
    let s = stats_json(&env, &[]);

    let snapshots = env.snapshots();
    assert_eq!(json_u64(&s, "snapshots"), snapshots.len() as u64);
    let summed = |field: &str| -> u64 {
        snapshots
            .iter()
            .map(|snap| nested_u64(snap, "summary", field))
            .sum()
    };
    assert_eq!(json_u64(&s, "restore_bytes"), summed("total_bytes"));
    assert_eq!(json_u64(&s, "files"), summed("files"));
    assert_eq!(json_u64(&s, "dirs"), summed("dirs"));

    let packs = env.repo_files("data");
    assert_eq!(json_u64(&s, "packs"), packs.len() as u64);
    let on_disk: u64 = packs
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert_eq!(json_u64(&s, "pack_bytes"), on_disk, "pack sizes sum");

    let check = assert_check_clean(&env, &[], "after two backups");
    assert_eq!(json_u64(&s, "packs"), json_u64(&check, "packs"));
    assert_eq!(
        nested_u64(&s, "data", "blobs"),
        json_u64(&check, "data_blobs")
    );
    assert_eq!(nested_u64(&s, "trees", "blobs"), json_u64(&check, "trees"));

    // Walking every snapshot's trees finds what the index and the summaries say.
    let ids: Vec<&str> = snapshots
        .iter()
        .map(|snap| snap["id"].as_str().unwrap())
        .collect();
    let walked = stats_json(&env, &ids);
    for field in ["snapshots", "files", "dirs", "restore_bytes", "packs"] {
        assert_eq!(json_u64(&walked, field), json_u64(&s, field), "{field}");
    }
    assert_eq!(walked["data"], s["data"]);
    assert_eq!(walked["trees"], s["trees"]);
    assert!(walked["pack_bytes"].is_null(), "{walked}");
    assert!(json_u64(&walked, "trees_read") <= nested_u64(&s, "trees", "blobs"));
}

#[test]
fn one_snapshot_counts_only_the_blobs_it_references() {
    let env = TestEnv::with_small_chunk_repo();
    let a = env.path("a");
    write_file(&a.join("a.bin"), &random_bytes(900_000, 66));
    let a_id = env.backup_id(&[&a], &[]);
    let b = env.path("b");
    write_file(&b.join("b.bin"), &random_bytes(700_000, 67));
    let b_id = env.backup_id(&[&b], &[]);

    let only_a = stats_json(&env, &[&a_id[..10]]);
    assert_eq!(json_u64(&only_a, "snapshots"), 1);
    assert_eq!(json_u64(&only_a, "files"), 1);
    assert_eq!(json_u64(&only_a, "restore_bytes"), 900_000);
    assert_eq!(nested_u64(&only_a, "data", "raw_bytes"), 900_000);
    let only_b = stats_json(&env, &["latest"]);
    assert_eq!(nested_u64(&only_b, "data", "raw_bytes"), 700_000);
    // The same snapshot named twice counts once.
    let twice = stats_json(&env, &[&b_id, "latest"]);
    assert_eq!(twice["data"], only_b["data"]);
    assert_eq!(json_u64(&twice, "snapshots"), 1);

    let human = env.cmd().args(["stats", &a_id]).output().unwrap();
    assert_success(&human, "cairn stats SNAPSHOT");
    let text = stdout(&human);
    for label in ["Snapshots:", "Restore size:", "Data blobs:", "Dedup:"] {
        assert!(text.contains(label), "{label} in:\n{text}");
    }
}

#[test]
fn a_snapshot_that_does_not_exist_is_an_error_naming_it() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f"), b"x");
    env.backup(&[&src], &[]);
    let out = env.cmd().args(["stats", "deadbeef99"]).output().unwrap();
    assert_exit(&out, 1, "cairn stats with an unknown snapshot");
    assert!(stderr(&out).contains("deadbeef99"), "{}", stderr(&out));
    assert!(
        out.stdout.is_empty(),
        "no figures printed: {}",
        stdout(&out)
    );
}

#[test]
fn an_empty_repository_has_zero_counts_and_no_ratios() {
    let env = TestEnv::with_repo();
    let s = stats_json(&env, &[]);
    assert_eq!(json_u64(&s, "snapshots"), 0);
    assert_eq!(json_u64(&s, "packs"), 0);
    assert_eq!(json_u64(&s, "pack_bytes"), 0);
    assert!(
        s["compression_ratio"].is_null() && s["dedup_ratio"].is_null(),
        "{s}"
    );
}

//! Trust: backups and `forget --prune` running at the same time lose nothing. Each round
//! starts two backups of different, changing trees and a `forget --keep-last 2 --prune`
//! together; all succeed, `check --read-data` is clean, and every snapshot that remains
//! restores exactly what its tree was when it was taken. Content comes back every third
//! round, so backups keep building on blobs that the concurrent prune is condemning.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

const ROUNDS: u64 = 6;

/// About 1.3 MB: a random file, a log, 20 small files.
fn build_tree(dir: &Path, seed: u64) {
    write_file(&dir.join("keep.bin"), &random_bytes(400_000, seed));
    write_file(&dir.join("log.txt"), &compressible_bytes(300_000, seed + 1));
    for i in 0..20u64 {
        write_file(
            &dir.join(format!("small/s{i:02}.dat")),
            &random_bytes(500 + i as usize * 150, seed + 10 + i),
        );
    }
}

/// Per round: `rot.bin` cycles through three contents (so a forgotten snapshot's blobs
/// come back three rounds later), a new 1.1 MB file replaces the last one (so forgetting
/// a snapshot leaves whole packs unused), the log grows and three small files change.
fn mutate_tree(dir: &Path, seed: u64, round: u64) {
    write_file(
        &dir.join("rot.bin"),
        &random_bytes(300_000, seed + 1000 + round % 3),
    );
    write_file(
        &dir.join(format!("new-{round}.bin")),
        &random_bytes(1_100_000, seed + 2000 + round),
    );
    let _ = fs::remove_file(dir.join(format!("new-{}.bin", round.wrapping_sub(1))));
    let mut log = fs::OpenOptions::new()
        .append(true)
        .open(dir.join("log.txt"))
        .unwrap();
    log.write_all(&compressible_bytes(50_000, seed + 3000 + round))
        .unwrap();
    drop(log);
    for j in 0..3u64 {
        write_file(
            &dir.join(format!("small/s{:02}.dat", (round * 3 + j) % 20)),
            &random_bytes(700 + j as usize * 100, seed + 4000 + round * 10 + j),
        );
    }
}

fn spawn(env: &TestEnv, args: &[&str], path: Option<&Path>) -> Child {
    let mut cmd = spawnable(env);
    cmd.args(args);
    if let Some(p) = path {
        cmd.arg(p);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cairn")
}

fn finish(child: Child, what: &str) -> Value {
    let out = child.wait_with_output().unwrap();
    assert_success(&out, what);
    parse_json(&out.stdout, what)
}

/// `forget --prune --json` prints human text before its JSON (see the ignored test
/// below); this takes the JSON that follows. A failure is returned, not asserted, so that
/// the round's check still shows whether anything was lost.
fn finish_forget_prune(child: Child) -> Result<Value, String> {
    let out = child.wait_with_output().unwrap();
    if !out.status.success() {
        return Err(describe(&out));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text
        .find("\n{")
        .map(|i| i + 1)
        .filter(|_| !text.starts_with('{'))
        .unwrap_or(0);
    Ok(parse_json(
        text[start..].as_bytes(),
        "forget --prune --json",
    ))
}

/// Two backups and a `forget --prune` at once, round after round: all succeed, and every
/// snapshot that remains restores exactly.
#[test]
fn trust_concurrency_backups_and_forget_prune_at_the_same_time_lose_nothing() {
    run_rounds();
}

fn run_rounds() {
    let started = Instant::now();
    let env = TestEnv::new();
    let mut init = vec!["--pack-size", "1M"];
    init.extend(SMALL_CHUNKS);
    env.init(&init);

    let trees = [
        (env.path("tree-a"), 10_000u64),
        (env.path("tree-b"), 20_000u64),
    ];
    for (dir, seed) in &trees {
        build_tree(dir, *seed);
    }
    // Snapshot id -> (tree index, copy of the tree when it was backed up).
    let mut states: BTreeMap<String, (usize, PathBuf)> = BTreeMap::new();
    let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
    let mut restores = 0;
    let mut failures: Vec<String> = Vec::new();

    for round in 0..ROUNDS {
        let mut copies = Vec::new();
        for (t, (dir, seed)) in trees.iter().enumerate() {
            if round > 0 {
                mutate_tree(dir, *seed, round);
            }
            let copy = env.path(&format!("states/{t}-{round}"));
            fs::create_dir_all(copy.parent().unwrap()).unwrap();
            copy_tree(dir, &copy);
            copies.push(copy);
        }

        // The forget starts before (negative), with, or after the backups, varying by
        // round, so that its prune condemns packs while backups are running.
        let offset_ms: i64 = [0, -100, 0, -200, 100, -100][round as usize % 6];
        let forget_args = ["forget", "--keep-last", "2", "--prune", "--json"];
        let mut forget = None;
        if offset_ms < 0 {
            forget = Some(spawn(&env, &forget_args, None));
            std::thread::sleep(Duration::from_millis(offset_ms.unsigned_abs()));
        }
        let backups: Vec<Child> = trees
            .iter()
            .map(|(dir, _)| spawn(&env, &["backup", "--json"], Some(dir)))
            .collect();
        if forget.is_none() {
            std::thread::sleep(Duration::from_millis(offset_ms as u64));
            forget = Some(spawn(&env, &forget_args, None));
        }
        let mut new_ids = Vec::new();
        for (t, child) in backups.into_iter().enumerate() {
            let summary = finish(child, &format!("round {round}: backup of tree {t}"));
            let id = summary["snapshot_id"].as_str().unwrap().to_string();
            states.insert(id.clone(), (t, copies[t].clone()));
            new_ids.push(id);
        }
        let prune = match finish_forget_prune(forget.unwrap()) {
            Ok(report) => report,
            Err(failure) => {
                eprintln!(
                    "trust_concurrency: round {round}: forget --keep-last 2 --prune FAILED while backups ran (new snapshots {}):\n{failure}",
                    new_ids.iter().map(|i| &i[..8]).collect::<Vec<_>>().join(", ")
                );
                failures.push(format!("round {round}: {failure}"));
                Value::Null
            }
        };
        for key in [
            "packs_deleted",
            "packs_deferred",
            "packs_condemned",
            "packs_repacked",
            "packs_rescued",
        ] {
            *totals.entry(key).or_default() += prune[key].as_u64().unwrap_or(0);
        }

        // Everything that remains is sound and restores exactly.
        let report = assert_check_clean(&env, &["--read-data"], &format!("after round {round}"));
        let remaining = env.snapshots();
        let mut per_tree = [0usize; 2];
        for snap in &remaining {
            let id = snap["id"].as_str().unwrap();
            let (t, copy) = states.get(id).unwrap_or_else(|| {
                panic!("round {round}: snapshot {id} is not one the backups made")
            });
            per_tree[*t] += 1;
            assert_snapshot_restores(&env, id, &trees[*t].0, copy, Compare::ALL);
            restores += 1;
        }
        for id in &new_ids {
            assert!(
                remaining
                    .iter()
                    .any(|s| s["id"].as_str() == Some(id.as_str())),
                "round {round}: the newest snapshot {id} is kept by --keep-last 2"
            );
        }
        assert!(
            per_tree.iter().all(|&n| (1..=3).contains(&n)),
            "round {round}: each tree keeps its last 2 snapshots, or 3 if its backup finished after the forget: {per_tree:?}"
        );
        let prune_summary = if prune.is_null() {
            "forget --prune failed".to_string()
        } else {
            format!(
                "prune deleted {} packs, deferred {}, condemned {}, repacked {}, rescued {}, blocked by {} session(s)",
                prune["packs_deleted"],
                prune["packs_deferred"],
                prune["packs_condemned"],
                prune["packs_repacked"],
                prune["packs_rescued"],
                prune["blocking_sessions"].as_array().map_or(0, |s| s.len()),
            )
        };
        eprintln!(
            "trust_concurrency: round {round} (forget {offset_ms:+} ms): {prune_summary}; \
             {} snapshots ({per_tree:?} per tree), {} packs checked",
            remaining.len(),
            json_u64(&report, "packs"),
        );
        // Copies of forgotten snapshots are no longer needed.
        let alive: Vec<&str> = remaining.iter().filter_map(|s| s["id"].as_str()).collect();
        states.retain(|id, (_, copy)| {
            let keep = alive.contains(&id.as_str());
            if !keep {
                let _ = fs::remove_dir_all(&*copy);
            }
            keep
        });
    }

    assert!(
        failures.is_empty(),
        "forget --prune run beside backups must succeed; it failed {} time(s) (nothing was lost: every round's check passed):\n{}",
        failures.len(),
        failures.join("\n")
    );

    // All backups ended, so no session is left, and a last prune deletes all it condemned.
    let sessions = repo_final_files(&env, "sessions");
    assert!(
        sessions.is_empty(),
        "no backup session is left behind: {sessions:?}"
    );
    let out = env.cmd().args(["prune", "--json"]).output().unwrap();
    assert_success(&out, "the final prune");
    let prune = parse_json(&out.stdout, "prune --json");
    eprintln!(
        "trust_concurrency: final prune: deleted {} packs, deferred {}, condemned {}, rescued {}, {} bytes freed",
        prune["packs_deleted"], prune["packs_deferred"], prune["packs_condemned"], prune["packs_rescued"], prune["bytes_freed"]
    );
    assert_eq!(
        json_u64(&prune, "packs_deferred"),
        0,
        "with no backup running, prune defers nothing: {prune}"
    );
    let report = assert_check_clean(&env, &["--read-data"], "after the final prune");
    for snap in env.snapshots() {
        let id = snap["id"].as_str().unwrap();
        let (t, copy) = &states[id];
        assert_snapshot_restores(&env, id, &trees[*t].0, copy, Compare::ALL);
        restores += 1;
    }
    let trash = repo_final_files(&env, "trash");
    eprintln!(
        "trust_concurrency: {ROUNDS} rounds; \
         totals over the rounds' prunes: {totals:?}; {restores} verified restores; \
         at the end {} snapshots, {} packs, {} trash file(s); {} s",
        json_u64(&report, "snapshots"),
        json_u64(&report, "packs"),
        trash.len(),
        started.elapsed().as_secs()
    );
}

#[test]
fn trust_concurrency_forget_prune_json_prints_only_json() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f.txt"), b"f\n");
    env.backup(&[&src], &[]);
    env.backup(&[&src], &[]);
    let out = env
        .cmd()
        .args(["forget", "--keep-last", "1", "--prune", "--json"])
        .output()
        .unwrap();
    assert_success(&out, "forget --keep-last 1 --prune --json");
    let v = parse_json(&out.stdout, "forget --keep-last 1 --prune --json");
    assert!(v.is_object(), "one JSON object: {v}");
}

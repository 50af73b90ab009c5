//! Trust: a backup killed with SIGKILL at any moment loses nothing. Every earlier
//! snapshot still restores exactly, `check --read-data` finds no problem (packs left in no
//! index and the killed backup's session are notes, not damage), and the next backup
//! succeeds and reuses what the killed one had already indexed.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// Kill points spread over one backup: fractions 0/20, 1/20, ..., 23/20 of the time an
/// uninterrupted backup of a similar change takes (the last ones land after the end).
const KILLS: usize = 24;
const FRACTION_STEPS: f64 = 20.0;

/// About 20 MB: two 4 MB logs (compressible), a 10 MB disk-image-like file (zeros with
/// scattered random blocks), three 300 KB random files and 300 small files (half random,
/// half text) in 12 directories. About 2.5 MB once compressed, so that reading the whole
/// repository after every kill stays affordable in a debug build.
fn build_source(src: &Path) {
    for i in 0..3u64 {
        write_file(
            &src.join(format!("big/r{i}.bin")),
            &random_bytes(300_000, 200 + i),
        );
    }
    for i in 0..2u64 {
        write_file(
            &src.join(format!("logs/log{i}.txt")),
            &compressible_bytes(4_000_000, 100 + i),
        );
    }
    let mut image = vec![0u8; 10_000_000];
    for (n, block) in image.chunks_mut(64 * 1024).enumerate() {
        block[..512].copy_from_slice(&random_bytes(512, 150 + n as u64));
    }
    write_file(&src.join("image/disk.img"), &image);
    for d in 0..12u64 {
        for f in 0..25u64 {
            let n = d * 25 + f;
            let len = 100 + (n * 397) as usize % 6000;
            let contents = if n % 2 == 0 {
                random_bytes(len, 300 + n)
            } else {
                compressible_bytes(len, 300 + n)
            };
            write_file(&src.join(format!("small/d{d:02}/f{f:02}.dat")), &contents);
        }
    }
    write_file(&src.join("deep/a/b/c/d/e/leaf.txt"), b"deep leaf\n");
    std::os::unix::fs::symlink("../logs/log0.txt", src.join("deep/link")).unwrap();
}

/// The change between two backups: one random file rewritten, a log grown, six small
/// files rewritten, small files and a directory added and removed. Roughly 0.15 MB of new
/// data after compression, so the repository stays small enough to read in full after
/// every kill.
fn mutate(src: &Path, k: u64) {
    write_file(
        &src.join(format!("big/r{}.bin", k % 3)),
        &random_bytes(80_000, 1000 + k),
    );
    let mut log = fs::OpenOptions::new()
        .append(true)
        .open(src.join(format!("logs/log{}.txt", k % 2)))
        .unwrap();
    log.write_all(&compressible_bytes(200_000, 2000 + k))
        .unwrap();
    drop(log);
    for j in 0..6u64 {
        let path = src.join(format!(
            "small/d{:02}/f{:02}.dat",
            (k + j) % 12,
            (k * 7 + j) % 25
        ));
        write_file(
            &path,
            &random_bytes(1000 + j as usize * 300, 3000 + k * 10 + j),
        );
    }
    write_file(
        &src.join(format!("small/new/k{k}.txt")),
        format!("added in round {k}\n").as_bytes(),
    );
    let _ = fs::remove_file(src.join(format!("small/new/k{}.txt", k.wrapping_sub(3))));
    write_file(
        &src.join(format!("round-{k}/inner/file.bin")),
        &random_bytes(20_000, 4000 + k),
    );
    let _ = fs::remove_dir_all(src.join(format!("round-{}", k.wrapping_sub(2))));
}

fn spawn_backup(env: &TestEnv, src: &Path, log: &Path) -> Child {
    spawnable(env)
        .args(["backup", "--json"])
        .arg(src)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(log).unwrap())
        .spawn()
        .expect("spawn cairn backup")
}

fn state_copy(env: &TestEnv, src: &Path, k: u64) -> PathBuf {
    let dest = env.path(&format!("states/{k}"));
    fs::create_dir_all(dest.parent().unwrap()).unwrap();
    copy_tree(src, &dest);
    dest
}

/// Runs a `cairn backup --json` to its end as a child process, like the killed ones;
/// returns its wall time and the new snapshot's id.
fn timed_backup(env: &TestEnv, src: &Path) -> (Duration, String) {
    let t = Instant::now();
    let out = spawnable(env)
        .args(["backup", "--json"])
        .arg(src)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let took = t.elapsed();
    assert_success(&out, "an uninterrupted backup");
    let summary = parse_json(&out.stdout, "cairn backup --json");
    (took, summary["snapshot_id"].as_str().unwrap().to_string())
}

fn median(durations: &[Duration]) -> Duration {
    let mut d = durations.to_vec();
    d.sort();
    d[d.len() / 2]
}

#[test]
fn trust_crash_backups_killed_at_24_points_lose_nothing_and_the_next_backup_succeeds() {
    let started = Instant::now();
    let env = TestEnv::new();
    let mut init = vec!["--pack-size", "1M"];
    init.extend(SMALL_CHUNKS);
    env.init(&init);

    let src = env.path("src");
    build_source(&src);
    let first_state = state_copy(&env, &src, 0);
    let summary = env.backup(&[&src], &[]);
    let first = summary["snapshot_id"].as_str().unwrap().to_string();
    eprintln!(
        "trust_crash: source of {} bytes stored as {} bytes",
        json_u64(&summary, "bytes_read"),
        json_u64(&summary, "bytes_added")
    );

    // Uninterrupted backups of a typical change, to spread the kill points over; every
    // later uninterrupted backup of a full round's change refines the estimate.
    let mut durations = Vec::new();
    let mut pending: Vec<(String, PathBuf)> = Vec::new();
    let mut prev_state = PathBuf::new();
    for round in 1..=2u64 {
        mutate(&src, round);
        let state = state_copy(&env, &src, round);
        let (took, id) = timed_backup(&env, &src);
        durations.push(took);
        pending.push((id, state.clone()));
        prev_state = state;
    }
    eprintln!(
        "trust_crash: uninterrupted backups of one round's change take {:?} ms",
        durations.iter().map(|d| d.as_millis()).collect::<Vec<_>>()
    );

    let mut expected_ids = snapshot_ids(&env);
    let mut verified_trees: BTreeSet<PathBuf> = BTreeSet::new();
    let (mut mid, mut after_snapshot_before_exit, mut after_exit) = (0, 0, 0);
    let (mut restores, mut skipped_same_tree, mut stale_sessions) = (0, 0, 0);
    let mut spent = [Duration::ZERO; 4]; // kill, check --read-data, restores, next backup

    // A state restored once (from the snapshot a killed backup completed) is not restored
    // again from the no-op backup that follows; the first snapshot is restored repeatedly.
    let verify = |env: &TestEnv,
                  id: &str,
                  expected: &Path,
                  verified: &mut BTreeSet<PathBuf>,
                  restores: &mut usize,
                  skipped: &mut usize| {
        if id != first && verified.contains(expected) {
            *skipped += 1;
            return;
        }
        assert_snapshot_restores(env, id, &src, expected, Compare::ALL);
        verified.insert(expected.to_path_buf());
        *restores += 1;
    };

    for k in 0..KILLS {
        let round = k as u64 + 3;
        mutate(&src, round);
        let state = state_copy(&env, &src, round);
        let before = expected_ids.clone();
        let sessions_before = repo_final_files(&env, "sessions").len();
        let fraction = k as f64 / FRACTION_STEPS;
        let delay = median(&durations).mul_f64(fraction);
        let log = env.path(&format!("killed-{round}.log"));
        let t = Instant::now();
        let mut child = spawn_backup(&env, &src, &log);
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL; harmless if it has already exited
        let status = child.wait().unwrap();
        spent[0] += t.elapsed();
        let after = snapshot_ids(&env);
        let new: Vec<&String> = after.iter().filter(|id| !before.contains(id)).collect();
        assert!(
            new.len() <= 1,
            "kill {k}: at most one snapshot appears (before {before:?}, after {after:?})"
        );
        assert!(
            before.iter().all(|id| after.contains(id)),
            "kill {k}: no snapshot disappears"
        );
        let left_sessions = repo_final_files(&env, "sessions").len() - sessions_before;
        stale_sessions += left_sessions;
        let outcome = if status.code().is_some() {
            assert!(
                status.success(),
                "kill {k}: the backup exited by itself, so it must have succeeded: {status:?}, stderr: {}",
                fs::read_to_string(&log).unwrap_or_default()
            );
            assert_eq!(
                new.len(),
                1,
                "kill {k}: a backup that exited 0 made a snapshot"
            );
            assert_eq!(
                left_sessions, 0,
                "kill {k}: a finished backup removes its session"
            );
            after_exit += 1;
            "after exit"
        } else if new.is_empty() {
            mid += 1;
            "mid-backup"
        } else {
            after_snapshot_before_exit += 1;
            "after its snapshot, before exit"
        };

        let t = Instant::now();
        let report = assert_check_clean(&env, &["--read-data"], &format!("after kill {k}"));
        spent[1] += t.elapsed();
        let t = Instant::now();
        if let Some(id) = new.first() {
            // The killed backup got as far as its commit point: its snapshot is complete.
            verify(
                &env,
                id,
                &state,
                &mut verified_trees,
                &mut restores,
                &mut skipped_same_tree,
            );
            expected_ids.push(id.to_string());
        }
        for (id, expected) in pending.drain(..) {
            verify(
                &env,
                &id,
                &expected,
                &mut verified_trees,
                &mut restores,
                &mut skipped_same_tree,
            );
        }
        if k % 12 == 11 {
            verify(
                &env,
                &first,
                &first_state,
                &mut verified_trees,
                &mut restores,
                &mut skipped_same_tree,
            );
        }
        spent[2] += t.elapsed();
        fs::remove_dir_all(&prev_state).unwrap();

        let t = Instant::now();
        let (took, id) = timed_backup(&env, &src);
        spent[3] += t.elapsed();
        if new.is_empty() {
            // Nothing of this round's change was committed: a full round's backup.
            durations.push(took);
        }
        let plain = assert_check_clean(
            &env,
            &[],
            &format!("after the backup that followed kill {k}"),
        );
        eprintln!(
            "trust_crash: kill {k:2} at {:4} ms ({fraction:.2} of a backup): {outcome}; sessions left: {left_sessions}; \
             check --read-data: {} packs, {} note(s); next backup {} ms; check: {} snapshots",
            delay.as_millis(),
            json_u64(&report, "packs"),
            report["notes"].as_array().map_or(0, |n| n.len()),
            took.as_millis(),
            json_u64(&plain, "snapshots"),
        );
        expected_ids.push(id.clone());
        pending.push((id, state.clone()));
        prev_state = state;
    }

    let report = assert_check_clean(&env, &["--read-data"], "at the end");
    for (id, expected) in pending.drain(..) {
        verify(
            &env,
            &id,
            &expected,
            &mut verified_trees,
            &mut restores,
            &mut skipped_same_tree,
        );
    }
    verify(
        &env,
        &first,
        &first_state,
        &mut verified_trees,
        &mut restores,
        &mut skipped_same_tree,
    );
    expected_ids.sort();
    assert_eq!(
        snapshot_ids(&env),
        expected_ids,
        "exactly the completed backups' snapshots are in the repository"
    );
    assert_eq!(mid + after_snapshot_before_exit + after_exit, KILLS);
    assert!(
        mid >= KILLS / 3,
        "a good part of the kill points land in the middle of a backup ({mid} of {KILLS} did)"
    );
    eprintln!(
        "trust_crash: {KILLS} kills: {mid} mid-backup, {after_snapshot_before_exit} after the snapshot was written but before exit, \
         {after_exit} after exit; {stale_sessions} session file(s) left by killed backups; {restores} verified restores \
         (+{skipped_same_tree} no-op snapshots of an already verified state); {} snapshots, {} packs, {} bytes read by the last check; \
         time in kills/check --read-data/restores/next backups: {:?} s; total {} s",
        json_u64(&report, "snapshots"),
        json_u64(&report, "packs"),
        json_u64(&report, "bytes_read"),
        spent.iter().map(|d| d.as_secs()).collect::<Vec<_>>(),
        started.elapsed().as_secs()
    );
}

/// A backup killed after its first interim index (written every 16 packs) leaves those
/// packs indexed: the next backup reuses them instead of uploading the data again.
#[test]
fn trust_crash_a_backup_killed_after_an_interim_index_is_resumed_by_the_next_backup() {
    let env = TestEnv::new();
    let mut init = vec!["--pack-size", "1M"];
    init.extend(SMALL_CHUNKS);
    env.init(&init);

    let src = env.path("src");
    for i in 0..20u64 {
        write_file(
            &src.join(format!("small/f{i}.txt")),
            &compressible_bytes(10_000, i),
        );
    }
    let first_state = state_copy(&env, &src, 0);
    let first = env.backup_id(&[&src], &[]);

    const FILES: u64 = 30;
    const FILE_SIZE: usize = 1_000_000;
    for i in 0..FILES {
        write_file(
            &src.join(format!("big/f{i:02}.bin")),
            &random_bytes(FILE_SIZE, 500 + i),
        );
    }
    let state = state_copy(&env, &src, 1);
    let new_bytes = FILES * FILE_SIZE as u64;

    let indexes_before = repo_final_files(&env, "index").len();
    let packs_before = repo_final_files(&env, "data").len();
    let log = env.path("killed.log");
    let mut child = spawn_backup(&env, &src, &log);
    let t = Instant::now();
    let mut killed_after_index = false;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if repo_final_files(&env, "index").len() > indexes_before {
            let _ = child.kill();
            killed_after_index = true;
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(240),
            "the backup neither finished nor wrote an interim index in 240 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let status = child.wait().unwrap();
    let packs_at_kill = repo_final_files(&env, "data").len() - packs_before;
    let indexes_at_kill = repo_final_files(&env, "index").len() - indexes_before;
    eprintln!(
        "trust_crash resume: killed={killed_after_index} after {} ms ({status:?}): {packs_at_kill} new packs, {indexes_at_kill} new index file(s)",
        t.elapsed().as_millis()
    );

    let report = assert_check_clean(&env, &["--read-data"], "after the kill");
    eprintln!(
        "trust_crash resume: check notes after the kill: {}",
        report["notes"]
    );
    assert_snapshot_restores(&env, &first, &src, &first_state, Compare::ALL);

    let summary = env.backup(&[&src], &[]);
    let added = json_u64(&summary, "bytes_added");
    eprintln!(
        "trust_crash resume: the next backup added {added} bytes of {new_bytes} new bytes ({:.0}%)",
        100.0 * added as f64 / new_bytes as f64
    );
    if killed_after_index && status.code().is_none() {
        assert!(indexes_at_kill >= 1 && packs_at_kill >= 16);
        assert!(
            added + 15 * 1_000_000 < new_bytes,
            "the packs indexed before the kill (at least 16 of about 1 MB) are reused: {added} of {new_bytes} bytes added\n{summary}"
        );
    } else {
        eprintln!("trust_crash resume: the backup finished before an interim index appeared; resume not observed");
    }
    assert_check_clean(&env, &["--read-data"], "after the resumed backup");
    let id = summary["snapshot_id"].as_str().unwrap();
    assert_snapshot_restores(&env, id, &src, &state, Compare::ALL);
    assert_snapshot_restores(&env, &first, &src, &first_state, Compare::ALL);
}

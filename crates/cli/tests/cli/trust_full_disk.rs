//! Trust: a repository on a disk that fills up during a backup. The backup fails with a
//! message that says so, nothing already saved is harmed, and once the failed backup's
//! source is gone a small backup still succeeds.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::common::*;

/// A tmpfs mounted for the test; unmounted on drop, even when the test panics.
struct TmpfsMount {
    dir: PathBuf,
}

impl TmpfsMount {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it) at `dir`, or says why not.
    fn new(dir: &Path, size: &str) -> Result<TmpfsMount, String> {
        fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({:?}): {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(TmpfsMount {
            dir: dir.to_path_buf(),
        })
    }

    fn available(&self) -> u64 {
        let st = nix::sys::statvfs::statvfs(&self.dir).unwrap();
        st.blocks_available() as u64 * st.fragment_size() as u64
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let ok = std::process::Command::new("umount")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Something still holds it (a child that outlived a panic): detach it lazily.
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.dir)
                .status();
        }
    }
}

fn tmp_files(dir: &Path) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e.file_name().to_string_lossy().starts_with(".tmp") {
                n += 1;
            }
        }
    }
    n
}

#[test]
fn trust_full_disk_a_backup_that_fills_the_disk_fails_clearly_and_loses_nothing() {
    let started = Instant::now();
    let mut env = TestEnv::new();
    let disk = match TmpfsMount::new(&env.path("disk"), "12m") {
        Ok(m) => m,
        Err(why) => {
            eprintln!("trust_full_disk: SKIPPED: {why}");
            return;
        }
    };
    env.repo = disk.dir.join("repo");
    let mut init = vec!["--pack-size", "1M"];
    init.extend(SMALL_CHUNKS);
    env.init(&init);

    // A first backup that fits.
    let small = env.path("small");
    write_file(&small.join("data.bin"), &random_bytes(2_000_000, 1));
    for i in 0..50u64 {
        write_file(
            &small.join(format!("notes/n{i:02}.txt")),
            &compressible_bytes(3_000 + i as usize * 100, 10 + i),
        );
    }
    let small_state = env.path("states/small-1");
    fs::create_dir_all(small_state.parent().unwrap()).unwrap();
    copy_tree(&small, &small_state);
    let first = env.backup_id(&[&small], &[]);
    // Something else on the disk that the user deletes once the backup has failed.
    let ballast = disk.dir.join("ballast");
    write_file(&ballast, &random_bytes(256 << 10, 2));
    let free_before = disk.available();

    // A backup of 16 MB of random data into the ~10 MB left.
    let big = env.path("big");
    write_random_files(&big, 8, 2_000_000, 100);
    let out = env
        .cmd()
        .args(["backup", "--json"])
        .arg(&big)
        .output()
        .unwrap();
    let err = stderr(&out);
    eprintln!(
        "trust_full_disk: {} bytes free before the big backup; it exited {:?} with stderr: {}",
        free_before,
        out.status.code(),
        err.trim()
    );
    assert!(
        !out.status.success(),
        "a backup larger than the free space fails\n{}",
        describe(&out)
    );
    let lower = err.to_lowercase();
    assert!(
        lower.contains("full") || lower.contains("no space") || lower.contains("space left"),
        "stderr says the disk is full: {err}"
    );
    assert!(
        !lower.contains("panicked"),
        "the failure is reported, not a panic: {err}"
    );
    assert_eq!(
        snapshot_ids(&env),
        vec![first.clone()],
        "the failed backup made no snapshot"
    );
    let leftovers = tmp_files(&env.repo);
    let sessions = repo_final_files(&env, "sessions").len();
    let free_after = disk.available();
    eprintln!(
        "trust_full_disk: after the failure: {free_after} bytes free, {} pack files, {leftovers} temporary file(s), {sessions} session file(s) left",
        repo_final_files(&env, "data").len()
    );

    // Nothing freed: the repository is still sound and the first snapshot restores.
    let report = assert_check_clean(&env, &["--read-data"], "after the disk filled up");
    eprintln!(
        "trust_full_disk: check --read-data on the full disk: {} packs read, notes: {}",
        json_u64(&report, "packs_read"),
        report["notes"]
    );
    assert_snapshot_restores(&env, &first, &small, &small_state, Compare::ALL);

    // The big source is gone, and so is the file the user deleted to make room: a small
    // change backs up in the little space there is (two packs, of 64 KiB each from
    // format 4), without a repair or a prune first.
    fs::remove_dir_all(&big).unwrap();
    fs::remove_file(&ballast).unwrap();
    write_file(
        &small.join("notes/new.txt"),
        b"written after the disk filled up\n",
    );
    write_file(&small.join("added.bin"), &random_bytes(20_000, 7));
    let small_state_2 = env.path("states/small-2");
    copy_tree(&small, &small_state_2);
    let out = env
        .cmd()
        .args(["backup", "--json"])
        .arg(&small)
        .output()
        .unwrap();
    assert_success(&out, "a small backup on the nearly full disk");
    let second = parse_json(&out.stdout, "backup --json")["snapshot_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_check_clean(&env, &["--read-data"], "after the small backup");
    assert_snapshot_restores(&env, &second, &small, &small_state_2, Compare::ALL);
    assert_snapshot_restores(&env, &first, &small, &small_state, Compare::ALL);

    // Prune gives back the space the failed backup used, and still loses nothing.
    let out = env.cmd().args(["prune", "--json"]).output().unwrap();
    assert_success(&out, "prune on the nearly full disk");
    let prune = parse_json(&out.stdout, "prune --json");
    let free_pruned = disk.available();
    eprintln!(
        "trust_full_disk: prune: {} packs deleted, {} deferred, {} unindexed, {} bytes freed; {free_pruned} bytes free now",
        prune["packs_deleted"], prune["packs_deferred"], prune["packs_unindexed"], prune["bytes_freed"]
    );
    assert_check_clean(&env, &["--read-data"], "after prune");

    // Prune leaves packs in no index alone (a backup may be writing them); `repair index`
    // adopts the failed backup's packs, and then prune deletes what no snapshot needs.
    let out = env
        .cmd()
        .args(["repair", "index", "--json"])
        .output()
        .unwrap();
    assert_success(&out, "repair index on the nearly full disk");
    let out = env.cmd().args(["prune", "--json"]).output().unwrap();
    assert_success(&out, "prune after repair index");
    let prune = parse_json(&out.stdout, "prune --json");
    let free_reclaimed = disk.available();
    eprintln!(
        "trust_full_disk: repair index + prune: {} packs deleted, {} deferred, {} bytes freed; {free_reclaimed} bytes free now",
        prune["packs_deleted"], prune["packs_deferred"], prune["bytes_freed"]
    );
    assert!(
        free_reclaimed > free_after + 8_000_000,
        "the failed backup's packs are deleted: {free_after} bytes free before, {free_reclaimed} after"
    );
    assert_check_clean(&env, &["--read-data"], "after repair index and prune");
    assert_snapshot_restores(&env, &second, &small, &small_state_2, Compare::ALL);
    assert_snapshot_restores(&env, &first, &small, &small_state, Compare::ALL);

    // With the space back, a backup that would not have fit before succeeds.
    write_file(&small.join("later.bin"), &random_bytes(4_000_000, 8));
    let small_state_3 = env.path("states/small-3");
    copy_tree(&small, &small_state_3);
    let third = env.backup_id(&[&small], &[]);
    assert_check_clean(&env, &["--read-data"], "after the last backup");
    assert_snapshot_restores(&env, &third, &small, &small_state_3, Compare::ALL);
    eprintln!("trust_full_disk: done in {} s", started.elapsed().as_secs());
    drop(disk);
}

//! A backup to a three-node Garage cluster (replication factor 3, started by
//! `scripts/services.sh`) goes on when a node the client does not talk to dies half-way:
//! Garage writes with a quorum of 2, so cairn must see nothing but, at most, retried
//! requests. The node is started again at the end, so later tests see a whole cluster.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::remote::{remote_cmd, remote_spawnable, run, server_address, unique_address};

/// Long enough for 32 MB stored three times on a loaded 2-core machine.
const BACKUP_DEADLINE: Duration = Duration::from_secs(240);

/// A cluster node stopped by the test; dropping it starts the node again (also when the
/// test fails), with the `start` script the setup wrote into the node's directory, which
/// waits until the node serves again.
struct StoppedNode {
    dir: PathBuf,
}

impl StoppedNode {
    /// Kills the node (SIGKILL, as a crash or a pulled plug) and waits until it is gone.
    fn kill(dir: &Path) -> StoppedNode {
        let pid: i32 = std::fs::read_to_string(dir.join("pid"))
            .unwrap_or_else(|e| panic!("read {}/pid: {e}", dir.display()))
            .trim()
            .parse()
            .unwrap();
        // SAFETY: kill(2) with a pid read from the node's pid file.
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGKILL) },
            0,
            "cluster node {pid} is running"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_alive(pid) {
            assert!(Instant::now() < deadline, "node {pid} dies within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        StoppedNode {
            dir: dir.to_path_buf(),
        }
    }
}

impl Drop for StoppedNode {
    fn drop(&mut self) {
        let out = std::process::Command::new(self.dir.join("start"))
            .output()
            .unwrap();
        // Panicking while already panicking would abort and hide the first failure.
        if !out.status.success() && !std::thread::panicking() {
            panic!("restart {}\n{}", self.dir.display(), describe(&out));
        }
    }
}

/// Whether `pid` runs (a zombie whose parent has not reaped it yet counts as gone).
fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses.
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Packs in the repository at `address`, as the storage layer lists them.
fn count_packs(storage: &dyn cairn_storage::Storage) -> usize {
    storage.list("data").expect("list the packs").len()
}

#[test]
fn remote_backup_to_a_cluster_survives_a_node_dying_half_way() {
    let Some(address) = unique_address("CAIRN_TEST_S3_CLUSTER", "node-down") else {
        return;
    };
    let Some(nodes) = server_address("CAIRN_TEST_S3_CLUSTER_NODES") else {
        return;
    };
    // The client talks to the first node; the last one dies.
    let victim = PathBuf::from(nodes.split_whitespace().last().unwrap());
    let env = TestEnv::new();
    let src = env.path("src");
    write_random_files(&src, 8, 4_000_000, 100);
    let mut init = vec!["init", "--pack-size", "1M"];
    init.extend(SMALL_CHUNKS);
    run(&env, &address, &init);
    let storage = cairn_storage::open(&address).unwrap();

    // Held to 2 MB/s, the 32 MB take sixteen seconds: the node dies near the start however
    // late a loaded machine runs this thread, so most packs are stored after it.
    let mut backup = remote_spawnable(&env, &address)
        .args(["--limit-upload", "2000", "backup", "--json"])
        .arg(&src)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    // Under way: the first packs are in the bucket.
    let packs_at_kill = loop {
        let packs = count_packs(storage.as_ref());
        if packs >= 3 {
            break packs;
        }
        assert!(
            backup.try_wait().unwrap().is_none(),
            "the backup ended before it had stored 3 packs; give it more data"
        );
        assert!(
            started.elapsed() < BACKUP_DEADLINE,
            "the backup stores 3 packs"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let node = StoppedNode::kill(&victim);
    let deadline = Instant::now() + BACKUP_DEADLINE;
    while backup.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = backup.kill();
            panic!("the backup did not finish within {BACKUP_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = backup.wait_with_output().unwrap();
    assert_success(&out, "backup while a cluster node is down");
    let packs = count_packs(storage.as_ref());
    assert!(
        packs >= packs_at_kill + 10,
        "most packs were stored after the node died ({packs_at_kill} before, {packs} in all)"
    );

    // With the node still down, everything reads back.
    let check = remote_cmd(&env, &address)
        .args(["check", "--read-data", "--json"])
        .output()
        .unwrap();
    assert_success(&check, "check --read-data with a node down");
    let report = parse_json(&check.stdout, "check --json");
    assert_eq!(report["problems"], serde_json::json!([]), "{report:#}");
    let target = env.path("restore");
    run(
        &env,
        &address,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);
    drop(node);
}

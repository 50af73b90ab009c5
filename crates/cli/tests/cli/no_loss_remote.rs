//! The no-loss cycle of `no_loss` (issue 16) against the real remote stores of
//! `scripts/services.sh`: a Garage S3 node and an OpenSSH SFTP server on loopback. Here
//! sessions are judged by the times the server gives its files (S3's `Last-Modified`,
//! to the second; the SFTP server's mtime), never by the clock of the host that wrote
//! them. Without the servers these tests say so and pass, unless
//! `CAIRN_TEST_SERVICES=required`.
//!
//! The helpers are `no_loss`'s: with a [`remote_test_env`] every command they run goes
//! to the remote repository, and its packs are listed through the storage layer.

use std::time::Instant;

use crate::common::*;
use crate::no_loss::{
    backup_with_a_wrong_clock_racing_forget_prune, cairn, killed_backup, run, snapshot_id_of,
    sorted, with_clock, KILL_GRACE_SECS, NEW_FILE, SHORT_GRACE_SECS,
};
use crate::remote::remote_test_env;

/// A backup whose clock is `offset` off races `forget --prune`; then a backup is killed
/// once it has stored packs, and the next backup adopts them instead of uploading them
/// again. At the end `check --read-data` is clean and every snapshot restores exactly.
fn no_loss_cycle(env: &TestEnv, offset: &str, time_is_shifted: impl Fn(jiff::Timestamp) -> bool) {
    let started = Instant::now();
    let raced = backup_with_a_wrong_clock_racing_forget_prune(env, offset, time_is_shifted);

    let src = env.path("tree");
    for i in 0..4u64 {
        write_file(
            &src.join(format!("f{i}.bin")),
            &random_bytes(200_000, 50 + i),
        );
    }
    let first_copy = env.path("tree-first");
    copy_tree(&src, &first_copy);
    let first = env.backup_id(&[&src], &[]);

    write_file(&src.join("new.bin"), &random_bytes(NEW_FILE, 60));
    let second_copy = env.path("tree-second");
    copy_tree(&src, &second_copy);
    let (left, killed) = killed_backup(env, &src, None, 2);
    assert!(
        killed && left.len() >= 2,
        "the backup was killed once it had stored 2 packs (killed: {killed}, packs: {})",
        left.len()
    );
    let out = run(
        cairn(env, KILL_GRACE_SECS),
        &["backup", "--json", src.to_str().unwrap()],
    );
    assert_success(&out, "the backup after a killed one");
    let second = snapshot_id_of(&out);
    let summary = parse_json(&out.stdout, "backup --json");
    let added = json_u64(&summary, "bytes_added");
    let adopted = json_u64(&summary, "packs_adopted");
    eprintln!(
        "no_loss remote: the killed backup left {} pack(s); the next one adopted {adopted} \
         and added {added} bytes for a new file of {NEW_FILE}",
        left.len()
    );
    assert!(
        adopted >= left.len() as u64,
        "the next backup adopts the {} pack(s) the killed one left: {summary}",
        left.len()
    );
    assert!(
        added as usize + (left.len() - 1) * 700_000 <= NEW_FILE + 100_000,
        "the next backup uploads only what the killed one did not store, yet it added \
         {added} bytes for a new file of {NEW_FILE}: {summary}"
    );

    assert_check_clean(env, &["--read-data"], "at the end");
    let mut ids = raced.assert_restore(env);
    assert_snapshot_restores(env, &first, &src, &first_copy, Compare::ALL);
    assert_snapshot_restores(env, &second, &src, &second_copy, Compare::ALL);
    ids.extend([first, second]);
    assert_eq!(snapshot_ids(env), sorted(ids));
    eprintln!("no_loss remote {offset}: {} s", started.elapsed().as_secs());
}

fn behind_by_hours(t: jiff::Timestamp, lo: i64, hi: i64) -> bool {
    let behind = jiff::Timestamp::now().duration_since(t);
    behind > jiff::SignedDuration::from_hours(lo) && behind < jiff::SignedDuration::from_hours(hi)
}

/// S3 signs every request with the client's clock and refuses requests too far from its
/// own: AWS beyond 15 minutes, Garage when the request is more than a day old. A host
/// 26 hours behind cannot back up to S3 at all, so this races a host 23 hours behind,
/// which Garage still serves; [`no_loss_remote_s3_refuses_a_host_26_hours_behind`]
/// covers the rest.
#[test]
fn no_loss_remote_s3_a_backup_23_hours_behind_racing_forget_prune_and_a_killed_backup_lose_nothing()
{
    let Some(env) = remote_test_env("CAIRN_TEST_S3", "no-loss") else {
        return;
    };
    no_loss_cycle(&env, "-23h", |t| behind_by_hours(t, 22, 24));
}

/// The SFTP server stamps files by its own clock, whatever the client's.
#[test]
fn no_loss_remote_sftp_a_backup_26_hours_behind_racing_forget_prune_and_a_killed_backup_lose_nothing(
) {
    let Some(env) = remote_test_env("CAIRN_TEST_SFTP", "no-loss") else {
        return;
    };
    no_loss_cycle(&env, "-26h", |t| behind_by_hours(t, 25, 27));
}

/// A host 26 hours behind gets a clear error from S3 and changes nothing.
#[test]
fn no_loss_remote_s3_refuses_a_host_26_hours_behind() {
    let Some(env) = remote_test_env("CAIRN_TEST_S3", "skewed") else {
        return;
    };
    env.init(&[]);
    let src = env.path("src");
    write_file(&src.join("a.bin"), &random_bytes(100_000, 1));
    let out = run(
        with_clock(cairn(&env, SHORT_GRACE_SECS), "-26h"),
        &["backup", src.to_str().unwrap()],
    );
    assert_exit(&out, 1, "a backup from a host 26 hours behind");
    let err = stderr(&out);
    assert!(
        err.contains(env.repo.to_str().unwrap()) && err.contains("clock"),
        "the error names the repository and the clock:\n{err}"
    );
    assert!(snapshot_ids(&env).is_empty());
    assert_check_clean(&env, &["--read-data"], "after the refused backup");
}

//! Issue 16: `check`, `repair index` and `repair snapshots` converge. After each kind of
//! damage, running the commands `check` prints, literally and once, leaves a repository
//! that `check --read-data` finds clean; then no repair changes anything (not one file of
//! the repository), no snapshot is duplicated, and every snapshot the damage did not touch
//! keeps its id and restores exactly.
//!
//! The fixture: six snapshots of one tree. Backup 2 adds `var/big.bin`, the only new data
//! of that backup, and backup 4 deletes it again; damage to the packs backup 2 wrote hits
//! snapshots 2 and 3 only.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::*;

struct Snap {
    id: String,
    tag: String,
    /// A copy of the source as it was backed up.
    state: PathBuf,
}

struct Fixture {
    env: TestEnv,
    src: PathBuf,
    snaps: Vec<Snap>,
    /// Data packs that backup 2 wrote, largest first: they hold `var/big.bin`.
    packs_of_2: Vec<PathBuf>,
    /// Index files that backup 2 wrote.
    index_of_2: Vec<PathBuf>,
}

const BIG: &str = "var/big.bin";
/// The snapshots that hold `BIG`.
const HIT: [&str; 2] = ["state-2", "state-3"];

fn fixture() -> Fixture {
    let env = TestEnv::new();
    let mut init = vec!["--pack-size", "1M"];
    init.extend(SMALL_CHUNKS);
    env.init(&init);
    let src = env.path("src");
    let mut snaps = Vec::new();
    let (mut packs_of_2, mut index_of_2) = (Vec::new(), Vec::new());
    for n in 0..6u64 {
        match n {
            0 => {
                write_file(&src.join("keep/a.bin"), &random_bytes(300_000, 1));
                write_file(&src.join("keep/notes.txt"), &compressible_bytes(50_000, 2));
                write_file(&src.join("var/small.txt"), b"small\n");
            }
            1 => write_file(&src.join("keep/b.bin"), &random_bytes(200_000, 3)),
            2 => write_file(&src.join(BIG), &random_bytes(1_500_000, 4)),
            3 => write_file(&src.join("keep/c.txt"), b"three\n"),
            4 => {
                fs::remove_file(src.join(BIG)).unwrap();
                write_file(&src.join("keep/d.bin"), &random_bytes(100_000, 5));
            }
            _ => write_file(&src.join("keep/e.txt"), b"five\n"),
        }
        let tag = format!("state-{n}");
        let state = env.path(&format!("states/{n}"));
        fs::create_dir_all(state.parent().unwrap()).unwrap();
        copy_tree(&src, &state);
        let (packs, indexes) = (env.repo_files("data"), env.repo_files("index"));
        let id = env.backup_id(&[&src], &["--tag", &tag]);
        if n == 2 {
            packs_of_2 = new_files(&packs, &env.repo_files("data"));
            index_of_2 = new_files(&indexes, &env.repo_files("index"));
        }
        snaps.push(Snap { id, tag, state });
    }
    packs_of_2.sort_by_key(|p| std::cmp::Reverse(fs::metadata(p).unwrap().len()));
    assert!(
        fs::metadata(&packs_of_2[0]).unwrap().len() > 500_000,
        "backup 2 wrote a data pack of big.bin: {packs_of_2:?}"
    );
    assert!(!index_of_2.is_empty(), "backup 2 wrote an index file");
    Fixture {
        env,
        src,
        snaps,
        packs_of_2,
        index_of_2,
    }
}

fn new_files(before: &[PathBuf], after: &[PathBuf]) -> Vec<PathBuf> {
    after
        .iter()
        .filter(|p| !before.contains(p))
        .cloned()
        .collect()
}

/// Every file of the repository with its size: what a repair that changes nothing leaves
/// exactly as it was (files are named by their content).
fn repo_listing(env: &TestEnv) -> BTreeMap<PathBuf, u64> {
    env.repo_files("")
        .into_iter()
        .map(|p| {
            let len = fs::metadata(&p).unwrap().len();
            (p.strip_prefix(&env.repo).unwrap().to_path_buf(), len)
        })
        .collect()
}

/// `cairn check EXTRA...` as a user sees it: exit code and what it printed.
fn check_text(env: &TestEnv, extra: &[&str]) -> (i32, String) {
    let out = env.cmd().arg("check").args(extra).output().unwrap();
    let code = out.status.code().unwrap_or(-1);
    assert!(
        code == 0 || code == 1,
        "check exits 0 or 1\n{}",
        describe(&out)
    );
    (code, stdout(&out))
}

/// The commands check tells the user to run, in its order: the lines under
/// "To repair, run in this order:".
fn advice(text: &str) -> Vec<String> {
    let mut lines = text
        .lines()
        .skip_while(|l| *l != "To repair, run in this order:");
    lines.next();
    lines
        .take_while(|l| l.starts_with("  cairn "))
        .map(|l| l.trim().to_string())
        .collect()
}

/// Runs `cairn ...` as the advice spells it; it must succeed.
fn run_command(env: &TestEnv, command: &str) -> String {
    let words: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(words[0], "cairn", "advice is a cairn command: {command}");
    let out = env.cmd().args(&words[1..]).output().unwrap();
    assert_success(&out, command);
    stdout(&out)
}

fn snapshots_by_tag(env: &TestEnv) -> BTreeMap<String, Vec<Value>> {
    let mut by_tag: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for s in env.snapshots() {
        let tag = s["tags"]
            .as_array()
            .and_then(|t| {
                t.iter()
                    .filter_map(|t| t.as_str())
                    .find(|t| t.starts_with("state-"))
            })
            .unwrap_or_else(|| panic!("every snapshot carries its state tag: {s}"))
            .to_string();
        by_tag.entry(tag).or_default().push(s);
    }
    by_tag
}

fn has_tag(s: &Value, tag: &str) -> bool {
    s["tags"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t.as_str() == Some(tag)))
}

/// Every repair, run again, changes no file of the repository and says so.
fn assert_repairs_change_nothing(f: &Fixture, case: &str, advised: &[String]) {
    let before = repo_listing(&f.env);
    let mut commands: Vec<String> = [
        "cairn repair index",
        "cairn repair index --read-data",
        "cairn repair snapshots",
        "cairn repair snapshots --forget",
    ]
    .iter()
    .map(|c| c.to_string())
    .collect();
    commands.extend(advised.iter().cloned());
    for command in &commands {
        let out = run_command(&f.env, command);
        assert!(
            out.contains("nothing to do"),
            "{case}: `{command}` after the repair says it has nothing to do:\n{out}"
        );
        let after = repo_listing(&f.env);
        let (gone, new): (BTreeSet<_>, BTreeSet<_>) = (
            before.keys().filter(|p| !after.contains_key(*p)).collect(),
            after.keys().filter(|p| !before.contains_key(*p)).collect(),
        );
        assert!(
            before == after,
            "{case}: `{command}` run again changes the repository: removed {gone:?}, added {new:?}"
        );
    }
    // And in --json, for scripts: nothing repaired, nothing removed, the index as it was.
    let out = f
        .env
        .cmd()
        .args(["repair", "snapshots", "--forget", "--json"])
        .output()
        .unwrap();
    assert_success(&out, "repair snapshots --forget --json");
    let r = parse_json(&out.stdout, "repair snapshots --json");
    for field in [
        "snapshots_repaired",
        "snapshots_already_repaired",
        "snapshots_lost_ids",
    ] {
        assert_eq!(r[field], Value::Array(vec![]), "{case}: {field} in {r}");
    }
    assert_eq!(r["snapshots_removed"], 0, "{case}: {r}");
    let out = f
        .env
        .cmd()
        .args(["repair", "index", "--read-data", "--json"])
        .output()
        .unwrap();
    assert_success(&out, "repair index --read-data --json");
    let r = parse_json(&out.stdout, "repair index --json");
    assert_eq!(r["up_to_date"], true, "{case}: {r}");
    assert_eq!(
        repo_listing(&f.env),
        before,
        "{case}: the --json runs change nothing"
    );
}

/// Restores `id` and compares it with `state`: exactly, or, for a repaired snapshot,
/// every file but `BIG`, which is gone or kept as a `.damaged` entry.
fn assert_restores(f: &Fixture, id: &str, state: &Path, repaired: bool) {
    if !repaired {
        assert_snapshot_restores(&f.env, id, &f.src, state, Compare::ALL);
        return;
    }
    let target = f.env.path(&format!("restore-{}", &id[..8]));
    f.env.restore(id, &target, &[]);
    let root = restored_path(&target, &f.src);
    let mut restored = files_below(&root);
    assert!(
        root.join(format!("{BIG}.damaged")).exists() || root.join("var.damaged").exists(),
        "repaired snapshot {id} marks what it lost as .damaged: {:?}",
        restored.keys().collect::<Vec<_>>()
    );
    restored.retain(|p, _| !p.to_string_lossy().contains(".damaged"));
    let mut expected = files_below(state);
    expected.remove(Path::new(BIG));
    assert!(
        restored == expected,
        "repaired snapshot {id} restores every file it did not lose, exactly: restored {:?}, expected {:?}",
        restored.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    fs::remove_dir_all(&target).unwrap();
}

/// Damages the fixture, follows `check CHECK_ARGS...`'s advice once, and checks that the
/// repository converged. `hit`: the snapshots the damage loses data of.
fn converge(case: &str, check_args: &[&str], hit: &[&str], damage: impl FnOnce(&Fixture)) {
    let f = fixture();
    let env = &f.env;
    assert_check_clean(env, &["--read-data"], "the undamaged fixture");
    damage(&f);

    let (code, text) = check_text(env, check_args);
    assert_eq!(
        code, 1,
        "{case}: check {check_args:?} finds the damage:\n{text}"
    );
    let advised = advice(&text);
    eprintln!("{case}: check {check_args:?} advises {advised:?}");
    assert!(
        !advised.is_empty(),
        "{case}: check names the repair commands:\n{text}"
    );
    if !hit.is_empty() {
        assert!(
            advised
                .iter()
                .any(|c| c == "cairn repair snapshots --forget"),
            "{case}: data is lost, and check says to replace the damaged snapshots:\n{text}"
        );
        assert!(
            text.contains("the damaged originals are removed"),
            "{case}: check says what --forget does:\n{text}"
        );
    }
    for command in &advised {
        let out = run_command(env, command);
        eprintln!("{case}: {command}:\n{out}");
    }

    assert_check_clean(env, &["--read-data"], &format!("{case}: after {advised:?}"));
    let (code, text) = check_text(env, &[]);
    assert_eq!(code, 0, "{case}: plain check is clean too:\n{text}");
    assert!(
        advice(&text).is_empty(),
        "{case}: nothing left to advise:\n{text}"
    );

    // One snapshot per state: the undamaged ones as they were, the hit ones replaced.
    let by_tag = snapshots_by_tag(env);
    assert_eq!(
        by_tag.values().map(|v| v.len()).sum::<usize>(),
        f.snaps.len(),
        "{case}: as many snapshots as before the damage: {by_tag:?}"
    );
    for s in &f.snaps {
        let now = &by_tag[&s.tag];
        assert_eq!(now.len(), 1, "{case}: one snapshot of {}: {now:?}", s.tag);
        let id = now[0]["id"].as_str().unwrap().to_string();
        let repaired = hit.contains(&s.tag.as_str());
        if repaired {
            assert_ne!(id, s.id, "{case}: damaged {} was replaced", s.tag);
            assert!(has_tag(&now[0], "repaired"), "{case}: {}", now[0]);
        } else {
            assert_eq!(id, s.id, "{case}: undamaged {} keeps its id", s.tag);
        }
    }

    assert_repairs_change_nothing(&f, case, &advised);
    assert_check_clean(
        env,
        &["--read-data"],
        &format!("{case}: after the second runs"),
    );
    assert_eq!(
        snapshots_by_tag(env),
        by_tag,
        "{case}: the second runs keep every snapshot"
    );
    // Prune deletes what the repair condemned; the repairs still find nothing to do.
    run_command(env, "cairn prune");
    assert_check_clean(env, &["--read-data"], &format!("{case}: after prune"));
    assert_repairs_change_nothing(&f, &format!("{case}, after prune"), &advised);

    for s in &f.snaps {
        let id = by_tag[&s.tag][0]["id"].as_str().unwrap();
        assert_restores(&f, id, &s.state, hit.contains(&s.tag.as_str()));
    }
}

#[test]
fn repairs_converge_after_a_flipped_byte_in_a_pack() {
    // Only reading the data finds it, so the advice to follow is that of --read-data.
    converge("pack-flip", &["--read-data"], &HIT, |f| {
        let pack = &f.packs_of_2[0];
        let mut bytes = fs::read(pack).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        fs::write(pack, bytes).unwrap();
    });
}

#[test]
fn repairs_converge_after_a_deleted_pack() {
    converge("pack-delete", &[], &HIT, |f| {
        fs::remove_file(&f.packs_of_2[0]).unwrap();
    });
}

#[test]
fn repairs_converge_after_a_truncated_pack() {
    // Without --read-data, check sees the header is gone but not which blobs are: its
    // advice must still be enough.
    converge("pack-truncate", &[], &HIT, |f| {
        let pack = &f.packs_of_2[0];
        let len = fs::metadata(pack).unwrap().len();
        fs::OpenOptions::new()
            .write(true)
            .open(pack)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
    });
}

#[test]
fn repairs_converge_after_a_truncated_pack_following_check_read_data() {
    converge("pack-truncate-read-data", &["--read-data"], &HIT, |f| {
        let pack = &f.packs_of_2[0];
        let len = fs::metadata(pack).unwrap().len();
        fs::OpenOptions::new()
            .write(true)
            .open(pack)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
    });
}

#[test]
fn repairs_converge_after_a_deleted_index_file() {
    // Nothing is lost: the packs are all there, so no snapshot may change.
    converge("index-delete", &[], &[], |f| {
        for index in &f.index_of_2 {
            fs::remove_file(index).unwrap();
        }
    });
}

/// What the user of issue 16 did: ran `repair index --read-data` and `repair snapshots`
/// (without --forget) as check then advised, and again, which duplicated the repaired
/// snapshots (10 -> 15) while check kept reporting the same problem.
#[test]
fn r16_repair_snapshots_run_twice_does_not_duplicate_and_check_then_advises_forget() {
    let f = fixture();
    let env = &f.env;
    fs::remove_file(&f.packs_of_2[0]).unwrap();
    run_command(env, "cairn repair index --read-data");
    let out = run_command(env, "cairn repair snapshots");
    assert!(out.contains("repaired as"), "{out}");
    let count = env.snapshots().len();
    assert_eq!(
        count,
        f.snaps.len() + HIT.len(),
        "a repaired copy beside each damaged one"
    );

    let before = repo_listing(env);
    for command in ["cairn repair snapshots", "cairn repair index --read-data"] {
        let out = run_command(env, command);
        assert!(
            out.contains("nothing to do"),
            "`{command}` again has nothing to do:\n{out}"
        );
        assert_eq!(
            repo_listing(env),
            before,
            "`{command}` again changes nothing"
        );
    }
    assert!(
        run_command(env, "cairn repair snapshots").contains("already repaired as"),
        "repair snapshots names the repaired versions it found"
    );

    let (code, text) = check_text(env, &[]);
    assert_eq!(code, 1, "the damaged originals are still there:\n{text}");
    assert_eq!(
        advice(&text),
        vec!["cairn repair snapshots --forget".to_string()],
        "check advises exactly what makes the repository clean:\n{text}"
    );
    assert!(
        text.contains("already have a repaired version"),
        "check says the damaged snapshots were repaired already:\n{text}"
    );
    run_command(env, "cairn repair snapshots --forget");
    assert_check_clean(env, &["--read-data"], "after repair snapshots --forget");
    let by_tag = snapshots_by_tag(env);
    assert_eq!(
        env.snapshots().len(),
        f.snaps.len(),
        "one snapshot per state: {by_tag:?}"
    );
    for tag in HIT {
        assert!(
            has_tag(&by_tag[tag][0], "repaired"),
            "{tag}: {:?}",
            by_tag[tag]
        );
    }
}

//! Trust: damage to a repository is found, never turns into wrong bytes, and the repair
//! commands bring the repository back to a clean check without losing anything that did
//! not depend on the damage.
//!
//! Each case damages a copy of the same four-snapshot repository, then:
//! 1. `check` (and `check --read-data`) exit 1 and name the damaged object;
//! 2. restoring each snapshot writes no file with wrong bytes, and every file that check
//!    did not list as damaged is restored;
//! 3. `repair index --read-data`, `repair snapshots --forget` (then `prune`, then the
//!    repair each remaining problem names) give a clean `check --read-data`;
//! 4. every remaining snapshot restores, with correct bytes in every file that is not a
//!    `.damaged` one, and every file check did not list as damaged is still there.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::*;

struct Snap {
    id: String,
    tag: String,
    state: PathBuf,
}

struct Base {
    env: TestEnv,
    src: PathBuf,
    snaps: Vec<Snap>,
}

/// Four snapshots of one evolving tree of about 1.5 MB, tagged state-0..state-3.
fn build_base() -> Base {
    let env = TestEnv::new();
    let mut init = vec!["--pack-size", "1M"];
    init.extend(SMALL_CHUNKS);
    env.init(&init);
    let src = env.path("src");
    let mut snaps = Vec::new();
    for n in 0..4u64 {
        match n {
            0 => {
                write_file(&src.join("keep/r1.bin"), &random_bytes(300_000, 1));
                write_file(&src.join("keep/text.log"), &compressible_bytes(400_000, 2));
                for i in 0..30u64 {
                    let len = 200 + (i as usize * 97) % 2800;
                    let body = if i % 2 == 0 {
                        random_bytes(len, 100 + i)
                    } else {
                        compressible_bytes(len, 100 + i)
                    };
                    write_file(&src.join(format!("keep/small/f{i:02}")), &body);
                }
                write_file(&src.join("var/a.bin"), &random_bytes(200_000, 10));
                write_file(&src.join("var/edit.txt"), b"v0\n");
            }
            1 => {
                write_file(&src.join("var/b.bin"), &random_bytes(200_000, 11));
                write_file(&src.join("var/edit.txt"), b"v1\n");
                write_file(&src.join("keep/small/f03"), &random_bytes(1500, 13));
            }
            2 => {
                fs::remove_file(src.join("var/a.bin")).unwrap();
                write_file(&src.join("extra/deep/x.bin"), &random_bytes(150_000, 12));
                write_file(&src.join("extra/deep/y.txt"), b"why\n");
            }
            _ => {
                write_file(&src.join("var/edit.txt"), b"v3\n");
                let mut log = fs::OpenOptions::new()
                    .append(true)
                    .open(src.join("keep/text.log"))
                    .unwrap();
                log.write_all(&compressible_bytes(100_000, 3)).unwrap();
                fs::remove_file(src.join("keep/small/f05")).unwrap();
            }
        }
        let tag = format!("state-{n}");
        let state = env.path(&format!("states/{n}"));
        fs::create_dir_all(state.parent().unwrap()).unwrap();
        copy_tree(&src, &state);
        let id = env.backup_id(&[&src], &["--tag", &tag]);
        snaps.push(Snap { id, tag, state });
    }
    Base { env, src, snaps }
}

// ---------------------------------------------------------------------------------------
// Ways to damage
// ---------------------------------------------------------------------------------------

fn name_of(p: &Path) -> String {
    p.file_name().unwrap().to_str().unwrap().to_string()
}

/// Packs, largest first (ties by name).
fn packs_by_size(env: &TestEnv) -> Vec<PathBuf> {
    let mut packs = repo_final_files(env, "data");
    packs.sort_by_key(|p| (std::cmp::Reverse(fs::metadata(p).unwrap().len()), p.clone()));
    assert!(
        packs.len() >= 3,
        "the base repository has several packs: {packs:?}"
    );
    packs
}

fn flip_byte(path: &Path, offset: usize) {
    let mut bytes = fs::read(path).unwrap();
    bytes[offset] ^= 0x10;
    fs::write(path, bytes).unwrap();
}

/// What a case did and what check must name.
struct Damage {
    what: String,
    /// Strings one of check's problem objects must contain (file names of what was hit).
    named: Vec<String>,
    /// Only `check --read-data` can see it.
    silent: bool,
    /// Only metadata was hit and the data survives elsewhere: after repair, every snapshot
    /// restores completely, with no `.damaged` file.
    lossless: bool,
}

// ---------------------------------------------------------------------------------------
// What check reported, and what it excuses
// ---------------------------------------------------------------------------------------

/// The damage check reported: a file may be missing (or `.damaged` after repair) only if
/// it, or a directory above it, is listed for its snapshot, or its whole snapshot is.
#[derive(Default)]
struct Excuses {
    /// Short ids of snapshots lost as a whole.
    whole: BTreeSet<String>,
    paths: BTreeMap<String, Vec<PathBuf>>,
    /// Some problem listed only part of the paths it damages.
    everything: bool,
}

impl Excuses {
    fn add(&mut self, report: &Value) {
        for p in report["problems"].as_array().unwrap() {
            if let Some(id) = damaged_snapshot_file(p) {
                self.whole.insert(id[..8].to_string());
            }
            let damages = p["damages"].as_array().unwrap();
            if p["damaged_paths"].as_u64().unwrap_or(0) > damages.len() as u64 {
                self.everything = true;
            }
            for d in damages {
                let snap: String = d["snapshot_id"].as_str().unwrap().chars().take(8).collect();
                let path = d["path"].as_str().unwrap();
                if path == "/" {
                    self.whole.insert(snap);
                } else {
                    self.paths
                        .entry(snap)
                        .or_default()
                        .push(PathBuf::from(path));
                }
            }
        }
    }

    fn excused(&self, snap: &str, abs: &Path) -> bool {
        let short: String = snap.chars().take(8).collect();
        self.everything
            || self.whole.contains(&short)
            || self
                .paths
                .get(&short)
                .is_some_and(|ps| ps.iter().any(|p| abs.starts_with(p)))
    }

    fn whole_snapshot(&self, snap: &str) -> bool {
        self.everything
            || self
                .whole
                .contains(&snap.chars().take(8).collect::<String>())
    }

    fn touches(&self, snap: &str) -> bool {
        let short: String = snap.chars().take(8).collect();
        self.everything || self.whole.contains(&short) || self.paths.contains_key(&short)
    }
}

fn problems_summary(report: &Value) -> String {
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "[{}: {} ({} damaged paths; repair: {})]",
                p["object"].as_str().unwrap_or("?"),
                p["problem"].as_str().unwrap_or("?"),
                p["damaged_paths"],
                p["repair"].as_str().unwrap_or("?")
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The problem's object and its description, where check names the damaged file.
fn problem_text(p: &Value) -> String {
    format!(
        "{} {}",
        p["object"].as_str().unwrap_or(""),
        p["problem"].as_str().unwrap_or("")
    )
}

fn names_object(report: &Value, needle: &str) -> bool {
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| problem_text(p).contains(needle))
}

/// The id of the snapshot file a problem is about, if it is about one.
fn damaged_snapshot_file(p: &Value) -> Option<String> {
    let text = problem_text(p);
    let at = text.find("snapshots/")? + "snapshots/".len();
    let id: String = text[at..].chars().take(64).collect();
    is_hex(&id, 64).then_some(id)
}

/// Restores `snapshot` (the original `orig`, or its repaired version) and checks every
/// restored file against the state it was taken from. Returns (files restored intact,
/// files missing, `.damaged` files).
fn verify_restore(
    b: &Base,
    snapshot: &str,
    orig: &Snap,
    ex: &Excuses,
    after_repair: bool,
) -> (usize, usize, usize) {
    let env = &b.env;
    let target = env.path(&format!("restore-{}-{}", after_repair, &snapshot[..8]));
    let out = env
        .cmd()
        .arg("restore")
        .arg(snapshot)
        .arg("--target")
        .arg(&target)
        .output()
        .unwrap();
    if after_repair || !ex.touches(&orig.id) {
        assert_success(
            &out,
            &format!(
                "restore of snapshot {snapshot} ({}{})",
                orig.tag,
                if after_repair {
                    ", after repair"
                } else {
                    ", which check found undamaged"
                }
            ),
        );
    }
    let root = restored_path(&target, &b.src);
    let expected = files_below(&orig.state);
    let (mut intact, mut damaged) = (0, 0);
    for (rel, contents) in files_below(&target) {
        let inside = target
            .join(&rel)
            .strip_prefix(&root)
            .unwrap_or_else(|_| {
                panic!(
                    "restore of {snapshot} wrote {} outside the source",
                    rel.display()
                )
            })
            .to_path_buf();
        let name = inside.to_string_lossy().into_owned();
        if let Some(original) = name.strip_suffix(".damaged") {
            assert!(
                after_repair,
                "restore of {snapshot} before repair wrote {name}"
            );
            assert!(
                ex.excused(&orig.id, &b.src.join(original)),
                "{name} in {snapshot} ({}) is marked damaged, but check did not list {original} as damaged",
                orig.tag
            );
            damaged += 1;
            continue;
        }
        let want = expected.get(&inside).unwrap_or_else(|| {
            panic!(
                "restore of {snapshot} ({}) wrote {name}, which was not in the backed-up tree",
                orig.tag
            )
        });
        assert!(
            *want == contents,
            "restore of {snapshot} ({}) wrote WRONG BYTES to {name}: {} bytes, expected {}",
            orig.tag,
            contents.len(),
            want.len()
        );
        intact += 1;
    }
    let mut missing = 0;
    for rel in expected.keys() {
        if root.join(rel).is_file() {
            continue;
        }
        missing += 1;
        assert!(
            ex.excused(&orig.id, &b.src.join(rel)),
            "restore of {snapshot} ({}{}) lacks {}, which check did not list as damaged\n{}",
            orig.tag,
            if after_repair { ", after repair" } else { "" },
            rel.display(),
            describe(&out)
        );
    }
    let _ = fs::remove_dir_all(&target);
    (intact, missing, damaged)
}

/// `cairn ARGS... --json`: exit code, report and stderr.
fn run_json(env: &TestEnv, args: &[&str]) -> (i32, Value, String) {
    let out = env.cmd().args(args).arg("--json").output().unwrap();
    let code = out.status.code().unwrap_or(-1);
    let report = if out.stdout.is_empty() {
        Value::Null
    } else {
        parse_json(&out.stdout, &format!("cairn {} --json", args.join(" ")))
    };
    (code, report, stderr(&out))
}

fn run_case(case: &str, damage: impl FnOnce(&Base) -> Damage) {
    let b = build_base();
    let env = &b.env;
    assert_check_clean(env, &["--read-data"], "the undamaged base repository");
    let d = damage(&b);

    // 1. Check finds it and names it.
    let (plain_code, plain) = check_report(env, &[]);
    let (read_code, read) = check_report(env, &["--read-data"]);
    eprintln!(
        "trust_damage {case}: {}: check exit {plain_code} {}; check --read-data exit {read_code} {}",
        d.what,
        problems_summary(&plain),
        problems_summary(&read)
    );
    assert_eq!(
        read_code, 1,
        "{case}: check --read-data finds the damage:\n{read:#}"
    );
    if !d.silent {
        assert_eq!(
            plain_code, 1,
            "{case}: check (without --read-data) finds the damage:\n{plain:#}"
        );
    }
    for needle in &d.named {
        let report = if d.silent { &read } else { &plain };
        assert!(
            names_object(report, needle),
            "{case}: check names the damaged object {needle}:\n{report:#}"
        );
    }
    let mut ex = Excuses::default();
    ex.add(&plain);
    ex.add(&read);

    // 2. Restores give right bytes or nothing, and everything check did not list.
    let mut before = (0, 0);
    for s in &b.snaps {
        let (intact, missing, _) = verify_restore(&b, &s.id, s, &ex, false);
        before.0 += intact;
        before.1 += missing;
    }

    // 3. Repair.
    let (index_code, index, index_err) = run_json(env, &["repair", "index", "--read-data"]);
    // Exit 1 is how `repair index` says that some packs were unreadable and left out.
    assert!(
        index_code == 0
            || (index_code == 1 && index["packs_unreadable"].as_array().is_some_and(|u| !u.is_empty())),
        "{case}: repair index --read-data exits 0, or 1 listing unreadable packs: exit {index_code}, {index}\n{index_err}"
    );
    let (snap_code, snapshots, snap_err) = run_json(env, &["repair", "snapshots", "--forget"]);
    assert_eq!(
        snap_code, 0,
        "{case}: repair snapshots --forget succeeds: {snapshots}\n{snap_err}"
    );
    let mut steps = vec![
        format!("repair index --read-data (exit {index_code})"),
        "repair snapshots --forget".to_string(),
    ];
    let (mut code, mut report) = check_report(env, &["--read-data"]);
    if code != 0 {
        let (prune_code, _, prune_err) = run_json(env, &["prune"]);
        steps.push(format!("prune (exit {prune_code}: {})", prune_err.trim()));
        (code, report) = check_report(env, &["--read-data"]);
    }
    if code != 0 {
        // Follow the repair the remaining problems name, when it is `cairn forget ID`.
        for p in report["problems"].as_array().unwrap().clone() {
            let hint = p["repair"].as_str().unwrap_or("");
            if let (true, Some(id)) = (hint.starts_with("cairn forget"), damaged_snapshot_file(&p))
            {
                let out = env.cmd().args(["forget", &id]).output().unwrap();
                steps.push(format!(
                    "forget {} as check's hint says (exit {:?}: {})",
                    &id[..8],
                    out.status.code(),
                    stderr(&out).trim()
                ));
            }
        }
        (code, report) = check_report(env, &["--read-data"]);
    }
    eprintln!(
        "trust_damage {case}: repair index: {} packs indexed, {} blobs damaged, {} packs condemned, unreadable {}; \
         repair snapshots: {} repaired, {} lost, {} files and {} dirs damaged; steps: {}",
        index["packs_indexed"],
        index["blobs_damaged"],
        index["packs_condemned"],
        index["packs_unreadable"],
        snapshots["snapshots_repaired"].as_array().map_or(0, |a| a.len()),
        snapshots["snapshots_lost_ids"].as_array().map_or(0, |a| a.len()),
        snapshots["files_damaged"],
        snapshots["dirs_damaged"],
        steps.join(", ")
    );
    assert_eq!(
        code,
        0,
        "{case}: after {} check --read-data is clean:\n{}",
        steps.join(", "),
        problems_summary(&report)
    );

    // 4. What remains restores correctly, and nothing undamaged was lost.
    let remaining = env.snapshots();
    let mut after = (0, 0, 0);
    for s in &b.snaps {
        let now: Vec<&Value> = remaining
            .iter()
            .filter(|r| {
                r["tags"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|t| t.as_str() == Some(&s.tag)))
            })
            .collect();
        if now.is_empty() {
            assert!(
                ex.whole_snapshot(&s.id),
                "{case}: snapshot {} ({}) disappeared, but check did not find it lost as a whole",
                &s.id[..8],
                s.tag
            );
            continue;
        }
        assert_eq!(now.len(), 1, "{case}: one snapshot per state after repair");
        let id = now[0]["id"].as_str().unwrap();
        if id != s.id {
            assert!(
                now[0]["tags"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|t| t.as_str() == Some("repaired"))),
                "{case}: a rewritten snapshot carries the tag `repaired`: {}",
                now[0]
            );
        }
        let (intact, missing, damaged) = verify_restore(&b, id, s, &ex, true);
        after.0 += intact;
        after.1 += missing;
        after.2 += damaged;
        if d.lossless {
            assert_eq!(
                (missing, damaged),
                (0, 0),
                "{case}: only metadata was damaged; {} ({}) restores completely after repair",
                &id[..8],
                s.tag
            );
        }
    }
    if d.lossless {
        assert_eq!(
            remaining.len(),
            b.snaps.len(),
            "{case}: only metadata was damaged; every snapshot survives the repair"
        );
    }
    eprintln!(
        "trust_damage {case}: before repair {} files restored intact, {} missing (all listed by check); \
         after repair {} snapshots, {} files intact, {} missing, {} .damaged",
        before.0,
        before.1,
        remaining.len(),
        after.0,
        after.1,
        after.2
    );
}

// ---------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------

#[test]
fn trust_damage_one_flipped_byte_in_a_pack() {
    run_case("pack-flip", |b| {
        let pack = packs_by_size(&b.env)[0].clone();
        let len = fs::metadata(&pack).unwrap().len() as usize;
        flip_byte(&pack, len / 3);
        Damage {
            what: format!(
                "flipped a byte at 1/3 of the largest pack {}",
                name_of(&pack)
            ),
            named: vec![name_of(&pack)],
            silent: true,
            lossless: false,
        }
    });
}

#[test]
fn trust_damage_a_truncated_pack() {
    run_case("pack-truncate", |b| {
        let pack = packs_by_size(&b.env)[1].clone();
        let len = fs::metadata(&pack).unwrap().len();
        fs::OpenOptions::new()
            .write(true)
            .open(&pack)
            .unwrap()
            .set_len(len * 2 / 3)
            .unwrap();
        Damage {
            what: format!(
                "truncated the second largest pack {} to 2/3",
                name_of(&pack)
            ),
            named: vec![name_of(&pack)],
            silent: false,
            lossless: false,
        }
    });
}

#[test]
fn trust_damage_a_deleted_pack() {
    run_case("pack-delete", |b| {
        let pack = packs_by_size(&b.env)[2].clone();
        fs::remove_file(&pack).unwrap();
        Damage {
            what: format!("deleted the third largest pack {}", name_of(&pack)),
            named: vec![name_of(&pack)],
            silent: false,
            lossless: false,
        }
    });
}

#[test]
fn trust_damage_a_deleted_index_file() {
    run_case("index-delete", |b| {
        let index = repo_final_files(&b.env, "index");
        assert!(!index.is_empty());
        fs::remove_file(&index[0]).unwrap();
        Damage {
            what: format!(
                "deleted index file {} of {}",
                name_of(&index[0]),
                index.len()
            ),
            // What is lost is the index entry of each blob: check can only name the index.
            named: vec!["index".into()],
            silent: false,
            lossless: true,
        }
    });
}

#[test]
fn trust_damage_a_corrupted_index_file() {
    run_case("index-corrupt", |b| {
        let index = repo_final_files(&b.env, "index");
        let len = fs::metadata(&index[0]).unwrap().len() as usize;
        flip_byte(&index[0], len / 2);
        Damage {
            what: format!("flipped a byte in index file {}", name_of(&index[0])),
            named: vec![name_of(&index[0])],
            silent: false,
            lossless: true,
        }
    });
}

#[test]
fn trust_damage_all_index_files_deleted() {
    run_case("index-delete-all", |b| {
        let index = repo_final_files(&b.env, "index");
        for f in &index {
            fs::remove_file(f).unwrap();
        }
        Damage {
            what: format!("deleted all {} index files", index.len()),
            named: vec!["index".into()],
            silent: false,
            lossless: true,
        }
    });
}

#[test]
fn trust_damage_all_packs_deleted() {
    run_case("pack-delete-all", |b| {
        let packs = repo_final_files(&b.env, "data");
        for f in &packs {
            fs::remove_file(f).unwrap();
        }
        Damage {
            what: format!("deleted all {} packs", packs.len()),
            named: vec![],
            silent: false,
            lossless: false,
        }
    });
}

#[test]
fn trust_damage_a_corrupted_snapshot_file() {
    run_case("snapshot-corrupt", |b| {
        let victim = &b.snaps[1];
        let path = b.env.repo.join("snapshots").join(&victim.id);
        let len = fs::metadata(&path).unwrap().len() as usize;
        flip_byte(&path, len / 2);
        Damage {
            what: format!(
                "flipped a byte in snapshot file {} ({})",
                &victim.id[..8],
                victim.tag
            ),
            named: vec![victim.id.clone()],
            silent: false,
            lossless: false,
        }
    });
}

#[test]
fn trust_damage_one_flipped_byte_in_a_pack_header() {
    run_case("pack-header-flip", |b| {
        let pack = packs_by_size(&b.env)[0].clone();
        let bytes = fs::read(&pack).unwrap();
        let header_len = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().unwrap()) as usize;
        assert!(
            header_len + 4 < bytes.len(),
            "header length {header_len} fits the pack"
        );
        let offset = bytes.len() - 4 - header_len / 2;
        flip_byte(&pack, offset);
        Damage {
            what: format!(
                "flipped a byte in the middle of the {header_len}-byte header of the largest pack {}",
                name_of(&pack)
            ),
            named: vec![name_of(&pack)],
            silent: false,
            lossless: true,
        }
    });
}

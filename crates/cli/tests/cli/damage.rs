//! Damaged repositories: a truncated, corrupted or missing pack, a missing index. Reads
//! must fail loudly, name what is broken, and never hand out wrong bytes.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::common::*;

const BIG: &str = "copy_of_big.bin";

/// A repository where one snapshot's file depends on packs written by an earlier
/// backup. Damaging those packs breaks that file's data while the later snapshot's
/// trees and its other files (stored in newer packs) stay intact.
struct Fixture {
    env: TestEnv,
    /// Source of the snapshot under test.
    src: PathBuf,
    snapshot: String,
    /// Packs written by the first backup, largest first; they hold `BIG`'s data.
    old_packs: Vec<PathBuf>,
    /// Index files that existed after the first backup.
    old_indexes: Vec<PathBuf>,
}

fn fixture() -> Fixture {
    let env = TestEnv::new();
    env.init(&["--compression", "none"]);
    let big = random_bytes(3_000_000, 77);
    let first = env.path("first");
    write_file(&first.join("big.bin"), &big);
    env.backup(&[&first], &[]);
    let mut old_packs = env.repo_files("data");
    old_packs.sort_by_key(|p| std::cmp::Reverse(fs::metadata(p).unwrap().len()));
    let old_indexes = env.repo_files("index");
    assert!(
        !old_packs.is_empty(),
        "the first backup wrote pack files under data/"
    );

    let src = env.path("second");
    write_file(&src.join("good.txt"), b"stored in a new pack\n");
    write_file(&src.join("good.bin"), &random_bytes(200_000, 78));
    write_file(&src.join("sub").join(BIG), &big);
    let snapshot = env.backup_id(&[&src], &[]);
    Fixture {
        env,
        src,
        snapshot,
        old_packs,
        old_indexes,
    }
}

fn pack_id(pack: &Path) -> String {
    pack.file_name().unwrap().to_str().unwrap().to_string()
}

fn truncate_to_half(pack: &Path) {
    let len = fs::metadata(pack).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(pack)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
}

pub(crate) fn flip_middle_byte(pack: &Path) {
    let mut bytes = fs::read(pack).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    fs::write(pack, bytes).unwrap();
}

fn delete(pack: &Path) {
    fs::remove_file(pack).unwrap();
}

/// Every file present under `target` equals the file it was restored from.
fn assert_no_wrong_bytes(f: &Fixture, target: &Path) {
    let restored_root = restored_path(target, &f.src);
    for (rel, contents) in files_below(target) {
        let abs = target.join(&rel);
        let Ok(inside) = abs.strip_prefix(&restored_root) else {
            panic!(
                "unexpected file {} in the target after a failed restore",
                rel.display()
            );
        };
        let source = fs::read(f.src.join(inside))
            .unwrap_or_else(|_| panic!("restored {} has no source file", inside.display()));
        assert!(
            contents == source,
            "restored {} holds wrong bytes ({} bytes, source {} bytes)",
            inside.display(),
            contents.len(),
            source.len()
        );
    }
}

fn assert_restore_fails_cleanly(f: &Fixture, pack: Option<&Path>) {
    let target = f.env.path("restored");
    let out = f
        .env
        .cmd()
        .arg("restore")
        .arg(&f.snapshot)
        .arg("--target")
        .arg(&target)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "restore from a damaged repository must fail\n{}",
        describe(&out)
    );
    let err = stderr(&out);
    if let Some(pack) = pack {
        assert!(
            err.contains(&pack_id(pack)) || err.to_lowercase().contains("pack"),
            "stderr names the pack {}: {err}",
            pack_id(pack)
        );
        assert!(
            err.contains(BIG),
            "stderr names the file that needed it ({BIG}): {err}"
        );
    } else {
        assert!(!err.trim().is_empty(), "an error message on stderr");
    }
    assert_no_wrong_bytes(f, &target);
    // What does not depend on the damage is still restored (STYLE.md, damage tests).
    let restored = restored_path(&target, &f.src);
    for intact in ["good.txt", "good.bin"] {
        assert!(
            restored.join(intact).is_file(),
            "the intact file {intact} is restored despite the damage elsewhere"
        );
    }
}

fn assert_cat_fails_cleanly(f: &Fixture, pack: Option<&Path>) {
    let path = f.src.join("sub").join(BIG);
    let out = f
        .env
        .cmd()
        .arg("cat")
        .arg(&f.snapshot)
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "cat from a damaged repository must fail\n{}",
        describe(&out)
    );
    let source = fs::read(&path).unwrap();
    assert!(
        source.starts_with(&out.stdout),
        "cat printed {} bytes that are not a prefix of the file",
        out.stdout.len()
    );
    assert!(
        out.stdout.len() < source.len(),
        "cat did not print the whole file and then fail"
    );
    let err = stderr(&out);
    if let Some(pack) = pack {
        assert!(
            err.contains(&pack_id(pack)) || err.to_lowercase().contains("pack"),
            "stderr names the pack {}: {err}",
            pack_id(pack)
        );
        assert!(err.contains(BIG), "stderr names the file ({BIG}): {err}");
    } else {
        assert!(!err.trim().is_empty(), "an error message on stderr");
    }
}

#[test]
fn the_undamaged_fixture_restores_completely() {
    // Guards the damage tests: they only mean something if this passes.
    let f = fixture();
    let target = f.env.path("restored");
    f.env.restore(&f.snapshot, &target, &[]);
    assert_trees_equal(&f.src, &restored_path(&target, &f.src), Compare::ALL);
}

#[test]
fn restore_refuses_a_truncated_pack_and_writes_no_wrong_bytes() {
    let f = fixture();
    truncate_to_half(&f.old_packs[0]);
    assert_restore_fails_cleanly(&f, Some(&f.old_packs[0]));
}

#[test]
fn restore_refuses_a_pack_with_one_flipped_byte_and_writes_no_wrong_bytes() {
    let f = fixture();
    flip_middle_byte(&f.old_packs[0]);
    assert_restore_fails_cleanly(&f, Some(&f.old_packs[0]));
}

#[test]
fn restore_refuses_a_deleted_pack_and_writes_no_wrong_bytes() {
    let f = fixture();
    delete(&f.old_packs[0]);
    assert_restore_fails_cleanly(&f, Some(&f.old_packs[0]));
}

#[test]
fn cat_refuses_a_truncated_pack() {
    let f = fixture();
    truncate_to_half(&f.old_packs[0]);
    assert_cat_fails_cleanly(&f, Some(&f.old_packs[0]));
}

#[test]
fn cat_refuses_a_pack_with_one_flipped_byte() {
    let f = fixture();
    flip_middle_byte(&f.old_packs[0]);
    assert_cat_fails_cleanly(&f, Some(&f.old_packs[0]));
}

#[test]
fn cat_refuses_a_deleted_pack() {
    let f = fixture();
    delete(&f.old_packs[0]);
    assert_cat_fails_cleanly(&f, Some(&f.old_packs[0]));
}

/// Deletes the index files of the first backup (or, if later backups rewrote the index,
/// every index file).
fn delete_old_indexes(f: &Fixture) {
    let still_there: Vec<&PathBuf> = f.old_indexes.iter().filter(|p| p.exists()).collect();
    if still_there.is_empty() {
        for p in f.env.repo_files("index") {
            fs::remove_file(p).unwrap();
        }
    } else {
        for p in still_there {
            fs::remove_file(p).unwrap();
        }
    }
    let left: BTreeSet<_> = f.env.repo_files("index").into_iter().collect();
    assert!(f.old_indexes.iter().all(|p| !left.contains(p)));
}

#[test]
fn restore_with_a_missing_index_file_fails_instead_of_writing_wrong_data() {
    let f = fixture();
    delete_old_indexes(&f);
    assert_restore_fails_cleanly(&f, None);
}

#[test]
fn cat_with_a_missing_index_file_fails_instead_of_printing_wrong_data() {
    let f = fixture();
    delete_old_indexes(&f);
    assert_cat_fails_cleanly(&f, None);
}

/// A file stored in two packs (its first index file was hidden while a copy of it was
/// backed up again), with one pack gone at a time: `cat` prints it whole either way, and
/// says so when it read around the pack the index prefers, naming that pack.
#[test]
fn cat_warns_when_it_reads_a_blob_from_another_copy() {
    let env = TestEnv::new();
    env.init(&["--compression", "none"]);
    let data = random_bytes(300_000, 5);
    let src = env.path("src");
    write_file(&src.join("f.bin"), &data);
    let snapshot = env.backup_id(&[&src], &[]);
    let first_packs = env.repo_files("data");
    let hidden = env.path("hidden-index");
    fs::create_dir_all(&hidden).unwrap();
    let indexes = env.repo_files("index");
    for index in &indexes {
        fs::rename(index, hidden.join(index.file_name().unwrap())).unwrap();
    }
    let copy = env.path("copy");
    write_file(&copy.join("f.bin"), &data);
    env.backup(&[&copy], &[]);
    for index in &indexes {
        fs::rename(hidden.join(index.file_name().unwrap()), index).unwrap();
    }
    let second_packs: Vec<PathBuf> = env
        .repo_files("data")
        .into_iter()
        .filter(|p| !first_packs.contains(p))
        .collect();
    // The file's blob, the largest pack of each backup.
    let largest = |packs: &[PathBuf]| {
        packs
            .iter()
            .max_by_key(|p| fs::metadata(p).unwrap().len())
            .unwrap()
            .clone()
    };
    let (first, second) = (largest(&first_packs), largest(&second_packs));

    let mut warned = Vec::new();
    for gone in [&first, &second] {
        let kept = fs::read(gone).unwrap();
        fs::remove_file(gone).unwrap();
        let out = env
            .cmd()
            .args(["cat", &snapshot])
            .arg(src.join("f.bin"))
            .output()
            .unwrap();
        fs::write(gone, kept).unwrap();
        assert_success(&out, "cat with one copy gone");
        assert!(out.stdout == data, "cat printed the file whole");
        let err = stderr(&out);
        if err.contains("another copy") {
            assert!(err.contains(&pack_id(gone)), "{err}");
            warned.push(gone);
        }
    }
    assert_eq!(
        warned.len(),
        1,
        "only the preferred copy's loss is read around"
    );
}

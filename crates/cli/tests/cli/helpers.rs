//! Tests of the tree comparison itself: every round-trip test trusts it, so it must see
//! each kind of difference (and see none between a tree and its `cp -a` copy).

use std::fs;

use crate::common::*;

fn tree_and_copy() -> (TestEnv, std::path::PathBuf, std::path::PathBuf) {
    let env = TestEnv::new();
    let src = build_rich_tree(&env.path("src"));
    let copy = env.path("copy");
    copy_tree(&src, &copy);
    (env, src, copy)
}

fn assert_difference(change: impl FnOnce(&std::path::Path), expected_word: &str) {
    let (_env, src, copy) = tree_and_copy();
    change(&copy);
    sync_dir_mtimes(&src, &copy);
    match compare_trees(&src, &copy, Compare::ALL) {
        Ok(()) => panic!("compare_trees missed a difference in {expected_word}"),
        Err(diff) => assert!(
            diff.contains(expected_word),
            "{diff:?} mentions {expected_word}"
        ),
    }
}

/// Changing entries changes their directory's mtime; put those back so that only the
/// intended difference remains.
fn sync_dir_mtimes(src: &std::path::Path, copy: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let m = fs::symlink_metadata(src).unwrap();
    if !m.is_dir() {
        return;
    }
    for entry in fs::read_dir(src).unwrap() {
        let name = entry.unwrap().file_name();
        if copy.join(&name).is_dir() {
            sync_dir_mtimes(&src.join(&name), &copy.join(&name));
        }
    }
    if copy.is_dir() {
        set_mtime(copy, m.mtime(), m.mtime_nsec());
    }
}

#[test]
fn a_tree_equals_its_cp_a_copy() {
    let (_env, src, copy) = tree_and_copy();
    assert_trees_equal(&src, &copy, Compare::ALL);
}

#[test]
fn tree_compare_sees_one_changed_byte() {
    assert_difference(
        |c| {
            let p = c.join("dir a/random.bin");
            let mut b = fs::read(&p).unwrap();
            b[777_777] ^= 1;
            let m = fs::metadata(&p).unwrap();
            fs::write(&p, b).unwrap();
            fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(m.modified().unwrap())
                .unwrap();
        },
        "contents",
    );
}

#[test]
fn tree_compare_sees_a_one_nanosecond_mtime_difference() {
    assert_difference(
        |c| set_mtime(&c.join("hello.txt"), 1_500_000_000, 123_456_790),
        "mtime",
    );
}

#[test]
fn tree_compare_sees_a_mode_difference() {
    assert_difference(|c| set_mode(&c.join("secret"), 0o640), "mode");
}

#[test]
fn tree_compare_sees_an_owner_difference() {
    assert_difference(
        |c| std::os::unix::fs::lchown(c.join("empty"), Some(1), Some(1)).unwrap(),
        "owner",
    );
}

#[test]
fn tree_compare_sees_a_different_symlink_target() {
    assert_difference(
        |c| {
            fs::remove_file(c.join("link-relative")).unwrap();
            std::os::unix::fs::symlink("empty", c.join("link-relative")).unwrap();
        },
        "symlink",
    );
}

#[test]
fn tree_compare_sees_a_broken_hardlink() {
    assert_difference(
        |c| {
            let p = c.join("dir a/hard-2");
            let m = fs::metadata(&p).unwrap();
            let bytes = fs::read(&p).unwrap();
            fs::remove_file(&p).unwrap();
            fs::write(&p, bytes).unwrap();
            fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(m.modified().unwrap())
                .unwrap();
        },
        "hardlinks",
    );
}

#[test]
fn tree_compare_sees_a_missing_and_an_extra_entry() {
    assert_difference(|c| fs::remove_file(c.join("empty")).unwrap(), "missing");
    assert_difference(|c| write_file(&c.join("private/extra"), b""), "extra");
}

#[test]
fn tree_compare_sees_a_file_replaced_by_a_fifo() {
    assert_difference(
        |c| {
            fs::remove_file(c.join("readonly")).unwrap();
            mkfifo(&c.join("readonly"));
        },
        "type",
    );
}

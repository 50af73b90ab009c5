//! The backup pipeline as a user sees it: small files bundled into shared blobs (and
//! restored, verified and deduplicated as before), counters and phase timings in the
//! summary, runs of zeros restored as holes, the page cache left as it was found.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::common::*;

/// 3 directories of 100 small text files each (1-4 KiB) and one 3 MiB file.
fn small_files(env: &TestEnv) -> PathBuf {
    let src = env.path("src");
    for d in 0..3u64 {
        for f in 0..100u64 {
            let len = 1024 + ((d * 100 + f) * 37 % 3072) as usize;
            let name = format!("dir{d}/file{f:03}.txt");
            write_file(&src.join(name), &compressible_bytes(len, d * 1000 + f));
        }
    }
    write_file(&src.join("big.log"), &compressible_bytes(3 << 20, 7));
    src
}

#[test]
fn small_files_share_blobs_and_restore_exactly() {
    let env = TestEnv::with_repo();
    let src = small_files(&env);
    let summary = env.backup(&[&src], &[]);
    assert_eq!(json_u64(&summary, "files_new"), 301);
    // 300 files of ~2.5 KiB in three directories fit in a bundle or two of 1-2 MiB.
    let blobs = json_u64(&summary, "blobs_added");
    assert!(blobs < 30, "300 small files should share blobs: {summary}");
    // The big file's chunks (where the keyed chunker cuts 3 MiB: at least one) and one
    // per bundle.
    let chunks = json_u64(&summary, "chunks");
    assert!((2..=blobs).contains(&chunks), "{summary}");
    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);
    // One small file alone, from the middle of its bundle.
    let inner = src.join("dir1/file050.txt");
    let out = env
        .cmd()
        .args(["cat", "latest"])
        .arg(&inner)
        .output()
        .unwrap();
    assert_success(&out, "cairn cat of a bundled file");
    assert_eq!(out.stdout, fs::read(&inner).unwrap());
}

#[test]
fn a_copied_tree_is_stored_once() {
    let env = TestEnv::with_repo();
    let src = small_files(&env);
    let first = env.backup(&[&src], &[]);
    let copy = env.path("copy");
    copy_tree(&src, &copy);
    // Another path: no parent snapshot, every file is read again.
    let second = env.backup(&[&copy], &[]);
    assert_eq!(json_u64(&second, "files_new"), 301, "{second}");
    assert_eq!(
        json_u64(&second, "chunks_present"),
        json_u64(&second, "chunks"),
        "every chunk of the copy is already stored: {second}"
    );
    // Only trees are new.
    assert!(
        json_u64(&second, "raw_bytes_added") * 20 < json_u64(&first, "raw_bytes_added"),
        "first {first}\nsecond {second}"
    );
}

#[test]
fn a_changed_small_file_is_stored_alone() {
    let env = TestEnv::with_repo();
    let src = small_files(&env);
    env.backup(&[&src], &[]);
    let changed = src.join("dir2/file010.txt");
    write_file(&changed, &compressible_bytes(2000, 99_999));
    let second = env.backup(&[&src], &[]);
    assert_eq!(json_u64(&second, "files_changed"), 1, "{second}");
    assert_eq!(json_u64(&second, "files_unchanged"), 300, "{second}");
    // The file and the trees above it, not its neighbours' bundle.
    assert!(
        json_u64(&second, "raw_bytes_added") < 2000 + 32 * 1024,
        "{second}"
    );
    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);
}

/// A backup goes on to the next directories while a directory's files are read, and
/// saves each tree once its files are in. Here `a0`'s large file keeps it waiting while
/// the hundreds of directories after it (more than the 256 a backup lets wait) are
/// walked: every tree must still be saved under its own parent.
#[test]
fn directories_saved_while_their_files_are_read_keep_their_places() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("a0/big.bin"), &random_bytes(48 << 20, 5));
    for a in 0..8u64 {
        for b in 0..8u64 {
            let mid = src.join(format!("a{a}/b{b}"));
            write_file(&mid.join("mid.txt"), &compressible_bytes(300, a * 8 + b));
            for c in 0..6u64 {
                let seed = 1000 + (a * 8 + b) * 6 + c;
                let len = 200 + (seed % 700) as usize;
                write_file(
                    &mid.join(format!("c{c}/leaf.txt")),
                    &compressible_bytes(len, seed),
                );
            }
        }
    }
    let first = env.backup(&[&src], &[]);
    assert_eq!(json_u64(&first, "files_new"), 1 + 64 + 384, "{first}");
    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);

    write_file(&src.join("a5/b2/c3/leaf.txt"), b"edited");
    let second = env.backup(&[&src], &[]);
    assert_eq!(json_u64(&second, "files_changed"), 1, "{second}");
    // The file and the trees on its path; each other tree is the same as before.
    assert!(json_u64(&second, "blobs_added") < 20, "{second}");
    let target = env.path("restored2");
    env.restore("latest", &target, &[]);
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);
}

#[test]
fn verified_resume_keeps_intact_bundled_files_and_mends_a_damaged_one() {
    let env = TestEnv::with_repo();
    let src = small_files(&env);
    env.backup(&[&src], &[]);
    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    let again = |env: &TestEnv| {
        let out = env.restore(
            "latest",
            &target,
            &["--overwrite", "if-changed", "--verify", "--json"],
        );
        parse_json(&out.stdout, "cairn restore --json")
    };
    let stats = again(&env);
    assert_eq!(json_u64(&stats, "files_restored"), 0, "{stats}");
    // Same size and mtime, different bytes: only --verify can tell.
    let victim = restored_path(&target, &src.join("dir0/file020.txt"));
    let md = fs::metadata(&victim).unwrap();
    let mut bytes = fs::read(&victim).unwrap();
    bytes[100] ^= 0x20;
    fs::write(&victim, &bytes).unwrap();
    set_mtime(&victim, md.mtime(), md.mtime_nsec());
    let stats = again(&env);
    assert_eq!(json_u64(&stats, "files_restored"), 1, "{stats}");
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);
}

#[test]
fn backup_reports_phase_times_and_chunk_counts() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("data.log"), &compressible_bytes(24 << 20, 3));
    let summary = env.backup(&[&src], &[]);
    let phases = &summary["phases_ms"];
    for phase in [
        "walk", "read", "chunk", "hash", "compress", "encrypt", "write",
    ] {
        assert!(phases[phase].is_u64(), "phases_ms.{phase} in {summary}");
    }
    // 24 MiB through zstd takes measurable time on any machine.
    assert!(json_u64(phases, "compress") > 0, "{summary}");
    assert_eq!(json_u64(&summary, "chunks_present"), 0, "{summary}");
    let out = env
        .cmd()
        .args(["backup", "--stats", "--force"])
        .arg(&src)
        .output()
        .unwrap();
    assert_success(&out, "cairn backup --stats");
    let text = stdout(&out);
    assert!(
        text.contains("Phases:") && text.contains("compress"),
        "{text}"
    );
    assert!(text.contains("already stored"), "{text}");
    let out = env.cmd().arg("backup").arg(&src).output().unwrap();
    assert!(!stdout(&out).contains("Phases:"), "only with --stats");
}

/// Bytes of disk a file occupies.
fn allocated(path: &Path) -> u64 {
    fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn runs_of_zeros_are_restored_as_holes() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    let mut middle = random_bytes(64 << 10, 1);
    middle.extend(vec![0u8; 16 << 20]);
    middle.extend(random_bytes(64 << 10, 2));
    write_file(&src.join("middle.img"), &middle);
    let mut tail = random_bytes(64 << 10, 3);
    tail.extend(vec![0u8; 16 << 20]);
    write_file(&src.join("tail.img"), &tail);
    env.backup(&[&src], &[]);
    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    for name in ["middle.img", "tail.img"] {
        let restored = restored_path(&target, &src.join(name));
        assert_eq!(
            fs::read(&restored).unwrap(),
            fs::read(src.join(name)).unwrap()
        );
        // 16 MiB of zeros take no blocks (a file system without holes fails this).
        assert!(
            allocated(&restored) < 4 << 20,
            "{name}: {} bytes allocated",
            allocated(&restored)
        );
    }
}

#[test]
fn a_restore_reads_each_pack_it_needs_once() {
    let env = TestEnv::new();
    env.init(&["--pack-size", "1M"]);
    let src = env.path("src");
    // 24 files of 300 KiB in about 8 packs, then the same files again elsewhere in the
    // tree in another order, so that the walk needs the packs in an order unlike theirs
    // and every blob twice.
    let files: Vec<Vec<u8>> = (0..24).map(|i| random_bytes(300 << 10, i)).collect();
    for (i, data) in files.iter().enumerate() {
        write_file(&src.join(format!("b/{i:02}")), data);
        write_file(&src.join(format!("a/{:02}", (i * 7) % 24)), data);
    }
    env.backup(&[&src], &[]);
    let stats = env.cmd().args(["stats", "--json"]).output().unwrap();
    let stats = parse_json(&stats.stdout, "cairn stats --json");
    let (packs, pack_bytes) = (json_u64(&stats, "packs"), json_u64(&stats, "pack_bytes"));
    assert!(packs >= 8, "{stats}");

    let target = env.path("restored");
    let out = env.restore("latest", &target, &["--json"]);
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);
    let report = parse_json(&out.stdout, "cairn restore --json");
    // Each pack once and each blob once, though every blob is restored twice (reads
    // widened to the 64 KiB grid of format 4 may take in the rest of a pack too).
    assert!(json_u64(&report, "packs_read") < packs, "{report} {stats}");
    assert!(
        json_u64(&report, "bytes_read") <= pack_bytes,
        "{report} {stats}"
    );
    assert_eq!(
        json_u64(&report, "bytes_restored"),
        2 * 24 * (300 << 10),
        "{report}"
    );
}

/// A large file whose chunks lie in many packs is written by several restore threads at
/// once (`pwrite` of distinct ranges outside the file's lock): its bytes, its zero runs
/// (left as holes) and the `--verify` digest of its parts come out right whatever order
/// the threads write in.
#[test]
fn a_large_file_in_many_packs_is_restored_exactly_by_threads_writing_it_at_once() {
    let env = TestEnv::new();
    env.init(&["--pack-size", "1M", "--chunk-avg", "64K"]);
    let src = env.path("src");
    let mut big = random_bytes(10 << 20, 41);
    big[3 << 20..5 << 20].fill(0);
    write_file(&src.join("big"), &big);
    write_file(&src.join("second"), &random_bytes(6 << 20, 42));
    env.backup(&[&src], &[]);
    let packs = env.repo_files("data").len();
    assert!(packs >= 12, "{packs} packs");
    for (i, extra) in [&[][..], &["--verify"]].into_iter().enumerate() {
        let target = env.path(&format!("t{i}"));
        let out = env.restore("latest", &target, extra);
        assert_success(&out, &format!("restore {extra:?}"));
        let restored = restored_path(&target, &src);
        assert!(
            fs::read(restored.join("big")).unwrap() == big,
            "{extra:?}: big differs"
        );
        assert!(
            fs::read(restored.join("second")).unwrap() == random_bytes(6 << 20, 42),
            "{extra:?}: second differs"
        );
    }
}

/// A restore lets go of the packs it reads: their pages are not left in the page cache
/// (they were all cached after a restore before; see `restore_packs::Behind`). Small
/// packs, so that what the kernel reads ahead past a thread's last read of a pack (up to
/// `read_ahead_kb`, 8 MiB on some machines) is little beside what was read.
#[test]
fn a_restore_leaves_few_pages_of_the_packs_it_read_in_the_page_cache() {
    use cairn_core::storage::pagecache::{cached_pages, drop_pages};
    let env = TestEnv::new();
    env.init(&["--pack-size", "1M"]);
    let src = env.path("src");
    let data = random_bytes(40 << 20, 7);
    write_file(&src.join("big.bin"), &data);
    env.backup(&[&src], &[]);
    let packs = env.repo_files("data");
    let pages = |path: &PathBuf| cached_pages(&fs::File::open(path).unwrap(), 0, 0);
    // Every page of the packs, cached by reading them whole; then dropped (clean: the
    // backup made the packs durable), as in a cold repository.
    let mut all = 0;
    for pack in &packs {
        fs::read(pack).unwrap();
        all += pages(pack).unwrap_or(0);
        drop_pages(&fs::File::open(pack).unwrap(), 0, 0);
    }
    if all == 0 || packs.iter().any(|pack| pages(pack) != Some(0)) {
        eprintln!("skipped: cachestat(2) is not available here, or the pages did not move");
        return;
    }
    let target = env.path("restored");
    assert_success(&env.restore("latest", &target, &[]), "restore");
    assert!(fs::read(restored_path(&target, &src).join("big.bin")).unwrap() == data);
    let left: u64 = packs.iter().map(|pack| pages(pack).unwrap_or(0)).sum();
    // Every page read went; what the kernel read ahead past the blobs (the packs'
    // headers) may stay.
    assert!(
        left * 4 < all,
        "{left} of the packs' {all} pages still cached after the restore"
    );
}

/// A backup leaves the page cache as it found it for the large files it reads: one none
/// of which was cached is not cached afterwards (its pages were dropped behind the
/// reading), and one that was cached (just written) still is, whole.
#[test]
fn a_backup_keeps_cached_files_cached_and_leaves_no_pages_of_the_others() {
    use cairn_core::storage::pagecache::{cached_pages, drop_pages};
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("cold.bin"), &random_bytes(12 << 20, 1));
    write_file(&src.join("hot.bin"), &random_bytes(12 << 20, 2));
    let open = |name: &str| fs::File::open(src.join(name)).unwrap();
    for name in ["cold.bin", "hot.bin"] {
        open(name).sync_all().unwrap();
    }
    // Drops the clean pages of cold.bin, as a cache dropped or a file not read for long.
    drop_pages(&open("cold.bin"), 0, 0);
    let hot_pages = cached_pages(&open("hot.bin"), 0, 0);
    if cached_pages(&open("cold.bin"), 0, 0) != Some(0) || hot_pages.is_none_or(|p| p == 0) {
        eprintln!("skipped: cachestat(2) is not available here, or the pages did not move");
        return;
    }
    env.backup(&[&src], &[]);
    assert_eq!(cached_pages(&open("cold.bin"), 0, 0), Some(0));
    assert_eq!(cached_pages(&open("hot.bin"), 0, 0), hot_pages);
    let target = env.path("restored");
    env.restore("latest", &target, &[]);
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);
}

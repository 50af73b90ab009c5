//! `cairn mount`: a real FUSE mount (CI machines have /dev/fuse and run as root), looked
//! at with the tools a user would use on it (`cp -a`, `diff -r`, `grep -r`), then
//! unmounted with `fusermount3 -u` or Ctrl-C.

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// A `cairn mount` running in the background. Dropping it unmounts (lazily) and kills the
/// process, so a failing test leaves no mount behind.
struct Mounted {
    child: Child,
    mountpoint: PathBuf,
    log: PathBuf,
}

impl Mounted {
    fn start(env: &TestEnv, mountpoint: &Path) -> Mounted {
        assert!(
            Path::new("/dev/fuse").exists(),
            "/dev/fuse is missing: the mount tests need FUSE (load the fuse module)"
        );
        let log = env.path("mount.log");
        let child = spawnable(env)
            .arg("mount")
            .arg(mountpoint)
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut m = Mounted {
            child,
            mountpoint: mountpoint.to_path_buf(),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !mountpoint.join("snapshots").exists() {
            if let Some(status) = m.child.try_wait().unwrap() {
                panic!("cairn mount exited early ({status}): {}", m.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "no mount after 60 s: {}",
                m.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to end on its own; its exit code.
    fn wait(&mut self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "cairn mount did not end within 30 s: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&self.mountpoint)
                .status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Unmounts as a user would, with `fusermount3 -u`, waiting for the mount to go idle.
/// Under the load of the whole suite the kernel may still hold a file of the mount for a
/// moment after its last reader closed it (FUSE releases files asynchronously), and
/// `fusermount3 -u` then fails with "Device or resource busy": a flaky test, not a bug
/// in cairn. So a busy mount is retried for up to 30 s, and only then detached lazily
/// (`-z`), which ends the session once the last reference goes.
fn unmount(mountpoint: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut pause = Duration::from_millis(20);
    loop {
        let out = Command::new("fusermount3")
            .arg("-u")
            .arg(mountpoint)
            .output()
            .unwrap();
        if out.status.success() {
            return;
        }
        let busy = stderr(&out).contains("busy");
        assert!(busy, "fusermount3 -u failed: {}", stderr(&out));
        if Instant::now() >= deadline {
            eprintln!(
                "{} still busy after 30 s: detaching it",
                mountpoint.display()
            );
            let out = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(mountpoint)
                .output()
                .unwrap();
            assert_success(&out, "fusermount3 -u -z");
            return;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// Where the mount shows `source` of the snapshot directory `snapshot_dir`.
fn shown(snapshot_dir: &Path, source: &Path) -> PathBuf {
    snapshot_dir.join(source.strip_prefix("/").unwrap())
}

#[test]
fn mount_shows_snapshots_as_the_source_tree_and_unmounts_cleanly() {
    let env = TestEnv::with_small_chunk_repo();
    let src = build_rich_tree(&env.path("src"));
    let id = env.backup_id(&[&src], &["--tag", "nightly"]);
    let mnt = env.path("mnt");
    fs::create_dir(&mnt).unwrap();
    let mut m = Mounted::start(&env, &mnt);

    // The layout: one snapshot under each view, and `latest` pointing at it.
    let names = |dir: &str| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(mnt.join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(""), ["hosts", "ids", "latest", "snapshots", "tags"]);
    let times = names("snapshots");
    assert_eq!(times.len(), 1);
    assert_eq!(names("ids"), [id[..8].to_string()]);
    assert_eq!(names("tags/nightly"), times);
    let latest = fs::read_link(mnt.join("latest")).unwrap();
    assert_eq!(latest, Path::new("snapshots").join(&times[0]));

    // Every view shows the backed-up tree with its metadata and hard links.
    let in_mount = shown(&mnt.join("latest"), &src);
    let what = Compare {
        xattrs: false,
        ..Compare::ALL
    };
    assert_trees_equal(&src, &in_mount, what);
    assert_trees_equal(&src, &shown(&mnt.join("ids").join(&id[..8]), &src), what);
    assert_eq!(fs::metadata(in_mount.join("hard-1")).unwrap().nlink(), 2);
    assert_eq!(
        fs::metadata(in_mount.join("hard-1")).unwrap().ino(),
        fs::metadata(in_mount.join("dir a/hard-2")).unwrap().ino(),
        "hard links share an inode"
    );

    // Random reads at offsets across chunk boundaries fetch the right bytes.
    let original = fs::read(src.join("dir a/random.bin")).unwrap();
    let file = fs::File::open(in_mount.join("dir a/random.bin")).unwrap();
    for offset in [1_234_567usize, 0, 65_535, 700_001, 1_499_990, 300_000] {
        let mut buf = vec![0; 100_000];
        let n = file.read_at(&mut buf, offset as u64).unwrap();
        let want = &original[offset..(offset + 100_000).min(original.len())];
        assert_eq!(&buf[..n], want, "bytes at offset {offset}");
    }

    // What users do with a mount.
    let copy = env.path("copy");
    let out = Command::new("cp")
        .arg("-a")
        .arg(&in_mount)
        .arg(&copy)
        .output()
        .unwrap();
    assert_success(&out, "cp -a from the mount");
    assert_trees_equal(&src, &copy, what);
    let out = Command::new("diff")
        .arg("-r")
        .arg(src.join("dir a"))
        .arg(in_mount.join("dir a"))
        .output()
        .unwrap();
    assert_success(&out, "diff -r source mount");
    let out = Command::new("grep")
        .args(["-r", "-l", "leaf"])
        .arg(in_mount.join("dir a"))
        .output()
        .unwrap();
    assert_success(&out, "grep -r in the mount");
    assert!(stdout(&out).contains("leaf.txt"), "{}", stdout(&out));

    // A second mount on a busy mountpoint is refused.
    let out = env.cmd().arg("mount").arg(&mnt).output().unwrap();
    assert_exit(&out, 1, "cairn mount on a mounted directory");
    assert!(
        stderr(&out).contains("already a mount point"),
        "{}",
        stderr(&out)
    );

    drop(file);
    unmount(&mnt);
    assert_eq!(m.wait(), 0, "cairn mount exits 0: {}", m.log_text());
    assert_eq!(
        fs::read_dir(&mnt).unwrap().count(),
        0,
        "the mountpoint is empty again"
    );
}

#[test]
fn mount_ends_on_ctrl_c_with_exit_130() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("a"), b"a\n");
    env.backup(&[&src], &[]);
    let mnt = env.path("mnt");
    fs::create_dir(&mnt).unwrap();
    let mut m = Mounted::start(&env, &mnt);
    // SAFETY: kill touches no memory; the pid is our own child, still running.
    assert_eq!(unsafe { libc::kill(m.child.id() as i32, libc::SIGINT) }, 0);
    assert_eq!(m.wait(), 130, "exit code after Ctrl-C: {}", m.log_text());
    assert_eq!(fs::read_dir(&mnt).unwrap().count(), 0, "unmounted");
}

#[test]
fn mount_refuses_missing_and_non_empty_mountpoints() {
    let env = TestEnv::with_repo();
    let out = env
        .cmd()
        .arg("mount")
        .arg(env.path("nowhere"))
        .output()
        .unwrap();
    assert_exit(&out, 1, "cairn mount on a missing directory");
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));

    let full = env.path("full");
    write_file(&full.join("x"), b"x");
    let out = env.cmd().arg("mount").arg(&full).output().unwrap();
    assert_exit(&out, 1, "cairn mount on a non-empty directory");
    assert!(stderr(&out).contains("not empty"), "{}", stderr(&out));
}

#[test]
fn mount_returns_eio_when_the_repository_data_is_gone() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("big"), &random_bytes(300_000, 9));
    env.backup(&[&src], &[]);
    let mnt = env.path("mnt");
    fs::create_dir(&mnt).unwrap();
    let _m = Mounted::start(&env, &mnt);
    let file = shown(&mnt.join("latest"), &src).join("big");
    assert_eq!(fs::metadata(&file).unwrap().len(), 300_000);

    // The packs become unreachable after the tree was read but before the file was.
    fs::rename(env.repo.join("data"), env.repo.join("data.gone")).unwrap();
    let started = Instant::now();
    let err = fs::read(&file).expect_err("reading without packs fails");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "EIO, got {err}");
    assert!(started.elapsed() < Duration::from_secs(30), "no hang");
    fs::rename(env.repo.join("data.gone"), env.repo.join("data")).unwrap();
}

#[test]
fn mount_refuses_a_tree_with_a_climbing_name_and_names_the_tree() {
    let env = TestEnv::with_repo();
    let bad = crate::unsafe_trees::plant_tree_with_name(&env.repo, b"../x").to_string();
    let mnt = env.path("mnt");
    fs::create_dir(&mnt).unwrap();
    let m = Mounted::start(&env, &mnt);
    let err = fs::read_dir(mnt.join("latest/d"))
        .and_then(|d| d.collect::<Result<Vec<_>, _>>())
        .expect_err("the directory of the unsafe tree cannot be listed");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "EIO, got {err}");
    let log = m.log_text();
    assert!(log.contains(&bad) && log.contains("unsafe name"), "{log}");
}

/// r15: `fusermount3 -u` failed with "Device or resource busy" under the load of the
/// whole suite, while the kernel still held a file of the mount. The tests' unmount
/// waits for the mount to go idle: here a reader closes its file only after the first
/// attempt has failed.
#[test]
fn unmount_waits_for_a_busy_mount_to_go_idle() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("a"), b"a\n");
    env.backup(&[&src], &[]);
    let mnt = env.path("mnt");
    fs::create_dir(&mnt).unwrap();
    let mut m = Mounted::start(&env, &mnt);
    let file = fs::File::open(shown(&mnt.join("latest"), &src).join("a")).unwrap();
    let busy = Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(stderr(&busy).contains("busy"), "{}", describe(&busy));
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(file);
    });
    unmount(&mnt);
    reader.join().unwrap();
    assert_eq!(m.wait(), 0, "cairn mount exits 0: {}", m.log_text());
    assert_eq!(fs::read_dir(&mnt).unwrap().count(), 0, "unmounted");
}

/// Snapshots made and forgotten while mounted appear and go without remounting; an id
/// directory keeps its inode across listings.
#[test]
fn mount_follows_snapshots_made_and_forgotten_while_mounted() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("a.txt"), b"first\n");
    let first = env.backup_id(&[&src], &["--tag", "t1"]);
    let mnt = env.path("mnt");
    fs::create_dir(&mnt).unwrap();
    let m = Mounted::start(&env, &mnt);
    let names = |dir: &str| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(mnt.join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names("ids"), [first[..8].to_string()]);
    let inode = fs::metadata(mnt.join("ids").join(&first[..8]))
        .unwrap()
        .ino();

    // A second later, so that the snapshot directories have different names.
    std::thread::sleep(Duration::from_millis(1100));
    write_file(&src.join("b.txt"), b"second\n");
    let second = env.backup_id(&[&src], &["--tag", "t2"]);
    let until = |what: &str, done: &dyn Fn() -> bool| {
        // The mount lists again after a second; a loaded machine may take far longer.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < deadline, "{what} within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    until("the new snapshot shows", &|| names("ids").len() == 2);
    assert_eq!(names("snapshots").len(), 2);
    assert_eq!(names("tags"), ["t1", "t2"]);
    let in_latest = shown(&mnt.join("latest"), &src).join("b.txt");
    assert_eq!(fs::read(&in_latest).unwrap(), b"second\n", "its files read");
    let in_id = shown(&mnt.join("ids").join(&second[..8]), &src).join("b.txt");
    assert_eq!(fs::read(&in_id).unwrap(), b"second\n");
    assert_eq!(
        fs::metadata(mnt.join("ids").join(&first[..8]))
            .unwrap()
            .ino(),
        inode,
        "a name keeps its inode"
    );

    let out = env.cmd().args(["forget", &first]).output().unwrap();
    assert_success(&out, "forget the first snapshot");
    until("the forgotten snapshot goes", &|| names("ids").len() == 1);
    assert_eq!(names("ids"), [second[..8].to_string()]);
    assert_eq!(names("tags"), ["t2"]);
    drop(m);
}

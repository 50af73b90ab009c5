//! `restore --no-special-files` and `--no-setuid`: what a snapshot from an untrusted
//! machine may hold (device nodes, FIFOs, setuid programs) can be left out or defused,
//! and whatever is left out is listed, never dropped without a word.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::common::*;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn restore_json(env: &TestEnv, spec: &str, target: &Path, extra: &[&str]) -> serde_json::Value {
    let out = env.restore(spec, target, &[&["--json"], extra].concat());
    parse_json(&out.stdout, "cairn restore --json")
}

/// A tree with a FIFO, and as root a character device (1:3, as /dev/null).
fn tree_with_specials(env: &TestEnv) -> std::path::PathBuf {
    let src = env.path("src");
    write_file(&src.join("plain.txt"), b"plain\n");
    mkfifo(&src.join("fifo"));
    if is_root() {
        nix::sys::stat::mknod(
            &src.join("null"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(1, 3),
        )
        .unwrap();
    }
    src
}

#[test]
fn no_special_files_leaves_out_fifos_and_devices_and_lists_each() {
    let env = TestEnv::with_repo();
    let src = tree_with_specials(&env);
    env.backup(&[&src], &[]);
    let target = env.path("restored");
    let out = env.restore(
        &format!("latest:{}", src.display()),
        &target,
        &["--no-special-files"],
    );
    assert_eq!(fs::read(target.join("plain.txt")).unwrap(), b"plain\n");
    assert!(fs::symlink_metadata(target.join("fifo")).is_err());
    assert!(fs::symlink_metadata(target.join("null")).is_err());
    let err = stderr(&out);
    assert!(
        err.contains("not restored (fifo)") && err.contains("fifo"),
        "the FIFO left out is listed: {err}"
    );
    if is_root() {
        assert!(
            err.contains("not restored (character device)"),
            "the device left out is listed: {err}"
        );
    }

    let target = env.path("restored-json");
    let s = restore_json(
        &env,
        &format!("latest:{}", src.display()),
        &target,
        &["--no-special-files"],
    );
    let kinds: Vec<&str> = s["specials_skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"fifo"), "{s}");

    // Without the flag they are made, as before.
    let target = env.path("restored-all");
    env.restore(&format!("latest:{}", src.display()), &target, &[]);
    assert!(fs::symlink_metadata(target.join("fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    if is_root() {
        let md = fs::symlink_metadata(target.join("null")).unwrap();
        assert!(md.file_type().is_char_device());
        assert_eq!(md.rdev(), nix::sys::stat::makedev(1, 3));
    }
}

#[test]
fn no_setuid_clears_setuid_and_setgid_bits_of_files_and_lists_them() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("suid"), b"#!/bin/sh\n");
    write_file(&src.join("sgid"), b"#!/bin/sh\n");
    write_file(&src.join("shared/f"), b"f\n");
    set_mode(&src.join("suid"), 0o4755);
    set_mode(&src.join("sgid"), 0o2755);
    set_mode(&src.join("shared"), 0o2775);
    env.backup(&[&src], &[]);
    let spec = format!("latest:{}", src.display());
    let mode = |p: &Path| fs::symlink_metadata(p).unwrap().mode() & 0o7777;

    let target = env.path("restored");
    let out = env.restore(&spec, &target, &["--no-setuid"]);
    assert_eq!(mode(&target.join("suid")), 0o755);
    assert_eq!(mode(&target.join("sgid")), 0o755);
    // setgid on a directory only passes its group on: kept.
    assert_eq!(mode(&target.join("shared")), 0o2775);
    let err = stderr(&out);
    for name in ["suid", "sgid"] {
        assert!(
            err.contains(&format!(
                "cleared (--no-setuid): {}",
                target.join(name).display()
            )),
            "{name} is listed: {err}"
        );
    }

    let target = env.path("restored-all");
    env.restore(&spec, &target, &[]);
    assert_eq!(mode(&target.join("suid")), 0o4755);
    assert_eq!(mode(&target.join("sgid")), 0o2755);
}

/// Runs `cairn ARGS` as user nobody; `None` if setpriv is not available.
fn cairn_as_nobody(env: &TestEnv, args: &[&std::ffi::OsStr]) -> Option<std::process::Output> {
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| Path::new(p).exists())?;
    let mut cmd = spawnable_program(env, setpriv);
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(cairn_bin())
        .arg("-r")
        .arg(&env.repo)
        .args(args);
    Some(cmd.output().unwrap())
}

#[test]
fn a_device_node_restored_without_root_is_an_error_that_names_the_way_out() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to make the device node the snapshot holds");
        return;
    }
    let env = TestEnv::with_repo();
    let src = tree_with_specials(&env);
    env.backup(&[&src], &[]);
    env.make_world_accessible();
    let spec = format!("latest:{}", src.display());
    let target = env.path("as-nobody");
    let Some(out) = cairn_as_nobody(
        &env,
        &[
            "restore".as_ref(),
            spec.as_ref(),
            "--target".as_ref(),
            target.as_os_str(),
        ],
    ) else {
        eprintln!("SKIPPED: no setpriv");
        return;
    };
    assert_exit(&out, 1, "restore of a device node as nobody");
    let err = stderr(&out);
    assert!(
        err.contains("null") && err.contains("only root") && err.contains("--no-special-files"),
        "{err}"
    );
    // Everything else is restored.
    assert_eq!(fs::read(target.join("plain.txt")).unwrap(), b"plain\n");

    let target = env.path("as-nobody-2");
    let out = cairn_as_nobody(
        &env,
        &[
            "restore".as_ref(),
            spec.as_ref(),
            "--target".as_ref(),
            target.as_os_str(),
            "--no-special-files".as_ref(),
        ],
    )
    .unwrap();
    assert_success(&out, "restore --no-special-files as nobody");
    assert!(stderr(&out).contains("not restored (character device)"));
}

/// File capabilities grant privileges as a setuid bit does (`cap_setuid` lets any user of
/// the file become root): `--no-setuid` leaves them out too, and lists the file.
#[test]
fn no_setuid_leaves_out_file_capabilities_and_lists_them() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to give a file capabilities");
        return;
    }
    // vfs_cap_data revision 2, effective, permitted = CAP_SETUID (bit 7).
    let cap_setuid: [u8; 20] = [
        1, 0, 0, 2, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("tool"), b"#!/bin/sh\n");
    if xattr::set(src.join("tool"), "security.capability", &cap_setuid).is_err() {
        eprintln!("SKIPPED: this file system keeps no file capabilities");
        return;
    }
    env.backup(&[&src], &[]);
    let spec = format!("latest:{}", src.display());
    let caps = |p: &Path| xattr::get(p, "security.capability").unwrap();

    let target = env.path("restored");
    let out = env.restore(&spec, &target, &["--no-setuid"]);
    assert_eq!(caps(&target.join("tool")), None);
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "cleared (--no-setuid): {}",
            target.join("tool").display()
        )),
        "the file is listed: {err}"
    );

    let target = env.path("restored-all");
    env.restore(&spec, &target, &[]);
    assert_eq!(caps(&target.join("tool")), Some(cap_setuid.to_vec()));
}

/// Whoever can write into the target can plant a file with the size and mtime of one in
/// the snapshot. Restoring over it as root, `--overwrite if-changed` must not take it
/// for the snapshot's file and make it root's and setuid: it is replaced by the
/// snapshot's bytes. And a hard link to a file elsewhere is never given the snapshot's
/// metadata.
#[test]
fn if_changed_replaces_a_planted_file_instead_of_giving_it_the_snapshots_owner_and_mode() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to restore owners");
        return;
    }
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("suid"), b"the real program\n");
    write_file(&src.join("plain"), b"a file of root's\n");
    set_mode(&src.join("suid"), 0o4755);
    set_mode(&src.join("plain"), 0o644);
    env.backup(&[&src], &[]);
    let spec = format!("latest:{}", src.display());

    // The target belongs to nobody, who planted both names.
    let target = env.path("home-of-nobody");
    fs::create_dir(&target).unwrap();
    std::os::unix::fs::chown(&target, Some(65534), Some(65534)).unwrap();
    // Gives `path` the mtime the snapshot has for `name`.
    let mtime_of = |path: &Path, name: &str| {
        let mtime = fs::metadata(src.join(name)).unwrap().modified().unwrap();
        let file = fs::File::options().write(true).open(path).unwrap();
        file.set_modified(mtime).unwrap();
    };
    let plant = |name: &str, bytes: &[u8]| {
        let path = target.join(name);
        fs::write(&path, bytes).unwrap();
        mtime_of(&path, name);
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    };
    plant("suid", b"nobody's program\n");
    assert_eq!(
        fs::metadata(target.join("suid")).unwrap().len(),
        fs::metadata(src.join("suid")).unwrap().len()
    );
    // A hard link to a file outside the target, owned as the snapshot says (root) and
    // with its size and mtime.
    let outside = env.path("outside-file");
    fs::write(&outside, b"a file of root's\n").unwrap();
    set_mode(&outside, 0o600);
    mtime_of(&outside, "plain");
    fs::hard_link(&outside, target.join("plain")).unwrap();

    env.restore(&spec, &target, &["--overwrite", "if-changed"]);
    let md = fs::symlink_metadata(target.join("suid")).unwrap();
    assert_eq!(
        fs::read(target.join("suid")).unwrap(),
        b"the real program\n"
    );
    assert_eq!((md.uid(), md.mode() & 0o7777), (0, 0o4755));
    let md = fs::symlink_metadata(&outside).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o600, "the file outside keeps its mode");
    assert_eq!(
        fs::symlink_metadata(target.join("plain")).unwrap().nlink(),
        1,
        "the link was replaced"
    );
}

/// A target that is another user's symlink sends a root restore wherever that user
/// chose: it is followed (a symlink in a path is how many systems are laid out) but
/// named in a warning.
#[test]
fn a_root_restore_through_another_users_symlink_warns() {
    if !is_root() {
        eprintln!("SKIPPED: needs root");
        return;
    }
    let env = TestEnv::with_repo();
    let src = env.path("src");
    write_file(&src.join("f"), b"f\n");
    write_file(&src.join("sub/g"), b"g\n");
    env.backup(&[&src], &[]);
    let real = env.path("roots-dir");
    fs::create_dir(&real).unwrap();
    let link = env.path("nobodys-link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let spec = format!("latest:{}", src.display());

    let out = env.restore(&spec, &link, &[]);
    assert!(
        !stderr(&out).contains("a symlink that user id"),
        "{}",
        stderr(&out)
    );
    std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
    let out = env.restore(&spec, &link, &["--overwrite", "always"]);
    let err = stderr(&out);
    assert!(
        err.contains("a symlink that user id 65534 owns") && err.contains("roots-dir"),
        "{err}"
    );
    // Once, not again for each directory that was already there.
    assert_eq!(err.matches("a symlink that user id").count(), 1, "{err}");
    assert_eq!(fs::read(real.join("f")).unwrap(), b"f\n");
}

//! `cairn dump`: archives unpacked by other tools (GNU tar, Python's zipfile) must give
//! back the source tree, and a single file must come out byte for byte.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::common::*;

/// A repository holding one backup of the rich tree at `<root>/src`.
fn backed_up_rich_tree() -> (TestEnv, std::path::PathBuf) {
    let env = TestEnv::with_small_chunk_repo();
    let src = build_rich_tree(&env.path("src"));
    env.backup(&[&src], &[]);
    (env, src)
}

#[test]
fn dump_directory_as_tar_unpacks_to_the_source_tree() {
    let (env, src) = backed_up_rich_tree();
    let tar_file = env.path("out.tar");
    let out = env
        .cmd()
        .args(["dump", "latest"])
        .arg(&src)
        .arg("--output")
        .arg(&tar_file)
        .output()
        .unwrap();
    assert_success(&out, "cairn dump --output out.tar");

    // Also through a pipe, as most people use it: the same bytes.
    let piped = env
        .cmd()
        .args(["dump", "latest"])
        .arg(&src)
        .output()
        .unwrap();
    assert_success(&piped, "cairn dump > pipe");
    assert_eq!(
        piped.stdout,
        fs::read(&tar_file).unwrap(),
        "tar to a file and to a pipe"
    );

    let unpacked = env.path("unpacked");
    fs::create_dir(&unpacked).unwrap();
    let status = Command::new("tar")
        .arg("-xpf")
        .arg(&tar_file)
        .arg("-C")
        .arg(&unpacked)
        .status()
        .unwrap();
    assert!(status.success(), "GNU tar unpacks the archive");
    assert_trees_equal(
        &src,
        &unpacked.join("src"),
        Compare {
            xattrs: false,
            ..Compare::ALL
        },
    );
}

#[test]
fn dump_directory_as_zip_holds_files_modes_and_symlinks() {
    let (env, src) = backed_up_rich_tree();
    let zip_file = env.path("out.zip");
    // A pipe: zip's streaming mode with data descriptors.
    let out = env
        .cmd()
        .args(["dump", "latest", "--archive", "zip"])
        .arg(&src)
        .output()
        .unwrap();
    // The FIFO and the non-UTF-8 name cannot be held by zip: reported, exit code 3.
    assert_exit(&out, 3, "cairn dump --archive zip of a tree with a FIFO");
    let err = stderr(&out);
    assert!(err.contains("src/fifo"), "the FIFO is named: {err}");
    assert!(
        err.contains("UTF-8"),
        "the non-UTF-8 name is reported: {err}"
    );
    fs::write(&zip_file, &out.stdout).unwrap();

    let unpacked = env.path("unzipped");
    let script = r#"
import json, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.testzip()
z.extractall(sys.argv[2])
print(json.dumps({i.filename: i.external_attr >> 16 for i in z.infolist()}))
"#;
    let py = Command::new("python3")
        .args(["-c", script])
        .arg(&zip_file)
        .arg(&unpacked)
        .output()
        .unwrap();
    assert_success(&py, "python3 zipfile reads the archive");
    let modes = parse_json(&py.stdout, "zip listing");

    for (rel, contents) in files_below(&src) {
        let name = format!("src/{}", rel.display());
        if std::str::from_utf8(rel.as_os_str().as_bytes()).is_err() {
            continue;
        }
        let unzipped = fs::read(unpacked.join("src").join(&rel)).unwrap();
        assert_eq!(unzipped, contents, "{name}: contents");
        let want = fs::metadata(src.join(&rel)).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            modes[&name].as_u64(),
            Some((0o100000 | want) as u64),
            "{name}: mode"
        );
    }
    let link_mode = modes["src/link-relative"].as_u64().unwrap() as u32;
    assert_eq!(link_mode & 0o170000, 0o120000, "symlinks are zip symlinks");
    assert_eq!(
        fs::read(unpacked.join("src/link-relative")).unwrap(),
        b"hello.txt",
        "a zip symlink holds its target"
    );
    assert_eq!(
        modes["src/private/"].as_u64(),
        Some(0o40700),
        "directory mode"
    );
}

#[test]
fn dump_single_file_is_byte_exact_and_a_missing_path_suggests_names() {
    let (env, src) = backed_up_rich_tree();
    let file = src.join("dir a/random.bin");
    let out = env
        .cmd()
        .args(["dump", "latest"])
        .arg(&file)
        .output()
        .unwrap();
    assert_success(&out, "cairn dump FILE");
    assert!(
        out.stdout == fs::read(&file).unwrap(),
        "dump FILE is byte-exact"
    );

    let missing = src.join("dir a/randon.bin");
    let out = env
        .cmd()
        .args(["dump", "latest"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_exit(&out, 1, "cairn dump of a missing path");
    let err = stderr(&out);
    assert!(
        err.contains("is not in snapshot")
            && err.contains("did you mean")
            && err.contains("dir a/random.bin"),
        "the error names the nearest path: {err}"
    );
    assert!(out.stdout.is_empty(), "nothing on stdout");
}

#[test]
fn dump_tar_of_a_subdirectory_is_named_after_it() {
    let (env, src) = backed_up_rich_tree();
    let out = env
        .cmd()
        .args(["dump", "latest"])
        .arg(src.join("dir a/nested"))
        .output()
        .unwrap();
    assert_success(&out, "cairn dump DIR");
    let tar_file = env.path("nested.tar");
    fs::write(&tar_file, &out.stdout).unwrap();
    let list = Command::new("tar")
        .arg("-tf")
        .arg(&tar_file)
        .output()
        .unwrap();
    assert_success(&list, "tar -t");
    assert_eq!(
        stdout(&list),
        "nested\nnested/deeper\nnested/deeper/leaf.txt\n",
        "entries are relative to the dumped directory's parent"
    );
}

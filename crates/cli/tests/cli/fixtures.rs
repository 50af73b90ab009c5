//! Format fixtures: a small repository written by each released format version, kept in
//! `testdata/repos/vN/` with a manifest of what it must restore to. Every fixture must be
//! read and restored exactly by every later cairn.
//!
//! When the format version changes (`cairn_core::config::FORMAT_VERSION`), add the new
//! version's fixture before releasing it:
//!
//! ```sh
//! cargo test -p cairn-cli --test cli fixtures::write_current_format_fixture -- --ignored
//! ```
//!
//! That writes `testdata/repos/v{FORMAT_VERSION}/` (XChaCha20-Poly1305) and
//! `v{FORMAT_VERSION}-aegis-256/`, each only if it is not there (fixtures are never
//! rewritten); commit them. `the_current_format_version_has_a_fixture` fails until both are
//! there, and `every_fixture_restores_exactly` then checks them along with all older ones.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::common::*;

const FIXTURE_PASSWORD: &str = "cairn fixture password";

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/repos")
}

/// Everything a restore must reproduce, in a form that survives git: no file of the
/// snapshot is stored as a file, so modes, times and odd names are all in the manifest.
fn describe_tree(root: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut entries: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let md = fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap();
            let ft = md.file_type();
            let mut v = json!({
                "path_hex": hex(rel.as_os_str().as_bytes()),
                "mode": md.permissions().mode() & 0o7777,
                "mtime": [md.mtime(), md.mtime_nsec()],
            });
            if ft.is_dir() {
                v["type"] = "dir".into();
                stack.push(path.clone());
            } else if ft.is_symlink() {
                v["type"] = "symlink".into();
                v["target_hex"] = hex(fs::read_link(&path).unwrap().as_os_str().as_bytes()).into();
                v.as_object_mut().unwrap().remove("mode");
            } else if ft.is_file() {
                v["type"] = "file".into();
                v["size"] = md.len().into();
                v["blake3"] = blake3::hash(&fs::read(&path).unwrap())
                    .to_hex()
                    .as_str()
                    .into();
                v["links"] = md.nlink().into();
            } else {
                v["type"] = "other".into();
            }
            out.push(v);
        }
    }
    out.sort_by(|a, b| a["path_hex"].as_str().cmp(&b["path_hex"].as_str()));
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The source tree of a fixture: every kind of entry and metadata the format records.
fn build_source(src: &Path, generation: u64) {
    fs::create_dir_all(src.join("docs/deep/er")).unwrap();
    write_file(&src.join("docs/readme.txt"), &compressible_bytes(5_000, 1));
    write_file(
        &src.join("docs/deep/er/random.bin"),
        &random_bytes(150_000 + generation as usize * 7, 2 + generation),
    );
    write_file(&src.join("empty"), b"");
    write_file(&src.join("big.log"), &compressible_bytes(400_000, 3));
    let odd = src.join(std::ffi::OsStr::from_bytes(b"name-\xff\xfe-not-utf8"));
    write_file(&odd, b"odd name");
    fs::hard_link(src.join("docs/readme.txt"), src.join("readme-hardlink.txt")).unwrap();
    std::os::unix::fs::symlink("docs/readme.txt", src.join("link-to-readme")).unwrap();
    mkfifo(&src.join("fifo"));
    set_mode(&src.join("big.log"), 0o640);
    set_mode(&src.join("docs/deep"), 0o750);
    if generation > 0 {
        write_file(&src.join("docs/added-later.txt"), b"second snapshot");
    }
    // Fixed times, children before parents so directory times stick.
    for (i, rel) in [
        "docs/deep/er/random.bin",
        "docs/deep/er",
        "docs/deep",
        "docs/readme.txt",
        "empty",
        "big.log",
        "docs",
    ]
    .iter()
    .enumerate()
    {
        set_mtime(&src.join(rel), 1_600_000_000 + i as i64 * 1000, 123_456_789);
    }
    set_mtime(&odd, 1_500_000_000, 5);
}

/// `cairn -r REPO --password-file PW ARGS...`, as someone who kept only the password.
fn run_with_password_file(
    env: &TestEnv,
    repo: &Path,
    pw: &Path,
    args: &[&str],
) -> std::process::Output {
    env.bare_cmd()
        .env_remove("CAIRN_PASSWORD")
        .arg("-r")
        .arg(repo)
        .arg("--password-file")
        .arg(pw)
        .args(args)
        .output()
        .unwrap()
}

#[test]
#[ignore = "writes testdata/repos/vN: run with --ignored when adding a format version"]
fn write_current_format_fixture() {
    for (dir, cipher) in current_fixtures() {
        let dest = fixtures_dir().join(dir);
        if !dest.exists() {
            write_fixture(&dest, cipher);
        }
    }
}

/// The current format's fixtures: one per cipher, each directory and its `init --cipher`.
fn current_fixtures() -> [(String, &'static str); 2] {
    let version = cairn_core::config::FORMAT_VERSION;
    [
        (format!("v{version}"), "xchacha20-poly1305"),
        (format!("v{version}-aegis-256"), "aegis-256"),
    ]
}

fn write_fixture(dest: &Path, cipher: &str) {
    let version = cairn_core::config::FORMAT_VERSION;
    let env = TestEnv::new();
    let pw = env.path("password");
    fs::write(&pw, FIXTURE_PASSWORD).unwrap();
    let repo = dest.join("repo");
    let cmd = |args: &[&str]| {
        let out = run_with_password_file(&env, &repo, &pw, args);
        assert_success(&out, &format!("cairn {args:?}"));
        out
    };
    fs::create_dir_all(dest).unwrap();
    cmd(&[
        "init",
        "--cipher",
        cipher,
        "--chunk-min",
        "16K",
        "--chunk-avg",
        "64K",
        "--chunk-max",
        "256K",
    ]);
    let src = env.path("src");
    let mut snapshots = Vec::new();
    for generation in 0..2 {
        if generation > 0 {
            fs::remove_dir_all(&src).unwrap();
        }
        build_source(&src, generation);
        let out = cmd(&["backup", "--json", src.to_str().unwrap()]);
        let summary = parse_json(&out.stdout, "backup --json");
        snapshots.push(json!({
            "id": summary["snapshot_id"],
            "path": src.to_str().unwrap(),
            "entries": describe_tree(&src),
        }));
    }
    if version >= 3 {
        // A third snapshot made with a write-only key: its packs, index and snapshot are
        // sealed by a writer (HPKE envelopes), which every later cairn must still open.
        let writer_pw = env.path("write-only-password");
        fs::write(&writer_pw, "cairn write-only fixture password").unwrap();
        cmd(&[
            "key",
            "add",
            "--write-only",
            "--new-password-file",
            writer_pw.to_str().unwrap(),
        ]);
        fs::remove_dir_all(&src).unwrap();
        build_source(&src, 2);
        let out = run_with_password_file(
            &env,
            &repo,
            &writer_pw,
            &["backup", "--json", src.to_str().unwrap()],
        );
        assert_success(&out, "backup with the write-only key");
        let summary = parse_json(&out.stdout, "backup --json");
        snapshots.push(json!({
            "id": summary["snapshot_id"],
            "path": src.to_str().unwrap(),
            "entries": describe_tree(&src),
            "written_with": "a write-only key",
        }));
    }
    let manifest = json!({
        "format_version": version,
        "written_by": format!("cairn {}", env!("CARGO_PKG_VERSION")),
        "password": FIXTURE_PASSWORD,
        "snapshots": snapshots,
    });
    fs::write(
        dest.join("manifest.json"),
        serde_json::to_string_pretty(&manifest).unwrap(),
    )
    .unwrap();
}

#[test]
fn the_current_format_version_has_a_fixture() {
    for (dir, cipher) in current_fixtures() {
        let dir = fixtures_dir().join(dir);
        assert!(
            dir.join("manifest.json").is_file(),
            "the current format with {cipher} has no fixture in {}; see the doc of this module",
            dir.display()
        );
    }
}

#[test]
fn every_fixture_restores_exactly() {
    let mut checked = 0;
    for entry in fs::read_dir(fixtures_dir()).unwrap() {
        let dir = entry.unwrap().path();
        let manifest: Value =
            serde_json::from_slice(&fs::read(dir.join("manifest.json")).unwrap()).unwrap();
        let env = TestEnv::new();
        // Work on a copy: a fixture is never touched, whatever a command might write.
        let repo = env.path("repo");
        copy_tree(&dir.join("repo"), &repo);
        let pw = env.path("password");
        fs::write(&pw, manifest["password"].as_str().unwrap()).unwrap();
        let run = |args: &[&str]| run_with_password_file(&env, &repo, &pw, args);
        let out = run(&["check", "--read-data"]);
        assert_success(&out, &format!("check --read-data of {}", dir.display()));
        for snap in manifest["snapshots"].as_array().unwrap() {
            let id = snap["id"].as_str().unwrap();
            let target = env.path(&format!("restore-{id}"));
            let spec = format!("{id}:{}", snap["path"].as_str().unwrap());
            let out = run(&["restore", &spec, "--target", target.to_str().unwrap()]);
            assert_success(&out, &format!("restore {spec} from {}", dir.display()));
            let got = describe_tree(&target);
            let want = snap["entries"].as_array().unwrap();
            assert_eq!(
                got.len(),
                want.len(),
                "{}: snapshot {id} entry count",
                dir.display()
            );
            for (g, w) in got.iter().zip(want) {
                assert_eq!(
                    g,
                    w,
                    "{}: snapshot {id} restores differently",
                    dir.display()
                );
            }
            checked += 1;
        }
    }
    eprintln!("restored {checked} fixture snapshots exactly");
    assert!(checked > 0, "no fixture was checked");
}

/// `copy` moves a repository of every older format into a new (current format) one,
/// whose snapshots restore exactly as the fixture's.
#[test]
fn copy_moves_every_fixture_to_the_current_format() {
    let version = cairn_core::config::FORMAT_VERSION;
    for entry in fs::read_dir(fixtures_dir()).unwrap() {
        let dir = entry.unwrap().path();
        let manifest: Value =
            serde_json::from_slice(&fs::read(dir.join("manifest.json")).unwrap()).unwrap();
        if manifest["format_version"] == version {
            continue;
        }
        let env = TestEnv::with_repo();
        let old = env.path("old");
        copy_tree(&dir.join("repo"), &old);
        let pw = env.path("old-password");
        fs::write(&pw, manifest["password"].as_str().unwrap()).unwrap();
        let out = env
            .cmd()
            .args(["copy", "--from-repo"])
            .arg(&old)
            .arg("--from-password-file")
            .arg(&pw)
            .output()
            .unwrap();
        assert_success(&out, &format!("copy from {}", dir.display()));
        let config: Value =
            serde_json::from_slice(&fs::read(env.repo.join("config")).unwrap()).unwrap();
        assert_eq!(config["version"], version);
        let copies = env.snapshots();
        let snapshots = manifest["snapshots"].as_array().unwrap();
        assert_eq!(copies.len(), snapshots.len());
        for (copy, snap) in copies.iter().zip(snapshots) {
            let target = env.path(&format!("restore-{}", snap["id"].as_str().unwrap()));
            let spec = format!(
                "{}:{}",
                copy["id"].as_str().unwrap(),
                snap["path"].as_str().unwrap()
            );
            env.restore(&spec, &target, &[]);
            assert_eq!(
                describe_tree(&target),
                snap["entries"].as_array().unwrap().clone(),
                "{}: copy of {} restores differently",
                dir.display(),
                snap["id"]
            );
        }
        assert_check_clean(&env, &["--read-data"], "the copy");
    }
}

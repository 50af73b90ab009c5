//! Shared helpers for the black-box tests: an isolated environment per test, running
//! `cairn` in it, building source trees, and comparing a restored tree with its source.
//!
//! Every command runs with HOME and the XDG directories inside the test's tempdir, so a
//! test can never read or write the real home, and with a timeout, so a command that
//! waits for a password on a terminal fails instead of hanging the suite.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use assert_cmd::Command;
use serde_json::Value;
use tempfile::TempDir;

pub const PASSWORD: &str = "correct horse battery staple";

/// Long enough for the slowest command of the suite on a loaded 2-core machine.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// Chunk sizes that make a few-MB file span many chunks and packs.
pub const SMALL_CHUNKS: [&str; 6] = [
    "--chunk-min",
    "16K",
    "--chunk-avg",
    "64K",
    "--chunk-max",
    "256K",
];

/// One test's private world: a tempdir holding home, XDG dirs, the repository and
/// whatever sources and restore targets the test makes.
pub struct TestEnv {
    pub dir: TempDir,
    /// Canonical path of `dir`, so paths compare equal to the absolute paths cairn stores.
    pub root: PathBuf,
    /// The repository's address: `root/repo`, or a remote address (see
    /// `remote::remote_test_env`).
    pub repo: PathBuf,
    /// What every cairn command gets in its environment besides the isolated defaults:
    /// what a remote repository needs (credentials, an `ssh` that reads the test server's
    /// client config).
    pub vars: Vec<(String, String)>,
}

impl TestEnv {
    /// A new environment without a repository.
    pub fn new() -> TestEnv {
        let dir = tempfile::Builder::new()
            .prefix("cairn-test-")
            .tempdir()
            .expect("create tempdir");
        let root = dir.path().canonicalize().expect("canonicalize tempdir");
        for sub in ["home", "data", "config"] {
            fs::create_dir_all(root.join(sub)).unwrap();
        }
        let repo = root.join("repo");
        TestEnv {
            dir,
            root,
            repo,
            vars: Vec::new(),
        }
    }

    /// A new environment with a repository initialised with the default options.
    pub fn with_repo() -> TestEnv {
        let env = TestEnv::new();
        env.init(&[]);
        env
    }

    /// A new environment with a repository using small chunks, so that small test files
    /// still produce several chunks and packs.
    pub fn with_small_chunk_repo() -> TestEnv {
        let env = TestEnv::new();
        env.init(&SMALL_CHUNKS);
        env
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// `cairn` with the isolated environment and the password, but no repository option.
    pub fn bare_cmd(&self) -> Command {
        let mut cmd = Command::from_std(spawnable_bare(self));
        cmd.timeout(COMMAND_TIMEOUT);
        cmd
    }

    /// `cairn -r REPO ...` with the password in the environment.
    pub fn cmd(&self) -> Command {
        let mut cmd = self.bare_cmd();
        cmd.arg("-r").arg(&self.repo);
        cmd
    }

    pub fn init(&self, extra: &[&str]) {
        let out = self.cmd().arg("init").args(extra).output().unwrap();
        assert_success(&out, "cairn init");
    }

    /// `cairn backup --json PATHS... EXTRA...`, which must exit 0; returns the summary.
    pub fn backup(&self, paths: &[&Path], extra: &[&str]) -> Value {
        let out = self
            .cmd()
            .args(["backup", "--json"])
            .args(paths)
            .args(extra)
            .output()
            .unwrap();
        assert_success(&out, "cairn backup");
        parse_json(&out.stdout, "cairn backup --json")
    }

    /// Backs up and returns the new snapshot's id.
    pub fn backup_id(&self, paths: &[&Path], extra: &[&str]) -> String {
        let summary = self.backup(paths, extra);
        summary["snapshot_id"]
            .as_str()
            .unwrap_or_else(|| panic!("backup summary has a string snapshot_id: {summary}"))
            .to_string()
    }

    pub fn snapshots(&self) -> Vec<Value> {
        let out = self.cmd().args(["snapshots", "--json"]).output().unwrap();
        assert_success(&out, "cairn snapshots --json");
        match parse_json(&out.stdout, "cairn snapshots --json") {
            Value::Object(mut doc) => match doc.remove("snapshots") {
                Some(Value::Array(items)) => items,
                other => panic!("cairn snapshots --json has a snapshots array, got {other:?}"),
            },
            other => panic!("cairn snapshots --json prints an object, got {other}"),
        }
    }

    /// `cairn restore SNAPSHOT --target TARGET EXTRA...`, which must exit 0.
    pub fn restore(&self, snapshot: &str, target: &Path, extra: &[&str]) -> std::process::Output {
        let out = self
            .cmd()
            .arg("restore")
            .arg(snapshot)
            .arg("--target")
            .arg(target)
            .args(extra)
            .output()
            .unwrap();
        assert_success(&out, &format!("cairn restore {snapshot}"));
        out
    }

    /// Files in a repository directory (`data`, `index`, ...), recursively, sorted.
    pub fn repo_files(&self, sub: &str) -> Vec<PathBuf> {
        let mut files = Vec::new();
        collect_files(&self.repo.join(sub), &mut files);
        files.sort();
        files
    }

    /// Opens up the whole tempdir so that a command run as `nobody` can use it.
    pub fn make_world_accessible(&self) {
        let status = std::process::Command::new("chmod")
            .arg("-R")
            .arg("a+rwX")
            .arg(&self.root)
            .status()
            .unwrap();
        assert!(status.success(), "chmod -R a+rwX on the tempdir");
    }
}

pub fn cairn_bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("cairn")
}

/// A command run in a new session, so it has no controlling terminal: a password
/// prompt on /dev/tty fails at once instead of waiting for a developer's keyboard.
pub fn detached(program: impl AsRef<OsStr>) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(program);
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd
}

/// Number of files below `dir`, recursively (0 if it does not exist).
pub fn count_files(dir: &Path) -> usize {
    let mut files = Vec::new();
    collect_files(dir, &mut files);
    files.len()
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Where a full restore of `source` into `target` puts it: the absolute path below target.
pub fn restored_path(target: &Path, source: &Path) -> PathBuf {
    target.join(source.strip_prefix("/").expect("source paths are absolute"))
}

pub fn describe(out: &std::process::Output) -> String {
    format!(
        "exit status: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn assert_success(out: &std::process::Output, what: &str) {
    assert!(out.status.success(), "{what} failed\n{}", describe(out));
}

pub fn assert_exit(out: &std::process::Output, code: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: expected exit code {code}\n{}",
        describe(out)
    );
}

pub fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn parse_json(bytes: &[u8], what: &str) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| {
        panic!(
            "{what} prints valid JSON ({e}); got:\n{}",
            String::from_utf8_lossy(bytes)
        )
    })
}

pub fn json_u64(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("field {field:?} is an unsigned integer in {v}"))
}

pub fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

// ---------------------------------------------------------------------------------------
// Building source trees
// ---------------------------------------------------------------------------------------

/// Deterministic pseudo-random bytes (xorshift), so failures are reproducible.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Log-like text that compresses well (lz4 to under a fifth) but is not one repeated
/// pattern.
pub fn compressible_bytes(len: usize, seed: u64) -> Vec<u8> {
    let words = [
        "cairn", "backup", "chunk", "pack", "index", "snapshot", "tree", "blob",
    ];
    let noise = random_bytes(len / 16 + 2, seed);
    let mut out = Vec::with_capacity(len + 64);
    let mut i = 0;
    while out.len() < len {
        let (a, b) = (
            noise[(2 * i) % noise.len()],
            noise[(2 * i + 1) % noise.len()],
        );
        out.extend_from_slice(
            format!(
                "entry {i:08}: {} stored in {}, status ok\n",
                words[a as usize % 8],
                words[b as usize % 8]
            )
            .as_bytes(),
        );
        i += 1;
    }
    out.truncate(len);
    out
}

/// Writes `count` files of `size` incompressible bytes into `dir`, named `f0.bin`,
/// `f1.bin`, ... and each made from its own seed (`seed`, `seed + 1`, ...).
pub fn write_random_files(dir: &Path, count: u64, size: usize, seed: u64) {
    for i in 0..count {
        write_file(
            &dir.join(format!("f{i}.bin")),
            &random_bytes(size, seed + i),
        );
    }
}

pub fn write_file(path: &Path, contents: &[u8]) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    let mut f = fs::File::create(path).unwrap();
    f.write_all(contents).unwrap();
}

pub fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Sets mtime (and atime) with nanosecond precision, without following symlinks.
pub fn set_mtime(path: &Path, secs: i64, nanos: i64) {
    use nix::sys::stat::{utimensat, UtimensatFlags};
    use nix::sys::time::TimeSpec;
    let ts = TimeSpec::new(secs, nanos);
    utimensat(None, path, &ts, &ts, UtimensatFlags::NoFollowSymlink)
        .unwrap_or_else(|e| panic!("set mtime of {}: {e}", path.display()));
}

pub fn mkfifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o640))
        .unwrap_or_else(|e| panic!("mkfifo {}: {e}", path.display()));
}

/// A file name with bytes that are not valid UTF-8.
pub fn non_utf8_name() -> OsString {
    OsStr::from_bytes(b"bad-\xff\xfe-name.bin").to_os_string()
}

/// Whether the filesystem under `dir` accepts `user.*` extended attributes.
pub fn user_xattrs_supported(dir: &Path) -> bool {
    let probe = dir.join(".xattr-probe");
    write_file(&probe, b"");
    let ok = xattr::set(&probe, "user.cairn.probe", b"1").is_ok();
    let _ = fs::remove_file(&probe);
    ok
}

/// A tree with most kinds of entries cairn must keep: nested dirs, an empty file, small
/// and multi-chunk files, modes, ns mtimes, symlinks (relative, absolute, dangling), a
/// hardlink pair, a FIFO and a non-UTF-8 name. Returns the tree's root.
pub fn build_rich_tree(root: &Path) -> PathBuf {
    let src = root.to_path_buf();
    fs::create_dir_all(&src).unwrap();
    write_file(&src.join("hello.txt"), b"hello, cairn\n");
    write_file(&src.join("empty"), b"");
    write_file(&src.join("dir a/nested/deeper/leaf.txt"), b"leaf\n");
    write_file(&src.join("dir a/random.bin"), &random_bytes(1_500_000, 1));
    write_file(&src.join("dir a/text.log"), &compressible_bytes(700_000, 2));
    write_file(&src.join("-leading-dash"), b"dash");
    write_file(&src.join("ünïcødé ✓.txt"), "unicode\n".as_bytes());
    write_file(&src.join(non_utf8_name()), b"non-utf8 name\n");
    write_file(&src.join("script.sh"), b"#!/bin/sh\necho hi\n");
    set_mode(&src.join("script.sh"), 0o755);
    write_file(&src.join("secret"), b"only me\n");
    set_mode(&src.join("secret"), 0o600);
    write_file(&src.join("readonly"), b"read only\n");
    set_mode(&src.join("readonly"), 0o444);
    fs::create_dir(src.join("private")).unwrap();
    write_file(&src.join("private/inside"), b"inside\n");
    fs::create_dir(src.join("empty dir")).unwrap();
    std::os::unix::fs::symlink("hello.txt", src.join("link-relative")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", src.join("link-absolute")).unwrap();
    std::os::unix::fs::symlink("does/not/exist", src.join("link-dangling")).unwrap();
    std::os::unix::fs::symlink("dir a", src.join("link-to-dir")).unwrap();
    write_file(&src.join("hard-1"), b"one inode, two names\n");
    fs::hard_link(src.join("hard-1"), src.join("dir a/hard-2")).unwrap();
    mkfifo(&src.join("fifo"));

    // Distinct nanosecond mtimes; directories last and bottom-up, because adding entries
    // changes a directory's mtime.
    let files = [
        "hello.txt",
        "empty",
        "dir a/nested/deeper/leaf.txt",
        "dir a/random.bin",
        "dir a/text.log",
        "-leading-dash",
        "script.sh",
        "secret",
        "readonly",
        "private/inside",
        "hard-1",
        "fifo",
    ];
    for (i, f) in files.iter().enumerate() {
        set_mtime(
            &src.join(f),
            1_500_000_000 + i as i64 * 1000,
            123_456_789 + i as i64,
        );
    }
    set_mtime(&src.join(non_utf8_name()), 1_600_000_000, 987_654_321);
    set_mtime(&src.join("ünïcødé ✓.txt"), 1_600_000_001, 1);
    set_mtime(&src.join("link-relative"), 1_400_000_000, 5);
    for (i, d) in [
        "dir a/nested/deeper",
        "dir a/nested",
        "dir a",
        "empty dir",
        "private",
    ]
    .iter()
    .enumerate()
    {
        set_mtime(&src.join(d), 1_550_000_000 + i as i64, 42 + i as i64);
    }
    set_mode(&src.join("private"), 0o700);
    set_mtime(&src, 1_560_000_000, 777);
    src
}

// ---------------------------------------------------------------------------------------
// Comparing trees
// ---------------------------------------------------------------------------------------

/// What `compare_trees` checks besides types, contents and symlink targets.
#[derive(Clone, Copy, Debug)]
pub struct Compare {
    pub modes: bool,
    pub mtimes: bool,
    pub owners: bool,
    pub xattrs: bool,
    pub hardlinks: bool,
    /// Also compare the metadata of the two roots themselves (not only their contents).
    pub root_metadata: bool,
}

impl Compare {
    pub const ALL: Compare = Compare {
        modes: true,
        mtimes: true,
        owners: true,
        xattrs: true,
        hardlinks: true,
        root_metadata: true,
    };
    pub const CONTENTS: Compare = Compare {
        modes: false,
        mtimes: false,
        owners: false,
        xattrs: false,
        hardlinks: false,
        root_metadata: false,
    };
}

/// Panics with the first difference between `expected` and `actual`.
pub fn assert_trees_equal(expected: &Path, actual: &Path, what: Compare) {
    if let Err(diff) = compare_trees(expected, actual, what) {
        panic!(
            "trees differ\n  expected: {}\n  actual:   {}\n  first difference: {diff}",
            expected.display(),
            actual.display()
        );
    }
}

/// Compares two trees entry by entry; returns the first difference found.
pub fn compare_trees(expected: &Path, actual: &Path, what: Compare) -> Result<(), String> {
    let mut inodes_expected = BTreeMap::new();
    let mut inodes_actual = BTreeMap::new();
    if what.root_metadata {
        compare_entry(expected, actual, Path::new("."), what)?;
    } else {
        let (e, a) = (meta(expected)?, meta(actual)?);
        if !e.is_dir() || !a.is_dir() {
            return Err(format!(
                "roots must both be directories (expected dir: {}, actual dir: {})",
                e.is_dir(),
                a.is_dir()
            ));
        }
    }
    compare_dirs(
        expected,
        actual,
        Path::new(""),
        what,
        &mut inodes_expected,
        &mut inodes_actual,
    )?;
    if what.hardlinks {
        compare_link_groups(&inodes_expected, &inodes_actual)?;
    }
    Ok(())
}

fn meta(path: &Path) -> Result<fs::Metadata, String> {
    fs::symlink_metadata(path).map_err(|e| format!("{}: cannot stat: {e}", path.display()))
}

fn sorted_names(dir: &Path) -> Result<Vec<OsString>, String> {
    let mut names: Vec<OsString> = fs::read_dir(dir)
        .map_err(|e| format!("{}: cannot list: {e}", dir.display()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: cannot list: {e}", dir.display()))?;
    names.sort();
    Ok(names)
}

type InodeMap = BTreeMap<PathBuf, (u64, u64)>;

fn compare_dirs(
    expected: &Path,
    actual: &Path,
    rel: &Path,
    what: Compare,
    inodes_expected: &mut InodeMap,
    inodes_actual: &mut InodeMap,
) -> Result<(), String> {
    let names_e = sorted_names(expected)?;
    let names_a = sorted_names(actual)?;
    for name in &names_e {
        if !names_a.contains(name) {
            return Err(format!(
                "{}: missing from the actual tree",
                rel.join(name).display()
            ));
        }
    }
    for name in &names_a {
        if !names_e.contains(name) {
            return Err(format!(
                "{}: unexpected extra entry in the actual tree",
                rel.join(name).display()
            ));
        }
    }
    for name in &names_e {
        let (e, a, r) = (expected.join(name), actual.join(name), rel.join(name));
        compare_entry(&e, &a, &r, what)?;
        let (me, ma) = (meta(&e)?, meta(&a)?);
        if me.is_file() {
            inodes_expected.insert(r.clone(), (me.dev(), me.ino()));
            inodes_actual.insert(r.clone(), (ma.dev(), ma.ino()));
        }
        if me.is_dir() {
            compare_dirs(&e, &a, &r, what, inodes_expected, inodes_actual)?;
        }
    }
    Ok(())
}

fn kind(m: &fs::Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_file() {
        "file"
    } else if t.is_dir() {
        "dir"
    } else if t.is_symlink() {
        "symlink"
    } else if t.is_fifo() {
        "fifo"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_char_device() {
        "char device"
    } else {
        "unknown"
    }
}

fn compare_entry(e: &Path, a: &Path, rel: &Path, what: Compare) -> Result<(), String> {
    let (me, ma) = (meta(e)?, meta(a)?);
    let r = rel.display();
    if kind(&me) != kind(&ma) {
        return Err(format!(
            "{r}: type {} expected, found {}",
            kind(&me),
            kind(&ma)
        ));
    }
    if me.is_file() {
        let (ce, ca) = (fs::read(e).unwrap(), fs::read(a).unwrap());
        if ce != ca {
            let first = ce
                .iter()
                .zip(&ca)
                .position(|(x, y)| x != y)
                .unwrap_or(ce.len().min(ca.len()));
            return Err(format!(
                "{r}: contents differ (expected {} bytes, found {}; first differing offset {first})",
                ce.len(),
                ca.len()
            ));
        }
    }
    if me.file_type().is_symlink() {
        let (te, ta) = (fs::read_link(e).unwrap(), fs::read_link(a).unwrap());
        if te != ta {
            return Err(format!("{r}: symlink target {te:?} expected, found {ta:?}"));
        }
    }
    let is_symlink = me.file_type().is_symlink();
    if what.modes && !is_symlink && me.mode() & 0o7777 != ma.mode() & 0o7777 {
        return Err(format!(
            "{r}: mode {:o} expected, found {:o}",
            me.mode() & 0o7777,
            ma.mode() & 0o7777
        ));
    }
    if what.mtimes && !is_symlink && (me.mtime(), me.mtime_nsec()) != (ma.mtime(), ma.mtime_nsec())
    {
        return Err(format!(
            "{r}: mtime {}.{:09} expected, found {}.{:09}",
            me.mtime(),
            me.mtime_nsec(),
            ma.mtime(),
            ma.mtime_nsec()
        ));
    }
    if what.owners && (me.uid(), me.gid()) != (ma.uid(), ma.gid()) {
        return Err(format!(
            "{r}: owner {}:{} expected, found {}:{}",
            me.uid(),
            me.gid(),
            ma.uid(),
            ma.gid()
        ));
    }
    if what.xattrs && !is_symlink {
        let (xe, xa) = (user_xattrs(e), user_xattrs(a));
        if xe != xa {
            return Err(format!("{r}: user xattrs {xe:?} expected, found {xa:?}"));
        }
    }
    Ok(())
}

fn user_xattrs(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let Ok(names) = xattr::list(path) else {
        return out;
    };
    for name in names {
        let name = name.to_string_lossy().into_owned();
        if name.starts_with("user.") {
            let value = xattr::get(path, &name).ok().flatten().unwrap_or_default();
            out.insert(name, value);
        }
    }
    out
}

/// Two paths share an inode in one tree exactly when they share one in the other.
fn compare_link_groups(expected: &InodeMap, actual: &InodeMap) -> Result<(), String> {
    fn representatives(map: &InodeMap) -> BTreeMap<PathBuf, PathBuf> {
        let mut first: BTreeMap<(u64, u64), PathBuf> = BTreeMap::new();
        let mut out = BTreeMap::new();
        for (path, inode) in map {
            let rep = first.entry(*inode).or_insert_with(|| path.clone());
            out.insert(path.clone(), rep.clone());
        }
        out
    }
    let (re, ra) = (representatives(expected), representatives(actual));
    for (path, rep_e) in &re {
        let rep_a = &ra[path];
        if rep_e != rep_a {
            return Err(format!(
                "hardlinks: {} should share an inode with {} (and only its group), but in the \
                 actual tree it is grouped with {}",
                path.display(),
                rep_e.display(),
                rep_a.display()
            ));
        }
    }
    Ok(())
}

/// `cairn` on the default repository: neither a repository nor a password configured.
pub fn unconfigured(env: &TestEnv) -> assert_cmd::Command {
    let mut cmd = env.bare_cmd();
    cmd.env_remove("CAIRN_PASSWORD")
        .env_remove("CAIRN_REPOSITORY");
    cmd
}

/// Where the default repository of `env` lives.
pub fn default_repo(env: &TestEnv) -> PathBuf {
    env.root.join("data/cairn/default")
}

/// Copies a tree with `cp -a`, keeping modes, times, owners, xattrs and hardlinks, to
/// remember a state for later comparison.
pub fn copy_tree(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

/// Every regular file below `dir` with its contents, keyed by path relative to `dir`.
pub fn files_below(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let m = fs::symlink_metadata(&path).unwrap();
            if m.is_dir() {
                walk(base, &path, out);
            } else if m.is_file() {
                out.insert(
                    path.strip_prefix(base).unwrap().to_path_buf(),
                    fs::read(&path).unwrap(),
                );
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

// ---------------------------------------------------------------------------------------
// Helpers of the trust_* tests (crashes, full disks, damage, concurrency)
// ---------------------------------------------------------------------------------------

/// `cairn -r REPO` as a plain `std::process::Command` with the same isolated environment
/// as `TestEnv::cmd`, for commands a test spawns, runs side by side, or kills.
pub fn spawnable(env: &TestEnv) -> std::process::Command {
    let mut cmd = spawnable_bare(env);
    cmd.arg("-r").arg(&env.repo);
    cmd
}

/// `cairn` as a plain `std::process::Command` in the isolated environment, without a
/// repository option.
pub fn spawnable_bare(env: &TestEnv) -> std::process::Command {
    spawnable_program(env, cairn_bin())
}

/// As [`spawnable_bare`], for another `cairn` binary (an older build, to show that a
/// regression test fails without its fix).
pub fn spawnable_program(env: &TestEnv, program: impl AsRef<OsStr>) -> std::process::Command {
    let mut cmd = detached(program);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", env.root.join("home"))
        .env("XDG_DATA_HOME", env.root.join("data"))
        .env("XDG_CONFIG_HOME", env.root.join("config"))
        .env("XDG_CACHE_HOME", env.root.join("home/.cache"))
        .env("LC_ALL", "C.UTF-8")
        // Days for forget's buckets, schedules and mount names are local: the same on
        // every machine, whatever its zone.
        .env("TZ", "UTC")
        .env("CAIRN_PASSWORD", PASSWORD)
        .envs(env.vars.iter().map(|(k, v)| (k, v)))
        .current_dir(&env.root);
    cmd
}

/// `cairn check --json EXTRA...`: its exit code and report. Exit codes other than 0
/// (no problems) and 1 (problems) fail the test.
pub fn check_report(env: &TestEnv, extra: &[&str]) -> (i32, Value) {
    let out = env
        .cmd()
        .args(["check", "--json"])
        .args(extra)
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    assert!(
        code == 0 || code == 1,
        "cairn check {extra:?} exits 0 or 1\n{}",
        describe(&out)
    );
    (code, parse_json(&out.stdout, "cairn check --json"))
}

/// `cairn check --json EXTRA...` must exit 0 with no problems; returns the report.
pub fn assert_check_clean(env: &TestEnv, extra: &[&str], what: &str) -> Value {
    let (code, report) = check_report(env, extra);
    assert!(
        code == 0 && report["problems"].as_array().is_some_and(|p| p.is_empty()),
        "{what}: cairn check {extra:?} finds no problems (exit {code}):\n{report:#}"
    );
    report
}

/// Restores `snapshot` into a fresh directory and compares the restored `source` (the
/// absolute path that was backed up) with `expected` (a copy taken at backup time).
/// Removes the restored tree afterwards.
pub fn assert_snapshot_restores(
    env: &TestEnv,
    snapshot: &str,
    source: &Path,
    expected: &Path,
    what: Compare,
) {
    let target = env.path(&format!(
        "verify-{snapshot}-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    env.restore(snapshot, &target, &[]);
    if let Err(diff) = compare_trees(expected, &restored_path(&target, source), what) {
        panic!(
            "snapshot {snapshot} does not restore what was backed up: {diff}\n  expected: {}\n  restored: {}",
            expected.display(),
            target.display()
        );
    }
    fs::remove_dir_all(&target).unwrap();
}

/// Snapshot ids (64 hex) currently in the repository, sorted.
pub fn snapshot_ids(env: &TestEnv) -> Vec<String> {
    let mut ids: Vec<String> = env
        .snapshots()
        .iter()
        .map(|s| {
            s["id"]
                .as_str()
                .unwrap_or_else(|| panic!("snapshot has a string id: {s}"))
                .to_string()
        })
        .collect();
    ids.sort();
    ids
}

/// Files in a repository directory that are not temporary (`.tmp-*`).
pub fn repo_final_files(env: &TestEnv, sub: &str) -> Vec<PathBuf> {
    env.repo_files(sub)
        .into_iter()
        .filter(|p| {
            !p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(".tmp"))
        })
        .collect()
}

/// Runs `command` and sends it SIGINT 200 ms after a session file appears in `sessions`
/// (a repository's `sessions` directory); see [`interrupt_when`].
pub fn interrupt_once_a_session_appears(
    command: &mut std::process::Command,
    sessions: &Path,
) -> std::process::Output {
    let what = format!("no session was registered in {}", sessions.display());
    interrupt_when(
        command,
        &what,
        std::time::Duration::from_millis(200),
        || fs::read_dir(sessions).map_or(0, |d| d.count()) > 0,
    )
}

/// Runs `command` and sends it SIGINT `after` the moment `ready` first holds (`what`
/// says what never happened, if it does not within 60 s). The command must still run
/// then, however late a loaded machine runs this thread: hold it to a transfer rate
/// (`--limit-upload`, `--limit-download`) so that it lasts many seconds by construction.
pub fn interrupt_when(
    command: &mut std::process::Command,
    what: &str,
    after: std::time::Duration,
    ready: impl Fn() -> bool,
) -> std::process::Output {
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !ready() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    std::thread::sleep(after);
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    assert_ne!(
        out.status.code(),
        Some(0),
        "the command finished before the signal arrived: hold it to a slower rate"
    );
    out
}

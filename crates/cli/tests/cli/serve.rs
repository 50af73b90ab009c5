//! `cairn serve` as its users meet it: a real server process on loopback, clients that
//! are `cairn` processes with `rest:` addresses and tokens, and raw HTTP requests for
//! what a compromised client would send that no `cairn` sends.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// A `cairn serve` process, killed when dropped.
struct Server {
    child: Child,
    /// `http(s)://127.0.0.1:PORT`
    url: String,
    dir: PathBuf,
}

impl Server {
    /// Serves `dir` on a free loopback port.
    fn start(env: &TestEnv, dir: &Path, extra: &[&str]) -> Server {
        Server::start_at(env, dir, "127.0.0.1:0", extra)
    }

    fn start_at(env: &TestEnv, dir: &Path, listen: &str, extra: &[&str]) -> Server {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("access.log"))
            .unwrap();
        let mut child = spawnable_bare(env)
            .args(["serve", "--dir"])
            .arg(dir)
            .args(["--listen", listen])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .rsplit(' ')
            .next()
            .filter(|u| u.contains("://") || u.starts_with("unix:"))
            .unwrap_or_else(|| panic!("cairn serve prints its address, not {line:?}"))
            .to_string();
        Server {
            child,
            url,
            dir: dir.to_path_buf(),
        }
    }

    fn addr(&self) -> String {
        self.url.rsplit('/').next().unwrap().to_string()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("access.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `cairn serve --dir DIR token add NAME --repo REPO --rights RIGHTS`: the token, the
/// last word of its output.
fn token(env: &TestEnv, dir: &Path, name: &str, repo: &str, rights: &str) -> String {
    let out = env
        .bare_cmd()
        .args(["serve", "--dir"])
        .arg(dir)
        .args(["token", "add", name, "--repo", repo, "--rights", rights])
        .output()
        .unwrap();
    assert_success(&out, "cairn serve token add");
    let token = stdout(&out).split_whitespace().last().unwrap().to_string();
    assert!(token.starts_with("cairn-"), "{token}");
    token
}

/// `cairn init` of `env`'s repository as its owner makes it: through a maintain token of
/// its own, since an append token may not create the config and key files.
fn init_as_owner(env: &TestEnv, senv: &TestEnv, dir: &Path, repo: &str, extra: &[&str]) {
    let owner = token(senv, dir, &format!("owner-of-{repo}"), repo, "maintain");
    let out = (env.cmd().env("CAIRN_REST_TOKEN", owner))
        .arg("init")
        .args(extra)
        .output()
        .unwrap();
    assert_success(&out, "cairn init with the owner's maintain token");
}

/// A client environment for repository `repo` of `server` with `token`.
fn client(server: &Server, repo: &str, token: &str) -> TestEnv {
    let mut env = TestEnv::new();
    env.repo = PathBuf::from(format!("rest:{}/{repo}", server.url));
    env.vars.push(("CAIRN_REST_TOKEN".into(), token.into()));
    env
}

/// A server directory with its own environment for the `serve` commands.
fn server_dir() -> (TestEnv, PathBuf) {
    let env = TestEnv::new();
    let dir = env.path("served");
    std::fs::create_dir_all(&dir).unwrap();
    (env, dir)
}

/// One request over a raw connection, as an attacker would write it (paths are sent
/// exactly as given, never normalized). `declared` is the Content-Length sent, which may
/// differ from the body. Returns the status and the body of the answer.
fn raw(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
    declared: Option<u64>,
) -> (u16, String) {
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    raw_on(stream, addr, method, path, token, body, declared)
}

/// [`raw`] on a connection already made (TCP or a unix socket).
fn raw_on(
    mut stream: impl Read + Write,
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
    declared: Option<u64>,
) -> (u16, String) {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\n\r\n",
        declared.unwrap_or(body.len() as u64)
    ));
    stream.write_all(head.as_bytes()).unwrap();
    // The server may answer and close before taking a body it refuses.
    let _ = stream.write_all(body);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: no HTTP answer: {answer:?}"));
    let text = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, text)
}

/// BLAKE3 of `bytes` in hex: how the server names objects.
fn hash_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

fn name_in(files: &std::collections::BTreeMap<PathBuf, Vec<u8>>, prefix: &str) -> String {
    files
        .keys()
        .map(|p| p.to_string_lossy().into_owned())
        .find(|p| p.starts_with(prefix))
        .unwrap_or_else(|| panic!("the repository has a file under {prefix}"))
}

#[test]
fn serve_append_token_cannot_alter_or_remove_anything_and_each_attempt_is_a_4xx() {
    let (senv, dir) = server_dir();
    let app = token(&senv, &dir, "laptop", "home", "append");
    let other = token(&senv, &dir, "desk", "home", "append");
    let foreign = token(&senv, &dir, "office", "work", "append");
    let reader = token(&senv, &dir, "auditor", "home", "read");
    let server = Server::start(&senv, &dir, &["--max-body", "1M"]);
    let env = client(&server, "home", &app);
    // The config and key files are the owner's to make.
    let out = env.cmd().arg("init").output().unwrap();
    assert_exit(&out, 1, "init with an append token");
    assert!(
        stderr(&out).contains("403") && stderr(&out).contains("maintain"),
        "{}",
        stderr(&out)
    );
    init_as_owner(&env, &senv, &dir, "home", &SMALL_CHUNKS);
    let src = env.path("src");
    write_random_files(&src, 4, 100_000, 1);
    let snapshot = env.backup_id(&[&src], &[]);

    // Session files: each token may remove the ones it wrote, and only those.
    let session = b"a session file of the desk".to_vec();
    let session_name = format!("sessions/{}", hash_hex(&session));
    let addr = server.addr();
    let put = |name: &str, token: Option<&str>, body: &[u8]| {
        raw(&addr, "PUT", &format!("/home/{name}"), token, body, None)
    };
    let delete = |name: &str, token: Option<&str>| {
        raw(&addr, "DELETE", &format!("/home/{name}"), token, b"", None)
    };
    assert_eq!(put(&session_name, Some(&other), &session).0, 201);
    assert_eq!(
        delete(&session_name, Some(&app)).0,
        403,
        "another token's session"
    );
    assert_eq!(
        delete(&session_name, Some(&other)).0,
        204,
        "its own session"
    );

    let repo_dir = dir.join("home");
    let before = files_below(&repo_dir);
    let pack = name_in(&before, "data/");
    let snap = name_in(&before, "snapshots/");
    let key = name_in(&before, "keys/");
    let index = name_in(&before, "index/");
    let fresh = b"bytes that hash to something else".to_vec();
    let wrong_name = format!("index/{}", hash_hex(b"other bytes"));
    let good_name = format!("index/{}", hash_hex(&fresh));
    let attempts: Vec<(&str, (u16, String), u16)> = vec![
        ("delete a pack", delete(&pack, Some(&app)), 403),
        ("delete a snapshot", delete(&snap, Some(&app)), 403),
        ("delete an index", delete(&index, Some(&app)), 403),
        ("delete a key file", delete(&key, Some(&app)), 403),
        ("delete the config", delete("config", Some(&app)), 403),
        ("overwrite a snapshot", put(&snap, Some(&app), &fresh), 409),
        ("overwrite a pack", put(&pack, Some(&app), &fresh), 409),
        (
            "overwrite the config",
            put("config", Some(&app), b"{}"),
            // An append token may not create it at all (a maintain token gets 409).
            403,
        ),
        (
            "add a key file",
            put(&format!("keys/{}", hash_hex(&fresh)), Some(&app), &fresh),
            403,
        ),
        (
            "a body whose hash is not its name",
            put(&wrong_name, Some(&app), &fresh),
            400,
        ),
        (
            "a name outside the layout",
            put("locks/x", Some(&app), &fresh),
            400,
        ),
        (
            "a pack in the wrong fan-out directory",
            put(&format!("data/00/{}", hash_hex(&fresh)), Some(&app), &fresh),
            400,
        ),
        (
            "path traversal",
            raw(
                &addr,
                "PUT",
                "/home/../work/config",
                Some(&app),
                b"{}",
                None,
            ),
            400,
        ),
        (
            "encoded path traversal",
            raw(
                &addr,
                "PUT",
                "/home/%2e%2e/%2e%2e/config",
                Some(&app),
                b"{}",
                None,
            ),
            400,
        ),
        (
            "encoded slashes",
            raw(
                &addr,
                "PUT",
                "/home/index%2F..%2F..%2Fx",
                Some(&app),
                b"{}",
                None,
            ),
            400,
        ),
        (
            "an oversized body",
            raw(
                &addr,
                "PUT",
                &format!("/home/{good_name}"),
                Some(&app),
                b"",
                Some(2 << 20),
            ),
            413,
        ),
        ("no token", put(&good_name, None, &fresh), 401),
        (
            "a wrong token",
            put(&good_name, Some("cairn-0123abcd"), &fresh),
            401,
        ),
        (
            "no token, reading",
            raw(&addr, "GET", &format!("/home/{pack}"), None, b"", None),
            401,
        ),
        (
            "a token of another repository",
            put(&good_name, Some(&foreign), &fresh),
            403,
        ),
        (
            "a token of another repository, reading",
            raw(
                &addr,
                "GET",
                &format!("/home/{pack}"),
                Some(&foreign),
                b"",
                None,
            ),
            403,
        ),
        (
            "a read token writing",
            put(&good_name, Some(&reader), &fresh),
            403,
        ),
    ];
    for (what, (status, reason), expected) in &attempts {
        assert_eq!(status, expected, "{what}: {reason}");
        assert!(!reason.is_empty(), "{what}: the refusal says why");
    }
    assert_eq!(
        files_below(&repo_dir),
        before,
        "no refused request stored or changed anything"
    );
    assert!(
        !dir.join(".cairn-serve/deleted").exists(),
        "nothing was deleted, not even into the deletion delay"
    );
    assert!(
        !dir.join("work").exists(),
        "nothing reached another repository"
    );
    let log = server.access_log();
    assert!(
        log.lines()
            .any(|l| l.contains("\"status\":403") && l.contains("\"token\":\"laptop\"")),
        "the access log names the token of a refused request:\n{log}"
    );

    // And the owner's backup is whole.
    assert_check_clean(&env, &["--read-data"], "after the attacks");
    assert_snapshot_restores(&env, &snapshot, &src, &src, Compare::CONTENTS);
    // The reader may read.
    let (status, _) = raw(
        &addr,
        "GET",
        &format!("/home/{pack}"),
        Some(&reader),
        b"",
        None,
    );
    assert_eq!(status, 200);
}

#[test]
fn serve_sixteen_clients_back_up_at_once_and_every_snapshot_restores() {
    let (senv, dir) = server_dir();
    let tok = token(&senv, &dir, "fleet", "fleet", "append");
    let server = Server::start(&senv, &dir, &[]);
    let env = client(&server, "fleet", &tok);
    init_as_owner(&env, &senv, &dir, "fleet", &SMALL_CHUNKS);
    let sources: Vec<PathBuf> = (0..16)
        .map(|i| {
            let src = env.path(&format!("host{i}"));
            write_random_files(&src, 3, 60_000, 100 * i);
            // A file every client shares, deduplicated across them.
            write_file(&src.join("common.bin"), &random_bytes(200_000, 7));
            src
        })
        .collect();
    let children: Vec<Child> = sources
        .iter()
        .map(|src| {
            spawnable(&env)
                .args(["backup", "--json", "--no-scan"])
                .arg(src)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ids = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert_success(&out, "one of 16 backups at once");
        let summary = parse_json(&out.stdout, "backup --json");
        ids.push(summary["snapshot_id"].as_str().unwrap().to_string());
    }
    assert_eq!(snapshot_ids(&env).len(), 16);
    assert_check_clean(&env, &["--read-data"], "after 16 backups at once");
    for (id, src) in ids.iter().zip(&sources) {
        assert_snapshot_restores(&env, id, src, src, Compare::CONTENTS);
    }
}

/// Starts a backup of `src` (of many packs) and calls `during` once
/// the first pack is on the server's disk, while the backup goes on: held to 2 MB/s, the
/// backup of 12 MB lasts six seconds, so a test descheduled for a while still finds it
/// running (unlimited, it could end before the test saw its first pack).
fn backup_interrupted(
    env: &TestEnv,
    repo_dir: &Path,
    src: &Path,
    during: impl FnOnce(&mut Child),
) -> std::process::Output {
    let mut child = spawnable(env)
        .args(["--limit-upload", "2000", "backup", "--json", "--no-scan"])
        .arg(src)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !files_below(&repo_dir.join("data")).keys().any(|_| true) {
        assert!(Instant::now() < deadline, "no pack reached the server");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the backup ended before its first pack was seen"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    during(&mut child);
    child.wait_with_output().unwrap()
}

#[test]
fn serve_restarted_mid_backup_the_client_retries_and_completes() {
    let (senv, dir) = server_dir();
    let tok = token(&senv, &dir, "laptop", "home", "append");
    let mut server = Server::start(&senv, &dir, &[]);
    let env = client(&server, "home", &tok);
    init_as_owner(&env, &senv, &dir, "home", &["--pack-size", "1M"]);
    let src = env.path("src");
    write_random_files(&src, 12, 1 << 20, 3);
    let listen = server.addr();
    let out = backup_interrupted(&env, &dir.join("home"), &src, |_| {
        server.kill();
        std::thread::sleep(Duration::from_millis(500));
        server = Server::start_at(&senv, &dir, &listen, &[]);
    });
    assert_success(&out, "a backup whose server restarted midway");
    let id = parse_json(&out.stdout, "backup --json")["snapshot_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_check_clean(&env, &["--read-data"], "after the restart");
    assert_snapshot_restores(&env, &id, &src, &src, Compare::CONTENTS);
}

#[test]
fn serve_a_client_killed_mid_upload_leaves_a_clean_repository_and_the_next_backup_works() {
    let (senv, dir) = server_dir();
    let tok = token(&senv, &dir, "laptop", "home", "append");
    let server = Server::start(&senv, &dir, &[]);
    let env = client(&server, "home", &tok);
    init_as_owner(&env, &senv, &dir, "home", &["--pack-size", "1M"]);
    let src = env.path("src");
    write_random_files(&src, 12, 1 << 20, 4);
    let out = backup_interrupted(&env, &dir.join("home"), &src, |child| {
        // SAFETY: kill has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
    });
    assert_eq!(out.status.code(), None, "killed by the signal");
    assert!(snapshot_ids(&env).is_empty());
    assert_check_clean(&env, &[], "after a client was killed mid-upload");
    // The next backup comes from another machine's token: it may not remove the killed
    // client's session files (clutter that prune removes), and must not fail on that.
    let mut env = env;
    env.vars.retain(|(k, _)| k != "CAIRN_REST_TOKEN");
    let other = token(&senv, &dir, "desk", "home", "append");
    env.vars.push(("CAIRN_REST_TOKEN".into(), other));
    let id = env.backup_id(&[&src], &[]);
    assert!(
        !files_below(&dir.join("home/sessions")).is_empty(),
        "the killed client's session file stays"
    );
    assert_check_clean(&env, &["--read-data"], "after the next backup");
    assert_snapshot_restores(&env, &id, &src, &src, Compare::CONTENTS);
}

#[test]
fn serve_quota_exceeded_mid_backup_is_a_clear_error_and_the_repository_stays_consistent() {
    let (senv, dir) = server_dir();
    let tok = token(&senv, &dir, "laptop", "home", "append");
    let out = senv
        .bare_cmd()
        .args(["serve", "--dir"])
        .arg(&dir)
        .args(["quota", "home", "4M"])
        .output()
        .unwrap();
    assert_success(&out, "serve quota");
    let server = Server::start(&senv, &dir, &[]);
    let env = client(&server, "home", &tok);
    init_as_owner(&env, &senv, &dir, "home", &SMALL_CHUNKS);
    let small = env.path("small");
    write_random_files(&small, 2, 300_000, 5);
    let first = env.backup_id(&[&small], &[]);
    let big = env.path("big");
    write_random_files(&big, 3, 3 << 20, 6);
    let out = env.cmd().args(["backup"]).arg(&big).output().unwrap();
    assert_exit(&out, 1, "a backup beyond the quota");
    let err = stderr(&out);
    assert!(
        err.contains("quota") && err.contains("home") && err.contains("507"),
        "the error names the quota and the repository: {err}"
    );
    assert_eq!(
        snapshot_ids(&env).len(),
        1,
        "no snapshot of the refused backup"
    );
    assert_check_clean(&env, &[], "after the quota refused a backup");
    let more = env.path("more");
    write_random_files(&more, 1, 200_000, 7);
    let second = env.backup_id(&[&more], &[]);
    assert_snapshot_restores(&env, &first, &small, &small, Compare::CONTENTS);
    assert_snapshot_restores(&env, &second, &more, &more, Compare::CONTENTS);
}

#[test]
fn serve_forget_and_prune_through_a_maintain_token_is_undone_by_serve_undelete() {
    let (senv, dir) = server_dir();
    let tok = token(&senv, &dir, "cleaner", "home", "maintain");
    let server = Server::start(&senv, &dir, &[]);
    let mut env = client(&server, "home", &tok);
    env.vars.push(("CAIRN_GRACE_SECS".into(), "0".into()));
    env.init(&SMALL_CHUNKS);
    let mut backed_up = Vec::new();
    for i in 0..3 {
        let src = env.path(&format!("src{i}"));
        write_random_files(&src, 2, 150_000, 20 + i);
        backed_up.push((env.backup_id(&[&src], &[]), src));
    }
    let out = env
        .cmd()
        .args(["forget", "--keep-last", "0", "--prune"])
        .output()
        .unwrap();
    assert_success(&out, "forget --prune with a maintain token");
    assert!(snapshot_ids(&env).is_empty(), "every snapshot is gone");
    assert!(
        files_below(&dir.join("home/data")).is_empty(),
        "prune deleted every pack: {}",
        stdout(&out)
    );
    let out = senv
        .bare_cmd()
        .args(["serve", "--dir"])
        .arg(&dir)
        .args(["undelete", "home"])
        .output()
        .unwrap();
    assert_success(&out, "serve undelete");
    assert_eq!(snapshot_ids(&env).len(), 3);
    assert_check_clean(&env, &["--read-data"], "after undelete");
    for (id, src) in &backed_up {
        assert_snapshot_restores(&env, id, src, src, Compare::CONTENTS);
    }
}

#[test]
fn serve_deleted_objects_are_freed_once_the_delay_has_passed() {
    let (senv, dir) = server_dir();
    let tok = token(&senv, &dir, "cleaner", "home", "maintain");
    let server = Server::start(&senv, &dir, &["--delete-delay", "0"]);
    let env = client(&server, "home", &tok);
    env.init(&[]);
    let src = env.path("src");
    write_random_files(&src, 1, 1000, 8);
    let id = env.backup_id(&[&src], &[]);
    let out = env.cmd().args(["forget", &id]).output().unwrap();
    assert_success(&out, "forget");
    // The server frees what is due at start and every minute: restart it to sweep now.
    drop(server);
    let _server = Server::start(&senv, &dir, &["--delete-delay", "0"]);
    assert!(
        files_below(&dir.join(".cairn-serve/deleted")).is_empty(),
        "with no delay, the deleted snapshot is freed"
    );
}

#[test]
fn serve_tls_with_a_private_ca_is_accepted_with_cacert_and_refused_without() {
    let (senv, dir) = server_dir();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let server_key = rcgen::KeyPair::generate().unwrap();
    let server_cert = rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
        .unwrap()
        .signed_by(&server_key, &ca)
        .unwrap();
    let (ca_file, cert_file, key_file) = (
        senv.path("ca.pem"),
        senv.path("cert.pem"),
        senv.path("key.pem"),
    );
    write_file(&ca_file, ca.pem().as_bytes());
    write_file(&cert_file, server_cert.pem().as_bytes());
    write_file(&key_file, server_key.serialize_pem().as_bytes());
    let tok = token(&senv, &dir, "laptop", "home", "append");
    let tls = [
        "--tls-cert",
        cert_file.to_str().unwrap(),
        "--tls-key",
        key_file.to_str().unwrap(),
    ];
    let server = Server::start(&senv, &dir, &tls);
    assert!(server.url.starts_with("https://"), "{}", server.url);

    let env = client(&server, "home", &tok);
    let out = env.cmd().arg("init").output().unwrap();
    assert_exit(&out, 1, "init against a certificate no known CA signed");
    assert!(
        stderr(&out).contains(&server.url),
        "the error names the server: {}",
        stderr(&out)
    );
    assert!(!dir.join("home").exists(), "nothing was written");

    let mut env = env;
    env.vars
        .push(("CAIRN_CACERT".into(), ca_file.to_str().unwrap().into()));
    init_as_owner(&env, &senv, &dir, "home", &[]);
    let src = env.path("src");
    write_random_files(&src, 2, 50_000, 9);
    let id = env.backup_id(&[&src], &[]);
    assert_snapshot_restores(&env, &id, &src, &src, Compare::CONTENTS);
    let out = env
        .cmd()
        .args(["snapshots", "--cacert"])
        .arg(&ca_file)
        .env_remove("CAIRN_CACERT")
        .output()
        .unwrap();
    assert_success(&out, "--cacert on the command line");
}

#[test]
fn serve_refuses_plain_http_beyond_loopback() {
    let (senv, dir) = server_dir();
    let out = senv
        .bare_cmd()
        .args(["serve", "--dir"])
        .arg(&dir)
        .args(["--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_exit(&out, 1, "plain HTTP on every interface");
    assert!(stderr(&out).contains("--tls-cert"), "{}", stderr(&out));
}

/// A connection cut in the middle of an upload (as a proxy or a NAT in front of the server
/// might) is retried and the backup completes; a server that stops answering altogether
/// is a quick, clear failure that leaves nothing a later command trusts. The same checks
/// as for S3 and SFTP (`remote_faults`).
#[test]
fn serve_connections_cut_by_a_proxy_are_retried_and_a_lost_server_fails_cleanly() {
    use crate::remote_faults::{
        backup_completes_through_drops, backup_that_loses_the_server_fails_cleanly, drops,
        proxied_rest_repo, LOST,
    };
    let (senv, dir) = server_dir();
    let tok = token(&senv, &dir, "laptop", "home", "maintain");
    let tok_lost = token(&senv, &dir, "desk", "lost", "maintain");
    let server = Server::start(&senv, &dir, &[]);
    for (repo, tok, lost) in [("home", tok, false), ("lost", tok_lost, true)] {
        let mut env = TestEnv::new();
        env.vars.push(("CAIRN_REST_TOKEN".into(), tok));
        if lost {
            let proxied = proxied_rest_repo(&server.url, repo, LOST);
            backup_that_loses_the_server_fails_cleanly(&env, &proxied);
        } else {
            let proxied = proxied_rest_repo(&server.url, repo, drops(3));
            backup_completes_through_drops(&env, &proxied, 3);
        }
    }
}

/// `--listen unix:PATH` serves the same protocol on a unix socket (for a reverse proxy
/// on the same machine); a socket a running server answers on, or a file that is not a
/// socket, is refused rather than taken over, and a dead server's socket is replaced.
#[test]
fn serve_on_a_unix_socket_answers_with_tokens_and_never_takes_over_a_live_socket() {
    use std::os::unix::net::UnixStream;
    let (senv, dir) = server_dir();
    let tok = token(&senv, &dir, "proxy", "home", "append");
    let socket = senv.path("serve.sock");
    let listen = format!("unix:{}", socket.display());
    let mut server = Server::start_at(&senv, &dir, &listen, &[]);
    assert_eq!(server.url, listen, "the address printed is the socket");
    let request = |method: &str, path: &str, token: Option<&str>, body: &[u8]| {
        let stream = UnixStream::connect(&socket).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        raw_on(stream, "localhost", method, path, token, body, None)
    };
    let body = b"an object sent through the socket".to_vec();
    let hash = hash_hex(&body);
    let path = format!("/home/data/{}/{hash}", &hash[..2]);
    assert_eq!(request("GET", &path, None, b"").0, 401, "no token");
    assert_eq!(request("PUT", &path, Some(&tok), &body).0, 201);
    let (status, got) = request("GET", &path, Some(&tok), b"");
    assert_eq!((status, got.into_bytes()), (200, body.clone()));

    let serve_on = |listen: &str| {
        senv.bare_cmd()
            .args(["serve", "--dir"])
            .arg(&dir)
            .args(["--listen", listen])
            .output()
            .unwrap()
    };
    let out = serve_on(&listen);
    assert_exit(&out, 1, "a second server on a live socket");
    assert!(
        stderr(&out).contains("server that is running"),
        "{}",
        stderr(&out)
    );
    server.kill();
    assert!(socket.exists(), "a killed server leaves its socket file");
    let _server = Server::start_at(&senv, &dir, &listen, &[]);
    assert_eq!(
        request("GET", &path, Some(&tok), b"").0,
        200,
        "a restarted server replaced the dead socket"
    );
    let plain = senv.path("not-a-socket");
    std::fs::write(&plain, "keep me").unwrap();
    let out = serve_on(&format!("unix:{}", plain.display()));
    assert_exit(&out, 1, "a path that is a regular file");
    assert!(stderr(&out).contains("not a socket"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&plain).unwrap(), "keep me");
}

/// The setup the issue asks for: a machine holds a write-only key and an append token.
/// Whoever takes it can add backups but cannot read, list the contents of, alter or
/// remove anything; the owner, with a full key and a maintain token elsewhere, restores
/// every snapshot exactly.
#[test]
fn serve_a_thief_with_a_write_only_key_and_an_append_token_cannot_read_or_remove() {
    let (senv, dir) = server_dir();
    let laptop = token(&senv, &dir, "laptop", "home", "append");
    let owner_token = token(&senv, &dir, "owner", "home", "maintain");
    let server = Server::start(&senv, &dir, &[]);
    let owner = client(&server, "home", &owner_token);
    owner.init(&SMALL_CHUNKS);
    crate::write_only::add_write_only_key(&owner, "laptop password");

    let mut thief = client(&server, "home", &laptop);
    thief
        .vars
        .push(("CAIRN_PASSWORD".into(), "laptop password".into()));
    let src = thief.path("src");
    write_random_files(&src, 4, 200_000, 9);
    let first = thief.backup_id(&[&src], &[]);
    let first_copy = thief.path("first");
    copy_tree(&src, &first_copy);
    write_random_files(&src.join("more"), 2, 100_000, 10);
    let second = thief.backup_id(&[&src], &[]);

    let before = files_below(&dir.join("home"));
    let target = thief.path("stolen");
    for args in [
        vec!["restore", "latest", "--target", target.to_str().unwrap()],
        vec!["ls", "latest"],
        vec!["snapshots"],
        vec!["forget", "--keep-last", "1", "--prune"],
    ] {
        let out = thief.cmd().args(&args).output().unwrap();
        assert_exit(&out, 1, &format!("the thief's {args:?}"));
        assert!(stderr(&out).contains("write-only key"), "{}", stderr(&out));
    }
    let pack = name_in(&before, "data/");
    let (status, _) = raw(
        &server.addr(),
        "DELETE",
        &format!("/home/{pack}"),
        Some(&laptop),
        b"",
        None,
    );
    assert_eq!(status, 403, "the append token deletes nothing");
    assert_eq!(files_below(&dir.join("home")), before, "nothing changed");
    assert!(!target.exists());

    assert_check_clean(&owner, &["--read-data"], "the owner's check");
    assert_snapshot_restores(&owner, &first, &src, &first_copy, Compare::CONTENTS);
    assert_snapshot_restores(&owner, &second, &src, &src, Compare::CONTENTS);
}

/// A server's token can come from the config file's entry (`rest-token-file`), so a
/// named repository needs nothing in the environment; `CAIRN_REST_TOKEN` still wins,
/// with a note, and a token file that cannot be read is an error naming it.
#[test]
fn serve_a_token_can_come_from_the_config_files_repository_entry() {
    let (senv, dir) = server_dir();
    let tok = token(&senv, &dir, "box", "home", "maintain");
    let server = Server::start(&senv, &dir, &[]);
    let env = TestEnv::new();
    let token_file = env.path("token");
    std::fs::write(&token_file, format!("{tok}\n")).unwrap();
    let address = format!("rest:{}/home", server.url);
    let out = env
        .bare_cmd()
        .args([
            "config",
            "repo",
            "add",
            "box",
            &address,
            "--rest-token-file",
        ])
        .arg(&token_file)
        .output()
        .unwrap();
    assert_success(&out, "config repo add --rest-token-file");
    let named = |args: &[&str]| {
        env.bare_cmd()
            .args(["-r", "@box"])
            .args(args)
            .output()
            .unwrap()
    };
    assert_success(&named(&["init"]), "init through the entry's token");
    let src = env.path("src");
    write_random_files(&src, 2, 50_000, 11);
    assert_success(
        &named(&["backup", src.to_str().unwrap()]),
        "backup through the entry's token",
    );
    let out = env
        .bare_cmd()
        .env("CAIRN_REST_TOKEN", &tok)
        .args(["-r", "@box", "snapshots"])
        .output()
        .unwrap();
    assert_success(&out, "snapshots with both");
    assert!(
        stderr(&out).contains("using CAIRN_REST_TOKEN"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_file(&token_file).unwrap();
    let out = named(&["snapshots"]);
    assert_exit(&out, 1, "a token file that is gone");
    assert!(
        stderr(&out).contains(token_file.to_str().unwrap()),
        "{}",
        stderr(&out)
    );
}

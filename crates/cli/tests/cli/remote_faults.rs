//! Bad input and bad networks against the real servers of `scripts/services.sh`: a
//! missing bucket, a key that may only read, a path the SFTP server cannot create, and a
//! TCP proxy that cuts connections in the middle of uploads. Each failure must be a clear
//! error naming the repository and what to check, and must leave nothing behind that a
//! later command trusts.

use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::remote::{remote_cmd, run, server_address, unique_address};

// ---------------------------------------------------------------------------------------
// A proxy that cuts connections
// ---------------------------------------------------------------------------------------

/// What the proxy does to the connections through it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rule {
    /// Cuts each of the first `count` connections that carry more than `after` bytes
    /// towards the server right after those bytes; then passes everything.
    CutFirst { count: u64, after: u64 },
    /// Passes `after` bytes towards the server (all connections together), then cuts
    /// every connection, and every new one at once.
    CutAllAfter { after: u64 },
}

/// A TCP proxy on a free loopback port in front of `upstream`, cutting connections by
/// its rule. Its threads live until the test process ends.
struct Proxy {
    port: u16,
    shared: Arc<Shared>,
}

struct Shared {
    upstream: SocketAddr,
    rule: Rule,
    /// Bytes passed towards the server, all connections together.
    bytes_up: AtomicU64,
    /// Cuts `Rule::CutFirst` has made so far.
    claimed: AtomicU64,
    /// Connections cut, by either rule.
    cut: AtomicU64,
    /// `Rule::CutAllAfter` has reached its limit.
    dead: AtomicBool,
}

impl Proxy {
    fn start(upstream: SocketAddr, rule: Rule) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream,
            rule,
            bytes_up: AtomicU64::new(0),
            claimed: AtomicU64::new(0),
            cut: AtomicU64::new(0),
            dead: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let s = Arc::clone(&s);
                std::thread::spawn(move || s.serve(client));
            }
        });
        Proxy { port, shared }
    }

    fn connections_cut(&self) -> u64 {
        self.shared.cut.load(Ordering::SeqCst)
    }
}

impl Shared {
    fn serve(self: Arc<Self>, client: TcpStream) {
        if self.dead.load(Ordering::SeqCst) {
            self.cut(&client, None);
            return;
        }
        let Ok(server) = TcpStream::connect(self.upstream) else {
            self.cut(&client, None);
            return;
        };
        let (client2, server2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        let me = Arc::clone(&self);
        let down = std::thread::spawn(move || me.pump_down(server2, client2));
        self.pump_up(client, server);
        let _ = down.join();
    }

    /// Client to server, where the rule applies.
    fn pump_up(&self, mut client: TcpStream, mut server: TcpStream) {
        let mut buf = vec![0u8; 64 * 1024];
        let mut sent = 0u64;
        loop {
            let n = match client.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let pass = self.allowance(sent, n as u64) as usize;
            if pass > 0 && server.write_all(&buf[..pass]).is_err() {
                break;
            }
            sent += pass as u64;
            if pass < n {
                self.cut(&client, Some(&server));
                return;
            }
        }
        let _ = server.shutdown(Shutdown::Write);
    }

    /// Server to client; once the proxy is dead, answers are cut too.
    fn pump_down(&self, mut server: TcpStream, mut client: TcpStream) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if self.dead.load(Ordering::SeqCst) {
                self.cut(&client, Some(&server));
                return;
            }
            if client.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = client.shutdown(Shutdown::Both);
    }

    /// How many of the next `n` bytes of a connection that has passed `sent` may pass;
    /// fewer than `n` means: cut the connection after them.
    fn allowance(&self, sent: u64, n: u64) -> u64 {
        if self.dead.load(Ordering::SeqCst) {
            return 0;
        }
        match self.rule {
            Rule::CutFirst { count, after } => {
                let claim = || {
                    self.claimed
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                            (c < count).then_some(c + 1)
                        })
                        .is_ok()
                };
                if sent + n > after && claim() {
                    after.saturating_sub(sent).min(n)
                } else {
                    n
                }
            }
            Rule::CutAllAfter { after } => {
                let before = self.bytes_up.fetch_add(n, Ordering::SeqCst);
                if before + n > after {
                    self.dead.store(true, Ordering::SeqCst);
                    after.saturating_sub(before).min(n)
                } else {
                    n
                }
            }
        }
    }

    fn cut(&self, client: &TcpStream, server: Option<&TcpStream>) {
        self.cut.fetch_add(1, Ordering::SeqCst);
        let _ = client.shutdown(Shutdown::Both);
        if let Some(server) = server {
            let _ = server.shutdown(Shutdown::Both);
        }
    }
}

/// Splits `s3:http://HOST:PORT/BUCKET` into the server's address and the bucket.
fn s3_server(base: &str) -> (SocketAddr, String) {
    let rest = base
        .strip_prefix("s3:http://")
        .unwrap_or_else(|| panic!("{base} is an s3:http:// address"));
    let (host, bucket) = rest.split_once('/').unwrap();
    (host.parse().unwrap(), bucket.trim_matches('/').to_string())
}

/// One repository reached two ways: `direct`ly and `via` the proxy (with `via_env` set).
pub(crate) struct ProxiedRepo {
    direct: String,
    via: String,
    via_env: Vec<(String, String)>,
    proxy: Proxy,
}

impl ProxiedRepo {
    /// `cairn -r VIA ...`: through the proxy.
    fn via_cmd(&self, env: &TestEnv) -> assert_cmd::Command {
        let mut cmd = remote_cmd(env, &self.via);
        cmd.envs(self.via_env.iter().cloned());
        cmd
    }
}

fn proxied_s3_repo(what: &str, rule: Rule) -> Option<ProxiedRepo> {
    let direct = unique_address("CAIRN_TEST_S3", what)?;
    let base = server_address("CAIRN_TEST_S3")?;
    let (server, bucket) = s3_server(&base);
    let proxy = Proxy::start(server, rule);
    let path = direct.strip_prefix(&base).unwrap();
    let via = format!("s3:http://127.0.0.1:{}/{bucket}{path}", proxy.port);
    Some(ProxiedRepo {
        direct,
        via,
        via_env: Vec::new(),
        proxy,
    })
}

/// The SFTP repository through a proxy: an ssh client config like the test server's,
/// with its own host alias and port, and a known_hosts entry for the proxy's port.
fn proxied_sftp_repo(env: &TestEnv, what: &str, rule: Rule) -> Option<ProxiedRepo> {
    let direct = unique_address("CAIRN_TEST_SFTP", what)?;
    let bin = PathBuf::from(server_address("CAIRN_TEST_SSH_BIN")?);
    let ssh_dir = bin.parent().unwrap();
    let config = fs::read_to_string(ssh_dir.join("home/.ssh/config")).unwrap();
    let port: u16 = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("Port "))
        .expect("the test server's ssh config has a Port")
        .parse()
        .unwrap();
    let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], port)), rule);

    let dir = env.path("proxy-ssh");
    let host_key = fs::read_to_string(ssh_dir.join("hostkey.pub")).unwrap();
    let host_key: Vec<&str> = host_key.split_whitespace().take(2).collect();
    let known_hosts = dir.join("known_hosts");
    write_file(
        &known_hosts,
        format!("[127.0.0.1]:{} {}\n", proxy.port, host_key.join(" ")).as_bytes(),
    );
    let config: String = config
        .lines()
        .map(|line| match line.trim().split_once(' ') {
            Some(("Host", _)) => "Host cairn-test-proxy".to_string(),
            Some(("Port", _)) => format!("  Port {}", proxy.port),
            Some(("UserKnownHostsFile", _)) => {
                format!("  UserKnownHostsFile {}", known_hosts.display())
            }
            _ => line.to_string(),
        })
        .map(|line| line + "\n")
        .collect();
    let config_file = dir.join("config");
    write_file(&config_file, config.as_bytes());
    // The real ssh, as the test server's wrapper calls it.
    let wrapper = fs::read_to_string(bin.join("ssh")).unwrap();
    let real_ssh = wrapper
        .split_whitespace()
        .skip_while(|w| *w != "exec")
        .nth(1)
        .expect("the ssh wrapper execs the real ssh");
    write_file(
        &dir.join("bin/ssh"),
        format!(
            "#!/bin/sh\nexec {real_ssh} -F {} \"$@\"\n",
            config_file.display()
        )
        .as_bytes(),
    );
    set_mode(&dir.join("bin/ssh"), 0o755);

    let via = direct.replacen("sftp:cairn-test-sftp:", "sftp:cairn-test-proxy:", 1);
    assert_ne!(via, direct, "CAIRN_TEST_SFTP is sftp:cairn-test-sftp:PATH");
    let path = std::env::var("PATH").unwrap_or_default();
    let via_env = vec![(
        "PATH".to_string(),
        format!("{}:{path}", dir.join("bin").display()),
    )];
    Some(ProxiedRepo {
        direct,
        via,
        via_env,
        proxy,
    })
}

fn init_args() -> Vec<&'static str> {
    let mut args = vec!["init", "--pack-size", "1M"];
    args.extend(SMALL_CHUNKS);
    args
}

/// `count` files of `size` random bytes below `dir`.
fn random_tree(dir: &Path, count: u64, size: usize, seed: u64) {
    for i in 0..count {
        write_file(
            &dir.join(format!("part-{i}.bin")),
            &random_bytes(size, seed + i),
        );
    }
}

/// `check --json EXTRA` on `address` must exit 0 with no problems; returns the report.
fn assert_remote_check_clean(env: &TestEnv, address: &str, extra: &[&str]) -> serde_json::Value {
    let out = remote_cmd(env, address)
        .args(["check", "--json"])
        .args(extra)
        .output()
        .unwrap();
    assert_success(&out, &format!("check {extra:?}"));
    let report = parse_json(&out.stdout, "check --json");
    assert_eq!(report["problems"], serde_json::json!([]), "{report:#}");
    report
}

fn restore_and_compare(env: &TestEnv, address: &str, src: &Path, target: &str) {
    let target = env.path(target);
    run(
        env,
        address,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    assert_trees_equal(src, &restored_path(&target, src), Compare::ALL);
}

// ---------------------------------------------------------------------------------------
// The connection drops mid-upload
// ---------------------------------------------------------------------------------------

/// Repository `repo` of the `cairn serve` at `server` (`http://127.0.0.1:PORT`), direct
/// and through a proxy. The token goes in the test environment's variables, for both.
pub(crate) fn proxied_rest_repo(server: &str, repo: &str, rule: Rule) -> ProxiedRepo {
    let upstream: SocketAddr = server
        .strip_prefix("http://")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("{server} is http://IP:PORT"));
    let proxy = Proxy::start(upstream, rule);
    ProxiedRepo {
        direct: format!("rest:{server}/{repo}"),
        via: format!("rest:http://127.0.0.1:{}/{repo}", proxy.port),
        via_env: Vec::new(),
        proxy,
    }
}

/// Cuts `cuts` connections in the middle of requests, then behaves.
pub(crate) fn drops(cuts: u64) -> Rule {
    Rule::CutFirst {
        count: cuts,
        after: 300_000,
    }
}

/// Passes the first 3 MB towards the server, then nothing.
pub(crate) const LOST: Rule = Rule::CutAllAfter { after: 3_000_000 };

/// A backup through connections that drop completes through the retries.
pub(crate) fn backup_completes_through_drops(env: &TestEnv, repo: &ProxiedRepo, cuts: u64) {
    let src = env.path("src");
    random_tree(&src, 4, 2_000_000, 10);
    run(env, &repo.direct, &init_args());

    let out = repo
        .via_cmd(env)
        .args(["backup", "--json"])
        .arg(&src)
        .output()
        .unwrap();
    assert_success(
        &out,
        &format!("backup through a proxy that drops {cuts} connections"),
    );
    assert_eq!(
        repo.proxy.connections_cut(),
        cuts,
        "the proxy cut {cuts} connections in the middle of requests"
    );
    assert_remote_check_clean(env, &repo.direct, &["--read-data"]);
    restore_and_compare(env, &repo.direct, &src, "restore");
}

/// A backup whose server stops answering half-way fails quickly and clearly; the
/// repository, seen directly, holds nothing that a later backup or restore trusts.
pub(crate) fn backup_that_loses_the_server_fails_cleanly(env: &TestEnv, repo: &ProxiedRepo) {
    let first = env.path("first");
    random_tree(&first, 1, 500_000, 20);
    run(env, &repo.direct, &init_args());
    run(env, &repo.direct, &["backup", first.to_str().unwrap()]);

    let src = env.path("src");
    random_tree(&src, 6, 2_000_000, 30);
    let started = Instant::now();
    let out = repo
        .via_cmd(env)
        .env("CAIRN_RETRIES", "2")
        .args(["backup"])
        .arg(&src)
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_exit(
        &out,
        1,
        "backup through a proxy that stops passing anything",
    );
    assert!(
        repo.proxy.connections_cut() > 0,
        "the proxy cut connections"
    );
    let err = stderr(&out);
    assert!(
        err.contains(&repo.via) && err.contains("check the address, the network"),
        "the error names the repository and what to check:\n{err}"
    );
    assert!(
        took < Duration::from_secs(60),
        "with CAIRN_RETRIES=2 the backup gives up quickly, not after {took:?}"
    );

    // Talking to the server directly: the failed backup left no snapshot, and the packs
    // it stored are in no index, so nothing relies on them.
    let out = run(env, &repo.direct, &["snapshots", "--json"]);
    let snapshots = parse_json(&out.stdout, "snapshots --json");
    assert_eq!(
        snapshots["snapshots"].as_array().map(Vec::len),
        Some(1),
        "only the first backup's snapshot: {snapshots:#}"
    );
    let report = assert_remote_check_clean(env, &repo.direct, &[]);
    assert!(
        report.to_string().contains("in no index file"),
        "check notes the failed backup's packs: {report:#}"
    );

    run(env, &repo.direct, &["backup", src.to_str().unwrap()]);
    assert_remote_check_clean(env, &repo.direct, &["--read-data"]);
    restore_and_compare(env, &repo.direct, &src, "restore");
}

#[test]
fn remote_s3_backup_completes_through_dropped_connections() {
    if let Some(repo) = proxied_s3_repo("drops", drops(3)) {
        backup_completes_through_drops(&TestEnv::new(), &repo, 3);
    }
}

#[test]
fn remote_s3_backup_that_loses_the_server_fails_cleanly() {
    if let Some(repo) = proxied_s3_repo("lost", LOST) {
        backup_that_loses_the_server_fails_cleanly(&TestEnv::new(), &repo);
    }
}

#[test]
fn remote_sftp_backup_completes_through_dropped_connections() {
    let env = TestEnv::new();
    if let Some(repo) = proxied_sftp_repo(&env, "drops", drops(1)) {
        backup_completes_through_drops(&env, &repo, 1);
    }
}

#[test]
fn remote_sftp_backup_that_loses_the_server_fails_cleanly() {
    let env = TestEnv::new();
    if let Some(repo) = proxied_sftp_repo(&env, "lost", LOST) {
        backup_that_loses_the_server_fails_cleanly(&env, &repo);
    }
}

// ---------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------

#[test]
fn remote_a_missing_s3_bucket_is_a_clear_error() {
    let Some(base) = server_address("CAIRN_TEST_S3") else {
        return;
    };
    let (server, _) = s3_server(&base);
    let address = format!("s3:http://{server}/cairn-no-such-bucket/repo");
    let env = TestEnv::new();
    let src = env.path("src");
    random_tree(&src, 1, 1000, 40);
    for args in [
        vec!["init"],
        vec!["snapshots"],
        vec!["backup", src.to_str().unwrap()],
    ] {
        let out = remote_cmd(&env, &address).args(&args).output().unwrap();
        assert_exit(&out, 1, &format!("{args:?} on a missing bucket"));
        let err = stderr(&out);
        assert!(
            err.contains(&address) && err.contains("bucket does not exist"),
            "{args:?}: the error names the repository and the missing bucket:\n{err}"
        );
    }
}

#[test]
fn remote_a_read_only_s3_key_restores_but_cannot_back_up() {
    let Some(address) = unique_address("CAIRN_TEST_S3", "readonly") else {
        return;
    };
    let (Some(id), Some(secret)) = (
        server_address("CAIRN_TEST_S3_READONLY_KEY_ID"),
        server_address("CAIRN_TEST_S3_READONLY_SECRET"),
    ) else {
        return;
    };
    let env = TestEnv::new();
    let src = build_rich_tree(&env.path("src"));
    run(&env, &address, &init_args());
    run(&env, &address, &["backup", src.to_str().unwrap()]);
    let read_only = |args: &[&str]| {
        remote_cmd(&env, &address)
            .env("AWS_ACCESS_KEY_ID", &id)
            .env("AWS_SECRET_ACCESS_KEY", &secret)
            .args(args)
            .output()
            .unwrap()
    };

    let more = env.path("more");
    random_tree(&more, 2, 1_500_000, 50);
    let out = read_only(&["backup", more.to_str().unwrap()]);
    assert_exit(&out, 1, "backup with a read-only key");
    let err = stderr(&out);
    assert!(
        err.contains(&address) && err.contains("permission denied") && err.contains("credentials"),
        "the error names the repository and says to check the key's rights:\n{err}"
    );

    let out = read_only(&["snapshots", "--json"]);
    assert_success(&out, "snapshots with a read-only key");
    let snapshots = parse_json(&out.stdout, "snapshots --json");
    assert_eq!(
        snapshots["snapshots"].as_array().map(Vec::len),
        Some(1),
        "{snapshots:#}"
    );
    let target = env.path("restore");
    let out = read_only(&["restore", "latest", "--target", target.to_str().unwrap()]);
    assert_success(&out, "restore with a read-only key");
    assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);
    assert_remote_check_clean(&env, &address, &[]);
}

#[test]
fn remote_an_sftp_path_the_server_cannot_create_is_a_clear_error() {
    let Some(base) = server_address("CAIRN_TEST_SFTP") else {
        return;
    };
    // sftp:HOST:PATH; the server cannot make directories in /proc, even as root.
    let host = base.rsplit_once(':').unwrap().0;
    let address = format!("{host}:/proc/cairn-test-repo");
    let env = TestEnv::new();
    let out = remote_cmd(&env, &address).arg("init").output().unwrap();
    assert_exit(
        &out,
        1,
        "init where the server cannot create the repository",
    );
    let err = stderr(&out);
    assert!(
        err.contains(&address) && err.contains("could not be created"),
        "the error names the repository and says it could not be created:\n{err}"
    );
    assert!(
        !err.contains("not found in"),
        "not a missing object:\n{err}"
    );
}

//! Jobs in the config file, `cairn run`, `cairn daemon`, hooks and notifications, with
//! real processes, real signals and a real HTTP listener on loopback.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

/// One request the listener received.
#[derive(Debug, Clone)]
struct Request {
    path: String,
    body: String,
}

/// An HTTP server on loopback that answers 200 to everything and keeps what it got.
struct Listener {
    url: String,
    got: Arc<Mutex<Vec<Request>>>,
}

impl Listener {
    fn start() -> Listener {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let got = Arc::new(Mutex::new(Vec::new()));
        let kept = got.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let mut reader = BufReader::new(conn);
                let mut first = String::new();
                if reader.read_line(&mut first).is_err() {
                    continue;
                }
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':') {
                        if k.eq_ignore_ascii_case("content-length") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                let path = first.split_whitespace().nth(1).unwrap_or("").to_string();
                kept.lock().unwrap().push(Request {
                    path,
                    body: String::from_utf8_lossy(&body).into_owned(),
                });
                let mut conn = reader.into_inner();
                let _ = conn.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
        });
        Listener { url, got }
    }

    fn requests(&self) -> Vec<Request> {
        self.got.lock().unwrap().clone()
    }

    fn paths(&self) -> Vec<String> {
        self.requests().into_iter().map(|r| r.path).collect()
    }
}

/// Waits until `cond` holds, for at most `secs`.
fn wait_for(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An environment with two initialised repositories named `a` and `b` in the config
/// file, and a source tree; the config file gets `jobs` appended.
fn jobs_env(jobs: &str) -> TestEnv {
    let env = TestEnv::new();
    for name in ["a", "b"] {
        let out = env
            .bare_cmd()
            .arg("-r")
            .arg(env.path(name))
            .arg("init")
            .output()
            .unwrap();
        assert_success(&out, "cairn init");
    }
    write_random_files(&env.path("src"), 5, 20_000, 7);
    write_config(&env, jobs);
    env
}

fn write_config(env: &TestEnv, jobs: &str) {
    let text = format!(
        "[repos.a]\naddress = \"{}\"\n\n[repos.b]\naddress = \"{}\"\n\n{jobs}",
        env.path("a").display(),
        env.path("b").display()
    );
    let dir = env.path("config/cairn");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.toml"), text).unwrap();
}

fn snapshots_of(env: &TestEnv, repo: &str) -> Vec<Value> {
    let out = env
        .bare_cmd()
        .args(["-r", repo, "snapshots", "--json"])
        .output()
        .unwrap();
    assert_success(&out, "cairn snapshots");
    parse_json(&out.stdout, "snapshots --json")["snapshots"]
        .as_array()
        .unwrap()
        .clone()
}

fn run_json(env: &TestEnv, args: &[&str]) -> (i32, Value) {
    let out = env
        .bare_cmd()
        .args(["run", "--json"])
        .args(args)
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    assert!(code == 0 || code == 1, "cairn run: {}", describe(&out));
    (code, parse_json(&out.stdout, "run --json")["runs"].clone())
}

/// A running `cairn daemon --log-format json` whose log is read as it is written, so a
/// test waits for the event it needs (the signal handlers installed, a reload done, a run
/// finished) instead of sleeping and hoping the daemon got there on a loaded machine.
/// A test that fails before [`Daemon::stop`] kills it, so that no daemon outlives its test.
struct Daemon {
    child: Option<Child>,
    log: Arc<Mutex<Vec<Value>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    fn start(env: &TestEnv, args: &[&str]) -> Daemon {
        let mut child = spawnable_bare(env)
            .args(["daemon", "--log-format", "json"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in stdout.lines().map_while(Result::ok) {
                    let event = serde_json::from_str(&line)
                        .unwrap_or_else(|e| panic!("{line:?} is JSON: {e}"));
                    log.lock().unwrap().push(event);
                }
            })
        };
        Daemon {
            child: Some(child),
            log,
            reader: Some(reader),
        }
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("the daemon runs")
    }

    fn signal(&self, signal: i32) {
        let pid = self.child.as_ref().expect("the daemon runs").id();
        // SAFETY: kill on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
    }

    fn events(&self, event: &str) -> Vec<Value> {
        events(&self.log.lock().unwrap(), event)
    }

    /// Waits until the log holds `n` events `event`, for at most `secs`; returns them.
    fn wait_for_events(&self, secs: u64, n: usize, event: &str) -> Vec<Value> {
        wait_for(
            secs,
            &format!("{n} {event} event(s) in the daemon's log"),
            || self.events(event).len() >= n,
        );
        self.events(event)
    }

    /// Stops the daemon while a run is in flight: it ends cleanly within seconds, the
    /// run counted as interrupted.
    fn stop_a_run(self) {
        let stopped = Instant::now();
        let (code, log, err) = self.stop();
        assert_eq!(code, 0, "{err}");
        assert!(
            stopped.elapsed() < Duration::from_secs(15),
            "stopped in {:?}",
            stopped.elapsed()
        );
        let finished = events(&log, "job_finished");
        assert_eq!(finished[0]["status"], "interrupted", "{log:?}");
    }

    /// Sends SIGTERM and returns the exit code, the whole log and standard error.
    fn stop(mut self) -> (i32, Vec<Value>, String) {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child().try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "the daemon did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = self.child.take().unwrap().wait_with_output().unwrap();
        if let Some(reader) = self.reader.take() {
            reader.join().expect("the daemon's log is JSON lines");
        }
        let log = std::mem::take(&mut *self.log.lock().unwrap());
        (
            out.status.code().unwrap_or(-1),
            log,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn events(log: &[Value], event: &str) -> Vec<Value> {
    log.iter()
        .filter(|e| e["event"] == event)
        .cloned()
        .collect()
}

#[test]
fn config_check_names_the_file_line_and_key_of_an_error() {
    let env = jobs_env("[jobs.home]\npaths = [\"/tmp\"]\nrepos = [\"@a\"]\nschedule = \"dayly\"\n");
    let out = env.bare_cmd().args(["config", "check"]).output().unwrap();
    assert_exit(&out, 1, "config check of a bad schedule");
    let err = stderr(&out);
    assert!(
        err.contains("config.toml, line 10, key `jobs.home.schedule`") && err.contains("dayly"),
        "{err}"
    );
    // An unknown key, a repository the file does not name.
    write_config(
        &env,
        "[jobs.home]\npaths = [\"/tmp\"]\nrepos = [\"@a\"]\nexclude-caches = true\nexlude = []\n",
    );
    let err = stderr(&env.bare_cmd().args(["config", "check"]).output().unwrap());
    assert!(err.contains("line 11") && err.contains("exlude"), "{err}");
    write_config(
        &env,
        "[jobs.home]\npaths = [\"/tmp\"]\nrepos = [\"@a\", \"@c\"]\n",
    );
    let err = stderr(&env.bare_cmd().args(["config", "check"]).output().unwrap());
    assert!(
        err.contains("line 9") && err.contains("\"c\"") && err.contains("known: a, b"),
        "{err}"
    );

    write_config(
        &env,
        "[jobs.home]\npaths = [\"/tmp\"]\nrepos = [\"@a\"]\nschedule = \"daily 02:30\"\n",
    );
    let out = env.bare_cmd().args(["config", "check"]).output().unwrap();
    assert_success(&out, "config check");
    assert!(
        stdout(&out).contains("is valid: 2 repositories, 1 job"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_job_to_two_repositories_reads_the_sources_once_and_both_restore_exactly() {
    let env =
        jobs_env("[jobs.home]\npaths = [\"SRC\"]\nrepos = [\"@a\", \"@b\"]\nkeep = { last = 1 }\n");
    let src = env.path("src");
    write_config(
        &env,
        &format!(
            "[jobs.home]\npaths = [\"{}\"]\nrepos = [\"@a\", \"@b\"]\nkeep = {{ last = 1 }}\n",
            src.display()
        ),
    );
    let total: u64 = 5 * 20_000;
    for round in 0..2 {
        let (code, reports) = run_json(&env, &["home"]);
        assert_eq!(code, 0, "{reports:#}");
        let r = &reports[0];
        assert_eq!(r["status"], "success");
        // Each file read once (all in the first round, the new one in the second): the
        // second repository got them by copy from the first.
        let later = b"a file of the second run";
        let expected_read = if round == 0 {
            total
        } else {
            later.len() as u64
        };
        assert_eq!(json_u64(r, "bytes_read"), expected_read, "{r:#}");
        let repos = r["repositories"].as_array().unwrap();
        assert_eq!(repos[0]["method"], "backup");
        assert_eq!(repos[1]["method"], "copy");
        assert!(repos.iter().all(|x| x["status"] == "success"), "{r:#}");
        if round == 0 {
            write_file(&src.join("later"), later);
        }
    }
    for repo in ["@a", "@b"] {
        // keep = { last = 1 } forgot the first run's snapshot in both.
        assert_eq!(snapshots_of(&env, repo).len(), 1, "{repo}");
        let target = env.path(&format!("restored-{}", &repo[1..]));
        let out = env
            .bare_cmd()
            .args(["-r", repo, "restore", "latest", "--target"])
            .arg(&target)
            .output()
            .unwrap();
        assert_success(&out, "restore");
        assert_trees_equal(&src, &restored_path(&target, &src), Compare::ALL);
    }
}

/// `commands = { NAME = COMMAND }`: each command's output is a file of the snapshot, in
/// both repositories; a failing command fails the job and writes no snapshot.
#[test]
fn a_jobs_commands_store_their_output_and_a_failing_one_fails_the_job() {
    let env = jobs_env("");
    let src = env.path("src");
    let job = |command: &str| {
        format!(
            "[jobs.db]\npaths = [\"{}\"]\nrepos = [\"@a\", \"@b\"]\ncommands = {{ \"db.sql\" = \"{command}\" }}\n",
            src.display()
        )
    };
    write_config(&env, &job("echo dump of the database; echo second line"));
    let (code, reports) = run_json(&env, &["db"]);
    assert_eq!(code, 0, "{reports:#}");
    for repo in ["@a", "@b"] {
        let out = env
            .bare_cmd()
            .args(["-r", repo, "dump", "latest", "/db.sql"])
            .output()
            .unwrap();
        assert_success(&out, "dump the command's output");
        assert_eq!(
            stdout(&out),
            "dump of the database\nsecond line\n",
            "{repo}"
        );
    }
    write_config(&env, &job("echo partial; exit 3"));
    let (code, reports) = run_json(&env, &["db"]);
    assert_eq!(code, 1, "{reports:#}");
    assert_eq!(reports[0]["status"], "failure", "{reports:#}");
    assert_eq!(
        snapshots_of(&env, "@a").len(),
        1,
        "no snapshot of the failed run"
    );
}

/// `limits = { upload = ... }` holds the job's uploads to that rate: 500 KB of random
/// data at 100 KiB/s cannot take less than about 5 s (a lower bound the limiter enforces
/// by waiting, so a slow machine cannot make this fail).
#[test]
fn a_jobs_upload_limit_holds_its_backup_to_the_rate() {
    let env = jobs_env("");
    let src = env.path("src");
    write_random_files(&src.join("big"), 1, 400_000, 8);
    write_config(
        &env,
        &format!(
            "[jobs.slow]\npaths = [\"{}\"]\nrepos = [\"@a\"]\nlimits = {{ upload = \"100K\" }}\n",
            src.display()
        ),
    );
    let started = std::time::Instant::now();
    let (code, reports) = run_json(&env, &["slow"]);
    let took = started.elapsed();
    assert_eq!(code, 0, "{reports:#}");
    assert!(
        took >= std::time::Duration::from_secs(4),
        "500 KB at 100 KiB/s took only {took:?}"
    );
}

#[test]
fn one_failing_repository_does_not_stop_the_others() {
    let env = jobs_env("");
    let src = env.path("src");
    write_config(
        &env,
        &format!(
            "[repos.gone]\naddress = \"{}\"\n\n[jobs.home]\npaths = [\"{}\"]\nrepos = [\"@gone\", \"@b\"]\n",
            env.path("nowhere").display(),
            src.display()
        ),
    );
    let (code, reports) = run_json(&env, &["home"]);
    assert_eq!(code, 1);
    let repos = reports[0]["repositories"].as_array().unwrap();
    assert_eq!(repos[0]["status"], "failure");
    // The backup went to the next repository instead.
    assert_eq!(
        (repos[1]["status"].as_str(), repos[1]["method"].as_str()),
        (Some("success"), Some("backup"))
    );
    assert_eq!(snapshots_of(&env, "@b").len(), 1);
}

#[test]
fn a_failing_before_hook_fails_the_job_notifies_and_makes_no_snapshot() {
    let http = Listener::start();
    let env = jobs_env("");
    write_config(
        &env,
        &format!(
            "[jobs.home]\npaths = [\"{src}\"]\nrepos = [\"@a\"]\nbefore = \"echo dumping; exit 3\"\n\
             after = \"echo $CAIRN_STATUS > {after}\"\n\
             notify = [\"healthchecks:{url}/ping/abc\", \"webhook:{url}/hook\",\n\
             {{ webhook = \"{url}/ntfy\", body = \"cairn {{job}} on {{host}}: {{status}}\" }},\n\
             {{ webhook = \"{url}/gotify\", content-type = \"application/json\", \
             body = '{{\"title\": \"cairn {{job}}\", \"message\": \"{{error}}\"}}' }}]\n",
            url = http.url,
            src = env.path("src").display(),
            after = env.path("after-ran").display(),
        ),
    );
    let (code, reports) = run_json(&env, &[]);
    assert_eq!(code, 1);
    assert_eq!(reports[0]["status"], "failure");
    assert!(snapshots_of(&env, "@a").is_empty());
    // `after` runs whatever happened.
    assert_eq!(
        std::fs::read_to_string(env.path("after-ran")).unwrap(),
        "failure\n"
    );
    let got = http.requests();
    let paths: Vec<_> = got.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/ping/abc/start",
            "/ping/abc/fail",
            "/hook",
            "/ntfy",
            "/gotify"
        ]
    );
    // The failure ping carries the log's tail, with the hook's own output.
    assert!(
        got[1].body.contains("dumping") && got[1].body.contains("before hook failed"),
        "{}",
        got[1].body
    );
    let hook: Value = serde_json::from_str(&got[2].body).unwrap();
    assert_eq!(hook["status"], "failure");
    assert_eq!(hook["job"], "home");
    assert!(
        hook["error"]
            .as_str()
            .unwrap()
            .contains("before hook failed"),
        "{hook}"
    );
}

/// Writes the job `home` (with `extra` lines) whose `before` hook starts a two-minute
/// sleep, writes its pid and waits for it, and whose `after` hook writes the run's status
/// to `after-ran`; returns the pid file's path.
fn sleeping_hook_job(env: &TestEnv, extra: &str) -> std::path::PathBuf {
    let pidfile = env.path("sleeper.pid");
    write_config(
        env,
        &format!(
            "[jobs.home]\npaths = [\"{src}\"]\nrepos = [\"@a\"]\n{extra}\n\
             before = \"sleep 120 & echo $! > {pid}; wait\"\n\
             after = \"echo $CAIRN_STATUS > {after}\"\n",
            src = env.path("src").display(),
            pid = pidfile.display(),
            after = env.path("after-ran").display(),
        ),
    );
    pidfile
}

/// After [`sleeping_hook_job`]'s `before` hook was stopped: no snapshot, `after` ran in
/// full and saw `status`, and the sleep the hook's shell started ended with it (or is a
/// zombie), not left running.
fn assert_hook_stopped(env: &TestEnv, pidfile: &std::path::Path, status: &str) {
    assert!(snapshots_of(env, "@a").is_empty());
    assert_eq!(
        std::fs::read_to_string(env.path("after-ran")).unwrap(),
        format!("{status}\n")
    );
    let pid = std::fs::read_to_string(pidfile).unwrap();
    let stat = format!("/proc/{}/stat", pid.trim());
    wait_for(10, "the hook's sleep to end", || {
        std::fs::read_to_string(&stat).map_or(true, |s| s.contains(") Z"))
    });
}

#[test]
fn a_hook_past_its_timeout_is_stopped_with_its_children_and_fails_the_job() {
    let env = jobs_env("");
    let pidfile = sleeping_hook_job(&env, "hook-timeout = \"3s\"");
    let started = Instant::now();
    let (code, reports) = run_json(&env, &[]);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(code, 1);
    assert_eq!(reports[0]["status"], "failure");
    let error = reports[0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("before hook did not finish within 3 s (hook-timeout)"),
        "{reports:#}"
    );
    assert_hook_stopped(&env, &pidfile, "failure");
}

/// In the foreground of a terminal, a hook stays in cairn's process group and can prompt
/// there: in a group of its own, its read of the terminal would stop it (SIGTTIN) until
/// its timeout.
#[test]
fn a_hook_can_read_the_terminal_cairn_runs_in() {
    let env = jobs_env("");
    let got = env.path("got");
    write_config(
        &env,
        &format!(
            "[jobs.home]\npaths = [\"{}\"]\nrepos = [\"@a\"]\nhook-timeout = \"30s\"\n\
             before = \"read x < /dev/tty; echo got $x > {}\"\n",
            env.path("src").display(),
            got.display()
        ),
    );
    // `script` (util-linux) runs cairn on a pseudo-terminal of its own and types what
    // it reads from its standard input there.
    let line = format!("{} run home", cairn_bin().display());
    let mut script = spawnable_program(&env, "script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = script.stdin.take().unwrap();
    stdin.write_all(b"hello\n").unwrap();
    wait_for(60, "the hook to read the terminal", || got.exists());
    drop(stdin);
    let out = script.wait_with_output().unwrap();
    assert_eq!(std::fs::read_to_string(&got).unwrap(), "got hello\n");
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(snapshots_of(&env, "@a").len(), 1);
}

/// A hook runs in a process group of its own (so that a timeout can stop what it
/// started), out of reach of the signal that stops the daemon: the daemon passes it on.
#[test]
fn sigterm_stops_a_hook_in_flight_and_the_after_hook_still_runs() {
    let env = jobs_env("");
    let pidfile = sleeping_hook_job(&env, "schedule = \"every 1s\"");
    let daemon = Daemon::start(&env, &[]);
    wait_for(60, "the before hook to start", || {
        std::fs::read_to_string(&pidfile).is_ok_and(|p| p.ends_with('\n'))
    });
    daemon.stop_a_run();
    assert_hook_stopped(&env, &pidfile, "interrupted");
}

#[test]
fn a_notification_that_cannot_be_sent_does_not_fail_the_job() {
    let env = jobs_env("");
    // Port 0, where nothing can listen: a port freed by a listener of this test could be
    // taken meanwhile by another test's listener, which would answer.
    write_config(
        &env,
        &format!(
            "[jobs.home]\npaths = [\"{}\"]\nrepos = [\"@a\"]\nnotify = [\"webhook:http://127.0.0.1:0/x\"]\n",
            env.path("src").display()
        ),
    );
    let out = env.bare_cmd().args(["run", "home"]).output().unwrap();
    assert_success(&out, "cairn run with an unreachable webhook");
    assert!(stderr(&out).contains("Cannot notify"), "{}", stderr(&out));
    assert_eq!(snapshots_of(&env, "@a").len(), 1);
}

#[test]
fn a_daemon_runs_a_job_on_its_schedule_with_hooks_in_order_and_notifies() {
    let http = Listener::start();
    let env = jobs_env("");
    let trace = env.path("trace");
    let hook = |name: &str| {
        format!(
            "echo {name} $CAIRN_JOB $CAIRN_REPOSITORY ${{CAIRN_STATUS:-none}} ${{CAIRN_SNAPSHOT:-none}} $(test -f \\\"$CAIRN_LOG\\\" && echo log) >> {}",
            trace.display()
        )
    };
    write_config(
        &env,
        &format!(
            "[jobs.home]\npaths = [\"{}\"]\nrepos = [\"@a\"]\nschedule = \"every 2s\"\n\
             before = \"{}\"\non-success = \"{}\"\non-failure = \"{}\"\nafter = \"{}\"\n\
             notify = [\"healthchecks:{}/ping/abc\", \"webhook:{}/hook\"]\n",
            env.path("src").display(),
            hook("before"),
            hook("on-success"),
            hook("on-failure"),
            hook("after"),
            http.url,
            http.url
        ),
    );
    let started = Instant::now();
    let daemon = Daemon::start(&env, &[]);
    wait_for(60, "a run's after hook", || {
        std::fs::read_to_string(&trace).is_ok_and(|t| t.contains("after"))
    });
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "the first run waits for its slot"
    );
    // A second daemon for the same config refuses.
    let out = env.bare_cmd().arg("daemon").output().unwrap();
    assert_exit(&out, 1, "a second daemon");
    assert!(
        stderr(&out).contains("Another cairn daemon runs"),
        "{}",
        stderr(&out)
    );
    wait_for(60, "the webhook", || {
        http.paths().contains(&"/hook".to_string())
    });
    let (code, log, err) = daemon.stop();
    assert_eq!(code, 0, "{err}");
    assert!(!events(&log, "job_finished").is_empty(), "{log:?}");
    assert_eq!(events(&log, "stopped").len(), 1);

    let snapshot = snapshots_of(&env, "@a")[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let trace = std::fs::read_to_string(&trace).unwrap();
    let first: Vec<&str> = trace.lines().take(3).collect();
    assert_eq!(
        first,
        [
            "before home @a none none log".to_string(),
            format!("on-success home @a success {snapshot} log"),
            format!("after home @a success {snapshot} log"),
        ]
    );
    let got = http.requests();
    let paths: Vec<_> = got.iter().map(|r| r.path.as_str()).take(3).collect();
    assert_eq!(paths, ["/ping/abc/start", "/ping/abc", "/hook"]);
    let hook: Value = serde_json::from_str(&got[2].body).unwrap();
    assert_eq!(hook["status"], "success");
    assert_eq!(hook["snapshot_id"].as_str(), Some(snapshot.as_str()));
    assert_eq!(hook["repositories"][0]["repository"], "@a");
}

/// The job's state file, as `cairn run` left it.
fn state_file(env: &TestEnv) -> std::path::PathBuf {
    env.path("home/.local/state/cairn/jobs/home.json")
}

#[test]
fn a_run_missed_while_the_daemon_was_stopped_is_caught_up_at_startup() {
    let env = jobs_env("");
    write_config(
        &env,
        &format!(
            "[jobs.home]\npaths = [\"{}\"]\nrepos = [\"@a\"]\nschedule = \"every 1h\"\n",
            env.path("src").display()
        ),
    );
    let out = env.bare_cmd().args(["run", "home"]).output().unwrap();
    assert_success(&out, "cairn run");
    // The daemon was off for two hours after that run.
    let mut state: Value =
        serde_json::from_slice(&std::fs::read(state_file(&env)).unwrap()).unwrap();
    state["last_started_ms"] = (json_u64(&state, "last_started_ms") - 2 * 3_600_000).into();
    std::fs::write(state_file(&env), state.to_string()).unwrap();

    let daemon = Daemon::start(&env, &[]);
    // Scheduled at startup (now, the missed run), then after the run ends. A fixed pause
    // here let a loaded machine stop the daemon before its loop had seen the run's end,
    // and the last `scheduled` event was still the one for now.
    daemon.wait_for_events(60, 1, "job_finished");
    daemon.wait_for_events(60, 2, "scheduled");
    assert_eq!(snapshots_of(&env, "@a").len(), 2);
    let (code, log, err) = daemon.stop();
    assert_eq!(code, 0, "{err}");
    assert_eq!(events(&log, "missed").len(), 1, "{log:?}");
    // And the next one is an hour after it, not now again.
    let next = events(&log, "scheduled");
    let next = next.last().unwrap()["next"].as_str().unwrap();
    let next: jiff::Timestamp = next.parse().unwrap();
    assert!(
        next > jiff::Timestamp::now() + jiff::SignedDuration::from_mins(50),
        "{next}"
    );
}

#[test]
fn sigterm_stops_a_backup_in_flight_cleanly_and_the_next_run_completes() {
    let env = jobs_env("");
    let src = env.path("src");
    // Large enough to be read for many seconds; sparse, so it costs no disk.
    let big = std::fs::File::create(src.join("big")).unwrap();
    big.set_len(64 << 30).unwrap();
    let marker = env.path("backup-started");
    write_config(
        &env,
        &format!(
            "[jobs.home]\npaths = [\"{}\"]\nrepos = [\"@a\"]\nschedule = \"every 1s\"\n\
             before = \"touch {}\"\n",
            src.display(),
            marker.display()
        ),
    );
    let daemon = Daemon::start(&env, &[]);
    wait_for(60, "the backup to start", || marker.exists());
    std::thread::sleep(Duration::from_millis(500));
    daemon.stop_a_run();
    assert!(snapshots_of(&env, "@a").is_empty());

    std::fs::remove_file(src.join("big")).unwrap();
    let (code, reports) = run_json(&env, &["home"]);
    assert_eq!(code, 0, "{reports:#}");
    assert_eq!(snapshots_of(&env, "@a").len(), 1);
    let out = env.bare_cmd().args(["-r", "@a", "check"]).output().unwrap();
    assert_success(&out, "check after the interrupted run");
}

/// `GET path` with a bearer token: the status code and the body.
fn http_get(addr: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\n{auth}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, body.to_string())
}

/// Prometheus text format: `name{labels} value` lines, `# ...` comments.
fn parse_metrics(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("{l:?}"));
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("{l:?} ends in a number"));
            (series.to_string(), value)
        })
        .collect()
}

fn metric(metrics: &[(String, f64)], series: &str) -> f64 {
    metrics
        .iter()
        .find(|(s, _)| s == series)
        .unwrap_or_else(|| panic!("no {series} in {metrics:?}"))
        .1
}

#[test]
fn the_status_endpoint_serves_job_status_and_prometheus_metrics() {
    let env = jobs_env("");
    write_config(
        &env,
        &format!(
            "[jobs.home]\npaths = [\"{}\"]\nrepos = [\"@a\", \"@b\"]\nschedule = \"every 1s\"\n",
            env.path("src").display()
        ),
    );
    let token_file = env.path("token");
    std::fs::write(&token_file, "s3cret\n").unwrap();
    let token_arg = token_file.to_str().unwrap();
    let daemon = Daemon::start(
        &env,
        &["--listen", "127.0.0.1:0", "--token-file", token_arg],
    );
    // The first line says where it listens.
    let listening = daemon.wait_for_events(60, 1, "listening");
    let first = daemon.log.lock().unwrap()[0].clone();
    assert_eq!(first["event"], "listening", "{first}");
    let addr = listening[0]["address"].as_str().unwrap().to_string();
    wait_for(60, "a finished run", || {
        let (_, body) = http_get(&addr, "/status", Some("s3cret"));
        serde_json::from_str::<Value>(&body).unwrap()["jobs"]["home"]["status"] == "success"
    });
    assert_eq!(http_get(&addr, "/metrics", None).0, 401);
    assert_eq!(http_get(&addr, "/status", Some("wrong")).0, 401);
    let (code, body) = http_get(&addr, "/metrics", Some("s3cret"));
    assert_eq!(code, 200);
    let m = parse_metrics(&body);
    assert_eq!(metric(&m, "cairn_job_success{job=\"home\"}"), 1.0);
    assert_eq!(metric(&m, "cairn_job_errors{job=\"home\"}"), 0.0);
    assert_eq!(metric(&m, "cairn_job_files{job=\"home\"}"), 5.0);
    let last = metric(&m, "cairn_job_last_success_timestamp_seconds{job=\"home\"}");
    // In milliseconds: the metric has them, and a whole second would round now below it.
    let now = jiff::Timestamp::now().as_millisecond() as f64 / 1000.0;
    assert!(last <= now && last > now - 60.0, "{last} vs {now}");
    assert_eq!(
        metric(
            &m,
            "cairn_repository_success{job=\"home\",repository=\"@b\"}"
        ),
        1.0
    );
    let (_, status) = http_get(&addr, "/status", Some("s3cret"));
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        status["jobs"]["home"]["repositories"]["@b"]["status"], "success",
        "{status}"
    );
    crate::json_schema::assert_matches_schema("daemon_status", &status, "GET /status");
    let (code, _, err) = daemon.stop();
    assert_eq!(code, 0, "{err}");
}

#[test]
fn run_writes_a_metrics_file_for_the_textfile_collector() {
    let env = jobs_env("");
    write_config(
        &env,
        &format!(
            "[jobs.home]\npaths = [\"{}\"]\nrepos = [\"@a\"]\n\n[jobs.etc]\npaths = [\"/nonexistent-cairn\"]\nrepos = [\"@a\"]\n",
            env.path("src").display()
        ),
    );
    let file = env.path("cairn.prom");
    let out = env
        .bare_cmd()
        .args(["run", "home", "--metrics-file"])
        .arg(&file)
        .output()
        .unwrap();
    assert_success(&out, "cairn run --metrics-file");
    let m = parse_metrics(&std::fs::read_to_string(&file).unwrap());
    assert_eq!(metric(&m, "cairn_job_success{job=\"home\"}"), 1.0);
    assert_eq!(metric(&m, "cairn_job_files{job=\"home\"}"), 5.0);
    assert_eq!(metric(&m, "cairn_job_read_bytes{job=\"home\"}"), 100_000.0);
    // The repository's packs, as `cairn stats` counts them.
    let out = env
        .bare_cmd()
        .args(["-r", "@a", "stats", "--json"])
        .output()
        .unwrap();
    assert_success(&out, "stats");
    let packs = json_u64(&parse_json(&out.stdout, "stats --json"), "pack_bytes");
    let size = metric(
        &m,
        "cairn_repository_size_bytes{job=\"home\",repository=\"@a\"}",
    );
    assert_eq!(size, packs as f64);
    assert!(size > 100_000.0, "{size}");
    // A job that never ran has no samples but its running state.
    assert!(!m.iter().any(|(s, _)| s == "cairn_job_success{job=\"etc\"}"));
}

#[test]
fn sighup_reloads_the_config_and_a_broken_one_is_refused() {
    let env = jobs_env("");
    let job = |schedule: &str| {
        format!(
            "[jobs.home]\npaths = [\"{}\"]\nrepos = [\"@a\"]\nschedule = \"{schedule}\"\nbefore = \"touch {}\"\n",
            env.path("src").display(),
            env.path("ran").display()
        )
    };
    write_config(&env, &job("every 1h"));
    let daemon = Daemon::start(&env, &[]);
    // Its handlers are installed before it says it started: a SIGHUP sent earlier would
    // end the process. And each reload is waited for, or a loaded machine folds the two
    // signals into one reload of the second file.
    daemon.wait_for_events(60, 1, "started");
    write_config(&env, &job("every 1 hour"));
    daemon.signal(libc::SIGHUP);
    daemon.wait_for_events(60, 1, "reload_failed");
    assert!(!env.path("ran").exists());
    write_config(&env, &job("every 1s"));
    daemon.signal(libc::SIGHUP);
    wait_for(60, "a run on the reloaded schedule", || {
        env.path("ran").exists()
    });
    let (code, log, err) = daemon.stop();
    assert_eq!(code, 0, "{err}");
    let failed = events(&log, "reload_failed");
    assert_eq!(failed.len(), 1, "{log:?}");
    assert!(
        failed[0]["error"].as_str().unwrap().contains("line 10"),
        "{failed:?}"
    );
    assert_eq!(events(&log, "reloaded").len(), 1);
}

#[test]
fn schedule_install_writes_units_that_systemd_analyze_accepts() {
    let env = jobs_env("");
    let src = env.path("src");
    write_config(
        &env,
        &format!(
            "[jobs.home]\npaths = [\"{0}\"]\nrepos = [\"@a\"]\nschedule = \"daily 02:30\"\njitter = \"10m\"\n\
             limits = {{ nice = true }}\n\n\
             [jobs.often]\npaths = [\"{0}\"]\nrepos = [\"@a\"]\nschedule = \"every 6h\"\n\n\
             [jobs.office]\npaths = [\"{0}\"]\nrepos = [\"@b\"]\nschedule = \"*/15 8-18 * * 1-5\"\n\n\
             [jobs.manual]\npaths = [\"{0}\"]\nrepos = [\"@b\"]\n",
            src.display()
        ),
    );
    let dir = env.path("units");
    let out = env
        .bare_cmd()
        .args(["schedule", "install", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_success(&out, "schedule install --dir");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "cairn-home.service",
            "cairn-home.timer",
            "cairn-office.service",
            "cairn-office.timer",
            "cairn-often.service",
            "cairn-often.timer"
        ]
    );
    let timer = std::fs::read_to_string(dir.join("cairn-home.timer")).unwrap();
    assert!(
        timer.contains("OnCalendar=*-*-* 02:30:00\nPersistent=true\nRandomizedDelaySec=600\n"),
        "{timer}"
    );
    let service = std::fs::read_to_string(dir.join("cairn-home.service")).unwrap();
    assert!(service.contains(" run home\n"), "{service}");

    match std::process::Command::new("systemd-analyze").arg("--version").output() {
        Ok(o) if o.status.success() => {
            let units: Vec<_> = names.iter().map(|n| dir.join(n)).collect();
            let out = std::process::Command::new("systemd-analyze")
                .args(["verify", "--man=no"])
                .args(&units)
                .output()
                .unwrap();
            assert_success(&out, "systemd-analyze verify");
            assert!(stderr(&out).trim().is_empty(), "systemd-analyze says: {}", stderr(&out));
            let out = std::process::Command::new("systemd-analyze")
                .args(["calendar", "Mon..Fri *-*-* 8..18:0/15:00"])
                .output()
                .unwrap();
            assert_success(&out, "systemd-analyze calendar");
        }
        _ => eprintln!("SKIPPED the systemd-analyze verification: systemd-analyze is not installed (scripts/services.sh install installs it)"),
    }

    // remove takes only what install wrote.
    std::fs::write(dir.join("cairn-mine.timer"), "[Timer]\n").unwrap();
    let out = env
        .bare_cmd()
        .args(["schedule", "remove", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_success(&out, "schedule remove --dir");
    assert_eq!(count_files(&dir), 1);
}

#[test]
fn limits_nice_runs_the_job_and_its_hooks_at_a_lower_priority() {
    let env = jobs_env("");
    write_config(
        &env,
        &format!(
            "[jobs.home]\npaths = [\"{}\"]\nrepos = [\"@a\"]\nlimits = {{ nice = true, threads = 1 }}\n\
             before = \"nice > {}\"\n",
            env.path("src").display(),
            env.path("niceness").display()
        ),
    );
    let out = env.bare_cmd().args(["run", "home"]).output().unwrap();
    assert_success(&out, "cairn run");
    assert_eq!(
        std::fs::read_to_string(env.path("niceness")).unwrap(),
        "10\n"
    );
}

/// A day of a daemon compressed into seconds: a job every second, forget after each run,
/// prune when due (hourly: once here), check after every run, the files changing between
/// runs.
#[test]
fn a_day_of_a_daemon_in_seconds() {
    let env = jobs_env("");
    let all = env.path("all-runs.log");
    // The before hook lets four runs through and fails the later ones, which then back up
    // nothing: stopping the daemon cannot interrupt a fifth run half-way, however late
    // a loaded machine lets the test send the signal.
    let admitted = env.path("admitted");
    std::fs::write(&admitted, "").unwrap();
    write_config(
        &env,
        &format!(
            "[jobs.home]\npaths = [\"{}\"]\nrepos = [\"@a\", \"@b\"]\nschedule = \"every 1s\"\n\
             keep = {{ last = 2 }}\nprune = \"hourly\"\ncheck = {{ every = \"always\", read-data-subset = \"50%\" }}\n\
             before = \"test $(wc -l < {admitted}) -lt 4 && echo >> {admitted} && date +%s%N > {}\"\n\
             after = \"cat $CAIRN_LOG >> {}\"\n",
            env.path("src").display(),
            env.path("src/stamp").display(),
            all.display(),
            admitted = admitted.display(),
        ),
    );
    let daemon = Daemon::start(&env, &[]);
    let count = |what: &str| {
        std::fs::read_to_string(&all).map_or(0, |t| t.lines().filter(|l| l.contains(what)).count())
    };
    daemon.wait_for_events(240, 5, "job_finished");
    let (code, log, err) = daemon.stop();
    assert_eq!(code, 0, "{err}");
    let runs = count("backup to @a");
    assert_eq!(runs, 4, "the before hook admits four runs");
    let finished = events(&log, "job_finished");
    let (admitted, refused) = finished.split_at(4);
    assert!(
        admitted.iter().all(|e| e["status"] == "success"),
        "{finished:?}"
    );
    assert!(
        refused.iter().all(|e| e["status"] != "success"),
        "{finished:?}"
    );
    // Every run copied to @b and forgot down to two snapshots in each repository.
    assert_eq!(count("copy to @b"), runs);
    assert_eq!(count("forget:"), 2 * runs);
    // Prune ran when due: once in each repository, not again within the hour; check
    // after every run.
    let (prunes, checks) = (count("prune:"), count("check: no problems found"));
    assert_eq!(prunes, 2, "{prunes} prunes in {runs} runs");
    assert_eq!(checks, 2 * runs, "{checks} checks in {runs} runs");
    for repo in ["@a", "@b"] {
        assert_eq!(snapshots_of(&env, repo).len(), 2, "{repo}");
        let out = env
            .bare_cmd()
            .args(["-r", repo, "check", "--read-data"])
            .output()
            .unwrap();
        assert_success(&out, "check --read-data");
    }
    eprintln!(
        "a day of a daemon: {runs} runs, {prunes} prunes and {checks} checks over two repositories; \
         daemon log:\n{}",
        log.iter().map(|e| e["message"].as_str().unwrap_or("")).collect::<Vec<_>>().join("\n")
    );
}

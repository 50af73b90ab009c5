//! Every `--json` document of every command, from real runs on a real repository, checked
//! against docs/json-schema.json. Its objects allow no other keys, so a key renamed,
//! added or dropped in one command without the schema (and docs/JSON.md) fails here.
//!
//! With `CAIRN_JSON_DUMP=DIR` the documents are also written to DIR, one file each, to
//! look at when the schema has to change.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use crate::common::*;

/// Documents checked by other tests: errors below, the daemon's status in the jobs tests.
const CHECKED_ELSEWHERE: [&str; 2] = ["error", "daemon_status"];

/// Checks `doc` against the schema's document `name`, for tests elsewhere.
pub fn assert_matches_schema(name: &str, doc: &Value, what: &str) {
    Schema::load().check(name, doc, what);
}

/// The schema, and which of its documents the runs have shown.
struct Schema {
    root: Value,
    checked: BTreeSet<String>,
    /// Documents checked so far, to name them in messages and dumped files.
    runs: usize,
    dump: Option<PathBuf>,
}

impl Schema {
    fn load() -> Schema {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/json-schema.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let root: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
        let dump = std::env::var_os("CAIRN_JSON_DUMP").map(PathBuf::from);
        if let Some(dir) = &dump {
            std::fs::create_dir_all(dir).unwrap();
        }
        Schema {
            root,
            checked: BTreeSet::new(),
            runs: 0,
            dump,
        }
    }

    /// The documents the schema describes: its `$defs` named in lower case (the shared
    /// parts are capitalized).
    fn documents(&self) -> BTreeSet<String> {
        self.root["$defs"]
            .as_object()
            .expect("the schema has $defs")
            .keys()
            .filter(|k| k.starts_with(|c: char| c.is_ascii_lowercase()))
            .cloned()
            .collect()
    }

    /// Checks `doc` against the schema's document `name`; panics listing every mismatch.
    fn check(&mut self, name: &str, doc: &Value, what: &str) {
        assert!(
            self.root["$defs"].get(name).is_some(),
            "the schema has no document {name}"
        );
        let mut schema = self.root.clone();
        schema["$ref"] = format!("#/$defs/{name}").into();
        let validator = jsonschema::validator_for(&schema)
            .unwrap_or_else(|e| panic!("docs/json-schema.json does not compile: {e}"));
        let errors: Vec<String> = validator
            .iter_errors(doc)
            .map(|e| format!("  at {}: {e}", e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{what}: the document does not match the schema's {name}:\n{}\n{doc:#}",
            errors.join("\n")
        );
        self.runs += 1;
        if let Some(dir) = &self.dump {
            let file = dir.join(format!("{name}-{}.json", self.runs));
            std::fs::write(file, serde_json::to_vec_pretty(doc).unwrap()).unwrap();
        }
        self.checked.insert(name.to_string());
    }

    /// Runs `cmd`, which must exit with `code`, and checks its stdout as document `name`.
    fn run(&mut self, name: &str, cmd: &mut assert_cmd::Command, code: i32) -> (Value, Output) {
        let out = cmd.output().unwrap();
        let what = format!("run {} ({name})", self.runs + 1);
        assert_exit(&out, code, &what);
        let doc = parse_json(&out.stdout, &what);
        self.check(name, &doc, &what);
        (doc, out)
    }
}

fn ok(schema: &mut Schema, name: &str, cmd: &mut assert_cmd::Command) -> Value {
    schema.run(name, cmd, 0).0
}

/// A source tree with a file of each kind that the documents describe differently: a
/// symlink (`link_target`), a file the size exclusion leaves out, one a pattern leaves out.
fn source(env: &TestEnv) -> PathBuf {
    let data = env.path("data");
    write_random_files(&data.join("files"), 3, 5_000, 1);
    write_file(&data.join("notes.txt"), b"first version\n");
    write_file(&data.join("big.bin"), &random_bytes(20_000, 2));
    write_file(&data.join("scratch.tmp"), b"left out\n");
    std::os::unix::fs::symlink("notes.txt", data.join("link")).unwrap();
    data
}

#[test]
fn every_commands_json_matches_the_schema() {
    let mut schema = Schema::load();
    let s = &mut schema;

    let env = TestEnv::new();
    ok(s, "init", env.cmd().args(["init", "--json"]));
    let data = source(&env);
    let first = ok(
        s,
        "backup",
        env.cmd()
            .args(["backup", "--json", "--tag", "a"])
            .arg(&data),
    );
    let first = first["snapshot_id"].as_str().unwrap().to_string();
    ok(
        s,
        "backup",
        env.cmd()
            .args(["backup", "--json", "--dry-run", "-vv", "--exclude", "*.tmp"])
            .args(["--exclude-larger-than", "10K"])
            .arg(&data),
    );
    write_file(&data.join("notes.txt"), b"second version, longer\n");
    ok(
        s,
        "backup",
        env.cmd().args(["backup", "--json", "-v"]).arg(&data),
    );

    ok(s, "snapshots", env.cmd().args(["snapshots", "--json"]));
    ok(
        s,
        "snapshots",
        env.cmd()
            .args(["snapshots", "--json", "--latest", "1", "--compact"]),
    );
    ok(
        s,
        "snapshots_grouped",
        env.cmd()
            .args(["snapshots", "--json", "--group-by", "host,tags"]),
    );
    ok(s, "ls", env.cmd().args(["ls", "--json", "latest"]));
    ok(
        s,
        "ls",
        env.cmd().args(["ls", "--json", "--recursive", "latest"]),
    );
    ok(s, "find", env.cmd().args(["find", "--json", "*.txt"]));
    ok(
        s,
        "diff",
        env.cmd()
            .args(["diff", "--json", "--content", &first, "latest"]),
    );
    ok(
        s,
        "diff",
        env.cmd().args(["diff", "--json", "latest"]).arg(&data),
    );
    ok(s, "stats", env.cmd().args(["stats", "--json"]));
    ok(s, "stats", env.cmd().args(["stats", "--json", "latest"]));
    ok(s, "check", env.cmd().args(["check", "--json"]));

    let target = env.path("restored");
    ok(
        s,
        "restore",
        env.cmd()
            .args(["restore", "--json", "latest", "--target"])
            .arg(&target),
    );
    ok(
        s,
        "restore_dry_run",
        env.cmd()
            .args([
                "restore",
                "--json",
                "latest",
                "--dry-run",
                "--delete",
                "--target",
            ])
            .arg(&target),
    );

    ok(
        s,
        "rewrite",
        env.cmd().args(["tag", "--json", "--add", "x,y", "latest"]),
    );
    ok(
        s,
        "rewrite",
        env.cmd().args(["rewrite", "--json", "--exclude", "*.bin"]),
    );

    let pw = env.path("second.pw");
    write_file(&pw, b"a second password\n");
    ok(
        s,
        "key_add",
        env.cmd()
            .args(["key", "add", "--json", "--new-password-file"])
            .arg(&pw),
    );
    ok(s, "key_list", env.cmd().args(["key", "list", "--json"]));

    ok(
        s,
        "forget",
        env.cmd()
            .args(["forget", "--json", "--dry-run", "--keep-last", "1"]),
    );
    ok(
        s,
        "forget",
        env.cmd()
            .args([
                "forget",
                "--json",
                "--dry-run",
                "--group-by",
                "host,paths,tags",
            ])
            .args(["--keep-last", "1"]),
    );
    ok(
        s,
        "forget",
        env.cmd().args(["forget", "--json", "--dry-run", &first]),
    );
    ok(s, "prune", env.cmd().args(["prune", "--json", "--dry-run"]));
    ok(
        s,
        "forget_prune",
        env.cmd()
            .args(["forget", "--json", "--keep-last", "2", "--prune"]),
    );
    ok(s, "prune", env.cmd().args(["prune", "--json"]));
    ok(
        s,
        "repair_index",
        env.cmd().args(["repair", "index", "--json"]),
    );
    ok(
        s,
        "repair_snapshots",
        env.cmd()
            .args(["repair", "snapshots", "--json", "--dry-run"]),
    );

    // copy, into a second repository with its own password.
    let other = env.path("other");
    let copy_env = |cmd: &mut assert_cmd::Command| {
        cmd.env("CAIRN_PASSWORD", "another password")
            .arg("-r")
            .arg(&other);
    };
    let mut init_other = env.bare_cmd();
    copy_env(&mut init_other);
    assert_success(&init_other.arg("init").output().unwrap(), "init other");
    let from_pw = env.path("from.pw");
    write_file(&from_pw, format!("{PASSWORD}\n").as_bytes());
    let mut copy = env.bare_cmd();
    copy_env(&mut copy);
    ok(
        s,
        "copy",
        copy.args(["copy", "--json", "--from-repo"])
            .arg(&env.repo)
            .arg("--from-password-file")
            .arg(&from_pw),
    );

    let file = data.join("big.bin");
    ok(
        s,
        "chunk",
        env.bare_cmd().args(["chunk", "--json"]).arg(&file),
    );
    ok(
        s,
        "chunk_sizes",
        env.bare_cmd()
            .args(["chunk", "--json", "--sizes", "16K,64K"])
            .arg(&file),
    );

    config_and_jobs(s, &env, &data);
    serve(s, &env);

    let missing: Vec<_> = s
        .documents()
        .into_iter()
        .filter(|d| !CHECKED_ELSEWHERE.contains(&d.as_str()) && !s.checked.contains(d))
        .collect();
    assert!(
        missing.is_empty(),
        "the schema describes documents no command here printed: {missing:?}"
    );
}

/// `config` and `run`: a config file naming the repository, and a job backing up to it.
fn config_and_jobs(s: &mut Schema, env: &TestEnv, data: &Path) {
    let repo = env.repo.to_str().unwrap();
    ok(
        s,
        "config_repo",
        env.bare_cmd()
            .args(["config", "repo", "add", "--json", "main", repo]),
    );
    ok(
        s,
        "config_repo_list",
        env.bare_cmd().args(["config", "repo", "list", "--json"]),
    );
    ok(
        s,
        "config_default",
        env.bare_cmd()
            .args(["config", "repo", "default", "--json", "main"]),
    );
    let config = env.path("config/cairn/config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "\n[jobs.home]\npaths = [\"{}\"]\nrepos = [\"@main\"]\n",
        data.display()
    ));
    std::fs::write(&config, text).unwrap();
    ok(
        s,
        "config_check",
        env.bare_cmd().args(["config", "check", "--json"]),
    );
    ok(s, "run", env.bare_cmd().args(["run", "--json", "home"]));
    ok(
        s,
        "config_repo_remove",
        env.bare_cmd()
            .args(["config", "repo", "remove", "--json", "main"]),
    );
}

/// `serve`'s administration commands, on a served directory.
fn serve(s: &mut Schema, env: &TestEnv) {
    let dir = env.path("served");
    std::fs::create_dir_all(dir.join("home")).unwrap();
    let serve = || {
        let mut cmd = env.bare_cmd();
        cmd.arg("serve").arg("--dir").arg(&dir);
        cmd
    };
    ok(
        s,
        "serve_token_add",
        serve().args([
            "token", "add", "--json", "laptop", "--repo", "home", "--rights", "append",
        ]),
    );
    ok(
        s,
        "serve_token_list",
        serve().args(["token", "list", "--json"]),
    );
    ok(
        s,
        "serve_undelete_list",
        serve().args(["undelete", "--json", "--list", "home"]),
    );
    ok(
        s,
        "serve_undelete",
        serve().args(["undelete", "--json", "home"]),
    );
    ok(s, "serve_scrub", serve().args(["scrub", "--json"]));
}

/// Runs `cmd`, which must fail with `code`; its stdout must be one error document of
/// `kind`, whose message is the error stderr shows.
fn error(s: &mut Schema, cmd: &mut assert_cmd::Command, code: i32, kind: &str) -> Value {
    let (doc, out) = s.run("error", cmd, code);
    assert_eq!(doc["error"]["kind"], kind, "{doc:#}");
    assert_eq!(doc["error"]["exit_code"], code, "{doc:#}");
    let message = doc["error"]["message"].as_str().unwrap();
    assert!(
        stderr(&out).contains(message.lines().next().unwrap()),
        "stderr shows the message too: {}",
        describe(&out)
    );
    doc
}

#[test]
fn a_fatal_error_with_json_is_one_error_document_naming_its_kind() {
    let mut schema = Schema::load();
    let s = &mut schema;
    let env = TestEnv::with_repo();
    let data = env.path("data");
    write_file(&data.join("a"), b"a");
    env.backup(&[&data], &[]);

    error(
        s,
        env.cmd()
            .env("CAIRN_PASSWORD", "not the password")
            .args(["snapshots", "--json"]),
        1,
        "wrong_password",
    );
    error(
        s,
        env.bare_cmd()
            .arg("-r")
            .arg(env.path("nothing-here"))
            .args(["snapshots", "--json"]),
        1,
        "not_a_repository",
    );
    let doc = error(
        s,
        env.cmd().args(["ls", "--json", "0123abcd"]),
        1,
        "not_found",
    );
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("0123abcd"),
        "{doc:#}"
    );
    error(
        s,
        env.cmd().args(["ls", "--json", "latest", "/no/such/path"]),
        1,
        "not_found",
    );
    // clap rejects the command line before any command runs; --json is still seen.
    error(
        s,
        env.cmd().args(["snapshots", "--json", "--no-such-option"]),
        2,
        "usage",
    );
    error(s, env.cmd().args(["--json", "no-such-command"]), 2, "usage");
    // After `--`, `--json` is a path, not the option: the usage error is text only.
    let out = env
        .cmd()
        .args(["backup", "--no-such-option", "--", "--json"])
        .output()
        .unwrap();
    assert_exit(&out, 2, "a usage error with --json after --");
    assert!(out.stdout.is_empty(), "{}", describe(&out));
    // Without --json, stdout stays empty.
    let out = env
        .cmd()
        .env("CAIRN_PASSWORD", "not the password")
        .arg("snapshots")
        .output()
        .unwrap();
    assert_exit(&out, 1, "snapshots with a wrong password");
    assert!(out.stdout.is_empty(), "{}", describe(&out));
}

//! Names are whatever bytes their owner chose: one holding an escape sequence or a newline
//! must not reach the terminal of whoever lists, searches or compares the snapshot, nor
//! forge a line of output. `--json` keeps the exact name (JSON escapes it itself).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::common::*;

const EVIL: &[u8] = b"x\x1b[31mred\nline\x07";
const SHOWN: &str = "x\\x1b[31mred\\nline\\x07";

/// Every byte of `out` is printable, a space, or the newline that ends a line.
fn assert_no_control_bytes(out: &[u8], what: &str) {
    let bad: Vec<u8> = out
        .iter()
        .copied()
        .filter(|&b| (b < 0x20 && b != b'\n') || b == 0x7f)
        .collect();
    assert!(
        bad.is_empty(),
        "{what} printed control bytes {bad:?}: {}",
        String::from_utf8_lossy(out).escape_debug()
    );
}

#[test]
fn names_with_escape_sequences_are_escaped_in_ls_find_diff_and_errors() {
    let env = TestEnv::with_repo();
    let src = env.path("src");
    let evil = src.join(OsStr::from_bytes(EVIL));
    write_file(&evil, b"one\n");
    write_file(&src.join("plain"), b"plain\n");
    let first = env.backup_id(&[&src], &[]);
    write_file(&evil, b"two, longer\n");
    let second = env.backup_id(&[&src], &[]);
    let shown = format!("{}/{SHOWN}", src.display());

    let runs: Vec<Vec<&OsStr>> = vec![
        vec!["ls".as_ref(), "-R".as_ref(), "latest".as_ref()],
        vec![
            "ls".as_ref(),
            "-l".as_ref(),
            "-R".as_ref(),
            "latest".as_ref(),
        ],
        vec!["find".as_ref(), "x*".as_ref()],
        vec!["diff".as_ref(), first.as_ref(), second.as_ref()],
    ];
    for args in runs {
        let out = env.cmd().args(&args).output().unwrap();
        assert_success(&out, &format!("cairn {args:?}"));
        assert_no_control_bytes(&out.stdout, &format!("cairn {args:?}"));
        assert_no_control_bytes(&out.stderr, &format!("cairn {args:?} (stderr)"));
        assert!(
            stdout(&out).contains(&shown),
            "cairn {args:?} shows {shown}: {}",
            stdout(&out)
        );
    }

    // An error that suggests names from the snapshot.
    let mut missing = evil.clone().into_os_string();
    missing.push("-gone");
    let out = env
        .cmd()
        .args(["cat", "latest"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_exit(&out, 1, "cairn cat of a missing path");
    assert_no_control_bytes(&out.stderr, "cairn cat's error");
    assert!(stderr(&out).contains("x\\x1b[31m"), "{}", stderr(&out));

    // JSON strings carry the exact name.
    let out = env
        .cmd()
        .args(["ls", "--json", "-R", "latest"])
        .output()
        .unwrap();
    assert_success(&out, "cairn ls --json");
    let listed = parse_json(&out.stdout, "cairn ls --json");
    let exact = String::from_utf8(EVIL.to_vec()).unwrap();
    assert!(
        listed["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["name"].as_str() == Some(exact.as_str())),
        "{listed}"
    );
}

//! `cairn generate`: completions for each shell and a man page per command, made from the
//! same definitions as `--help`.

use std::fs;

use crate::common::*;

#[test]
fn completions_and_man_pages_cover_every_command() {
    let env = TestEnv::new();
    for shell in ["bash", "zsh", "fish"] {
        let out = env
            .bare_cmd()
            .args(["generate", "--completions", shell])
            .output()
            .unwrap();
        assert_success(&out, shell);
        let script = stdout(&out);
        for word in ["cairn", "restore", "serve", "exclude-caches", "cipher"] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
    }
    let man = env.path("man");
    let out = env
        .bare_cmd()
        .args(["generate", "--man", man.to_str().unwrap()])
        .output()
        .unwrap();
    assert_success(&out, "generate --man");
    for page in [
        "cairn.1",
        "cairn-backup.1",
        "cairn-key-passwd.1",
        "cairn-serve.1",
    ] {
        let text = fs::read_to_string(man.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".SH NAME"), "{page}");
    }
    let restore = fs::read_to_string(man.join("cairn-restore.1")).unwrap();
    assert!(restore.contains("no\\-special\\-files"), "{restore}");

    let out = env.bare_cmd().arg("generate").output().unwrap();
    assert_exit(&out, 2, "generate with nothing to generate");
    let out = env
        .bare_cmd()
        .args(["generate", "--completions", "cmd.exe"])
        .output()
        .unwrap();
    assert_exit(&out, 2, "an unknown shell");
}

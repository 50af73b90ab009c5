//! Link options for a smaller resident binary, in optimized builds on Linux.
//!
//! - The functions that everyday commands run, listed in `symbol-order.txt` by
//!   `scripts/symbol-order`, are laid out together. Otherwise they are spread over the
//!   16 MiB of `.text`, and the kernel maps the 64 KiB around every page of code that runs
//!   (fault-around): an unchanged backup of the mixed corpus held 7.8-8.6 MiB of cairn's
//!   code resident, 2.6-2.7 MiB with the order. lld's `--symbol-ordering-file` takes the
//!   list's names as they are. A name that ends in `.llvm.*` is a local function that
//!   ThinLTO renamed with the hash of its module, which changes with every edit of that
//!   module (one `cargo fmt` made 141 of 259 such names stale): a linker script written
//!   here puts the sections of such functions, whatever their hash, into `.text.hot`
//!   before `.text`. Only those names go there, because lld compares every section with
//!   every pattern of a script: all 1,900 names took the link from 0.6 to 4 s, the 250
//!   renamed ones to 1.2 s.
//! - `-z pack-relative-relocs`: the 27,000 relative relocations of a PIE in 7 KB of
//!   `.relr.dyn` instead of 640 KB of `.rela.dyn`, which the loader reads in full at
//!   every start. Needs glibc 2.36.
//!
//! Each option is used only if a test program linked with it here runs: another linker
//! (GNU ld has no symbol ordering), an older glibc or a cross build gets the default link.
//! Together they took the peak RSS of that unchanged backup from 13.3-14.4 to
//! 8.4-8.9 MiB (see docs/BENCHMARKS.md).

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let order = Path::new("symbol-order.txt");
    println!("cargo:rerun-if-changed={}", order.display());
    let optimized = env::var("OPT_LEVEL").is_ok_and(|level| level != "0");
    let native = env::var("TARGET").ok() == env::var("HOST").ok();
    if !optimized || !native || env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let Some(out) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    let mut options = vec!["-Wl,-z,pack-relative-relocs".to_string()];
    // Names this build does not have (renamed or moved functions) are not an error: they
    // only leave those functions where they were.
    if let Ok(list) = order.canonicalize() {
        options.push(format!(
            "-Wl,--symbol-ordering-file={},--no-warn-symbol-ordering",
            list.display()
        ));
        let script = out.join("hot-text.ld");
        let written = std::fs::read_to_string(&list)
            .and_then(|names| std::fs::write(&script, renamed_locals_script(&names)));
        match written {
            Ok(()) => options.push(format!("-Wl,{}", script.display())),
            Err(error) => println!("cargo:warning=linked without {}: {error}", script.display()),
        }
    }
    for option in options {
        if links_and_runs(&out, &option) {
            println!("cargo:rustc-link-arg-bin=cairn={option}");
        } else {
            println!(
                "cargo:warning=linked without {option}: a program linked with it here did not run"
            );
        }
    }
}

/// A linker script that puts the sections of the listed functions whose names end in
/// `.llvm.*` (ThinLTO's renamed locals, any hash), in the list's order, into `.text.hot`
/// before `.text`, and leaves the rest of the default layout as it is (`INSERT`). rustc
/// gives every function a section named for it, `.text.<symbol>`, or
/// `.text.unlikely.<symbol>` when it is cold.
fn renamed_locals_script(list: &str) -> String {
    let mut script = String::from("SECTIONS {\n  .text.hot : {\n");
    for name in list.lines().map(str::trim) {
        if name.ends_with(".llvm.*") && !name.starts_with('#') {
            let _ = writeln!(script, "    *(.text.{name} .text.unlikely.{name})");
        }
    }
    script.push_str("  }\n}\nINSERT BEFORE .text;\n");
    script
}

/// Whether a program linked with `option`, by the same rustc, linker and flags as the
/// binary, links and runs.
fn links_and_runs(out: &Path, option: &str) -> bool {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let source = out.join("probe.rs");
    let program = out.join("probe");
    if std::fs::write(&source, "fn main() {}\n").is_err() {
        return false;
    }
    let mut link = Command::new(rustc);
    link.arg(&source).arg("-o").arg(&program);
    link.arg("-C").arg(format!("link-arg={option}"));
    if let Ok(flags) = env::var("CARGO_ENCODED_RUSTFLAGS") {
        link.args(flags.split('\x1f').filter(|flag| !flag.is_empty()));
    }
    if let Some(linker) = env::var_os("RUSTC_LINKER") {
        link.arg("-C")
            .arg(format!("linker={}", linker.to_string_lossy()));
    }
    let linked = link.output().is_ok_and(|output| output.status.success());
    linked
        && Command::new(&program)
            .status()
            .is_ok_and(|status| status.success())
}

//! The floor under an unchanged backup: walk the given paths with every core and lstat()
//! each entry, doing nothing else. `bench/compare.sh` times it beside cairn's unchanged
//! second backup, which must also list and lstat every entry (and compare it with the
//! parent snapshot) but should not take much longer than this.
//!
//! usage: cargo run --release -p cairn-core --example statwalk -- PATH...

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

use ignore::{WalkBuilder, WalkState};

fn main() -> ExitCode {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    let Some((first, rest)) = paths.split_first() else {
        eprintln!("usage: statwalk PATH...");
        return ExitCode::from(2);
    };
    let mut builder = WalkBuilder::new(first);
    for path in rest {
        builder.add(path);
    }
    // A backup reads everything: no hidden-file, ignore-file or gitignore filtering.
    // threads(0) lets the crate pick one thread per core.
    builder
        .standard_filters(false)
        .follow_links(false)
        .threads(0);

    let entries = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let errors = AtomicU64::new(0);
    builder.build_parallel().run(|| {
        Box::new(|entry| {
            // `metadata()` lstats the entry (links are not followed); the walk itself only
            // reads directories and knows each entry's type from readdir.
            match entry.and_then(|e| e.metadata()) {
                Ok(meta) => {
                    entries.fetch_add(1, Ordering::Relaxed);
                    bytes.fetch_add(meta.len(), Ordering::Relaxed);
                }
                Err(err) => {
                    eprintln!("statwalk: {err}");
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            WalkState::Continue
        })
    });
    println!(
        "{} entries, {} bytes",
        entries.load(Ordering::Relaxed),
        bytes.load(Ordering::Relaxed)
    );
    if errors.load(Ordering::Relaxed) > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

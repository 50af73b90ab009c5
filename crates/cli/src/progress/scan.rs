//! The backup's pre-scan: a thread that walks the backup paths ahead of the backup,
//! `lstat` only, and adds what it finds to the progress totals, so that the bar has an
//! end and an ETA. It is an estimate: it applies `--exclude`, `--one-file-system` and
//! `--exclude-larger-than` as the backup does, but not ignore files or cache tags, and it
//! counts files as they are now, not as the backup reads them. It never reads a file's
//! contents and never reports a problem (the backup reports those).

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cairn_core::ops::exclude::Excludes;

use super::Feed;

/// What the walk leaves out, from the backup's own options.
pub struct ScanOptions {
    pub paths: Vec<PathBuf>,
    pub excludes: Excludes,
    pub one_file_system: bool,
    pub exclude_larger_than: Option<u64>,
}

/// Stops the walk when the backup has ended before it.
pub struct StopHandle(Arc<AtomicBool>);

impl StopHandle {
    pub fn stop(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Starts the walk on its own thread. It is not joined: a walk stopped in a slow `lstat`
/// (a network filesystem) must not hold up the end of the command.
pub fn spawn(opts: ScanOptions, feed: Feed) -> StopHandle {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let started = std::thread::Builder::new()
        .name("prescan".into())
        .spawn(move || {
            let mut feed = feed;
            if walk(&opts, &mut feed, &stopped) {
                feed.complete();
            }
        });
    if started.is_err() {
        // No estimate then; the display shows counts and rate without an ETA.
        stop.store(true, Ordering::Relaxed);
    }
    StopHandle(stop)
}

/// Whether the walk went through to the end.
fn walk(opts: &ScanOptions, feed: &mut Feed, stop: &AtomicBool) -> bool {
    for root in &opts.paths {
        let Ok(root) = cairn_core::ops::backup::lexical_absolute(root) else {
            continue;
        };
        let Ok(md) = std::fs::symlink_metadata(&root) else {
            continue;
        };
        let device = md.dev();
        if !md.is_dir() {
            count(opts, &md, feed);
            continue;
        }
        let mut dirs = vec![root];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if stop.load(Ordering::Relaxed) {
                    return false;
                }
                let path = entry.path();
                if opts.excludes.matches(&path) {
                    continue;
                }
                // DirEntry::metadata does not follow symlinks, as backup's lstat.
                let Ok(md) = entry.metadata() else {
                    continue;
                };
                if md.is_dir() {
                    if !(opts.one_file_system && md.dev() != device) {
                        dirs.push(path);
                    }
                } else {
                    count(opts, &md, feed);
                }
            }
        }
    }
    true
}

fn count(opts: &ScanOptions, md: &Metadata, feed: &mut Feed) {
    if md.is_file() && opts.exclude_larger_than.is_none_or(|max| md.len() <= max) {
        feed.add(1, md.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::GlobalArgs;
    use crate::progress::Progress;

    fn quiet() -> GlobalArgs {
        GlobalArgs {
            repo: None,
            password_file: None,
            password_command: None,
            json: false,
            quiet: true,
            stats: false,
            no_cache: false,
            cache_dir: None,
            cacert: None,
        }
    }

    #[test]
    fn the_walk_counts_regular_files_and_leaves_out_excluded_ones() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("a/skip")).unwrap();
        std::fs::write(d.join("a/one"), b"12345").unwrap();
        std::fs::write(d.join("a/two.o"), b"123").unwrap();
        std::fs::write(d.join("a/skip/three"), b"1").unwrap();
        std::fs::write(d.join("big"), vec![0u8; 100]).unwrap();
        std::os::unix::fs::symlink("one", d.join("a/link")).unwrap();
        let progress = Progress::files(&quiet(), "backup");
        let opts = ScanOptions {
            paths: vec![d.to_path_buf()],
            excludes: Excludes::new(&["*.o".into(), "skip".into()]).unwrap(),
            one_file_system: false,
            exclude_larger_than: Some(50),
        };
        let mut feed = progress.feed();
        assert!(walk(&opts, &mut feed, &AtomicBool::new(false)));
        feed.complete();
        assert_eq!(progress.shared.totals(), Some((1, 5)));
    }

    #[test]
    fn a_stopped_walk_is_not_complete() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let progress = Progress::files(&quiet(), "backup");
        let opts = ScanOptions {
            paths: vec![dir.path().to_path_buf()],
            excludes: Excludes::new(&[]).unwrap(),
            one_file_system: false,
            exclude_larger_than: None,
        };
        assert!(!walk(&opts, &mut progress.feed(), &AtomicBool::new(true)));
    }
}

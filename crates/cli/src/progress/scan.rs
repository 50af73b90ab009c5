//! The backup's pre-scan: a thread that walks the backup paths ahead of the backup,
//! `lstat` only, and adds what it finds to the progress totals, so that the bar has an
//! end and an ETA. It leaves out what the backup leaves out, through the core's own
//! decision (`ExcludeOptions::why_excluded`: patterns, ignore files, tagged directories,
//! sizes, other filesystems), but it counts files as they are now, not as the backup reads
//! them, so it is an estimate. It never reads a file's contents (ignore files and tags
//! aside) and never reports a problem (the backup reports those).

use std::fs::{DirEntry, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cairn_core::ops::exclude::{ExcludeOptions, Excludes};
use cairn_core::ops::ignore_files::IgnoreStack;

use super::Feed;

/// What the walk leaves out, from the backup's own options.
pub struct ScanOptions {
    pub paths: Vec<PathBuf>,
    pub exclude: ExcludeOptions,
    pub excludes: Excludes,
    pub one_file_system: bool,
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
        // The walk recurses once per directory level, as the ignore files nest.
        .stack_size(16 << 20)
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
    let mut ignores = IgnoreStack::default();
    for root in &opts.paths {
        let Ok(root) = cairn_core::ops::backup::lexical_absolute(root) else {
            continue;
        };
        let Ok(md) = std::fs::symlink_metadata(&root) else {
            continue;
        };
        let excluded =
            (opts.exclude).why_excluded(&opts.excludes, &ignores, &root, &md, true, None);
        if excluded.is_some() {
            continue;
        }
        if !md.is_dir() {
            count(&md, feed);
            continue;
        }
        let device = opts.one_file_system.then_some(md.dev());
        if !walk_dir(opts, &root, device, &mut ignores, feed, stop) {
            return false;
        }
    }
    true
}

/// Counts what backup would take below `dir`; whether it went through to the end.
fn walk_dir(
    opts: &ScanOptions,
    dir: &Path,
    device: Option<u64>,
    ignores: &mut IgnoreStack,
    feed: &mut Feed,
    stop: &AtomicBool,
) -> bool {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return true;
    };
    let entries: Vec<DirEntry> = listing.flatten().collect();
    let present = |name: &std::ffi::OsStr| entries.iter().any(|e| e.file_name() == name);
    // A file that cannot be read or parsed: the backup reports it; count without it.
    let pushed = matches!(
        ignores.push_dir(dir, &opts.exclude.ignore_files, present),
        Ok((true, _))
    );
    let mut complete = true;
    for entry in &entries {
        if stop.load(Ordering::Relaxed) {
            complete = false;
            break;
        }
        let path = entry.path();
        // DirEntry::metadata does not follow symlinks, as backup's lstat.
        let Ok(md) = entry.metadata() else {
            continue;
        };
        let excluded =
            (opts.exclude).why_excluded(&opts.excludes, ignores, &path, &md, false, device);
        if excluded.is_some() {
            continue;
        }
        if md.is_dir() {
            if !walk_dir(opts, &path, device, ignores, feed, stop) {
                complete = false;
                break;
            }
        } else {
            count(&md, feed);
        }
    }
    if pushed {
        ignores.pop();
    }
    complete
}

fn count(md: &Metadata, feed: &mut Feed) {
    if md.is_file() {
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
            limit_upload: None,
            limit_download: None,
            nice: false,
        }
    }

    #[test]
    fn the_walk_counts_regular_files_and_leaves_out_what_backup_leaves_out() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("a/skip")).unwrap();
        std::fs::write(d.join("a/one"), b"12345").unwrap();
        std::fs::write(d.join("a/two.o"), b"123").unwrap();
        std::fs::write(d.join("a/skip/three"), b"1").unwrap();
        std::fs::write(d.join("big"), vec![0u8; 100]).unwrap();
        std::os::unix::fs::symlink("one", d.join("a/link")).unwrap();
        let progress = Progress::files(&quiet(), "backup");
        std::fs::create_dir_all(d.join("c/cache")).unwrap();
        std::fs::write(d.join("c/.cairnignore"), "*.tmp\n").unwrap();
        std::fs::write(d.join("c/x.tmp"), b"1234").unwrap();
        let mut tag = cairn_core::ops::ignore_files::CACHEDIR_SIGNATURE.to_vec();
        tag.extend_from_slice(b"\n");
        std::fs::write(d.join("c/cache/CACHEDIR.TAG"), tag).unwrap();
        std::fs::write(d.join("c/cache/blob"), b"12").unwrap();
        let exclude = ExcludeOptions {
            excludes: vec!["*.o".into(), "skip".into()],
            ignore_files: vec![".cairnignore".into()],
            exclude_caches: true,
            exclude_larger_than: Some(50),
            ..Default::default()
        };
        let opts = ScanOptions {
            paths: vec![d.to_path_buf()],
            excludes: Excludes::of(&exclude).unwrap(),
            exclude,
            one_file_system: false,
        };
        let mut feed = progress.feed();
        assert!(walk(&opts, &mut feed, &AtomicBool::new(false)));
        feed.complete();
        // a/one and c/.cairnignore: not the ignored x.tmp, nor anything in the cache.
        assert_eq!(progress.shared.totals(), Some((2, 5 + 6)));
    }

    #[test]
    fn a_stopped_walk_is_not_complete() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let progress = Progress::files(&quiet(), "backup");
        let opts = ScanOptions {
            paths: vec![dir.path().to_path_buf()],
            excludes: Excludes::new(&[]).unwrap(),
            exclude: ExcludeOptions::default(),
            one_file_system: false,
        };
        assert!(!walk(&opts, &mut progress.feed(), &AtomicBool::new(true)));
    }
}

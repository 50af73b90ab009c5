//! How operations report progress and problems that do not stop them, without knowing
//! whether a terminal, a JSON consumer or nobody is listening.

use std::path::Path;

use crate::ops::exclude::ExcludeReason;

/// What a backup did with a file, compared with the parent snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileChange {
    /// Not in the parent snapshot: read.
    New,
    /// In the parent snapshot with other metadata: read again.
    Changed,
    /// Metadata as in the parent snapshot: its content kept without reading.
    Unchanged,
}

pub trait Monitor: Sync {
    /// Something went wrong with one path; the operation skipped it and goes on. The
    /// operation also counts it in its report, so the exit code can say so.
    fn problem(&self, path: &Path, error: &dyn std::fmt::Display) {
        let _ = (path, error);
    }

    /// Reading of file `path` has begun: a file large enough to be chunked, which may
    /// take a while (small files are read in bundles and only reported done).
    fn file_started(&self, path: &Path) {
        let _ = path;
    }

    /// A file has been completely handled (`bytes` of content).
    fn file_done(&self, path: &Path, bytes: u64) {
        let _ = (path, bytes);
    }

    /// Backup has decided about regular file `path` (called once per file, after
    /// `file_done` for one that was read).
    fn file_change(&self, path: &Path, change: FileChange) {
        let _ = (path, change);
    }

    /// A walk of live files left `path` out, for `reason` (a directory is left out whole
    /// and nothing below it is reported).
    fn excluded(&self, path: &Path, reason: &ExcludeReason) {
        let _ = (path, reason);
    }

    /// `bytes` more of file content are handled: read (in steps as a large file streams
    /// through) or, for a file unchanged since the parent snapshot, reused all at once.
    /// Over a whole run the calls add up to the bytes of all files `file_done` reports.
    fn bytes_done(&self, bytes: u64) {
        let _ = bytes;
    }

    /// Whether the user asked to stop (Ctrl-C): long operations check this often and
    /// return `Error::Interrupted`, cleaning up on the way out.
    fn cancelled(&self) -> bool {
        false
    }

    /// `done` of `total` units of the phase named `what` are finished.
    fn progress(&self, what: &str, done: u64, total: u64) {
        let _ = (what, done, total);
    }
}

/// Listens to nothing.
pub struct NullMonitor;

impl Monitor for NullMonitor {}

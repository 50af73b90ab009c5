//! Counting requests to a remote store, by kind, so that `--stats` can show what a
//! command cost (object stores bill per request).

use std::sync::atomic::{AtomicU64, Ordering};

/// Requests issued so far, by kind.
#[derive(Debug, Default)]
pub struct RequestCounts {
    pub get: AtomicU64,
    pub put: AtomicU64,
    pub head: AtomicU64,
    pub list: AtomicU64,
    pub delete: AtomicU64,
    pub rename: AtomicU64,
    /// Bytes of file contents received and sent.
    pub bytes_received: AtomicU64,
    pub bytes_sent: AtomicU64,
}

impl RequestCounts {
    /// `(kind, count)` pairs of requests.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("get", self.get.load(Ordering::Relaxed)),
            ("put", self.put.load(Ordering::Relaxed)),
            ("head", self.head.load(Ordering::Relaxed)),
            ("list", self.list.load(Ordering::Relaxed)),
            ("delete", self.delete.load(Ordering::Relaxed)),
            ("rename", self.rename.load(Ordering::Relaxed)),
        ]
    }
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl RequestCounts {
    /// `(bytes received, bytes sent)` as file contents.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.bytes_received.load(Ordering::Relaxed),
            self.bytes_sent.load(Ordering::Relaxed),
        )
    }
}

pub(crate) fn add(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

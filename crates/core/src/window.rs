//! Reading a remote pack a window at a time: a blob read from an object store costs a
//! round trip, and the blobs a restore (or `cat`, `dump`, `mount`, `copy`) wants next
//! usually sit right after the one it wants now, because a backup writes them in the
//! order it reads files. So a blob read fetches the aligned window of the pack around it
//! and keeps the last few windows.
//!
//! Measured on the Linux 6.1 tree restored from Garage on loopback: one ranged GET per
//! blob took 78,705 requests and 437 s (bench/remote.sh); see docs/BENCHMARKS.md for the
//! figures with windows.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, OnceLock};

use crate::id::{BlobId, PackId};

/// Window size: large enough that a request carries many small blobs, small enough
/// that the few kept in memory stay cheap.
pub const WINDOW: u64 = 4 << 20;

/// Windows kept: enough for every file a restore writes at once to find its window.
const KEPT: usize = 8;

/// The most recently used windows of remote packs, shared by threads.
pub type PackWindows = Recent<(PackId, u64)>;

/// Decrypted blobs kept. Small files share bundles (see `ops::ingest`): the files of one
/// bundle are read one after the other, often by several restore threads at once, and
/// each would otherwise decrypt and decompress the whole bundle again.
const BLOBS_KEPT: usize = 16;

/// The most recently read plaintext blobs, shared by threads.
pub type RecentBlobs = Recent<BlobId>;

impl Default for PackWindows {
    fn default() -> Self {
        Recent::new(KEPT)
    }
}

impl Default for RecentBlobs {
    fn default() -> Self {
        Recent::new(BLOBS_KEPT)
    }
}

type Cell = Arc<OnceLock<Option<Arc<Vec<u8>>>>>;

/// The last few byte buffers fetched by key, each fetched once however many threads ask
/// for it at the same time.
pub struct Recent<K> {
    kept: usize,
    inner: Mutex<Inner<K>>,
}

struct Inner<K> {
    cells: HashMap<K, Cell>,
    order: VecDeque<K>,
}

impl<K: Copy + Eq + Hash> Recent<K> {
    pub fn new(kept: usize) -> Self {
        Recent {
            kept,
            inner: Mutex::new(Inner {
                cells: HashMap::new(),
                order: VecDeque::new(),
            }),
        }
    }

    /// The buffer of `key`, fetched with `fetch` by the first thread that asks (others
    /// wait for it). `None` if the fetch failed; the caller then reads what it needs
    /// directly and reports the error.
    pub fn get(&self, key: K, fetch: impl FnOnce() -> Option<Vec<u8>>) -> Option<Arc<Vec<u8>>> {
        let cell = {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(cell) = inner.cells.get(&key) {
                Arc::clone(cell)
            } else {
                let cell: Cell = Arc::default();
                inner.cells.insert(key, Arc::clone(&cell));
                inner.order.push_back(key);
                while inner.order.len() > self.kept {
                    if let Some(old) = inner.order.pop_front() {
                        inner.cells.remove(&old);
                    }
                }
                cell
            }
        };
        let window = cell.get_or_init(|| fetch().map(Arc::new)).clone();
        if window.is_none() {
            // Do not remember a failure: the next reader may succeed.
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            inner.cells.remove(&key);
            inner.order.retain(|k| *k != key);
        }
        window
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_window_is_fetched_once_while_kept() {
        let windows = PackWindows::default();
        let fetches = AtomicUsize::new(0);
        let fetch = || {
            fetches.fetch_add(1, Ordering::Relaxed);
            Some(vec![7u8; 10])
        };
        let pack = PackId([1; 32]);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| assert_eq!(windows.get((pack, 0), fetch).unwrap()[3], 7));
            }
        });
        assert_eq!(fetches.load(Ordering::Relaxed), 1);
        // Evicted after KEPT others.
        for i in 1..=KEPT as u64 {
            windows.get((pack, i * WINDOW), fetch);
        }
        windows.get((pack, 0), fetch);
        assert_eq!(fetches.load(Ordering::Relaxed), KEPT + 2);
    }

    #[test]
    fn failures_are_not_remembered() {
        let windows = PackWindows::default();
        let pack = PackId([2; 32]);
        assert!(windows.get((pack, 0), || None).is_none());
        assert!(windows.get((pack, 0), || Some(vec![1])).is_some());
    }
}

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

/// The window of a pack that holds a blob, and where the blob lies in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The window's first byte in the pack, a multiple of [`WINDOW`].
    pub start: u64,
    /// Bytes to read from `start`: up to [`WINDOW`], fewer at the pack's end.
    pub len: u64,
    /// The blob's bytes within the window.
    pub within: std::ops::Range<usize>,
}

/// The window holding the blob at `offset..offset + length` of a pack whose blobs end at
/// `pack_end`; `None` when the blob crosses a window boundary or is not inside
/// `0..pack_end` (the caller then reads it alone). Offsets, lengths and the pack end come
/// from index files, which a writer with the key may have made anything, so the sums
/// are done in `u64` where two `u32`s cannot overflow, and an end before the start is
/// refused rather than wrapped into a huge read.
pub fn span(offset: u32, length: u32, pack_end: u64) -> Option<Span> {
    let (offset, end) = (u64::from(offset), u64::from(offset) + u64::from(length));
    let start = offset / WINDOW * WINDOW;
    if end > start + WINDOW || end > pack_end {
        return None;
    }
    let window_end = (start + WINDOW).min(pack_end);
    Some(Span {
        start,
        len: window_end - start,
        within: (offset - start) as usize..(end - start) as usize,
    })
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
    fn a_blob_lies_inside_its_window_and_its_pack() {
        let s = span(10, 20, 100).unwrap();
        assert_eq!((s.start, s.len, s.within), (0, 100, 10..30));
        let w = WINDOW as u32;
        let s = span(w + 5, 5, 3 * WINDOW).unwrap();
        assert_eq!((s.start, s.len, s.within), (WINDOW, WINDOW, 5..10));
        assert_eq!(span(w - 1, 2, 3 * WINDOW), None, "crosses a window's end");
        assert_eq!(span(50, 60, 100), None, "ends past the pack");
        // An index entry whose offset + length passes u32::MAX: the u32 sum (as
        // repo.rs computed it) overflows; here it is a blob past the pack's end.
        assert_eq!(span(u32::MAX - 3, 16, 1 << 20), None);
        assert_eq!(span(u32::MAX, u32::MAX, u64::MAX), None);
    }

    #[test]
    fn failures_are_not_remembered() {
        let windows = PackWindows::default();
        let pack = PackId([2; 32]);
        assert!(windows.get((pack, 0), || None).is_none());
        assert!(windows.get((pack, 0), || Some(vec![1])).is_some());
    }
}

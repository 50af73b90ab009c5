//! Reading a pack a window at a time: a blob read from an object store costs a round
//! trip, and the blobs a restore (or `cat`, `dump`, `mount`, `copy`) wants next usually
//! sit right after the one it wants now, because a backup writes them in the order it
//! reads files. So a blob read fetches the aligned window of the pack around it and keeps
//! the last few windows.
//!
//! Measured on the Linux 6.1 tree restored from Garage on loopback: one ranged GET per
//! blob took 78,705 requests and 437 s (bench/remote.sh); see docs/BENCHMARKS.md for the
//! figures with windows.
//!
//! Locally a read costs a system call, not a round trip, but from format 4 on every read
//! of a pack is widened to its 64 KiB grid (`pack::grid_span`): a tree read alone reads
//! 64 KiB, and a restore's walk, which reads trees one at a time, read the same cells
//! over and over. Smaller windows ([`LOCAL_WINDOW`]) keep those.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use crate::id::{BlobId, PackId};

/// Window size on a remote store: large enough that a request carries many small blobs,
/// small enough that the few kept in memory stay cheap.
pub const WINDOW: u64 = 4 << 20;

/// Window size on a local store: the grid, which every read of a format 4 pack reads
/// anyway. Restoring the Linux 6.1 tree (`strace -f -e trace=pread64`, release builds):
/// 5,437 reads of 569.6 MB with no windows, 373 of 240.1 MB with these, 298 of
/// 235.8 MB with 256 KiB and 282 of 234.7 MB with 1 MiB (the repository is 207 MB;
/// most of the reads are the restore's own batched reads of data). Cold restore times
/// did not differ measurably.
pub const LOCAL_WINDOW: u64 = crate::pack::GRID;

/// Windows kept: enough for every file a restore writes at once to find its window.
const KEPT: usize = 8;

/// The most recently used windows of packs, shared by threads.
pub struct PackWindows {
    size: u64,
    recent: Recent<(PackId, u64)>,
}

impl PackWindows {
    /// Windows of [`WINDOW`] bytes, or of [`LOCAL_WINDOW`] on a local store.
    pub fn new(remote: bool) -> Self {
        PackWindows {
            size: if remote { WINDOW } else { LOCAL_WINDOW },
            recent: Recent::new(KEPT),
        }
    }

    /// The bytes at `offset..offset + length` of `pack`, whose blobs end at `pack_end`,
    /// from the windows around them: each window not kept is fetched with
    /// `fetch(start, len)`. A blob that crosses into the next window takes both (a reader
    /// that goes on to the next blobs needs that window next). `None` when the bytes
    /// span more than two windows or are not inside the pack's blobs, or a fetch failed:
    /// the caller then reads them alone, and reports any error.
    pub fn read(
        &self,
        pack: PackId,
        offset: u32,
        length: u32,
        pack_end: u64,
        fetch: impl Fn(u64, u64) -> Option<Vec<u8>>,
    ) -> Option<Vec<u8>> {
        let blob = span(offset, length, pack_end, self.size)?;
        let mut out = Vec::with_capacity(length as usize);
        let mut start = blob.start / self.size * self.size;
        while start < blob.end {
            let len = self.size.min(pack_end - start);
            let window = self.recent.get((pack, start), || fetch(start, len))?;
            let within = blob.start.max(start) - start..blob.end.min(start + len) - start;
            out.extend_from_slice(window.get(within.start as usize..within.end as usize)?);
            start += self.size;
        }
        Some(out)
    }
}

/// Decrypted blobs kept. Small files share bundles (see `ops::ingest`): the files of one
/// bundle are read one after the other, often by several restore threads at once, and
/// each would otherwise decrypt and decompress the whole bundle again.
const BLOBS_KEPT: usize = 16;

/// The most recently read plaintext blobs, shared by threads.
pub type RecentBlobs = Recent<BlobId>;

impl Default for RecentBlobs {
    fn default() -> Self {
        Recent::new(BLOBS_KEPT)
    }
}

/// The bytes of the blob at `offset..offset + length` of a pack whose blobs end at
/// `pack_end`, if they lie in one window of `window` bytes or two neighbouring ones and
/// inside `0..pack_end`. Offsets, lengths and the pack end come from index files, which
/// a writer with the key may have made anything, so the sums are done in `u64` where
/// two `u32`s cannot overflow, and an end before the start is refused rather than
/// wrapped into a huge read.
pub fn span(offset: u32, length: u32, pack_end: u64, window: u64) -> Option<Range<u64>> {
    let (offset, end) = (u64::from(offset), u64::from(offset) + u64::from(length));
    if end > offset / window * window + 2 * window || end > pack_end {
        return None;
    }
    Some(offset..end)
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
        let windows = PackWindows::new(true);
        let fetches = AtomicUsize::new(0);
        let fetch = || {
            fetches.fetch_add(1, Ordering::Relaxed);
            Some(vec![7u8; 10])
        };
        let pack = PackId([1; 32]);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| assert_eq!(windows.recent.get((pack, 0), fetch).unwrap()[3], 7));
            }
        });
        assert_eq!(fetches.load(Ordering::Relaxed), 1);
        // Evicted after KEPT others.
        for i in 1..=KEPT as u64 {
            windows.recent.get((pack, i * WINDOW), fetch);
        }
        windows.recent.get((pack, 0), fetch);
        assert_eq!(fetches.load(Ordering::Relaxed), KEPT + 2);
    }

    #[test]
    fn a_blob_lies_inside_one_or_two_windows_and_its_pack() {
        for window in [WINDOW, LOCAL_WINDOW] {
            let w = window as u32;
            assert_eq!(span(10, 20, 100, window), Some(10..30));
            let second = span(w + 5, 5, 3 * window, window);
            assert_eq!(second, Some(window + 5..window + 10));
            let crossing = span(w - 1, 2, 3 * window, window);
            assert_eq!(
                crossing,
                Some(window - 1..window + 1),
                "into the next window"
            );
            assert_eq!(
                span(w - 1, w + 2, 4 * window, window),
                None,
                "three windows"
            );
            assert_eq!(span(50, 60, 100, window), None, "ends past the pack");
            // An index entry whose offset + length passes u32::MAX: the u32 sum (as
            // repo.rs computed it) overflows; here it is a blob past the pack's end.
            assert_eq!(span(u32::MAX - 3, 16, 1 << 20, window), None);
            assert_eq!(span(u32::MAX, u32::MAX, u64::MAX, window), None);
        }
    }

    #[test]
    fn a_blob_across_two_windows_is_read_from_both_and_each_is_kept() {
        let windows = PackWindows::new(false);
        let pack = PackId([3; 32]);
        let bytes: Vec<u8> = (0..3 * LOCAL_WINDOW).map(|i| (i % 251) as u8).collect();
        let fetched = Mutex::new(Vec::new());
        let fetch = |start: u64, len: u64| {
            fetched.lock().unwrap().push((start, len));
            Some(bytes[start as usize..(start + len) as usize].to_vec())
        };
        let end = bytes.len() as u64 - 10;
        let (w, at) = (LOCAL_WINDOW as u32, LOCAL_WINDOW as usize);
        let got = windows.read(pack, w - 3, 7, end, fetch).unwrap();
        assert_eq!(got, &bytes[at - 3..at + 4]);
        let got = windows.read(pack, w + 100, 50, end, fetch).unwrap();
        assert_eq!(got, &bytes[at + 100..at + 150]);
        // The last window ends where the pack's blobs do.
        let got = windows.read(pack, 2 * w + 1, w - 11, end, fetch).unwrap();
        assert_eq!(got, &bytes[2 * at + 1..end as usize]);
        let fetched = fetched.lock().unwrap();
        let last = (2 * LOCAL_WINDOW, LOCAL_WINDOW - 10);
        let all = [(0, LOCAL_WINDOW), (LOCAL_WINDOW, LOCAL_WINDOW), last];
        assert_eq!(*fetched, all);
    }

    #[test]
    fn failures_are_not_remembered() {
        let windows = PackWindows::new(true);
        let pack = PackId([2; 32]);
        assert!(windows.recent.get((pack, 0), || None).is_none());
        assert!(windows.recent.get((pack, 0), || Some(vec![1])).is_some());
    }
}

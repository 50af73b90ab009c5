//! `--limit-upload` and `--limit-download`: a store that passes each call to another one
//! no faster than a given number of bytes a second, counted over every thread.
//!
//! Each direction has a schedule (a token bucket with no burst): a transfer of n bytes
//! takes the next n/rate seconds of it. An upload waits until its share has passed
//! before it starts; a download's size is known (`read_range`) or learnt when it is done
//! (`read`), and the caller waits until its share has passed before it gets the bytes.
//! So from the first call, moving B bytes takes at least B/rate seconds, whatever the
//! number of concurrent requests, and an idle period earns no burst. Objects are sent
//! whole, so a 16 MiB pack at 1 MiB/s is one request after a 16 s wait, not a trickle:
//! the average is what is limited, which is what sharing a link needs.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::{RequestCounts, Result, Storage};

/// Bytes per second for each direction; `None`: unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimits {
    pub upload: Option<u64>,
    pub download: Option<u64>,
}

impl RateLimits {
    pub fn is_empty(&self) -> bool {
        self.upload.is_none() && self.download.is_none()
    }
}

/// One direction's schedule.
#[derive(Debug)]
struct Schedule {
    bytes_per_sec: u64,
    /// When the transfers taken so far have had their time.
    free_at: Mutex<Option<Instant>>,
}

impl Schedule {
    fn new(bytes_per_sec: u64) -> Schedule {
        Schedule {
            bytes_per_sec: bytes_per_sec.max(1),
            free_at: Mutex::new(None),
        }
    }

    /// Takes the time of `bytes` and waits until it has passed.
    fn take(&self, bytes: u64) {
        let cost = Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec as f64);
        let until = {
            let mut free_at = self.free_at.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let start = free_at.map_or(now, |t| t.max(now));
            let until = start + cost;
            *free_at = Some(until);
            until
        };
        let now = Instant::now();
        if until > now {
            std::thread::sleep(until - now);
        }
    }
}

/// A store whose transfers are held to [`RateLimits`].
#[derive(Debug)]
pub struct Limited {
    inner: Arc<dyn Storage>,
    upload: Option<Schedule>,
    download: Option<Schedule>,
}

impl Limited {
    /// `inner` as it is when `limits` is empty.
    pub fn wrap(inner: Arc<dyn Storage>, limits: RateLimits) -> Arc<dyn Storage> {
        if limits.is_empty() {
            return inner;
        }
        Arc::new(Limited {
            inner,
            upload: limits.upload.map(Schedule::new),
            download: limits.download.map(Schedule::new),
        })
    }

    fn downloaded(&self, bytes: u64) {
        if let Some(s) = &self.download {
            s.take(bytes);
        }
    }
}

impl Storage for Limited {
    fn location(&self) -> String {
        self.inner.location()
    }

    fn read(&self, name: &str) -> Result<Vec<u8>> {
        let data = self.inner.read(name)?;
        self.downloaded(data.len() as u64);
        Ok(data)
    }

    fn read_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.downloaded(len);
        self.inner.read_range(name, offset, len)
    }

    fn read_range_into(&self, name: &str, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<()> {
        self.downloaded(len);
        self.inner.read_range_into(name, offset, len, buf)
    }

    fn uncache(&self, name: &str, offset: u64, len: u64) {
        self.inner.uncache(name, offset, len)
    }

    fn write(&self, name: &str, data: &[u8]) -> Result<()> {
        if let Some(s) = &self.upload {
            s.take(data.len() as u64);
        }
        self.inner.write(name, data)
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        self.inner.list(dir)
    }

    fn list_modified(&self, dir: &str) -> Result<Vec<(String, SystemTime)>> {
        self.inner.list_modified(dir)
    }

    fn temporaries(&self) -> Result<Vec<(String, SystemTime)>> {
        self.inner.temporaries()
    }

    fn delete_temporary(&self, name: &str) -> Result<()> {
        self.inner.delete_temporary(name)
    }

    fn size(&self, name: &str) -> Result<u64> {
        self.inner.size(name)
    }

    fn exists(&self, name: &str) -> Result<bool> {
        self.inner.exists(name)
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.inner.delete(name)
    }

    fn delete_unsynced(&self, name: &str) -> Result<()> {
        self.inner.delete_unsynced(name)
    }

    fn request_counts(&self) -> Option<Arc<RequestCounts>> {
        self.inner.request_counts()
    }

    fn is_remote(&self) -> bool {
        self.inner.is_remote()
    }

    fn create_is_exclusive(&self) -> bool {
        self.inner.create_is_exclusive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_spreads_transfers_over_their_time_across_threads() {
        // 4 threads × 5 transfers × 1,000 bytes at 100,000 B/s: at least 0.2 s.
        let s = Arc::new(Schedule::new(100_000));
        let started = Instant::now();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = Arc::clone(&s);
                std::thread::spawn(move || (0..5).for_each(|_| s.take(1_000)))
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(started.elapsed() >= Duration::from_millis(200));
    }

    #[test]
    fn a_limited_store_passes_the_storage_suite() {
        let dir = tempfile::tempdir().unwrap();
        let inner: Arc<dyn Storage> = Arc::new(crate::LocalStorage::new(dir.path().join("r")));
        let limits = RateLimits {
            upload: Some(1 << 30),
            download: Some(1 << 30),
        };
        crate::testsuite::run_all(Limited::wrap(inner, limits).as_ref());
    }

    #[test]
    fn no_limits_leave_the_store_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let inner: Arc<dyn Storage> = Arc::new(crate::LocalStorage::new(dir.path()));
        let same = Limited::wrap(Arc::clone(&inner), RateLimits::default());
        assert!(Arc::ptr_eq(&inner, &same));
    }
}

//! Source files read once, front to back, without filling the page cache with them.
//!
//! A backup reads each new or changed file once and does not read it again. Left in the
//! page cache, those pages push out what the machine is using, and a backup that reads
//! a gigabyte takes a gigabyte of fresh pages. Like borg's chunker, a [`ReadOnce`] drops
//! the pages behind it as it reads (`POSIX_FADV_DONTNEED`), so the few megabytes it needs
//! are freed and taken again. Unlike borg, it does so only for a file none of which was
//! cached when it was opened (`cachestat(2)`, Linux 6.5 and later): a file someone is
//! using, or has just written, stays cached. Where that cannot be known, the pages are
//! left alone, as before.
//!
//! Cold first backups of the mixed corpus, started 3 s after dropping the cache as
//! `bench/compare.sh` does (this VM has given the freed memory back to its host by then,
//! so every fresh page faults there), eight runs each in turns: median 2.305 → 2.205 s
//! wall, 3.29 → 3.15 CPU s (docs/BENCHMARKS.md). Small files (bundled) are left alone:
//! the Linux tree's first backup showed no difference, and each would cost two more
//! system calls.

use std::fs::File;
use std::io::{self, Read};

use cairn_storage::pagecache::{cached_pages, drop_pages};

/// Bytes read between two requests to drop pages, and the alignment of those requests.
const STEP: u64 = 4 << 20;

/// A file read front to back, its pages dropped behind the reader if none of it was
/// cached when it was opened.
///
/// ```no_run
/// use std::io::Read;
/// use cairn_core::ops::read_once::ReadOnce;
///
/// let mut file = ReadOnce::new(std::fs::File::open("/var/backups/dump.tar")?);
/// let mut bytes = Vec::new();
/// file.read_to_end(&mut bytes)?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct ReadOnce {
    file: File,
    /// `None` when the file's pages are left alone.
    behind: Option<Behind>,
}

/// How far a file has been read, and up to where its pages have been dropped.
#[derive(Debug)]
struct Behind {
    read: u64,
    dropped: u64,
}

impl ReadOnce {
    /// Reads `file`, just opened, from its start. Asks the kernel once whether any of it
    /// is cached.
    pub fn new(file: File) -> ReadOnce {
        let behind = (cached_pages(&file, 0, 0) == Some(0)).then_some(Behind {
            read: 0,
            dropped: 0,
        });
        ReadOnce { file, behind }
    }
}

impl Read for ReadOnce {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read(buf)?;
        if let Some(behind) = &mut self.behind {
            behind.read += n as u64;
            // Up to a multiple of the step: the kernel keeps a page, or a large folio
            // (up to 2 MiB), that a range covers in part.
            let end = behind.read - behind.read % STEP;
            if end > behind.dropped {
                drop_pages(&self.file, behind.dropped, end - behind.dropped);
                behind.dropped = end;
            }
        }
        Ok(n)
    }
}

impl Drop for ReadOnce {
    fn drop(&mut self) {
        if let Some(behind) = &self.behind {
            // Up to the end (a length of 0): the last page, and what readahead brought
            // in beyond where the reading stopped.
            drop_pages(&self.file, behind.dropped, 0);
        }
    }
}

#[cfg(test)]
#[path = "read_once_tests.rs"]
mod tests;

//! The streaming loop: one buffer, refilled in large reads, chunks handed out as borrows.
//!
//! Cut points must not depend on how the reader splits its data, or the same file would
//! chunk differently from a pipe and from disk and stop deduplicating. fastcdc's cut
//! function looks at most `max_size` bytes ahead, so the loop only asks for a cut when at
//! least `max_size` bytes are buffered or the reader is exhausted; [`chunk_slice`] runs
//! the same function over a whole slice, and the two always agree.

use std::fmt;
use std::io::{self, Read};
use std::sync::Arc;

use fastcdc::v2020::get_gear_with_seed;

use crate::cut::Cutter;
use crate::ChunkerParams;

/// Smallest full-grown buffer, so that small chunk sizes still read in large blocks.
const MIN_BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// A new buffer starts this small and doubles as the stream proves longer. Allocating
/// (and zeroing) the full 16 MiB for each of the 78,000 mostly small files of the Linux
/// tree cost 120 s of memset; see also [`Chunker::with_buffer`].
const INITIAL_BUFFER_BYTES: usize = 64 * 1024;

/// One chunk of the stream, borrowed from the chunker's buffer until the next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk<'a> {
    /// Offset of the chunk's first byte in the stream.
    pub offset: u64,
    /// The chunk's bytes.
    pub data: &'a [u8],
}

/// The gear table of the rolling hash: which byte values push a cut point where. A
/// repository keys it, so chunk boundaries do not show which known files it holds.
///
/// ```
/// use cairn_chunker::Gear;
///
/// // Format 1: fastcdc's public table XORed with a 64-bit seed (0 is the plain table).
/// let seeded = Gear::from(0x5eed_u64);
/// // Format 2: a whole table from a keyed PRF (the caller derives it; this crate does
/// // no cryptography).
/// let keyed = Gear::from_table([7; 256]);
/// assert_ne!(seeded, keyed);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Gear {
    pub(crate) gear: Arc<[u64; 256]>,
    pub(crate) gear_ls: Arc<[u64; 256]>,
}

impl Gear {
    /// A table given whole, for example from a keyed PRF. FastCDC 2020 also needs the
    /// table shifted left by one bit; it is derived here.
    pub fn from_table(table: [u64; 256]) -> Self {
        let shifted = table.map(|v| v << 1);
        Gear {
            gear: Arc::new(table),
            gear_ls: Arc::new(shifted),
        }
    }
}

impl From<u64> for Gear {
    /// fastcdc's table with `seed` XORed into every entry (`get_gear_with_seed`). Only
    /// 48 of the seed's bits move cut points, and the table is public: format 1 only.
    fn from(seed: u64) -> Self {
        let (gear, gear_ls) = get_gear_with_seed(seed);
        Gear {
            gear: Arc::new(*gear),
            gear_ls: Arc::new(*gear_ls),
        }
    }
}

impl fmt::Debug for Gear {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The table is derived from a repository secret.
        f.write_str("Gear(..)")
    }
}

/// Streams chunks out of any reader with one reusable buffer.
pub struct Chunker<R> {
    reader: R,
    cutter: Cutter,
    /// `buf[start..end]` holds read but not yet chunked bytes; grows up to `capacity`.
    buf: Vec<u8>,
    capacity: usize,
    start: usize,
    end: usize,
    /// The chunk at `start` holds no cut point before this offset: the search for its end
    /// resumes there after a refill instead of hashing the chunk again.
    scanned: usize,
    eof: bool,
    position: u64,
}

impl<R: Read> Chunker<R> {
    /// `gear` keys the chunk boundaries ([`Gear`]; `0_u64.into()` is the plain FastCDC
    /// table).
    ///
    /// The buffer grows as needed to 4 MiB, and past it to `max_size` only while a
    /// chunk needs it: reader threads each hold one (16 MiB each, when it was always
    /// twice `max_size`, were a third of a backup's peak RSS).
    ///
    /// # Panics
    ///
    /// If `params` holds sizes that [`ChunkerParams::new`] rejects.
    pub fn new(reader: R, params: ChunkerParams, gear: impl Into<Gear>) -> Self {
        Self::with_buffer(reader, params, gear, Vec::new())
    }

    /// As [`new`](Self::new), reusing the allocation of a buffer from
    /// [`into_buffer`](Chunker::into_buffer), so that chunking many files allocates once.
    pub fn with_buffer(
        reader: R,
        params: ChunkerParams,
        gear: impl Into<Gear>,
        mut buffer: Vec<u8>,
    ) -> Self {
        let cutter = Cutter::new(params, gear.into());
        let capacity = cutter.max_size.max(MIN_BUFFER_BYTES);
        if buffer.len() < INITIAL_BUFFER_BYTES.min(capacity) {
            buffer.resize(INITIAL_BUFFER_BYTES.min(capacity), 0);
        }
        buffer.truncate(capacity);
        Chunker {
            reader,
            cutter,
            buf: buffer,
            capacity,
            start: 0,
            end: 0,
            scanned: 0,
            eof: false,
            position: 0,
        }
    }

    /// The next chunk, borrowed from the internal buffer; `Ok(None)` at end of input.
    ///
    /// Retries reads interrupted by a signal (`ErrorKind::Interrupted`). After any other
    /// read error, bytes read before it are kept, so calling again resumes the stream.
    pub fn next_chunk(&mut self) -> io::Result<Option<Chunk<'_>>> {
        let len = loop {
            let pending = self.end - self.start;
            if pending == 0 && self.eof {
                return Ok(None);
            }
            if pending > 0 {
                // A boundary depends only on the bytes before it: one found before the
                // end of what was read is final, and so is a cut at `max_size` or at the
                // end of the stream. Otherwise the chunk may go on: read more.
                let cut = self
                    .cutter
                    .cut(&self.buf[self.start..self.end], self.scanned);
                if cut.len < pending || cut.len >= self.cutter.max_size || self.eof {
                    self.scanned = 0;
                    break cut.len;
                }
                self.scanned = cut.scanned;
            }
            self.refill()?;
        };
        let begin = self.start;
        let offset = self.position;
        self.start += len;
        self.position += len as u64;
        Ok(Some(Chunk {
            offset,
            data: &self.buf[begin..begin + len],
        }))
    }

    /// Moves the unchunked tail (a chunk not yet ended, less than `max_size` bytes) to
    /// the front, then reads until the buffer is full or the reader is exhausted. The
    /// buffer grows (doubling) while it is full of the tail, or is still small, up to
    /// `capacity`: past [`MIN_BUFFER_BYTES`] only for a chunk that long.
    fn refill(&mut self) -> io::Result<()> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let mut grow = self.end == self.buf.len();
        loop {
            if self.end == self.buf.len() {
                let full_size = self.buf.len() >= MIN_BUFFER_BYTES.min(self.capacity);
                if self.buf.len() >= self.capacity || (full_size && !grow) {
                    break;
                }
                grow = false;
                let grown = (self.buf.len() * 2).min(self.capacity);
                self.buf.resize(grown, 0);
            }
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => self.end += n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }
}

impl<R> Chunker<R> {
    /// Bytes consumed into chunks so far, which is the offset of the next chunk.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Gives the buffer back for [`Chunker::with_buffer`].
    pub fn into_buffer(self) -> Vec<u8> {
        self.buf
    }

    /// Gives the reader back. Bytes already read from it but not yet returned as chunks
    /// are lost.
    pub fn into_inner(self) -> R {
        self.reader
    }
}

impl<R: fmt::Debug> fmt::Debug for Chunker<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunker")
            .field("reader", &self.reader)
            .field("min_size", &self.cutter.min_size)
            .field("avg_size", &self.cutter.avg_size)
            .field("max_size", &self.cutter.max_size)
            .field("buffered", &(self.end - self.start))
            .field("eof", &self.eof)
            .field("position", &self.position)
            .finish_non_exhaustive()
    }
}

/// Cut points of an in-memory slice as `(offset, length)` pairs; the same as what
/// [`Chunker`] yields for the same bytes, params and gear.
///
/// # Panics
///
/// If `params` holds sizes that [`ChunkerParams::new`] rejects.
pub fn chunk_slice(
    data: &[u8],
    params: ChunkerParams,
    gear: impl Into<Gear>,
) -> Vec<(usize, usize)> {
    let cutter = Cutter::new(params, gear.into());
    let mut cuts = Vec::with_capacity(data.len() / cutter.avg_size + 1);
    let mut offset = 0;
    while offset < data.len() {
        let len = cutter.cut(&data[offset..], 0).len;
        cuts.push((offset, len));
        offset += len;
    }
    cuts
}

#[cfg(test)]
#[path = "chunker_tests.rs"]
mod tests;

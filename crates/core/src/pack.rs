//! Pack files: many sealed blobs followed by a sealed header that lists them, so that the
//! index can always be rebuilt from the packs alone.
//!
//! ```text
//! pack   := blob* filler header header_len:u32le
//! blob   := seal(codec_tag || compressed bytes)      as Purpose::{Data,Tree}Blob(id)
//! filler := random bytes that make the pack a multiple of GRID (format 4 on; else none)
//! header := seal(postcard(PackHeader))                as Purpose::PackHeader
//! ```
//!
//! From format 4 a blob is sealed at its exact size and the pack hides it: the pack's
//! size is a multiple of [`GRID`], and every read of a pack is widened to the grid
//! ([`grid_span`]), so neither a pack's size nor the ranges read from it show where a
//! blob begins or ends closer than 64 KiB. The filler is not authenticated by the AEAD,
//! nothing reads it, and the pack's id (the hash of all its bytes) covers it.
//!
//! A pack is built in memory and written in one go ([`PackWriter`]), or written to a
//! temporary object as it fills and named when whole ([`StreamedPack`]): either way no
//! reader ever sees half of one.

use cairn_storage::{StorageError, UnnamedWrite};
use serde::{Deserialize, Serialize};

use rand::RngCore;

use crate::crypto::{MasterKey, Purpose, GRID_FORMAT, SEAL_OVERHEAD};
use crate::id::{BlobId, PackId};

/// What a blob holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlobKind {
    Data,
    Tree,
}

impl BlobKind {
    /// What a blob of this kind and id is sealed as.
    pub fn purpose(self, id: BlobId) -> Purpose {
        match self {
            BlobKind::Data => Purpose::DataBlob(id),
            BlobKind::Tree => Purpose::TreeBlob(id),
        }
    }
}

/// Where a blob sits in its pack, as recorded in the pack header and in index files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackEntry {
    pub id: BlobId,
    pub kind: BlobKind,
    pub offset: u32,
    /// Stored (sealed) length.
    pub length: u32,
    /// Plaintext length after decompression.
    pub raw_length: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct PackHeader {
    version: u32,
    entries: Vec<PackEntry>,
}

const PACK_VERSION: u32 = 1;

/// From format 4, packs are a multiple of this size and reads of them are widened to it.
pub const GRID: u64 = 64 << 10;

/// The range to read from a pack to get `len` bytes at `start`: under `key`'s format 4
/// on, widened to the [`GRID`] at both ends (a pack's size is on the grid, so the range
/// stays inside it); before, the range itself. The wanted bytes start `start - from` bytes
/// into the wider one.
///
/// ```
/// # use cairn_core::pack::{grid_span, GRID};
/// # let key = cairn_core::crypto::MasterKey::generate_for(4);
/// assert_eq!(grid_span(&key, GRID + 10, 100), (GRID, GRID));
/// assert_eq!(grid_span(&key, 10, GRID), (0, 2 * GRID));
/// ```
pub fn grid_span(key: &MasterKey, start: u64, len: u64) -> (u64, u64) {
    if key.format() < GRID_FORMAT {
        return (start, len);
    }
    let from = start - start % GRID;
    let end = (start + len).next_multiple_of(GRID);
    (from, end - from)
}

/// Collects sealed blobs for one pack.
#[derive(Default)]
pub struct PackWriter {
    buf: Vec<u8>,
    entries: Vec<PackEntry>,
}

impl PackWriter {
    pub fn new(capacity: usize) -> Self {
        PackWriter {
            buf: Vec::with_capacity(capacity),
            entries: Vec::new(),
        }
    }

    /// A writer filling `buf` (emptied first), to reuse the buffer of a stored pack.
    pub fn with_buffer(mut buf: Vec<u8>) -> Self {
        buf.clear();
        PackWriter {
            buf,
            entries: Vec::new(),
        }
    }

    /// Appends a blob that is already compressed and sealed, and gives back its buffer
    /// once copied. A blob that starts a pack and would not fit its buffer becomes the
    /// buffer (a large tree is not copied again).
    pub fn add(
        &mut self,
        id: BlobId,
        kind: BlobKind,
        sealed: Vec<u8>,
        raw_length: u32,
    ) -> Option<Vec<u8>> {
        self.entries.push(PackEntry {
            id,
            kind,
            offset: self.buf.len() as u32,
            length: sealed.len() as u32,
            raw_length,
        });
        if self.buf.is_empty() && sealed.len() > self.buf.capacity() {
            self.buf = sealed;
            None
        } else {
            self.buf.extend_from_slice(&sealed);
            Some(sealed)
        }
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends the sealed header and returns the finished pack, its id and its entries.
    pub fn finish(mut self, key: &MasterKey) -> (PackId, Vec<u8>, Vec<PackEntry>) {
        let end = end_of_pack(key, &self.entries, self.buf.len() as u64);
        self.buf.extend_from_slice(&end);
        let id = PackId::of_bytes(&self.buf);
        (id, self.buf, self.entries)
    }
}

/// What is wrong with a pack of `total` bytes under `key`'s format, if that size cannot
/// be one of its packs (format 4 on: not on the [`GRID`]).
pub fn off_grid(key: &MasterKey, total: u64) -> Option<String> {
    (key.format() >= GRID_FORMAT && !total.is_multiple_of(GRID)).then(|| {
        format!("{total} bytes long, not a multiple of 64 KiB as every pack of format {} is (truncated?)", key.format())
    })
}

/// What follows `body_len` bytes of blobs in a pack holding `entries`: the filler, the
/// sealed header and its length.
fn end_of_pack(key: &MasterKey, entries: &[PackEntry], body_len: u64) -> Vec<u8> {
    let header = PackHeader {
        version: PACK_VERSION,
        entries: entries.to_vec(),
    };
    let plain = postcard::to_stdvec(&header).expect("a pack header serializes");
    // Format 2 pads the header, so its length does not give away the blob count.
    let header = key.seal(Purpose::PackHeader, &plain);
    let filler = filler_len(key, body_len + header.len() as u64 + 4);
    let mut end = vec![0; filler as usize];
    rand::rngs::OsRng.fill_bytes(&mut end);
    end.extend_from_slice(&header);
    end.extend_from_slice(&(header.len() as u32).to_le_bytes());
    end
}

/// The filler a pack of `len` bytes without it needs: up to the next multiple of [`GRID`]
/// from format 4; none before.
fn filler_len(key: &MasterKey, len: u64) -> u64 {
    if key.format() < GRID_FORMAT {
        return 0;
    }
    len.next_multiple_of(GRID) - len
}

/// A pack written to storage as it fills ([`Storage::begin_unnamed_write`]), where a
/// [`PackWriter`] holds the whole pack in memory: each blob goes to the object as it
/// comes, and the pack's id, the hash of all its bytes, is known once the header is
/// appended. Dropped before [`UnnamedWrite::commit_as`], nothing is left of it.
pub struct StreamedPack {
    out: Box<dyn UnnamedWrite>,
    hasher: blake3::Hasher,
    len: u64,
    entries: Vec<PackEntry>,
}

impl StreamedPack {
    pub fn new(out: Box<dyn UnnamedWrite>) -> Self {
        StreamedPack {
            out,
            hasher: blake3::Hasher::new(),
            len: 0,
            entries: Vec::new(),
        }
    }

    /// Appends a blob that is already compressed and sealed.
    pub fn add(
        &mut self,
        id: BlobId,
        kind: BlobKind,
        sealed: &[u8],
        raw_length: u32,
    ) -> Result<(), StorageError> {
        self.out.write_all(sealed)?;
        self.hasher.update(sealed);
        self.entries.push(PackEntry {
            id,
            kind,
            offset: self.len as u32,
            length: sealed.len() as u32,
            raw_length,
        });
        self.len += sealed.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.len
    }

    /// Appends the sealed header.
    pub fn finish(mut self, key: &MasterKey) -> Result<FinishedPack, StorageError> {
        let end = end_of_pack(key, &self.entries, self.len);
        self.out.write_all(&end)?;
        self.hasher.update(&end);
        Ok(FinishedPack {
            id: PackId(*self.hasher.finalize().as_bytes()),
            object: self.out,
            len: self.len + end.len() as u64,
            entries: self.entries,
        })
    }
}

/// A [`StreamedPack`] written whole.
pub struct FinishedPack {
    pub id: PackId,
    /// Written, not yet named: the caller commits it under the id's name.
    pub object: Box<dyn UnnamedWrite>,
    /// Its size in bytes.
    pub len: u64,
    pub entries: Vec<PackEntry>,
}

/// Size of the whole pack file that holds exactly `entries` (in any order): the blobs,
/// the filler, the sealed header listing them, and its 4-byte length. Lets `stats` sum
/// pack sizes from the index, without asking storage for each file's size.
pub fn file_size(key: &MasterKey, entries: &[PackEntry]) -> u64 {
    let body = entries
        .iter()
        .map(|e| e.offset as u64 + e.length as u64)
        .max()
        .unwrap_or(0);
    let header = PackHeader {
        version: PACK_VERSION,
        entries: entries.to_vec(),
    };
    let plain = postcard::to_stdvec(&header).expect("a pack header serializes");
    let len = body + key.sealed_len(plain.len()) as u64 + 4;
    len + filler_len(key, len)
}

/// Length of the sealed header, from the last 4 bytes of a pack.
pub fn header_length(trailer: [u8; 4]) -> u64 {
    u32::from_le_bytes(trailer) as u64
}

/// Opens a sealed header of a pack whose blobs take `body_len` bytes.
pub fn open_header(
    key: &MasterKey,
    sealed: &[u8],
    body_len: u64,
) -> Result<Vec<PackEntry>, String> {
    let plain = key
        .open(Purpose::PackHeader, sealed)
        .map_err(|e| format!("header: {e}"))?;
    let header: PackHeader =
        postcard::from_bytes(&plain).map_err(|e| format!("header does not parse: {e}"))?;
    if header.version != PACK_VERSION {
        return Err(format!("unknown pack version {}", header.version));
    }
    for e in &header.entries {
        if e.offset as u64 + e.length as u64 > body_len {
            return Err(format!("blob {} lies outside the pack body", e.id));
        }
    }
    Ok(header.entries)
}

/// Where the sealed header sits in a pack of `total` bytes with the given trailer.
pub fn header_range(total: u64, trailer: [u8; 4]) -> Result<(u64, u64), String> {
    let len = header_length(trailer);
    if total < 4 || len < SEAL_OVERHEAD as u64 || len > total - 4 {
        return Err(format!(
            "header length {len} does not fit in {total} bytes (truncated?)"
        ));
    }
    Ok((total - 4 - len, len))
}

/// Whether the blob `entry` places in a whole pack decrypts, decompresses to its
/// `raw_length` bytes and hashes to its id.
pub fn verify_blob(key: &MasterKey, pack: &[u8], entry: &PackEntry) -> bool {
    let (offset, length) = (entry.offset as usize, entry.length as usize);
    pack.get(offset..offset + length)
        .and_then(|sealed| key.open(entry.kind.purpose(entry.id), sealed).ok())
        .and_then(|tagged| crate::compress::decompress(&tagged, entry.raw_length as usize).ok())
        .is_some_and(|plain| key.blob_id(&plain) == entry.id)
}

/// Whether a writer sealed the whole pack file `pack` (format 3), by its header.
pub fn sealed_by_writer(key: &MasterKey, pack: &[u8]) -> bool {
    let total = pack.len();
    let Some(trailer) = total.checked_sub(4).map(|at| &pack[at..]) else {
        return false;
    };
    let trailer: [u8; 4] = trailer.try_into().expect("4 bytes");
    header_range(total as u64, trailer)
        .is_ok_and(|(start, _)| key.sealed_by_writer(&pack[start as usize..]))
}

/// Reads the header of a whole pack file.
pub fn read_header(key: &MasterKey, pack: &[u8]) -> Result<Vec<PackEntry>, String> {
    let total = pack.len();
    if total < 4 {
        return Err(format!("only {total} bytes long, too short for a pack"));
    }
    let trailer: [u8; 4] = pack[total - 4..].try_into().expect("4 bytes");
    let (start, len) = header_range(total as u64, trailer)?;
    open_header(key, &pack[start as usize..(start + len) as usize], start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack_of(key: &MasterKey, blobs: &[&[u8]]) -> (PackId, Vec<u8>, Vec<PackEntry>) {
        let mut w = PackWriter::new(1024);
        for b in blobs {
            let id = key.blob_id(b);
            w.add(
                id,
                BlobKind::Data,
                key.seal(Purpose::DataBlob(id), b),
                b.len() as u32,
            );
        }
        w.finish(key)
    }

    #[test]
    fn a_blob_larger_than_the_buffer_becomes_it_and_the_pack_reads_back() {
        let key = MasterKey::generate();
        let big = vec![7u8; 5000];
        let mut w = PackWriter::new(16);
        let big_id = key.blob_id(&big);
        let sealed = key.seal(Purpose::TreeBlob(big_id), &big);
        let at = sealed.as_ptr();
        w.add(big_id, BlobKind::Tree, sealed, big.len() as u32);
        assert_eq!(
            w.buf.as_ptr(),
            at,
            "the sealed blob is the buffer, not a copy"
        );
        let small = key.blob_id(b"small");
        w.add(
            small,
            BlobKind::Tree,
            key.seal(Purpose::TreeBlob(small), b"small"),
            5,
        );
        let (_, bytes, entries) = w.finish(&key);
        assert_eq!(read_header(&key, &bytes).unwrap(), entries);
        for (e, plain) in entries.iter().zip([&big[..], b"small"]) {
            let sealed = &bytes[e.offset as usize..(e.offset + e.length) as usize];
            assert_eq!(key.open(e.kind.purpose(e.id), sealed).unwrap(), plain);
        }
    }

    #[test]
    fn header_lists_every_blob_where_it_is() {
        let key = MasterKey::generate();
        let (id, bytes, entries) = pack_of(&key, &[b"one", b"two two"]);
        assert_eq!(id, PackId::of_bytes(&bytes));
        let read = read_header(&key, &bytes).unwrap();
        assert_eq!(read, entries);
        for (e, plain) in read.iter().zip([&b"one"[..], b"two two"]) {
            let sealed = &bytes[e.offset as usize..(e.offset + e.length) as usize];
            assert_eq!(key.open(e.kind.purpose(e.id), sealed).unwrap(), plain);
            assert_eq!(e.id, key.blob_id(plain));
        }
    }

    #[test]
    fn file_size_from_the_entries_is_the_size_of_the_pack() {
        let key = MasterKey::generate();
        let (_, bytes, mut entries) = pack_of(&key, &[b"one", b"two two", &[7; 5000]]);
        entries.reverse();
        assert_eq!(file_size(&key, &entries), bytes.len() as u64);
    }

    /// Format 4's packs end on the grid, with random filler before the header; earlier
    /// formats' packs end right after it. Either way the header and every blob read back.
    #[test]
    fn packs_of_format_4_fill_the_grid_and_earlier_ones_end_at_their_header() {
        for format in [3, 4] {
            let key = MasterKey::generate_for(format);
            for blobs in [
                &[&b"one"[..]][..],
                &[&[7; 70_000], b"two"],
                &[&[8; 200_000]],
            ] {
                let (_, bytes, entries) = pack_of(&key, blobs);
                assert_eq!(read_header(&key, &bytes).unwrap(), entries);
                assert_eq!(file_size(&key, &entries), bytes.len() as u64);
                for (e, plain) in entries.iter().zip(blobs) {
                    let sealed = &bytes[e.offset as usize..(e.offset + e.length) as usize];
                    assert_eq!(key.open(e.kind.purpose(e.id), sealed).unwrap(), *plain);
                    assert_eq!(e.length as usize, key.sealed_blob_len(plain.len()));
                }
                let body = entries.iter().map(|e| e.offset + e.length).max().unwrap() as usize;
                let trailer: [u8; 4] = bytes[bytes.len() - 4..].try_into().unwrap();
                let (header, _) = header_range(bytes.len() as u64, trailer).unwrap();
                let filler = &bytes[body..header as usize];
                if format < GRID_FORMAT {
                    assert!(filler.is_empty());
                    assert_eq!(off_grid(&key, bytes.len() as u64), None);
                } else {
                    // On the grid, with no more filler than that takes.
                    assert_eq!(bytes.len() as u64 % GRID, 0, "{} bytes", bytes.len());
                    assert!((filler.len() as u64) < GRID, "{} bytes", filler.len());
                    assert!(filler.iter().filter(|&&b| b == 0).count() < filler.len() / 64);
                    assert!(off_grid(&key, bytes.len() as u64 - 1).is_some());
                }
            }
        }
    }

    #[test]
    fn reads_are_widened_to_the_grid_from_format_4_only() {
        let old = MasterKey::generate_for(3);
        assert_eq!(grid_span(&old, 10, 100), (10, 100));
        let key = MasterKey::generate_for(4);
        assert_eq!(grid_span(&key, 0, GRID), (0, GRID));
        assert_eq!(grid_span(&key, GRID - 1, 2), (0, 2 * GRID));
        assert_eq!(grid_span(&key, 3 * GRID, 1), (3 * GRID, GRID));
    }

    #[test]
    fn truncated_or_tampered_packs_are_rejected() {
        let key = MasterKey::generate();
        let (_, bytes, _) = pack_of(&key, &[b"one", b"two"]);
        for cut in [0, 3, 10, bytes.len() - 1] {
            assert!(read_header(&key, &bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = bytes.clone();
        let n = bad.len();
        bad[n - 10] ^= 0x40;
        assert!(read_header(&key, &bad).is_err());
        assert!(read_header(&MasterKey::generate(), &bytes).is_err());
    }
}

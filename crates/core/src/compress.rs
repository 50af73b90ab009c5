//! Compression of blobs before they are sealed. The compressed form carries a one-byte
//! tag naming the codec, so every blob says how to read it back whatever the repository
//! setting was when it was written. Data that does not shrink is stored raw.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

const TAG_RAW: u8 = 0;
const TAG_ZSTD: u8 = 1;
const TAG_LZ4: u8 = 2;

/// The codec a repository uses for new blobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "codec", rename_all = "lowercase")]
pub enum Compression {
    None,
    Zstd { level: i32 },
    Lz4,
}

impl Default for Compression {
    fn default() -> Self {
        Compression::Zstd { level: 3 }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Zstd { level } => write!(f, "zstd:{level}"),
            Compression::Lz4 => f.write_str("lz4"),
        }
    }
}

impl FromStr for Compression {
    type Err = String;

    /// `zstd`, `zstd:LEVEL` (1–22), `lz4` or `none`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("Unknown compression {s:?}: use zstd, zstd:LEVEL (1-22), lz4 or none");
        match s.split_once(':') {
            None if s == "zstd" => Ok(Compression::default()),
            None if s == "lz4" => Ok(Compression::Lz4),
            None if s == "none" => Ok(Compression::None),
            Some(("zstd", level)) => match level.parse::<i32>() {
                Ok(level @ 1..=22) => Ok(Compression::Zstd { level }),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

/// Compressed bytes that do not decompress, or decompress to the wrong length.
#[derive(Debug, thiserror::Error)]
#[error("Cannot decompress: {0}")]
pub struct DecompressError(String);

/// Compresses `data` into a tagged buffer; keeps it raw when compression does not help.
pub fn compress(codec: Compression, data: &[u8]) -> Vec<u8> {
    Compressor::new(codec).compress(data).to_vec()
}

/// A compressor that keeps its zstd context and output buffer between calls: creating a
/// context per blob spent most of a backup's time resetting zstd's tables, and a new
/// buffer per blob faulted in fresh pages for every compressed byte. The context is made
/// at the first blob worth compressing: an unchanged backup's writer compresses nothing.
pub struct Compressor {
    codec: Compression,
    /// zstd's context, once made (`None` also when it could not be: blobs stay raw).
    zstd: Option<zstd::bulk::Compressor<'static>>,
    out: Vec<u8>,
}

/// A blob's compressed form: the tag byte naming the codec, and the body (the caller's
/// own bytes when stored raw).
pub struct Compressed<'a> {
    tag: [u8; 1],
    body: &'a [u8],
}

impl Compressed<'_> {
    /// Bytes of the tagged form.
    pub fn tagged_len(&self) -> usize {
        1 + self.body.len()
    }

    /// The tagged form in one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        [&self.tag[..], self.body].concat()
    }
}

impl Compressor {
    pub fn new(codec: Compression) -> Self {
        Compressor {
            codec,
            zstd: None,
            out: Vec::new(),
        }
    }

    pub fn compress<'a>(&'a mut self, data: &'a [u8]) -> Compressed<'a> {
        let raw = Compressed {
            tag: [TAG_RAW],
            body: data,
        };
        if looks_incompressible(data) {
            return raw;
        }
        if self.out.capacity() > KEEP_OUT {
            // Left by a large chunk or a huge tree: not kept for the chunks that follow
            // (with 16 MiB kept, peak RSS of a Linux-tree backup grew by 13-20 MiB).
            self.out = Vec::new();
        }
        self.out.clear();
        if let (Compression::Zstd { level }, None) = (self.codec, &self.zstd) {
            self.zstd = zstd::bulk::Compressor::new(level).ok();
        }
        let tag = match (self.codec, &mut self.zstd) {
            (Compression::Zstd { .. }, Some(z)) => {
                self.out
                    .reserve(zstd::zstd_safe::compress_bound(data.len()));
                match z.compress_to_buffer(data, &mut self.out) {
                    Ok(_) => TAG_ZSTD,
                    Err(_) => return raw,
                }
            }
            (Compression::Lz4, _) => {
                let bound = lz4_flex::block::get_maximum_output_size(data.len());
                self.out.resize(bound, 0);
                match lz4_flex::block::compress_into(data, &mut self.out) {
                    Ok(n) => self.out.truncate(n),
                    Err(_) => return raw,
                }
                TAG_LZ4
            }
            _ => return raw,
        };
        if self.out.len() >= data.len() {
            return raw;
        }
        Compressed {
            tag: [tag],
            body: &self.out,
        }
    }

    /// [`compress`](Self::compress) in place, for a writer that seals in the same buffer:
    /// the blob is what `buf` holds after `at + 1` bytes; the tag goes into `buf[at]` and
    /// the body after it, compressed where that pays and left as it is otherwise.
    ///
    /// # Panics
    /// If `buf` holds no more than `at` bytes.
    pub fn compress_in_place(&mut self, buf: &mut Vec<u8>, at: usize) {
        let tag = self.compress(&buf[at + 1..]).tag[0];
        if tag != TAG_RAW {
            buf.truncate(at + 1);
            buf.extend_from_slice(&self.out);
        }
        buf[at] = tag;
    }
}

/// The compressor's output buffer is kept up to this size: the bound of zstd's output for
/// the largest bundle of small files (2 MiB, `ops::backup`), with room to spare. With up
/// to 4 MiB kept, peak RSS of a backup of the mixed corpus rose by 7 MiB once its disk
/// images' chunks were compressed (83-85 MiB against 77-78 with 2 MiB).
const KEEP_OUT: usize = (2 << 20) + (64 << 10);

/// Blobs at least this large are probed before compressing.
const PROBE_FROM: usize = 64 << 10;
const PROBE_SAMPLE: usize = 4 << 10;
/// One sample per this many bytes (and at least three: start, middle, end).
const PROBE_STRIDE: usize = 64 << 10;

/// Whether `data` looks already compressed (archives, media, encrypted files): LZ4 on
/// samples spread evenly over it, one per 64 KiB, saves under 3%. A sixteenth of a
/// chunk through LZ4 instead of the whole chunk through zstd. Samples this close find
/// the runs of zeros between random data in a disk image: with three samples (start,
/// middle, end), the mixed corpus's two 96 MiB disk images were stored in 166.0-166.8 MB,
/// against 151.2 MB for `zstd -3` of the same bytes (measured with `cairn backup` of
/// `bench/corpus.py`'s `vm/` into a new repository).
fn looks_incompressible(data: &[u8]) -> bool {
    if data.len() < PROBE_FROM {
        return false;
    }
    let samples = (data.len() / PROBE_STRIDE).max(3);
    let step = (data.len() - PROBE_SAMPLE) / (samples - 1);
    let packed: usize = (0..samples)
        .map(|i| lz4_flex::block::compress(&data[i * step..i * step + PROBE_SAMPLE]).len())
        .sum();
    packed * 100 >= samples * PROBE_SAMPLE * 97
}

/// Blobs up to this size are decompressed into a buffer reserved up front; larger ones
/// (only a huge tree can be) grow their buffer as they are read.
const BULK_MAX: usize = 64 << 20;

thread_local! {
    static ZSTD_CONTEXT: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Reverses [`compress`]; `raw_len` is the length recorded for the blob.
pub fn decompress(tagged: &[u8], raw_len: usize) -> Result<Vec<u8>, DecompressError> {
    decompress_borrowed(tagged, raw_len).map(Cow::into_owned)
}

/// [`decompress`], borrowing a raw blob's bytes rather than copying them (incompressible
/// data, most of what a restore of media writes).
pub fn decompress_borrowed(
    tagged: &[u8],
    raw_len: usize,
) -> Result<Cow<'_, [u8]>, DecompressError> {
    if tagged.first() == Some(&TAG_RAW) {
        return checked_len(&tagged[1..], raw_len).map(Cow::Borrowed);
    }
    let mut out = Vec::new();
    decompress_reusing(tagged, raw_len, &mut out)?;
    Ok(Cow::Owned(out))
}

/// [`decompress_borrowed`] into `out`, a buffer the caller keeps for the next blob (a
/// restore decompresses every blob of a snapshot on a few threads; a new buffer for each
/// showed in its profile as `malloc`, page faults and `memset`, about 5% of its CPU
/// time). A raw blob is not copied: the result then lies in `tagged`.
pub fn decompress_reusing<'a>(
    tagged: &'a [u8],
    raw_len: usize,
    out: &'a mut Vec<u8>,
) -> Result<&'a [u8], DecompressError> {
    let (&tag, body) = tagged
        .split_first()
        .ok_or_else(|| DecompressError("empty blob".into()))?;
    out.clear();
    match tag {
        TAG_RAW => return checked_len(body, raw_len),
        // `raw_len` comes from storage: beyond `BULK_MAX`, memory is reserved as the
        // output grows, never up front, so a hostile length cannot make us allocate
        // gigabytes.
        // One decompression context per thread: creating one per blob showed in the
        // profile of an unchanged backup, which decompresses every parent tree.
        TAG_ZSTD if raw_len <= BULK_MAX => {
            out.reserve(raw_len);
            ZSTD_CONTEXT.with(|cell| {
                let mut slot = cell.borrow_mut();
                if slot.is_none() {
                    *slot = zstd::bulk::Decompressor::new().ok();
                }
                match slot.as_mut() {
                    Some(z) => z
                        .decompress_to_buffer(body, out)
                        .map(drop)
                        .map_err(|e| DecompressError(e.to_string())),
                    None => Err(DecompressError("cannot create a zstd context".into())),
                }
            })?
        }
        TAG_ZSTD => {
            use std::io::Read;
            let err = |e: std::io::Error| DecompressError(e.to_string());
            out.reserve(raw_len.min(body.len().saturating_mul(16)));
            zstd::stream::read::Decoder::with_buffer(body)
                .map_err(err)?
                .take(raw_len as u64 + 1)
                .read_to_end(out)
                .map_err(err)?;
        }
        TAG_LZ4 => {
            // An LZ4 block expands at most 255-fold.
            if raw_len > body.len().saturating_mul(255) {
                return Err(DecompressError(format!(
                    "{} LZ4 bytes cannot hold {raw_len} bytes",
                    body.len()
                )));
            }
            out.resize(raw_len, 0);
            let n = lz4_flex::block::decompress_into(body, out)
                .map_err(|e| DecompressError(e.to_string()))?;
            out.truncate(n);
        }
        other => return Err(DecompressError(format!("unknown codec tag {other}"))),
    }
    checked_len(out, raw_len)
}

/// `plain`, if it is `raw_len` bytes long as the index says.
fn checked_len(plain: &[u8], raw_len: usize) -> Result<&[u8], DecompressError> {
    if plain.len() != raw_len {
        return Err(DecompressError(format!(
            "expected {raw_len} bytes, got {}",
            plain.len()
        )));
    }
    Ok(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_round_trips() {
        let text = b"hello hello hello hello hello hello hello".repeat(100);
        for codec in [Compression::None, Compression::Lz4, Compression::default()] {
            let c = compress(codec, &text);
            assert_eq!(decompress(&c, text.len()).unwrap(), text, "{codec}");
        }
    }

    /// In place, a blob gets the same tagged form as copied, whether it shrinks or not,
    /// and the bytes before it are left alone.
    #[test]
    fn compressing_in_place_gives_the_tagged_form_after_the_headroom() {
        let text = b"hello hello hello hello hello hello hello".repeat(3000);
        let mut noise = vec![0; 200_000];
        blake3::Hasher::new().finalize_xof().fill(&mut noise);
        let mut compressor = Compressor::new(Compression::default());
        for blob in [&text, &noise] {
            let tagged = compressor.compress(blob).to_vec();
            let mut buf = vec![7; 5];
            buf.push(0xEE);
            buf.extend_from_slice(blob);
            compressor.compress_in_place(&mut buf, 5);
            assert_eq!(buf[..5], [7; 5]);
            assert_eq!(buf[5..], tagged[..]);
            assert_eq!(decompress(&buf[5..], blob.len()).unwrap(), blob[..]);
        }
        assert!(compressor.compress(&text).tagged_len() < text.len());
        assert_eq!(compressor.compress(&noise).tagged_len(), noise.len() + 1);
    }

    #[test]
    fn a_reused_buffer_holds_exactly_each_blob_and_a_wrong_length_is_refused() {
        let long = b"hello hello hello hello hello hello hello".repeat(1000);
        let short = b"short short short short short short".repeat(10);
        let mut out = Vec::new();
        for codec in [Compression::None, Compression::Lz4, Compression::default()] {
            // Long, then short in the same buffer: nothing of the long one is left.
            for text in [&long, &short, &long] {
                let c = compress(codec, text);
                let plain = decompress_reusing(&c, text.len(), &mut out).unwrap();
                assert_eq!(plain, &text[..], "{codec}");
                // The buffer's capacity is larger than the blob: the index's length is
                // still checked, in both directions.
                for wrong in [text.len() - 1, text.len() + 1] {
                    assert!(
                        decompress_reusing(&c, wrong, &mut out).is_err(),
                        "{codec}: {wrong} bytes claimed for {}",
                        text.len()
                    );
                }
            }
        }
    }

    #[test]
    fn incompressible_data_is_stored_raw() {
        let noise: Vec<u8> = (0..10_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let c = compress(Compression::default(), &noise);
        assert!(c.len() <= noise.len() + 1);
        assert_eq!(decompress(&c, noise.len()).unwrap(), noise);
    }

    #[test]
    fn the_probe_skips_noise_but_not_text_after_noise() {
        use rand::RngCore;
        let mut noise = vec![0u8; 256 << 10];
        rand::thread_rng().fill_bytes(&mut noise);
        assert!(looks_incompressible(&noise));
        let c = compress(Compression::default(), &noise);
        assert_eq!((c[0], c.len()), (TAG_RAW, noise.len() + 1));
        // Noise at the start only: the middle and end samples compress.
        let mut mixed = noise[..8 << 10].to_vec();
        mixed.extend(b"some text that repeats, ".repeat(10_000));
        assert!(!looks_incompressible(&mixed));
        assert!(compress(Compression::default(), &mixed).len() < mixed.len() / 10);
    }

    #[test]
    fn the_probe_finds_zeros_between_noise_as_in_a_disk_image() {
        use rand::RngCore;
        // 1 MiB of noise with 96 KiB of zeros a fifth of the way in: between the start
        // and the middle, where three samples never look.
        let mut image = vec![0u8; 1 << 20];
        rand::thread_rng().fill_bytes(&mut image);
        image[200 << 10..296 << 10].fill(0);
        assert!(!looks_incompressible(&image));
        let c = compress(Compression::default(), &image);
        assert_eq!(c[0], TAG_ZSTD);
        assert!(c.len() < image.len() - (90 << 10), "{} bytes", c.len());
    }

    #[test]
    fn compression_names_parse() {
        assert_eq!(
            "zstd:19".parse::<Compression>().unwrap(),
            Compression::Zstd { level: 19 }
        );
        assert_eq!("lz4".parse::<Compression>().unwrap(), Compression::Lz4);
        assert!("zstd:0".parse::<Compression>().is_err());
        assert!("gzip".parse::<Compression>().is_err());
    }

    #[test]
    fn wrong_length_is_an_error() {
        let c = compress(Compression::default(), &[7u8; 1000]);
        assert!(decompress(&c, 999).is_err());
        assert!(decompress(&[9, 1, 2], 2).is_err());
    }
}

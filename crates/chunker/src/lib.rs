//! Content-defined chunking: cuts a byte stream into chunks whose boundaries depend on
//! the content, so an insertion or deletion only changes the chunks around it and the
//! rest deduplicate against earlier backups.
//!
//! This crate is pure: it reads from the reader it is given and does nothing else (no
//! files, no hashing, no threads). It finds the cut points of FastCDC 2020 with
//! normalization level 1, exactly as the `fastcdc` crate's cut function does (its masks
//! and tables are used), with its own search (`cut`: resumable, and hashing distant
//! stretches side by side where the processor has AVX-512) and its own streaming loop over
//! one reusable buffer, because `fastcdc::v2020::StreamCDC` allocates a `Vec` per chunk
//! and shifts its whole buffer after every chunk.
//!
//! ```
//! use cairn_chunker::{chunk_slice, Chunker, ChunkerParams};
//!
//! let data: Vec<u8> = (0..200_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
//! let params = ChunkerParams::new(2048, 8192, 32768)?;
//! let mut chunker = Chunker::new(&data[..], params, 0_u64);
//! let mut total = 0;
//! while let Some(chunk) = chunker.next_chunk()? {
//!     assert_eq!(chunk.offset, total as u64);
//!     assert!(chunk.data.len() <= 32768);
//!     total += chunk.data.len();
//! }
//! assert_eq!(total, data.len());
//! // The in-memory variant finds the same cut points.
//! assert_eq!(chunk_slice(&data, params, 0_u64).iter().map(|&(_, len)| len).sum::<usize>(), total);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod chunker;
mod cut;
mod params;

pub use chunker::{chunk_slice, Chunk, Chunker, Gear};
pub use params::{ChunkerParams, ParamsError};

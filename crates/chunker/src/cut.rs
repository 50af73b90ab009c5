//! FastCDC 2020's cut-point search: the same cut points as `fastcdc::v2020::cut_gear`,
//! found faster, and resumable.
//!
//! The gear hash after byte `j` of a chunk is `h_j = (h_{j-1} << 1) + gear[data[j]]`,
//! from 0 at the chunk's minimum size; the chunk ends before the first `j` whose hash has
//! none of the mask's bits set (a harder mask before the average size, an easier one
//! after), or at the maximum size. Each step shifts every earlier byte's term one bit up,
//! so 64 steps later it has left the hash: `h_j` depends only on `data[j-63..=j]`. So:
//!
//! - A search can resume where one over a shorter buffer stopped, from the 64 bytes before
//!   that point, instead of hashing the chunk again from its start (the
//!   [`Chunker`](crate::Chunker) reads a long chunk in several reads).
//! - Stretches of a chunk far apart can be hashed at once. fastcdc's loop waits for each
//!   step's shift and add before the next; with AVX-512, 16 stretches of 2 KiB are hashed
//!   side by side in vector lanes, each from the 64 bytes before it, and only the first
//!   stretch holding a cut point is searched again byte by byte. The lanes' table
//!   lookups (gathers) bound it: `cargo bench -p cairn-chunker` on this project's 2-core
//!   Xeon VM, against fastcdc's function just before, streaming with default sizes 1.86
//!   -> 2.63 GiB/s, over a slice 1.66 -> 3.03 GiB/s, streaming 64 KiB chunks 1.35 -> 1.73
//!   GiB/s (medians).
//!   Without AVX-512 the search goes one byte after another: hashing 4 stretches side by
//!   side in general-purpose registers instead was slower on an AMD EPYC (Zen 3) VM,
//!   streaming 2.42 -> 1.80 GiB/s (8-byte loads and no branch per byte: 1.58), since
//!   that loop is bound by its loads and additions, not by each step's wait for the last.

use fastcdc::v2020::{logarithm2, Normalization, MASKS};

use crate::chunker::Gear;
use crate::ChunkerParams;

/// FastCDC's normalization level: level 1 narrows the size spread around the average
/// while keeping boundaries content-driven, and is fastcdc's own default.
const NORMALIZATION: Normalization = Normalization::Level1;

/// Where a search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cut {
    /// The chunk's length: up to the first cut point, else `max_size` or all of the data.
    pub len: usize,
    /// The chunk holds no cut point before this offset: where a search over more of the
    /// same chunk may resume.
    pub scanned: usize,
}

/// The cut-point function with its sizes, masks and gear table.
pub(crate) struct Cutter {
    /// Even (see `new`): searches start there and go two bytes at a time.
    pub min_size: usize,
    pub avg_size: usize,
    pub max_size: usize,
    mask_s: u64,
    mask_l: u64,
    gear: Gear,
    /// Whether the processor has AVX-512 (checked once).
    wide: bool,
}

impl Cutter {
    /// FastCDC's masks for `params`, normalization level 1.
    ///
    /// # Panics
    ///
    /// If `params` holds sizes that [`ChunkerParams::new`] rejects: the fields are
    /// public, so a value may have bypassed it, and out-of-range sizes would index past
    /// fastcdc's mask table.
    pub fn new(params: ChunkerParams, gear: Gear) -> Self {
        let params = ChunkerParams::new(params.min_size, params.avg_size, params.max_size)
            .unwrap_or_else(|err| panic!("Invalid chunker parameters: {err}"));
        let bits = logarithm2(params.avg_size);
        let level = NORMALIZATION.bits();
        let (mask_s, mask_l) = (
            MASKS[(bits + level) as usize],
            MASKS[(bits - level) as usize],
        );
        // fastcdc tests an even position `j` as `(h_j << 1) & (mask << 1)`: the same as
        // `h_j & mask` while the mask's top bit is clear, as in all of its masks.
        assert!((mask_s | mask_l) >> 63 == 0, "mask with bit 63 set");
        Cutter {
            // fastcdc starts testing at byte `min_size / 2 * 2` and may cut right there,
            // one byte short of an odd minimum; rounding up keeps every chunk but the
            // last at least `min_size` long.
            min_size: params.min_size as usize + (params.min_size as usize & 1),
            avg_size: params.avg_size as usize,
            max_size: params.max_size as usize,
            mask_s,
            mask_l,
            gear,
            wide: wide::available(),
        }
    }

    /// The same, never using vector lanes: what a processor without AVX-512 runs.
    #[cfg(test)]
    pub fn narrow(mut self) -> Self {
        self.wide = false;
        self
    }

    /// The chunk at `data[0]`, given that it holds no cut point before `resume` (0, or the
    /// `scanned` of a search over a prefix of `data`). Depends only on `data[..max_size]`,
    /// or all of `data` when shorter, which must then be the end of the stream.
    pub fn cut(&self, data: &[u8], resume: usize) -> Cut {
        let n = data.len();
        if n <= self.min_size {
            return Cut { len: n, scanned: 0 };
        }
        let remaining = n.min(self.max_size);
        // fastcdc tests the positions of whole pairs of bytes: an odd last byte only
        // once more data follows it.
        let end = remaining & !1;
        let start = self.min_size;
        let mid = (self.avg_size & !1).clamp(start, end);
        let mut j = (resume & !1).max(start);
        let mut h = self.hash_before(data, start, j);
        for (to, mask) in [(mid, self.mask_s), (end, self.mask_l)] {
            if j < to {
                if let Some(at) = self.first_hit(data, start, j, to, &mut h, mask) {
                    return Cut {
                        len: at,
                        scanned: at,
                    };
                }
                j = to;
            }
        }
        Cut {
            len: remaining,
            scanned: end,
        }
    }

    /// The hash before position `j` of a chunk whose hashing starts at `start`: that of
    /// the 64 bytes before `j` alone, since earlier bytes have been shifted out.
    fn hash_before(&self, data: &[u8], start: usize, j: usize) -> u64 {
        data[j.saturating_sub(64).max(start)..j]
            .iter()
            .fold(0, |h: u64, &b| {
                (h << 1).wrapping_add(self.gear.gear[usize::from(b)])
            })
    }

    /// The first position in `from..to` (both even) whose hash has no bit of `mask` set;
    /// `h` is the hash before `from` and becomes the hash before `to`. The chunk's hashing
    /// starts at `start`.
    fn first_hit(
        &self,
        data: &[u8],
        start: usize,
        mut from: usize,
        to: usize,
        h: &mut u64,
        mask: u64,
    ) -> Option<usize> {
        if self.wide {
            // Each lane starts 64 bytes before its stretch, within the chunk's hashing.
            let lanes_from = (start + 64).min(to);
            if from < lanes_from {
                if let Some(at) = self.first_hit_narrow(data, from, lanes_from, h, mask) {
                    return Some(at);
                }
                from = lanes_from;
            }
            while to - from >= wide::BLOCK {
                // SAFETY: `wide` says the processor has AVX-512F; `block` checks bounds.
                let (hits, last) = unsafe { wide::block(&self.gear.gear, data, from, mask) };
                if hits == 0 {
                    *h = last;
                    from += wide::BLOCK;
                    continue;
                }
                // The first cut is in the first stretch holding one: search it again.
                let lane = hits.trailing_zeros() as usize;
                if lane > 0 {
                    from += lane * wide::STRETCH;
                    *h = self.hash_before(data, start, from);
                }
                break;
            }
        }
        self.first_hit_narrow(data, from, to, h, mask)
    }

    /// [`first_hit`](Self::first_hit) a byte at a time, two per step as fastcdc does.
    fn first_hit_narrow(
        &self,
        data: &[u8],
        from: usize,
        to: usize,
        h: &mut u64,
        mask: u64,
    ) -> Option<usize> {
        let (gear, gear_ls) = (&self.gear.gear, &self.gear.gear_ls);
        let mask_ls = mask << 1;
        for (i, pair) in data[from..to].chunks_exact(2).enumerate() {
            // `gear_ls` holds the entries shifted by one: this is `h_j << 1`.
            let even = (*h << 2).wrapping_add(gear_ls[usize::from(pair[0])]);
            if even & mask_ls == 0 {
                return Some(from + 2 * i);
            }
            *h = even.wrapping_add(gear[usize::from(pair[1])]);
            if *h & mask == 0 {
                return Some(from + 2 * i + 1);
            }
        }
        None
    }
}

/// Hashing stretches of a chunk side by side in the lanes of AVX-512 vectors.
mod wide {
    /// Stretches hashed side by side.
    pub const LANES: usize = 16;
    /// Each stretch's length: short enough that the search again after a hit is cheap.
    pub const STRETCH: usize = 2048;
    /// The bytes one call to `block` tests.
    pub const BLOCK: usize = LANES * STRETCH;

    pub fn available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Hashes `data[at..at + BLOCK]` as `LANES` stretches of `STRETCH` bytes, each from
    /// the 64 bytes before it. Returns which stretches hold a position whose hash has no
    /// bit of `mask` set (bit `i` for stretch `i`), and the hash after the block's last
    /// byte.
    ///
    /// # Safety
    ///
    /// The processor must have AVX-512F.
    ///
    /// # Panics
    ///
    /// If `at < 64` or the block does not fit in `data`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn block(gear: &[u64; 256], data: &[u8], at: usize, mask: u64) -> (u16, u64) {
        use std::arch::x86_64::*;

        assert!(
            at >= 64 && at + BLOCK <= data.len(),
            "block outside the data"
        );
        // Lanes 0-7 and 8-15: where each stretch's reading starts, relative to `at - 64`.
        let s = STRETCH as i64;
        let offsets_a = _mm512_set_epi64(7 * s, 6 * s, 5 * s, 4 * s, 3 * s, 2 * s, s, 0);
        let offsets_b = _mm512_add_epi64(offsets_a, _mm512_set1_epi64(8 * s));
        let bytes = data.as_ptr().add(at - 64);
        let table = gear.as_ptr().cast::<i64>();
        let masks = _mm512_set1_epi64(mask as i64);
        let low_byte = _mm512_set1_epi64(0xff);
        let (mut ha, mut hb) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        let mut hits: u16 = 0;
        // Eight bytes of every stretch at a time, the first 64 hashed but not tested.
        for t in (0..64 + STRETCH).step_by(8) {
            let tv = _mm512_set1_epi64(t as i64);
            // SAFETY: every lane reads 8 bytes at `at - 64 + i * STRETCH + t`, within
            // `data[at - 64..at + BLOCK]` (asserted above).
            let words_a =
                _mm512_i64gather_epi64::<1>(_mm512_add_epi64(offsets_a, tv), bytes.cast());
            let words_b =
                _mm512_i64gather_epi64::<1>(_mm512_add_epi64(offsets_b, tv), bytes.cast());
            let mut found: u16 = 0;
            macro_rules! step {
                ($shift:literal) => {
                    let ia = _mm512_and_si512(_mm512_srli_epi64::<$shift>(words_a), low_byte);
                    let ib = _mm512_and_si512(_mm512_srli_epi64::<$shift>(words_b), low_byte);
                    // SAFETY: indexes are bytes, within the 256 entries of `gear`.
                    let ga = _mm512_i64gather_epi64::<8>(ia, table);
                    let gb = _mm512_i64gather_epi64::<8>(ib, table);
                    ha = _mm512_add_epi64(_mm512_slli_epi64::<1>(ha), ga);
                    hb = _mm512_add_epi64(_mm512_slli_epi64::<1>(hb), gb);
                    found |= u16::from(_mm512_testn_epi64_mask(ha, masks))
                        | u16::from(_mm512_testn_epi64_mask(hb, masks)) << 8;
                };
            }
            step!(0);
            step!(8);
            step!(16);
            step!(24);
            step!(32);
            step!(40);
            step!(48);
            step!(56);
            if t >= 64 {
                hits |= found;
            }
        }
        let last = _mm256_extract_epi64::<3>(_mm512_extracti64x4_epi64::<1>(hb)) as u64;
        (hits, last)
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub unsafe fn block(_: &[u64; 256], _: &[u8], _: usize, _: u64) -> (u16, u64) {
        unreachable!("no vector lanes on this processor")
    }
}

#[cfg(test)]
#[path = "cut_tests.rs"]
mod tests;

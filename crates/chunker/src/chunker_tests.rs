use std::collections::HashSet;
use std::io::{self, Read};

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use super::*;
use fastcdc::v2020::Normalization;

fn small_params() -> ChunkerParams {
    ChunkerParams::new(2 * 1024, 8 * 1024, 32 * 1024).unwrap()
}

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut data = vec![0; len];
    StdRng::seed_from_u64(seed).fill_bytes(&mut data);
    data
}

/// Collects `(offset, length)` pairs by streaming, checking offsets are contiguous.
fn stream_cuts(reader: impl Read, params: ChunkerParams, seed: u64) -> Vec<(usize, usize)> {
    let mut chunker = Chunker::new(reader, params, seed);
    let mut cuts = Vec::new();
    while let Some(chunk) = chunker.next_chunk().unwrap() {
        assert_eq!(chunk.offset, chunker_position_before(&cuts));
        cuts.push((chunk.offset as usize, chunk.data.len()));
    }
    assert_eq!(chunker.position(), chunker_position_before(&cuts));
    cuts
}

fn chunker_position_before(cuts: &[(usize, usize)]) -> u64 {
    cuts.last().map_or(0, |&(o, l)| (o + l) as u64)
}

fn assert_sizes_within_limits(cuts: &[(usize, usize)], params: ChunkerParams) {
    let (last, rest) = cuts.split_last().expect("at least one chunk");
    for &(offset, len) in rest {
        assert!(
            len >= params.min_size as usize,
            "chunk at {offset} has {len} bytes, below the minimum"
        );
        assert!(
            len <= params.max_size as usize,
            "chunk at {offset} has {len} bytes, above the maximum"
        );
    }
    assert!(last.1 >= 1 && last.1 <= params.max_size as usize);
}

/// Hands out 1 to 7 bytes per call and now and then fails with `Interrupted`.
struct TrickleReader<'a> {
    data: &'a [u8],
    rng: StdRng,
}

impl Read for TrickleReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.rng.gen_ratio(1, 50) {
            return Err(io::Error::from(io::ErrorKind::Interrupted));
        }
        let n = self
            .rng
            .gen_range(1..=7)
            .min(buf.len())
            .min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn boundaries_are_stable_under_an_insertion_near_the_start() {
    let params = small_params();
    let original = random_bytes(20_000_000, 1);
    let mut edited = original[..1000].to_vec();
    edited.extend_from_slice(&random_bytes(100, 2));
    edited.extend_from_slice(&original[1000..]);

    let before: HashSet<&[u8]> = chunk_slice(&original, params, 0)
        .into_iter()
        .map(|(o, l)| &original[o..o + l])
        .collect();
    let after = chunk_slice(&edited, params, 0);
    assert!(
        after.len() > 1000,
        "expected many chunks, got {}",
        after.len()
    );
    let changed: Vec<usize> = after
        .iter()
        .enumerate()
        .filter(|&(_, &(o, l))| !before.contains(&edited[o..o + l]))
        .map(|(i, _)| i)
        .collect();
    assert!(
        !changed.is_empty() && changed.len() <= 3,
        "changed chunks: {changed:?}"
    );
    assert!(
        changed.iter().all(|&i| i < 3),
        "changed chunks: {changed:?}"
    );
}

#[test]
fn sizes_respect_min_and_max_on_random_data() {
    let params = small_params();
    let data = random_bytes(5_000_000, 3);
    let cuts = chunk_slice(&data, params, 0_u64);
    assert_sizes_within_limits(&cuts, params);
    let mean = data.len() / cuts.len();
    assert!(
        (4 * 1024..=16 * 1024).contains(&mean),
        "mean chunk size {mean}"
    );
}

#[test]
fn sizes_respect_min_and_max_on_all_zero_data() {
    let params = small_params();
    let data = vec![0; 1_000_000];
    let cuts = stream_cuts(&data[..], params, 0);
    assert_eq!(cuts, chunk_slice(&data, params, 0));
    assert_sizes_within_limits(&cuts, params);
    let (_, rest) = cuts.split_last().unwrap();
    assert!(rest.iter().all(|&(_, l)| l == 32 * 1024));
}

#[test]
fn odd_minimum_is_still_respected() {
    let params = ChunkerParams::new(1001, 4000, 16000).unwrap();
    let data = random_bytes(2_000_000, 4);
    assert_sizes_within_limits(&chunk_slice(&data, params, 0), params);
}

#[test]
fn streaming_equals_chunk_slice_across_buffer_refills() {
    // 20 MB is several times the 4 MiB buffer used for small params.
    let params = small_params();
    let data = random_bytes(20_000_000, 5);
    let cuts = stream_cuts(&data[..], params, 7);
    assert_eq!(cuts, chunk_slice(&data, params, 7));
    assert_eq!(chunker_position_before(&cuts), data.len() as u64);
}

#[test]
fn streaming_equals_chunk_slice_with_default_params() {
    let params = ChunkerParams::DEFAULT;
    let data = random_bytes(40_000_000, 6);
    let cuts = stream_cuts(&data[..], params, 0);
    assert_eq!(cuts, chunk_slice(&data, params, 0));
    assert_sizes_within_limits(&cuts, params);
}

#[test]
fn streaming_equals_chunk_slice_with_a_reader_giving_a_few_bytes_per_call() {
    let params = small_params();
    // More than two buffers, so tails are moved and refilled through tiny reads too.
    let data = random_bytes(9_000_000, 8);
    let reader = TrickleReader {
        data: &data,
        rng: StdRng::seed_from_u64(9),
    };
    assert_eq!(
        stream_cuts(reader, params, 0),
        chunk_slice(&data, params, 0)
    );
}

#[test]
fn chunk_data_matches_the_input_bytes() {
    let params = small_params();
    let data = random_bytes(300_000, 10);
    let mut chunker = Chunker::new(&data[..], params, 0);
    let mut joined = Vec::new();
    while let Some(chunk) = chunker.next_chunk().unwrap() {
        assert_eq!(
            chunk.data,
            &data[chunk.offset as usize..][..chunk.data.len()]
        );
        joined.extend_from_slice(chunk.data);
    }
    assert_eq!(joined, data);
    assert!(chunker.next_chunk().unwrap().is_none());
}

#[test]
fn cut_points_match_fastcdc_reference_implementation() {
    let params = small_params();
    let data = random_bytes(3_000_000, 11);
    for seed in [0, 0x5eed] {
        let reference: Vec<(usize, usize)> = fastcdc::v2020::FastCDC::with_level_and_seed(
            &data,
            params.min_size,
            params.avg_size,
            params.max_size,
            Normalization::Level1,
            seed,
        )
        .map(|c| (c.offset, c.length))
        .collect();
        assert_eq!(chunk_slice(&data, params, seed), reference);
    }
}

#[test]
fn empty_input_yields_no_chunks() {
    let mut chunker = Chunker::new(io::empty(), ChunkerParams::DEFAULT, 0_u64);
    assert!(chunker.next_chunk().unwrap().is_none());
    assert_eq!(chunker.position(), 0);
    assert!(chunk_slice(&[], ChunkerParams::DEFAULT, 0_u64).is_empty());
}

#[test]
fn input_shorter_than_the_minimum_is_one_chunk() {
    let data = b"tiny";
    let mut chunker = Chunker::new(&data[..], small_params(), 0_u64);
    let chunk = chunker.next_chunk().unwrap().unwrap();
    assert_eq!((chunk.offset, chunk.data), (0, &data[..]));
    assert!(chunker.next_chunk().unwrap().is_none());
}

#[test]
fn different_seeds_give_different_boundaries() {
    let params = small_params();
    let data = random_bytes(2_000_000, 12);
    let plain = chunk_slice(&data, params, 0_u64);
    let keyed = chunk_slice(&data, params, 0x0123_4567_89ab_cdef);
    assert_ne!(plain, keyed);
    assert_eq!(keyed, chunk_slice(&data, params, 0x0123_4567_89ab_cdef));
}

#[test]
fn read_errors_are_returned_and_the_stream_can_resume() {
    struct FailOnce<'a> {
        data: &'a [u8],
        failed: bool,
    }
    impl Read for FailOnce<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if !self.failed && self.data.len() < 100_000 {
                self.failed = true;
                return Err(io::Error::other("disk on fire"));
            }
            let n = buf.len().min(self.data.len()).min(65_536);
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }
    let params = small_params();
    let data = random_bytes(300_000, 13);
    let mut chunker = Chunker::new(
        FailOnce {
            data: &data,
            failed: false,
        },
        params,
        0,
    );
    let err = chunker.next_chunk().unwrap_err();
    assert_eq!(err.to_string(), "disk on fire");
    let mut cuts = Vec::new();
    while let Some(chunk) = chunker.next_chunk().unwrap() {
        cuts.push((chunk.offset as usize, chunk.data.len()));
    }
    assert_eq!(cuts, chunk_slice(&data, params, 0));
}

#[test]
#[should_panic(expected = "Invalid chunker parameters")]
fn params_built_without_validation_are_refused() {
    let params = ChunkerParams {
        min_size: 8192,
        avg_size: 1024,
        max_size: 4096,
    };
    let _ = Chunker::new(io::empty(), params, 0);
}

#[test]
fn a_reused_buffer_chunks_each_stream_as_a_fresh_one_would() {
    let params = small_params();
    // A long stream first grows the buffer to full size; the short ones reuse it with
    // stale bytes in it, which must never leak into their chunks.
    let inputs = [
        random_bytes(3_000_000, 7),
        random_bytes(100, 8),
        random_bytes(40_000, 9),
        vec![],
    ];
    let mut buffer = Vec::new();
    for data in &inputs {
        let mut chunker = Chunker::with_buffer(&data[..], params, 3, buffer);
        let mut joined = Vec::new();
        let mut cuts = Vec::new();
        while let Some(chunk) = chunker.next_chunk().unwrap() {
            cuts.push((chunk.offset as usize, chunk.data.len()));
            joined.extend_from_slice(chunk.data);
        }
        assert_eq!(&joined, data);
        assert_eq!(cuts, chunk_slice(data, params, 3));
        buffer = chunker.into_buffer();
    }
    assert!(
        buffer.len() >= 64 * 1024,
        "the buffer was kept, not dropped"
    );
}

#[test]
fn the_buffer_grows_past_4_mib_only_for_chunks_that_long() {
    let params = ChunkerParams::DEFAULT;
    let random = random_bytes(30_000_000, 10);
    let mut chunker = Chunker::new(&random[..], params, 0);
    while chunker.next_chunk().unwrap().is_some() {}
    assert_eq!(
        chunker.into_buffer().len(),
        4 << 20,
        "random data: ~1 MiB chunks"
    );

    // Zeros have no boundaries: maximal chunks, which need the buffer at full size, and
    // streaming still cuts where cutting the whole input does.
    let mut data = vec![0u8; 20_000_000];
    data.extend(random_bytes(10_000_000, 11));
    let cuts = stream_cuts(&data[..], params, 0);
    assert_eq!(cuts, chunk_slice(&data, params, 0));
    assert!(cuts.iter().any(|&(_, len)| len == params.max_size as usize));
    let mut chunker = Chunker::new(&data[..], params, 0);
    while chunker.next_chunk().unwrap().is_some() {}
    assert_eq!(chunker.into_buffer().len(), params.max_size as usize);
}

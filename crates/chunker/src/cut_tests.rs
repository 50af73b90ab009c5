use fastcdc::v2020::cut_gear;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use super::*;

/// The gear hash of `bytes` from 0, a byte at a time: what the search must agree with.
fn gear_hash(gear: &Gear, bytes: &[u8]) -> u64 {
    bytes.iter().fold(0, |h: u64, &b| {
        (h << 1).wrapping_add(gear.gear[usize::from(b)])
    })
}

fn random_bytes(len: usize, rng: &mut StdRng) -> Vec<u8> {
    let mut data = vec![0; len];
    rng.fill_bytes(&mut data);
    data
}

/// Random bytes, all zeros, and zeros with a random byte now and then (long runs where
/// the hash repeats, and cut points close together or none at all).
fn inputs(len: usize, rng: &mut StdRng) -> Vec<(&'static str, Vec<u8>)> {
    let mut sparse = vec![0; len];
    for _ in 0..len / 97 {
        let at = rng.gen_range(0..len);
        sparse[at] = rng.gen();
    }
    vec![
        ("random", random_bytes(len, rng)),
        ("zeros", vec![0; len]),
        ("sparse", sparse),
    ]
}

/// Sizes from fastcdc's smallest to the default, with stretches of vector lanes fitting
/// between the minimum and the maximum (all but the first).
fn all_params() -> Vec<ChunkerParams> {
    vec![
        ChunkerParams::new(2 << 10, 8 << 10, 32 << 10).unwrap(),
        ChunkerParams::new(64, 256, 64 << 10).unwrap(),
        ChunkerParams::for_average(64 << 10).unwrap(),
        ChunkerParams::new(4097, 16 << 10, 1 << 20).unwrap(),
        ChunkerParams::DEFAULT,
    ]
}

fn gears(rng: &mut StdRng) -> Vec<Gear> {
    vec![
        Gear::from(0_u64),
        Gear::from(0x5eed_u64),
        Gear::from_table(std::array::from_fn(|_| rng.gen())),
    ]
}

/// The chunk lengths fastcdc's own cut function gives, with the sizes `Cutter` uses.
fn reference(data: &[u8], cutter: &Cutter) -> Vec<usize> {
    let mut lens = Vec::new();
    let mut offset = 0;
    while offset < data.len() {
        let (_, len) = cut_gear(
            &data[offset..],
            cutter.min_size,
            cutter.avg_size,
            cutter.max_size,
            cutter.mask_s,
            cutter.mask_l,
            cutter.mask_s << 1,
            cutter.mask_l << 1,
            &cutter.gear.gear,
            &cutter.gear.gear_ls,
        );
        lens.push(len);
        offset += len;
    }
    lens
}

fn lengths(data: &[u8], cutter: &Cutter) -> Vec<usize> {
    let mut lens = Vec::new();
    let mut offset = 0;
    while offset < data.len() {
        let len = cutter.cut(&data[offset..], 0).len;
        lens.push(len);
        offset += len;
    }
    lens
}

#[test]
fn cut_points_are_fastcdcs_with_and_without_vector_lanes() {
    let mut rng = StdRng::seed_from_u64(7);
    for params in all_params() {
        let len = (params.max_size as usize * 3).min(20 << 20);
        for (kind, data) in inputs(len, &mut rng) {
            for gear in gears(&mut rng) {
                let wide = Cutter::new(params, gear);
                let expected = reference(&data, &wide);
                assert_eq!(lengths(&data, &wide), expected, "{params:?}, {kind} data");
                let narrow = Cutter::new(params, wide.gear.clone()).narrow();
                assert_eq!(
                    lengths(&data, &narrow),
                    expected,
                    "{params:?}, {kind} data, narrow"
                );
            }
        }
    }
}

#[test]
fn every_length_of_input_cuts_as_fastcdc_does() {
    // Short inputs, odd and even, around the minimum, the average and the maximum.
    let mut rng = StdRng::seed_from_u64(8);
    let params = ChunkerParams::for_average(64 << 10).unwrap();
    let data = random_bytes(params.max_size as usize + 100, &mut rng);
    let cutter = Cutter::new(params, Gear::from(0x5eed_u64));
    let narrow = Cutter::new(params, Gear::from(0x5eed_u64)).narrow();
    let mut lens: Vec<usize> = (0..300).map(|_| rng.gen_range(0..data.len())).collect();
    for edge in [params.min_size, params.avg_size, params.max_size] {
        lens.extend((edge as usize - 3)..(edge as usize + 3));
    }
    lens.extend([0, 1, 2, data.len()]);
    for len in lens {
        let expected = reference(&data[..len], &cutter)
            .first()
            .copied()
            .unwrap_or(0);
        assert_eq!(cutter.cut(&data[..len], 0).len, expected, "{len} bytes");
        assert_eq!(
            narrow.cut(&data[..len], 0).len,
            expected,
            "{len} bytes, narrow"
        );
    }
}

#[test]
fn a_search_resumed_on_more_data_finds_the_cut_a_whole_search_finds() {
    let mut rng = StdRng::seed_from_u64(9);
    for params in all_params() {
        let max = params.max_size as usize;
        for (kind, data) in inputs(max + 1, &mut rng) {
            let cutter = Cutter::new(params, Gear::from_table(std::array::from_fn(|_| rng.gen())));
            let whole = cutter.cut(&data, 0);
            for _ in 0..20 {
                // A prefix that ends before the cut, as a chunker's buffer before a refill.
                let short = rng.gen_range(0..=whole.len.min(max));
                let first = cutter.cut(&data[..short], 0);
                if first.len < short {
                    continue;
                }
                assert!(
                    first.scanned <= short,
                    "{params:?}, {kind}: scanned past the data"
                );
                let resumed = cutter.cut(&data, first.scanned);
                assert_eq!(
                    resumed.len, whole.len,
                    "{params:?}, {kind} data, resumed at {short}"
                );
            }
        }
    }
}

#[test]
fn vector_lanes_flag_exactly_the_stretches_holding_a_cut_point() {
    if !wide::available() {
        eprintln!("skipped: this processor has no AVX-512");
        return;
    }
    let mut rng = StdRng::seed_from_u64(10);
    let gear = Gear::from_table(std::array::from_fn(|_| rng.gen()));
    // Masks of 9 to 16 bits: some stretches hold a hit, others none; many runs, so that
    // now and then a hit falls just before a stretch with none, where the lanes' first
    // 64 bytes, hashed but not tested, end.
    for bits in [9, 10, 11, 12, 13, 16] {
        let mask = MASKS[bits];
        for _ in 0..1000 {
            let data = random_bytes(wide::BLOCK + 200, &mut rng);
            let at = rng.gen_range(64..=200);
            let mut expected: u16 = 0;
            for lane in 0..wide::LANES {
                let from = at + lane * wide::STRETCH;
                let mut h = gear_hash(&gear, &data[from - 64..from]);
                for &b in &data[from..from + wide::STRETCH] {
                    h = (h << 1).wrapping_add(gear.gear[usize::from(b)]);
                    if h & mask == 0 {
                        expected |= 1 << lane;
                    }
                }
            }
            let end = at + wide::BLOCK;
            let last = gear_hash(&gear, &data[end - 64..end]);
            // SAFETY: AVX-512F is available (checked above).
            let got = unsafe { wide::block(&gear.gear, &data, at, mask) };
            assert_eq!(got, (expected, last), "mask of {bits} bits at {at}");
        }
    }
}

#[test]
fn the_hash_of_the_64_bytes_before_a_position_is_the_chunks_hash_there() {
    let mut rng = StdRng::seed_from_u64(11);
    let data = random_bytes(4096, &mut rng);
    let cutter = Cutter::new(
        ChunkerParams::DEFAULT,
        Gear::from_table(std::array::from_fn(|_| rng.gen())),
    );
    for _ in 0..200 {
        let start = rng.gen_range(0..2048);
        let j = rng.gen_range(start..data.len());
        let whole = gear_hash(&cutter.gear, &data[start..j]);
        assert_eq!(cutter.hash_before(&data, start, j), whole, "{start}..{j}");
    }
}

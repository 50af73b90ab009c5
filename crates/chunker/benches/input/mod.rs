//! Deterministic benchmark input, shared by the chunker's and core's benches (core
//! includes this file by path): the same bytes on every run and machine, so figures
//! compare across commits. A directory module, so that cargo does not take it for a
//! bench target of its own.

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// Source-like text: indented lines of identifiers, keywords, numbers and punctuation,
/// which zstd shrinks about as much as real code.
pub fn text(len: usize, seed: u64) -> Vec<u8> {
    const WORDS: [&str; 24] = [
        "fn", "let", "mut", "match", "return", "self", "impl", "pub", "struct", "if", "else",
        "for", "in", "while", "Result", "Option", "Vec<u8>", "&str", "u64", "usize", "None",
        "Some", "Ok", "Err",
    ];
    const PUNCT: [&str; 8] = [" = ", ", ", "(", ") ", "{", "}", "; ", ".iter()"];
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(len + 128);
    while out.len() < len {
        let depth = rng.gen_range(0..5);
        out.extend(std::iter::repeat_n(b' ', depth * 4));
        for _ in 0..rng.gen_range(2..10) {
            match rng.gen_range(0..4) {
                0 => out.extend_from_slice(PUNCT[rng.gen_range(0..PUNCT.len())].as_bytes()),
                1 => out.extend_from_slice(format!("x{}", rng.gen_range(0..500)).as_bytes()),
                _ => {
                    out.extend_from_slice(WORDS[rng.gen_range(0..WORDS.len())].as_bytes());
                    out.push(b' ');
                }
            }
        }
        out.push(b'\n');
    }
    out.truncate(len);
    out
}

/// Random bytes: the incompressible case (media, archives, encrypted files).
pub fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill_bytes(&mut out);
    out
}

/// What a backup sees: 64 KiB runs of text (three in four) and of random bytes.
pub fn mixed(len: usize, seed: u64) -> Vec<u8> {
    const RUN: usize = 64 * 1024;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(len + RUN);
    while out.len() < len {
        let run = if rng.gen_ratio(3, 4) {
            text(RUN, rng.next_u64())
        } else {
            random(RUN, rng.next_u64())
        };
        out.extend_from_slice(&run);
    }
    out.truncate(len);
    out
}

//! The offset arithmetic of reads at any offset of a file (the FUSE reader's), over
//! content refs a tree may hold: any offsets and lengths, zero-length refs, reads past
//! the end.
#![no_main]

use cairn_fuzz::structured::ArbRef;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (Vec<ArbRef>, u64, u64, bool)| {
    let (refs, offset, size, small) = input;
    let mut content: Vec<_> = refs.into_iter().map(ArbRef::content_ref).collect();
    if small {
        // Small refs, so that the byte-by-byte model runs.
        for c in &mut content {
            c.len %= 64;
        }
        cairn_fuzz::check_pieces(&content, offset % 4096, size % 4096);
    } else {
        cairn_fuzz::check_pieces(&content, offset, size);
    }
});

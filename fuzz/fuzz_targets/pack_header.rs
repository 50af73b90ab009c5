//! Pack trailers and headers.
//!
//! Input: `body_len:u16le trailer_mode:u8 trailer_len:u32le header_plaintext`. The
//! header plaintext is sealed with the fixed key behind a zeroed body of `body_len` bytes,
//! so the fuzzer reaches postcard decoding and the offset checks; an odd `trailer_mode`
//! writes `trailer_len` as the header length instead of the true one.
#![no_main]

use cairn_core::crypto::Purpose;
use cairn_core::pack::read_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = cairn_fuzz::key();
    // As stored: never opens, but exercises the trailer arithmetic on any length.
    let _ = read_header(key, data);

    let Some((fixed, plain)) = data.split_first_chunk::<7>() else {
        return;
    };
    let body_len = u16::from_le_bytes([fixed[0], fixed[1]]) as usize;
    let sealed = key.seal(Purpose::PackHeader, plain);
    let header_len = if fixed[2] & 1 == 1 {
        u32::from_le_bytes([fixed[3], fixed[4], fixed[5], fixed[6]])
    } else {
        sealed.len() as u32
    };
    let mut pack = vec![0u8; body_len];
    pack.extend_from_slice(&sealed);
    pack.extend_from_slice(&header_len.to_le_bytes());
    if let Ok(entries) = read_header(key, &pack) {
        for e in entries {
            assert!(
                e.offset as usize + e.length as usize <= body_len,
                "accepted an entry outside the body: {e:?}"
            );
        }
    }
});

//! Sealed objects and the codec layer: `seal(raw_len:u32le || codec_tag || body)`.
#![no_main]

use cairn_core::crypto::Purpose;
use cairn_core::object;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = cairn_fuzz::key();
    // As stored: never opens.
    let _ = object::open(key, Purpose::Index, data);
    // The fuzzer's bytes as the sealed plaintext: it picks raw_len, the codec tag and the
    // compressed body, as a writer holding the key could.
    let _ = object::open(key, Purpose::Index, &key.seal(Purpose::Index, data));
    // Whatever is sealed comes back unchanged.
    assert_eq!(
        object::open(
            key,
            Purpose::Index,
            &object::seal(key, Purpose::Index, data)
        )
        .unwrap(),
        data
    );
});

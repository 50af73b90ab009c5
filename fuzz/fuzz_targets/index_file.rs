//! Index files: sealed objects holding postcard.
#![no_main]

use cairn_core::crypto::Purpose;
use cairn_core::index::IndexFile;
use cairn_core::object;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = cairn_fuzz::key();
    // As stored: never opens.
    let _ = IndexFile::open(key, data);
    // The fuzzer's bytes as the postcard plaintext of a well-formed object. The object
    // layer (length prefix, codec) has its own target.
    if let Ok(file) = IndexFile::open(key, &object::seal(key, Purpose::Index, data)) {
        let packs = file.packs.len();
        let again = IndexFile::open(key, &file.seal(key)).expect("a parsed index reparses");
        assert_eq!(again.packs.len(), packs);
    }
});

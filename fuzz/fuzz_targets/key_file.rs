//! Key files: plaintext JSON on storage, and the master key's JSON inside the wrapping.
#![no_main]

use cairn_core::crypto::MasterKey;
use cairn_core::keyfile::KeyFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // What `KeyFile::open` parses once the password has unwrapped the key; the fuzzer
    // cannot make a wrapping that opens, so this layer is fed directly.
    let _ = serde_json::from_slice::<MasterKey>(data);
    if let Ok(file) = KeyFile::from_bytes(data) {
        // Argon2 runs with the file's own costs; only cheap ones are tried (see lib.rs);
        // a blake3 file has none.
        if file.params.is_none_or(cairn_fuzz::cheap_kdf) {
            let _ = file.open(b"fuzz");
        }
        let _ = KeyFile::from_bytes(&file.to_bytes()).expect("a parsed key file reparses");
    }
});

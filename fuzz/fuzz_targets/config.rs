//! The plaintext `config` file, read before anything else in a repository.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cairn_core::config::Config::parse(data);
});

//! Helpers shared by the fuzz targets: a fixed master key, so the targets can seal the
//! fuzzer's bytes and reach the parsers that sit behind authentication.

use std::sync::OnceLock;

use cairn_core::crypto::MasterKey;
use cairn_core::keyfile::KdfParams;

/// One key for the whole process. Built from its serialized form so that it is the same in
/// every run; nothing here depends on its value, only on holding one.
pub fn key() -> &'static MasterKey {
    static KEY: OnceLock<MasterKey> = OnceLock::new();
    KEY.get_or_init(|| {
        let zeros = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        let json = format!(r#"{{"data_key":"{zeros}","id_key":"{zeros}","chunker_seed":0}}"#);
        serde_json::from_str(&json).expect("the fixed key parses")
    })
}

/// Argon2 costs small enough to run on every fuzz input. `KeyFile::open` takes a key file's
/// costs as they are (up to 4 TiB of memory and 2^32 passes), so the targets must not
/// hand it anything bigger.
pub fn cheap_kdf(p: KdfParams) -> bool {
    p.memory_kib <= 256 && p.iterations <= 2 && p.parallelism <= 4
}

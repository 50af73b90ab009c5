//! Whole stored objects that are not packs (index files, snapshots): compressed, then
//! sealed, with the plaintext length inside the seal so nothing outside it is trusted.

use crate::compress::{self, Compression};
use crate::crypto::{MasterKey, Purpose};

/// `seal(raw_len:u32le || tagged compressed plaintext)`. Holds the plaintext, its
/// compressed form and the sealed object, no other copy: an index file written during a
/// backup is megabytes, and the backup's peak memory includes it.
pub fn seal(key: &MasterKey, purpose: Purpose, plain: &[u8]) -> Vec<u8> {
    let packed = compress::compress(Compression::default(), plain);
    key.seal_parts(purpose, &[&(plain.len() as u32).to_le_bytes(), &packed])
}

/// Reverses [`seal`]; the error says what went wrong in words.
pub fn open(key: &MasterKey, purpose: Purpose, stored: &[u8]) -> Result<Vec<u8>, String> {
    let inner = key.open(purpose, stored).map_err(|e| e.to_string())?;
    if inner.len() < 4 {
        return Err("too short".into());
    }
    let raw_len = u32::from_le_bytes(inner[..4].try_into().expect("4 bytes")) as usize;
    compress::decompress(&inner[4..], raw_len).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_round_trip_and_damage_is_caught() {
        let key = MasterKey::generate();
        let plain = b"{\"some\": \"json\"}".repeat(50);
        let stored = seal(&key, Purpose::Index, &plain);
        assert_eq!(open(&key, Purpose::Index, &stored).unwrap(), plain);
        assert!(open(&key, Purpose::Snapshot, &stored).is_err());
        let mut bad = stored.clone();
        bad[30] ^= 4;
        assert!(open(&key, Purpose::Index, &bad).is_err());
    }
}

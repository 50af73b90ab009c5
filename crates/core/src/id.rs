//! Typed 32-byte ids, so a blob id is never mistaken for a pack id across an API.
//!
//! Every object in a repository is named by a 256-bit hash: blobs by the keyed hash of
//! their plaintext, files (packs, indexes, snapshots, keys) by the plain BLAKE3 hash of
//! their stored bytes, so a file's name proves its content without any key.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The raw bytes behind every typed id.
pub type RawId = [u8; 32];

macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub RawId);

        impl $name {
            /// The id as 64 lowercase hex digits.
            pub fn to_hex(&self) -> String {
                hex::encode(self.0)
            }

            /// The first 8 hex digits, as `snapshots` shows them.
            pub fn short(&self) -> String {
                hex::encode(&self.0[..4])
            }

            /// Names the stored file whose bytes are `data`.
            pub fn of_bytes(data: &[u8]) -> Self {
                Self(*blake3::hash(data).as_bytes())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_hex())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.short())
            }
        }

        impl FromStr for $name {
            type Err = hex::FromHexError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let mut raw = [0u8; 32];
                hex::decode_to_slice(s, &mut raw)?;
                Ok(Self(raw))
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                if s.is_human_readable() {
                    s.serialize_str(&self.to_hex())
                } else {
                    self.0.serialize(s)
                }
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                if d.is_human_readable() {
                    let s = String::deserialize(d)?;
                    s.parse().map_err(serde::de::Error::custom)
                } else {
                    RawId::deserialize(d).map(Self)
                }
            }
        }
    };
}

typed_id!(
    /// A blob: a chunk of file data or a serialized tree, named by the repository's keyed hash.
    BlobId
);
typed_id!(
    /// A pack file under `data/`.
    PackId
);
typed_id!(
    /// An index file under `index/`.
    IndexId
);
typed_id!(
    /// A snapshot file under `snapshots/`.
    SnapshotId
);
typed_id!(
    /// A key file under `keys/`.
    KeyId
);

impl PackId {
    /// Storage name: packs are fanned out by the first byte of their id.
    pub fn storage_name(&self) -> String {
        let hex = self.to_hex();
        format!("data/{}/{}", &hex[..2], hex)
    }
}

impl IndexId {
    pub fn storage_name(&self) -> String {
        format!("index/{self}")
    }
}

impl SnapshotId {
    pub fn storage_name(&self) -> String {
        format!("snapshots/{self}")
    }
}

impl KeyId {
    pub fn storage_name(&self) -> String {
        format!("keys/{self}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_hex_and_json() {
        let id = PackId::of_bytes(b"pack");
        assert_eq!(id.to_hex().parse::<PackId>().unwrap(), id);
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{id}\""));
        assert_eq!(serde_json::from_str::<PackId>(&json).unwrap(), id);
        let bin = postcard::to_stdvec(&id).unwrap();
        assert_eq!(bin.len(), 32);
        assert_eq!(postcard::from_bytes::<PackId>(&bin).unwrap(), id);
    }

    #[test]
    fn pack_names_fan_out_by_first_byte() {
        let id = PackId([0xab; 32]);
        assert!(id.storage_name().starts_with("data/ab/abab"));
    }
}

//! The repository's `config` file: the one plaintext file besides key files. It says which
//! format version wrote the repository and how data is chunked, named and compressed, so a
//! reader can refuse what it does not understand before touching anything else.

use cairn_chunker::ChunkerParams;
use serde::{Deserialize, Serialize};

use crate::compress::Compression;

/// The newest repository format this binary reads and writes.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    /// Format version; a reader refuses anything newer than [`FORMAT_VERSION`].
    pub version: u32,
    /// Random id of the repository, fixed at init.
    pub id: String,
    pub chunker: ChunkerConfig,
    /// Keyed hash naming blobs.
    pub hash: String,
    pub compression: Compression,
    /// Target size of a pack file in bytes.
    pub pack_size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChunkerConfig {
    pub algorithm: String,
    pub min_size: u32,
    pub avg_size: u32,
    pub max_size: u32,
}

impl ChunkerConfig {
    pub fn fastcdc(p: ChunkerParams) -> Self {
        ChunkerConfig {
            algorithm: "fastcdc-2020".into(),
            min_size: p.min_size,
            avg_size: p.avg_size,
            max_size: p.max_size,
        }
    }
}

/// Peeks at the version before parsing the rest, so a newer format with fields this
/// binary does not know still gets the "newer version" message rather than a parse error.
#[derive(Deserialize)]
struct VersionOnly {
    version: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("format version {0} is not one this cairn reads")]
    UnsupportedVersion(u32),
    #[error("{0}")]
    Malformed(String),
}

impl Config {
    /// Parses and validates a `config` file.
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        let malformed = |e: &dyn std::fmt::Display| ConfigError::Malformed(e.to_string());
        let version: VersionOnly = serde_json::from_slice(bytes).map_err(|e| malformed(&e))?;
        if version.version > FORMAT_VERSION || version.version == 0 {
            return Err(ConfigError::UnsupportedVersion(version.version));
        }
        let config: Config = serde_json::from_slice(bytes).map_err(|e| malformed(&e))?;
        let c = &config.chunker;
        if c.algorithm != "fastcdc-2020" {
            return Err(malformed(&format!("unknown chunker {:?}", c.algorithm)));
        }
        ChunkerParams::new(c.min_size, c.avg_size, c.max_size).map_err(|e| malformed(&e))?;
        if config.hash != "blake3-keyed" {
            return Err(malformed(&format!("unknown hash {:?}", config.hash)));
        }
        if let Compression::Zstd { level } = config.compression {
            if !(1..=22).contains(&level) {
                return Err(malformed(&format!("zstd level {level} is outside 1-22")));
            }
        }
        if !(1 << 20..=1 << 30).contains(&config.pack_size) {
            return Err(malformed(&format!(
                "pack size {} is outside 1 MiB-1 GiB",
                config.pack_size
            )));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> serde_json::Value {
        serde_json::json!({
            "version": 1, "id": "ab", "hash": "blake3-keyed", "pack_size": 16777216,
            "compression": {"codec": "zstd", "level": 3},
            "chunker": {"algorithm": "fastcdc-2020", "min_size": 524288, "avg_size": 1048576, "max_size": 8388608}
        })
    }

    #[test]
    fn a_valid_config_parses() {
        let c = Config::parse(sample().to_string().as_bytes()).unwrap();
        assert_eq!(c.chunker.avg_size, 1 << 20);
    }

    #[test]
    fn a_newer_version_is_named_even_with_unknown_fields() {
        let v = serde_json::json!({"version": 2, "something_new": true});
        assert!(matches!(
            Config::parse(v.to_string().as_bytes()),
            Err(ConfigError::UnsupportedVersion(2))
        ));
    }

    #[test]
    fn invalid_settings_are_refused() {
        for (field, value) in [
            ("hash", serde_json::json!("md5")),
            ("pack_size", serde_json::json!(0)),
            (
                "compression",
                serde_json::json!({"codec": "zstd", "level": 99}),
            ),
        ] {
            let mut v = sample();
            v[field] = value;
            assert!(Config::parse(v.to_string().as_bytes()).is_err(), "{field}");
        }
        let mut v = sample();
        v["chunker"]["min_size"] = serde_json::json!(4 << 20);
        assert!(Config::parse(v.to_string().as_bytes()).is_err());
    }
}

//! The repository's `config` file: the one plaintext file besides key files. It says which
//! format version wrote the repository and how data is chunked, named and compressed, so a
//! reader can refuse what it does not understand before touching anything else. From
//! format 2 its settings carry a MAC under a subkey of the master key: whoever can write
//! to the storage cannot change them (see [`Config::authenticate`]).

use cairn_chunker::ChunkerParams;
use serde::{Deserialize, Serialize};

use crate::compress::Compression;
use crate::crypto::{Cipher, MasterKey};

/// The newest repository format this binary reads and writes.
pub const FORMAT_VERSION: u32 = 4;

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
    /// Format 2: the AEAD sealing every object; absent means XChaCha20-Poly1305 (format 1,
    /// and format 2 repositories made before the choice existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cipher: Option<Cipher>,
    /// Format 2: hex keyed BLAKE3 of the settings above (the JSON of this struct without
    /// `mac`), under the master key's config MAC key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
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
    #[error("{0}")]
    NotAuthentic(String),
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

    /// The AEAD that seals this repository's objects.
    pub fn cipher(&self) -> Cipher {
        self.cipher.unwrap_or_default()
    }

    /// The bytes the MAC covers: the settings, serialized without the MAC.
    fn settings(&self) -> Vec<u8> {
        let unsigned = Config {
            mac: None,
            ..self.clone()
        };
        serde_json::to_vec(&unsigned).expect("a config serializes")
    }

    /// Sets the MAC (format 2); format 1 configs have none.
    pub fn sign(&mut self, key: &MasterKey) {
        self.mac = (self.version >= 2).then(|| hex::encode(key.config_mac(&self.settings())));
    }

    /// A write-only key for this repository, made with its full `key`: it carries this
    /// config's MAC to compare, since it cannot compute one.
    pub fn write_only_key(&self, key: &MasterKey) -> Result<MasterKey, String> {
        key.write_only(&self.settings())
    }

    /// Checks that `key` belongs to a repository of this config's format and, from format
    /// 2, that the settings are the ones written at `init`. Run before any setting is used:
    /// changed chunker sizes, codec or pack size are refused, not followed.
    pub fn authenticate(&self, key: &MasterKey) -> Result<(), ConfigError> {
        if key.format() != self.version {
            return Err(ConfigError::NotAuthentic(format!(
                "it says format {} but the key is for format {}: the config was replaced",
                self.version,
                key.format()
            )));
        }
        if self.version == 1 {
            return match self.cipher {
                None => Ok(()),
                Some(_) => Err(ConfigError::NotAuthentic(
                    "it names a cipher, which format 1 does not have".into(),
                )),
            };
        }
        if key.vouches_for(&self.settings(), self.mac.as_deref()) {
            return Ok(());
        }
        match (&self.mac, key.is_write_only()) {
            (_, true) => Err(ConfigError::NotAuthentic(
                "its settings are not the ones this write-only key was made for: they were \
                 changed after `init`"
                    .into(),
            )),
            (Some(_), false) => Err(ConfigError::NotAuthentic(
                "its settings do not match their MAC: they were changed after `init`".into(),
            )),
            (None, false) => Err(ConfigError::NotAuthentic("it has no MAC".into())),
        }
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
        let newer = FORMAT_VERSION + 1;
        let v = serde_json::json!({"version": newer, "something_new": true});
        assert!(matches!(
            Config::parse(v.to_string().as_bytes()),
            Err(ConfigError::UnsupportedVersion(n)) if n == newer
        ));
    }

    /// The format 1 finding: the plaintext config's chunker sizes, codec and pack size were
    /// followed whatever they said.
    #[test]
    fn changed_settings_or_a_changed_version_are_refused() {
        let key = MasterKey::generate();
        let mut v = sample();
        v["version"] = FORMAT_VERSION.into();
        v["cipher"] = "aegis-256".into();
        let mut config = Config::parse(v.to_string().as_bytes()).unwrap();
        config.sign(&key);
        let stored = serde_json::to_value(&config).unwrap();
        let reread = Config::parse(stored.to_string().as_bytes()).unwrap();
        reread.authenticate(&key).unwrap();
        // A write-only key compares the MAC it was made with.
        let writer = reread.write_only_key(&key).unwrap();
        reread.authenticate(&writer).unwrap();
        let mut tampered = Vec::new();
        for (path, value) in [
            (&["chunker", "min_size"][..], serde_json::json!(65536)),
            (&["chunker", "avg_size"], serde_json::json!(2097152)),
            (&["compression"], serde_json::json!({"codec": "none"})),
            (&["pack_size"], serde_json::json!(1 << 20)),
            (&["cipher"], serde_json::json!("xchacha20-poly1305")),
            (&["id"], serde_json::json!("cd")),
            (&["mac"], serde_json::json!("00")),
        ] {
            let mut t = stored.clone();
            match path {
                [a] => t[a] = value,
                [a, b] => t[a][b] = value,
                _ => unreachable!(),
            }
            tampered.push(t);
        }
        for field in ["mac", "cipher"] {
            let mut without = stored.clone();
            without.as_object_mut().unwrap().remove(field);
            tampered.push(without);
        }
        for t in tampered {
            let c = Config::parse(t.to_string().as_bytes()).unwrap();
            assert!(
                matches!(c.authenticate(&key), Err(ConfigError::NotAuthentic(_))),
                "{t}"
            );
            // The write-only key judges the settings, not the MAC it cannot check.
            let settings_changed = t.get("mac") == stored.get("mac");
            assert_eq!(
                matches!(c.authenticate(&writer), Err(ConfigError::NotAuthentic(_))),
                settings_changed,
                "{t}"
            );
        }
        // Back to format 1, where there is no MAC: the key says format 2.
        let mut downgraded = stored.clone();
        downgraded["version"] = 1.into();
        let with_cipher = Config::parse(downgraded.to_string().as_bytes()).unwrap();
        downgraded.as_object_mut().unwrap().remove("cipher");
        let c = Config::parse(downgraded.to_string().as_bytes()).unwrap();
        for c in [c, with_cipher.clone()] {
            assert!(matches!(
                c.authenticate(&key),
                Err(ConfigError::NotAuthentic(_))
            ));
        }
        // Nor does a format 1 key vouch for a format 1 config naming a cipher.
        assert!(matches!(
            with_cipher.authenticate(&MasterKey::generate_for(1)),
            Err(ConfigError::NotAuthentic(_))
        ));
        // Another repository's key does not vouch for it.
        assert!(reread.authenticate(&MasterKey::generate()).is_err());
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
        let mut v = sample();
        v["cipher"] = "rot13".into();
        assert!(Config::parse(v.to_string().as_bytes()).is_err());
    }
}

//! Who may do what: tokens with rights on one repository each, and quotas, kept in
//! `DIR/.cairn-serve/access.json`.
//!
//! The file holds no token, only its BLAKE3 hash: a token is 32 random bytes, far beyond
//! guessing, so a fast hash suffices (a password hash such as Argon2 is for secrets
//! people choose) and a request costs one hash to check. The `cairn serve token`
//! commands edit the file (atomically: a temporary file renamed over it); a running
//! server notices the change by its modification time and reloads it.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// What a token may do in its repository. Each right includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rights {
    /// Read and list objects.
    Read,
    /// Also create new objects in the repository's layout, each verified against its
    /// name, but not the config or key files; never overwrite or delete, except the
    /// session files this token wrote.
    Append,
    /// Also create the config and key files (init, key add), and delete objects (prune,
    /// forget); deleted objects are kept for the deletion delay before they are freed.
    Maintain,
    /// Also delete key files, and write names outside the repository layout without
    /// verification (the storage conformance suite does). The operator's own token.
    Admin,
}

impl Rights {
    pub fn as_str(self) -> &'static str {
        match self {
            Rights::Read => "read",
            Rights::Append => "append",
            Rights::Maintain => "maintain",
            Rights::Admin => "admin",
        }
    }
}

impl FromStr for Rights {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "read" => Ok(Rights::Read),
            "append" => Ok(Rights::Append),
            "maintain" => Ok(Rights::Maintain),
            "admin" => Ok(Rights::Admin),
            _ => Err(format!(
                "{s:?} is not a right: use read, append, maintain or admin"
            )),
        }
    }
}

/// One token, as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TokenEntry {
    /// Chosen by the operator, unique: names the token in `token list`, `token remove`
    /// and the access log.
    pub name: String,
    pub repo: String,
    pub rights: Rights,
    /// Hex BLAKE3 hash of the token.
    pub hash: String,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// Bytes this token may upload in all, if limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_bytes: Option<u64>,
}

/// The contents of `access.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Access {
    #[serde(default)]
    pub tokens: Vec<TokenEntry>,
    /// Bytes each repository may hold, live and deleted objects together.
    #[serde(default)]
    pub repo_quotas: BTreeMap<String, u64>,
}

/// The server's own directory inside DIR: never a repository (repository names may
/// not start with a dot).
pub const STATE_DIR: &str = ".cairn-serve";

pub fn access_file(dir: &Path) -> PathBuf {
    dir.join(STATE_DIR).join("access.json")
}

/// Whether `name` may name a repository: one name component, not hidden, so that no
/// repository is the server's own directory.
pub fn valid_repo_name(name: &str) -> bool {
    !name.contains('/') && !name.starts_with('.') && cairn_storage::is_valid_name(name)
}

pub fn hash_token(token: &str) -> blake3::Hash {
    blake3::hash(token.as_bytes())
}

impl Access {
    /// The file in `dir`, or an empty one if there is none yet.
    pub fn load(dir: &Path) -> Result<Access> {
        let path = access_file(dir);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
                path,
                reason: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Access::default()),
            Err(e) => Err(Error::io("read", &path, e)),
        }
    }

    /// Replaces the file atomically, readable by its owner only.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = access_file(dir);
        let json = serde_json::to_vec_pretty(self).expect("access serializes");
        write_atomically(&path, &json)
    }

    /// Adds a token and returns it; the only time it exists outside a client.
    pub fn add_token(
        &mut self,
        name: &str,
        repo: &str,
        rights: Rights,
        quota_bytes: Option<u64>,
    ) -> Result<String> {
        if !valid_repo_name(name) {
            return Err(Error::Invalid(format!(
                "{name:?} cannot name a token: use letters, digits, '.', '_' and '-', not starting with '.'"
            )));
        }
        if !valid_repo_name(repo) {
            return Err(Error::Invalid(format!(
                "{repo:?} cannot name a repository: use one name of letters, digits, '.', '_' \
                 and '-', not starting with '.'"
            )));
        }
        if self.tokens.iter().any(|t| t.name == name) {
            return Err(Error::Invalid(format!(
                "A token named {name} exists already: remove it first, or choose another name"
            )));
        }
        let token = format!("cairn-{}", hex::encode(rand::random::<[u8; 32]>()));
        self.tokens.push(TokenEntry {
            name: name.to_string(),
            repo: repo.to_string(),
            rights,
            hash: hash_token(&token).to_hex().to_string(),
            created: now_secs(),
            quota_bytes,
        });
        Ok(token)
    }

    pub fn remove_token(&mut self, name: &str) -> Result<TokenEntry> {
        let at = self
            .tokens
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "No token is named {name}: see `cairn serve token list`"
                ))
            })?;
        Ok(self.tokens.remove(at))
    }

    /// The entry of a presented token.
    pub fn find(&self, presented: &str) -> Option<&TokenEntry> {
        let hash = hash_token(presented);
        // `blake3::Hash` compares in constant time.
        self.tokens
            .iter()
            .find(|t| blake3::Hash::from_hex(&t.hash).is_ok_and(|stored| stored == hash))
    }
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Writes `path` through a temporary file renamed over it, 0600.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    create_private_dirs(dir)?;
    let tmp = dir.join(format!(".tmp-{}", hex::encode(rand::random::<[u8; 8]>())));
    let result = (|| {
        let mut options = fs::OpenOptions::new();
        options.write(true).create_new(true);
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(|e| Error::io("write", path, e))
}

pub(crate) fn create_private_dirs(dir: &Path) -> Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|e| Error::io("create", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_found_by_itself_and_stored_only_as_its_hash() {
        let dir = tempfile::tempdir().unwrap();
        let mut access = Access::default();
        let token = access
            .add_token("laptop", "home", Rights::Append, None)
            .unwrap();
        access.save(dir.path()).unwrap();
        let stored = fs::read_to_string(access_file(dir.path())).unwrap();
        assert!(!stored.contains(&token), "the token itself is not stored");
        let access = Access::load(dir.path()).unwrap();
        assert_eq!(access.find(&token).map(|t| t.name.as_str()), Some("laptop"));
        assert!(access.find("cairn-0000").is_none());
    }

    #[test]
    fn rights_include_the_lesser_ones() {
        assert!(Rights::Admin > Rights::Maintain);
        assert!(Rights::Maintain > Rights::Append);
        assert!(Rights::Append > Rights::Read);
        assert!("owner".parse::<Rights>().is_err());
    }

    #[test]
    fn repository_names_cannot_reach_outside_dir_or_the_server_state() {
        for bad in ["", ".", "..", ".cairn-serve", "a/b", "../x", "a b"] {
            assert!(!valid_repo_name(bad), "{bad:?}");
        }
        assert!(valid_repo_name("laptop-1"));
    }
}

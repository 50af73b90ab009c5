//! Repository key management: opening a repository with a secret (which key files are
//! tried, in which order, and how much work that may cost), and listing, adding and
//! removing key files and changing a password.
//!
//! Key files are plaintext on storage and anyone who can write there can add one, with
//! whatever Argon2 costs they like. So: costs above [`crate::keyfile::MAX_WORK`] are
//! refused unread; the key file that opened the repository last time (client state) is
//! tried first, alone, so a known client pays for one derivation whatever else is in
//! `keys/`; the others are tried cheapest first; and the work spent on files that do not
//! open is bounded by [`SEARCH_BUDGET`], so a command's worst case is a few seconds, not
//! one derivation per planted file. Never: write a `blake3` key file for a password a
//! person chose, or remove the key file that opened the repository or the last one.

use std::sync::Mutex;

use cairn_storage::Storage;
use serde::Serialize;
use zeroize::Zeroizing;

use crate::client_state::{ClientState, StateOptions};
use crate::config::Config;
use crate::crypto::MasterKey;
use crate::error::{Error, Result};
use crate::id::{KeyId, SnapshotId};
use crate::keyfile::{Kdf, KdfParams, KeyFile, KeyFileError, RandomSecret, DEFAULT_WORK};
use crate::repo::Repository;

/// The most Argon2 work one command spends on key files that do not open: 32 key files
/// at our default costs, or two at the per-file cap, about 2.6 s on 2 cores. Without a
/// bound, N planted files cost N derivations (listing them is free for whoever planted
/// them); restic bounds the count instead (20 key files). A repository with more keys
/// than this still opens for the clients that opened it before (their key file is
/// remembered) and for cheap keys (tried first).
pub const SEARCH_BUDGET: u64 = 32 * DEFAULT_WORK;

/// The secret that opens a repository.
pub enum Secret {
    /// A password a person chose: only Argon2id key files are tried with it.
    Password(Zeroizing<Vec<u8>>),
    /// A 256-bit secret cairn generated: `blake3` key files too, and new key files for it
    /// are `blake3` (no stretching).
    Random(RandomSecret),
}

impl Secret {
    /// A secret given as text (a password file, the default key file, a prompt): one
    /// that has the exact form cairn generates (64 lowercase hex digits) is taken for a
    /// random one, wherever it comes from (a copy of the default key file restores on
    /// another machine), anything else for a password.
    pub fn from_text(text: &str) -> Secret {
        match RandomSecret::from_text(text) {
            Some(random) => Secret::Random(random),
            None => Secret::Password(Zeroizing::new(text.as_bytes().to_vec())),
        }
    }

    fn open(&self, file: &KeyFile) -> std::result::Result<MasterKey, KeyFileError> {
        match self {
            Secret::Password(pw) => file.open(pw),
            Secret::Random(secret) => file.open_random(secret),
        }
    }

    /// Wraps `key` in a new key file for this secret: Argon2id with `kdf` for a password,
    /// BLAKE3 for a random secret. Only pass a random secret that cairn generated.
    fn key_file(&self, key: &MasterKey, kdf: KdfParams, host: &str) -> KeyFile {
        match self {
            Secret::Password(pw) => KeyFile::create(key, pw, kdf, host),
            Secret::Random(secret) => KeyFile::create_for_random(key, secret, host),
        }
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Secret::Password(_) => "Secret::Password(..)",
            Secret::Random(_) => "Secret::Random(..)",
        })
    }
}

impl From<&[u8]> for Secret {
    fn from(password: &[u8]) -> Self {
        Secret::Password(Zeroizing::new(password.to_vec()))
    }
}

impl<const N: usize> From<&[u8; N]> for Secret {
    fn from(password: &[u8; N]) -> Self {
        Secret::from(&password[..])
    }
}

impl From<RandomSecret> for Secret {
    fn from(secret: RandomSecret) -> Self {
        Secret::Random(secret)
    }
}

/// What opens a repository: the secret and, optionally, where this client keeps its state
/// of repositories (see [`crate::client_state`]).
#[derive(Debug)]
pub struct Credentials {
    pub secret: Secret,
    pub state: Option<StateOptions>,
}

impl From<Secret> for Credentials {
    fn from(secret: Secret) -> Self {
        Credentials {
            secret,
            state: None,
        }
    }
}

impl From<&[u8]> for Credentials {
    fn from(password: &[u8]) -> Self {
        Secret::from(password).into()
    }
}

impl<const N: usize> From<&[u8; N]> for Credentials {
    fn from(password: &[u8; N]) -> Self {
        Secret::from(password).into()
    }
}

/// How an open repository was opened: the key file, and this client's state for it.
#[derive(Debug, Default)]
pub struct Access {
    key_file: Mutex<Option<KeyId>>,
    state: Option<ClientState>,
}

impl Access {
    /// The key file that opened the repository (`None` for one assembled otherwise).
    pub fn key_file(&self) -> Option<KeyId> {
        *self.key_file.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_key_file(&self, id: KeyId) {
        *self.key_file.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
        if let Some(state) = &self.state {
            state.set_key_file(id);
        }
    }

    pub fn client_state(&self) -> Option<&ClientState> {
        self.state.as_ref()
    }

    /// Hook: the repository's snapshots were listed.
    pub fn saw_snapshots(&self, ids: &[SnapshotId]) {
        if let Some(state) = &self.state {
            state.saw_snapshots(ids);
        }
    }

    /// Hook: this client removed snapshots.
    pub fn removed_snapshots(&self, ids: &[SnapshotId]) {
        if let Some(state) = &self.state {
            state.removed_snapshots(ids);
        }
    }

    /// Hook: the trash was read whole, at `observed` (`None`: not whole).
    pub fn saw_trash(&self, observed: Option<u64>) {
        if let (Some(state), Some(generation)) = (&self.state, observed) {
            state.saw_trash_generation(generation);
        }
    }
}

/// Opens the master key of the repository whose config is `config`.
pub(crate) fn open(
    storage: &dyn Storage,
    config: &Config,
    credentials: Credentials,
) -> Result<(MasterKey, Access)> {
    let state = credentials
        .state
        .as_ref()
        .and_then(|o| ClientState::open(o, &config.id));
    let remembered = state.as_ref().and_then(ClientState::key_file);
    let (key, id) = unlock(storage, &credentials.secret, remembered, SEARCH_BUDGET)?;
    let access = Access {
        key_file: Mutex::new(None),
        state,
    };
    access.set_key_file(id);
    Ok((key, access))
}

impl Access {
    /// The access of a repository just created with key file `key_file`.
    pub(crate) fn new(key_file: KeyId, state: Option<&StateOptions>, repo_id: &str) -> Self {
        let access = Access {
            key_file: Mutex::new(None),
            state: state.and_then(|o| ClientState::open(o, repo_id)),
        };
        access.set_key_file(key_file);
        access
    }
}

/// Writes a key file wrapping `key` for `secret` (see [`Secret`]); returns its id.
pub(crate) fn write_key_file(
    storage: &dyn Storage,
    key: &MasterKey,
    secret: &Secret,
    kdf: KdfParams,
    host: &str,
) -> Result<KeyId> {
    let bytes = secret.key_file(key, kdf, host).to_bytes();
    let id = KeyId::of_bytes(&bytes);
    storage.write(&id.storage_name(), &bytes)?;
    Ok(id)
}

/// Key file `id` as read from storage, or why it does not parse (the outer error: it
/// could not be read).
fn read_key_file(storage: &dyn Storage, id: KeyId) -> Result<std::result::Result<KeyFile, String>> {
    let bytes = storage.read(&id.storage_name())?;
    Ok(KeyFile::from_bytes(&bytes).map_err(|e| e.to_string()))
}

/// Every key file's id; names that are not one are returned apart.
fn key_ids(storage: &dyn Storage) -> Result<(Vec<KeyId>, Vec<String>)> {
    let mut ids = Vec::new();
    let mut others = Vec::new();
    for name in storage.list("keys")? {
        match name.strip_prefix("keys/").and_then(|hex| hex.parse().ok()) {
            Some(id) => ids.push(id),
            None => others.push(name),
        }
    }
    Ok((ids, others))
}

/// What trying one key file came to.
enum Tried {
    Opened(Box<MasterKey>),
    /// The secret does not open it: this much work was spent.
    Wrong(u64),
    /// A random key file, not tried with a typed password.
    NotForPasswords,
    Unusable(String),
}

fn try_one(secret: &Secret, id: KeyId, file: &KeyFile) -> Tried {
    match secret.open(file) {
        Ok(key) => Tried::Opened(Box::new(key)),
        Err(KeyFileError::WrongPassword) => Tried::Wrong(file.work().unwrap_or(0)),
        Err(KeyFileError::NotForPasswords) => Tried::NotForPasswords,
        Err(e) => Tried::Unusable(format!("{}: {e}", id.storage_name())),
    }
}

/// What one search for the key file has spent and found so far.
#[derive(Default)]
struct Search {
    /// Work spent on key files the secret did not open.
    spent: u64,
    tried: usize,
    /// Random key files not tried with a typed password.
    not_for_passwords: usize,
    problems: Vec<String>,
}

impl Search {
    fn note(&mut self, outcome: Tried) -> Option<Box<MasterKey>> {
        match outcome {
            Tried::Opened(key) => return Some(key),
            Tried::Wrong(work) => {
                self.tried += 1;
                self.spent += work;
            }
            Tried::NotForPasswords => self.not_for_passwords += 1,
            Tried::Unusable(problem) => self.problems.push(problem),
        }
        None
    }
}

/// Finds the key file `secret` opens: `remembered` first, then the others cheapest first,
/// spending at most `budget` on files that do not open.
fn unlock(
    storage: &dyn Storage,
    secret: &Secret,
    remembered: Option<KeyId>,
    budget: u64,
) -> Result<(MasterKey, KeyId)> {
    let location = storage.location();
    let (ids, others) = key_ids(storage)?;
    let mut search = Search {
        problems: others
            .iter()
            .map(|n| format!("{n}: not named as a key file"))
            .collect(),
        ..Search::default()
    };
    if ids.is_empty() {
        let mut reason = vec!["there are no key files, so nothing can be decrypted".into()];
        reason.append(&mut search.problems);
        return Err(Error::CorruptObject {
            location,
            name: "keys/".into(),
            reason: reason.join("; "),
        });
    }
    let unusable = |id: KeyId, e: &dyn std::fmt::Display| {
        Tried::Unusable(format!("{}: {e}", id.storage_name()))
    };

    // The key file that opened the repository before, alone: the common case reads and
    // derives once, whatever else `keys/` holds.
    let remembered = remembered.filter(|r| ids.contains(r));
    if let Some(id) = remembered {
        let outcome = match read_key_file(storage, id)? {
            Ok(file) => try_one(secret, id, &file),
            Err(e) => unusable(id, &e),
        };
        if let Some(key) = search.note(outcome) {
            return Ok((*key, id));
        }
    }

    let mut candidates = Vec::new();
    for id in ids.iter().copied().filter(|id| Some(*id) != remembered) {
        let file = match read_key_file(storage, id)? {
            Ok(file) => file,
            Err(e) => {
                search.note(unusable(id, &e));
                continue;
            }
        };
        match file.kdf() {
            // Never tried with a password: no work, and no reason to call it a problem.
            Ok(Kdf::Blake3) if matches!(secret, Secret::Password(_)) => {
                search.note(Tried::NotForPasswords);
            }
            Ok(_) => candidates.push((file.work().unwrap_or(0), id, file)),
            Err(e) => {
                search.note(unusable(id, &e));
            }
        }
    }
    candidates.sort_by_key(|(work, id, _)| (*work, *id));
    let mut untried = Vec::new();
    for (work, id, file) in &candidates {
        if !untried.is_empty() || search.spent + work > budget {
            untried.push(id.short());
            continue;
        }
        if let Some(key) = search.note(try_one(secret, *id, file)) {
            return Ok((*key, *id));
        }
    }
    if !untried.is_empty() {
        return Err(Error::KeySearchStopped {
            location,
            tried: search.tried,
            untried,
        });
    }
    if search.tried == 0 && search.not_for_passwords == 0 {
        return Err(Error::CorruptObject {
            location,
            name: "keys/".into(),
            reason: search.problems.join("; "),
        });
    }
    Err(Error::WrongPassword { location })
}

/// One key file, as `cairn key list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct KeyInfo {
    pub id: KeyId,
    /// Whether it is the key file that opened the repository.
    pub current: bool,
    pub host: String,
    pub created: Option<jiff::Timestamp>,
    /// How it derives its wrapping key, e.g. `argon2id 64 MiB x3 x4`.
    pub kdf: String,
    /// Why it cannot be used, if it cannot.
    pub problem: Option<String>,
    /// It says it writes but cannot read (its file's plaintext hint; see
    /// [`crate::keyfile::KeyFile::kind`]).
    pub write_only: bool,
}

/// Every key file of the repository, the current one first, then by creation time.
pub fn list(repo: &Repository) -> Result<Vec<KeyInfo>> {
    let storage = repo.storage().as_ref();
    let current = repo.access().key_file();
    let (ids, _) = key_ids(storage)?;
    let mut out = Vec::new();
    for id in ids {
        let info = match read_key_file(storage, id)? {
            Ok(file) => {
                let (kdf, problem) = match file.kdf() {
                    Ok(kdf) => (kdf.to_string(), None),
                    Err(e) => (file.kdf.clone(), Some(e.to_string())),
                };
                KeyInfo {
                    id,
                    current: Some(id) == current,
                    host: file.host,
                    created: Some(file.created),
                    kdf,
                    problem,
                    write_only: file.kind.as_deref() == Some("write-only"),
                }
            }
            Err(e) => KeyInfo {
                id,
                current: false,
                host: String::new(),
                created: None,
                kdf: String::new(),
                problem: Some(e),
                write_only: false,
            },
        };
        out.push(info);
    }
    out.sort_by_key(|k| (!k.current, k.created, k.id));
    Ok(out)
}

/// Adds a key file that `secret` opens, wrapping the repository's master key: Argon2id
/// with `kdf` for a password; BLAKE3 for a random secret, which must be one cairn has
/// just generated. Returns its id.
pub fn add(repo: &Repository, secret: &Secret, kdf: KdfParams, host: &str) -> Result<KeyId> {
    write_key_file(repo.storage().as_ref(), repo.key(), secret, kdf, host)
}

/// Adds a write-only key file (format 3) that `secret` opens: it backs up into this
/// repository but cannot read it. Made from a full key.
pub fn add_write_only(
    repo: &Repository,
    secret: &Secret,
    kdf: KdfParams,
    host: &str,
) -> Result<KeyId> {
    let key = repo
        .config()
        .write_only_key(repo.key())
        .map_err(Error::InvalidInput)?;
    write_key_file(repo.storage().as_ref(), &key, secret, kdf, host)
}

/// The key file whose id is `spec` or starts with it.
pub fn resolve(repo: &Repository, spec: &str) -> Result<KeyId> {
    let location = repo.storage().location();
    let spec_lower = spec.to_ascii_lowercase();
    let (ids, _) = key_ids(repo.storage().as_ref())?;
    let matches: Vec<KeyId> = if spec.is_empty() {
        Vec::new()
    } else {
        ids.into_iter()
            .filter(|id| id.to_hex().starts_with(&spec_lower))
            .collect()
    };
    match matches.as_slice() {
        [id] => Ok(*id),
        [] => Err(Error::KeyNotFound {
            location,
            spec: spec.to_string(),
        }),
        many => Err(Error::KeyAmbiguous {
            spec: spec.to_string(),
            candidates: many.iter().map(KeyId::short).collect(),
        }),
    }
}

/// Removes key file `id`; refuses the one that opened the repository and the last one.
pub fn remove(repo: &Repository, id: KeyId) -> Result<()> {
    let storage = repo.storage().as_ref();
    let location = storage.location();
    if repo.key().is_write_only() {
        return Err(Error::WriteOnlyKey {
            action: "remove key files".into(),
        });
    }
    if repo.access().key_file() == Some(id) {
        return Err(Error::KeyInUse { id: id.short() });
    }
    let (ids, _) = key_ids(storage)?;
    if !ids.contains(&id) {
        return Err(Error::KeyNotFound {
            location,
            spec: id.to_hex(),
        });
    }
    if ids.len() < 2 {
        return Err(Error::LastKey {
            id: id.short(),
            location,
        });
    }
    cairn_storage::delete_if_present(storage, &id.storage_name())?;
    Ok(())
}

/// Replaces the key file that opened the repository with one for `secret`: the new file
/// is written (durably) before the old one is removed, so a crash between leaves both.
/// Returns the new id and the removed one.
pub fn change(
    repo: &Repository,
    secret: &Secret,
    kdf: KdfParams,
    host: &str,
) -> Result<(KeyId, KeyId)> {
    let new = add(repo, secret, kdf, host)?;
    let old = switch_to(repo, new)?;
    Ok((new, old))
}

/// Makes key file `new` (just added) the one in use, and removes the one that opened the
/// repository; returns the removed one's id.
pub fn switch_to(repo: &Repository, new: KeyId) -> Result<KeyId> {
    let old = repo.access().key_file().ok_or_else(|| {
        Error::InvalidInput("This repository was not opened with a key file".into())
    })?;
    repo.access().set_key_file(new);
    remove(repo, old)?;
    Ok(old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyfile::MAX_WORK;
    use crate::repo::test_repository;

    const FAST: KdfParams = KdfParams {
        memory_kib: 8,
        iterations: 1,
        parallelism: 1,
    };

    fn plant(repo: &Repository, params: KdfParams) -> KeyId {
        // A key file some stranger wrote: another master key, another password.
        let mut file = KeyFile::create(&MasterKey::generate(), b"not yours", FAST, "x");
        file.params = Some(params);
        let bytes = file.to_bytes();
        let id = KeyId::of_bytes(&bytes);
        repo.storage().write(&id.storage_name(), &bytes).unwrap();
        id
    }

    #[test]
    fn several_passwords_open_the_same_repository_and_the_current_one_is_marked() {
        let dir = tempfile::tempdir().unwrap();
        let repo = test_repository(dir.path());
        let first = repo.access().key_file().unwrap();
        let second = add(&repo, &Secret::from(b"second"), FAST, "h").unwrap();
        let storage = std::sync::Arc::clone(repo.storage());
        let reopened = Repository::open_without_index(storage, b"second").unwrap();
        assert_eq!(reopened.access().key_file(), Some(second));
        assert_eq!(reopened.key().blob_id(b"x"), repo.key().blob_id(b"x"));
        let listed = list(&reopened).unwrap();
        assert_eq!(listed.len(), 2);
        assert!(listed[0].current && listed[0].id == second);
        assert!(!listed[1].current && listed[1].id == first);
    }

    #[test]
    fn the_key_in_use_and_the_last_key_are_not_removed() {
        let dir = tempfile::tempdir().unwrap();
        let repo = test_repository(dir.path());
        let current = repo.access().key_file().unwrap();
        assert!(matches!(
            remove(&repo, current),
            Err(Error::KeyInUse { .. })
        ));
        let other = add(&repo, &Secret::from(b"other"), FAST, "h").unwrap();
        let storage = std::sync::Arc::clone(repo.storage());
        let by_other = Repository::open_without_index(storage, b"other").unwrap();
        remove(&by_other, current).unwrap();
        // Now `other` is the only key: opened by it, it is in use; and it is the last.
        assert!(matches!(
            remove(&by_other, other),
            Err(Error::KeyInUse { .. })
        ));
        assert!(matches!(remove(&repo, other), Err(Error::LastKey { .. })));
    }

    #[test]
    fn a_changed_password_opens_and_the_old_one_no_longer_does() {
        let dir = tempfile::tempdir().unwrap();
        let repo = test_repository(dir.path());
        let (new, old) = change(&repo, &Secret::from(b"new"), FAST, "h").unwrap();
        assert_ne!(new, old);
        assert_eq!(repo.access().key_file(), Some(new));
        let storage = std::sync::Arc::clone(repo.storage());
        assert!(matches!(
            Repository::open_without_index(storage.clone(), b"pw"),
            Err(Error::WrongPassword { .. })
        ));
        assert!(Repository::open_without_index(storage, b"new").is_ok());
    }

    #[test]
    fn key_files_are_tried_cheapest_first_and_costs_above_the_cap_never() {
        let dir = tempfile::tempdir().unwrap();
        let repo = test_repository(dir.path());
        // Within the cap but far costlier than the real key: tried after it, so never.
        plant(
            &repo,
            KdfParams {
                memory_kib: 1 << 20,
                iterations: 3,
                parallelism: 1,
            },
        );
        // Above the cap: refused unread.
        plant(
            &repo,
            KdfParams {
                memory_kib: 4 << 20,
                iterations: 64,
                parallelism: 4,
            },
        );
        let storage = std::sync::Arc::clone(repo.storage());
        let (opened, derivations) =
            crate::keyfile::derivations_in(|| Repository::open_without_index(storage, b"pw"));
        assert!(opened.is_ok());
        assert_eq!(derivations, 1, "the real key only");
    }

    #[test]
    fn the_work_spent_on_key_files_that_do_not_open_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let repo = test_repository(dir.path());
        let planted_cost = KdfParams {
            memory_kib: 64,
            iterations: 1,
            parallelism: 1,
        };
        let _planted: Vec<KeyId> = (0..5).map(|_| plant(&repo, planted_cost)).collect();
        let storage = repo.storage().as_ref();
        // The real key (8 KiB x 1) and four planted ones fit; the fifth does not.
        let budget = 8 + 4 * planted_cost.work();
        assert!(unlock(storage, &Secret::from(b"pw"), None, budget).is_ok());
        match unlock(storage, &Secret::from(b"wrong"), None, budget) {
            Err(Error::KeySearchStopped { tried, untried, .. }) => {
                assert_eq!(tried, 5, "the real key and four planted ones");
                assert_eq!(untried.len(), 1);
            }
            Err(e) => panic!("expected a stopped search, got {e:?}"),
            Ok(_) => panic!("a wrong password opened"),
        }
        // The real budget pays for 32 key files at our default costs.
        assert_eq!(SEARCH_BUDGET / DEFAULT_WORK, 32);
        const { assert!(MAX_WORK < SEARCH_BUDGET) };
    }

    #[test]
    fn a_typed_password_never_opens_a_random_key_file() {
        let dir = tempfile::tempdir().unwrap();
        let repo = test_repository(dir.path());
        let secret = RandomSecret::generate();
        let id = add(&repo, &Secret::Random(secret.clone()), FAST, "h").unwrap();
        let storage = std::sync::Arc::clone(repo.storage());
        let opened =
            Repository::open_without_index(storage.clone(), Secret::Random(secret.clone()))
                .unwrap();
        assert_eq!(opened.access().key_file(), Some(id));
        let typed = Secret::Password(Zeroizing::new(secret.as_text().as_bytes().to_vec()));
        assert!(matches!(
            Repository::open_without_index(storage, typed),
            Err(Error::WrongPassword { .. })
        ));
    }
}

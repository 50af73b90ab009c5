//! What a running server shares between requests: the access file (reloaded when the
//! `token` commands change it), bytes used per repository and per token (for quotas),
//! and which token wrote each session file.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use cairn_storage::LocalStorage;

use crate::access::{write_atomically, Access, TokenEntry, STATE_DIR};
use crate::{deleted, Error, Result, ServeOptions};

pub(crate) struct State {
    pub options: ServeOptions,
    access: Mutex<LoadedAccess>,
    usage: Mutex<Usage>,
    stores: Mutex<HashMap<String, LocalStorage>>,
}

struct LoadedAccess {
    access: Arc<Access>,
    modified: Option<SystemTime>,
    checked: Instant,
}

#[derive(Default)]
struct Usage {
    /// Bytes stored per repository, held deleted objects included; computed on first use.
    repos: HashMap<String, u64>,
    /// Bytes uploaded per token (by its hash), persisted in `usage.json`.
    tokens: BTreeMap<String, u64>,
}

/// A quota that an upload would exceed, as the client is told.
pub(crate) struct QuotaExceeded(pub String);

/// The least an object counts for against quotas: its file and inode cost the server a
/// block however short it is, and a token could otherwise store millions of empty
/// objects under any quota.
const LEAST_CHARGE: u64 = 4096;

/// What an object of `len` bytes counts for against quotas.
pub(crate) fn charged(len: u64) -> u64 {
    len.max(LEAST_CHARGE)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    pub fn new(options: ServeOptions) -> Result<State> {
        let access = Access::load(&options.dir)?;
        let tokens = match fs::read(usage_file(&options.dir)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
                path: usage_file(&options.dir),
                reason: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(Error::io("read", &usage_file(&options.dir), e)),
        };
        Ok(State {
            access: Mutex::new(LoadedAccess {
                access: Arc::new(access),
                modified: modified(&crate::access::access_file(&options.dir)),
                checked: Instant::now(),
            }),
            usage: Mutex::new(Usage {
                repos: HashMap::new(),
                tokens,
            }),
            stores: Mutex::default(),
            options,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.options.dir
    }

    /// The access file as it is now (looked at no more than once a second, unless
    /// `now`: a token that was not found may have been added this very second).
    pub fn access(&self, now: bool) -> Result<Arc<Access>> {
        let mut loaded = lock(&self.access);
        if now || loaded.checked.elapsed().as_millis() >= 1000 {
            loaded.checked = Instant::now();
            let now = modified(&crate::access::access_file(self.dir()));
            if now != loaded.modified {
                loaded.access = Arc::new(Access::load(self.dir())?);
                loaded.modified = now;
            }
        }
        Ok(Arc::clone(&loaded.access))
    }

    pub fn store(&self, repo: &str) -> LocalStorage {
        lock(&self.stores)
            .entry(repo.to_string())
            .or_insert_with(|| LocalStorage::new(self.dir().join(repo)))
            .clone()
    }

    /// Counts an object of `len` bytes ([`charged`]) against the quotas of `repo` and
    /// `token`, or says which one it would exceed.
    pub fn reserve(
        &self,
        repo: &str,
        token: &TokenEntry,
        len: u64,
        access: &Access,
    ) -> std::result::Result<(), QuotaExceeded> {
        let len = charged(len);
        let mut usage = lock(&self.usage);
        if !usage.repos.contains_key(repo) {
            let used = repo_bytes(self.dir(), repo).unwrap_or(0);
            usage.repos.insert(repo.to_string(), used);
        }
        let repo_used = usage.repos[repo];
        if let Some(&quota) = access.repo_quotas.get(repo) {
            if repo_used.saturating_add(len) > quota {
                return Err(QuotaExceeded(format!(
                    "the repository {repo} would exceed its quota of {quota} bytes ({repo_used} \
                     used, deleted objects held for the deletion delay included, {len} more \
                     asked, an object counting for {LEAST_CHARGE} bytes at least): ask the \
                     server's operator for more room (`cairn serve quota`), or forget and \
                     prune snapshots"
                )));
            }
        }
        let token_used = usage.tokens.get(&token.hash).copied().unwrap_or(0);
        if let Some(quota) = token.quota_bytes {
            if token_used.saturating_add(len) > quota {
                return Err(QuotaExceeded(format!(
                    "the token {} would exceed its quota of {quota} uploaded bytes ({token_used} \
                     used, {len} more asked, an object counting for {LEAST_CHARGE} bytes at least): \
                     ask the server's operator for a new token",
                    token.name
                )));
            }
        }
        *usage.repos.entry(repo.to_string()).or_default() += len;
        *usage.tokens.entry(token.hash.clone()).or_default() += len;
        Ok(())
    }

    /// Gives back what [`reserve`](Self::reserve) counted, for an upload that failed.
    pub fn release(&self, repo: &str, token: &TokenEntry, len: u64) {
        let len = charged(len);
        let mut usage = lock(&self.usage);
        if let Some(used) = usage.repos.get_mut(repo) {
            *used = used.saturating_sub(len);
        }
        if let Some(used) = usage.tokens.get_mut(&token.hash) {
            *used = used.saturating_sub(len);
        }
    }

    /// Persists the tokens' usage after an upload was stored.
    pub fn save_usage(&self) -> Result<()> {
        let usage = lock(&self.usage);
        let json = serde_json::to_vec(&usage.tokens).expect("usage serializes");
        write_atomically(&usage_file(self.dir()), &json)
    }

    /// Objects of `repo` that counted `bytes` against its quota ([`charged`]) were freed.
    pub fn freed(&self, repo: &str, bytes: u64) {
        if let Some(used) = lock(&self.usage).repos.get_mut(repo) {
            *used = used.saturating_sub(bytes);
        }
    }

    /// Records that `token` wrote the session file `name`.
    pub fn record_owner(&self, repo: &str, name: &str, token: &TokenEntry) -> Result<()> {
        write_atomically(&self.owner_file(repo, name), token.hash.as_bytes())
    }

    /// Whether `token` wrote the session file `name`.
    pub fn is_owner(&self, repo: &str, name: &str, token: &TokenEntry) -> bool {
        fs::read(self.owner_file(repo, name)).is_ok_and(|owner| owner == token.hash.as_bytes())
    }

    pub fn forget_owner(&self, repo: &str, name: &str) {
        let _ = fs::remove_file(self.owner_file(repo, name));
    }

    fn owner_file(&self, repo: &str, name: &str) -> PathBuf {
        // Session names are `sessions/<hash>`: one flat directory per repository.
        let file = name.rsplit('/').next().unwrap_or(name);
        self.dir()
            .join(STATE_DIR)
            .join("owners")
            .join(repo)
            .join(file)
    }
}

fn usage_file(dir: &Path) -> PathBuf {
    dir.join(STATE_DIR).join("usage.json")
}

fn modified(path: &Path) -> Option<SystemTime> {
    fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// What a repository's objects and its held deleted ones count for against its quota.
pub(crate) fn repo_bytes(dir: &Path, repo: &str) -> Result<u64> {
    let store = LocalStorage::new(dir.join(repo));
    let mut total = deleted::held_bytes(dir, repo)?;
    for name in cairn_storage::Storage::list(&store, "")? {
        total += charged(cairn_storage::Storage::size(&store, &name).unwrap_or(0));
    }
    Ok(total)
}

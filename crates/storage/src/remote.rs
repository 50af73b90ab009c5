//! S3 and SFTP storage through Apache OpenDAL, behind the same [`Storage`] trait as a
//! local directory.
//!
//! OpenDAL is async; cairn's core is synchronous, so each store owns a small tokio runtime
//! and calls OpenDAL's blocking operator. Requests are retried with exponential backoff
//! and jitter on transient failures (6 retries, or `CAIRN_RETRIES`), time out, and are
//! limited in number at once.
//! Every request is counted by kind, so `--stats` can show what a command cost.
//!
//! Write-once: S3 writes check that the key is free and send `If-None-Match: *`, which
//! AWS enforces and some compatible servers ignore (names are content hashes, so a lost
//! race writes the same bytes).
//! SFTP writes go to a temporary name and are renamed into place; OpenSSH's rename does
//! not replace an existing file.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use opendal::layers::{ConcurrentLimitLayer, RetryLayer, TimeoutLayer};
use opendal::{blocking, ErrorKind, Operator};

use crate::counts::{add, bump, RequestCounts};
use crate::error::{Result, StorageError};
use crate::name::{is_temporary_name, validate_name};
use crate::Storage;

/// Where an S3 store is and how to sign requests.
#[derive(Debug, Clone)]
pub struct S3Config {
    /// `http(s)://host[:port]`
    pub endpoint: String,
    pub bucket: String,
    /// Key prefix inside the bucket, without leading or trailing `/`.
    pub prefix: String,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub profile: Option<String>,
}

/// Where an SFTP store is. Authentication is the `ssh` client's: the user's
/// `~/.ssh/config`, agent, keys and known_hosts.
#[derive(Debug, Clone)]
pub struct SftpConfig {
    /// `[user@]host[:port]` as `ssh` takes it.
    pub host: String,
    pub user: Option<String>,
    pub port: Option<u16>,
    /// Absolute path of the repository on the server.
    pub path: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    S3,
    Sftp,
}

/// A store reached through OpenDAL.
pub struct RemoteStorage {
    op: blocking::Operator,
    kind: Kind,
    location: String,
    counts: Arc<RequestCounts>,
    // Kept alive for the blocking operator; dropped last.
    _runtime: Arc<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for RemoteStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStorage")
            .field("location", &self.location)
            .finish()
    }
}

/// Concurrent requests per S3 store; enough to keep a pack upload and reads busy.
const MAX_CONCURRENT_REQUESTS: usize = 16;

/// Concurrent requests per SFTP store. Each one holds its own `ssh` connection, and
/// sixteen handshakes at once on a loaded machine outlasted OpenDAL's 10 s wait for a
/// connection, which leaks the `ssh` master (see `ssh_orphans`).
const MAX_CONCURRENT_SFTP_REQUESTS: usize = 4;

/// Retries of a request that failed in a way worth retrying, unless `CAIRN_RETRIES` says
/// otherwise. With backoff from 200 ms doubling to at most 10 s, 6 retries ride out about
/// 13 s of trouble; a user on a flaky link may want more, a test that cuts the connection
/// on purpose fewer.
const DEFAULT_RETRIES: usize = 6;

/// Whole attempts at an SFTP upload; see [`RemoteStorage::write`].
const SFTP_WRITE_ATTEMPTS: u32 = 3;

pub(crate) fn retries(location: &str) -> Result<usize> {
    match std::env::var("CAIRN_RETRIES") {
        Err(_) => Ok(DEFAULT_RETRIES),
        Ok(v) => v.trim().parse().map_err(|e| StorageError::Remote {
            op: "connect to",
            name: String::new(),
            location: location.to_string(),
            hint: "CAIRN_RETRIES must be a whole number of retries, such as 6",
            source: Box::new(e),
        }),
    }
}

impl RemoteStorage {
    pub fn s3(config: &S3Config, location: String) -> Result<Self> {
        // OpenDAL's HTTP client, installed here rather than by its constructor at every
        // start (the `auto-register-services` feature, off: see Cargo.toml). Idempotent.
        opendal::install_default();
        let mut b = opendal::services::S3::default()
            .endpoint(&config.endpoint)
            .bucket(&config.bucket)
            .root(&format!("/{}", config.prefix))
            .region(config.region.as_deref().unwrap_or("us-east-1"));
        if let Some(k) = &config.access_key_id {
            b = b.access_key_id(k);
        }
        if let Some(k) = &config.secret_access_key {
            b = b.secret_access_key(k);
        }
        if let Some(p) = &config.profile {
            b = b.profile(p);
        }
        let op = Operator::new(b).map_err(|e| config_error(&location, e))?;
        Self::with_operator(op, Kind::S3, location)
    }

    pub fn sftp(config: &SftpConfig, location: String) -> Result<Self> {
        // Before any `ssh` starts: the masters it starts stay our children, so that Drop
        // can tell them from other programs' (see `ssh_orphans`).
        crate::ssh_orphans::adopt_orphaned_descendants();
        let endpoint = match config.port {
            Some(port) => format!("ssh://{}:{port}", config.host),
            None => config.host.clone(),
        };
        let mut b = opendal::services::Sftp::default()
            .endpoint(&endpoint)
            .root(&config.path);
        if let Some(user) = &config.user {
            b = b.user(user);
        }
        let op = Operator::new(b).map_err(|e| config_error(&location, e))?;
        Self::with_operator(op, Kind::Sftp, location)
    }

    fn with_operator(op: Operator, kind: Kind, location: String) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| StorageError::Io {
                op: "start the I/O runtime for",
                name: String::new(),
                location: location.clone(),
                source: e,
            })?;
        let op = op
            .layer(
                TimeoutLayer::new()
                    .with_timeout(Duration::from_secs(60))
                    .with_io_timeout(Duration::from_secs(30)),
            )
            .layer(
                RetryLayer::new()
                    .with_jitter()
                    .with_max_times(retries(&location)?)
                    .with_min_delay(Duration::from_millis(200))
                    .with_max_delay(Duration::from_secs(10)),
            )
            .layer(ConcurrentLimitLayer::new(match kind {
                Kind::S3 => MAX_CONCURRENT_REQUESTS,
                Kind::Sftp => MAX_CONCURRENT_SFTP_REQUESTS,
            }));
        let op = {
            let _guard = runtime.enter();
            blocking::Operator::new(op).map_err(|e| config_error(&location, e))?
        };
        Ok(RemoteStorage {
            op,
            kind,
            location,
            counts: Arc::new(RequestCounts::default()),
            _runtime: Arc::new(runtime),
        })
    }

    fn check(&self, name: &str) -> Result<()> {
        if validate_name(name) {
            Ok(())
        } else {
            Err(StorageError::InvalidName {
                name: name.to_string(),
                location: self.location.clone(),
            })
        }
    }

    fn error(&self, op: &'static str, name: &str, e: opendal::Error) -> StorageError {
        let (name, location) = (name.to_string(), self.location.clone());
        match e.kind() {
            // A write that finds nothing found no bucket or directory to write into, which
            // is not the missing object the caller would take it for.
            ErrorKind::NotFound if op != "write" => StorageError::NotFound { name, location },
            ErrorKind::AlreadyExists | ErrorKind::ConditionNotMatch => {
                StorageError::AlreadyExists { name, location }
            }
            kind => {
                let hint = match kind {
                    // AWS answers 403, which would otherwise read as bad credentials.
                    _ if refuses_the_clock(&e) => {
                        "the server refused the request's time: check this host's clock \
                         (S3 servers refuse requests signed by a clock far from theirs: AWS \
                         beyond 15 minutes)"
                    }
                    ErrorKind::PermissionDenied => {
                        "permission denied: check the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, \
                         or the SSH key) and that they may use this bucket or path"
                    }
                    ErrorKind::NotFound => {
                        "the bucket or directory does not exist and could not be created: \
                         check the path in the repository address and that the server may create it"
                    }
                    // OpenDAL reports S3's NoSuchBucket as invalid settings; say which one.
                    ErrorKind::ConfigInvalid if e.to_string().contains("NoSuchBucket") => {
                        "the bucket does not exist: check the bucket name in the repository \
                         address, or create the bucket"
                    }
                    ErrorKind::ConfigInvalid => "the repository address or settings are invalid",
                    ErrorKind::RateLimited => "the server kept refusing requests as too many, even after retries",
                    _ => {
                        "the server could not be reached, refused the request or kept failing after \
                         retries: check the address, the network and that the server is up"
                    }
                };
                StorageError::Remote {
                    op,
                    name,
                    location,
                    hint,
                    source: Box::new(e),
                }
            }
        }
    }

    fn stat_len(&self, name: &str) -> Result<Option<u64>> {
        bump(&self.counts.head);
        match self.op.stat(name) {
            // A directory is not an object.
            Ok(meta) if meta.is_dir() => Ok(None),
            Ok(meta) => Ok(Some(meta.content_length())),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.error("look up", name, e)),
        }
    }

    /// Every file below `dir`, recursively, with the metadata the listing gave: names
    /// not yet checked against the naming rules.
    fn entries(&self, dir: &str) -> Result<Vec<(String, opendal::Metadata)>> {
        if !dir.is_empty() {
            self.check(dir)?;
        }
        bump(&self.counts.list);
        let path = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let opts = opendal::options::ListOptions {
            recursive: true,
            ..Default::default()
        };
        let entries = match self.op.list_options(&path, opts) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.error("list", dir, e)),
        };
        Ok(entries
            .into_iter()
            .filter(|e| e.metadata().is_file())
            .map(|e| {
                let name = e.path().trim_start_matches('/').to_string();
                (name, e.metadata().clone())
            })
            .collect())
    }

    /// A listed file's modification time: from the listing where it has one (S3 and
    /// SFTP listings do), else from a stat; `None` if the file is gone meanwhile.
    fn modified(&self, name: &str, listed: &opendal::Metadata) -> Result<Option<SystemTime>> {
        if let Some(t) = listed.last_modified() {
            return Ok(Some(t.into()));
        }
        bump(&self.counts.head);
        match self.op.stat(name) {
            Ok(meta) => match meta.last_modified() {
                Some(t) => Ok(Some(t.into())),
                None => Err(StorageError::Remote {
                    op: "look up",
                    name: name.to_string(),
                    location: self.location.clone(),
                    hint: "the server gives no modification time for files, which cairn needs \
                           to tell a running backup from a crashed one",
                    source: "no modification time".into(),
                }),
            },
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.error("look up", name, e)),
        }
    }

    fn tmp_name(name: &str) -> String {
        let (dir, file) = name.rsplit_once('/').unwrap_or(("", name));
        let tmp = format!(".tmp-{}-{file}", hex::encode(rand::random::<[u8; 8]>()));
        if dir.is_empty() {
            tmp
        } else {
            format!("{dir}/{tmp}")
        }
    }
}

impl Drop for RemoteStorage {
    fn drop(&mut self) {
        if self.kind == Kind::Sftp {
            crate::ssh_orphans::end_orphaned_masters();
        }
    }
}

/// Whether an S3 server refused a request because it was signed by a clock too far
/// from the server's: AWS's `RequestTimeTooSkewed`, Garage's "Date is too old".
fn refuses_the_clock(e: &opendal::Error) -> bool {
    let text = e.to_string();
    text.contains("RequestTimeTooSkewed") || text.contains("Date is too old")
}

fn config_error(location: &str, e: opendal::Error) -> StorageError {
    StorageError::Remote {
        op: "connect to",
        name: String::new(),
        location: location.to_string(),
        hint: "the repository address or settings are invalid",
        source: Box::new(e),
    }
}

impl Storage for RemoteStorage {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn read(&self, name: &str) -> Result<Vec<u8>> {
        self.check(name)?;
        bump(&self.counts.get);
        let data = self
            .op
            .read(name)
            .map(|b| b.to_vec())
            .map_err(|e| self.error("read", name, e))?;
        add(&self.counts.bytes_received, data.len());
        Ok(data)
    }

    fn read_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.check(name)?;
        let truncated = |size| crate::range_truncated(self, name, offset, len, size);
        let end = match crate::range_end(self, name, offset, len) {
            Ok(end) => end,
            Err(answer) => return answer,
        };
        bump(&self.counts.get);
        let opts = opendal::options::ReadOptions {
            range: (offset..end).into(),
            ..Default::default()
        };
        let data = match self.op.read_options(name, opts) {
            Ok(b) => b.to_vec(),
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(self.error("read", name, e)),
            // Servers report a range past the end in different ways (416, or a short
            // read): the size tells whether the object is too short.
            Err(e) => match self.stat_len(name)? {
                Some(size) if end > size => return Err(truncated(size)),
                _ => return Err(self.error("read", name, e)),
            },
        };
        add(&self.counts.bytes_received, data.len());
        if data.len() as u64 != len {
            return Err(truncated(self.stat_len(name)?.unwrap_or(0)));
        }
        Ok(data)
    }

    fn write(&self, name: &str, data: &[u8]) -> Result<()> {
        self.check(name)?;
        let exists = |s: &Self| -> Result<()> {
            match s.stat_len(name)? {
                Some(_) => Err(StorageError::AlreadyExists {
                    name: name.to_string(),
                    location: s.location.clone(),
                }),
                None => Ok(()),
            }
        };
        match self.kind {
            Kind::S3 => {
                // If-None-Match makes AWS refuse an existing key, but some S3-compatible
                // servers (Garage 2.5) ignore it: look first as well.
                exists(self)?;
                bump(&self.counts.put);
                add(&self.counts.bytes_sent, data.len());
                let opts = opendal::options::WriteOptions {
                    if_not_exists: self.op.info().capability().write_with_if_not_exists,
                    ..Default::default()
                };
                self.op
                    .write_options(name, data.to_vec(), opts)
                    .map(|_| ())
                    .map_err(|e| self.error("write", name, e))
            }
            Kind::Sftp => {
                exists(self)?;
                // A connection cut during an upload takes the writer with it, and the
                // retry layer retries that same writer: whole new attempts, each with a
                // new temporary name on a connection from the pool, get through.
                let mut attempts_left = SFTP_WRITE_ATTEMPTS;
                let tmp = loop {
                    let tmp = Self::tmp_name(name);
                    bump(&self.counts.put);
                    add(&self.counts.bytes_sent, data.len());
                    match self.op.write(&tmp, data.to_vec()) {
                        Ok(_) => break tmp,
                        Err(e) => {
                            let _ = self.op.delete(&tmp);
                            attempts_left -= 1;
                            if attempts_left == 0 || e.kind() != ErrorKind::Unexpected {
                                return Err(self.error("write", name, e));
                            }
                        }
                    }
                };
                bump(&self.counts.rename);
                self.op.rename(&tmp, name).map_err(|e| {
                    let _ = self.op.delete(&tmp);
                    self.error("write", name, e)
                })
            }
        }
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .entries(dir)?
            .into_iter()
            .map(|(name, _)| name)
            .filter(|n| validate_name(n))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn list_modified(&self, dir: &str) -> Result<Vec<(String, SystemTime)>> {
        let mut out = Vec::new();
        for (name, meta) in self.entries(dir)? {
            if !validate_name(&name) {
                continue;
            }
            if let Some(time) = self.modified(&name, &meta)? {
                out.push((name, time));
            }
        }
        out.sort();
        out.dedup_by(|a, b| a.0 == b.0);
        Ok(out)
    }

    fn temporaries(&self) -> Result<Vec<(String, SystemTime)>> {
        if self.kind == Kind::S3 {
            // Single PUTs: nothing is ever written under a temporary name.
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for (name, meta) in self.entries("")? {
            if is_temporary_name(&name) {
                if let Some(time) = self.modified(&name, &meta)? {
                    out.push((name, time));
                }
            }
        }
        Ok(out)
    }

    fn delete_temporary(&self, name: &str) -> Result<()> {
        if !is_temporary_name(name) {
            return Err(StorageError::InvalidName {
                name: name.to_string(),
                location: self.location.clone(),
            });
        }
        bump(&self.counts.delete);
        self.op
            .delete(name)
            .map_err(|e| self.error("delete", name, e))
    }

    fn size(&self, name: &str) -> Result<u64> {
        self.check(name)?;
        self.stat_len(name)?.ok_or_else(|| StorageError::NotFound {
            name: name.to_string(),
            location: self.location.clone(),
        })
    }

    fn exists(&self, name: &str) -> Result<bool> {
        self.check(name)?;
        Ok(self.stat_len(name)?.is_some())
    }

    fn request_counts(&self) -> Option<Arc<RequestCounts>> {
        Some(Arc::clone(&self.counts))
    }

    fn create_is_exclusive(&self) -> bool {
        // Not every S3-compatible server honours If-None-Match, and SFTP's rename replaces.
        false
    }

    fn delete(&self, name: &str) -> Result<()> {
        // S3 deletes of missing keys succeed; look first to keep the trait's contract.
        if !self.exists(name)? {
            return Err(StorageError::NotFound {
                name: name.to_string(),
                location: self.location.clone(),
            });
        }
        bump(&self.counts.delete);
        self.op
            .delete(name)
            .map_err(|e| self.error("delete", name, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_refusals_of_a_skewed_clock_are_told_apart() {
        for message in [
            r#"S3Error { code: "RequestTimeTooSkewed", message: "The difference between the request time and the current time is too large." }"#,
            r#"S3Error { code: "InvalidRequest", message: "Bad request: Date is too old" }"#,
        ] {
            assert!(refuses_the_clock(&opendal::Error::new(
                ErrorKind::PermissionDenied,
                message
            )));
        }
        assert!(!refuses_the_clock(&opendal::Error::new(
            ErrorKind::PermissionDenied,
            r#"S3Error { code: "InvalidAccessKeyId" }"#
        )));
    }
}

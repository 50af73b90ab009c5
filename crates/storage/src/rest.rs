//! A repository on a `cairn serve` server, reached over HTTP(S): `rest:https://HOST[:PORT]/REPO`.
//!
//! The protocol is small and mirrors the [`Storage`] trait, one request per call:
//!
//! | call | request | answers |
//! | --- | --- | --- |
//! | read, read_range | `GET /REPO/NAME` (with `Range: bytes=A-B`) | 200 / 206, 404, 416 |
//! | size, exists | `HEAD /REPO/NAME` | 200 with `Content-Length`, 404 |
//! | write | `PUT /REPO/NAME` with `Content-Length` | 201, 409 exists, 400 / 403 / 413 refused, 507 quota |
//! | delete | `DELETE /REPO/NAME` | 204, 404, 403 |
//! | list, list_modified | `GET /REPO?list=DIR` | 200 with a JSON array of [`ListEntry`] |
//!
//! Every request carries `Authorization: Bearer TOKEN` (`CAIRN_REST_TOKEN`). The server
//! writes each object under a temporary name and links it into place, so writes are
//! create-only and atomic and nothing temporary is ever visible to a client.
//!
//! Failures are retried as the S3 and SFTP backends retry theirs (`CAIRN_RETRIES`,
//! default 6, backoff from 200 ms doubling to 10 s, with jitter): a connection that
//! failed or was cut, a timeout, 5xx answers other than 507, 408 and 429. A refusal
//! (4xx, 507) is final and its reason, the server's own words, reaches the user.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::header::{AUTHORIZATION, CONTENT_LENGTH, RANGE};
use reqwest::{Method, StatusCode};

use crate::counts::{add, bump, RequestCounts};
use crate::error::{Result, StorageError};
use crate::name::{is_temporary_name, validate_name};
use crate::Storage;

/// The environment variable holding the token a client presents.
pub const TOKEN_VAR: &str = "CAIRN_REST_TOKEN";

/// One file of a listing, as the server sends it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ListEntry {
    pub name: String,
    /// Modification time by the server's clock, nanoseconds since the Unix epoch.
    pub modified_ns: u64,
}

/// Where a `cairn serve` repository is and how to reach it.
#[derive(Debug, Clone)]
pub struct RestConfig {
    /// `http(s)://host[:port]`, without a trailing slash.
    pub endpoint: String,
    /// The repository's name on the server: one path component.
    pub repo: String,
    /// The bearer token (`CAIRN_REST_TOKEN`).
    pub token: Option<String>,
    /// A PEM file of the certificate authorities to trust instead of the system's
    /// (`--cacert`), for a server whose certificate a private CA signed.
    pub ca_cert: Option<PathBuf>,
}

/// A repository on a `cairn serve` server.
pub struct RestStorage {
    client: Client,
    base: String,
    location: String,
    token: Option<String>,
    retries: usize,
    counts: Arc<RequestCounts>,
}

impl std::fmt::Debug for RestStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("RestStorage")
            .field("location", &self.location)
            .finish()
    }
}

/// The longest refusal text taken from a server into an error message.
const MAX_REASON: usize = 400;

impl RestStorage {
    pub fn new(config: &RestConfig, location: String) -> Result<Self> {
        let config_error =
            |hint: &'static str, source: Box<dyn std::error::Error + Send + Sync>| {
                StorageError::Remote {
                    op: "connect to",
                    name: String::new(),
                    location: location.clone(),
                    hint,
                    source,
                }
            };
        let mut builder = Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(600))
            .pool_max_idle_per_host(16)
            // Authorization must not follow a redirect to another host.
            .redirect(reqwest::redirect::Policy::none());
        if let Some(path) = &config.ca_cert {
            let pem = std::fs::read(path).map_err(|e| StorageError::Io {
                op: "read the CA certificate",
                name: path.display().to_string(),
                location: location.clone(),
                source: e,
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                config_error(
                    "the --cacert file holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                    Box::new(e),
                )
            })?;
            builder = builder.tls_certs_only(certs);
        }
        let client = builder
            .build()
            .map_err(|e| config_error("the TLS settings could not be used", Box::new(e)))?;
        Ok(RestStorage {
            client,
            base: format!("{}/{}", config.endpoint, config.repo),
            retries: crate::remote::retries(&location)?,
            location,
            token: config.token.clone(),
            counts: Arc::new(RequestCounts::default()),
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

    fn request(&self, method: Method, url: &str) -> RequestBuilder {
        let request = self.client.request(method, url);
        match &self.token {
            Some(token) => request.header(AUTHORIZATION, format!("Bearer {token}")),
            None => request,
        }
    }

    /// Sends the request `build` makes, again after transient failures, and returns the
    /// first answer that is not one (which may still be a refusal: see [`Self::refused`]),
    /// and whether an attempt before it failed.
    fn send(
        &self,
        op: &'static str,
        name: &str,
        counter: &AtomicU64,
        build: impl Fn() -> RequestBuilder,
    ) -> Result<(Response, bool)> {
        bump(counter);
        let mut delay = Duration::from_millis(200);
        let mut attempt = 0;
        loop {
            let failure: Box<dyn std::error::Error + Send + Sync> = match build().send() {
                Ok(response) if !is_transient(response.status()) => {
                    return Ok((response, attempt > 0))
                }
                Ok(response) => format!("the server answered {}", response.status()).into(),
                Err(e) => Box::new(e),
            };
            if attempt >= self.retries {
                return Err(StorageError::Remote {
                    op,
                    name: name.to_string(),
                    location: self.location.clone(),
                    hint: "the server could not be reached, or kept failing after retries: \
                           check the address, the network and that `cairn serve` is running",
                    source: failure,
                });
            }
            attempt += 1;
            // Full jitter, so that many clients cut off at once do not return at once.
            let jittered = delay.mul_f64(0.5 + rand::random::<f64>() / 2.0);
            std::thread::sleep(jittered);
            delay = (delay * 2).min(Duration::from_secs(10));
        }
    }

    /// The error for an answer that is a refusal, with the server's reason.
    fn refused(&self, op: &'static str, name: &str, response: Response) -> StorageError {
        let (name, location) = (name.to_string(), self.location.clone());
        match response.status() {
            StatusCode::NOT_FOUND => StorageError::NotFound { name, location },
            StatusCode::CONFLICT => StorageError::AlreadyExists { name, location },
            status => {
                let text = response.text().unwrap_or_default();
                let mut reason: String = text
                    .chars()
                    .filter(|c| !c.is_control())
                    .take(MAX_REASON)
                    .collect();
                if reason.is_empty() {
                    reason = status.to_string();
                }
                if status == StatusCode::UNAUTHORIZED {
                    reason.push_str(&format!(
                        " (set {TOKEN_VAR} to the token `cairn serve token add` made for this \
                         repository)"
                    ));
                }
                StorageError::Refused {
                    op,
                    name,
                    location,
                    status: status.as_u16(),
                    reason,
                }
            }
        }
    }

    fn url(&self, name: &str) -> String {
        format!("{}/{name}", self.base)
    }

    /// The object's size, `None` if it does not exist.
    fn head(&self, name: &str) -> Result<Option<u64>> {
        self.check(name)?;
        let url = self.url(name);
        let response = self
            .send("look up", name, &self.counts.head, || {
                self.request(Method::HEAD, &url)
            })?
            .0;
        match response.status() {
            StatusCode::OK => content_length(&response)
                .map(Some)
                .ok_or_else(|| self.protocol("look up", name, "no Content-Length")),
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(self.refused("look up", name, response)),
        }
    }

    fn protocol(&self, op: &'static str, name: &str, what: &str) -> StorageError {
        StorageError::Remote {
            op,
            name: name.to_string(),
            location: self.location.clone(),
            hint: "the server's answer does not follow cairn's protocol: is this a `cairn serve` \
                   server of the same version?",
            source: what.to_string().into(),
        }
    }

    fn body(&self, op: &'static str, name: &str, response: Response) -> Result<Vec<u8>> {
        let bytes = response.bytes().map_err(|e| StorageError::Remote {
            op,
            name: name.to_string(),
            location: self.location.clone(),
            hint: "the connection failed while the answer was coming in",
            source: Box::new(e),
        })?;
        add(&self.counts.bytes_received, bytes.len());
        Ok(bytes.to_vec())
    }

    fn entries(&self, dir: &str) -> Result<Vec<ListEntry>> {
        if !dir.is_empty() {
            self.check(dir)?;
        }
        // Names are URL-safe as they are (letters, digits, '.', '_', '-', '/').
        let url = format!("{}?list={dir}", self.base);
        let response = self
            .send("list", dir, &self.counts.list, || {
                self.request(Method::GET, &url)
            })?
            .0;
        if response.status() != StatusCode::OK {
            return Err(self.refused("list", dir, response));
        }
        let body = self.body("list", dir, response)?;
        let mut entries: Vec<ListEntry> = serde_json::from_slice(&body)
            .map_err(|e| self.protocol("list", dir, &format!("a listing that is not JSON: {e}")))?;
        entries.retain(|e| validate_name(&e.name));
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        entries.dedup_by(|a, b| a.name == b.name);
        Ok(entries)
    }
}

/// Answers worth another attempt: the server is overloaded, restarting or timed out.
/// 507 (a quota or a full disk) is not: it would answer the same.
fn is_transient(status: StatusCode) -> bool {
    (status.is_server_error() && status != StatusCode::INSUFFICIENT_STORAGE)
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
}

fn content_length(response: &Response) -> Option<u64> {
    response
        .headers()
        .get(CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

impl Storage for RestStorage {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn read(&self, name: &str) -> Result<Vec<u8>> {
        self.check(name)?;
        let url = self.url(name);
        let response = self
            .send("read", name, &self.counts.get, || {
                self.request(Method::GET, &url)
            })?
            .0;
        if response.status() != StatusCode::OK {
            return Err(self.refused("read", name, response));
        }
        self.body("read", name, response)
    }

    fn read_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.check(name)?;
        let truncated = |size| crate::range_truncated(self, name, offset, len, size);
        let end = match crate::range_end(self, name, offset, len) {
            Ok(end) => end,
            Err(answer) => return answer,
        };
        let url = self.url(name);
        let response = self
            .send("read", name, &self.counts.get, || {
                self.request(Method::GET, &url)
                    .header(RANGE, format!("bytes={offset}-{}", end - 1))
            })?
            .0;
        match response.status() {
            StatusCode::PARTIAL_CONTENT => {}
            StatusCode::RANGE_NOT_SATISFIABLE => return Err(truncated(self.size(name)?)),
            _ => return Err(self.refused("read", name, response)),
        }
        let data = self.body("read", name, response)?;
        if data.len() as u64 != len {
            return Err(truncated(self.size(name)?));
        }
        Ok(data)
    }

    fn write(&self, name: &str, data: &[u8]) -> Result<()> {
        self.check(name)?;
        let url = self.url(name);
        add(&self.counts.bytes_sent, data.len());
        let (response, retried) = self.send("write", name, &self.counts.put, || {
            self.request(Method::PUT, &url).body(data.to_vec())
        })?;
        match response.status() {
            StatusCode::CREATED | StatusCode::OK | StatusCode::NO_CONTENT => Ok(()),
            // An attempt whose answer was lost (a cut connection, a server restarted
            // after the write) may have stored the object: then it holds these bytes.
            StatusCode::CONFLICT if retried && self.read(name)? == data => Ok(()),
            _ => Err(self.refused("write", name, response)),
        }
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        Ok(self.entries(dir)?.into_iter().map(|e| e.name).collect())
    }

    fn list_modified(&self, dir: &str) -> Result<Vec<(String, SystemTime)>> {
        Ok(self
            .entries(dir)?
            .into_iter()
            .map(|e| {
                let time = SystemTime::UNIX_EPOCH + Duration::from_nanos(e.modified_ns);
                (e.name, time)
            })
            .collect())
    }

    fn temporaries(&self) -> Result<Vec<(String, SystemTime)>> {
        // The server keeps its unfinished uploads to itself and removes them.
        Ok(Vec::new())
    }

    fn delete_temporary(&self, name: &str) -> Result<()> {
        if !is_temporary_name(name) {
            return Err(StorageError::InvalidName {
                name: name.to_string(),
                location: self.location.clone(),
            });
        }
        Err(StorageError::NotFound {
            name: name.to_string(),
            location: self.location.clone(),
        })
    }

    fn size(&self, name: &str) -> Result<u64> {
        self.head(name)?.ok_or_else(|| StorageError::NotFound {
            name: name.to_string(),
            location: self.location.clone(),
        })
    }

    fn exists(&self, name: &str) -> Result<bool> {
        Ok(self.head(name)?.is_some())
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.check(name)?;
        let url = self.url(name);
        let response = self
            .send("delete", name, &self.counts.delete, || {
                self.request(Method::DELETE, &url)
            })?
            .0;
        match response.status() {
            StatusCode::NO_CONTENT | StatusCode::OK => Ok(()),
            _ => Err(self.refused("delete", name, response)),
        }
    }

    fn request_counts(&self) -> Option<Arc<RequestCounts>> {
        Some(Arc::clone(&self.counts))
    }
}

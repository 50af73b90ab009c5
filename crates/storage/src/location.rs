//! Repository addresses, in restic's forms:
//!
//! - `/srv/repo` or `repo`: a local directory
//! - `s3:https://host[:port]/bucket[/prefix]`, `s3:http://...` (path-style addressing, as
//!   S3-compatible servers such as Garage and MinIO expect); credentials from
//!   `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` or `AWS_PROFILE`, region from
//!   `AWS_DEFAULT_REGION` or `AWS_REGION`. Plain `http://` only to a loopback address or
//!   with `CAIRN_S3_ALLOW_HTTP=1` (see [`http_refusal`])
//! - `sftp://[user@]host[:port]/path` (relative to the login directory; `//path` is
//!   absolute) or `sftp:[user@]host:path`, reached with the user's `ssh` setup
//! - `rest:https://host[:port]/repo`: a repository on a `cairn serve` server, with the
//!   token from `CAIRN_REST_TOKEN`; plain `http://` only to a loopback address or with
//!   `CAIRN_REST_ALLOW_HTTP=1`

use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{Result, StorageError};
use crate::remote::{RemoteStorage, S3Config, SftpConfig};
use crate::rest::{RestConfig, RestStorage};
use crate::{LocalStorage, Storage};

#[derive(Debug, Clone)]
pub enum Location {
    Local(PathBuf),
    S3(S3Config),
    Sftp(SftpConfig),
    Rest(RestConfig),
}

impl Location {
    /// Parses an address; the error says which form was expected.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        if let Some(rest) = s.strip_prefix("s3:") {
            return parse_s3(rest).ok_or_else(|| {
                format!("{s:?} is not an S3 address: use s3:https://HOST[:PORT]/BUCKET[/PREFIX]")
            });
        }
        if let Some(rest) = s.strip_prefix("rest:") {
            return parse_rest(rest).ok_or_else(|| {
                format!(
                    "{s:?} is not a repository server address: use rest:https://HOST[:PORT]/REPO"
                )
            });
        }
        if let Some(rest) = s.strip_prefix("sftp://") {
            return parse_sftp_url(rest).ok_or_else(|| {
                format!("{s:?} is not an SFTP address: use sftp://[USER@]HOST[:PORT]/PATH")
            });
        }
        if let Some(rest) = s.strip_prefix("sftp:") {
            return parse_sftp_short(rest)
                .ok_or_else(|| format!("{s:?} is not an SFTP address: use sftp:[USER@]HOST:PATH"));
        }
        if s.is_empty() {
            return Err("The repository address is empty".into());
        }
        Ok(Location::Local(PathBuf::from(s)))
    }
}

fn parse_s3(rest: &str) -> Option<Location> {
    let (scheme, after) = match rest.split_once("://") {
        Some((scheme @ ("http" | "https"), after)) => (scheme, after),
        Some(_) => return None,
        None => ("https", rest),
    };
    let (host, path) = after.split_once('/')?;
    let path = path.trim_matches('/');
    let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
    if host.is_empty() || bucket.is_empty() {
        return None;
    }
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    Some(Location::S3(S3Config {
        endpoint: format!("{scheme}://{host}"),
        bucket: bucket.to_string(),
        prefix: prefix.trim_matches('/').to_string(),
        region: env("AWS_DEFAULT_REGION").or_else(|| env("AWS_REGION")),
        access_key_id: env("AWS_ACCESS_KEY_ID"),
        secret_access_key: env("AWS_SECRET_ACCESS_KEY"),
        profile: env("AWS_PROFILE"),
    }))
}

fn parse_rest(rest: &str) -> Option<Location> {
    let (scheme, after) = rest.split_once("://")?;
    if !matches!(scheme, "http" | "https") {
        return None;
    }
    let (host, repo) = after.split_once('/')?;
    let repo = repo.trim_end_matches('/');
    if host.is_empty() || !crate::name::valid_component(repo) || repo.starts_with('.') {
        return None;
    }
    Some(Location::Rest(RestConfig {
        endpoint: format!("{scheme}://{host}"),
        repo: repo.to_string(),
        token: None,
        ca_cert: None,
    }))
}

fn split_user(s: &str) -> (Option<String>, &str) {
    match s.rsplit_once('@') {
        Some((user, host)) => (Some(user.to_string()), host),
        None => (None, s),
    }
}

fn parse_sftp_url(rest: &str) -> Option<Location> {
    let (authority, path) = rest.split_once('/')?;
    let (user, hostport) = split_user(authority);
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || hostport.starts_with('[') => {
            (h, Some(p.parse().ok()?))
        }
        _ => (hostport, None),
    };
    if host.is_empty() || path.is_empty() {
        return None;
    }
    Some(Location::Sftp(SftpConfig {
        host: host.to_string(),
        user,
        port,
        path: path.to_string(),
    }))
}

fn parse_sftp_short(rest: &str) -> Option<Location> {
    let (authority, path) = rest.split_once(':')?;
    let (user, host) = split_user(authority);
    if host.is_empty() || path.is_empty() {
        return None;
    }
    Some(Location::Sftp(SftpConfig {
        host: host.to_string(),
        user,
        port: None,
        path: path.to_string(),
    }))
}

/// The environment variable that allows `s3:http://` to a server that is not on this
/// machine. Named after object_store's `AWS_ALLOW_HTTP`, with cairn's prefix as restic's
/// variables have theirs; an environment variable rather than a flag so that it reaches
/// every way an address comes in (`-r`, `CAIRN_REPOSITORY`, named repositories, `copy`).
pub const ALLOW_HTTP_VAR: &str = "CAIRN_S3_ALLOW_HTTP";

/// Why cairn will not talk plain HTTP to this S3 endpoint, or `None` if it may: the
/// endpoint is `https`, or a loopback address, or the user opted in with
/// `CAIRN_S3_ALLOW_HTTP=1`.
///
/// Over plain HTTP anyone on the network path sees every request (the access key id,
/// object names and sizes, the timing of backups) and can replay, drop or delay them;
/// the contents stay encrypted, but the signed requests and the repository's shape do
/// not. Loopback (`127.0.0.0/8`, `::1`, `localhost`) is allowed without the opt-in:
/// those packets never leave the machine, and only root can watch them, who can read the
/// credentials from the environment anyway; local S3 gateways and test servers listen
/// there. A host *name* other than `localhost` is not trusted to be loopback, since DNS
/// decides where it goes.
pub fn http_refusal(config: &S3Config, opted_in: bool) -> Option<String> {
    let host = config.endpoint.strip_prefix("http://")?;
    if opted_in || is_loopback(host) {
        return None;
    }
    Some(format!(
        "Refusing plain HTTP to the S3 server {host}: requests would cross the network \
         unencrypted (access key id, object names and sizes, open to replay). Use \
         s3:https://{host}/..., or set {ALLOW_HTTP_VAR}=1 to allow plain HTTP to it \
         (a loopback address needs no opt-in)"
    ))
}

/// Whether `host[:port]` (an IP literal, `[v6]:port`, or a name) is this machine by
/// address: `localhost`, `127.0.0.0/8` or `::1`.
fn is_loopback(hostport: &str) -> bool {
    let host = if let Some(v6) = hostport.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        hostport.rsplit_once(':').map_or(hostport, |(h, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                hostport
            }
        })
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn http_allowed_by_env() -> bool {
    std::env::var(ALLOW_HTTP_VAR).is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"))
}

/// The environment variable that allows `rest:http://` to a server not on this machine.
pub const REST_ALLOW_HTTP_VAR: &str = "CAIRN_REST_ALLOW_HTTP";

/// What a store may need besides its address: credentials and trust for a repository
/// server. [`OpenOptions::from_env`] takes them from the environment.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// The bearer token for `rest:` addresses.
    pub rest_token: Option<String>,
    /// A PEM file of certificate authorities to trust for `rest:https://` instead of the
    /// system's.
    pub ca_cert: Option<PathBuf>,
    /// `--limit-upload` / `--limit-download`: the store is wrapped in [`crate::Limited`].
    pub limits: crate::RateLimits,
}

impl OpenOptions {
    /// `CAIRN_REST_TOKEN` and `CAIRN_CACERT`.
    pub fn from_env() -> Self {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        OpenOptions {
            rest_token: env(crate::rest::TOKEN_VAR),
            ca_cert: env("CAIRN_CACERT").map(PathBuf::from),
            limits: crate::RateLimits::default(),
        }
    }
}

/// Opens the store at `address`, with credentials from the environment.
pub fn open(address: &str) -> Result<Arc<dyn Storage>> {
    open_with(address, &OpenOptions::from_env())
}

/// Opens the store at `address`.
pub fn open_with(address: &str, options: &OpenOptions) -> Result<Arc<dyn Storage>> {
    let invalid = |reason: String| StorageError::InvalidAddress {
        address: address.to_string(),
        reason,
    };
    let location = Location::parse(address).map_err(invalid)?;
    if let Location::S3(config) = &location {
        if let Some(reason) = http_refusal(config, http_allowed_by_env()) {
            return Err(invalid(reason));
        }
    }
    if let Location::Rest(config) = &location {
        let opted_in = std::env::var(REST_ALLOW_HTTP_VAR)
            .is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"));
        if let Some(host) = config.endpoint.strip_prefix("http://") {
            if !opted_in && !is_loopback(host) {
                return Err(invalid(format!(
                    "Refusing plain HTTP to the repository server {host}: the token and every \
                     object would cross the network unencrypted. Use rest:https://{host}/..., or \
                     set {REST_ALLOW_HTTP_VAR}=1 (a loopback address needs no opt-in)"
                )));
            }
        }
    }
    let store: Arc<dyn Storage> = match location {
        Location::Local(path) => Arc::new(LocalStorage::new(path)),
        Location::S3(config) => Arc::new(RemoteStorage::s3(&config, address.to_string())?),
        Location::Sftp(config) => Arc::new(RemoteStorage::sftp(&config, address.to_string())?),
        Location::Rest(config) => {
            let config = RestConfig {
                token: options.rest_token.clone(),
                ca_cert: options.ca_cert.clone(),
                ..config
            };
            Arc::new(RestStorage::new(&config, address.to_string())?)
        }
    };
    Ok(crate::Limited::wrap(store, options.limits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_addresses_parse_like_restics() {
        let Ok(Location::S3(c)) = Location::parse("s3:http://127.0.0.1:3900/bucket/some/prefix/")
        else {
            panic!()
        };
        assert_eq!(c.endpoint, "http://127.0.0.1:3900");
        assert_eq!(c.bucket, "bucket");
        assert_eq!(c.prefix, "some/prefix");
        let Ok(Location::S3(c)) = Location::parse("s3:s3.amazonaws.com/b") else {
            panic!()
        };
        assert_eq!(
            (c.endpoint.as_str(), c.bucket.as_str(), c.prefix.as_str()),
            ("https://s3.amazonaws.com", "b", "")
        );
        assert!(Location::parse("s3:http://host").is_err());
        assert!(Location::parse("s3:ftp://host/b").is_err());
    }

    #[test]
    fn plain_http_to_s3_needs_the_opt_in_unless_on_loopback() {
        let s3 = |a: &str| match Location::parse(a) {
            Ok(Location::S3(c)) => c,
            other => panic!("{a}: {other:?}"),
        };
        for remote in [
            "s3:http://nas:9000/b",
            "s3:http://192.0.2.7/b",
            "s3:http://[2001:db8::1]:9000/b",
            "s3:http://localhost.example.com/b",
            "s3:http://127.0.0.1.nip.io/b",
        ] {
            let why = http_refusal(&s3(remote), false).unwrap_or_else(|| panic!("{remote}"));
            assert!(why.contains("CAIRN_S3_ALLOW_HTTP=1"), "{why}");
            assert!(why.contains("s3:https://"), "{why}");
            assert_eq!(http_refusal(&s3(remote), true), None, "{remote} opted in");
        }
        for local in [
            "s3:http://127.0.0.1:3900/b",
            "s3:http://127.8.9.1/b",
            "s3:http://[::1]:3900/b",
            "s3:http://localhost:3900/b",
            "s3:http://LOCALHOST/b",
        ] {
            assert_eq!(http_refusal(&s3(local), false), None, "{local}");
        }
        for secure in ["s3:https://nas:9000/b", "s3:s3.amazonaws.com/b"] {
            assert_eq!(http_refusal(&s3(secure), false), None, "{secure}");
        }
    }

    #[test]
    fn rest_addresses_name_one_repository() {
        let Ok(Location::Rest(c)) = Location::parse("rest:https://backup.example:8443/laptop/")
        else {
            panic!()
        };
        assert_eq!(
            (c.endpoint.as_str(), c.repo.as_str()),
            ("https://backup.example:8443", "laptop")
        );
        for bad in [
            "rest:https://host",
            "rest:https://host/",
            "rest:https://host/a/b",
            "rest:https://host/..",
            "rest:https://host/.cairn-serve",
            "rest:ftp://host/r",
            "rest:host/r",
        ] {
            assert!(Location::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn plain_http_to_a_repository_server_only_on_loopback() {
        let err = open_with("rest:http://192.0.2.1:8000/r", &OpenOptions::default())
            .expect_err("plain HTTP across the network is refused");
        assert!(err.to_string().contains("CAIRN_REST_ALLOW_HTTP=1"), "{err}");
        assert!(open_with("rest:http://127.0.0.1:8000/r", &OpenOptions::default()).is_ok());
    }

    #[test]
    fn sftp_addresses_parse_in_both_forms() {
        let Ok(Location::Sftp(c)) = Location::parse("sftp://backup@nas:2222//srv/cairn") else {
            panic!()
        };
        assert_eq!(
            (c.user.as_deref(), c.host.as_str(), c.port, c.path.as_str()),
            (Some("backup"), "nas", Some(2222), "/srv/cairn")
        );
        let Ok(Location::Sftp(c)) = Location::parse("sftp://nas/cairn") else {
            panic!()
        };
        assert_eq!((c.user, c.port, c.path.as_str()), (None, None, "cairn"));
        let Ok(Location::Sftp(c)) = Location::parse("sftp:me@nas:/srv/repo") else {
            panic!()
        };
        assert_eq!(
            (c.user.as_deref(), c.host.as_str(), c.path.as_str()),
            (Some("me"), "nas", "/srv/repo")
        );
        assert!(Location::parse("sftp://nas:notaport/x").is_err());
        assert!(Location::parse("sftp:nas").is_err());
        assert!(matches!(
            Location::parse("/srv/repo"),
            Ok(Location::Local(_))
        ));
    }
}

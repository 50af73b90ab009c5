//! The HTTP side: the listener (TLS through rustls, or plain HTTP on loopback), limits,
//! the access log, and one handler per request kind of the protocol in
//! `cairn_storage::rest`.
//!
//! Every request is authenticated first (401 without a valid token, before anything
//! about the repository is revealed), then scoped (403 for a token of another
//! repository or without the right), then checked against the layout. File work runs
//! on the runtime's worker threads through `block_in_place`, which the
//! multi-threaded runtime allows; uploads stream to a temporary file as they arrive.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, Query, Request, State as Ax};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use cairn_storage::rest::ListEntry;
use cairn_storage::{Storage, StorageError};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::access::{now_secs, valid_repo_name, Rights, TokenEntry};
use crate::layout::{self, Kind};
use crate::state::State;
use crate::{deleted, Error, Result, ServeOptions};

/// Where the server listens, as `ready` is told once connections are accepted.
#[derive(Debug, Clone)]
pub enum Listening {
    /// A TCP address (a port of 0 picks a free one), and whether it is HTTPS.
    Tcp(SocketAddr, bool),
    /// A unix socket (`--listen unix:PATH`), for a reverse proxy on the same machine.
    Unix(std::path::PathBuf),
}

impl std::fmt::Display for Listening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listening::Tcp(addr, true) => write!(f, "https://{addr}"),
            Listening::Tcp(addr, false) => write!(f, "http://{addr}"),
            Listening::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// Serves until the process ends. `ready` is told where, once connections are accepted.
pub fn serve(options: ServeOptions, ready: impl FnOnce(Listening)) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("start the runtime for", &options.dir, e))?;
    runtime.block_on(run(options, ready))
}

/// A bound listener of either kind.
enum Listener {
    Tcp(TcpListener),
    Unix(tokio::net::UnixListener),
}

async fn bind(options: &ServeOptions) -> Result<(Listener, Listening, Option<TlsAcceptor>)> {
    let listen_path = std::path::Path::new(&options.listen);
    let acceptor = match &options.tls {
        Some((cert, key)) => Some(tls_acceptor(cert, key)?),
        None => None,
    };
    if let Some(path) = options.listen.strip_prefix("unix:") {
        let path = std::path::PathBuf::from(path);
        remove_stale_socket(&path)?;
        let listener = tokio::net::UnixListener::bind(&path)
            .map_err(|e| Error::io("listen on the unix socket", &path, e))?;
        return Ok((Listener::Unix(listener), Listening::Unix(path), acceptor));
    }
    let addr = tokio::net::lookup_host(&options.listen)
        .await
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| {
            Error::Invalid(format!(
                "Cannot resolve the listen address {:?}: give HOST:PORT, such as \
                 127.0.0.1:8000, or unix:PATH",
                options.listen
            ))
        })?;
    if acceptor.is_none() && !addr.ip().is_loopback() {
        return Err(Error::Invalid(format!(
            "Refusing plain HTTP on {addr}, which is not a loopback address: tokens and \
             objects would cross the network unencrypted. Give --tls-cert and --tls-key, or \
             listen on 127.0.0.1 or a unix socket behind a reverse proxy that does TLS"
        )));
    }
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io("listen on", listen_path, e))?;
    let local = listener
        .local_addr()
        .map_err(|e| Error::io("listen on", listen_path, e))?;
    let tls = acceptor.is_some();
    Ok((
        Listener::Tcp(listener),
        Listening::Tcp(local, tls),
        acceptor,
    ))
}

/// A socket file left by a server that is gone is removed; one that a live server
/// answers on, or a file that is not a socket, is an error rather than taken over.
fn remove_stale_socket(path: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(Error::Invalid(format!(
            "{} exists and is not a socket: give another path for --listen unix:PATH",
            path.display()
        )));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(Error::Invalid(format!(
            "{} is the socket of a server that is running: stop it first, or give another path",
            path.display()
        )));
    }
    std::fs::remove_file(path).map_err(|e| Error::io("remove the stale socket", path, e))
}

async fn run(options: ServeOptions, ready: impl FnOnce(Listening)) -> Result<()> {
    if !options.dir.is_dir() {
        return Err(Error::Invalid(format!(
            "{} is not a directory: create it, or give the directory whose subdirectories are \
             the repositories",
            options.dir.display()
        )));
    }
    let (listener, listening, acceptor) = bind(&options).await?;
    let idle = options.idle_timeout;
    let connections = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let peers = Arc::new(PeerSlots::new(options.max_connections));
    let state = Arc::new(State::new(options)?);
    // Once before the first request, so that what is due is freed when `ready` is told.
    tokio::task::block_in_place(|| sweep(&state));
    tokio::spawn(housekeeping(Arc::clone(&state)));
    let app = router(state);
    ready(listening);
    loop {
        // Waiting for a permit before accepting leaves extra connections in the
        // kernel's backlog: they are served in turn rather than refused.
        let permit = Arc::clone(&connections)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let (app, acceptor) = (app.clone(), acceptor.clone());
        let accepted = match &listener {
            Listener::Tcp(l) => l.accept().await.map(|(stream, peer)| {
                let slot = match peers.take(peer.ip()) {
                    Admit::Yes(slot) => slot,
                    // Closed at once, and its permit is free again.
                    Admit::No { log } => {
                        if log {
                            let held = peers.cap;
                            let why = format!("{peer}: its address holds {held} connections");
                            log_event("connection_refused", &why);
                        }
                        return;
                    }
                };
                tokio::spawn(async move {
                    connection(stream, peer.to_string(), acceptor, app, idle).await;
                    drop((slot, permit));
                });
            }),
            Listener::Unix(l) => l.accept().await.map(|(stream, _)| {
                tokio::spawn(async move {
                    connection(stream, "unix".to_string(), acceptor, app, idle).await;
                    drop(permit);
                });
            }),
        };
        if let Err(e) = accepted {
            log_event("accept_failed", &e.to_string());
        }
    }
}

/// Connections held per client address. One address may hold at most half of all
/// connections: a single host, with a token or without, cannot take every connection (a
/// connection that sends nothing holds one for the idle timeout) and leave the others
/// waiting. cairn's own client keeps at most 16 open. Loopback is not limited: there
/// every connection comes from a proxy on the server's machine (the way to serve plain
/// HTTP), which speaks for all its clients. IPv6 addresses count by their /64, which one
/// host is given whole.
struct PeerSlots {
    cap: usize,
    held: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, Held>>,
}

#[derive(Default)]
struct Held {
    connections: usize,
    /// A refusal was logged since the address last had room: one line per episode, not
    /// one per connection a flood opens.
    logged: bool,
}

/// What [`PeerSlots::take`] says of a connection.
enum Admit {
    Yes(Option<PeerSlot>),
    /// Refused; whether to log it.
    No {
        log: bool,
    },
}

impl PeerSlots {
    fn new(max_connections: usize) -> PeerSlots {
        PeerSlots {
            cap: max_connections.div_ceil(2).max(1),
            held: Default::default(),
        }
    }

    /// A connection slot for `ip`, if it holds fewer than its share.
    fn take(self: &Arc<Self>, ip: std::net::IpAddr) -> Admit {
        // An IPv4 client of a dual-stack listener comes as ::ffff:a.b.c.d, whose /64
        // every IPv4 client shares.
        let ip = ip.to_canonical();
        if ip.is_loopback() {
            return Admit::Yes(None);
        }
        let key = match ip {
            std::net::IpAddr::V6(v6) => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                std::net::IpAddr::V6(bits.into())
            }
            v4 => v4,
        };
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let h = held.entry(key).or_default();
        if h.connections >= self.cap {
            return Admit::No {
                log: !std::mem::replace(&mut h.logged, true),
            };
        }
        h.connections += 1;
        Admit::Yes(Some(PeerSlot {
            slots: Arc::clone(self),
            key,
        }))
    }
}

/// One connection of an address, given back when dropped.
struct PeerSlot {
    slots: Arc<PeerSlots>,
    key: std::net::IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = held.get_mut(&self.key) {
            h.connections -= 1;
            h.logged = false;
            if h.connections == 0 {
                held.remove(&self.key);
            }
        }
    }
}

async fn connection<S>(
    stream: S,
    peer: String,
    acceptor: Option<TlsAcceptor>,
    app: Router,
    idle: Duration,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let tag = Peer(Arc::from(peer.as_str()));
    let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
        request.extensions_mut().insert(tag.clone());
        app.clone().oneshot(request)
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(idle);
    match acceptor {
        Some(acceptor) => match tokio::time::timeout(idle, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => {
                let _ = http.serve_connection(TokioIo::new(tls), service).await;
            }
            Ok(Err(e)) => log_event("tls_handshake_failed", &format!("{peer}: {e}")),
            Err(_) => log_event("tls_handshake_failed", &format!("{peer}: timed out")),
        },
        None => {
            let _ = http.serve_connection(TokioIo::new(stream), service).await;
        }
    }
}

fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> Result<TlsAcceptor> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |path: &std::path::Path, what: &str| {
        Error::Invalid(format!(
            "{} holds no {what} in PEM form: give the files your certificate authority issued",
            path.display()
        ))
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|_| bad(cert, "certificate"))?;
    if certs.is_empty() {
        return Err(bad(cert, "certificate"));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|_| bad(key, "private key"))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key_der))
        .map_err(|e| {
            Error::Invalid(format!(
                "Cannot use {} with {}: {e}",
                cert.display(),
                key.display()
            ))
        })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Frees deleted objects whose delay has passed, and removes uploads a crash left
/// half-written; at start and then every minute.
async fn housekeeping(state: Arc<State>) {
    loop {
        tokio::time::sleep(Duration::from_secs(60)).await;
        let state = Arc::clone(&state);
        let _ = tokio::task::spawn_blocking(move || sweep(&state)).await;
    }
}

/// Uploads in progress are younger than this; older temporary files are leftovers.
const STALE_UPLOAD: Duration = Duration::from_secs(3600);

fn sweep(state: &State) {
    let Ok(entries) = std::fs::read_dir(state.dir()) else {
        return;
    };
    let now = now_secs();
    for entry in entries.flatten() {
        let Some(repo) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !valid_repo_name(&repo) || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        match deleted::expire(state.dir(), &repo, state.options.delete_delay, now) {
            Ok(0) => {}
            Ok(freed) => {
                state.freed(&repo, freed);
                log_event(
                    "deleted_freed",
                    &format!("{repo}: {freed} bytes as quotas count"),
                );
            }
            Err(e) => log_event("expire_failed", &format!("{repo}: {e}")),
        }
        let store = state.store(&repo);
        for (name, modified) in store.temporaries().unwrap_or_default() {
            if modified.elapsed().is_ok_and(|age| age > STALE_UPLOAD) {
                let _ = store.delete_temporary(&name);
            }
        }
    }
}

pub(crate) fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/{repo}", get(list))
        .route(
            "/{repo}/{*name}",
            get(read).head(head).put(write).delete(delete),
        )
        .layer(middleware::from_fn(access_log))
        .with_state(state)
}

#[derive(Clone)]
struct Peer(Arc<str>);

/// The token a request was made with, for the access log.
#[derive(Clone)]
struct TokenName(String);

/// A refusal: its status and the reason the client shows its user.
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = (self.0, self.1.clone()).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response.extensions_mut().insert(Reason(self.1));
        response
    }
}

#[derive(Clone)]
struct Reason(String);

fn refuse(status: StatusCode, reason: impl Into<String>) -> Refusal {
    Refusal(status, reason.into())
}

fn internal(e: impl std::fmt::Display) -> Refusal {
    refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// The answer, marked with the token's name for the access log.
fn answer(token: Option<&TokenEntry>, result: std::result::Result<Response, Refusal>) -> Response {
    let mut response = result.unwrap_or_else(IntoResponse::into_response);
    if let Some(token) = token {
        response
            .extensions_mut()
            .insert(TokenName(token.name.clone()));
    }
    response
}

/// The token of the request if it may act on `repo` with `needed`.
fn authorize(
    state: &State,
    headers: &HeaderMap,
    repo: &str,
    needed: Rights,
) -> std::result::Result<TokenEntry, Refusal> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let mut access = state.access(false).map_err(internal)?;
    if presented.is_some_and(|p| access.find(p).is_none()) {
        access = state.access(true).map_err(internal)?;
    }
    let Some(token) = presented.and_then(|p| access.find(p)) else {
        return Err(refuse(
            StatusCode::UNAUTHORIZED,
            "no valid token in an Authorization: Bearer header",
        ));
    };
    if token.repo != repo {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            format!(
                "the token {} is for the repository {}, not {repo}",
                token.name, token.repo
            ),
        ));
    }
    if token.rights < needed {
        return Err(lacks_right(token, "this", needed));
    }
    Ok(token.clone())
}

/// A 403 for `token`, whose rights are below `needed` for `doing` ("deleting NAME").
fn lacks_right(token: &TokenEntry, doing: &str, needed: Rights) -> Refusal {
    let (name, has) = (&token.name, token.rights.as_str());
    let needed = needed.as_str();
    refuse(
        StatusCode::FORBIDDEN,
        format!("the token {name} has the right {has}; {doing} needs {needed}"),
    )
}

fn check_name(name: &str) -> std::result::Result<(), Refusal> {
    if cairn_storage::is_valid_name(name) {
        Ok(())
    } else {
        Err(refuse(
            StatusCode::BAD_REQUEST,
            format!("{name:?} is not a valid object name"),
        ))
    }
}

fn storage_refusal(e: StorageError) -> Refusal {
    match e {
        StorageError::NotFound { name, .. } => {
            refuse(StatusCode::NOT_FOUND, format!("{name} does not exist"))
        }
        StorageError::AlreadyExists { name, .. } => refuse(
            StatusCode::CONFLICT,
            format!("{name} exists already, and objects are never replaced"),
        ),
        StorageError::NoSpace { .. } => refuse(
            StatusCode::INSUFFICIENT_STORAGE,
            "the server's disk is full: tell its operator",
        ),
        e => internal(e),
    }
}

#[derive(serde::Deserialize)]
struct ListQuery {
    list: Option<String>,
}

async fn list(
    Ax(state): Ax<Arc<State>>,
    Path(repo): Path<String>,
    Query(query): Query<ListQuery>,
    headers: HeaderMap,
) -> Response {
    let token = match authorize(&state, &headers, &repo, Rights::Read) {
        Ok(token) => token,
        Err(refusal) => return answer(None, Err(refusal)),
    };
    let result = (|| {
        let dir = query
            .list
            .ok_or_else(|| refuse(StatusCode::BAD_REQUEST, "expected ?list=DIR"))?;
        if !dir.is_empty() {
            check_name(&dir)?;
        }
        let store = state.store(&repo);
        let files =
            tokio::task::block_in_place(|| store.list_modified(&dir)).map_err(storage_refusal)?;
        let entries: Vec<ListEntry> = files
            .into_iter()
            .map(|(name, time)| ListEntry {
                name,
                modified_ns: time
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64),
            })
            .collect();
        let json = serde_json::to_vec(&entries).map_err(internal)?;
        Ok(([(header::CONTENT_TYPE, "application/json")], json).into_response())
    })();
    answer(Some(&token), result)
}

async fn read(
    Ax(state): Ax<Arc<State>>,
    Path((repo, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let token = match authorize(&state, &headers, &repo, Rights::Read) {
        Ok(token) => token,
        Err(refusal) => return answer(None, Err(refusal)),
    };
    let result = (|| {
        check_name(&name)?;
        let store = state.store(&repo);
        let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok());
        let (file, size) =
            tokio::task::block_in_place(|| store.open_object(&name)).map_err(storage_refusal)?;
        let Some(range) = range else {
            return Ok((
                StatusCode::OK,
                [(header::CONTENT_LENGTH, size.to_string())],
                stream_file(file, 0, size),
            )
                .into_response());
        };
        let (start, end) = parse_range(range).ok_or_else(|| {
            refuse(
                StatusCode::BAD_REQUEST,
                format!("expected Range: bytes=START-END, not {range:?}"),
            )
        })?;
        let len = end - start + 1;
        if end >= size {
            let e = store.range_past_end(&name, start, len, size);
            return Err(refuse(StatusCode::RANGE_NOT_SATISFIABLE, e.to_string()));
        }
        Ok((
            StatusCode::PARTIAL_CONTENT,
            [
                (header::CONTENT_RANGE, format!("bytes {start}-{end}/*")),
                (header::CONTENT_LENGTH, len.to_string()),
            ],
            stream_file(file, start, len),
        )
            .into_response())
    })();
    answer(Some(&token), result)
}

/// Bytes a response holds in memory at once, per piece read from the file.
const PIECE: usize = 1 << 20;

/// A body of `len` bytes of `file` from `start`, read a piece at a time on a blocking
/// thread as the client takes them: a response holds a few pieces, not the object (64
/// connections reading 1 GiB objects whole would have held 64 GiB).
fn stream_file(file: std::fs::File, start: u64, len: u64) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(2);
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::FileExt;
        let (mut at, end) = (start, start + len);
        while at < end {
            let mut piece = vec![0; PIECE.min((end - at) as usize)];
            let read = match file.read_at(&mut piece, at) {
                Ok(0) => Err(std::io::Error::other("the object shrank while it was read")),
                Ok(n) => {
                    piece.truncate(n);
                    at += n as u64;
                    Ok(bytes::Bytes::from(piece))
                }
                Err(e) => Err(e),
            };
            let failed = read.is_err();
            // The client gone, or the read failed (the body then ends in an error).
            if tx.blocking_send(read).is_err() || failed {
                return;
            }
        }
    });
    Body::new(Pieces(rx))
}

/// The body of [`stream_file`]: pieces as the reading thread sends them.
struct Pieces(tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>);

impl http_body::Body for Pieces {
    type Data = bytes::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::result::Result<http_body::Frame<Self::Data>, Self::Error>>>
    {
        self.0
            .poll_recv(cx)
            .map(|piece| piece.map(|r| r.map(http_body::Frame::data)))
    }
}

/// `bytes=START-END`, inclusive, as the client sends it.
fn parse_range(range: &str) -> Option<(u64, u64)> {
    let (start, end) = range.strip_prefix("bytes=")?.split_once('-')?;
    let (start, end) = (start.parse().ok()?, end.parse().ok()?);
    (start <= end).then_some((start, end))
}

async fn head(
    Ax(state): Ax<Arc<State>>,
    Path((repo, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let token = match authorize(&state, &headers, &repo, Rights::Read) {
        Ok(token) => token,
        Err(refusal) => return answer(None, Err(refusal)),
    };
    let result = (|| {
        check_name(&name)?;
        let store = state.store(&repo);
        let size = tokio::task::block_in_place(|| store.size(&name)).map_err(storage_refusal)?;
        let mut response = StatusCode::OK.into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(size));
        Ok(response)
    })();
    answer(Some(&token), result)
}

async fn write(
    Ax(state): Ax<Arc<State>>,
    Path((repo, name)): Path<(String, String)>,
    headers: HeaderMap,
    mut body: Body,
) -> Response {
    let token = match authorize(&state, &headers, &repo, Rights::Append) {
        Ok(token) => token,
        Err(refusal) => return answer(None, Err(refusal)),
    };
    let result = write_checked(&state, &repo, &name, &token, &headers, &mut body).await;
    if result.is_err() {
        drain(&state, &headers, &mut body).await;
    }
    answer(Some(&token), result)
}

/// The most of a refused upload's body read and discarded so that the client sees the
/// answer: larger than any pack a client writes.
const MAX_DRAIN: u64 = 256 << 20;

/// Reads what is left of a refused upload's body. A server that answers before the body
/// is read closes the connection while the client is still sending, and the client then
/// sees a broken pipe instead of the reason (a quota, an object that exists already).
/// Bodies that announce more than [`MAX_DRAIN`], or than the server accepts at all, are
/// not read: the connection closes.
async fn drain(state: &State, headers: &HeaderMap, body: &mut Body) {
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let most = MAX_DRAIN.min(state.options.max_body);
    if announced.is_none_or(|len| len > most) {
        return;
    }
    let mut read = 0u64;
    while read <= most {
        match tokio::time::timeout(state.options.idle_timeout, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                read += frame.data_ref().map_or(0, |d| d.len() as u64);
            }
            _ => return,
        }
    }
}

async fn write_checked(
    state: &State,
    repo: &str,
    name: &str,
    token: &TokenEntry,
    headers: &HeaderMap,
    body: &mut Body,
) -> std::result::Result<Response, Refusal> {
    check_name(name)?;
    let kind = layout::classify(name);
    if kind.is_none() && token.rights < Rights::Admin {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            format!(
                "{name} is not a name in the repository layout (config, keys/, data/XX/, \
                 index/, snapshots/, sessions/ or trash/ and a BLAKE3 hash)"
            ),
        ));
    }
    // A thief's append token must not add a key (a write-only key file that a laptop
    // which lost its cache would take, sealing its backups to the thief's key) nor set
    // up a repository: the owner makes both, with a maintain token.
    let owners_only = matches!(kind, Some(Kind::Config | Kind::Hashed { dir: "keys", .. }));
    if owners_only && token.rights < Rights::Maintain {
        let doing = format!("creating {name} (the owner's: `cairn init`, `cairn key add`)");
        return Err(lacks_right(token, &doing, Rights::Maintain));
    }
    let len: u64 = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            refuse(
                StatusCode::LENGTH_REQUIRED,
                "the upload needs a Content-Length",
            )
        })?;
    let limit = match kind {
        Some(Kind::Config) => layout::MAX_CONFIG,
        _ => state.options.max_body,
    };
    if len > limit {
        return Err(refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("{name}: {len} bytes is more than the {limit} this server accepts"),
        ));
    }
    let access = state.access(false).map_err(internal)?;
    state
        .reserve(repo, token, len, &access)
        .map_err(|q| refuse(StatusCode::INSUFFICIENT_STORAGE, q.0))?;
    let stored = receive(state, repo, name, kind, len, body).await;
    if stored.is_err() {
        state.release(repo, token, len);
        return stored.map(|()| StatusCode::CREATED.into_response());
    }
    if matches!(
        kind,
        Some(Kind::Hashed {
            dir: "sessions",
            ..
        })
    ) {
        state.record_owner(repo, name, token).map_err(internal)?;
    }
    state.save_usage().map_err(internal)?;
    Ok(StatusCode::CREATED.into_response())
}

/// Streams the body into a new object, checking its length and, for hash-named
/// objects, its hash before it is linked into place.
async fn receive(
    state: &State,
    repo: &str,
    name: &str,
    kind: Option<Kind<'_>>,
    len: u64,
    body: &mut Body,
) -> std::result::Result<(), Refusal> {
    let store = state.store(repo);
    let mut pending =
        tokio::task::block_in_place(|| store.begin_write(name, len)).map_err(storage_refusal)?;
    let mut hasher = blake3::Hasher::new();
    let mut received = 0u64;
    loop {
        let frame = tokio::time::timeout(state.options.idle_timeout, body.frame())
            .await
            .map_err(|_| {
                refuse(
                    StatusCode::REQUEST_TIMEOUT,
                    format!("{name}: the upload stalled"),
                )
            })?;
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| {
            refuse(
                StatusCode::BAD_REQUEST,
                format!("{name}: the upload broke off: {e}"),
            )
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        received += data.len() as u64;
        if received > len {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                format!("{name}: the body is longer than its Content-Length"),
            ));
        }
        hasher.update(&data);
        tokio::task::block_in_place(|| pending.write_all(&data)).map_err(storage_refusal)?;
    }
    if received != len {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            format!("{name}: {received} bytes arrived of the {len} announced"),
        ));
    }
    if let Some(Kind::Hashed { hash, .. }) = kind {
        let actual = hasher.finalize();
        if actual.to_hex().as_str() != hash {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                format!(
                    "{name}: the body's BLAKE3 hash is {actual}, not its name: objects are named \
                     by the hash of their bytes"
                ),
            ));
        }
    }
    tokio::task::block_in_place(|| pending.commit()).map_err(storage_refusal)
}

async fn delete(
    Ax(state): Ax<Arc<State>>,
    Path((repo, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    // Every token that may write may delete its own session files; what it may delete
    // otherwise is decided once the name is known.
    let token = match authorize(&state, &headers, &repo, Rights::Append) {
        Ok(token) => token,
        Err(refusal) => return answer(None, Err(refusal)),
    };
    let result = delete_checked(&state, &repo, &name, &token);
    answer(Some(&token), result)
}

fn delete_checked(
    state: &State,
    repo: &str,
    name: &str,
    token: &TokenEntry,
) -> std::result::Result<Response, Refusal> {
    check_name(name)?;
    // A missing object is 404 whatever the rights: a session file another process
    // of the same token removed first is no reason to refuse. Every token may read,
    // so this tells it nothing new.
    let store = state.store(repo);
    if !tokio::task::block_in_place(|| store.exists(name)).map_err(storage_refusal)? {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            format!("{name} does not exist"),
        ));
    }
    let needed = match layout::classify(name) {
        Some(Kind::Hashed {
            dir: "sessions", ..
        }) if state.is_owner(repo, name, token) => Rights::Append,
        Some(Kind::Hashed {
            dir: "sessions", ..
        }) => Rights::Maintain,
        Some(Kind::Hashed {
            dir: "data" | "index" | "snapshots" | "trash",
            ..
        }) => Rights::Maintain,
        // Key files, the config and names outside the layout.
        _ => Rights::Admin,
    };
    if token.rights < needed {
        return Err(lacks_right(token, &format!("deleting {name}"), needed));
    }
    if let Some(Kind::Hashed {
        dir: "sessions", ..
    }) = layout::classify(name)
    {
        // Session files hold no history (heartbeats of running commands): freed at once.
        let size = tokio::task::block_in_place(|| store.size(name)).map_err(storage_refusal)?;
        tokio::task::block_in_place(|| store.delete(name)).map_err(storage_refusal)?;
        state.forget_owner(repo, name);
        state.freed(repo, crate::state::charged(size));
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    match tokio::task::block_in_place(|| deleted::hold(state.dir(), repo, name, now_secs())) {
        Ok(_) => Ok(StatusCode::NO_CONTENT.into_response()),
        Err(Error::NotFound(_)) => Err(refuse(
            StatusCode::NOT_FOUND,
            format!("{name} does not exist"),
        )),
        Err(e) => Err(internal(e)),
    }
}

/// One JSON line per request on standard error: time, peer, token, method, path,
/// status, duration, and the reason of a refusal.
async fn access_log(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let path = request.uri().path().to_string();
    let peer = request.extensions().get::<Peer>().map(|p| p.0.to_string());
    let response = next.run(request).await;
    let line = serde_json::json!({
        "time": now_secs(),
        "peer": peer,
        "token": response.extensions().get::<TokenName>().map(|t| t.0.clone()),
        "method": method,
        "path": path,
        "status": response.status().as_u16(),
        "ms": started.elapsed().as_millis() as u64,
        "reason": response.extensions().get::<Reason>().map(|r| r.0.clone()),
    });
    eprintln!("{line}");
    response
}

fn log_event(event: &str, detail: &str) {
    eprintln!(
        "{}",
        serde_json::json!({"time": now_secs(), "event": event, "detail": detail})
    );
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    #[test]
    fn an_address_holds_at_most_half_the_connections_and_loopback_any() {
        let slots = Arc::new(PeerSlots::new(8));
        let take = |a: &str| match slots.take(a.parse::<IpAddr>().unwrap()) {
            Admit::Yes(slot) => Some(slot),
            Admit::No { .. } => None,
        };
        let mut held: Vec<_> = (0..4).map(|_| take("192.0.2.1").unwrap()).collect();
        let one = "192.0.2.1".parse::<IpAddr>().unwrap();
        // Logged once, not once per connection a flood opens.
        assert!(matches!(slots.take(one), Admit::No { log: true }));
        assert!(matches!(slots.take(one), Admit::No { log: false }));
        assert!(
            take("192.0.2.2").is_some(),
            "another address has a share of its own"
        );
        let _v6: Vec<_> = (1..=4)
            .map(|i| take(&format!("2001:db8::{i}")).unwrap())
            .collect();
        assert!(take("2001:db8::ffff").is_none(), "a /64 is one host");
        assert!(take("2001:db8:0:1::1").is_some(), "another /64 is another");
        // IPv4 clients of a dual-stack listener are each their own address.
        let _mapped: Vec<_> = (0..4)
            .map(|_| take("::ffff:198.51.100.1").unwrap())
            .collect();
        assert!(take("::ffff:198.51.100.2").is_some(), "another IPv4 client");
        assert!(
            take("198.51.100.1").is_none(),
            "the same client, however written"
        );
        assert!(
            take("::ffff:127.0.0.1").is_some(),
            "loopback, however written"
        );
        let local: Vec<_> = (0..20).map(|_| take("127.0.0.1")).collect();
        assert!(local.iter().all(Option::is_some), "a proxy on this machine");
        held.pop();
        held.push(take("192.0.2.1").expect("room again once one closed"));
        assert!(matches!(slots.take(one), Admit::No { log: true }));
    }
}

//! The daemon's status endpoint: `GET /status` (per-job JSON) and `GET /metrics`
//! (Prometheus), on a loopback address only, each request with
//! `Authorization: Bearer TOKEN`. Plain HTTP, hence loopback: whoever needs it from
//! elsewhere puts a TLS proxy in front. Served by axum on a thread of its own, so that
//! the daemon's loop and the backups stay synchronous.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::metrics::{self, Live};

/// What the daemon shares with the endpoint: the jobs it runs and how they are.
pub type Shared = Arc<Mutex<BTreeMap<String, Live>>>;

#[derive(Clone)]
struct AppState {
    jobs: Shared,
    token: blake3::Hash,
}

/// Starts serving on `addr`; returns the address bound (the port may have been 0).
pub fn spawn(addr: &str, token: &str, jobs: Shared) -> Result<SocketAddr> {
    let listener =
        std::net::TcpListener::bind(addr).with_context(|| format!("Cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    if !local.ip().is_loopback() {
        bail!("--listen {addr}: the status endpoint speaks plain HTTP, so it listens on a loopback address only (127.0.0.1:PORT or [::1]:PORT)");
    }
    listener.set_nonblocking(true)?;
    let state = AppState {
        jobs,
        // Compared as hashes: blake3's equality takes the same time wherever they differ.
        token: blake3::hash(token.as_bytes()),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("Cannot start the status endpoint's runtime")?;
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let app = Router::new()
                .route("/status", get(status))
                .route("/metrics", get(prometheus))
                .with_state(state);
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => {
                    if let Err(e) = axum::serve(listener, app).await {
                        eprintln!("warning: the status endpoint stopped: {e}");
                    }
                }
                Err(e) => eprintln!("warning: the status endpoint cannot start: {e}"),
            }
        })
    });
    Ok(local)
}

fn authorized(state: &AppState, headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| blake3::hash(t.trim().as_bytes()) == state.token)
}

fn views(state: &AppState) -> Vec<metrics::JobView> {
    let jobs = state.jobs.lock().map(|j| j.clone()).unwrap_or_default();
    metrics::views(&jobs)
}

async fn status(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return unauthorized();
    }
    let body = metrics::status_json(&views(&state)).to_string();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn prometheus(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return unauthorized();
    }
    let body = metrics::prometheus(&views(&state));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        "Give the daemon's token as `Authorization: Bearer TOKEN` (see --token-file)\n",
    )
        .into_response()
}

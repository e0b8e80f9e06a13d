//! The admin listener's routes (`--admin-listen`, 127.0.0.1:9090 by default): for whoever
//! runs hookledger, never on the webhook port.
//!
//! - `GET /healthz`: the process serves HTTP.
//! - `GET /readyz`: a heartbeat row is rewritten through the writer and committed, so a 200
//!   means the writer is alive, the database answers and takes writes. On SQLite the file
//!   system of the database must also have [`MIN_FREE_BYTES`] free: a heartbeat alone can
//!   commit on a full disk, into pages the database already has. Otherwise 503 with the
//!   reason (the same kinds as the webhook port's 503s).
//! - `GET /metrics`: Prometheus (OpenMetrics text when asked for, else text 0.0.4), see
//!   [`crate::metrics`].
//! - `GET /status`: an HTML page for people; `POST /status/retry-dead` puts the dead outbox rows
//!   back to pending (see [`status`]).
//! - `GET /events`, `GET /event`: the events browser, and an event's page with its payload and
//!   outbox rows; `POST /event/replay` (see [`events`]).
//! - `GET /outbox`, `GET /outbox/row`: the outbox by kind and status, one row; `POST
//!   /outbox/retry` (one dead row) and `POST /outbox/retry-dead` (the dead rows of a kind)
//!   (see [`outbox`]).
//!
//! # Who may do what
//! Nothing changes data without the admin token (`--admin-token`), sent as
//! `Authorization: Bearer <token>`, as the password of HTTP basic auth, or as the `token` field
//! of the page's form. `/metrics` and `/status` need it too when the listener is not on
//! loopback (start-up refuses such a listener without a token). Health and readiness never do:
//! load balancers and probes call them, and they show nothing about events.

mod events;
mod html;
mod outbox;
mod status;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use serde_json::json;

use crate::config::Secret;
use crate::config::{Database, RetentionConfig};
use crate::http::error::Rejection;
use crate::metrics::Metrics;
use crate::sql::StoreError;
use crate::store::{Reader, Write};
use crate::writer::WriterHandle;

/// How long `/readyz` waits for its write: longer than a busy timeout, so a busy database
/// answers with its own reason.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Free space below which a SQLite database's file system counts as full for `/readyz`: a
/// batch of events needs room for its pages and its WAL frames.
pub(crate) const MIN_FREE_BYTES: u64 = 1024 * 1024;

/// What the admin routes read and change.
pub(crate) struct Admin {
    pub(crate) writer: WriterHandle,
    /// Pooled read connections to the ledger.
    pub(crate) reader: Reader,
    /// Shown on the status page (a URL without its password).
    pub(crate) database: Database,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) retention: RetentionConfig,
    pub(crate) token: Option<Secret>,
    /// `/metrics` and `/status` need the token too (the listener is not on loopback).
    pub(crate) reads_need_token: bool,
    /// The configured sources' names, in order.
    pub(crate) sources: Vec<String>,
    /// Each delivery kind's target as shown: a URL (without credentials or query) or a command.
    pub(crate) targets: Vec<(String, String)>,
    /// When this process started (Unix seconds), for its uptime.
    pub(crate) started_at: i64,
}

pub(crate) fn router(admin: Admin) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .route("/status", get(status::page))
        .route("/status/retry-dead", post(status::retry_dead))
        .route("/events", get(events::list))
        .route("/event", get(events::show))
        .route("/event/replay", post(events::replay))
        .route("/outbox", get(outbox::list))
        .route("/outbox/row", get(outbox::show))
        .route("/outbox/retry", post(outbox::retry))
        .route("/outbox/retry-dead", post(outbox::retry_dead))
        .fallback(|| async { Rejection::not_found() })
        .with_state(Arc::new(admin))
}

async fn ready(State(admin): State<Arc<Admin>>) -> Response {
    if let Some(file) = admin.reader.file() {
        if let Err(full) = room_for(file) {
            return not_ready(&full);
        }
    }
    let writer = admin.writer.clone();
    let write = tokio::task::spawn_blocking(move || {
        writer.run_blocking(Write::Heartbeat {
            at: crate::time::unix_now(),
        })
    });
    let failed = match tokio::time::timeout(READY_TIMEOUT, write).await {
        Ok(Ok(Ok(_))) => return (StatusCode::OK, "ready\n").into_response(),
        Ok(Ok(Err(e))) => e,
        Ok(Err(_)) => StoreError::ShuttingDown,
        Err(_) => StoreError::Busy(format!(
            "the writer did not commit a heartbeat within {} s",
            READY_TIMEOUT.as_secs()
        )),
    };
    not_ready(&failed)
}

/// Whether the file system holding `file` has room for the next writes.
fn room_for(file: &Path) -> Result<(), StoreError> {
    match free_bytes(file) {
        Some(free) if free < MIN_FREE_BYTES => Err(StoreError::DiskFull(format!(
            "{} KiB free on the file system of {} (less than {} KiB)",
            free / 1024,
            file.display(),
            MIN_FREE_BYTES / 1024
        ))),
        // Free space unknown: the heartbeat decides.
        _ => Ok(()),
    }
}

/// Bytes an unprivileged process may still write on the file system holding `file`.
fn free_bytes(file: &Path) -> Option<u64> {
    let folder = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let fs = rustix::fs::statvfs(folder).ok()?;
    Some(fs.f_bavail.saturating_mul(fs.f_frsize))
}

fn not_ready(failed: &StoreError) -> Response {
    let kind = Rejection::of_store_kind(failed);
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "ready": false, "reason": kind, "message": failed.to_string() })),
    )
        .into_response()
}

async fn metrics(State(admin): State<Arc<Admin>>, headers: HeaderMap) -> Response {
    if let Some(refused) = read_refusal(&admin, &headers) {
        return refused;
    }
    let outbox = match read_ledger(&admin, crate::store::listings::outbox_summary).await {
        Ok(outbox) => outbox,
        Err(refused) => return refused,
    };
    let text = admin.metrics.encode(&outbox, crate::time::unix_now());
    // OpenMetrics to a scraper that asks for it (Prometheus does); the Prometheus text format
    // to the rest (curl, promtool), whose parsers read a counter's `# TYPE` by its samples'
    // name.
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("application/openmetrics-text"));
    if openmetrics {
        return (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::to_prometheus_text(&text),
    )
        .into_response()
}

/// `read` on a pooled read connection, on a blocking thread. `Err` is a 503: the page or the
/// scrape fails visibly rather than showing an empty outbox.
async fn read_ledger<T: Send + 'static>(
    admin: &Admin,
    read: impl FnOnce(&dyn crate::sql::Session) -> anyhow::Result<T> + Send + 'static,
) -> Result<T, Response> {
    let reader = admin.reader.clone();
    let result = tokio::task::spawn_blocking(move || reader.read(read))
        .await
        .unwrap_or_else(|e| Err(anyhow::anyhow!("{e}")));
    result.map_err(|e| {
        log::error!("admin: cannot read the database: {e:#}");
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot read the database: {e:#}\n"),
        )
            .into_response()
    })
}

/// A change asked for by a form of the console: refused without the admin token (the form's
/// `token` field or a bearer token, never basic auth, which a browser would send by itself
/// for another site's form); else `write` (read from the form; `Err`: 400 with its text) is
/// committed by the writer, and the answer is a redirect (303) to `then(changed rows)`.
pub(super) async fn change(
    admin: &Admin,
    headers: &HeaderMap,
    form: &[u8],
    write: Result<Write, String>,
    then: impl FnOnce(u64) -> String,
) -> Response {
    let token = html::param(form, "token");
    if let Some(refused) = refusal(admin, headers, Auth::form_or_bearer(token.as_deref())) {
        return refused;
    }
    let write = match write {
        Ok(write) => write,
        Err(why) => return (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response(),
    };
    let writer = admin.writer.clone();
    let done = tokio::task::spawn_blocking(move || writer.run_blocking(write)).await;
    match done {
        Ok(Ok(n)) => (StatusCode::SEE_OTHER, [(header::LOCATION, then(n))]).into_response(),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("nothing was changed: {e}\n"),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("nothing was changed: {e}\n"),
        )
            .into_response(),
    }
}

/// The answer to a read (`/metrics`, `/status`) that must show the token and does not. Reads
/// need none only on a loopback listener and for a request that names an IP address or
/// `localhost` as its `Host`: a web page that rebinds its own DNS name to 127.0.0.1 cannot
/// read them from a browser on this machine.
pub(super) fn read_refusal(admin: &Admin, headers: &HeaderMap) -> Option<Response> {
    if !admin.reads_need_token && local_host(headers) {
        return None;
    }
    refusal(admin, headers, Auth::header_or_basic())
}

/// Whether `Host` is `localhost` or an IP address (with or without a port).
fn local_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        // [::1]:9090
        Some(rest) => {
            return rest
                .split_once(']')
                .is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// Where a route takes the admin token from.
pub(super) struct Auth<'a> {
    /// The `token` field of a form.
    form: Option<&'a str>,
    /// The password of basic auth: only for reads, since a browser sends it by itself.
    basic: bool,
}

impl<'a> Auth<'a> {
    /// Reads: a bearer token, or basic auth (a browser asks for it).
    pub(super) fn header_or_basic() -> Auth<'static> {
        Auth {
            form: None,
            basic: true,
        }
    }

    /// Changes: the form's `token` field, or a bearer token.
    pub(super) fn form_or_bearer(form: Option<&'a str>) -> Auth<'a> {
        Auth { form, basic: false }
    }
}

/// The answer to send when the request does not carry the admin token where `auth` says.
fn refusal(admin: &Admin, headers: &HeaderMap, auth: Auth<'_>) -> Option<Response> {
    let Some(token) = &admin.token else {
        return Some(
            (
                StatusCode::FORBIDDEN,
                "this needs the admin token, and none is set: start serve with --admin-token \
                 env:NAME (or admin_token in the config file)\n",
            )
                .into_response(),
        );
    };
    let offered = auth
        .form
        .map(str::to_string)
        .or_else(|| header_token(headers, auth.basic));
    match offered {
        Some(offered)
            if constant_time_eq::constant_time_eq(
                offered.as_bytes(),
                token.expose().as_bytes(),
            ) =>
        {
            None
        }
        _ if auth.basic => Some(
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Basic realm=\"hookledger admin\"")],
                "the admin token is missing or wrong\n",
            )
                .into_response(),
        ),
        _ => Some(
            (
                StatusCode::UNAUTHORIZED,
                "the admin token is missing or wrong\n",
            )
                .into_response(),
        ),
    }
}

/// The token of `Authorization: Bearer <token>`, or with `basic` of
/// `Basic base64(<any user>:<token>)`.
fn header_token(headers: &HeaderMap, basic: bool) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    if let Some(token) = value.strip_prefix("Bearer ") {
        return Some(token.trim().to_string());
    }
    let encoded = value.strip_prefix("Basic ").filter(|_| basic)?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let pair = String::from_utf8(decoded).ok()?;
    pair.split_once(':').map(|(_, token)| token.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(authorization: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, authorization.parse().unwrap());
        h
    }

    #[test]
    fn the_token_is_read_from_bearer_and_for_reads_from_basic_auth() {
        for basic in [true, false] {
            assert_eq!(
                header_token(&headers("Bearer s3cret-token"), basic).as_deref(),
                Some("s3cret-token")
            );
        }
        let encoded = base64::engine::general_purpose::STANDARD.encode("admin:s3cret:token");
        let basic = headers(&format!("Basic {encoded}"));
        assert_eq!(header_token(&basic, true).as_deref(), Some("s3cret:token"));
        // Not where a browser would send it by itself.
        assert_eq!(header_token(&basic, false), None);
        assert_eq!(header_token(&headers("Basic !!!"), true), None);
        assert_eq!(header_token(&headers("Token s3cret"), true), None);
        assert_eq!(header_token(&HeaderMap::new(), true), None);
    }

    #[test]
    fn only_an_ip_address_or_localhost_is_a_local_host() {
        let host = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, value.parse().unwrap());
            local_host(&h)
        };
        for local in [
            "127.0.0.1:9090",
            "127.0.0.1",
            "localhost:9090",
            "LOCALHOST",
            "[::1]:9090",
            "10.0.0.5:9090",
        ] {
            assert!(host(local), "{local}");
        }
        for other in [
            "evil.example:9090",
            "evil.example",
            "127.0.0.1.evil.example",
            "[::1",
            "[nope]:1",
        ] {
            assert!(!host(other), "{other}");
        }
        assert!(!local_host(&HeaderMap::new()));
    }

    #[test]
    fn room_is_checked_beside_the_file_also_for_a_bare_file_name() {
        // The current folder: a bare file name has no parent to ask.
        let free = free_bytes(Path::new("hookledger.db")).expect("statvfs of .");
        assert!(free > 0);
        assert_eq!(
            free_bytes(Path::new("/nonexistent-folder/hookledger.db")),
            None
        );
    }
}

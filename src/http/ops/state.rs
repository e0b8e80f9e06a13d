//! What the admin routes share: their state, a read of the ledger and a change committed
//! through the writer.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::config::Secret;
use crate::config::{Database, RetentionConfig};
use crate::metrics::Metrics;
use crate::store::{Reader, Write};
use crate::writer::WriterHandle;

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
    /// Each delivery kind's target as shown: a URL (without credentials or query) or a command.
    pub(crate) targets: Vec<(String, String)>,
    /// When this process started (Unix seconds), for its uptime.
    pub(crate) started_at: i64,
    /// Set once this instance has begun to stop: `/readyz` is 503 from then on.
    pub(crate) stopping: Arc<AtomicBool>,
}

/// `read` on a pooled read connection, on a blocking thread. `Err` is a 503: the page or the
/// scrape fails visibly rather than showing an empty outbox.
pub(super) async fn read_ledger<T: Send + 'static>(
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

/// Commits `write` (read from the form; `Err`: 400 with its text) through the writer, and
/// answers with a redirect (303) to `then(changed rows)`. The route's layer checked the token.
pub(super) async fn commit(
    admin: &Admin,
    write: Result<Write, String>,
    then: impl FnOnce(u64) -> String,
) -> Response {
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

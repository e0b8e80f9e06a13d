//! `/readyz` and `/metrics`: what probes and scrapers call.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::state::{read_ledger, Admin};
use crate::http::error::Rejection;
use crate::sql::StoreError;
use crate::store::Write;

/// How long `/readyz` waits for its write: longer than a busy timeout, so a busy database
/// answers with its own reason.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Free space below which a SQLite database's file system counts as full for `/readyz`: a
/// batch of events needs room for its pages and its WAL frames.
pub(crate) const MIN_FREE_BYTES: u64 = 1024 * 1024;

pub(super) async fn ready(State(admin): State<Arc<Admin>>) -> Response {
    if admin.stopping.load(Ordering::SeqCst) {
        return not_ready(&StoreError::ShuttingDown);
    }
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

pub(super) async fn metrics(State(admin): State<Arc<Admin>>, headers: HeaderMap) -> Response {
    let lanes: Vec<String> = admin.metrics.lanes().into_keys().collect();
    let summary =
        move |conn: &dyn crate::sql::Session| crate::store::listings::outbox_summary(conn, &lanes);
    let outbox = match read_ledger(&admin, summary).await {
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

#[cfg(test)]
mod tests {
    use super::*;

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

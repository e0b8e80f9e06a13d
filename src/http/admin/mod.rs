//! The admin listener's routes (`--admin-listen`, 127.0.0.1:9090 by default): for whoever
//! runs hookledger, never on the webhook port.
//!
//! - `GET /healthz`: the process serves HTTP.
//! - `GET /readyz`: a heartbeat row is rewritten through the writer and committed, so a 200
//!   means the writer is alive, the database answers and takes writes. On SQLite the file
//!   system of the database must also have [`MIN_FREE_BYTES`] free: a heartbeat alone can
//!   commit on a full disk, into pages the database already has. Otherwise 503 with the
//!   reason (the same kinds as the webhook port's 503s).

use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::http::error::Rejection;
use crate::store::{StoreError, Write};
use crate::writer::WriterHandle;

/// How long `/readyz` waits for its write: longer than a busy timeout, so a busy database
/// answers with its own reason.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Free space below which a SQLite database's file system counts as full for `/readyz`: a
/// batch of events needs room for its pages and its WAL frames.
pub(crate) const MIN_FREE_BYTES: u64 = 1024 * 1024;

/// `sqlite_file`: the SQLite database file whose file system `/readyz` checks for room.
pub(crate) fn router(writer: WriterHandle, sqlite_file: Option<PathBuf>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || ready(writer.clone(), sqlite_file.clone())),
        )
        .fallback(|| async { Rejection::not_found() })
}

async fn ready(writer: WriterHandle, sqlite_file: Option<PathBuf>) -> Response {
    match sqlite_file.as_deref().map(room_for) {
        Some(Err(full)) => not_ready(&full),
        _ => heartbeat(writer).await,
    }
}

/// Whether the file system holding `file` has room for the next writes.
fn room_for(file: &Path) -> Result<(), StoreError> {
    let folder = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match rustix::fs::statvfs(folder) {
        Ok(fs) if fs.f_bavail.saturating_mul(fs.f_frsize) < MIN_FREE_BYTES => {
            Err(StoreError::DiskFull(format!(
                "{} KiB free on the file system of {} (less than {} KiB)",
                fs.f_bavail.saturating_mul(fs.f_frsize) / 1024,
                file.display(),
                MIN_FREE_BYTES / 1024
            )))
        }
        // Free space unknown: the heartbeat decides.
        _ => Ok(()),
    }
}

async fn heartbeat(writer: WriterHandle) -> Response {
    let write = tokio::task::spawn_blocking(move || {
        writer.run_blocking(Write::Heartbeat {
            at: crate::unix_now(),
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

fn not_ready(failed: &StoreError) -> Response {
    let kind = Rejection::of_store_kind(failed);
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "ready": false, "reason": kind, "message": failed.to_string() })),
    )
        .into_response()
}

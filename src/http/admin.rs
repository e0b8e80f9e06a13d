//! The admin listener's routes (`--admin-listen`, 127.0.0.1:9090 by default): for whoever
//! runs hookledger, never on the webhook port.
//!
//! - `GET /healthz`: the process serves HTTP.
//! - `GET /readyz`: a heartbeat row is rewritten through the writer and committed, so a 200
//!   means the writer is alive, the database answers and takes writes, and the disk has room;
//!   otherwise 503 with the reason (the same kinds as the webhook port's 503s).

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

pub(crate) fn router(writer: WriterHandle) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(move || ready(writer.clone())))
        .fallback(|| async { Rejection::not_found() })
}

async fn ready(writer: WriterHandle) -> Response {
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
    let kind = Rejection::of_store_kind(&failed);
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "ready": false, "reason": kind, "message": failed.to_string() })),
    )
        .into_response()
}

//! THE request path, top to bottom: read the body (bounded) → verify the signature on the raw
//! bytes → parse the event → submit it to the writer → answer after COMMIT.
//!
//! Every way a request can fail is an [`IngestError`], and [`status`] is the one place that
//! turns one into an HTTP status (DESIGN §2).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::json;

use crate::event::{self, ParseError};
use crate::source::{stripe, Secret, VerifyError};
use crate::unix_now;
use crate::writer::{Outcome, StoreError, WriterHandle};

/// What the request path needs, shared by all requests.
pub struct Ingest {
    pub stripe_secrets: Vec<Secret>,
    pub tolerance_secs: u64,
    pub max_body: usize,
    pub read_timeout: Duration,
    pub writer: WriterHandle,
}

/// Every way a webhook request can fail.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("body is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the body was not received within {0:?}")]
    BodyTimeout(Duration),
    #[error("the body could not be read: {0}")]
    BodyRead(String),
    #[error(transparent)]
    Verify(#[from] VerifyError),
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl IngestError {
    /// The error for the log line: like `Display`, but never quoting the request body.
    fn log_text(&self) -> String {
        match self {
            IngestError::Parse(e) => e.summary(),
            other => other.to_string(),
        }
    }
}

/// Seconds a client should wait before retrying a 503.
const RETRY_AFTER_SECS: u64 = 1;

/// The HTTP status, the error kind for the JSON body, and whether to send `Retry-After`.
pub fn status(err: &IngestError) -> (StatusCode, &'static str, bool) {
    use StoreError::*;
    match err {
        IngestError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", false),
        IngestError::BodyTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "body_timeout", false),
        IngestError::BodyRead(_) => (StatusCode::BAD_REQUEST, "body_unreadable", false),
        IngestError::Verify(VerifyError::TooOld { .. } | VerifyError::InFuture { .. }) => {
            (StatusCode::BAD_REQUEST, "timestamp_out_of_tolerance", false)
        }
        IngestError::Verify(_) => (StatusCode::BAD_REQUEST, "invalid_signature", false),
        IngestError::Parse(_) => (StatusCode::BAD_REQUEST, "invalid_event", false),
        IngestError::Store(QueueFull) => (StatusCode::SERVICE_UNAVAILABLE, "overloaded", true),
        IngestError::Store(ShuttingDown) => {
            (StatusCode::SERVICE_UNAVAILABLE, "shutting_down", true)
        }
        IngestError::Store(Busy(_)) => (StatusCode::SERVICE_UNAVAILABLE, "database_busy", true),
        IngestError::Store(DiskFull(_)) => (StatusCode::SERVICE_UNAVAILABLE, "disk_full", true),
        IngestError::Store(Database(_)) => (StatusCode::INTERNAL_SERVER_ERROR, "internal", false),
    }
}

/// The message for the response body: what to fix for client faults, nothing internal for
/// server faults (the detail is logged instead).
fn public_message(err: &IngestError) -> String {
    match err {
        IngestError::Store(StoreError::Database(_)) => {
            "the event could not be recorded and nothing was stored; retry later".into()
        }
        IngestError::Store(StoreError::Busy(_) | StoreError::DiskFull(_)) => format!(
            "the database cannot take writes right now; nothing was stored, retry after {RETRY_AFTER_SECS} s"
        ),
        IngestError::Store(StoreError::QueueFull) => format!(
            "too many events in flight; nothing was stored, retry after {RETRY_AFTER_SECS} s"
        ),
        other => other.to_string(),
    }
}

/// `POST /webhooks/stripe`.
pub async fn stripe_webhook(State(ingest): State<Arc<Ingest>>, request: Request) -> Response {
    let started = Instant::now();
    let result = receive_stripe(&ingest, request).await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    match result {
        Ok((id, kind, outcome)) => {
            let label = match outcome {
                Outcome::Processed(applied) => {
                    log::info!("stripe {id} {kind} processed ({applied:?}) {ms:.1}ms");
                    "processed"
                }
                Outcome::Duplicate => {
                    log::info!("stripe {id} {kind} duplicate {ms:.1}ms");
                    "duplicate"
                }
            };
            // Built by hand: this is the hot path, and the id is the only dynamic part.
            let id = serde_json::to_string(&id).unwrap_or_default();
            let body = format!(r#"{{"event_id":{id},"outcome":"{label}"}}"#);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response()
        }
        Err((id, err)) => {
            let (code, kind, _) = status(&err);
            let id = id.as_deref().unwrap_or("-");
            if code.is_server_error() {
                log::error!("stripe {id} {kind} {}: {err} {ms:.1}ms", code.as_u16());
            } else {
                // Client faults: the kind and our own message; never the body.
                let text = err.log_text();
                log::warn!(
                    "stripe {id} rejected {kind} {}: {text} {ms:.1}ms",
                    code.as_u16()
                );
            }
            error_response(&err)
        }
    }
}

/// The request path. Errors carry the event id once it is known, for the log line.
async fn receive_stripe(
    ingest: &Ingest,
    request: Request,
) -> Result<(String, String, Outcome), (Option<String>, IngestError)> {
    let (parts, body) = request.into_parts();
    let body = read_body(body, &parts.headers, ingest.max_body, ingest.read_timeout)
        .await
        .map_err(|e| (None, e))?;
    let signature = parts.headers.get(stripe::HEADER).map(HeaderValue::as_bytes);
    stripe::verify(
        &ingest.stripe_secrets,
        signature,
        &body,
        unix_now(),
        ingest.tolerance_secs,
    )
    .map_err(|e| (None, e.into()))?;
    let event = event::parse_stripe(body).map_err(|e| (None, e.into()))?;
    let (id, kind) = (event.id.clone(), event.kind.clone());
    let fail = |e: StoreError| (Some(id.clone()), IngestError::from(e));
    let reply = ingest.writer.try_submit(event).map_err(fail)?;
    let outcome = reply
        .await
        .map_err(|_| fail(StoreError::ShuttingDown))?
        .map_err(fail)?;
    Ok((id, kind, outcome))
}

/// Reads the whole body, refusing more than `limit` bytes: from `Content-Length` before any
/// byte is read, and while reading a chunked body.
async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, IngestError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(IngestError::TooLarge { limit });
    }
    match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Err(_) => Err(IngestError::BodyTimeout(timeout)),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(IngestError::TooLarge { limit })
        }
        Ok(Err(e)) => Err(IngestError::BodyRead(e.to_string())),
    }
}

/// `{"error": kind, "message": …}` with the status from [`status`].
pub fn error_response(err: &IngestError) -> Response {
    let (code, kind, retry) = status(err);
    let mut response = (
        code,
        axum::Json(json!({ "error": kind, "message": public_message(err) })),
    )
        .into_response();
    if retry {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    }
    if matches!(
        err,
        IngestError::TooLarge { .. } | IngestError::BodyTimeout(_)
    ) {
        // The rest of the body is not read; the connection cannot be reused.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

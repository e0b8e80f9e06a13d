//! THE request path, top to bottom: find the source → check the signature headers → reserve
//! room in the body budget → read the body (bounded) → verify the signature on the raw bytes →
//! read the envelope → prepare the handlers → submit to the writer → answer after COMMIT.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::HttpConfig;
use crate::event::Event;
use crate::handler::Submission;
use crate::http::error::{IngestError, Rejection};
use crate::http::log_budget::LogBudget;
use crate::source::Source;
use crate::store::{Outcome, StoreError};
use crate::unix_now;
use crate::writer::WriterHandle;

/// What the request path needs, shared by all requests.
pub(crate) struct Ingest {
    pub(crate) sources: HashMap<Arc<str>, Source>,
    pub(crate) http: HttpConfig,
    pub(crate) budget: BodyBudget,
    pub(crate) writer: WriterHandle,
    /// Rejections are logged at most ten a second.
    pub(crate) rejection_log: LogBudget,
}

/// `POST /webhooks/{source}`.
pub(crate) async fn webhook(
    State(ingest): State<Arc<Ingest>>,
    Path(name): Path<String>,
    request: Request,
) -> Response {
    let Some(source) = ingest.sources.get(name.as_str()) else {
        return Rejection::unknown_source().into_response();
    };
    let started = Instant::now();
    let result = receive(&ingest, source, request).await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let name = &source.name;
    match result {
        Ok((event, outcome)) => {
            let label = match outcome {
                Outcome::Processed => "processed",
                Outcome::Duplicate => "duplicate",
            };
            let (id, kind) = (&event.id, &event.kind);
            log::info!("{name} {id} {kind} {label} {ms:.1}ms");
            // Built by hand: this is the hot path, and the id is the only dynamic part.
            let id = serde_json::to_string(id).unwrap_or_default();
            let body = format!(r#"{{"event_id":{id},"outcome":"{label}"}}"#);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response()
        }
        Err((id, err)) => {
            let rejection = Rejection::of(&err);
            if let Some(held_back) = ingest.rejection_log.admit(unix_now()) {
                let (code, kind) = (rejection.status.as_u16(), rejection.kind);
                let id = id.as_deref().unwrap_or("-");
                let more = match held_back {
                    0 => String::new(),
                    n => format!(" ({n} earlier rejections not logged)"),
                };
                if rejection.status.is_server_error() {
                    log::error!("{name} {id} {kind} {code}: {err} {ms:.1}ms{more}");
                } else {
                    // Client faults: the kind and our own message; never the body.
                    let text = err.log_text();
                    log::warn!("{name} {id} rejected {kind} {code}: {text} {ms:.1}ms{more}");
                }
            }
            rejection.into_response()
        }
    }
}

/// The request path for one source. Errors carry the event id once it is known, for the log.
async fn receive(
    ingest: &Ingest,
    source: &Source,
    request: Request,
) -> Result<(Event, Outcome), (Option<String>, IngestError)> {
    let (parts, body) = request.into_parts();
    let http = &ingest.http;
    let no_id = |e: IngestError| (None, e);
    source
        .scheme
        .precheck(&parts.headers, unix_now())
        .map_err(|e| no_id(e.into()))?;
    let size = declared_size(&parts.headers, http.max_body).map_err(no_id)?;
    let _room = ingest.budget.reserve(size).map_err(no_id)?;
    let body = read_body(body, http.max_body, http.read_timeout)
        .await
        .map_err(no_id)?;
    source
        .scheme
        .verify(&parts.headers, &body, unix_now())
        .map_err(|e| no_id(e.into()))?;
    let envelope = source
        .scheme
        .envelope(&parts.headers, &body)
        .map_err(|e| no_id(e.into()))?;
    let event = Event {
        source: source.name.clone(),
        id: envelope.id,
        kind: envelope.kind,
        created: envelope.created,
        body,
    };
    let handlers = source
        .handlers
        .iter()
        .map(|h| Ok((h.clone(), h.prepare(&event)?)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| (Some(event.id.clone()), IngestError::Parse(e)))?;
    let submission = Submission {
        event: event.clone(),
        handlers,
        forward: source.forward,
    };
    let fail = |e: StoreError| (Some(event.id.clone()), IngestError::from(e));
    let reply = ingest.writer.try_submit(submission).map_err(fail)?;
    let outcome = reply
        .await
        .map_err(|_| fail(StoreError::ShuttingDown))?
        .map_err(fail)?;
    Ok((event, outcome))
}

/// The most bytes the body can have: its `Content-Length`, refused at once over `limit`; a
/// body without one (chunked) may have up to `limit`.
fn declared_size(headers: &HeaderMap, limit: usize) -> Result<usize, IngestError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(len) if len > limit as u64 => Err(IngestError::TooLarge { limit }),
        Some(len) => Ok(len as usize),
        None => Ok(limit),
    }
}

/// The bytes of request bodies that may be held in memory at once, across all requests. A
/// request reserves its body's size before reading it; when the budget is spent it is refused
/// (503) without reading, so memory stays bounded however many senders stream bodies at once.
pub(crate) struct BodyBudget {
    /// One permit per KiB.
    kib: Arc<Semaphore>,
}

impl BodyBudget {
    pub(crate) fn new(bytes: usize) -> Self {
        BodyBudget {
            kib: Arc::new(Semaphore::new(bytes.div_ceil(1024))),
        }
    }

    /// Room for `bytes` until the returned permit is dropped, or `BodyBudget` if there is none.
    fn reserve(&self, bytes: usize) -> Result<OwnedSemaphorePermit, IngestError> {
        let kib = u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        self.kib
            .clone()
            .try_acquire_many_owned(kib)
            .map_err(|_| IngestError::BodyBudget)
    }
}

/// Reads the whole body, refusing more than `limit` bytes (a chunked body is cut off when it
/// goes over) and a body that takes longer than `timeout`.
async fn read_body(body: Body, limit: usize, timeout: Duration) -> Result<Bytes, IngestError> {
    match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Err(_) => Err(IngestError::BodyTimeout(timeout)),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(IngestError::TooLarge { limit })
        }
        Ok(Err(e)) => Err(IngestError::BodyRead(e.to_string())),
    }
}

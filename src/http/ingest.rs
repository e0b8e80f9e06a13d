//! THE request path, top to bottom: find the source → check the signature headers → reserve
//! room in the body budget → read the body (bounded) → verify the signature on the raw bytes →
//! answer a handshake (nothing claimed) → read the envelope (or, for a body that is an array of
//! events, cut it into its elements) → prepare the handlers → submit to the writer → answer
//! after COMMIT.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;

use crate::config::{HttpConfig, BATCH_CHUNK};
use crate::event::Event;
use crate::http::body::{declared_size, read_body, BodyBudget};
use crate::http::error::{IngestError, Rejection};
use crate::log_budget::LogBudget;
use crate::metrics::{self, Metrics, Seen};
use crate::refusals::Refusals;
use crate::source::{Challenge, LiveSources, Source, Split};
use crate::sql::StoreError;
use crate::store::Outcome;
use crate::time::unix_now;
use crate::trace::{self, SpanContext, Tracer};
use crate::writer::WriterHandle;

/// What the request path needs, shared by all requests.
pub(crate) struct Ingest {
    /// The sources by name, swapped whole by a reload between two requests.
    pub(crate) sources: Arc<LiveSources>,
    pub(crate) http: HttpConfig,
    pub(crate) budget: BodyBudget,
    pub(crate) writer: WriterHandle,
    /// Rejections are logged at most ten a second.
    pub(crate) rejection_log: LogBudget,
    pub(crate) metrics: Arc<Metrics>,
    /// Refusals counted for `/status` (kept in the database off this path).
    pub(crate) refusals: Arc<Refusals>,
    /// When traces are on (`otlp_endpoint`): a span per request.
    pub(crate) tracer: Option<Arc<Tracer>>,
}

/// `POST /webhooks/{source}`.
pub(crate) async fn webhook(
    State(ingest): State<Arc<Ingest>>,
    Path(name): Path<String>,
    request: Request,
) -> Response {
    let started = Instant::now();
    // Only when traces are on: the span, a child of the sender's `traceparent` if it sent one.
    let span = ingest.tracer.as_ref().map(|tracer| {
        let parent = request
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(SpanContext::from_traceparent);
        (tracer, tracer.begin("webhook", trace::SERVER, parent))
    });
    // A copy of the one source: a reload may swap the map while this request runs.
    let source = ingest.sources.load().get(name.as_str()).cloned();
    let Some(source) = source else {
        let rejection = Rejection::unknown_source();
        ingest.refusals.record_unknown(&name, unix_now());
        let seconds = started.elapsed().as_secs_f64();
        ingest.metrics.rejected(None, rejection.kind, seconds);
        let reason = rejection.kind;
        if let Some(more) = ingest.rejection_log.admit(unix_now(), "rejections") {
            tracing::warn!(
                source = %name.escape_debug(),
                outcome = "refused",
                reason,
                status = 404,
                "request rejected: no source `{}`{more}",
                name.escape_debug()
            );
        }
        let response = rejection.into_response();
        if let Some((tracer, span)) = span {
            let traced = Traced {
                outcome: "refused",
                reason,
                ..Traced::default()
            };
            traced.end(tracer, span, &name, response.status().as_u16());
        }
        return response;
    };
    let context = span
        .as_ref()
        .map(|(tracer, span)| (&***tracer, span.context));
    let result = receive(&ingest, &source, request, context).await;
    let seconds = started.elapsed().as_secs_f64();
    let name = &source.name;
    let traced = span.is_some().then(|| Traced::of(&result));
    let response = match result {
        Ok(Answer::Event(event, outcome)) => answer_event(&ingest, name, event, outcome, seconds),
        Ok(Answer::Challenge(challenge)) => answer_challenge(&ingest, name, challenge, seconds),
        Ok(Answer::Events(events)) => answer_events(&ingest, name, events, seconds),
        Err((known, err)) => refuse(&ingest, name, known, err, seconds),
    };
    if let (Some((tracer, span)), Some(traced)) = (span, traced) {
        traced.end(tracer, span, name, response.status().as_u16());
    }
    response
}

/// What a request's span says of it.
#[derive(Default)]
struct Traced {
    /// The (first) event's id and type, once read.
    event_id: Option<String>,
    event_type: Option<String>,
    /// Events in the request (a body that is an array of them may hold several).
    events: usize,
    /// `processed`, `duplicate`, `failed` (read, not committed), `refused` (before an event
    /// could be read), `challenge`.
    outcome: &'static str,
    /// The error's kind, when refused or failed.
    reason: &'static str,
}

impl Traced {
    fn of(result: &Result<Answer, (Option<Known>, IngestError)>) -> Traced {
        match result {
            Ok(Answer::Event(event, outcome)) => Traced {
                event_id: Some(event.id.clone()),
                event_type: Some(event.kind.clone()),
                events: 1,
                outcome: metrics::Outcome::from(*outcome).label(),
                reason: "",
            },
            Ok(Answer::Challenge(_)) => Traced {
                outcome: "challenge",
                ..Traced::default()
            },
            Ok(Answer::Events(events)) => {
                let failed = events.iter().find_map(|(_, r)| r.as_ref().err());
                let processed = events
                    .iter()
                    .any(|(_, r)| matches!(r, Ok(Outcome::Processed)));
                let first = events.first().map(|(known, _)| known);
                Traced {
                    event_id: first.map(|k| k.id.clone()),
                    event_type: first.map(|k| k.kind.clone()),
                    events: events.len(),
                    outcome: match (failed, processed) {
                        (Some(_), _) => "failed",
                        (None, true) => "processed",
                        (None, false) => "duplicate",
                    },
                    reason: failed.map_or("", Rejection::of_store_kind),
                }
            }
            Err((known, err)) => Traced {
                event_id: known.as_ref().map(|k| k.id.clone()),
                event_type: known.as_ref().map(|k| k.kind.clone()),
                events: usize::from(known.is_some()),
                outcome: if known.is_some() { "failed" } else { "refused" },
                reason: Rejection::of(err).kind,
            },
        }
    }

    /// Ends the request's span with what it says.
    fn end(self, tracer: &Tracer, span: trace::Started, source: &str, status: u16) {
        let mut attributes: Vec<(&'static str, trace::Value)> = vec![
            ("http.request.method", "POST".into()),
            ("http.route", "/webhooks/{source}".into()),
            ("http.response.status_code", i64::from(status).into()),
            ("hookledger.source", source.into()),
            ("hookledger.outcome", self.outcome.into()),
        ];
        if let Some(id) = self.event_id {
            attributes.push(("hookledger.event_id", id.into()));
        }
        if let Some(kind) = self.event_type {
            attributes.push(("hookledger.event_type", kind.into()));
        }
        if self.events > 1 {
            attributes.push(("hookledger.events", (self.events as i64).into()));
        }
        if !self.reason.is_empty() {
            attributes.push(("hookledger.reason", self.reason.into()));
        }
        tracer.end(span, attributes, status >= 500);
    }
}

/// What a request is answered with, when it is not refused.
enum Answer {
    /// One event, committed (new or a duplicate).
    Event(Event, Outcome),
    /// A handshake the sender requires before it delivers: nothing claimed.
    Challenge(Challenge),
    /// The events of a body that is an array of them, in order, each with its outcome.
    Events(Vec<(Known, Result<Outcome, StoreError>)>),
}

/// 200 with the event's outcome.
fn answer_event(
    ingest: &Ingest,
    name: &Arc<str>,
    event: Event,
    outcome: Outcome,
    seconds: f64,
) -> Response {
    let ms = seconds * 1000.0;
    let label = metrics::Outcome::from(outcome).label();
    let (id, kind) = (&event.id, &event.kind);
    // Fields as `&str`, not `%` (Display): the log records them without formatting.
    tracing::info!(
        source = &**name,
        event_id = id.as_str(),
        event_type = kind.as_str(),
        outcome = label,
        status = 200,
        duration_ms = round_ms(ms),
        "{name} {id} {kind} {label} {ms:.1}ms"
    );
    // Built by hand: this is the hot path, and the id is the only dynamic part.
    let id = serde_json::to_string(id).unwrap_or_default();
    let body = format!(r#"{{"event_id":{id},"outcome":"{label}"}}"#);
    let seen = Seen {
        at: unix_now(),
        id: event.id,
        kind: event.kind,
        outcome: outcome.into(),
        reason: "",
        millis: ms,
    };
    ingest.metrics.event(name, seen, seconds);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// 200 with what the handshake asks for.
fn answer_challenge(
    ingest: &Ingest,
    name: &Arc<str>,
    challenge: Challenge,
    seconds: f64,
) -> Response {
    let ms = seconds * 1000.0;
    let kind = challenge.kind;
    tracing::info!(
        source = %name,
        event_type = kind,
        outcome = "challenge",
        status = 200,
        duration_ms = round_ms(ms),
        "{name} - {kind} challenge {ms:.1}ms"
    );
    ingest.metrics.challenge(name, kind, seconds);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, challenge.content_type)],
        challenge.body,
    )
        .into_response()
}

/// 200 with each event's outcome when all committed; else the status of the first failure
/// (`Rejection::of_events`), with each event's outcome too.
fn answer_events(
    ingest: &Ingest,
    name: &Arc<str>,
    events: Vec<(Known, Result<Outcome, StoreError>)>,
    seconds: f64,
) -> Response {
    let ms = seconds * 1000.0;
    let mut first_error = None;
    let mut listed = Vec::with_capacity(events.len());
    let mut seen = Vec::with_capacity(events.len());
    for (Known { id, kind }, result) in events {
        let (outcome, reason) = match &result {
            Ok(outcome) => (metrics::Outcome::from(*outcome), ""),
            Err(e) => (metrics::Outcome::Failed, Rejection::of_store_kind(e)),
        };
        let label = outcome.label();
        match result {
            Ok(_) => {
                tracing::info!(
                    source = %name,
                    event_id = %id,
                    event_type = %kind,
                    outcome = label,
                    duration_ms = round_ms(ms),
                    "{name} {id} {kind} {label} {ms:.1}ms"
                );
                listed.push(json!({ "event_id": id, "outcome": label }));
            }
            Err(e) => {
                if let Some(more) = ingest.rejection_log.admit(unix_now(), "rejections") {
                    tracing::error!(
                        source = %name,
                        event_id = %id,
                        event_type = %kind,
                        outcome = "failed",
                        reason,
                        duration_ms = round_ms(ms),
                        "{name} {id} {kind} {reason}: {e} {ms:.1}ms{more}"
                    );
                }
                // Every error an event of an array can have is the store's or its handler's
                // (the server's): only its kind is kept.
                ingest.refusals.record(name, reason, unix_now(), || {
                    refusal_message(Some(&id), reason, true, String::new)
                });
                listed.push(json!({ "event_id": id, "outcome": label, "error": reason }));
                first_error.get_or_insert(e);
            }
        }
        seen.push(Seen {
            at: unix_now(),
            id,
            kind,
            outcome,
            reason,
            millis: ms,
        });
    }
    ingest.metrics.events(name, seen, seconds);
    match first_error {
        None => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            json!({ "events": listed }).to_string(),
        )
            .into_response(),
        Some(first) => Rejection::of_events(&first, listed.into()),
    }
}

/// What `/status` keeps about a refusal of event `id` (when it was read) for `kind`. A client's
/// fault is hookledger's own text about it (`text`); a server error's text can carry a value
/// of the payload (a database's `DETAIL: Key (email)=(…)`), so only its kind is kept and the
/// text is left to the log.
fn refusal_message(
    id: Option<&str>,
    kind: &str,
    server_error: bool,
    text: impl FnOnce() -> String,
) -> String {
    let text = if server_error {
        format!("{kind}: see the log for the error")
    } else {
        text()
    };
    match id {
        Some(id) => format!("event {id}: {text}"),
        None => text,
    }
}

/// The error's answer (`Rejection::of`), logged and counted.
fn refuse(
    ingest: &Ingest,
    name: &Arc<str>,
    known: Option<Known>,
    err: IngestError,
    seconds: f64,
) -> Response {
    let ms = seconds * 1000.0;
    let rejection = Rejection::of(&err);
    if let Some(more) = ingest.rejection_log.admit(unix_now(), "rejections") {
        let (code, kind) = (rejection.status.as_u16(), rejection.kind);
        let id = known.as_ref().map_or("-", |k| k.id.as_str());
        let outcome = if known.is_some() { "failed" } else { "refused" };
        // The same fields at either level (tracing's level is fixed where a line is written).
        macro_rules! refusal {
            ($level:expr, $($message:tt)+) => {
                tracing::event!(
                    $level,
                    source = %name,
                    event_id = id,
                    outcome,
                    reason = kind,
                    status = code,
                    duration_ms = round_ms(ms),
                    $($message)+
                )
            };
        }
        if rejection.status.is_server_error() {
            refusal!(
                tracing::Level::ERROR,
                "{name} {id} {kind} {code}: {err} {ms:.1}ms{more}"
            );
        } else {
            // Client faults: the kind and our own message; never the body.
            let text = err.log_text();
            refusal!(
                tracing::Level::WARN,
                "{name} {id} rejected {kind} {code}: {text} {ms:.1}ms{more}"
            );
        }
    }
    let server_error = rejection.status.is_server_error();
    let id = known.as_ref().map(|k| k.id.as_str());
    ingest
        .refusals
        .record(name, rejection.kind, unix_now(), || {
            refusal_message(id, rejection.kind, server_error, || err.log_text())
        });
    match known {
        Some(Known { id, kind }) => {
            let seen = Seen {
                at: unix_now(),
                id,
                kind,
                outcome: metrics::Outcome::Failed,
                reason: rejection.kind,
                millis: ms,
            };
            ingest.metrics.event(name, seen, seconds);
        }
        None => ingest.metrics.rejected(Some(name), rejection.kind, seconds),
    }
    rejection.into_response()
}

/// Milliseconds to a tenth, for a log field.
fn round_ms(ms: f64) -> f64 {
    (ms * 10.0).round() / 10.0
}

/// An event's id and type, once read: for the log and the counts of an event that failed.
struct Known {
    id: String,
    kind: String,
}

impl Known {
    fn of(event: &Event) -> Known {
        Known {
            id: event.id.clone(),
            kind: event.kind.clone(),
        }
    }
}

/// The request path for one source. Errors carry the event's id and type once
/// known, for the log and the counts.
/// With traces on, `span` is the request's: remembered for each event before it is submitted,
/// so that its delivery (which may start as soon as it commits) continues the trace.
async fn receive(
    ingest: &Ingest,
    source: &Source,
    request: Request,
    span: Option<(&Tracer, SpanContext)>,
) -> Result<Answer, (Option<Known>, IngestError)> {
    let (parts, body) = request.into_parts();
    let http = &ingest.http;
    let no_id = |e: IngestError| (None, e);
    source
        .scheme
        .precheck(&parts.headers, unix_now())
        .map_err(|e| no_id(e.into()))?;
    let size = declared_size(&parts.headers, source.max_body).map_err(no_id)?;
    let mut room = ingest.budget.reserve(size).map_err(no_id)?;
    let body = read_body(body, source.max_body, http.read_timeout, &mut room)
        .await
        .map_err(no_id)?;
    source
        .scheme
        .verify_request(&parts.headers, parts.uri.query(), &body, unix_now())
        .map_err(|e| no_id(e.into()))?;
    let challenge = source
        .challenge(&parts.headers, &body)
        .map_err(|e| no_id(e.into()))?;
    if let Some(challenge) = challenge {
        return Ok(Answer::Challenge(challenge));
    }
    if let Some(split) = &source.split {
        return receive_events(ingest, source, split, body, span).await;
    }
    let envelope = source
        .envelope(&parts.headers, &body)
        .map_err(|e| no_id(e.into()))?;
    let event = Event {
        source: source.name.clone(),
        id: envelope.id,
        kind: envelope.kind,
        created: envelope.created,
        body,
    };
    let submission = source
        .submission(event.clone())
        .map_err(|e| (Some(Known::of(&event)), IngestError::Parse(e)))?;
    let fail = |e: StoreError| (Some(Known::of(&event)), IngestError::from(e));
    if let Some((tracer, context)) = span {
        tracer.remember(&source.name, &event.id, context);
    }
    let reply = ingest.writer.try_submit(submission).map_err(fail)?;
    let outcome = reply
        .await
        .map_err(|_| fail(StoreError::ShuttingDown))?
        .map_err(fail)?;
    Ok(Answer::Event(event, outcome))
}

/// The rest of the path for a body that is an array of events: each element an event of its
/// own (its own bytes, id and type), written in writer jobs of [`BATCH_CHUNK`] events (one
/// transaction each, a savepoint per event), one after the other: other requests' jobs run
/// between them, so a big batch never holds the writer for its whole array. An array or an
/// element that cannot be read, or more elements than the source takes, refuses the whole
/// request before anything is claimed. A chunk that fails leaves the ones before it committed:
/// the sender's retry finds them duplicates.
async fn receive_events(
    ingest: &Ingest,
    source: &Source,
    split: &Split,
    body: Bytes,
    span: Option<(&Tracer, SpanContext)>,
) -> Result<Answer, (Option<Known>, IngestError)> {
    let no_id = |e: IngestError| (None, e);
    let elements = split.elements(&body).map_err(|e| no_id(e.into()))?;
    let events: Vec<Event> = elements
        .into_iter()
        .map(|(envelope, body)| Event {
            source: source.name.clone(),
            id: envelope.id,
            kind: envelope.kind,
            created: envelope.created,
            body,
        })
        .collect();
    let submissions = events
        .iter()
        .map(|event| {
            source
                .submission(event.clone())
                .map_err(|e| (Some(Known::of(event)), IngestError::Parse(e)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some((tracer, context)) = span {
        for event in &events {
            tracer.remember(&source.name, &event.id, context);
        }
    }
    let mut outcomes = Vec::with_capacity(submissions.len());
    let mut submissions = submissions.into_iter().peekable();
    while submissions.peek().is_some() {
        let chunk: Vec<_> = submissions.by_ref().take(BATCH_CHUNK).collect();
        let reply = ingest
            .writer
            .try_submit_all(chunk)
            .map_err(|e| no_id(e.into()))?;
        outcomes.extend(
            reply
                .await
                .map_err(|_| no_id(StoreError::ShuttingDown.into()))?,
        );
    }
    Ok(Answer::Events(
        events.iter().map(Known::of).zip(outcomes).collect(),
    ))
}

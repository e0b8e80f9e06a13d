//! OpenTelemetry traces, exported over OTLP/HTTP as JSON (`POST {otlp_endpoint}/v1/traces`),
//! when `otlp_endpoint` is set: one span per webhook request (its source, event id, outcome
//! and status) and one per HTTP delivery attempt, a child of the request's span, whose
//! context goes to the target in a W3C `traceparent` header. A leaf: it imports nothing of
//! the crate.
//!
//! Our own exporter rather than the `opentelemetry` SDK crates: two kinds of span with a few
//! attributes need neither the SDK's context machinery nor a protobuf stack and a second HTTP
//! client; this is a JSON body sent with the HTTP client the outbox already uses.
//!
//! # Ordering
//! A delivery continues the trace of the request that committed its event: the request
//! remembers its span's context by (source, event id), and the delivery of that event's
//! outbox row looks it up. The memory holds the last [`REMEMBERED`] events; a row delivered
//! after a restart, or long after, starts a trace of its own.
//!
//! # Failure modes
//! Spans leave the request path through a bounded queue ([`QUEUE`]): when it is full (the
//! collector is slow or down) a span is dropped and counted
//! (`hookledger_trace_spans_dropped_total`); a request never waits for the collector. One
//! thread sends them in batches of at most [`BATCH`]; a batch the collector does not take is
//! dropped and counted too, and logged at most once a minute (without the URL, which may
//! carry credentials).

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use serde_json::json;

/// Spans waiting for the exporter: about a second of requests at several thousand a second,
/// a few hundred KiB; past it spans are dropped, not waited for.
pub(crate) const QUEUE: usize = 4096;
/// Spans per export request: a body of a few hundred KiB at most.
pub(crate) const BATCH: usize = 512;
/// How long the exporter gathers spans after the first of a batch: spans reach the collector
/// within this, in a few requests a second under load.
const GATHER: Duration = Duration::from_millis(200);
/// A collector that does not answer within this loses the batch, and the exporter moves on.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// Events whose request span is remembered for their deliveries: a delivery usually follows
/// its event within seconds.
pub(crate) const REMEMBERED: usize = 10_000;

/// `SPAN_KIND_SERVER` (a request we answer) and `SPAN_KIND_CLIENT` (one we send) in OTLP.
pub(crate) const SERVER: u8 = 2;
pub(crate) const CLIENT: u8 = 3;

/// A span's place in its trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpanContext {
    pub(crate) trace_id: [u8; 16],
    pub(crate) span_id: [u8; 8],
}

impl SpanContext {
    /// A W3C `traceparent` (`00-{trace id}-{parent id}-{flags}`), or `None` when it is not
    /// one (an all-zero id is invalid).
    pub(crate) fn from_traceparent(value: &str) -> Option<SpanContext> {
        let mut parts = value.trim().split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let lower_hex = |s: &str| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if version.len() != 2 || version == "ff" || flags.len() != 2 {
            return None;
        }
        // Version 00 has exactly four parts; later versions may append more.
        if version == "00" && parts.next().is_some() {
            return None;
        }
        if ![version, trace, span, flags].iter().all(|p| lower_hex(p)) {
            return None;
        }
        let mut context = SpanContext {
            trace_id: [0; 16],
            span_id: [0; 8],
        };
        hex::decode_to_slice(trace, &mut context.trace_id).ok()?;
        hex::decode_to_slice(span, &mut context.span_id).ok()?;
        if context.trace_id == [0; 16] || context.span_id == [0; 8] {
            return None;
        }
        Some(context)
    }

    /// As a W3C `traceparent`, sampled.
    pub(crate) fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-01",
            hex::encode(self.trace_id),
            hex::encode(self.span_id)
        )
    }
}

/// An attribute's value.
#[derive(Debug, Clone)]
pub(crate) enum Value {
    Str(String),
    Int(i64),
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Str(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Str(s)
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Value {
        Value::Int(n)
    }
}

/// A span begun and not yet ended.
#[derive(Debug)]
pub(crate) struct Started {
    pub(crate) context: SpanContext,
    parent: Option<[u8; 8]>,
    name: &'static str,
    kind: u8,
    start: u64,
}

/// A finished span, waiting for export.
#[derive(Debug)]
struct Span {
    started: Started,
    end: u64,
    attributes: Vec<(&'static str, Value)>,
    error: bool,
}

/// Starts spans, hands finished ones to the exporter thread, and remembers the request span
/// of recent events for their deliveries.
#[derive(Debug)]
pub(crate) struct Tracer {
    /// Finished spans, to the exporter thread. Dropping the tracer closes it: the exporter
    /// sends what it holds and ends.
    spans: SyncSender<Span>,
    /// Spans dropped: the queue was full, or the collector refused or did not answer.
    dropped: Counter,
    remembered: Mutex<Remembered>,
}

#[derive(Debug, Default)]
struct Remembered {
    by_event: HashMap<(Arc<str>, String), SpanContext>,
    /// Oldest first, to forget past [`REMEMBERED`].
    order: VecDeque<(Arc<str>, String)>,
}

impl Tracer {
    /// Starts the exporter thread sending to `endpoint` (its `/v1/traces`, unless it names
    /// that path already); spans dropped are counted in `dropped`.
    pub(crate) fn start(endpoint: &str, dropped: Counter) -> std::io::Result<Tracer> {
        let url = traces_url(endpoint);
        let (spans, queue) = mpsc::sync_channel(QUEUE);
        let agent = ureq::AgentBuilder::new()
            .timeout(EXPORT_TIMEOUT)
            .redirects(0)
            .user_agent(concat!("hookledger/", env!("CARGO_PKG_VERSION")))
            .build();
        let counted = dropped.clone();
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || export(queue, &url, &agent, &counted))?;
        Ok(Tracer {
            spans,
            dropped,
            remembered: Mutex::default(),
        })
    }

    /// Begins a span: a child of `parent`, or the root of a new trace.
    pub(crate) fn begin(
        &self,
        name: &'static str,
        kind: u8,
        parent: Option<SpanContext>,
    ) -> Started {
        let trace_id = parent.map_or_else(random_id, |p| p.trace_id);
        Started {
            context: SpanContext {
                trace_id,
                span_id: random_id(),
            },
            parent: parent.map(|p| p.span_id),
            name,
            kind,
            start: unix_nanos(),
        }
    }

    /// Ends `started` now, with `attributes`; queued for export, or dropped and counted when
    /// the queue is full. Never blocks.
    pub(crate) fn end(
        &self,
        started: Started,
        attributes: Vec<(&'static str, Value)>,
        error: bool,
    ) {
        let span = Span {
            started,
            end: unix_nanos(),
            attributes,
            error,
        };
        match self.spans.try_send(span) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.inc();
            }
        }
    }

    /// Remembers `context` as the span of the request that committed `event_id` of `source`.
    pub(crate) fn remember(&self, source: &Arc<str>, event_id: &str, context: SpanContext) {
        let mut r = self.remembered.lock().unwrap_or_else(|e| e.into_inner());
        let key = (source.clone(), event_id.to_string());
        if r.by_event.insert(key.clone(), context).is_none() {
            r.order.push_back(key);
        }
        while r.order.len() > REMEMBERED {
            if let Some(old) = r.order.pop_front() {
                r.by_event.remove(&old);
            }
        }
    }

    /// The span of the request that committed `event_id` of `source`, if still remembered.
    pub(crate) fn recall(&self, source: &str, event_id: &str) -> Option<SpanContext> {
        let r = self.remembered.lock().unwrap_or_else(|e| e.into_inner());
        // Keyed by an `Arc<str>` to share the source's name; looked up by a `&str`.
        r.by_event
            .get(&(Arc::from(source), event_id.to_string()))
            .copied()
    }
}

/// `{endpoint}/v1/traces`, the OTLP/HTTP path for traces, unless `endpoint` ends with it.
pub(crate) fn traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    match base.ends_with("/v1/traces") {
        true => base.to_string(),
        false => format!("{base}/v1/traces"),
    }
}

/// The exporter thread: gathers spans into batches and POSTs each, until the tracer is gone.
fn export(queue: Receiver<Span>, url: &str, agent: &ureq::Agent, dropped: &Counter) {
    let mut last_warning: Option<Instant> = None;
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        let deadline = Instant::now() + GATHER;
        let mut open = true;
        while batch.len() < BATCH {
            match queue.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(span) => batch.push(span),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let body = encode(&batch).to_string();
        let sent = agent
            .post(url)
            .set("Content-Type", "application/json")
            .send_string(&body);
        if let Err(e) = sent {
            dropped.inc_by(batch.len() as u64);
            if last_warning.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                last_warning = Some(Instant::now());
                // The kind or the status only: the full message repeats the URL.
                let why = match e {
                    ureq::Error::Status(status, _) => format!("HTTP {status}"),
                    ureq::Error::Transport(t) => t.kind().to_string(),
                };
                tracing::warn!(
                    spans = batch.len(),
                    error = %why,
                    "OTLP collector did not take a batch of spans; dropped"
                );
            }
        }
        if !open {
            break;
        }
    }
}

/// A batch as an OTLP `ExportTraceServiceRequest` in its JSON form (ids in hex, times as
/// decimal strings of Unix nanoseconds).
fn encode(batch: &[Span]) -> serde_json::Value {
    let spans: Vec<serde_json::Value> = batch
        .iter()
        .map(|span| {
            let s = &span.started;
            let attributes: Vec<serde_json::Value> = span
                .attributes
                .iter()
                .map(|(key, value)| {
                    let value = match value {
                        Value::Str(s) => json!({ "stringValue": s }),
                        Value::Int(n) => json!({ "intValue": n.to_string() }),
                    };
                    json!({ "key": key, "value": value })
                })
                .collect();
            json!({
                "traceId": hex::encode(s.context.trace_id),
                "spanId": hex::encode(s.context.span_id),
                "parentSpanId": s.parent.map(hex::encode).unwrap_or_default(),
                "name": s.name,
                "kind": s.kind,
                "startTimeUnixNano": s.start.to_string(),
                "endTimeUnixNano": span.end.to_string(),
                "attributes": attributes,
                // STATUS_CODE_ERROR, or UNSET.
                "status": { "code": if span.error { 2 } else { 0 } },
            })
        })
        .collect();
    json!({
        "resourceSpans": [{
            "resource": { "attributes": [
                { "key": "service.name", "value": { "stringValue": "hookledger" } },
                { "key": "service.version",
                  "value": { "stringValue": env!("CARGO_PKG_VERSION") } },
            ]},
            "scopeSpans": [{
                "scope": { "name": "hookledger", "version": env!("CARGO_PKG_VERSION") },
                "spans": spans,
            }],
        }],
    })
}

fn random_id<const N: usize>() -> [u8; N] {
    loop {
        let mut id = [0u8; N];
        id.iter_mut().for_each(|b| *b = fastrand::u8(..));
        // All zeros is the invalid id.
        if id != [0u8; N] {
            return id;
        }
    }
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_bad_ones_are_refused() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = SpanContext::from_traceparent(text).unwrap();
        assert_eq!(
            hex::encode(context.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(hex::encode(context.span_id), "00f067aa0ba902b7");
        assert_eq!(context.traceparent(), text);
        // A later version may add fields.
        assert!(SpanContext::from_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
        )
        .is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
        ] {
            assert_eq!(SpanContext::from_traceparent(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_traces_path_is_added_once() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_the_memory_is_bounded() {
        // A collector that never answers: nothing listens on a closed port's accept queue.
        let dropped = Counter::default();
        let tracer = Tracer::start("http://127.0.0.1:9", dropped.clone()).unwrap();
        let started = Instant::now();
        for _ in 0..QUEUE * 3 {
            let span = tracer.begin("webhook", SERVER, None);
            tracer.end(span, vec![("k", "v".into())], false);
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "ending spans waited"
        );
        assert!(dropped.get() >= QUEUE as u64, "{}", dropped.get());
        let source: Arc<str> = Arc::from("stripe");
        let first = tracer.begin("webhook", SERVER, None).context;
        tracer.remember(&source, "evt_0", first);
        assert_eq!(tracer.recall("stripe", "evt_0"), Some(first));
        assert_eq!(tracer.recall("github", "evt_0"), None);
        for i in 1..=REMEMBERED {
            tracer.remember(&source, &format!("evt_{i}"), first);
        }
        assert_eq!(
            tracer.recall("stripe", "evt_0"),
            None,
            "the oldest is forgotten"
        );
        assert!(tracer
            .recall("stripe", &format!("evt_{REMEMBERED}"))
            .is_some());
        assert_eq!(tracer.remembered.lock().unwrap().by_event.len(), REMEMBERED);
    }

    #[test]
    fn a_batch_encodes_as_otlp_json() {
        let dropped = Counter::default();
        let tracer = Tracer::start("http://127.0.0.1:9", dropped).unwrap();
        let parent = tracer.begin("webhook", SERVER, None);
        let child = tracer.begin("delivery", CLIENT, Some(parent.context));
        assert_eq!(child.context.trace_id, parent.context.trace_id);
        let span = Span {
            started: child,
            end: 2,
            attributes: vec![("hookledger.outbox.row_id", 7.into())],
            error: true,
        };
        let json = encode(std::slice::from_ref(&span));
        let s = &json["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(
            s["traceId"].as_str().unwrap(),
            hex::encode(parent.context.trace_id)
        );
        assert_eq!(
            s["parentSpanId"].as_str().unwrap(),
            hex::encode(parent.context.span_id)
        );
        assert_eq!(s["kind"], 3);
        assert_eq!(s["endTimeUnixNano"], "2");
        assert_eq!(s["status"]["code"], 2);
        assert_eq!(
            s["attributes"][0],
            json!({"key": "hookledger.outbox.row_id", "value": {"intValue": "7"}})
        );
    }
}

//! Every way a request can fail, and THE table that turns each into a status, an error kind, a
//! message, `Retry-After` and `Connection: close`: [`Rejection::of`].
//!
//! Error bodies are JSON `{"error": "<kind>", "message": "<what to fix>"}`. Client faults say
//! what to fix; server faults say nothing internal (the detail is logged instead).

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::event::ParseError;
use crate::source::VerifyError;
use crate::sql::StoreError;

/// Seconds a client should wait before retrying a 503.
pub(crate) const RETRY_AFTER_SECS: u64 = 1;

/// Every way a webhook request can fail.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IngestError {
    #[error("body is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the body was not received within {0:?}")]
    BodyTimeout(Duration),
    #[error("the body could not be read: {0}")]
    BodyRead(String),
    #[error("too many request bodies are being received at once")]
    BodyBudget,
    #[error(transparent)]
    Verify(#[from] VerifyError),
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl IngestError {
    /// The error for the log line: like `Display`, but never quoting the request body.
    pub(crate) fn log_text(&self) -> String {
        match self {
            IngestError::Parse(e) => e.summary(),
            other => other.to_string(),
        }
    }
}

/// An answer other than 200: everything the response says, decided in one place.
#[derive(Debug)]
pub(crate) struct Rejection {
    pub(crate) status: StatusCode,
    pub(crate) kind: &'static str,
    pub(crate) message: String,
    /// Send `Retry-After` ([`RETRY_AFTER_SECS`]): nothing was stored, a retry will do.
    pub(crate) retry_after: bool,
    /// Send `Connection: close`: the rest of the request was not read.
    pub(crate) close: bool,
}

impl Rejection {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Rejection {
            status,
            kind,
            message: message.into(),
            retry_after: false,
            close: false,
        }
    }

    fn retry(mut self) -> Self {
        self.retry_after = true;
        self
    }

    fn close(mut self) -> Self {
        self.close = true;
        self
    }

    /// THE status table of the request path.
    pub(crate) fn of(err: &IngestError) -> Rejection {
        use StatusCode as S;
        let text = err.to_string();
        match err {
            IngestError::TooLarge { .. } => {
                Rejection::new(S::PAYLOAD_TOO_LARGE, "body_too_large", text).close()
            }
            IngestError::BodyTimeout(_) => {
                Rejection::new(S::REQUEST_TIMEOUT, "body_timeout", text).close()
            }
            IngestError::BodyRead(_) => Rejection::new(S::BAD_REQUEST, "body_unreadable", text),
            IngestError::BodyBudget => Rejection::new(
                S::SERVICE_UNAVAILABLE,
                "overloaded",
                format!("too many request bodies in flight; nothing was stored, retry after {RETRY_AFTER_SECS} s"),
            )
            .retry()
            .close(),
            // Signature errors close the connection: most are found before the body is read.
            IngestError::Verify(VerifyError::TooOld { .. } | VerifyError::InFuture { .. }) => {
                Rejection::new(S::BAD_REQUEST, "timestamp_out_of_tolerance", text).close()
            }
            IngestError::Verify(_) => {
                Rejection::new(S::BAD_REQUEST, "invalid_signature", text).close()
            }
            IngestError::Parse(ParseError::TooManyEvents { .. }) => {
                Rejection::new(S::PAYLOAD_TOO_LARGE, "too_many_events", text)
            }
            IngestError::Parse(_) => Rejection::new(S::BAD_REQUEST, "invalid_event", text),
            IngestError::Store(e) => Rejection::of_store(e),
        }
    }

    /// The kind a store error is answered with (`disk_full`, `database_busy`, …).
    pub(crate) fn of_store_kind(err: &StoreError) -> &'static str {
        Rejection::of_store(err).kind
    }

    fn of_store(err: &StoreError) -> Rejection {
        use StatusCode as S;
        let unavailable = format!(
            "the database cannot take writes right now; nothing was stored, retry after {RETRY_AFTER_SECS} s"
        );
        match err {
            StoreError::QueueFull => Rejection::new(
                S::SERVICE_UNAVAILABLE,
                "overloaded",
                format!("too many events in flight; nothing was stored, retry after {RETRY_AFTER_SECS} s"),
            )
            .retry(),
            StoreError::ShuttingDown => {
                Rejection::new(S::SERVICE_UNAVAILABLE, "shutting_down", err.to_string()).retry()
            }
            StoreError::Busy(_) => {
                Rejection::new(S::SERVICE_UNAVAILABLE, "database_busy", unavailable).retry()
            }
            StoreError::Unavailable(_) => {
                Rejection::new(S::SERVICE_UNAVAILABLE, "database_unavailable", unavailable).retry()
            }
            StoreError::DiskFull(_) => {
                Rejection::new(S::SERVICE_UNAVAILABLE, "disk_full", unavailable).retry()
            }
            StoreError::ReadOnly(_) => {
                Rejection::new(S::SERVICE_UNAVAILABLE, "database_read_only", unavailable).retry()
            }
            StoreError::Database(_) => Rejection::new(
                S::INTERNAL_SERVER_ERROR,
                "internal",
                "the event could not be recorded and nothing was stored; retry later",
            ),
            // Nothing a retry of this body changes: a sender's own retry of the same event is
            // a duplicate before its token is looked at.
            StoreError::ReplayedSignature => {
                Rejection::new(S::BAD_REQUEST, "replayed_signature", err.to_string()).close()
            }
        }
    }

    /// Answered without reading the body: the connection is closed, so that a client does not
    /// send its next request on a connection the server may drop (an unread body is not
    /// drained).
    pub(crate) fn unknown_source() -> Rejection {
        Rejection::new(
            StatusCode::NOT_FOUND,
            "unknown_source",
            "no such webhook source; check the URL set at the provider (POST /webhooks/<source name>)",
        )
        .close()
    }

    pub(crate) fn not_found() -> Rejection {
        Rejection::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such path; webhooks go to POST /webhooks/<source name>",
        )
    }

    pub(crate) fn method_not_allowed() -> Rejection {
        Rejection::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "webhooks must be sent with POST",
        )
    }

    /// A connection over the cap, answered without reading its request.
    pub(crate) fn too_many_connections() -> Rejection {
        Rejection::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_connections",
            "connection limit reached; retry later",
        )
        .retry()
        .close()
    }

    /// The answer to a request whose events (a body that is an array of them) did not all
    /// commit; `first` is the first event's error. An event its handler or the database
    /// refused is a 500: the others committed, and the sender's retry finds them
    /// duplicates. When the database was not available, none committed: its 503 and
    /// `Retry-After`. The body lists each event's outcome (`events`).
    pub(crate) fn of_events(first: &StoreError, events: serde_json::Value) -> Response {
        let mut rejection = Rejection::of_store(first);
        if rejection.status == StatusCode::INTERNAL_SERVER_ERROR {
            rejection.message = "some events could not be recorded (their outcome is failed); \
                the others were stored, and a retry finds them duplicates"
                .into();
        }
        let body =
            json!({ "error": rejection.kind, "message": rejection.message, "events": events });
        rejection.respond(body.to_string())
    }

    fn body(&self) -> String {
        json!({ "error": self.kind, "message": self.message }).to_string()
    }

    /// The whole HTTP/1.1 response, for a connection that never reaches the router.
    pub(crate) fn to_http1(&self) -> String {
        let body = self.body();
        let mut head = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\n",
            self.status.as_u16(),
            self.status.canonical_reason().unwrap_or("")
        );
        if self.retry_after {
            head.push_str(&format!("retry-after: {RETRY_AFTER_SECS}\r\n"));
        }
        if self.close {
            head.push_str("connection: close\r\n");
        }
        format!("{head}content-length: {}\r\n\r\n{body}", body.len())
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        let body = self.body();
        self.respond(body)
    }
}

impl Rejection {
    /// The response with `body`, with this rejection's status and headers.
    fn respond(self, body: String) -> Response {
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
        let headers = response.headers_mut();
        if self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        if self.close {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if self.status == StatusCode::METHOD_NOT_ALLOWED {
            headers.insert(header::ALLOW, HeaderValue::from_static("POST"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_store_faults_are_server_errors_and_only_unavailability_asks_for_a_retry() {
        let store = |e: StoreError| Rejection::of(&IngestError::Store(e));
        let internal = store(StoreError::Database("x".into()));
        assert_eq!(internal.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!internal.retry_after && !internal.message.contains('x'));
        for e in [
            StoreError::QueueFull,
            StoreError::ShuttingDown,
            StoreError::Busy("b".into()),
            StoreError::Unavailable("u".into()),
            StoreError::DiskFull("d".into()),
            StoreError::ReadOnly("r".into()),
        ] {
            let r = store(e);
            assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(r.retry_after);
        }
        let partial = Rejection::of_events(&StoreError::Database("x".into()), json!([]));
        assert_eq!(partial.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(partial.headers().get(header::RETRY_AFTER).is_none());
        let none = Rejection::of_events(&StoreError::Busy("b".into()), json!([]));
        assert_eq!(none.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(none.headers().get(header::RETRY_AFTER).is_some());
        let big = Rejection::of(&IngestError::TooLarge { limit: 1 });
        assert_eq!(
            (big.status, big.close),
            (StatusCode::PAYLOAD_TOO_LARGE, true)
        );
        let refused = Rejection::too_many_connections().to_http1();
        assert!(
            refused.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{refused}"
        );
        assert!(
            refused.contains("retry-after: 1\r\nconnection: close\r\n"),
            "{refused}"
        );
    }
}

//! Stripe's API as hookledger uses it: list events (`GET /v1/events`) and retrieve a
//! subscription (`GET /v1/subscriptions/{id}`), with the secret key as a bearer token.
//!
//! Rate limits (429), Stripe's own errors (5xx) and lost connections are retried with a
//! doubling pause; a refused key (401, 403) is not: nothing will change until someone fixes
//! the key. No error message carries the key: Stripe's messages are logged and returned with
//! every key-like token cut short ([`redact_keys`]).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::Secret;

/// Events per page: Stripe's largest.
pub(crate) const PAGE: usize = 100;

/// The largest answer read (a page of 100 large events is a few MB).
const MAX_ANSWER: u64 = 64 * 1024 * 1024;

/// The pauses before each retry of a call (then it fails): about 30 s in all.
const BACKOFF: [Duration; 6] = [
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
];

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ApiError {
    /// 401 or 403: the key is wrong, revoked, or lacks a permission.
    #[error(
        "Stripe refused the API key (HTTP {status}: {message}); check the key and that it may \
         read Events and Subscriptions"
    )]
    Refused { status: u16, message: String },
    #[error("not found at Stripe: {0}")]
    NotFound(String),
    /// Another answer, or retries used up.
    #[error("{0}")]
    Failed(String),
}

/// One page of `GET /v1/events`, newest first, each event's JSON as Stripe sent it.
pub(crate) struct Page {
    pub(crate) events: Vec<Vec<u8>>,
    pub(crate) has_more: bool,
}

/// A client for one account's API.
pub(crate) struct StripeApi {
    agent: ureq::Agent,
    base: String,
    key: Secret,
    backoff: Vec<Duration>,
    /// Set when the caller stops: a pause before a retry ends, and the call fails.
    cancel: Option<Arc<AtomicBool>>,
}

#[derive(Deserialize)]
struct List<'a> {
    #[serde(borrow)]
    data: Vec<&'a RawValue>,
    /// Stripe always says; an API that does not has no more.
    #[serde(default)]
    has_more: bool,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    message: Option<String>,
}

impl StripeApi {
    /// A client for the API at `base` (`https://api.stripe.com`) with secret `key`.
    pub(crate) fn new(base: &str, key: Secret) -> StripeApi {
        StripeApi {
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(10))
                .timeout(Duration::from_secs(30))
                .build(),
            base: base.trim_end_matches('/').to_string(),
            key,
            backoff: BACKOFF.to_vec(),
            cancel: None,
        }
    }

    /// The same client, whose pauses end (and calls fail) once `cancel` is set.
    pub(crate) fn cancelled_by(mut self, cancel: Arc<AtomicBool>) -> StripeApi {
        self.cancel = Some(cancel);
        self
    }

    /// The client of a stripe source with an `api_key`.
    pub(crate) fn of(source: &crate::config::SourceConfig) -> Option<StripeApi> {
        let base = crate::recover::api_base(None, source, super::settings::STRIPE_API_BASE).ok()?;
        Some(StripeApi::new(base, source.api_key.clone()?))
    }

    /// The same client with other pauses between retries (none: one try).
    pub(crate) fn with_backoff(mut self, backoff: Vec<Duration>) -> StripeApi {
        self.backoff = backoff;
        self
    }

    /// A page of the events created at or after `since` (Unix seconds), after event
    /// `starting_after` when given.
    pub(crate) fn events(
        &self,
        since: i64,
        starting_after: Option<&str>,
    ) -> Result<Page, ApiError> {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        query.append_pair("limit", &PAGE.to_string());
        query.append_pair("created[gte]", &since.to_string());
        if let Some(id) = starting_after {
            query.append_pair("starting_after", id);
        }
        let body = self.get(&format!("/v1/events?{}", query.finish()))?;
        let list: List<'_> = serde_json::from_slice(&body)
            .map_err(|e| ApiError::Failed(format!("Stripe's list of events is not JSON: {e}")))?;
        Ok(Page {
            events: list
                .data
                .iter()
                .map(|e| e.get().as_bytes().to_vec())
                .collect(),
            has_more: list.has_more,
        })
    }

    /// The subscription `id` as Stripe has it now (its JSON).
    pub(crate) fn subscription(&self, id: &str) -> Result<Vec<u8>, ApiError> {
        let id: String = url::form_urlencoded::byte_serialize(id.as_bytes()).collect();
        self.get(&format!("/v1/subscriptions/{id}"))
    }

    /// `GET path`, retried as the module doc says.
    fn get(&self, path: &str) -> Result<Vec<u8>, ApiError> {
        let url = format!("{}{path}", self.base);
        let mut pauses = self.backoff.iter();
        loop {
            let retry = match self.get_once(&url) {
                Ok(body) => return Ok(body),
                Err(Retry::Again(why)) => why,
                Err(Retry::No(e)) => return Err(e),
            };
            let Some(pause) = pauses.next() else {
                return Err(ApiError::Failed(format!(
                    "GET {path}: {retry}; gave up after {} retries",
                    self.backoff.len()
                )));
            };
            log::warn!("Stripe API: GET {path}: {retry}; retrying in {pause:?}");
            self.pause(*pause)?;
        }
    }

    /// Sleeps `pause`, in steps, unless cancelled.
    fn pause(&self, pause: Duration) -> Result<(), ApiError> {
        match crate::recover::pause(pause, self.cancel.as_deref()) {
            true => Ok(()),
            false => Err(ApiError::Failed("stopped".into())),
        }
    }

    fn get_once(&self, url: &str) -> Result<Vec<u8>, Retry> {
        let result = self
            .agent
            .get(url)
            .set("Authorization", &format!("Bearer {}", self.key.expose()))
            .call();
        match result {
            Ok(response) => {
                let mut body = Vec::new();
                let mut reader = std::io::Read::take(response.into_reader(), MAX_ANSWER + 1);
                std::io::Read::read_to_end(&mut reader, &mut body)
                    .map_err(|e| Retry::Again(format!("reading the answer: {e}")))?;
                if body.len() as u64 > MAX_ANSWER {
                    return Err(Retry::No(ApiError::Failed(format!(
                        "an answer larger than {MAX_ANSWER} bytes"
                    ))));
                }
                Ok(body)
            }
            Err(ureq::Error::Status(status, response)) => {
                let message = response
                    .into_string()
                    .ok()
                    .and_then(|b| serde_json::from_str::<ErrorBody>(&b).ok())
                    .and_then(|b| b.error.message)
                    .map(|m| redact_keys(&m))
                    .unwrap_or_default();
                Err(match status {
                    429 | 500..=599 => Retry::Again(format!("HTTP {status} {message}")),
                    401 | 403 => Retry::No(ApiError::Refused { status, message }),
                    404 => Retry::No(ApiError::NotFound(message)),
                    _ => Retry::No(ApiError::Failed(format!("HTTP {status}: {message}"))),
                })
            }
            // The kind only: the message repeats the URL.
            Err(ureq::Error::Transport(t)) => Err(Retry::Again(t.kind().to_string())),
        }
    }
}

enum Retry {
    Again(String),
    No(ApiError),
}

/// The prefixes of Stripe's secret, restricted and publishable keys and of signing secrets.
const KEY_PREFIXES: [&str; 4] = ["sk_", "rk_", "pk_", "whsec_"];

/// `message` with every token that looks like a key or a signing secret (`sk_…`, `rk_…`,
/// `pk_…`, `whsec_…`), wherever it starts (`key=sk_…`, `"sk_…"`, `(rk_…)`), cut to its kind:
/// `sk_live_…`, `whsec_…`. A token starts where the character before is not a letter or a
/// digit, and runs over letters, digits and `_`.
pub(crate) fn redact_keys(message: &str) -> String {
    let is_token = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(message.len());
    let mut previous: Option<char> = None;
    let mut rest = message;
    while let Some(c) = rest.chars().next() {
        let at_start = !previous.is_some_and(|p| p.is_ascii_alphanumeric());
        if let Some(prefix) = KEY_PREFIXES
            .iter()
            .find(|p| at_start && rest.starts_with(**p))
        {
            let len = rest.find(|c: char| !is_token(c)).unwrap_or(rest.len());
            let token = &rest[..len];
            let mode = ["test_", "live_"]
                .iter()
                .find(|m| token[prefix.len()..].starts_with(**m))
                .map_or(0, |m| m.len());
            let kept = &token[..prefix.len() + mode];
            out.push_str(kept);
            if token.len() > kept.len() {
                out.push('…');
            }
            previous = token.chars().last();
            rest = &rest[len..];
            continue;
        }
        out.push(c);
        previous = Some(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    /// Stopping ends a retry's pause: the call fails as stopped, not after its retries.
    #[test]
    fn a_pause_before_a_retry_ends_when_cancelled() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let cancel = Arc::new(AtomicBool::new(false));
        let api = StripeApi::new(&base, Secret::new("sk_test_x"))
            .with_backoff(vec![Duration::from_secs(600)])
            .cancelled_by(cancel.clone());
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            cancel.store(true, Ordering::SeqCst);
        });
        assert_eq!(
            api.subscription("sub_1"),
            Err(ApiError::Failed("stopped".into()))
        );
        setter.join().unwrap();
    }

    #[test]
    fn a_key_in_stripes_message_is_cut_short() {
        assert_eq!(
            redact_keys("Invalid API Key provided: sk_test_abcdefghijklmnop"),
            "Invalid API Key provided: sk_test_…"
        );
        assert_eq!(
            redact_keys("Expired key rk_live_1234567890"),
            "Expired key rk_live_…"
        );
        assert_eq!(redact_keys("no key here"), "no key here");
    }

    #[test]
    fn every_key_like_token_anywhere_in_a_message_is_cut_short() {
        for (message, redacted) in [
            ("key=sk_live_abcdef0123456789", "key=sk_live_…"),
            (
                "Invalid request: \"sk_test_51Habc\" (rk_live_xyz), pk_test_9, whsec_s3cr3t.",
                "Invalid request: \"sk_test_…\" (rk_live_…), pk_test_…, whsec_….",
            ),
            ("sk_abcdef and whsec_", "sk_… and whsec_"),
            ("bearer_sk_live_abc", "bearer_sk_live_…"),
            ("é:sk_test_abc", "é:sk_test_…"),
            // Words that only contain a prefix are left alone.
            ("risk_score task_list", "risk_score task_list"),
        ] {
            assert_eq!(redact_keys(message), redacted, "{message}");
        }
    }

    /// Answers each of `answers` to one connection on a port of its own; returns the base.
    fn one_shot_api(answers: Vec<(u16, String)>) -> String {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for (status, body) in answers {
                let (mut stream, _) = listener.accept().unwrap();
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request);
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        base
    }

    /// A 400 once returned Stripe's message in full, and a 401 `key=sk_…`.
    #[test]
    fn an_error_that_echoes_the_key_is_returned_without_it() {
        let key = "sk_live_0123456789abcdefghij";
        let echo = |text: &str| format!(r#"{{"error":{{"message":"{text}"}}}}"#);
        let base = one_shot_api(vec![
            (400, echo(&format!("No such parameter for key {key}"))),
            (401, echo(&format!("Invalid API Key provided: key={key}"))),
            (404, echo(&format!("No such subscription (key {key})"))),
        ]);
        let api = StripeApi::new(&base, Secret::new(key)).with_backoff(Vec::new());
        for expected in [
            "HTTP 400: No such parameter for key sk_live_…",
            "HTTP 401: Invalid API Key provided: key=sk_live_…",
            "not found at Stripe: No such subscription (key sk_live_…)",
        ] {
            let error = api.subscription("sub_1").unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
            assert!(!error.contains("0123456789"), "{error}");
        }
    }
}

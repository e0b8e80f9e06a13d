//! Stripe's API as hookledger uses it: list events (`GET /v1/events`) and retrieve a
//! subscription (`GET /v1/subscriptions/{id}`), with the secret key as a bearer token.
//!
//! Rate limits (429), Stripe's own errors (5xx) and lost connections are retried with a
//! doubling pause; a refused key (401, 403) is not: nothing will change until someone fixes
//! the key. No error message carries the key.

use std::sync::atomic::{AtomicBool, Ordering};
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
        let base = source
            .api_base
            .as_deref()
            .unwrap_or(super::settings::STRIPE_API_BASE);
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
        let step = Duration::from_millis(100);
        let mut left = pause;
        while !left.is_zero() {
            if self
                .cancel
                .as_ref()
                .is_some_and(|c| c.load(Ordering::SeqCst))
            {
                return Err(ApiError::Failed("stopped".into()));
            }
            std::thread::sleep(left.min(step));
            left = left.saturating_sub(step);
        }
        Ok(())
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
                    .unwrap_or_default();
                Err(match status {
                    429 | 500..=599 => Retry::Again(format!("HTTP {status} {message}")),
                    401 | 403 => Retry::No(ApiError::Refused {
                        status,
                        message: without_key(&message),
                    }),
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

/// Stripe's message with anything that looks like a key (`sk_…`, `rk_…`) cut short.
fn without_key(message: &str) -> String {
    message
        .split(' ')
        .map(|word| {
            let key_like = ["sk_", "rk_"].iter().any(|p| word.starts_with(p));
            if key_like && word.chars().count() > 8 {
                format!("{}…", word.chars().take(8).collect::<String>())
            } else {
                word.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
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
            without_key("Invalid API Key provided: sk_test_abcdefghijklmnop"),
            "Invalid API Key provided: sk_test_…"
        );
        assert_eq!(
            without_key("Expired key rk_live_1234567890"),
            "Expired key rk_live_…"
        );
        assert_eq!(without_key("no key here"), "no key here");
    }
}

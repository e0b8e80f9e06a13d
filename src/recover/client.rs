//! The HTTP client of a provider's API, shared by the recoveries that list what a provider
//! kept (GitHub's deliveries, Paddle's events): the token as a bearer, a `User-Agent`, the
//! provider's own headers; a read (`GET`) that failed for the provider's side (5xx, a lost
//! connection) retried after [`BACKOFF`]'s pauses, a `POST` (a redelivery: it may have been
//! done) never; a rate limit (429, or 403 with `x-ratelimit-remaining: 0` or a `retry-after`,
//! as GitHub answers one) waited out when short ([`MAX_WAIT`]), at most [`MAX_RATE_WAITS`]
//! times a call; any other answer that is not 2xx returned at once, for the provider's run to
//! say what it means. An answer over [`MAX_ANSWER`] fails the call. No message carries the
//! token: an answer that quotes it has it replaced.

use std::io::Read;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Secret;

use super::jwt::AppKey;

/// The pauses before each retry of a call that failed for the provider's side: about 30 s in
/// all.
const BACKOFF: [Duration; 5] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
];

/// The longest rate-limit wait a run sits out; past it the run stops and says until when.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Rate-limit waits one call sits out at most (a limit that keeps coming back stops the run).
const MAX_RATE_WAITS: usize = 10;

/// The largest answer read: a page of summaries is small, one GitHub delivery holds a payload
/// of up to 25 MiB.
const MAX_ANSWER: u64 = 32 << 20;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// An answer that retrying cannot change (a refused token, a 404): its status and the
    /// message of its body.
    Status { status: u16, message: String },
    /// Anything else (retries used up, a rate limit too long to wait, stopped): said whole.
    Failed(String),
}

impl CallError {
    /// The failure as a run says it: a 401 or 403 (left after the rate-limit checks) is a
    /// refused credential, a 404 is `not_found` where the run has a meaning for it, any other
    /// status or failure is said as it is.
    pub(crate) fn sorted<E: From<String>>(
        self,
        refused: impl FnOnce(u16, String) -> E,
        not_found: Option<E>,
    ) -> E {
        match (self, not_found) {
            (
                CallError::Status {
                    status: status @ (401 | 403),
                    message,
                },
                _,
            ) => refused(status, message),
            (CallError::Status { status: 404, .. }, Some(e)) => e,
            (CallError::Status { status, message }, _) => {
                format!("HTTP {status}: {message}").into()
            }
            (CallError::Failed(why), _) => why.into(),
        }
    }
}

/// A call's failure: waited out (a short rate limit, without using up a retry), retried
/// (the provider's side), or not.
enum Retry {
    RateLimited(Duration, String),
    Again(String),
    No(CallError),
}

/// What a call is authorized with.
pub(crate) enum Auth {
    /// A token or key, as the bearer.
    Token(Secret),
    /// A GitHub App's JWT, made anew for each call.
    App(Arc<AppKey>),
}

impl Auth {
    fn bearer(&self) -> String {
        match self {
            Auth::Token(token) => token.expose().to_string(),
            Auth::App(key) => key.jwt(crate::time::unix_now()),
        }
    }
}

/// A client of one provider's API at `base`.
pub(crate) struct Api {
    agent: ureq::Agent,
    /// The provider's name, for messages ("GitHub").
    provider: &'static str,
    base: String,
    auth: Auth,
    /// Sent with every call besides the token and the `User-Agent`.
    headers: &'static [(&'static str, &'static str)],
    backoff: Vec<Duration>,
    cancel: Option<Arc<AtomicBool>>,
}

impl Api {
    pub(crate) fn new(
        provider: &'static str,
        base: &str,
        auth: Auth,
        headers: &'static [(&'static str, &'static str)],
    ) -> Api {
        Api {
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(10))
                .timeout(Duration::from_secs(30))
                .build(),
            provider,
            base: base.trim_end_matches('/').to_string(),
            auth,
            headers,
            backoff: BACKOFF.to_vec(),
            cancel: None,
        }
    }

    /// The same client, whose pauses end (and calls fail) once `cancel` is set.
    pub(crate) fn cancelled_by(mut self, cancel: Arc<AtomicBool>) -> Api {
        self.cancel = Some(cancel);
        self
    }

    /// `method path` (the path with its query): the answer's body and its `Link` header;
    /// retried as the module doc says.
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
    ) -> Result<(Vec<u8>, Option<String>), CallError> {
        let url = format!("{}{path}", self.base);
        let mut pauses = self.backoff.iter();
        let mut rate_waits = 0;
        loop {
            let (pause, why) = match self.call_once(method, &url) {
                Ok(answer) => return Ok(answer),
                Err(Retry::No(e)) => return Err(e),
                Err(Retry::RateLimited(_, why)) if rate_waits >= MAX_RATE_WAITS => {
                    return Err(CallError::Failed(format!(
                        "{method} {path}: {why} {MAX_RATE_WAITS} times in a row; the next run \
                         goes on"
                    )))
                }
                Err(Retry::RateLimited(wait, why)) => {
                    rate_waits += 1;
                    (wait, why)
                }
                // A redelivery asked for again could be made twice.
                Err(Retry::Again(why)) if method != "GET" => {
                    return Err(CallError::Failed(format!(
                        "{method} {path}: {why}; not retried (it may have been done)"
                    )))
                }
                Err(Retry::Again(why)) => match pauses.next() {
                    Some(pause) => (*pause, why),
                    None => {
                        return Err(CallError::Failed(format!(
                            "{method} {path}: {why}; gave up after {} retries",
                            self.backoff.len()
                        )))
                    }
                },
            };
            log::warn!(
                "{} API: {method} {path}: {why}; retrying in {pause:?}",
                self.provider
            );
            if !super::pause(pause, self.cancel.as_deref()) {
                return Err(CallError::Failed("stopped".into()));
            }
        }
    }

    fn call_once(&self, method: &str, url: &str) -> Result<(Vec<u8>, Option<String>), Retry> {
        let bearer = self.auth.bearer();
        let mut request = self
            .agent
            .request(method, url)
            .set("Authorization", &format!("Bearer {bearer}"))
            .set(
                "User-Agent",
                concat!("hookledger/", env!("CARGO_PKG_VERSION")),
            );
        for (name, value) in self.headers {
            request = request.set(name, value);
        }
        let read = |response: ureq::Response| {
            let link = response.header("link").map(str::to_string);
            let mut body = Vec::new();
            response
                .into_reader()
                .take(MAX_ANSWER + 1)
                .read_to_end(&mut body)
                .map_err(|e| Retry::Again(format!("reading the answer: {e}")))?;
            if body.len() as u64 > MAX_ANSWER {
                return Err(Retry::No(CallError::Failed(format!(
                    "the answer is over {} MiB",
                    MAX_ANSWER >> 20
                ))));
            }
            Ok((body, link))
        };
        match request.call() {
            Ok(response) => read(response),
            Err(ureq::Error::Status(status, response)) => {
                Err(self.refusal(status, response, &bearer))
            }
            Err(e) => Err(Retry::Again(e.to_string())),
        }
    }

    /// What an error answer means: a rate limit (waited out if short), the provider's side
    /// (retried), or an answer that retrying cannot change.
    fn refusal(&self, status: u16, response: ureq::Response, bearer: &str) -> Retry {
        let header = |name: &str| response.header(name).map(str::to_string);
        let retry_after = header("retry-after").and_then(|v| v.trim().parse::<u64>().ok());
        let spent = header("x-ratelimit-remaining").as_deref() == Some("0");
        let reset = header("x-ratelimit-reset").and_then(|v| v.trim().parse::<i64>().ok());
        let mut text = String::new();
        let _ = response
            .into_reader()
            .take(64 * 1024)
            .read_to_string(&mut text);
        // An answer that quotes the token does not carry it into a log line: replaced before
        // the text is cut, so no part of it is left either.
        let text = text.replace(bearer, "…");
        let message = message_of(&text).unwrap_or_else(|| text.chars().take(200).collect());
        if status == 429 || (status == 403 && (spent || retry_after.is_some())) {
            let wait = match (retry_after, reset) {
                (Some(s), _) => Duration::from_secs(s),
                (None, Some(at)) => {
                    Duration::from_secs((at - crate::time::unix_now()).max(1) as u64)
                }
                (None, None) => Duration::from_secs(60),
            };
            if wait > MAX_WAIT {
                return Retry::No(CallError::Failed(format!(
                    "{}'s rate limit is spent for {}s more (HTTP {status}: {message}); the \
                     next run goes on",
                    self.provider,
                    wait.as_secs()
                )));
            }
            return Retry::RateLimited(wait, format!("rate limit (HTTP {status})"));
        }
        match status {
            500.. => Retry::Again(format!("HTTP {status}: {message}")),
            _ => Retry::No(CallError::Status { status, message }),
        }
    }
}

/// Parameter `param` of the `rel="next"` link of a `Link` header (GitHub's `cursor`, GitLab's
/// `page`).
pub(crate) fn next_link_param(link: &str, param: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        if !params.split(';').any(|p| p.trim() == "rel=\"next\"") {
            return None;
        }
        let url =
            url::Url::parse(target.trim().trim_start_matches('<').trim_end_matches('>')).ok()?;
        url.query_pairs()
            .find(|(k, _)| k == param)
            .map(|(_, v)| v.into_owned())
    })
}

/// The message of an API's error answer: GitHub's `{"message": …}`, or Paddle's
/// `{"error": {"code": …, "detail": …}}` as `code: detail`.
fn message_of(text: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    if let Some(message) = value.get("message").and_then(|m| m.as_str()) {
        return Some(message.to_string());
    }
    let error = value.get("error")?;
    let code = error.get("code").and_then(|c| c.as_str());
    let detail = error.get("detail").and_then(|d| d.as_str());
    match (code, detail) {
        (Some(code), Some(detail)) => Some(format!("{code}: {detail}")),
        (Some(one), None) | (None, Some(one)) => Some(one.to_string()),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_is_read_from_the_next_link_only() {
        let link = "<https://api.github.com/repos/o/r/hooks/1/deliveries?per_page=100&cursor=v1_42>; rel=\"next\", \
                    <https://api.github.com/repos/o/r/hooks/1/deliveries?per_page=100>; rel=\"first\"";
        assert_eq!(next_link_param(link, "cursor").as_deref(), Some("v1_42"));
        assert_eq!(
            next_link_param("<https://x/deliveries?cursor=v1_1>; rel=\"prev\"", "cursor"),
            None
        );
        let gitlab = "<https://gitlab.example.com/api/v4/projects/7/hooks/1/events?page=3&per_page=100>; rel=\"next\", \
                      <https://gitlab.example.com/api/v4/projects/7/hooks/1/events?page=1&per_page=100>; rel=\"first\"";
        assert_eq!(next_link_param(gitlab, "page").as_deref(), Some("3"));
    }

    #[test]
    fn the_message_is_github_s_or_paddle_s_shape() {
        assert_eq!(
            message_of(r#"{"message":"Bad credentials","documentation_url":"x"}"#).as_deref(),
            Some("Bad credentials")
        );
        assert_eq!(
            message_of(
                r#"{"error":{"type":"request_error","code":"invalid_token","detail":"Authentication token passed is invalid."},"meta":{"request_id":"r"}}"#
            )
            .as_deref(),
            Some("invalid_token: Authentication token passed is invalid.")
        );
        assert_eq!(message_of("<html>bad gateway</html>"), None);
        assert_eq!(message_of(r#"{"other":1}"#), None);
    }
}

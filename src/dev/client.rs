//! Sending signed events to a hookledger, as Stripe does: used by `hookledger send`, the demo,
//! the load generator and the tests.

use std::time::Duration;

use crate::config::Secret;
use crate::source::stripe;

/// The request did not get an HTTP answer (refused, timed out, reset).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TransportError(pub String);

/// What came back.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub retry_after: Option<String>,
    pub body: String,
}

/// A small blocking HTTP client with keep-alive.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
}

impl Default for Client {
    fn default() -> Self {
        Client::new(Duration::from_secs(30))
    }
}

impl Client {
    pub fn new(timeout: Duration) -> Self {
        Client {
            agent: ureq::AgentBuilder::new().timeout(timeout).build(),
        }
    }

    /// Signs `body` (the exact bytes) with `secret` at `timestamp` and POSTs it to `url`.
    pub fn send(
        &self,
        url: &str,
        body: &[u8],
        secret: &Secret,
        timestamp: i64,
    ) -> Result<Reply, TransportError> {
        let header = stripe::sign(secret, timestamp, body);
        self.post(url, body, &[(stripe::HEADER, &header)])
    }

    /// POSTs `body` with `headers`; any HTTP status is a `Reply`, only transport failures are
    /// errors.
    pub fn post(
        &self,
        url: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> Result<Reply, TransportError> {
        let mut request = self
            .agent
            .post(url)
            .set("Content-Type", "application/json; charset=utf-8");
        for (name, value) in headers {
            request = request.set(name, value);
        }
        let response = match request.send_bytes(body) {
            Ok(response) => response,
            Err(ureq::Error::Status(_, response)) => response,
            Err(e) => return Err(TransportError(e.to_string())),
        };
        let status = response.status();
        let retry_after = response.header("Retry-After").map(str::to_string);
        let body = response.into_string().unwrap_or_default();
        Ok(Reply {
            status,
            retry_after,
            body,
        })
    }
}

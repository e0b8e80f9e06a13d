//! The signed POST: `forward` and each `[[delivery]]` with a `url`, and how an HTTP answer
//! (or the lack of one) is told to the operator.

use std::sync::Arc;
use std::time::Duration;

use crate::config::PostTarget;
use crate::outbox::{Failure, FollowUp, PendingRow, Target};
use crate::source::standard::{self, SigningKey};
use crate::time::unix_now;
use crate::trace::{self, Tracer};

/// POSTs each row to a URL, signed with the Standard Webhooks headers: `forward` and each
/// `[[delivery]]`.
pub(crate) struct Post {
    url: String,
    key: SigningKey,
    agent: ureq::Agent,
    /// The agent's, named in a timeout's cause.
    timeout: Duration,
    /// When traces are on: a span per attempt, its context in the `traceparent` header.
    tracer: Option<Arc<Tracer>>,
}

impl Post {
    /// Decodes the signing secret; a bad one is refused here, at start-up.
    pub(crate) fn new(config: &PostTarget, tracer: Option<Arc<Tracer>>) -> anyhow::Result<Post> {
        let key = SigningKey::from_secret(config.secret.expose()).map_err(anyhow::Error::msg)?;
        Ok(Post {
            url: config.url.clone(),
            key,
            timeout: config.timeout,
            agent: ureq::AgentBuilder::new()
                .timeout(config.timeout)
                .redirects(0)
                .user_agent(concat!("hookledger/", env!("CARGO_PKG_VERSION")))
                .build(),
            tracer,
        })
    }
}

impl Target for Post {
    fn attempt(
        &self,
        row: &PendingRow,
        payload: &[u8],
    ) -> Result<Option<Arc<dyn FollowUp>>, Failure> {
        // When traces are on, a child of the span of the request that committed the event
        // (when remembered), its context sent along.
        let traced = self.tracer.as_ref().map(|tracer| {
            let parent = tracer.recall(&row.source, &row.key);
            (tracer, tracer.begin("delivery", trace::CLIENT, parent))
        });
        let traceparent = traced.as_ref().map(|(_, span)| span.context.traceparent());
        let result = post(
            &self.agent,
            self.timeout,
            &self.url,
            &self.key,
            row,
            payload,
            traceparent.as_deref(),
        );
        let Some((tracer, span)) = traced else {
            return result.map(|()| None);
        };
        let mut attributes: Vec<(&'static str, trace::Value)> = vec![
            ("hookledger.outbox.kind", row.kind.as_str().into()),
            ("hookledger.outbox.row_id", row.id.into()),
            ("hookledger.source", row.source.as_str().into()),
            ("hookledger.event_id", row.key.as_str().into()),
            ("hookledger.outbox.attempt", (row.attempts + 1).into()),
        ];
        let (result_label, status) = match &result {
            Ok(()) => ("delivered", None),
            Err(Failure::Gone(_)) => ("gone", Some(410)),
            Err(Failure::Status(status, _, _)) => ("failed", Some(*status)),
            Err(Failure::Refused(_) | Failure::Transport(_) | Failure::Ran { .. }) => {
                ("failed", None)
            }
        };
        attributes.push(("hookledger.outbox.result", result_label.into()));
        if let Some(status) = status {
            attributes.push(("http.response.status_code", i64::from(status).into()));
        }
        tracer.end(span, attributes, result.is_err());
        result.map(|()| None)
    }
}

/// `Retry-After` as delay-seconds or as an HTTP date (a date in the past means now).
fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The header that names the source of a delivered event.
pub(crate) const SOURCE_HEADER: &str = "webhook-source";

/// The header with the delivered event's type (GitHub's and Shopify's are not in the body).
pub(crate) const TYPE_HEADER: &str = "webhook-type";

/// POSTs the verified event body (`payload`) with the Standard Webhooks headers and the
/// source's name.
fn post(
    agent: &ureq::Agent,
    timeout: Duration,
    url: &str,
    key: &SigningKey,
    row: &PendingRow,
    payload: &[u8],
    traceparent: Option<&str>,
) -> Result<(), Failure> {
    let timestamp = unix_now();
    let signature = key.sign(&row.key, timestamp, payload);
    let mut request = agent.post(url);
    if let Some(kind) = &row.event_type {
        request = request.set(TYPE_HEADER, kind);
    }
    if let Some(traceparent) = traceparent {
        request = request.set("traceparent", traceparent);
    }
    let result = request
        .set("Content-Type", "application/json")
        .set("Idempotency-Key", &row.key)
        .set(standard::ID_HEADER, &row.key)
        .set(standard::TIMESTAMP_HEADER, &timestamp.to_string())
        .set(standard::SIGNATURE_HEADER, &signature)
        // Event ids are unique per source; an app fed by several sources dedupes on both.
        .set(SOURCE_HEADER, &row.source)
        .send_bytes(payload);
    answer(result, url, Some(timeout))
}

/// A POST's result as a [`Failure`] that names the cause (refused, timeout, DNS, TLS, or the
/// HTTP status with the start of the body) and the target.
pub(crate) fn answer(
    result: Result<ureq::Response, ureq::Error>,
    url: &str,
    timeout: Option<Duration>,
) -> Result<(), Failure> {
    let target = shown_url(url);
    match result {
        Ok(response) if (200..300).contains(&response.status()) => Ok(()),
        Ok(response) => Err(Failure::Status(
            response.status(),
            None,
            from(&target, response),
        )),
        Err(ureq::Error::Status(410, response)) => Err(Failure::Gone(from(&target, response))),
        Err(ureq::Error::Status(status, response)) => {
            let retry_after = response
                .header("Retry-After")
                .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()));
            Err(Failure::Status(
                status,
                retry_after,
                from(&target, response),
            ))
        }
        Err(ureq::Error::Transport(t)) => Err(Failure::Transport(format!(
            "{} ({target})",
            cause(&t, timeout)
        ))),
    }
}

/// Bytes of an error answer's body kept on the row: enough for a framework's error line.
pub(crate) const BODY_EXCERPT: usize = 200;

/// `from URL: excerpt` of an error answer (the excerpt one line, control characters dropped).
fn from(target: &str, response: ureq::Response) -> String {
    use std::io::Read;
    let mut body = Vec::with_capacity(BODY_EXCERPT);
    // At most a little past the excerpt; a body that does not arrive in time is left.
    let _ = response
        .into_reader()
        .take(BODY_EXCERPT as u64 + 4)
        .read_to_end(&mut body);
    let text = String::from_utf8_lossy(&body);
    let mut excerpt: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if excerpt.len() > BODY_EXCERPT {
        let mut end = BODY_EXCERPT;
        while !excerpt.is_char_boundary(end) {
            end -= 1;
        }
        excerpt.truncate(end);
        excerpt.push('…');
    }
    match excerpt.is_empty() {
        true => format!("from {target}"),
        false => format!("from {target}: {excerpt}"),
    }
}

/// Why a request got no answer, in words an operator acts on: refused, timeout, DNS, TLS.
fn cause(t: &ureq::Transport, timeout: Option<Duration>) -> String {
    use std::io::ErrorKind as Io;
    let io = std::error::Error::source(t).and_then(|e| e.downcast_ref::<std::io::Error>());
    let within = timeout.map_or(String::new(), |t| format!(" within {t:.0?}"));
    let tls = t.message().is_some_and(|m| m.contains("tls"));
    match t.kind() {
        ureq::ErrorKind::Dns => match t.url().and_then(|u| u.host_str()) {
            Some(host) => format!("DNS: cannot resolve {host}"),
            None => "DNS: cannot resolve the host".into(),
        },
        _ if tls => match io {
            Some(e) => format!(
                "TLS: {}",
                e.get_ref().map_or(e.to_string(), |r| r.to_string())
            ),
            None => "TLS: handshake failed".into(),
        },
        ureq::ErrorKind::ConnectionFailed => match io.map(|e| e.kind()) {
            Some(Io::ConnectionRefused) => "connection refused".into(),
            Some(Io::TimedOut | Io::WouldBlock) => format!("timeout: no connection{within}"),
            Some(_) => format!("cannot connect: {}", io.expect("some")),
            None => "cannot connect".into(),
        },
        ureq::ErrorKind::Io => match io.map(|e| e.kind()) {
            Some(Io::TimedOut | Io::WouldBlock) => format!("timeout: no answer{within}"),
            Some(Io::ConnectionReset | Io::ConnectionAborted | Io::BrokenPipe) => {
                "connection reset before an answer".into()
            }
            Some(Io::UnexpectedEof) => "connection closed before an answer".into(),
            Some(_) => format!("network error: {}", io.expect("some")),
            None => "network error".into(),
        },
        ureq::ErrorKind::BadStatus | ureq::ErrorKind::BadHeader => {
            "not an HTTP answer (bad status line or header)".into()
        }
        other => other.to_string(),
    }
}

/// `url` as errors, logs, alerts and the console show it: `scheme://host[:port]`, with its
/// path and query as `/…` and `?…` (credentials, a Slack or Discord webhook's path and a query
/// can each hold a secret).
pub(crate) fn shown_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => {
            let host = u.host_str().unwrap_or_default();
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            let path = if matches!(u.path(), "" | "/") {
                ""
            } else {
                "/…"
            };
            let query = if u.query().is_some() { "?…" } else { "" };
            format!("{}://{host}{port}{path}{query}", u.scheme())
        }
        Err(_) => "(not a URL)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_as_seconds_or_http_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(
            parse_retry_after(&later, now),
            Some(Duration::from_secs(90))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }
}

//! A `[[delivery]]` into a message broker: `nats = { url, subject, stream }` (a JetStream
//! stream), `amqp = { url, exchange, routing_key }` (RabbitMQ) or `redis = { url, stream }` (a
//! Redis stream). What is checked here needs no connection; what needs one (the stream exists,
//! the subject is the stream's) is checked by the target when it opens, at start-up.

use serde::Deserialize;

use super::{refuse, ConfigError, Secret};

/// `nats = { url, subject, stream }`: each row published to `subject` with `Nats-Msg-Id`, done
/// when `stream` acknowledges it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NatsConfig {
    /// `nats://[user:password@]host:port` (`tls://` for TLS); it may hold credentials, so it
    /// is a secret (`env:`, `file:` and `credential:` work) and is never shown whole.
    pub url: Secret,
    pub subject: String,
    /// The JetStream stream that must hold `subject`.
    pub stream: String,
    /// Create `stream` (file storage, its subject, a 2-hour duplicate window) when it does not
    /// exist; without it a missing stream stops start-up.
    #[serde(default)]
    pub create: bool,
}

/// `amqp = { url, exchange, routing_key }`: each row published persistent, mandatory, with
/// `message_id`, done on the broker's confirm.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AmqpConfig {
    /// `amqp://user:password@host:port/vhost` (`amqps://` for TLS), a secret as `nats.url`.
    pub url: Secret,
    /// The exchange, which must exist (hookledger declares nothing); empty: the default
    /// exchange, where `routing_key` is the queue's name.
    #[serde(default)]
    pub exchange: String,
    pub routing_key: String,
}

/// `redis = { url, stream }`: each row added to `stream` at most once (a guard key per row,
/// set in the same script as the entry).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]`, a secret as `nats.url`.
    pub url: Secret,
    pub stream: String,
    /// Let the first entry create `stream`; without it the stream must exist (start-up checks
    /// it, and an entry is never added to a stream that was deleted since).
    #[serde(default)]
    pub create: bool,
}

impl NatsConfig {
    /// Publishing to `subject`, which the existing JetStream `stream` takes.
    pub fn new(url: Secret, subject: impl Into<String>, stream: impl Into<String>) -> Self {
        NatsConfig {
            url,
            subject: subject.into(),
            stream: stream.into(),
            create: false,
        }
    }

    /// Creating the stream when it does not exist.
    pub fn creating(mut self) -> Self {
        self.create = true;
        self
    }
}

impl AmqpConfig {
    /// Publishing to the existing `exchange` (empty: the default one) with `routing_key`.
    pub fn new(url: Secret, exchange: impl Into<String>, routing_key: impl Into<String>) -> Self {
        AmqpConfig {
            url,
            exchange: exchange.into(),
            routing_key: routing_key.into(),
        }
    }
}

impl RedisConfig {
    /// Adding to the existing `stream`.
    pub fn new(url: Secret, stream: impl Into<String>) -> Self {
        RedisConfig {
            url,
            stream: stream.into(),
            create: false,
        }
    }

    /// Letting the first entry create the stream.
    pub fn creating(mut self) -> Self {
        self.create = true;
        self
    }
}

/// The broker a delivery publishes to, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Broker {
    Nats(NatsConfig),
    Amqp(AmqpConfig),
    Redis(RedisConfig),
}

impl Broker {
    /// The key of the broker's table (`nats`, `amqp`, `redis`).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Broker::Nats(_) => "nats",
            Broker::Amqp(_) => "amqp",
            Broker::Redis(_) => "redis",
        }
    }

    /// Its URL.
    pub(crate) fn url(&self) -> &Secret {
        match self {
            Broker::Nats(c) => &c.url,
            Broker::Amqp(c) => &c.url,
            Broker::Redis(c) => &c.url,
        }
    }

    /// Refuses what no broker would take, naming the key under `at` (``delivery `kind`.nats``).
    pub(crate) fn check(&self, at: &str) -> Result<(), ConfigError> {
        let key = |field: &str| format!("{at}.{field}");
        let built_in = match self {
            Broker::Nats(_) => cfg!(feature = "nats"),
            Broker::Amqp(_) => cfg!(feature = "amqp"),
            Broker::Redis(_) => cfg!(feature = "redis"),
        };
        if !built_in {
            refuse!(
                at,
                "this build of hookledger cannot publish to it: it was built without the cargo \
                 feature `{}`",
                self.name()
            );
        }
        let schemes: &[&str] = match self {
            Broker::Nats(_) => &["nats", "tls"],
            Broker::Amqp(_) => &["amqp", "amqps"],
            Broker::Redis(_) => &["redis"],
        };
        // The URL itself is not repeated: it may hold credentials.
        let url = url::Url::parse(self.url().expose())
            .map_err(|e| ConfigError::new(key("url"), format!("not a URL ({e})")))?;
        if !schemes.contains(&url.scheme()) || !url.has_host() {
            refuse!(
                key("url"),
                "must be a {} URL with a host",
                schemes
                    .iter()
                    .map(|s| format!("{s}://"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            );
        }
        match self {
            Broker::Nats(c) => {
                if c.subject.is_empty()
                    || c.subject
                        .split('.')
                        .any(|t| t.is_empty() || t == "*" || t == ">")
                    || c.subject.contains(char::is_whitespace)
                {
                    refuse!(
                        key("subject"),
                        "must be a subject to publish to: dot-separated tokens, none empty, no \
                         wildcard (`*`, `>`) and no space"
                    );
                }
                if c.stream.is_empty()
                    || c.stream
                        .contains(|ch: char| ch.is_whitespace() || ".*>/\\".contains(ch))
                {
                    refuse!(
                        key("stream"),
                        "must be a JetStream stream's name: no space, `.`, `*`, `>`, `/` or `\\`"
                    );
                }
            }
            Broker::Amqp(c) => {
                if c.exchange.len() > 255
                    || !c
                        .exchange
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || "-_.:".contains(ch))
                {
                    refuse!(
                        key("exchange"),
                        "must be an exchange's name: at most 255 of letters, digits, `-`, `_`, \
                         `.` and `:` (empty: the default exchange)"
                    );
                }
                if c.routing_key.len() > 255 || (c.exchange.is_empty() && c.routing_key.is_empty())
                {
                    refuse!(
                        key("routing_key"),
                        "must be at most 255 bytes, and on the default exchange (no `exchange`) \
                         the name of the queue"
                    );
                }
            }
            Broker::Redis(c) => {
                if c.stream.is_empty() {
                    refuse!(key("stream"), "must name the stream (a Redis key)");
                }
            }
        }
        Ok(())
    }
}

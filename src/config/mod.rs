//! One configuration: every setting of `serve`, its default (each with its reason,
//! `defaults.rs`) and its validation, whose errors name the config file's key
//! ([`ConfigError`]). It deserializes (serde) with every field optional, from a TOML file
//! (`file.rs`; [`Config::load`] reads it); the CLI's flags are an overlay on it
//! (`cli/serve.rs`), and the parts borrow their section of it. `[[source]]` entries are in
//! `source.rs`.
//!
//! A leaf of the crate: it imports nothing of it, and names no provider. The parts that
//! share a default import it from here; a built-in handler's settings are a
//! [`HandlerSettings`] the handler decodes; what a provider wing requires of the settings
//! (which schemes have an API, how far back it reaches) is checked by that wing at start-up.

mod alert;
mod broker;
mod database;
mod days;
mod defaults;
mod delivery;
mod effect;
mod error;
mod file;
pub(crate) use file::preset_source;
mod handler;
mod rate;
mod reload;
mod route;
mod secret;
mod source;

pub use alert::AlertConfig;
pub(crate) use broker::Broker;
pub use broker::{AmqpConfig, NatsConfig, RedisConfig};
pub(crate) use database::parse_postgres;
pub use database::Database;
#[cfg(feature = "postgres")]
pub(crate) use database::PgUrl;
#[cfg(not(feature = "postgres"))]
pub(crate) use database::WITHOUT_POSTGRES;
pub(crate) use days::{describe_days, parse_days, NEVER};
pub use defaults::DEFAULT_TOLERANCE_SECS;
pub(crate) use defaults::{
    default_schedule, DEFAULT_ADMIN_LISTEN, DEFAULT_BATCH_MAX, DEFAULT_BODY_BUDGET,
    DEFAULT_BREAKER_COOLDOWN, DEFAULT_BREAKER_FAILURES, DEFAULT_BUSY_TIMEOUT, DEFAULT_CLAIM_DAYS,
    DEFAULT_COMMAND_CONCURRENCY, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONCURRENCY, DEFAULT_DB,
    DEFAULT_EFFECT_TIMEOUT, DEFAULT_FORWARD_TIMEOUT, DEFAULT_LISTEN, DEFAULT_MAX_BODY,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_OUTBOX_LEASE, DEFAULT_PAYLOAD_DAYS, DEFAULT_QUEUE_DEPTH,
    DEFAULT_READ_TIMEOUT, DEFAULT_WAL_LIMIT_MB, MIN_RETENTION_DAYS,
};
pub(crate) use defaults::{BATCH_CHUNK, DEFAULT_MAX_EVENTS, DEFAULT_OUTBOX_PAYLOAD_BUDGET};
pub(crate) use delivery::{BrokerTarget, CommandTarget, DeliveryTarget, LaneSettings, PostTarget};
pub use delivery::{DeliveryConfig, ForwardConfig, LaneKeys};
pub(crate) use effect::{bind_parameters, split_statements, BoundStatement};
pub use effect::{EffectConfig, SchemaConfig};
pub use error::ConfigError;
pub(crate) use error::{refuse, source_key};
pub use handler::HandlerSettings;
pub(crate) use rate::Rate;
pub(crate) use reload::{change, Change};
pub(crate) use route::type_matches as route_type_matches;
pub use route::{RouteConfig, RouteValues};
pub use secret::Secret;
pub(crate) use secret::{decode_standard_key, decode_standard_secret, StandardKey};
pub use source::Handshake;
pub(crate) use source::{is_valid_name as is_valid_source_name, one_secret, Signed};
pub use source::{
    HmacAlgorithm, HmacConfig, HmacEncoding, Locator, ReconcileConfig, RecoverMode, Refresh,
    SchemeName, SourceConfig, TimestampConfig, TokenConfig,
};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The outbox kind of `[forward]`'s rows ("POST this event to the app"); a `[[delivery]]`
/// cannot take it.
pub(crate) const FORWARD: &str = "forward";

/// The fewest characters of an admin token.
const MIN_ADMIN_TOKEN: usize = 16;

impl Config {
    /// The admin listener shows event ids and errors: on an address other than loopback it
    /// needs a token, and a token must not be guessable.
    fn validate_admin(&self) -> Result<(), ConfigError> {
        if let Some(token) = &self.admin_token {
            if token.expose().chars().count() < MIN_ADMIN_TOKEN {
                refuse!(
                    "admin_token",
                    "the token is shorter than {MIN_ADMIN_TOKEN} characters; make a random one, \
                     e.g. `openssl rand -hex 32`"
                );
            }
        }
        match self.admin_listen {
            Some(at) if !at.ip().is_loopback() && self.admin_token.is_none() => refuse!(
                "admin_listen",
                "is not a loopback address: set an admin_token too (env:NAME or file:PATH), \
                 since /metrics and /status show event ids and errors to whoever reaches them, \
                 or listen on 127.0.0.1"
            ),
            _ => Ok(()),
        }
    }
}

/// `admin_listen` (and the flag that sets it): an address, or `off`.
pub(crate) fn parse_admin_listen(value: &str) -> Result<Option<SocketAddr>, String> {
    if value.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    value
        .parse()
        .map(Some)
        .map_err(|_| format!("`{value}` is not an address (host:port) or `off`"))
}

fn admin_listen<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    let value = String::deserialize(d)?;
    // The file's value is not repeated (config errors quote none).
    parse_admin_listen(&value)
        .map_err(|_| serde::de::Error::custom("is not an address (host:port) or off"))
}

/// What a config file's duration that does not parse is told (its value is not repeated).
const NOT_A_DURATION: &str = "is not a duration (like 500ms, 5s, 2m, 1h, 3d)";

/// Everything `serve` needs. `Debug` shows no secret.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// Where `serve` listens (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Where `serve` answers `/healthz` and `/readyz` for operators (`None`: nowhere). Never
    /// the webhook port.
    #[serde(deserialize_with = "admin_listen")]
    pub admin_listen: Option<SocketAddr>,
    /// The bearer token of the admin routes that change data (and of all but health and
    /// readiness when `admin_listen` is not loopback). In a config file `env:NAME`,
    /// `file:PATH` or `credential:NAME`.
    pub admin_token: Option<Secret>,
    /// The SQLite database file, or a PostgreSQL URL.
    pub database: Database,
    pub http: HttpConfig,
    pub storage: StorageConfig,
    pub writer: WriterConfig,
    /// `[[source]]`: who sends webhooks, each at `POST /webhooks/{name}`.
    #[serde(rename = "source")]
    pub sources: Vec<SourceConfig>,
    /// `[stripe_billing]`: the settings of the built-in `stripe-billing` handler, which
    /// decodes them itself.
    pub stripe_billing: HandlerSettings,
    /// `[[effect]]`: the app's SQL, run for matching events inside the claim's transaction.
    #[serde(rename = "effect")]
    pub effects: Vec<EffectConfig>,
    /// The app's own migrations, applied at start-up.
    pub schema: SchemaConfig,
    /// Delivery of every processed event to the app; `None`: none.
    pub forward: Option<ForwardConfig>,
    /// `[[delivery]]`: where the outbox rows of each kind that effects queue are POSTed.
    #[serde(rename = "delivery")]
    pub deliveries: Vec<DeliveryConfig>,
    pub retention: RetentionConfig,
    /// `[[alert]]`: who is told when rows go dead, a source is refused too often or the
    /// backlog grows old, and when that is over.
    #[serde(rename = "alert")]
    pub alerts: Vec<AlertConfig>,
    /// Where OpenTelemetry traces go, over OTLP/HTTP (JSON): the collector's base URL
    /// (`http://127.0.0.1:4318`; `/v1/traces` is added) or its traces URL. `None`: no traces.
    pub otlp_endpoint: Option<String>,
}

/// The webhook listener and its limits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct HttpConfig {
    pub max_body: usize,
    /// Bytes of request bodies held in memory at once (at least `max_body`).
    pub body_budget: usize,
    #[serde(with = "duration")]
    pub read_timeout: Duration,
    pub max_connections: usize,
}

/// The database.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct StorageConfig {
    /// SQLite: how long to wait for another process's write lock. PostgreSQL: how long to wait
    /// for a row lock (`lock_timeout`) and for a connection. Then the answer is a 503.
    #[serde(with = "duration")]
    pub busy_timeout: Duration,
    /// PostgreSQL: how long an instance holds a due outbox row it took without renewing the
    /// lease (it renews the leases of its rows in flight every second); if it dies, another
    /// instance delivers the row once the lease lapses.
    #[serde(with = "duration")]
    pub outbox_lease: Duration,
    /// SQLite: the write-ahead log's bound in MiB. Past it a checkpoint that waits for the
    /// writer copies the log back into the database file and truncates it, so the log stays
    /// near this size under any load (a prune, a burst) and is empty after `serve` stops.
    pub wal_limit_mb: usize,
    /// The payload bytes the outbox worker holds at once across all kinds (each attempt holds
    /// its row's payload until it ends): attempts wait for room. One payload larger than this
    /// is attempted alone. Default: 64 MiB.
    pub outbox_payload_budget: usize,
}

/// The writer's batches and queue.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct WriterConfig {
    /// Most events per transaction (1 = one fsync per event).
    pub batch_max: usize,
    /// Events waiting for the writer beyond this get a 503.
    pub queue_depth: usize,
    /// How long one event's handlers and SQL effects may run; past it that event fails alone
    /// (500, its sender retries) and the rest of its batch commits.
    #[serde(with = "duration")]
    pub effect_timeout: Duration,
}

/// What the ledger remembers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RetentionConfig {
    /// Days the ledger remembers events: their claims, so a resend is still a duplicate (at
    /// least 3, the providers' retry window). `"never"` in a file (`u64::MAX`): kept for ever.
    #[serde(deserialize_with = "days::deserialize_days")]
    pub claim_days: u64,
    /// Days the ledger keeps events' payloads (at most `claim_days`); then the payload is
    /// cleared and the claim stays. `"never"` in a file (`u64::MAX`): kept for ever.
    #[serde(deserialize_with = "days::deserialize_days")]
    pub payload_days: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body: DEFAULT_MAX_BODY,
            body_budget: DEFAULT_BODY_BUDGET,
            read_timeout: DEFAULT_READ_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            outbox_lease: DEFAULT_OUTBOX_LEASE,
            wal_limit_mb: DEFAULT_WAL_LIMIT_MB,
            outbox_payload_budget: DEFAULT_OUTBOX_PAYLOAD_BUDGET,
        }
    }
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            batch_max: DEFAULT_BATCH_MAX,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            effect_timeout: DEFAULT_EFFECT_TIMEOUT,
        }
    }
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            claim_days: DEFAULT_CLAIM_DAYS,
            payload_days: DEFAULT_PAYLOAD_DAYS,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: DEFAULT_LISTEN.parse().expect("a valid address"),
            admin_listen: Some(DEFAULT_ADMIN_LISTEN.parse().expect("a valid address")),
            admin_token: None,
            database: Database::Sqlite(PathBuf::from(DEFAULT_DB)),
            http: HttpConfig::default(),
            storage: StorageConfig::default(),
            writer: WriterConfig::default(),
            sources: Vec::new(),
            stripe_billing: HandlerSettings::default(),
            effects: Vec::new(),
            schema: SchemaConfig::default(),
            forward: None,
            deliveries: Vec::new(),
            retention: RetentionConfig::default(),
            alerts: Vec::new(),
            otlp_endpoint: None,
        }
    }
}

impl Config {
    /// The quick start: every default, database `db`, and one source, `stripe`, with the
    /// `stripe-billing` handler and these secrets.
    pub fn new(db: impl Into<Database>, stripe_secrets: Vec<Secret>) -> Self {
        Config {
            database: db.into(),
            sources: vec![SourceConfig::stripe(stripe_secrets)],
            ..Config::default()
        }
    }

    /// With the source `source` after the others.
    pub fn with_source(mut self, source: SourceConfig) -> Self {
        self.sources.push(source);
        self
    }

    /// Forwarding every processed event as `forward` says.
    pub fn with_forward(mut self, forward: ForwardConfig) -> Self {
        self.forward = Some(forward);
        self
    }

    /// With the delivery `delivery` after the others.
    pub fn with_delivery(mut self, delivery: DeliveryConfig) -> Self {
        self.deliveries.push(delivery);
        self
    }

    /// With the effect `effect` after the others.
    pub fn with_effect(mut self, effect: EffectConfig) -> Self {
        self.effects.push(effect);
        self
    }

    /// The source named `name`, if any.
    pub fn source_mut(&mut self, name: &str) -> Option<&mut SourceConfig> {
        self.sources.iter_mut().find(|s| s.name == name)
    }

    /// Refuses settings that cannot work, naming the key, with a message that says what to
    /// change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(endpoint) = &self.otlp_endpoint {
            check_otlp_endpoint(endpoint).map_err(|m| ConfigError::new("otlp_endpoint", m))?;
        }
        if self.sources.is_empty() {
            refuse!(
                "source",
                "none to receive from: add a [[source]] with its name, scheme and secrets"
            );
        }
        // The listener's limits first: a source's default limit is the listener's.
        if self.http.max_body == 0 {
            refuse!("http.max_body", "must be at least 1 byte");
        }
        if self.http.body_budget < self.http.max_body {
            refuse!(
                "http.body_budget",
                "must be at least http.max_body, or no body of the largest size could ever be \
                 read"
            );
        }
        for (i, source) in self.sources.iter().enumerate() {
            source.validate()?;
            let max_body = source.max_body(self.http.max_body);
            if max_body == 0 || max_body > self.http.body_budget {
                refuse!(
                    source_key(&source.name, "max_body"),
                    "must be at least 1 and at most http.body_budget"
                );
            }
            if self.sources[..i].iter().any(|s| s.name == source.name) {
                refuse!(
                    source_key(&source.name, "name"),
                    "two sources have this name"
                );
            }
        }
        let names: Vec<&str> = self.sources.iter().map(|s| s.name.as_str()).collect();
        for (i, effect) in self.effects.iter().enumerate() {
            effect.validate(i + 1, &names)?;
        }
        if let Some(folder) = &self.schema.migrations {
            // Here, not when they are applied: by then the database would have been created.
            if let Err(e) = std::fs::read_dir(folder) {
                refuse!(
                    "schema.migrations",
                    "cannot read folder {}: {e}",
                    folder.display()
                );
            }
        }
        self.validate_admin()?;
        if let Database::Postgres(url) = &self.database {
            parse_postgres(url)?;
        }
        // Whole seconds, as the lease is stored; at most a day, so a dead instance's rows wait
        // no longer than that.
        let lease = self.storage.outbox_lease;
        if lease < Duration::from_secs(1) || lease > Duration::from_secs(86_400) {
            refuse!("storage.outbox_lease", "must be between 1 s and 1 day");
        }
        if self.storage.outbox_payload_budget == 0 {
            refuse!(
                "storage.outbox_payload_budget",
                "must be at least 1 (bytes)"
            );
        }
        for (key, value) in [
            ("writer.batch_max", self.writer.batch_max),
            ("writer.queue_depth", self.writer.queue_depth),
            ("http.max_connections", self.http.max_connections),
            ("storage.wal_limit_mb", self.storage.wal_limit_mb),
        ] {
            if value == 0 {
                refuse!(key, "must be at least 1");
            }
        }
        let effect_timeout = self.writer.effect_timeout;
        if effect_timeout < Duration::from_millis(1) || effect_timeout > MAX_EFFECT_TIMEOUT {
            refuse!(
                "writer.effect_timeout",
                "must be between 1ms and 1m: every other event waits for an effect that runs"
            );
        }
        check_retention(self.retention.claim_days)?;
        if self.retention.payload_days > self.retention.claim_days {
            refuse!(
                "retention.payload_days",
                "cannot be more than retention.claim_days: a payload is kept only with its claim"
            );
        }
        let claim_days = Duration::from_secs(self.retention.claim_days.saturating_mul(86_400));
        for source in &self.sources {
            if source.reconcile.is_some_and(|r| r.since > claim_days) {
                refuse!(
                    source_key(&source.name, "reconcile.since"),
                    "must be at most retention.claim_days ({} days): an event whose claim was \
                     pruned would be applied again",
                    self.retention.claim_days
                );
            }
        }
        if let Some(forward) = &self.forward {
            forward.target()?;
            if let Some(on) = &forward.on {
                route::validate("forward", on, &names)?;
            }
        }
        for (i, delivery) in self.deliveries.iter().enumerate() {
            if delivery.kind.trim().is_empty()
                || delivery.kind == FORWARD
                || delivery.kind.starts_with("alert:")
            {
                refuse!(
                    format!("delivery {}.kind", i + 1),
                    "must name the rows' kind; `{FORWARD}` is [forward]'s and `alert:…` the \
                     alerts'"
                );
            }
            if self.deliveries[..i].iter().any(|d| d.kind == delivery.kind) {
                refuse!(
                    format!("delivery `{}`.kind", delivery.kind),
                    "two deliveries have this kind"
                );
            }
            delivery.target(self.forward.as_ref())?;
            if let Some(on) = &delivery.on {
                route::validate(&format!("delivery `{}`", delivery.kind), on, &names)?;
            }
        }
        for (i, alert) in self.alerts.iter().enumerate() {
            alert.validate(i + 1)?;
            let name = alert.name_at(i + 1);
            if self.alerts[..i]
                .iter()
                .enumerate()
                .any(|(j, a)| a.name_at(j + 1) == name)
            {
                refuse!(alert.key(i + 1, "name"), "two alerts have this name");
            }
        }
        Ok(())
    }
}

/// Longest time limit of one event's effects: every other event waits for them.
pub(crate) const MAX_EFFECT_TIMEOUT: Duration = Duration::from_secs(60);

/// A retention shorter than the providers' retry window would let a retry apply twice.
/// An OTLP/HTTP endpoint: an `http` or `https` URL with a host.
pub(crate) fn check_otlp_endpoint(endpoint: &str) -> Result<(), String> {
    match url::Url::parse(endpoint) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => Ok(()),
        Ok(_) => Err(format!(
            "`{endpoint}` is not an http(s) URL of a collector (e.g. http://127.0.0.1:4318)"
        )),
        Err(e) => Err(format!("not a URL ({e}): e.g. http://127.0.0.1:4318")),
    }
}

pub(crate) fn check_retention(days: u64) -> Result<(), ConfigError> {
    if days < MIN_RETENTION_DAYS {
        refuse!(
            "retention.claim_days",
            "is shorter than the providers' retry window of {MIN_RETENTION_DAYS} \
             days: a retried event would be applied twice. Use at least {MIN_RETENTION_DAYS} \
             (default {DEFAULT_CLAIM_DAYS})."
        );
    }
    Ok(())
}

/// Fewest characters a signing secret may have after its `whsec_` prefix. Real ones have 32 or
/// more; fewer than 10 is a placeholder (`a`, `test`, `changeme`), and one captured request is enough
/// to guess it offline.
pub(crate) const MIN_SECRET_CHARS: usize = 10;

/// Refuses a secret that cannot be real: empty after its `whsec_` prefix (what `whsec_$VAR`
/// becomes when the variable is unset), or shorter than [`MIN_SECRET_CHARS`].
pub(crate) fn check_secret(secret: &str) -> Result<(), String> {
    let key = secret.strip_prefix("whsec_").unwrap_or(secret);
    if key.trim().is_empty() {
        return Err(format!(
            "`{}` holds nothing after the prefix (an unset variable in `whsec_$VAR`, or a stray \
             comma?)",
            &secret[..secret.len() - key.len()]
        ));
    }
    let chars = key.chars().count();
    if chars < MIN_SECRET_CHARS {
        // Only Stripe's secrets (`whsec_`) have a prefix to count after and a known length.
        let (after, real) = if key.len() < secret.len() {
            (" after `whsec_`", " a real one has 32 or more, and")
        } else {
            ("", "")
        };
        return Err(format!(
            "it has {chars} characters{after};{real} fewer than {MIN_SECRET_CHARS} is a \
             placeholder that one captured request is enough to guess (copy the whole secret \
             from the provider's dashboard)"
        ));
    }
    Ok(())
}

/// The secrets of a secret file: one per line, a UTF-8 byte order mark dropped, blank lines
/// and `#` comment lines ignored. A line is one secret, commas and all: only a list written in
/// the config or an environment variable is split at commas ([`parse_secret_list`]).
pub(crate) fn parse_secret_file(text: &str) -> Vec<Secret> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(Secret::new)
        .collect()
}

/// Splits a comma-separated secret list (as in `SECRET=whsec_a,whsec_b`).
pub(crate) fn parse_secret_list(list: &str) -> Vec<Secret> {
    let list = list.strip_prefix('\u{feff}').unwrap_or(list);
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(Secret::new)
        .collect()
}

/// Parses `250ms`, `5s`, `2m`, `1h`, `3d` (a bare number is seconds).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (like 500ms, 5s, 2m, 1h, 3d)"))?;
    let unit_secs = match unit {
        "ms" => return Ok(Duration::from_millis(n)),
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "`{text}`: unknown unit `{unit}` (use ms, s, m, h or d)"
            ))
        }
    };
    n.checked_mul(unit_secs)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("`{text}` is far too long"))
}

/// An optional tolerance in a config file: a duration (`"5m"`) or a number of seconds.
mod tolerance {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Seconds(u64),
        Text(String),
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        match Written::deserialize(d)? {
            Written::Seconds(n) => Ok(Some(Duration::from_secs(n))),
            Written::Text(text) => super::parse_duration(&text)
                .map(Some)
                .map_err(|_| serde::de::Error::custom(super::NOT_A_DURATION)),
        }
    }
}

/// An optional duration in a config file.
mod option_duration {
    use std::time::Duration;

    use serde::Deserializer;

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        super::duration::deserialize(d).map(Some)
    }
}

/// An optional list of durations in a config file.
mod option_durations {
    use std::time::Duration;

    use serde::Deserializer;

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<Duration>>, D::Error> {
        super::durations::deserialize(d).map(Some)
    }
}

/// A duration in a config file, written as [`parse_duration`] reads it (`"5s"`).
mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_duration(&text).map_err(|_| serde::de::Error::custom(super::NOT_A_DURATION))
    }
}

/// A list of durations in a config file (`["5s", "1m"]`).
mod durations {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|text| {
                super::parse_duration(text)
                    .map_err(|_| serde::de::Error::custom(super::NOT_A_DURATION))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3d"), Ok(Duration::from_secs(3 * 86_400)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("-5s").is_err());
    }

    #[test]
    fn the_effect_time_limit_is_a_writer_key_with_a_default_and_bounds() {
        let source = "[[source]]\nname = \"gh\"\nscheme = \"github\"\n\
                      secrets = [\"gh_literal_secret_123\"]\n";
        let config = Config::from_toml(source, Path::new(".")).unwrap();
        assert_eq!(config.writer.effect_timeout, DEFAULT_EFFECT_TIMEOUT);
        let with = |limit: &str| {
            Config::from_toml(
                &format!("[writer]\neffect_timeout = \"{limit}\"\n{source}"),
                Path::new("."),
            )
            .unwrap()
        };
        let config = with("250ms");
        assert_eq!(config.writer.effect_timeout, Duration::from_millis(250));
        config.validate().unwrap();
        for limit in ["0s", "2m"] {
            let err = with(limit).validate().unwrap_err();
            assert_eq!(err.key, "writer.effect_timeout", "{limit}: {err}");
        }
    }

    #[test]
    fn retention_below_three_days_is_refused() {
        assert!(check_retention(2).is_err());
        assert!(check_retention(3).is_ok());
    }

    #[test]
    fn secrets_empty_after_the_prefix_or_too_short_are_refused() {
        assert!(check_secret("whsec_")
            .unwrap_err()
            .contains("nothing after"));
        assert!(check_secret("whsec_   ").is_err());
        let short = check_secret("a").unwrap_err();
        assert!(
            short.starts_with("it has 1 characters; fewer than 10"),
            "{short}"
        );
        let short = check_secret("whsec_abc").unwrap_err();
        assert!(
            short.starts_with("it has 3 characters after `whsec_`;"),
            "{short}"
        );
        assert!(check_secret("whsec_012345678").is_err());
        assert!(check_secret("whsec_0123456789").is_ok());
        assert!(check_secret("0123456789").is_ok());
    }

    #[test]
    fn secret_files_skip_comments_blank_lines_and_a_bom() {
        let text = "\u{feff}whsec_first_secret_0123456789\r\n\n# rotated 2024\n  \n  # old one below\nwhsec_second_secret_012345678\nkey,with,commas_0123456789\n";
        let secrets: Vec<String> = parse_secret_file(text)
            .iter()
            .map(|s| s.expose().to_string())
            .collect();
        assert_eq!(
            secrets,
            [
                "whsec_first_secret_0123456789",
                "whsec_second_secret_012345678",
                "key,with,commas_0123456789"
            ]
        );
        assert_eq!(parse_secret_list("\u{feff}whsec_x")[0].expose(), "whsec_x");
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let config = Config::new(
            PathBuf::from("x.db"),
            parse_secret_list("whsec_abc, whsec_def"),
        );
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("whsec_abc") && !shown.contains("whsec_def"),
            "{shown}"
        );
        assert_eq!(config.sources[0].secrets.len(), 2);
    }

    /// The command `delivery` runs (it must be a command delivery), or why not.
    fn command_of(delivery: &DeliveryConfig) -> Result<CommandTarget, ConfigError> {
        match delivery.target(None)? {
            DeliveryTarget::Command(command) => Ok(command),
            other => panic!("not a command: {other:?}"),
        }
    }

    /// The POST `delivery` makes (it must be one), or why not.
    fn post_of(
        delivery: &DeliveryConfig,
        forward: Option<&ForwardConfig>,
    ) -> Result<PostTarget, ConfigError> {
        match delivery.target(forward)? {
            DeliveryTarget::Post(post) => Ok(post),
            other => panic!("not a POST: {other:?}"),
        }
    }

    #[test]
    fn a_command_delivery_is_checked_at_start_up_naming_the_key() {
        let sh = |argv: &[&str]| {
            DeliveryConfig::command("deploy", argv.iter().map(|a| a.to_string()).collect())
        };
        let ok = command_of(&sh(&["/bin/sh", "deploy.sh"])).unwrap();
        assert_eq!(ok.timeout, DEFAULT_COMMAND_TIMEOUT);
        assert_eq!(ok.args, ["deploy.sh"]);
        let err = |d: DeliveryConfig| d.target(None).unwrap_err().key;
        assert_eq!(err(sh(&[])), "delivery `deploy`.command");
        assert_eq!(err(sh(&[""])), "delivery `deploy`.command");
        // A program that is not there starts (its attempts fail, naming it).
        assert!(command_of(&sh(&["/no/such/deploy.sh"])).is_ok());
        let plain = std::env::temp_dir().join(format!("hookledger-plain-{}", std::process::id()));
        std::fs::write(&plain, "not a program").unwrap();
        let plain_argv = [plain.to_str().unwrap()];
        assert_eq!(err(sh(&plain_argv)), "delivery `deploy`.command");
        let _ = std::fs::remove_file(&plain);
        assert_eq!(err(sh(&["deploy.sh"])), "delivery `deploy`.command");
        let relative = command_of(&sh(&["sh"]).with_workdir("/bin")).unwrap();
        assert_eq!(relative.program, PathBuf::from("/bin/sh"));
        let both = DeliveryConfig {
            url: "http://127.0.0.1:1/x".into(),
            ..sh(&["/bin/sh"])
        };
        assert_eq!(err(both), "delivery `deploy`.command");
        assert_eq!(
            err(DeliveryConfig::new("x", "http://127.0.0.1:1/x").with_env(vec!["HOME".into()])),
            "delivery `x`.env"
        );
        let file = Config::from_toml(
            r#"
            [[delivery]]
            kind = "deploy"
            command = ["/bin/sh", "deploy.sh"]
            give_up_exit = 3
            timeout = "5m"
            "#,
            Path::new("/etc/hookledger"),
        )
        .unwrap();
        let target = command_of(&file.deliveries[0]).unwrap();
        assert_eq!(target.give_up_exit, [3]);
        assert_eq!(target.timeout, Duration::from_secs(300));
    }

    #[test]
    fn a_delivery_takes_what_it_does_not_set_from_forward() {
        let forward = ForwardConfig::new(
            "http://127.0.0.1:1/forward",
            Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        )
        .with_schedule(vec![Duration::from_secs(7)])
        .with_timeout(Duration::from_secs(3));
        let delivery = DeliveryConfig::new("send_receipt", "http://127.0.0.1:1/receipts");
        let target = post_of(&delivery, Some(&forward)).unwrap();
        assert_eq!(target.url, "http://127.0.0.1:1/receipts");
        assert_eq!(target.secret, forward.secret);
        assert_eq!(target.schedule, forward.schedule);
        assert_eq!(target.timeout, forward.timeout);
        let own = delivery.clone().with_timeout(Duration::from_secs(9));
        assert_eq!(
            post_of(&own, Some(&forward)).unwrap().timeout,
            Duration::from_secs(9)
        );
        let err = post_of(&delivery, None).unwrap_err();
        assert_eq!(err.key, "delivery `send_receipt`.secret");
        assert!(err.message.starts_with("missing"), "{err}");
        let ftp = DeliveryConfig {
            url: "ftp://127.0.0.1/receipts".into(),
            ..delivery.clone()
        };
        let err = post_of(&ftp, Some(&forward)).unwrap_err();
        assert_eq!(err.key, "delivery `send_receipt`.url", "{err}");
    }

    #[test]
    fn a_broker_delivery_is_checked_naming_the_key_and_takes_nothing_from_forward() {
        let file = |broker: &str| {
            Config::from_toml(
                &format!("[forward]\nurl = \"http://127.0.0.1:1/f\"\nsecret = \"whsec_b\"\ntimeout = \"3s\"\n\
                          [[delivery]]\nkind = \"events\"\n{broker}\n"),
                Path::new("/etc/hookledger"),
            )
            .unwrap()
        };
        let target = |broker: &str| {
            let config = file(broker);
            config.deliveries[0].target(config.forward.as_ref())
        };
        let nats = "nats = { url = \"nats://127.0.0.1:4222\", subject = \"hooks.gh\", stream = \"HOOKS\" }";
        match target(nats) {
            #[cfg(feature = "nats")]
            Ok(DeliveryTarget::Broker(broker)) => {
                assert_eq!(broker.timeout, DEFAULT_FORWARD_TIMEOUT, "not [forward]'s");
                assert_eq!(broker.schedule, default_schedule());
                assert_eq!(broker.broker.name(), "nats");
            }
            #[cfg(not(feature = "nats"))]
            Err(e) => {
                assert_eq!(e.key, "delivery `events`.nats", "{e}");
                assert!(e.message.contains("cargo feature `nats`"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        for (broker, key) in [
            ("nats = { url = \"redis://h\", subject = \"a\", stream = \"S\" }", "nats.url"),
            ("nats = { url = \"nats://h\", subject = \"a..b\", stream = \"S\" }", "nats.subject"),
            ("nats = { url = \"nats://h\", subject = \"a.>\", stream = \"S\" }", "nats.subject"),
            ("nats = { url = \"nats://h\", subject = \"a\", stream = \"S.1\" }", "nats.stream"),
            ("amqp = { url = \"amqp://h\", exchange = \"a b\", routing_key = \"k\" }", "amqp.exchange"),
            ("amqp = { url = \"amqp://h\", routing_key = \"\" }", "amqp.routing_key"),
            ("redis = { url = \"redis://h\", stream = \"\" }", "redis.stream"),
            ("redis = { url = \"not a url\", stream = \"s\" }", "redis.url"),
            ("redis = { url = \"redis://h\", stream = \"s\" }\nsecret = \"whsec_b\"", "secret"),
            ("redis = { url = \"redis://h\", stream = \"s\" }\nenv = [\"HOME\"]", "env"),
            ("redis = { url = \"redis://h\", stream = \"s\" }\nschedule = []", "schedule"),
            ("redis = { url = \"redis://h\", stream = \"s\" }\ntimeout = \"2h\"", "timeout"),
            ("redis = { url = \"redis://h\", stream = \"s\" }\nconcurrency = 0", "concurrency"),
            ("redis = { url = \"redis://h\", stream = \"s\" }\nnats = { url = \"nats://h\", subject = \"a\", stream = \"S\" }", "redis"),
        ] {
            let refused = target(broker).unwrap_err();
            // A build without the broker's feature refuses it first, naming the broker.
            let wanted = format!("delivery `events`.{key}");
            let named = format!("delivery `events`.{}", broker.split(' ').next().unwrap());
            assert!(
                refused.key == wanted || refused.key == named,
                "{broker}: {refused}"
            );
        }
    }

    #[test]
    fn deserializes_with_defaults_and_refuses_unknown_keys() {
        let config = Config::from_toml(
            r#"
            listen = "127.0.0.1:9000"
            database = "data/h.db"
            http = { read_timeout = "3s" }
            forward = { url = "http://127.0.0.1:3000/hooks", secret = "whsec_b" }
            [[source]]
            name = "stripe"
            scheme = "stripe"
            secrets = ["whsec_a_secret_of_some_length"]
            tolerance = "5m"
            handlers = ["stripe-billing"]
            "#,
            Path::new("/etc/hookledger"),
        )
        .unwrap();
        assert_eq!(config.listen.port(), 9000);
        assert_eq!(
            config.database,
            Path::new("/etc/hookledger/data/h.db").into()
        );
        assert_eq!(config.http.read_timeout, Duration::from_secs(3));
        assert_eq!(config.http.max_body, DEFAULT_MAX_BODY);
        assert_eq!(config.sources[0].tolerance, Some(Duration::from_secs(300)));
        assert_eq!(config.retention.claim_days, DEFAULT_CLAIM_DAYS);
        let forward = config.forward.unwrap();
        assert_eq!(forward.schedule, default_schedule());
        assert_eq!(forward.timeout, DEFAULT_FORWARD_TIMEOUT);
        let err = Config::from_toml("[http]\nport = 1\n", Path::new(".")).unwrap_err();
        assert!(
            err.to_string()
                .contains("unknown field `port`, expected one of `max_body`"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_lane_key_is_named_with_the_table_it_is_in() {
        // The lane keys are a flattened table (one declaration for [forward] and every
        // [[delivery]]), whose errors point at the table's header: the key is still named.
        let delivery = |lane: &str| {
            format!(
                "[[delivery]]\nkind = \"a\"\nurl = \"http://a/\"\n\n\
                 [[delivery]]\nkind = \"b\"\nurl = \"http://b/\"\n{lane}\n"
            )
        };
        let forward =
            "[forward]\nurl = \"http://a/\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n\
                       concurrency = \"x\"\n";
        let cases = [
            (forward.to_string(), "forward", "concurrency: invalid type"),
            (
                delivery("breaker_cooldown = \"soon\""),
                "delivery `b`",
                "breaker_cooldown is not a duration",
            ),
            (
                delivery("coalesce = 1"),
                "delivery `b`",
                "coalesce: invalid type",
            ),
            (delivery("rate = 20"), "delivery `b`", "rate: invalid type"),
            (
                delivery("breaker_failures = -1"),
                "delivery `b`",
                "breaker_failures: invalid value",
            ),
            (
                delivery("concurency = 3"),
                "delivery `b`",
                "unknown field `concurency`",
            ),
        ];
        for (text, key, message) in cases {
            let err = Config::from_toml(&text, Path::new("/")).unwrap_err();
            assert_eq!(err.key, key, "{text}");
            assert!(err.message.contains(message), "{text}: {err}");
        }
    }

    /// (`credential:` is in `file.rs`, the one test that sets `CREDENTIALS_DIRECTORY`.)
    #[test]
    fn a_delivery_secret_is_read_from_env_or_file_as_forward_s_is() {
        let dir = std::env::temp_dir().join(format!("hookledger-dsecret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        std::fs::write(dir.join("receipts.key"), format!("{key}\n")).unwrap();
        std::env::set_var("HOOKLEDGER_TEST_DELIVERY_SECRET", key);
        let delivery = |secret: &str| {
            format!(
                "[[delivery]]\nkind = \"receipts\"\nurl = \"http://127.0.0.1:1/r\"\n\
                 secret = \"{secret}\"\n"
            )
        };
        for written in ["file:receipts.key", "env:HOOKLEDGER_TEST_DELIVERY_SECRET"] {
            let config = Config::from_toml(&delivery(written), &dir).unwrap();
            assert_eq!(
                config.deliveries[0].secret.as_ref().unwrap().expose(),
                key,
                "{written}"
            );
        }
        let err =
            Config::from_toml(&delivery("env:HOOKLEDGER_TEST_UNSET_DELIVERY"), &dir).unwrap_err();
        assert_eq!(err.key, "delivery `receipts`.secret", "{err}");
        let err = Config::from_toml(&delivery("file:missing.key"), &dir).unwrap_err();
        assert_eq!(err.key, "delivery `receipts`.secret", "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

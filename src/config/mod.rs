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
mod database;
mod days;
mod defaults;
mod effect;
mod error;
mod file;
mod handler;
mod rate;
mod secret;
mod source;

pub use alert::AlertConfig;
pub(crate) use database::parse_postgres;
pub use database::Database;
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
pub(crate) use effect::{bind_parameters, split_statements, BoundStatement};
pub use effect::{EffectConfig, SchemaConfig};
pub use error::ConfigError;
pub(crate) use error::{refuse, source_key};
pub use handler::HandlerSettings;
pub(crate) use rate::Rate;
pub use secret::Secret;
pub(crate) use secret::{decode_standard_key, decode_standard_secret, StandardKey};
pub use source::Handshake;
pub(crate) use source::{is_valid_name as is_valid_source_name, one_secret, Signed};
pub use source::{
    HmacAlgorithm, HmacConfig, HmacEncoding, Locator, ReconcileConfig, Refresh, SchemeName,
    SourceConfig, TimestampConfig, TokenConfig,
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
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
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
}

/// The writer's batches and queue.
#[derive(Debug, Clone, Deserialize)]
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

/// Where and how to forward processed events to the app.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ForwardConfig {
    pub url: String,
    /// The Standard Webhooks signing secret (`whsec_<base64>`).
    pub secret: Secret,
    /// Delays between attempts; after the last one a row is dead.
    #[serde(default = "default_schedule", with = "durations")]
    pub schedule: Vec<Duration>,
    #[serde(default = "default_forward_timeout", with = "duration")]
    pub timeout: Duration,
    /// Attempts of this kind in flight at once (each row attempted by one).
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Consecutive failures (no answer, or an error status) that pause this kind.
    #[serde(default = "default_breaker_failures")]
    pub breaker_failures: u32,
    /// How long a paused kind waits before one probe attempt.
    #[serde(default = "default_breaker_cooldown", with = "duration")]
    pub breaker_cooldown: Duration,
    /// At most so many attempts of this kind: `"20/s"` or `"600/m"`; default: no limit.
    #[serde(default)]
    pub rate: Option<String>,
    /// A newer queued row of this kind (same source, same `coalesce_key`) supersedes the older
    /// queued ones not running: "deliver only the newest". Default: off.
    #[serde(default)]
    pub coalesce: bool,
}

/// Where outbox rows of one `kind`, queued by effects, are delivered: as `forward` rows are
/// (signed, retried, dead-lettered), to their own URL, or to a local `command` (argv, never a
/// shell) that reads the payload on stdin. A delivery has `url` or `command`, not both.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DeliveryConfig {
    pub kind: String,
    /// The app's endpoint; empty when the delivery runs a `command`.
    #[serde(default)]
    pub url: String,
    /// The program and its arguments, run without a shell: exit 0 is done, an exit in
    /// `give_up_exit` is dead at once, any other is retried on `schedule`.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// The command's working directory; a relative `command[0]` is resolved against it.
    #[serde(default)]
    pub workdir: Option<PathBuf>,
    /// Names of hookledger's environment variables passed to the command; it gets these, the
    /// `HOOKLEDGER_*` ones of the row, and nothing else (not even `PATH`, unless named).
    #[serde(default)]
    pub env: Vec<String>,
    /// Exit codes that mean "a retry would change nothing": the row is dead at once.
    #[serde(default, deserialize_with = "one_or_many")]
    pub give_up_exit: Vec<i32>,
    /// The Standard Webhooks signing secret; default: the `[forward]` secret.
    #[serde(default)]
    pub secret: Option<Secret>,
    #[serde(default, with = "option_durations")]
    pub schedule: Option<Vec<Duration>>,
    #[serde(default, with = "option_duration")]
    pub timeout: Option<Duration>,
    /// Attempts of this kind in flight at once; default: `[forward]`'s.
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// Default: `[forward]`'s.
    #[serde(default)]
    pub breaker_failures: Option<u32>,
    /// Default: `[forward]`'s.
    #[serde(default, with = "option_duration")]
    pub breaker_cooldown: Option<Duration>,
    /// Default: `[forward]`'s (a `command`'s: no limit).
    #[serde(default)]
    pub rate: Option<String>,
    /// Only the newest queued row of a source (and `coalesce_key`) is delivered; the older
    /// queued ones are kept as `superseded`. Default: `[forward]`'s (a `command`'s: off).
    #[serde(default)]
    pub coalesce: Option<bool>,
}

impl ForwardConfig {
    /// Forwarding to the app at `url`, signed with `secret` (`whsec_<base64>`), on the
    /// default schedule and timeout.
    pub fn new(url: impl Into<String>, secret: Secret) -> ForwardConfig {
        ForwardConfig {
            url: url.into(),
            secret,
            schedule: default_schedule(),
            timeout: DEFAULT_FORWARD_TIMEOUT,
            concurrency: DEFAULT_CONCURRENCY,
            breaker_failures: DEFAULT_BREAKER_FAILURES,
            breaker_cooldown: DEFAULT_BREAKER_COOLDOWN,
            rate: None,
            coalesce: false,
        }
    }

    /// With these delays between attempts; after the last one a row is dead.
    pub fn with_schedule(mut self, schedule: Vec<Duration>) -> Self {
        self.schedule = schedule;
        self
    }

    /// With this timeout of one delivery request.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// With this many attempts in flight at once.
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// At most `rate` attempts (`"20/s"`, `"600/m"`).
    pub fn with_rate(mut self, rate: impl Into<String>) -> Self {
        self.rate = Some(rate.into());
        self
    }

    /// Paused for `cooldown` after `failures` consecutive failures.
    pub fn with_breaker(mut self, failures: u32, cooldown: Duration) -> Self {
        self.breaker_failures = failures;
        self.breaker_cooldown = cooldown;
        self
    }
}

impl DeliveryConfig {
    /// Delivery of the outbox rows of `kind` to `url`; what is not set is `[forward]`'s.
    pub fn new(kind: impl Into<String>, url: impl Into<String>) -> DeliveryConfig {
        DeliveryConfig {
            kind: kind.into(),
            url: url.into(),
            command: None,
            workdir: None,
            env: Vec::new(),
            give_up_exit: Vec::new(),
            secret: None,
            schedule: None,
            timeout: None,
            concurrency: None,
            breaker_failures: None,
            breaker_cooldown: None,
            rate: None,
            coalesce: None,
        }
    }

    /// Signed with `secret` rather than the `[forward]` one.
    pub fn with_secret(mut self, secret: Secret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// With these delays between attempts rather than `[forward]`'s.
    pub fn with_schedule(mut self, schedule: Vec<Duration>) -> Self {
        self.schedule = Some(schedule);
        self
    }

    /// With this timeout of one request rather than `[forward]`'s.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Delivery of the outbox rows of `kind` by running `command` (argv: the program, then
    /// its arguments) with the payload on stdin.
    pub fn command(kind: impl Into<String>, command: Vec<String>) -> DeliveryConfig {
        DeliveryConfig {
            command: Some(command),
            ..DeliveryConfig::new(kind, "")
        }
    }

    /// Run in `workdir` (a relative command is resolved against it).
    pub fn with_workdir(mut self, workdir: impl Into<PathBuf>) -> Self {
        self.workdir = Some(workdir.into());
        self
    }

    /// Passing these variables of hookledger's environment to the command.
    pub fn with_env(mut self, names: Vec<String>) -> Self {
        self.env = names;
        self
    }

    /// These exit codes make the row dead at once.
    pub fn with_give_up_exit(mut self, codes: Vec<i32>) -> Self {
        self.give_up_exit = codes;
        self
    }

    /// The command to run, resolved and checked, when this delivery has a `command` (`None`:
    /// it POSTs to `url`); errors name the delivery's keys.
    pub(crate) fn command_target(&self) -> Result<Option<CommandTarget>, ConfigError> {
        let at = format!("delivery `{}`", self.kind);
        let key = |field: &str| format!("{at}.{field}");
        let Some(argv) = &self.command else {
            if self.url.is_empty() {
                refuse!(key("url"), "missing: a delivery needs `url` or `command`");
            }
            for (set, field) in [
                (self.workdir.is_some(), "workdir"),
                (!self.env.is_empty(), "env"),
                (!self.give_up_exit.is_empty(), "give_up_exit"),
            ] {
                if set {
                    refuse!(key(field), "is only for a delivery with a `command`");
                }
            }
            return Ok(None);
        };
        if !self.url.is_empty() {
            refuse!(
                key("command"),
                "a delivery has `url` or `command`, not both"
            );
        }
        if self.secret.is_some() {
            refuse!(key("secret"), "signs POSTs; a `command` delivery has none");
        }
        let Some(program) = argv.first().filter(|p| !p.trim().is_empty()) else {
            refuse!(key("command"), "is empty: it needs at least the program");
        };
        if let Some(dir) = &self.workdir {
            if !dir.is_absolute() || !dir.is_dir() {
                refuse!(key("workdir"), "must be an absolute path to a directory");
            }
        }
        let program = PathBuf::from(program);
        let program = if program.is_absolute() {
            program
        } else if program.components().count() > 1 || self.workdir.is_some() {
            match &self.workdir {
                Some(dir) => dir.join(program),
                None => refuse!(
                    key("command"),
                    "`{}` is a relative path: it needs `workdir` to be resolved against",
                    program.display()
                ),
            }
        } else {
            refuse!(
                key("command"),
                "`{}` is not an absolute path (no PATH lookup): give the full path, or set \
                 `workdir` and a path relative to it",
                program.display()
            );
        };
        if !is_executable(&program) {
            refuse!(
                key("command"),
                "`{}` does not exist or is not an executable file",
                program.display()
            );
        }
        for name in &self.env {
            if name.is_empty() || name.contains('=') || name.starts_with("HOOKLEDGER_") {
                refuse!(
                    key("env"),
                    "`{name}` is not a variable name to pass through (HOOKLEDGER_* are set by \
                     hookledger)"
                );
            }
        }
        let timeout = self.timeout.unwrap_or(DEFAULT_COMMAND_TIMEOUT);
        if timeout.is_zero() || timeout > MAX_COMMAND_TIMEOUT {
            refuse!(key("timeout"), "must be more than 0 and at most 1 day");
        }
        let schedule = self.schedule.clone().unwrap_or_else(default_schedule);
        if schedule.is_empty() {
            refuse!(key("schedule"), "needs at least one delay");
        }
        if schedule.iter().any(|d| *d > MAX_FORWARD_DELAY) {
            refuse!(
                key("schedule"),
                "a delay is longer than the most allowed, 30 days"
            );
        }
        // A command's lane is its own: one run at a time unless said otherwise, nothing
        // taken from `[forward]` (a POST's settings say nothing of a local program).
        let lane = LaneSettings {
            concurrency: self.concurrency.unwrap_or(DEFAULT_COMMAND_CONCURRENCY),
            breaker_failures: self.breaker_failures.unwrap_or(DEFAULT_BREAKER_FAILURES),
            breaker_cooldown: self.breaker_cooldown.unwrap_or(DEFAULT_BREAKER_COOLDOWN),
            rate: self.rate.clone(),
            coalesce: self.coalesce.unwrap_or(false),
        };
        lane.check(&at)?;
        Ok(Some(CommandTarget {
            program,
            args: argv[1..].to_vec(),
            workdir: self.workdir.clone(),
            env: self.env.clone(),
            give_up_exit: self.give_up_exit.clone(),
            timeout,
            schedule,
            lane,
        }))
    }

    /// With this many attempts in flight at once rather than `[forward]`'s.
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = Some(concurrency);
        self
    }

    /// As a [`ForwardConfig`], the `[forward]` one filling what is not set; errors name the
    /// delivery's keys.
    pub(crate) fn target(
        &self,
        forward: Option<&ForwardConfig>,
    ) -> Result<ForwardConfig, ConfigError> {
        let at = format!("delivery `{}`", self.kind);
        let secret = match (&self.secret, forward) {
            (Some(secret), _) => secret.clone(),
            (None, Some(forward)) => forward.secret.clone(),
            (None, None) => refuse!(
                format!("{at}.secret"),
                "missing, and there is no [forward] secret to share"
            ),
        };
        let target = ForwardConfig {
            url: self.url.clone(),
            secret,
            schedule: match (&self.schedule, forward) {
                (Some(schedule), _) => schedule.clone(),
                (None, Some(forward)) => forward.schedule.clone(),
                (None, None) => default_schedule(),
            },
            timeout: match (self.timeout, forward) {
                (Some(timeout), _) => timeout,
                (None, Some(forward)) => forward.timeout,
                (None, None) => DEFAULT_FORWARD_TIMEOUT,
            },
            concurrency: match (self.concurrency, forward) {
                (Some(concurrency), _) => concurrency,
                (None, Some(forward)) => forward.concurrency,
                (None, None) => DEFAULT_CONCURRENCY,
            },
            breaker_failures: match (self.breaker_failures, forward) {
                (Some(failures), _) => failures,
                (None, Some(forward)) => forward.breaker_failures,
                (None, None) => DEFAULT_BREAKER_FAILURES,
            },
            breaker_cooldown: match (self.breaker_cooldown, forward) {
                (Some(cooldown), _) => cooldown,
                (None, Some(forward)) => forward.breaker_cooldown,
                (None, None) => DEFAULT_BREAKER_COOLDOWN,
            },
            rate: self
                .rate
                .clone()
                .or_else(|| forward.and_then(|f| f.rate.clone())),
            coalesce: self
                .coalesce
                .unwrap_or_else(|| forward.is_some_and(|f| f.coalesce)),
        };
        target.check(&at)?;
        Ok(target)
    }
}

/// A `[[delivery]]` `command`, resolved and checked at start-up.
#[derive(Debug, Clone)]
pub(crate) struct CommandTarget {
    /// An absolute path to an executable file.
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) workdir: Option<PathBuf>,
    /// Names of the variables passed through from hookledger's environment.
    pub(crate) env: Vec<String>,
    pub(crate) give_up_exit: Vec<i32>,
    pub(crate) timeout: Duration,
    pub(crate) schedule: Vec<Duration>,
    pub(crate) lane: LaneSettings,
}

/// A kind's lane, as configured: attempts in flight, its breaker, its rate, coalescing.
#[derive(Debug, Clone)]
pub(crate) struct LaneSettings {
    pub(crate) concurrency: usize,
    pub(crate) breaker_failures: u32,
    pub(crate) breaker_cooldown: Duration,
    pub(crate) rate: Option<String>,
    pub(crate) coalesce: bool,
}

impl LaneSettings {
    /// Refuses what no lane can run with, naming `at`'s key.
    fn check(&self, at: &str) -> Result<(), ConfigError> {
        let key = |field: &str| format!("{at}.{field}");
        if self.concurrency == 0 || self.concurrency > MAX_CONCURRENCY {
            refuse!(
                key("concurrency"),
                "must be at least 1 and at most {MAX_CONCURRENCY} (attempts in flight at once)"
            );
        }
        if self.breaker_failures == 0 {
            refuse!(
                key("breaker_failures"),
                "must be at least 1 (consecutive failures that pause the kind)"
            );
        }
        if self.breaker_cooldown.is_zero() || self.breaker_cooldown > MAX_FORWARD_TIMEOUT {
            refuse!(
                key("breaker_cooldown"),
                "must be more than 0 and at most 1h"
            );
        }
        if self
            .rate
            .as_deref()
            .is_some_and(|r| Rate::parse(r).is_none())
        {
            refuse!(
                key("rate"),
                "must be attempts per second or per minute, as \"20/s\" or \"600/m\" \
                 (at least 1)"
            );
        }
        Ok(())
    }
}

/// Whether `path` is a file someone may execute.
fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Longest run of one delivery command.
pub(crate) const MAX_COMMAND_TIMEOUT: Duration = Duration::from_secs(86_400);

/// One value or a list of them (`give_up_exit = 3` or `[3, 4]`).
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<i32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(i32),
        Many(Vec<i32>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(n) => vec![n],
        OneOrMany::Many(v) => v,
    })
}

/// What the ledger remembers.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RetentionConfig {
    /// Days the ledger remembers events: their claims, so a resend is still a duplicate (at
    /// least [`MIN_RETENTION_DAYS`]). `"never"` in a file (`u64::MAX`): kept for ever.
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

fn default_forward_timeout() -> Duration {
    DEFAULT_FORWARD_TIMEOUT
}

fn default_concurrency() -> usize {
    DEFAULT_CONCURRENCY
}

fn default_breaker_failures() -> u32 {
    DEFAULT_BREAKER_FAILURES
}

fn default_breaker_cooldown() -> Duration {
    DEFAULT_BREAKER_COOLDOWN
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
        if let Some(forward) = &self.forward {
            forward.check("forward")?;
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
            if delivery.command_target()?.is_none() {
                delivery.target(self.forward.as_ref())?;
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

/// Longest delay between two delivery attempts: a longer one is a typo (`99999999999d`).
pub(crate) const MAX_FORWARD_DELAY: Duration = Duration::from_secs(30 * 86_400);

/// Longest time limit of one event's effects: every other event waits for them.
pub(crate) const MAX_EFFECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Most attempts of one kind in flight at once: each holds a thread and a payload.
pub(crate) const MAX_CONCURRENCY: usize = 256;

/// Longest timeout of one delivery request.
pub(crate) const MAX_FORWARD_TIMEOUT: Duration = Duration::from_secs(3600);

impl ForwardConfig {
    /// Its lane settings.
    pub(crate) fn lane(&self) -> LaneSettings {
        LaneSettings {
            concurrency: self.concurrency,
            breaker_failures: self.breaker_failures,
            breaker_cooldown: self.breaker_cooldown,
            rate: self.rate.clone(),
            coalesce: self.coalesce,
        }
    }

    /// Refuses a target that cannot be delivered to and settings that are typos, naming the
    /// keys under `at` (`forward`, or a ``delivery `kind` ``). The secret is checked where the
    /// signer decodes it.
    fn check(&self, at: &str) -> Result<(), ConfigError> {
        let key = |field: &str| format!("{at}.{field}");
        // The URL itself is not repeated: it may hold credentials.
        let url = url::Url::parse(&self.url)
            .map_err(|e| ConfigError::new(key("url"), format!("not a URL ({e})")))?;
        if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
            refuse!(
                key("url"),
                "must be an http:// or https:// URL with a host (the app's webhook endpoint)"
            );
        }
        if self.schedule.is_empty() {
            refuse!(key("schedule"), "needs at least one delay");
        }
        if self.schedule.iter().any(|d| *d > MAX_FORWARD_DELAY) {
            refuse!(
                key("schedule"),
                "a delay is longer than the most allowed, 30 days"
            );
        }
        if self.timeout.is_zero() || self.timeout > MAX_FORWARD_TIMEOUT {
            refuse!(key("timeout"), "must be more than 0 and at most 1h");
        }
        self.lane().check(at)
    }
}

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
        return Err(format!(
            "it has {chars} characters after `whsec_`; a real one has 32 or more, and fewer than \
             {MIN_SECRET_CHARS} is a placeholder that one captured request is enough to guess \
             (copy the whole secret from the provider's dashboard)"
        ));
    }
    Ok(())
}

/// The secrets of a secret file: one per line (or comma-separated), a UTF-8 byte order mark
/// dropped, blank lines and `#` comment lines ignored.
pub(crate) fn parse_secret_file(text: &str) -> Vec<Secret> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .flat_map(parse_secret_list)
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
        assert!(check_secret("a").unwrap_err().contains("1 characters"));
        assert!(check_secret("whsec_012345678").is_err());
        assert!(check_secret("whsec_0123456789").is_ok());
        assert!(check_secret("0123456789").is_ok());
    }

    #[test]
    fn secret_files_skip_comments_blank_lines_and_a_bom() {
        let text = "\u{feff}whsec_first_secret_0123456789\r\n\n# rotated 2024\n  \n  # old one below\nwhsec_second_secret_012345678,whsec_third_secret_0123456789\n";
        let secrets: Vec<String> = parse_secret_file(text)
            .iter()
            .map(|s| s.expose().to_string())
            .collect();
        assert_eq!(
            secrets,
            [
                "whsec_first_secret_0123456789",
                "whsec_second_secret_012345678",
                "whsec_third_secret_0123456789"
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

    #[test]
    fn a_command_delivery_is_checked_at_start_up_naming_the_key() {
        let sh = |argv: &[&str]| {
            DeliveryConfig::command("deploy", argv.iter().map(|a| a.to_string()).collect())
        };
        let ok = sh(&["/bin/sh", "deploy.sh"])
            .command_target()
            .unwrap()
            .unwrap();
        assert_eq!(ok.timeout, DEFAULT_COMMAND_TIMEOUT);
        assert_eq!(ok.args, ["deploy.sh"]);
        let err = |d: DeliveryConfig| d.command_target().unwrap_err().key;
        assert_eq!(err(sh(&[])), "delivery `deploy`.command");
        assert_eq!(err(sh(&[""])), "delivery `deploy`.command");
        assert_eq!(
            err(sh(&["/no/such/deploy.sh"])),
            "delivery `deploy`.command"
        );
        let plain = std::env::temp_dir().join(format!("hookledger-plain-{}", std::process::id()));
        std::fs::write(&plain, "not a program").unwrap();
        let plain_argv = [plain.to_str().unwrap()];
        assert_eq!(err(sh(&plain_argv)), "delivery `deploy`.command");
        let _ = std::fs::remove_file(&plain);
        assert_eq!(err(sh(&["deploy.sh"])), "delivery `deploy`.command");
        let relative = sh(&["sh"])
            .with_workdir("/bin")
            .command_target()
            .unwrap()
            .unwrap();
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
        let target = file.deliveries[0].command_target().unwrap().unwrap();
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
        let target = delivery.target(Some(&forward)).unwrap();
        assert_eq!(target.url, "http://127.0.0.1:1/receipts");
        assert_eq!(target.secret, forward.secret);
        assert_eq!(target.schedule, forward.schedule);
        assert_eq!(target.timeout, forward.timeout);
        let own = delivery.clone().with_timeout(Duration::from_secs(9));
        assert_eq!(
            own.target(Some(&forward)).unwrap().timeout,
            Duration::from_secs(9)
        );
        let err = delivery.target(None).unwrap_err();
        assert_eq!(err.key, "delivery `send_receipt`.secret");
        assert!(err.message.starts_with("missing"), "{err}");
        let ftp = DeliveryConfig {
            url: "ftp://127.0.0.1/receipts".into(),
            ..delivery.clone()
        };
        let err = ftp.target(Some(&forward)).unwrap_err();
        assert_eq!(err.key, "delivery `send_receipt`.url", "{err}");
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
                .contains("unknown field `…`, expected one of `max_body`"),
            "{err}"
        );
    }
}

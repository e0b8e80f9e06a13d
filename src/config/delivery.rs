//! Delivery: `[forward]`, each `[[delivery]]` (a POST to a URL, a local `command` or a message
//! broker) and the lane every kind is delivered in.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::broker::{AmqpConfig, Broker, NatsConfig, RedisConfig};
use super::{
    default_schedule, refuse, ConfigError, Rate, RouteConfig, Secret, DEFAULT_BREAKER_COOLDOWN,
    DEFAULT_BREAKER_FAILURES, DEFAULT_COMMAND_CONCURRENCY, DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_CONCURRENCY, DEFAULT_FORWARD_TIMEOUT,
};

/// A lane's keys as a `[forward]` or `[[delivery]]` table writes them, each optional: what is
/// not set is taken from the lane below, `[forward]`'s for a `[[delivery]]` with a `url`, the
/// defaults for `[forward]` and for a `command` (whose lane takes nothing from `[forward]`: a
/// POST's settings say nothing of a local program). The one place a lane key is declared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LaneKeys {
    /// Attempts of this kind in flight at once (each row attempted by one).
    #[serde(default, deserialize_with = "keyed::concurrency")]
    pub concurrency: Option<usize>,
    /// Consecutive failures (no answer, or an error status) that pause this kind.
    #[serde(default, deserialize_with = "keyed::breaker_failures")]
    pub breaker_failures: Option<u32>,
    /// How long a paused kind waits before one probe attempt.
    #[serde(default, deserialize_with = "keyed::breaker_cooldown")]
    pub breaker_cooldown: Option<Duration>,
    /// At most so many attempts of this kind: `"20/s"` or `"600/m"`; default: no limit.
    #[serde(default, deserialize_with = "keyed::rate")]
    pub rate: Option<String>,
    /// A newer queued row of this kind (same source, same `coalesce_key`) supersedes the older
    /// queued ones not running: "deliver only the newest". Default: off.
    #[serde(default, deserialize_with = "keyed::coalesce")]
    pub coalesce: Option<bool>,
}

impl LaneKeys {
    /// These keys over `base` (each one set here wins), checked; errors name `at`'s key.
    pub(crate) fn over(&self, base: &LaneSettings, at: &str) -> Result<LaneSettings, ConfigError> {
        let rate = match &self.rate {
            None => base.rate,
            Some(text) => match Rate::parse(text) {
                Some(rate) => Some(rate),
                None => refuse!(
                    format!("{at}.rate"),
                    "must be attempts per second or per minute, as \"20/s\" or \"600/m\" \
                     (at least 1)"
                ),
            },
        };
        let lane = LaneSettings {
            concurrency: self.concurrency.unwrap_or(base.concurrency),
            breaker_failures: self.breaker_failures.unwrap_or(base.breaker_failures),
            breaker_cooldown: self.breaker_cooldown.unwrap_or(base.breaker_cooldown),
            rate,
            coalesce: self.coalesce.unwrap_or(base.coalesce),
        };
        lane.check(at)?;
        Ok(lane)
    }
}

/// The lane keys' deserializers. A flattened table's errors point at its header, not at the
/// key, so each names its key (without quotes: the parse error's quoted parts are withheld,
/// as they may be values).
mod keyed {
    use std::time::Duration;

    use serde::de::{Deserialize, Deserializer, Error};

    fn named<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
        key: &str,
    ) -> Result<Option<T>, D::Error> {
        T::deserialize(d)
            .map(Some)
            .map_err(|e| D::Error::custom(format_args!("{key}: {e}")))
    }

    pub(super) fn concurrency<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
        named(d, "concurrency")
    }

    pub(super) fn breaker_failures<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<u32>, D::Error> {
        named(d, "breaker_failures")
    }

    pub(super) fn breaker_cooldown<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let text: Option<String> = named(d, "breaker_cooldown")?;
        match text.as_deref().map(super::super::parse_duration) {
            Some(Ok(duration)) => Ok(Some(duration)),
            Some(Err(_)) => Err(D::Error::custom(format_args!(
                "breaker_cooldown {}",
                super::super::NOT_A_DURATION
            ))),
            None => Ok(None),
        }
    }

    pub(super) fn rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        named(d, "rate")
    }

    pub(super) fn coalesce<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
        named(d, "coalesce")
    }
}

/// Where and how to forward processed events to the app.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ForwardConfig {
    pub url: String,
    /// The Standard Webhooks signing secret (`whsec_<base64>`).
    pub secret: Secret,
    /// Delays between attempts; after the last one a row is dead.
    #[serde(default = "default_schedule", with = "super::durations")]
    pub schedule: Vec<Duration>,
    #[serde(default = "default_forward_timeout", with = "super::duration")]
    pub timeout: Duration,
    /// Which events are forwarded (any entry that matches); default: every processed event.
    #[serde(default)]
    pub on: Option<Vec<RouteConfig>>,
    /// Its lane (attempts in flight, breaker, rate, coalescing); what is not set, the defaults.
    #[serde(flatten)]
    pub lane: LaneKeys,
}

/// Where outbox rows of one `kind`, queued by effects, are delivered: as `forward` rows are
/// (signed, retried, dead-lettered), to their own URL, or to a local `command` (argv, never a
/// shell) that reads the payload on stdin. A delivery has `url` or `command`, not both.
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
    /// Publish each row to a NATS JetStream stream.
    #[serde(default)]
    pub nats: Option<NatsConfig>,
    /// Publish each row to a RabbitMQ (AMQP 0-9-1) exchange.
    #[serde(default)]
    pub amqp: Option<AmqpConfig>,
    /// Add each row to a Redis stream.
    #[serde(default)]
    pub redis: Option<RedisConfig>,
    /// The Standard Webhooks signing secret; default: the `[forward]` secret.
    #[serde(default)]
    pub secret: Option<Secret>,
    #[serde(default, with = "super::option_durations")]
    pub schedule: Option<Vec<Duration>>,
    #[serde(default, with = "super::option_duration")]
    pub timeout: Option<Duration>,
    /// Which events queue a row of this kind (any entry that matches), in the claim's
    /// transaction as an effect's `INSERT INTO outbox` would; default: only effects queue them.
    #[serde(default)]
    pub on: Option<Vec<RouteConfig>>,
    /// Its lane; what is not set is `[forward]`'s (a `command`'s: the defaults, one run at a
    /// time).
    #[serde(flatten)]
    pub lane: LaneKeys,
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
            on: None,
            lane: LaneKeys::default(),
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
        self.lane.concurrency = Some(concurrency);
        self
    }

    /// Forwarding only the events one of `on` matches.
    pub fn with_routes(mut self, on: Vec<RouteConfig>) -> Self {
        self.on = Some(on);
        self
    }

    /// At most `rate` attempts (`"20/s"`, `"600/m"`).
    pub fn with_rate(mut self, rate: impl Into<String>) -> Self {
        self.lane.rate = Some(rate.into());
        self
    }

    /// Paused for `cooldown` after `failures` consecutive failures.
    pub fn with_breaker(mut self, failures: u32, cooldown: Duration) -> Self {
        self.lane.breaker_failures = Some(failures);
        self.lane.breaker_cooldown = Some(cooldown);
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
            nats: None,
            amqp: None,
            redis: None,
            secret: None,
            schedule: None,
            timeout: None,
            on: None,
            lane: LaneKeys::default(),
        }
    }

    /// A row of this kind for each new event one of `on` matches.
    pub fn with_routes(mut self, on: Vec<RouteConfig>) -> Self {
        self.on = Some(on);
        self
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

    /// Delivery of the rows of `kind` into a message broker (`nats`, `amqp` or `redis`).
    pub fn broker(kind: impl Into<String>) -> DeliveryConfig {
        DeliveryConfig::new(kind, "")
    }

    /// Published to a NATS JetStream stream.
    pub fn with_nats(mut self, nats: NatsConfig) -> Self {
        self.nats = Some(nats);
        self
    }

    /// Published to a RabbitMQ exchange.
    pub fn with_amqp(mut self, amqp: AmqpConfig) -> Self {
        self.amqp = Some(amqp);
        self
    }

    /// Added to a Redis stream.
    pub fn with_redis(mut self, redis: RedisConfig) -> Self {
        self.redis = Some(redis);
        self
    }

    /// What delivers this kind's rows, `[forward]` filling what a POST does not set, checked;
    /// errors name the delivery's keys.
    pub(crate) fn target(
        &self,
        forward: Option<&ForwardConfig>,
    ) -> Result<DeliveryTarget, ConfigError> {
        let at = format!("delivery `{}`", self.kind);
        let key = |field: &str| format!("{at}.{field}");
        let ways = [
            ("url", !self.url.is_empty()),
            ("command", self.command.is_some()),
            ("nats", self.nats.is_some()),
            ("amqp", self.amqp.is_some()),
            ("redis", self.redis.is_some()),
        ];
        let mut set = ways.iter().filter(|(_, set)| *set).map(|(way, _)| *way);
        let way = match (set.next(), set.next()) {
            (None, _) => refuse!(
                key("url"),
                "missing: a delivery needs `url`, `command`, `nats`, `amqp` or `redis`"
            ),
            (Some(first), Some(second)) => refuse!(
                key(second),
                "a delivery has one of `url`, `command`, `nats`, `amqp` and `redis`; this one \
                 has `{first}` too"
            ),
            (Some(way), None) => way,
        };
        if way != "command" {
            for (set, field) in [
                (self.workdir.is_some(), "workdir"),
                (!self.env.is_empty(), "env"),
                (!self.give_up_exit.is_empty(), "give_up_exit"),
            ] {
                if set {
                    refuse!(key(field), "is only for a delivery with a `command`");
                }
            }
        }
        if way != "url" && self.secret.is_some() {
            refuse!(
                key("secret"),
                "signs POSTs; a delivery with `{way}` has none"
            );
        }
        Ok(match way {
            "url" => DeliveryTarget::Post(self.post_target(forward)?),
            "command" => DeliveryTarget::Command(self.command_target(&at)?),
            _ => DeliveryTarget::Broker(self.broker_target(&at)?),
        })
    }

    /// The URL of a delivery's broker and the broker's key, to resolve its `env:`, `file:`
    /// or `credential:` value.
    pub(crate) fn broker_url_mut(&mut self) -> Option<(&'static str, &mut Secret)> {
        (self.nats.as_mut().map(|c| ("nats", &mut c.url)))
            .or(self.amqp.as_mut().map(|c| ("amqp", &mut c.url)))
            .or(self.redis.as_mut().map(|c| ("redis", &mut c.url)))
    }

    /// The broker this delivery publishes to, checked; its lane takes nothing from
    /// `[forward]`, as a command's does not.
    fn broker_target(&self, at: &str) -> Result<BrokerTarget, ConfigError> {
        let broker = match (&self.nats, &self.amqp, &self.redis) {
            (Some(nats), _, _) => Broker::Nats(nats.clone()),
            (_, Some(amqp), _) => Broker::Amqp(amqp.clone()),
            (_, _, Some(redis)) => Broker::Redis(redis.clone()),
            _ => unreachable!("target() calls it for a delivery with a broker"),
        };
        broker.check(&format!("{at}.{}", broker.name()))?;
        let schedule = self.schedule.clone().unwrap_or_else(default_schedule);
        check_schedule(&schedule, at)?;
        let timeout = self.timeout.unwrap_or(DEFAULT_FORWARD_TIMEOUT);
        if timeout.is_zero() || timeout > MAX_FORWARD_TIMEOUT {
            refuse!(
                format!("{at}.timeout"),
                "must be more than 0 and at most 1h"
            );
        }
        Ok(BrokerTarget {
            broker,
            schedule,
            timeout,
            lane: self.lane.over(&LaneSettings::post(), at)?,
        })
    }

    /// The command to run, resolved and checked, for a delivery with a `command`; errors name
    /// the keys under `at`.
    fn command_target(&self, at: &str) -> Result<CommandTarget, ConfigError> {
        let key = |field: &str| format!("{at}.{field}");
        let argv = self
            .command
            .as_ref()
            .expect("target() calls it for a command");
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
        // A program that is not there (a deploy that removed its own script) does not stop
        // the start: every other kind and source works, and this kind's attempts fail naming
        // it until it is there again (`delivery::Targets::of` warns at start). One that is
        // there but cannot run is a mistake of the config's.
        let missing = std::fs::symlink_metadata(&program)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
        if !missing && !is_executable(&program) {
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
        check_schedule(&schedule, at)?;
        let lane = self.lane.over(&LaneSettings::command(), at)?;
        Ok(CommandTarget {
            program,
            args: argv[1..].to_vec(),
            workdir: self.workdir.clone(),
            env: self.env.clone(),
            give_up_exit: self.give_up_exit.clone(),
            timeout,
            schedule,
            lane,
        })
    }

    /// With this many attempts in flight at once rather than `[forward]`'s.
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.lane.concurrency = Some(concurrency);
        self
    }

    /// The POST this delivery makes, `[forward]` filling what is not set, checked; errors name
    /// the delivery's keys.
    fn post_target(&self, forward: Option<&ForwardConfig>) -> Result<PostTarget, ConfigError> {
        let at = format!("delivery `{}`", self.kind);
        let below = match forward {
            Some(forward) => forward.target()?,
            None => PostTarget {
                url: String::new(),
                secret: match &self.secret {
                    Some(secret) => secret.clone(),
                    None => refuse!(
                        format!("{at}.secret"),
                        "missing, and there is no [forward] secret to share"
                    ),
                },
                schedule: default_schedule(),
                timeout: DEFAULT_FORWARD_TIMEOUT,
                lane: LaneSettings::post(),
            },
        };
        PostTarget {
            url: self.url.clone(),
            secret: self.secret.clone().unwrap_or(below.secret),
            schedule: self.schedule.clone().unwrap_or(below.schedule),
            timeout: self.timeout.unwrap_or(below.timeout),
            lane: self.lane.over(&below.lane, &at)?,
        }
        .check(&at)
    }
}

/// What delivers a `[[delivery]]`'s rows, resolved and checked at start-up.
#[derive(Debug, Clone)]
pub(crate) enum DeliveryTarget {
    Post(PostTarget),
    Command(CommandTarget),
    Broker(BrokerTarget),
}

/// A delivery into a message broker, resolved and checked at start-up (what needs a connection
/// is checked by the target as it opens).
#[derive(Debug, Clone)]
pub(crate) struct BrokerTarget {
    pub(crate) broker: Broker,
    pub(crate) schedule: Vec<Duration>,
    /// Of one publish, its confirm included.
    pub(crate) timeout: Duration,
    pub(crate) lane: LaneSettings,
}

/// A POST delivery (`[forward]`, a `[[delivery]]` with a `url`), resolved and checked at
/// start-up.
#[derive(Debug, Clone)]
pub(crate) struct PostTarget {
    pub(crate) url: String,
    pub(crate) secret: Secret,
    pub(crate) schedule: Vec<Duration>,
    pub(crate) timeout: Duration,
    pub(crate) lane: LaneSettings,
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

/// A kind's lane, resolved: attempts in flight, its breaker, its rate, coalescing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaneSettings {
    pub(crate) concurrency: usize,
    pub(crate) breaker_failures: u32,
    pub(crate) breaker_cooldown: Duration,
    /// At most so many attempts (none: no limit).
    pub(crate) rate: Option<Rate>,
    /// Whether a newer queued row supersedes the older queued ones of its source and
    /// `coalesce_key`.
    pub(crate) coalesce: bool,
}

impl Default for LaneSettings {
    /// A lane the code adds (a provider wing's fetches, the alerts): one attempt at a time.
    fn default() -> Self {
        LaneSettings {
            concurrency: 1,
            breaker_failures: DEFAULT_BREAKER_FAILURES,
            breaker_cooldown: DEFAULT_BREAKER_COOLDOWN,
            rate: None,
            coalesce: false,
        }
    }
}

impl LaneSettings {
    /// A POST's lane where nothing is set.
    pub(crate) fn post() -> LaneSettings {
        LaneSettings {
            concurrency: DEFAULT_CONCURRENCY,
            ..LaneSettings::default()
        }
    }

    /// A command's lane where nothing is set.
    pub(crate) fn command() -> LaneSettings {
        LaneSettings {
            concurrency: DEFAULT_COMMAND_CONCURRENCY,
            ..LaneSettings::default()
        }
    }

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
        Ok(())
    }
}

/// Refuses a retry schedule no lane can run, naming `at`'s `schedule`.
fn check_schedule(schedule: &[Duration], at: &str) -> Result<(), ConfigError> {
    if schedule.is_empty() {
        refuse!(format!("{at}.schedule"), "needs at least one delay");
    }
    if schedule.iter().any(|d| *d > MAX_FORWARD_DELAY) {
        refuse!(
            format!("{at}.schedule"),
            "a delay is longer than the most allowed, 30 days"
        );
    }
    Ok(())
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

fn default_forward_timeout() -> Duration {
    DEFAULT_FORWARD_TIMEOUT
}

/// Longest delay between two delivery attempts: a longer one is a typo (`99999999999d`).
pub(crate) const MAX_FORWARD_DELAY: Duration = Duration::from_secs(30 * 86_400);
/// Most attempts of one kind in flight at once: each holds a thread and a payload.
pub(crate) const MAX_CONCURRENCY: usize = 256;

/// Longest timeout of one delivery request.
pub(crate) const MAX_FORWARD_TIMEOUT: Duration = Duration::from_secs(3600);

impl ForwardConfig {
    /// The POST it makes, checked; errors name `forward`'s keys.
    pub(crate) fn target(&self) -> Result<PostTarget, ConfigError> {
        PostTarget {
            url: self.url.clone(),
            secret: self.secret.clone(),
            schedule: self.schedule.clone(),
            timeout: self.timeout,
            lane: self.lane.over(&LaneSettings::post(), "forward")?,
        }
        .check("forward")
    }
}

impl PostTarget {
    /// Refuses a target that cannot be delivered to and settings that are typos, naming the
    /// keys under `at` (`forward`, or a ``delivery `kind` ``). The secret is checked where the
    /// signer decodes it.
    fn check(self, at: &str) -> Result<PostTarget, ConfigError> {
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
        check_schedule(&self.schedule, at)?;
        if self.timeout.is_zero() || self.timeout > MAX_FORWARD_TIMEOUT {
            refuse!(key("timeout"), "must be more than 0 and at most 1h");
        }
        Ok(self)
    }
}

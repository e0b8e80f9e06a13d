//! `[[alert]]`: where hookledger tells an operator that something needs them (rows going dead,
//! a source refused too often, a backlog too old), and when it is over.

use std::time::Duration;

use serde::Deserialize;

use super::{decode_standard_secret, refuse, ConfigError, Secret};

/// The causes an alert can be `on`.
pub(crate) const CAUSES: [&str; 3] = ["dead", "refused", "backlog"];

/// Refusals a minute of one source that make an incident: a few are a typo'd test; a steady
/// stream is a wrong secret or an attack.
pub(crate) const DEFAULT_REFUSED_PER_MINUTE: u64 = 10;

/// The window the refusal rate is counted over: long enough that one burst of retries is not
/// an incident, short enough that a wrong secret is told within minutes.
pub(crate) const DEFAULT_REFUSED_WINDOW: Duration = Duration::from_secs(300);

/// The age of the oldest pending row that makes an incident: past the first few retries of
/// the default schedule (5s, 30s, 2m, 10m), so a short blip of the app is not one.
pub(crate) const DEFAULT_BACKLOG_AGE: Duration = Duration::from_secs(15 * 60);

/// A message an operator waits for should not wait for a slow chat service for long.
pub(crate) const DEFAULT_ALERT_TIMEOUT: Duration = Duration::from_secs(10);

/// One `[[alert]]`: a URL, the message's shape, and what it is told of.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AlertConfig {
    /// Names its incidents and its outbox kind (`alert:NAME`); default: its position (1, 2…).
    #[serde(default)]
    pub name: Option<String>,
    /// Where each message is POSTed (a Slack incoming webhook, say).
    pub url: String,
    /// `slack`: `{"text": …}` (Slack, Mattermost, Rocket.Chat, Discord's `/slack`);
    /// `standard`: JSON signed with Standard Webhooks headers under `secret`.
    #[serde(default = "default_format")]
    pub format: String,
    /// The Standard Webhooks secret (`whsec_…`; `env:NAME` or `file:PATH` in a file).
    #[serde(default)]
    pub secret: Option<Secret>,
    /// What it is told of: `dead`, `refused`, `backlog`.
    #[serde(default = "default_on")]
    pub on: Vec<String>,
    /// Refusals a minute of one source, over `refused_window`, that open an incident.
    #[serde(default = "default_refused_per_minute")]
    pub refused_per_minute: u64,
    #[serde(default = "default_refused_window", with = "super::duration")]
    pub refused_window: Duration,
    /// The age of the oldest pending delivery that opens an incident.
    #[serde(default = "default_backlog_age", with = "super::duration")]
    pub backlog_age: Duration,
    /// Timeout of one POST of a message.
    #[serde(default = "default_alert_timeout", with = "super::duration")]
    pub timeout: Duration,
}

fn default_format() -> String {
    "slack".into()
}

fn default_on() -> Vec<String> {
    CAUSES.map(String::from).to_vec()
}

fn default_refused_per_minute() -> u64 {
    DEFAULT_REFUSED_PER_MINUTE
}

fn default_refused_window() -> Duration {
    DEFAULT_REFUSED_WINDOW
}

fn default_backlog_age() -> Duration {
    DEFAULT_BACKLOG_AGE
}

fn default_alert_timeout() -> Duration {
    DEFAULT_ALERT_TIMEOUT
}

impl AlertConfig {
    /// Slack-shaped messages to `url`, on every cause, with the default thresholds.
    pub fn slack(url: impl Into<String>) -> AlertConfig {
        AlertConfig {
            name: None,
            url: url.into(),
            format: default_format(),
            secret: None,
            on: default_on(),
            refused_per_minute: DEFAULT_REFUSED_PER_MINUTE,
            refused_window: DEFAULT_REFUSED_WINDOW,
            backlog_age: DEFAULT_BACKLOG_AGE,
            timeout: DEFAULT_ALERT_TIMEOUT,
        }
    }

    /// The name of the alert at `position` (1-based): its own, or the position.
    pub(crate) fn name_at(&self, position: usize) -> String {
        self.name.clone().unwrap_or_else(|| position.to_string())
    }

    /// Whether it is told of `cause`.
    pub(crate) fn on(&self, cause: &str) -> bool {
        self.on.iter().any(|c| c == cause)
    }

    /// The config key of `field` of the alert at `position`.
    pub(crate) fn key(&self, position: usize, field: &str) -> String {
        match &self.name {
            Some(name) => format!("alert `{name}`.{field}"),
            None => format!("alert {position}.{field}"),
        }
    }

    /// Refuses what cannot work, naming the key (never repeating the URL or the secret).
    pub(crate) fn validate(&self, position: usize) -> Result<(), ConfigError> {
        let key = |field: &str| self.key(position, field);
        if let Some(name) = &self.name {
            let ok = !name.is_empty()
                && name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !ok {
                refuse!(
                    format!("alert {position}.name"),
                    "must be 1 to 64 letters, digits, `-`, `_` or `.`"
                );
            }
        }
        let url = url::Url::parse(&self.url)
            .map_err(|e| ConfigError::new(key("url"), format!("not a URL ({e})")))?;
        if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
            refuse!(
                key("url"),
                "must be an http:// or https:// URL with a host (where messages are POSTed)"
            );
        }
        match (self.format.as_str(), &self.secret) {
            ("slack", _) => {}
            ("standard", None) => refuse!(
                key("secret"),
                "format \"standard\" signs each message: set secret (whsec_…; hookledger \
                 gen-secret makes one)"
            ),
            ("standard", Some(secret)) => {
                decode_standard_secret(secret.expose())
                    .map_err(|why| ConfigError::new(key("secret"), why))?;
            }
            _ => refuse!(
                key("format"),
                "must be \"slack\" ({{\"text\": …}}) or \"standard\" (signed JSON)"
            ),
        }
        if self.on.is_empty() {
            refuse!(key("on"), "names no cause: use some of {CAUSES:?}");
        }
        if let Some(bad) = self.on.iter().find(|c| !CAUSES.contains(&c.as_str())) {
            // A cause is a word of ours, not a secret: named, to show the typo.
            refuse!(key("on"), "`{bad}` is not a cause: use some of {CAUSES:?}");
        }
        if self.refused_per_minute == 0 {
            refuse!(key("refused_per_minute"), "must be at least 1");
        }
        let day = Duration::from_secs(86_400);
        if self.refused_window < Duration::from_secs(1) || self.refused_window > day {
            refuse!(key("refused_window"), "must be between 1s and 1d");
        }
        if self.backlog_age < Duration::from_secs(1) {
            refuse!(key("backlog_age"), "must be at least 1s");
        }
        if self.timeout.is_zero() || self.timeout > Duration::from_secs(3600) {
            refuse!(key("timeout"), "must be more than 0 and at most 1h");
        }
        Ok(())
    }
}

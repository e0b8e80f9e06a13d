//! Settings for `serve`, their defaults (each with its reason) and validation.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;

use crate::source::standard::SigningKey;
use crate::source::Secret;

/// Stripe's payloads are a few KB; 1 MiB leaves room for the largest real events while a
/// hostile sender cannot make us buffer more than that per request.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// A client that has not sent its headers or body within this time is cut off, so slow
/// senders cannot hold connections (Stripe itself times out after ~10 s).
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Open connections beyond this are refused with a 503 at once. Each idle connection costs a
/// few KB; the cap bounds memory and file descriptors under a flood.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// Credits granted per paid invoice (DESIGN §4).
pub const DEFAULT_CREDITS_PER_INVOICE: i64 = 100;

/// Stripe lets people resend events up to 30 days old; the ledger must remember them that long.
pub const DEFAULT_RETENTION_DAYS: u64 = 30;

/// Stripe retries a failed delivery for 3 days; a ledger that forgets sooner would apply a
/// retried event twice.
pub const MIN_RETENTION_DAYS: u64 = 3;

/// Where and how to forward processed events to the app.
#[derive(Debug, Clone)]
pub struct ForwardConfig {
    pub url: String,
    pub key: SigningKey,
    /// Delays between attempts; after the last one a row is dead.
    pub schedule: Vec<Duration>,
    pub timeout: Duration,
}

/// Everything `serve` needs. `Debug` shows no secret.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub db: PathBuf,
    pub stripe_secrets: Vec<Secret>,
    pub tolerance_secs: u64,
    pub max_body: usize,
    pub read_timeout: Duration,
    pub max_connections: usize,
    pub credits_per_invoice: i64,
    pub batch_max: usize,
    pub queue_depth: usize,
    pub busy_timeout: Duration,
    pub forward: Option<ForwardConfig>,
    pub retention_days: u64,
}

impl Config {
    /// A config with every default, for `db` and `secrets`; the listener is chosen by the caller.
    pub fn new(db: PathBuf, stripe_secrets: Vec<Secret>) -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            db,
            stripe_secrets,
            tolerance_secs: crate::source::stripe::DEFAULT_TOLERANCE_SECS,
            max_body: DEFAULT_MAX_BODY,
            read_timeout: DEFAULT_READ_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            credits_per_invoice: DEFAULT_CREDITS_PER_INVOICE,
            batch_max: crate::writer::DEFAULT_BATCH_MAX,
            queue_depth: crate::writer::DEFAULT_QUEUE_DEPTH,
            busy_timeout: crate::store::sqlite::DEFAULT_BUSY_TIMEOUT,
            forward: None,
            retention_days: DEFAULT_RETENTION_DAYS,
        }
    }

    /// Refuses settings that cannot work, with a message that says what to change.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.stripe_secrets.is_empty() {
            bail!(
                "no Stripe signing secret: set STRIPE_WEBHOOK_SECRET=whsec_... (comma-separated \
                 during rotation) or pass --stripe-secret / --stripe-secret-file"
            );
        }
        if self
            .stripe_secrets
            .iter()
            .any(|s| s.expose().trim().is_empty())
        {
            bail!("a Stripe signing secret is empty (check for a stray comma in STRIPE_WEBHOOK_SECRET)");
        }
        if self.max_body == 0 {
            bail!("--max-body must be at least 1 byte");
        }
        if self.batch_max == 0 || self.queue_depth == 0 || self.max_connections == 0 {
            bail!("--batch-max, --queue-depth and --max-connections must be at least 1");
        }
        check_retention(self.retention_days)?;
        Ok(())
    }
}

/// A retention shorter than the provider's retry window would let a retry apply twice.
pub fn check_retention(days: u64) -> anyhow::Result<()> {
    if days < MIN_RETENTION_DAYS {
        bail!(
            "retention of {days} day(s) is shorter than Stripe's retry window of \
             {MIN_RETENTION_DAYS} days: a retried event would be applied twice. Use at least \
             {MIN_RETENTION_DAYS} (default {DEFAULT_RETENTION_DAYS}, Stripe's resend window)."
        );
    }
    Ok(())
}

/// Splits a comma-separated secret list (as in `STRIPE_WEBHOOK_SECRET=whsec_a,whsec_b`).
pub fn parse_secret_list(list: &str) -> Vec<Secret> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(Secret::new)
        .collect()
}

/// Parses `250ms`, `5s`, `2m`, `1h`, `3d` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
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
    Ok(Duration::from_secs(n * unit_secs))
}

#[cfg(test)]
mod tests {
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
    fn retention_below_three_days_is_refused() {
        assert!(check_retention(2).is_err());
        assert!(check_retention(3).is_ok());
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let config = Config::new("x.db".into(), parse_secret_list("whsec_abc, whsec_def"));
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("whsec_abc") && !shown.contains("whsec_def"),
            "{shown}"
        );
        assert_eq!(config.stripe_secrets.len(), 2);
    }
}

//! `hookledger serve`: the flags, as an overlay on [`Config`], and the process around
//! [`Hookledger`] (listen, print the address, stop on a signal).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use crate::app::Hookledger;
use crate::config::{self, Config, ForwardConfig};
use crate::source::Secret;

use super::Exit;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, default_value = config::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// SQLite database file, created on first start.
    #[arg(long, default_value = config::DEFAULT_DB)]
    db: PathBuf,
    /// Stripe signing secret(s), comma-separated during rotation.
    #[arg(long, env = "STRIPE_WEBHOOK_SECRET", hide_env_values = true)]
    stripe_secret: Option<String>,
    /// Read the signing secret(s) from a file (one per line or comma-separated), keeping them
    /// out of argv and the environment.
    #[arg(long)]
    stripe_secret_file: Option<PathBuf>,
    /// Seconds a signature's timestamp may be old (or ahead); 0 turns the check off.
    #[arg(long, default_value_t = config::DEFAULT_TOLERANCE_SECS)]
    tolerance: u64,
    /// Largest accepted body in bytes.
    #[arg(long, default_value_t = config::DEFAULT_MAX_BODY)]
    max_body: usize,
    /// Bytes of request bodies held in memory at once, across all requests; beyond it a
    /// request gets a 503 before its body is read.
    #[arg(long, default_value_t = config::DEFAULT_BODY_BUDGET)]
    max_body_in_flight: usize,
    /// Seconds a client has to send its headers and its body.
    #[arg(long, default_value_t = config::DEFAULT_READ_TIMEOUT.as_secs())]
    read_timeout: u64,
    /// Open connections beyond this are refused with a 503.
    #[arg(long, default_value_t = config::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Credits granted per paid invoice.
    #[arg(long, default_value_t = config::DEFAULT_CREDITS_PER_INVOICE)]
    credits_per_invoice: i64,
    /// Most events per transaction (1 = one fsync per event, for comparison).
    #[arg(long, default_value_t = config::DEFAULT_BATCH_MAX)]
    batch_max: usize,
    /// Events waiting for the writer beyond this get a 503.
    #[arg(long, default_value_t = config::DEFAULT_QUEUE_DEPTH)]
    queue_depth: usize,
    /// Milliseconds a write waits for another process's lock on the database before the
    /// request gets a 503.
    #[arg(long, default_value_t = config::DEFAULT_BUSY_TIMEOUT.as_millis() as u64)]
    busy_timeout_ms: u64,
    /// Forward every processed event to this URL (the app), signed with Standard Webhooks.
    #[arg(long)]
    forward_to: Option<String>,
    /// The forwarding secret (whsec_<base64>; `hookledger gen-secret` makes one).
    #[arg(long, env = "HOOKLEDGER_FORWARD_SECRET", hide_env_values = true)]
    forward_secret: Option<String>,
    /// Read the forwarding secret from a file instead.
    #[arg(long)]
    forward_secret_file: Option<PathBuf>,
    /// Delays between delivery attempts, comma-separated; after the last one a row is dead.
    /// [default: 5s,30s,2m,10m,30m,1h,2h,4h,8h, then 8h up to 3 days]
    #[arg(long, value_delimiter = ',', value_parser = config::parse_duration)]
    forward_schedule: Vec<Duration>,
    /// Timeout of one delivery request. [default: 10s]
    #[arg(long, value_parser = config::parse_duration)]
    forward_timeout: Option<Duration>,
    /// Days the ledger remembers events (at least 3, Stripe's retry window).
    #[arg(long, default_value_t = config::DEFAULT_RETENTION_DAYS)]
    retention_days: u64,
}

impl ServeArgs {
    /// The flags over `config`: every flag has a value (its default is the config's own), so
    /// each replaces its field.
    fn overlay(self, mut config: Config) -> anyhow::Result<Config> {
        config.listen = self.listen;
        config.http.max_body = self.max_body;
        config.http.body_budget = self.max_body_in_flight;
        config.http.read_timeout = Duration::from_secs(self.read_timeout.max(1));
        config.http.max_connections = self.max_connections;
        config.database = self.db;
        config.storage.busy_timeout = Duration::from_millis(self.busy_timeout_ms);
        config.writer.batch_max = self.batch_max;
        config.writer.queue_depth = self.queue_depth;
        config.stripe.secrets = match secret_source(
            self.stripe_secret.as_deref(),
            self.stripe_secret_file.as_deref(),
            (
                "--stripe-secret",
                "STRIPE_WEBHOOK_SECRET",
                "--stripe-secret-file",
            ),
        )? {
            Some(SecretFrom::Value(list)) => config::parse_secret_list(list),
            Some(SecretFrom::File(file)) => read_secret_file(file)?,
            None => Vec::new(),
        };
        config.stripe.tolerance = self.tolerance;
        config.stripe.credits_per_invoice = self.credits_per_invoice;
        config.retention.days = self.retention_days;
        let secret = secret_source(
            self.forward_secret.as_deref(),
            self.forward_secret_file.as_deref(),
            (
                "--forward-secret",
                "HOOKLEDGER_FORWARD_SECRET",
                "--forward-secret-file",
            ),
        )?;
        let Some(url) = self.forward_to else {
            // Forwarding settings without a target would be silently ignored.
            let given = [
                (
                    "--forward-secret",
                    self.forward_secret.is_some()
                        && std::env::var_os("HOOKLEDGER_FORWARD_SECRET").is_none(),
                ),
                ("--forward-secret-file", self.forward_secret_file.is_some()),
                ("--forward-schedule", !self.forward_schedule.is_empty()),
                ("--forward-timeout", self.forward_timeout.is_some()),
            ];
            if let Some((flag, _)) = given.iter().find(|(_, given)| *given) {
                bail!("{flag} has no effect without --forward-to <url of the app>; add --forward-to, or drop {flag}");
            }
            return Ok(config);
        };
        let secret = match secret {
            Some(SecretFrom::Value(secret)) => secret.trim().to_string(),
            Some(SecretFrom::File(file)) => match read_secret_file(file)?.as_slice() {
                [one] => one.expose().to_string(),
                _ => bail!(
                    "--forward-secret-file {} must hold exactly one secret",
                    file.display()
                ),
            },
            None => bail!(
                "--forward-to needs a signing secret: --forward-secret, --forward-secret-file or \
                 HOOKLEDGER_FORWARD_SECRET (make one with: hookledger gen-secret)"
            ),
        };
        config.forward = Some(ForwardConfig {
            url,
            secret: Secret::new(secret),
            schedule: if self.forward_schedule.is_empty() {
                crate::outbox::default_schedule()
            } else {
                self.forward_schedule
            },
            timeout: self
                .forward_timeout
                .unwrap_or(config::DEFAULT_FORWARD_TIMEOUT),
        });
        Ok(config)
    }
}

/// Runs `serve`: the flags over the defaults, then open, listen and serve until a signal.
pub(super) fn run(args: ServeArgs) -> anyhow::Result<Exit> {
    let config = args.overlay(Config::default())?;
    if config.stripe.tolerance == 0 {
        log::warn!("--tolerance 0: signature timestamps are not checked; captured requests can be replayed");
    }

    let hookledger = Hookledger::open(config.clone())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let addr = listener.local_addr()?;
        log::info!(
            "listening on http://{addr}/webhooks/stripe, database {}, {} secret(s)",
            config.database.display(),
            config.stripe.secrets.len()
        );
        // A machine-readable line for scripts and tests that start us on port 0.
        println!("hookledger listening on {addr}");
        hookledger.serve(listener, shutdown_signal()?).await
    })?;
    Ok(Exit::Ok)
}

/// A future that resolves on SIGTERM, SIGINT or SIGHUP (a closed terminal or `systemctl
/// reload` alike: hookledger has nothing to reload, so it stops gracefully rather than die).
/// The handlers are installed here, before serving, so a failure to install them stops
/// start-up (exit 2) instead of a panic.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    let (mut term, mut hangup) = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            signal(SignalKind::hangup()).context("installing the SIGHUP handler")?,
        )
    };
    Ok(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
            _ = hangup.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        log::info!("shutdown signal received");
    })
}

/// Where a secret comes from: a flag's (or its environment variable's) value, or a file.
enum SecretFrom<'a> {
    Value(&'a str),
    File(&'a Path),
}

/// The one source of a secret among a value flag (which may come from the environment
/// variable `env`) and a file flag. Both at once is refused, naming the variable when it is
/// the environment that set the value.
fn secret_source<'a>(
    value: Option<&'a str>,
    file: Option<&'a Path>,
    (flag, env, file_flag): (&str, &str, &str),
) -> anyhow::Result<Option<SecretFrom<'a>>> {
    match (value, file) {
        (Some(_), Some(_)) if std::env::var_os(env).is_some() => bail!(
            "{file_flag} cannot be used while {env} is set in the environment: unset {env}, or \
             drop {file_flag}"
        ),
        (Some(_), Some(_)) => bail!("{file_flag} cannot be used together with {flag}; pick one"),
        (Some(value), None) => Ok(Some(SecretFrom::Value(value))),
        (None, Some(file)) => Ok(Some(SecretFrom::File(file))),
        (None, None) => Ok(None),
    }
}

fn read_secret_file(path: &Path) -> anyhow::Result<Vec<Secret>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read secret file {}", path.display()))?;
    let secrets = config::parse_secret_file(&text);
    if secrets.is_empty() {
        bail!("secret file {} holds no secret", path.display());
    }
    Ok(secrets)
}

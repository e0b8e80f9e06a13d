//! `hookledger serve`: the flags, as an overlay on [`Config`], and the process around
//! [`Hookledger`] (listen, print the address, stop on a signal).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use crate::app::Hookledger;
use crate::config::Secret;
use crate::config::{self, Config, Database, ForwardConfig, SchemeName, SourceConfig};
use crate::error::Error;

use super::common::{from_environment, Exit};

/// The flags of `serve`. Each is optional: a flag that is given replaces the config file's
/// value (or the default), one that is not leaves it.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// A TOML config file with [[source]] entries (see docs/src/configuration.md
    /// and examples/hookledger.toml); flags and environment variables override it.
    #[arg(long, env = "HOOKLEDGER_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    /// [default: 127.0.0.1:8080]
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Where to answer /healthz and /readyz for operators (never the webhook port), or `off`.
    /// [default: 127.0.0.1:9090]
    #[arg(long, value_parser = admin_listen)]
    admin_listen: Option<AdminListen>,
    /// The admin token, as env:NAME, file:PATH or credential:NAME (never the token itself, which every user
    /// could read in the process list): needed by the admin routes that change data, and by
    /// /metrics and /status when --admin-listen is not loopback.
    #[arg(long, value_name = "env:NAME|file:PATH|credential:NAME")]
    admin_token: Option<String>,
    /// Send OpenTelemetry traces (a span per request and per delivery) over OTLP/HTTP to this
    /// collector, e.g. http://127.0.0.1:4318 (config key `otlp_endpoint`).
    #[arg(long, env = "HOOKLEDGER_OTLP_ENDPOINT", hide_env_values = true)]
    otlp_endpoint: Option<String>,
    /// SQLite database file, created on first start, or a PostgreSQL URL
    /// (postgres://user:password@host/db). [default: ./hookledger.db]
    #[arg(long, env = "HOOKLEDGER_DATABASE", hide_env_values = true)]
    db: Option<Database>,
    /// Stripe signing secret(s), comma-separated during rotation: the secrets of the source
    /// named `stripe` (without a config file, the one source).
    #[arg(long, env = "STRIPE_WEBHOOK_SECRET", hide_env_values = true)]
    stripe_secret: Option<String>,
    /// Read the signing secret(s) from a file (one per line or comma-separated), keeping them
    /// out of argv and the environment.
    #[arg(long)]
    stripe_secret_file: Option<PathBuf>,
    /// The `stripe` source's Stripe API key, as env:NAME, file:PATH or credential:NAME: with stripe-billing,
    /// a tie between two subscription events fetches the current subscription (see
    /// `reconcile` for the rest). A restricted key that may read Events and Subscriptions.
    #[arg(long, value_name = "env:NAME|file:PATH|credential:NAME")]
    stripe_api_key: Option<String>,
    /// Where the `stripe` source's Stripe API is. [default: https://api.stripe.com]
    #[arg(long)]
    stripe_api_base: Option<String>,
    /// Seconds the `stripe` source's signed timestamps may be old (or ahead); 0 turns the
    /// check off. [default: 300]
    #[arg(long)]
    tolerance: Option<u64>,
    /// Largest accepted body in bytes. [default: 1048576]
    #[arg(long)]
    max_body: Option<usize>,
    /// Bytes of request bodies held in memory at once, across all requests; beyond it a
    /// request gets a 503. [default: 33554432]
    #[arg(long)]
    max_body_in_flight: Option<usize>,
    /// Seconds a client has to send its headers and its body. [default: 10]
    #[arg(long)]
    read_timeout: Option<u64>,
    /// Open connections beyond this are refused with a 503. [default: 1024]
    #[arg(long)]
    max_connections: Option<usize>,
    /// Credits granted per paid invoice by the stripe-billing handler. [default: 100]
    #[arg(long)]
    credits_per_invoice: Option<i64>,
    /// Most events per transaction (1 = one fsync per event, for comparison). [default: 256]
    #[arg(long)]
    batch_max: Option<usize>,
    /// Events waiting for the writer beyond this get a 503. [default: 512]
    #[arg(long)]
    queue_depth: Option<usize>,
    /// Milliseconds a write waits for another process's lock on the database before the
    /// request gets a 503. [default: 5000]
    #[arg(long)]
    busy_timeout_ms: Option<u64>,
    /// PostgreSQL: how long an instance holds the due outbox rows it took while it attempts
    /// them; another instance takes rows whose lease lapsed (e.g. 30s, 5m). [default: 5m]
    #[arg(long, value_parser = config::parse_duration)]
    outbox_lease: Option<Duration>,
    /// The payload bytes the outbox worker holds at once across all kinds; attempts wait for
    /// room. [default: 67108864 (64 MiB)]
    #[arg(long)]
    outbox_payload_budget: Option<usize>,
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
    /// Days the ledger remembers events (their claims), at least 3, Stripe's retry window, or
    /// `never`. [default: 400]
    #[arg(long, alias = "claim-days", value_parser = crate::config::parse_days)]
    retention_days: Option<u64>,
    /// Days the ledger keeps events' payloads (then cleared; the claim stays), or `never`.
    /// [default: 30]
    #[arg(long, value_parser = crate::config::parse_days)]
    payload_days: Option<u64>,
}

/// Sets `field` to the flag's value when the flag was given.
fn set<T>(field: &mut T, flag: Option<T>) {
    if let Some(value) = flag {
        *field = value;
    }
}

/// The config keys that given flags set, each with the flag (or its environment variable)
/// that set it: an error about one of those keys names the flag too.
#[derive(Debug, Default)]
struct FromFlags(Vec<(String, &'static str)>);

impl FromFlags {
    /// `err` as `serve` shows it: a config error about a key that a flag set names the flag
    /// first, `--forward-to (forward.url): not a URL (…)`; any other error is as it is.
    fn explain(&self, err: Error) -> anyhow::Error {
        if let Error::Config { key, message } = &err {
            if let Some((_, flag)) = self.0.iter().find(|(k, _)| k == key) {
                return super::common::flag_error(flag, key, message);
            }
        }
        err.into()
    }
}

impl ServeArgs {
    /// The config: the file's (or the defaults), with each given flag over it; and which
    /// keys the flags set.
    fn config(self) -> anyhow::Result<(Config, FromFlags)> {
        let file = self.config.clone();
        let config = match &file {
            Some(path) => Config::load(path).map_err(|e| match e {
                Error::Config { .. } => {
                    anyhow::Error::from(e).context(format!("config file {}", path.display()))
                }
                other => other.into(),
            })?,
            None => Config::default(),
        };
        let flags = self.keys_set();
        Ok((self.overlay(config, file.is_some())?, flags))
    }

    /// The config keys the given flags set.
    fn keys_set(&self) -> FromFlags {
        let stripe = |field: &str| config::source_key("stripe", field);
        let stripe_secret = if self.stripe_secret_file.is_some() {
            "--stripe-secret-file"
        } else if from_environment(&self.stripe_secret, "STRIPE_WEBHOOK_SECRET") {
            "STRIPE_WEBHOOK_SECRET"
        } else {
            "--stripe-secret"
        };
        let given = [
            ("listen".into(), "--listen", self.listen.is_some()),
            (
                "admin_listen".into(),
                "--admin-listen",
                self.admin_listen.is_some(),
            ),
            (
                "admin_token".into(),
                "--admin-token",
                self.admin_token.is_some(),
            ),
            ("database".into(), "--db", self.db.is_some()),
            (
                "otlp_endpoint".into(),
                "--otlp-endpoint",
                self.otlp_endpoint.is_some(),
            ),
            (
                "http.max_body".into(),
                "--max-body",
                self.max_body.is_some(),
            ),
            (
                "http.body_budget".into(),
                "--max-body-in-flight",
                self.max_body_in_flight.is_some(),
            ),
            (
                "http.read_timeout".into(),
                "--read-timeout",
                self.read_timeout.is_some(),
            ),
            (
                "http.max_connections".into(),
                "--max-connections",
                self.max_connections.is_some(),
            ),
            (
                "storage.busy_timeout".into(),
                "--busy-timeout-ms",
                self.busy_timeout_ms.is_some(),
            ),
            (
                "storage.outbox_lease".into(),
                "--outbox-lease",
                self.outbox_lease.is_some(),
            ),
            (
                "storage.outbox_payload_budget".into(),
                "--outbox-payload-budget",
                self.outbox_payload_budget.is_some(),
            ),
            (
                "writer.batch_max".into(),
                "--batch-max",
                self.batch_max.is_some(),
            ),
            (
                "writer.queue_depth".into(),
                "--queue-depth",
                self.queue_depth.is_some(),
            ),
            (
                "stripe_billing".into(),
                "--credits-per-invoice",
                self.credits_per_invoice.is_some(),
            ),
            (
                "retention.claim_days".into(),
                "--retention-days",
                self.retention_days.is_some(),
            ),
            (
                "retention.payload_days".into(),
                "--payload-days",
                self.payload_days.is_some(),
            ),
            (
                "forward.url".into(),
                "--forward-to",
                self.forward_to.is_some(),
            ),
            (
                "forward.schedule".into(),
                "--forward-schedule",
                !self.forward_schedule.is_empty(),
            ),
            (
                "forward.timeout".into(),
                "--forward-timeout",
                self.forward_timeout.is_some(),
            ),
            (
                stripe("secrets"),
                stripe_secret,
                self.stripe_secret.is_some() || self.stripe_secret_file.is_some(),
            ),
            (stripe("tolerance"), "--tolerance", self.tolerance.is_some()),
            (
                stripe("api_key"),
                "--stripe-api-key",
                self.stripe_api_key.is_some(),
            ),
            (
                stripe("api_base"),
                "--stripe-api-base",
                self.stripe_api_base.is_some(),
            ),
        ];
        FromFlags(
            given
                .into_iter()
                .filter(|(_, _, given)| *given)
                .map(|(key, flag, _)| (key, flag))
                .collect(),
        )
    }

    /// The given flags over `config`.
    fn overlay(self, mut config: Config, from_file: bool) -> anyhow::Result<Config> {
        set(&mut config.listen, self.listen);
        set(&mut config.admin_listen, self.admin_listen.map(|a| a.0));
        if let Some(token) = &self.admin_token {
            config.admin_token = Some(super::common::secret_flag("--admin-token", token)?);
        }
        set(&mut config.database, self.db);
        if let Some(endpoint) = self.otlp_endpoint {
            config.otlp_endpoint = Some(endpoint);
        }
        set(&mut config.http.max_body, self.max_body);
        set(&mut config.http.body_budget, self.max_body_in_flight);
        set(
            &mut config.http.read_timeout,
            self.read_timeout.map(|s| Duration::from_secs(s.max(1))),
        );
        set(&mut config.http.max_connections, self.max_connections);
        set(
            &mut config.storage.busy_timeout,
            self.busy_timeout_ms.map(Duration::from_millis),
        );
        set(&mut config.storage.outbox_lease, self.outbox_lease);
        set(
            &mut config.storage.outbox_payload_budget,
            self.outbox_payload_budget,
        );
        set(&mut config.writer.batch_max, self.batch_max);
        set(&mut config.writer.queue_depth, self.queue_depth);
        if let Some(credits) = self.credits_per_invoice {
            config.stripe_billing.set("credits_per_invoice", credits)?;
        }
        set(&mut config.retention.claim_days, self.retention_days);
        set(&mut config.retention.payload_days, self.payload_days);
        if self.retention_days.is_some() && self.payload_days.is_none() {
            // A claim age given below the payload age shortens the payload age with it.
            config.retention.payload_days = config
                .retention
                .payload_days
                .min(config.retention.claim_days);
        }
        let from_env = from_environment(&self.stripe_secret, "STRIPE_WEBHOOK_SECRET");
        let stripe_secrets = match secret_source(
            self.stripe_secret.as_deref(),
            self.stripe_secret_file.as_deref(),
            (
                "--stripe-secret",
                "STRIPE_WEBHOOK_SECRET",
                "--stripe-secret-file",
            ),
        )? {
            Some(SecretFrom::Value(list)) => Some((config::parse_secret_list(list), from_env)),
            Some(SecretFrom::File(file)) => Some((read_secret_file(file)?, false)),
            None => None,
        };
        overlay_stripe(&mut config, stripe_secrets, self.tolerance, from_file)?;
        if self.stripe_api_key.is_some() || self.stripe_api_base.is_some() {
            let Some(source) = config.source_mut("stripe") else {
                bail!(
                    "--stripe-api-key and --stripe-api-base apply to the source named `stripe`, \
                     and there is none"
                );
            };
            if let Some(reference) = &self.stripe_api_key {
                source.api_key = Some(super::common::secret_flag("--stripe-api-key", reference)?);
            }
            if let Some(base) = &self.stripe_api_base {
                source.api_base = Some(base.clone());
            }
        }
        let secret = secret_source(
            self.forward_secret.as_deref(),
            self.forward_secret_file.as_deref(),
            (
                "--forward-secret",
                "HOOKLEDGER_FORWARD_SECRET",
                "--forward-secret-file",
            ),
        )?;
        // As for Stripe: with a file that forwards, the environment counts only through it.
        let secret_from_env = from_environment(&self.forward_secret, "HOOKLEDGER_FORWARD_SECRET");
        let secret = secret.filter(|_| !(secret_from_env && config.forward.is_some()));
        let Some(url) = self.forward_to else {
            // Forwarding flags without a target would be silently ignored (unless the file
            // forwards: then they adjust it).
            if let Some(forward) = &mut config.forward {
                if let Some(secret) = secret {
                    forward.secret = Secret::new(read_forward_secret(secret)?);
                }
                if !self.forward_schedule.is_empty() {
                    forward.schedule = self.forward_schedule;
                }
                set(&mut forward.timeout, self.forward_timeout);
                return Ok(config);
            }
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
        let from_file = config.forward.take();
        let secret = match (secret, &from_file) {
            (Some(secret), _) => Secret::new(read_forward_secret(secret)?),
            (None, Some(file)) => file.secret.clone(),
            (None, None) => bail!(
                "--forward-to needs a signing secret: --forward-secret, --forward-secret-file or \
                 HOOKLEDGER_FORWARD_SECRET (make one with: hookledger gen-secret)"
            ),
        };
        // The flags over the file's `[forward]`: its lane keys stay as the file has them.
        let file = from_file.unwrap_or_else(|| ForwardConfig::new(url.clone(), secret.clone()));
        config.forward = Some(ForwardConfig {
            url,
            secret,
            schedule: match self.forward_schedule.is_empty() {
                false => self.forward_schedule,
                true => file.schedule.clone(),
            },
            timeout: self.forward_timeout.unwrap_or(file.timeout),
            ..file
        });
        Ok(config)
    }
}

/// The Stripe flags over `config`: the secrets and the tolerance of the source named `stripe`
/// (which must have scheme stripe). Without a config file they make that source (the quick
/// start: `stripe` with the `stripe-billing` handler). With one, `STRIPE_WEBHOOK_SECRET` from
/// the environment counts only where the file names it (`env:STRIPE_WEBHOOK_SECRET`): only
/// the flags override the file.
fn overlay_stripe(
    config: &mut Config,
    secrets: Option<(Vec<Secret>, bool)>,
    tolerance: Option<u64>,
    from_file: bool,
) -> anyhow::Result<()> {
    let secrets = match secrets {
        Some((_, from_env)) if from_file && from_env => None,
        Some((secrets, _)) => Some(secrets),
        None => None,
    };
    for secret in secrets.iter().flatten() {
        config::check_secret(secret.expose()).map_err(|why| {
            anyhow::anyhow!(
                "Stripe signing secret (STRIPE_WEBHOOK_SECRET, --stripe-secret or \
                 --stripe-secret-file) refused: {why}"
            )
        })?;
    }
    if config.source_mut("stripe").is_none() {
        match &secrets {
            Some(secrets) if !from_file => {
                config.sources.push(SourceConfig::stripe(secrets.clone()))
            }
            Some(_) => bail!(
                "--stripe-secret / --stripe-secret-file: the config file has no source named \
                 `stripe` to give it to"
            ),
            None if tolerance.is_some() => {
                bail!("--tolerance applies to the source named `stripe`, and there is none")
            }
            None => return Ok(()),
        }
    }
    let source = config.source_mut("stripe").expect("found or made above");
    if source.scheme != SchemeName::Stripe && (secrets.is_some() || tolerance.is_some()) {
        bail!(
            "--stripe-secret, --stripe-secret-file and --tolerance apply to a source named \
             `stripe` with scheme stripe; the config file's has scheme {}",
            source.scheme.as_str()
        );
    }
    if let Some(secrets) = secrets {
        source.secrets = secrets;
    }
    if let Some(tolerance) = tolerance {
        source.tolerance = Some(Duration::from_secs(tolerance));
    }
    Ok(())
}

/// The forwarding secret from a flag, the environment or a file (exactly one in a file).
fn read_forward_secret(from: SecretFrom<'_>) -> anyhow::Result<String> {
    match from {
        SecretFrom::Value(secret) => Ok(secret.trim().to_string()),
        SecretFrom::File(file) => match read_secret_file(file)?.as_slice() {
            [one] => Ok(one.expose().to_string()),
            _ => bail!(
                "--forward-secret-file {} must hold exactly one secret",
                file.display()
            ),
        },
    }
}

/// `--admin-listen`: an address, or `off` (a type of its own: clap reads `Option<Option<_>>`
/// as a flag with an optional value).
#[derive(Debug, Clone, Copy)]
struct AdminListen(Option<SocketAddr>);

fn admin_listen(value: &str) -> Result<AdminListen, String> {
    config::parse_admin_listen(value).map(AdminListen)
}

/// Runs `serve`: the flags over the defaults, then open, listen and serve until a signal.
pub(super) fn run(args: ServeArgs, log_format: super::LogFormat) -> anyhow::Result<Exit> {
    let sha256 = file_sha256(args.config.as_deref())?;
    let (config, flags) = args.clone().config()?;
    if config.sources.is_empty() {
        bail!(
            "no source to receive from: set STRIPE_WEBHOOK_SECRET=whsec_... (comma-separated \
             during rotation) or pass --stripe-secret / --stripe-secret-file for Stripe, or \
             --config hookledger.toml with [[source]] entries"
        );
    }
    for source in &config.sources {
        if source.tolerance == Some(Duration::ZERO) {
            log::warn!(
                "source {}: tolerance 0: signature timestamps are not checked; captured \
                 requests can be replayed",
                source.name
            );
        }
    }

    // Sockets passed as systemd passes them (socket activation, or our own restart) win over
    // `listen` and `admin_listen`; read before anything is opened, so a bad one stops here.
    let passed = super::listeners::passed()?;
    let mut config = config;
    if let Some(webhook) = &passed.webhook {
        config.listen = webhook
            .local_addr()
            .context("the webhook socket of LISTEN_FDS")?;
    }
    if let Some(admin) = &passed.admin {
        let at = admin
            .local_addr()
            .context("the admin socket of LISTEN_FDS")?;
        if !at.ip().is_loopback() && config.admin_token.is_none() {
            bail!(
                "the admin socket passed in LISTEN_FDS is on {at}, not a loopback address: set \
                 admin_token too (env:NAME or file:PATH), since /metrics and /status show event \
                 ids and errors to whoever reaches them, or listen on 127.0.0.1"
            );
        }
        config.admin_listen = Some(at);
    }

    let hookledger = Hookledger::open(config.clone()).map_err(|e| flags.explain(e))?;
    let hookledger_admin = hookledger.admin_router();
    let reloader = hookledger.reloader();
    reloader.loaded_from(sha256);
    let read_again = ReadAgain {
        args,
        listen: passed.webhook.is_some().then_some(config.listen),
        admin_listen: passed
            .admin
            .is_some()
            .then_some(config.admin_listen)
            .flatten(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let restart = runtime.block_on(async {
        let listener = match passed.webhook {
            Some(passed) => from_std(passed)?,
            None => tokio::net::TcpListener::bind(config.listen)
                .await
                .with_context(|| format!("cannot listen on {}", config.listen))?,
        };
        let addr = listener.local_addr()?;
        // Signals are handled from before the address is announced: a SIGTERM sent as soon as
        // it is seen still stops the server gracefully.
        let stop = stop_signal(reloader, read_again)?;
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            listen = %addr,
            sources = config.sources.len(),
            traces = config.otlp_endpoint.is_some(),
            "hookledger {} starting",
            env!("CARGO_PKG_VERSION")
        );
        for source in &config.sources {
            tracing::info!(
                source = %source.name,
                scheme = source.scheme.as_str(),
                secrets = source.secrets.len(),
                "listening on http://{addr}/webhooks/{} ({}, {} secret(s))",
                source.name,
                source.scheme.as_str(),
                source.secrets.len()
            );
        }
        let admin = match (passed.admin, config.admin_listen) {
            (Some(passed), _) => Some(from_std(passed)?),
            (None, Some(at)) => Some(
                tokio::net::TcpListener::bind(at)
                    .await
                    .with_context(|| format!("cannot listen on {at} (--admin-listen)"))?,
            ),
            (None, None) => None,
        };
        // Copies of the listening sockets, kept open through a restart's drain so that the
        // connections arriving meanwhile wait in the queue for the next process.
        // A stop that is not a restart closes them at once (new connections are refused, as
        // when nothing listens).
        let held = std::sync::Arc::new(std::sync::Mutex::new(Some(Held::of(
            &listener,
            admin.as_ref(),
        )?)));
        log::info!("database {}", config.database);
        // Machine-readable lines for scripts and tests that start us on port 0 (JSON with
        // `--log-format json`, so that every line we print is).
        // Written, not `println!`: a stdout nobody reads any more (the starter read the first
        // lines and closed its pipe, then a restart in place prints them again) must not stop
        // the server.
        let json = log_format == super::LogFormat::Json;
        let print = |key: &str, at: SocketAddr| {
            use std::io::Write as _;
            let line = match json {
                true => serde_json::json!({ key: at.to_string() }).to_string(),
                false if key == "listen" => format!("hookledger listening on {at}"),
                false => format!("hookledger {key} on {at}"),
            };
            let mut out = std::io::stdout().lock();
            if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
                log::warn!("cannot print the address to stdout ({e}): {line}");
            }
        };
        print("listen", addr);
        if let Some(admin) = admin {
            let at = admin.local_addr()?;
            log::info!("admin on http://{at}/ (healthz, readyz, metrics, status)");
            print("admin", at);
            let http = config.http.clone();
            tokio::spawn(async move {
                crate::http::server::serve_admin(admin, hookledger_admin, &http).await;
            });
        }
        let (stopped, mut how) = tokio::sync::oneshot::channel();
        let keep = held.clone();
        let shutdown = async move {
            let signal = stop.await;
            if signal == Stop::Exit {
                drop(keep.lock().map(|mut held| held.take()));
            }
            let _ = stopped.send(signal);
        };
        hookledger.serve(listener, shutdown).await?;
        let held = held.lock().ok().and_then(|mut held| held.take());
        anyhow::Ok(held.filter(|_| how.try_recv() == Ok(Stop::Restart)))
    })?;
    if let Some(held) = restart {
        // Nothing of this process runs on: the exec ends its threads, and the held sockets
        // are the new one's.
        runtime.shutdown_timeout(Duration::from_secs(1));
        return Err(super::listeners::restart_in_place(held.webhook, held.admin));
    }
    Ok(Exit::Ok)
}

/// A passed listening socket, for tokio.
fn from_std(listener: std::net::TcpListener) -> anyhow::Result<tokio::net::TcpListener> {
    listener.set_nonblocking(true)?;
    Ok(tokio::net::TcpListener::from_std(listener)?)
}

/// Duplicates of the listening sockets, for [`super::listeners::restart_in_place`].
struct Held {
    webhook: std::net::TcpListener,
    admin: Option<std::net::TcpListener>,
}

impl Held {
    fn of(
        webhook: &tokio::net::TcpListener,
        admin: Option<&tokio::net::TcpListener>,
    ) -> anyhow::Result<Held> {
        use std::os::fd::AsFd;
        let copy = |l: &tokio::net::TcpListener| -> anyhow::Result<std::net::TcpListener> {
            let fd = l
                .as_fd()
                .try_clone_to_owned()
                .context("duplicating a listening socket")?;
            Ok(std::net::TcpListener::from(fd))
        };
        Ok(Held {
            webhook: copy(webhook)?,
            admin: admin.map(copy).transpose()?,
        })
    }
}

/// How a stop was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// SIGTERM or SIGINT: drain and exit.
    Exit,
    /// SIGUSR2, or a SIGHUP whose new config changes what only a start reads: drain, then
    /// run the same command line again in place, on the same listening sockets (held open
    /// meanwhile: no connection is refused).
    Restart,
}

/// What a SIGHUP reads again: the config file with the flags over it, as at start, and the
/// addresses of the sockets passed in (they win over the file's, as at start).
struct ReadAgain {
    args: ServeArgs,
    listen: Option<SocketAddr>,
    admin_listen: Option<SocketAddr>,
}

impl ReadAgain {
    /// The config as a start now would read it, and the hash of its file.
    fn read(&self) -> anyhow::Result<(Config, Option<String>)> {
        let sha256 = file_sha256(self.args.config.as_deref())?;
        let (mut config, flags) = self.args.clone().config()?;
        if let Some(at) = self.listen {
            config.listen = at;
        }
        if self.admin_listen.is_some() {
            config.admin_listen = self.admin_listen;
        }
        // A flag's error names the flag, as at start (checked here for that; the reload
        // checks again).
        config.validate().map_err(|e| flags.explain(e.into()))?;
        Ok((config, sha256))
    }

    /// Reads the config again and applies it: `Some(Stop::Restart)` when it changes what
    /// only a start reads. A refusal is logged with its key; the running config serves on.
    fn reload(&self, reloader: &crate::app::Reloader) -> Option<Stop> {
        let refused = |err: anyhow::Error| {
            tracing::error!(
                "reload refused: {err:#}; the running config keeps serving (fix the file and \
                 send SIGHUP again)"
            );
        };
        let (config, sha256) = match self.read() {
            Ok(read) => read,
            Err(err) => {
                reloader.refused();
                refused(err);
                return None;
            }
        };
        match reloader.reload(config, sha256) {
            Ok(crate::app::Reloaded::Unchanged) => {
                log::info!("reload: the config is unchanged");
                None
            }
            Ok(crate::app::Reloaded::Swapped {
                added,
                removed,
                changed,
            }) => {
                log::info!(
                    "reload: sources swapped in place (added: [{}], removed: [{}], changed: \
                     [{}]); the requests in flight finish on the config they began with",
                    added.join(", "),
                    removed.join(", "),
                    changed.join(", ")
                );
                None
            }
            Ok(crate::app::Reloaded::NeedsRestart(keys)) => {
                log::info!(
                    "reload: {} changed, which only a start reads: restarting in place on the \
                     same sockets (no connection is refused)",
                    keys.join(", ")
                );
                Some(Stop::Restart)
            }
            Err(err) => {
                refused(anyhow::Error::from(err));
                None
            }
        }
    }
}

/// The SHA-256 of the config file, in hex, for `/status` (none without a file).
fn file_sha256(path: Option<&Path>) -> anyhow::Result<Option<String>> {
    use sha2::{Digest, Sha256};
    let Some(path) = path else { return Ok(None) };
    let bytes = std::fs::read(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    Ok(Some(hex::encode(Sha256::digest(bytes))))
}

/// A future that resolves on the first stop signal, and applies each SIGHUP meanwhile (a
/// reload: on a thread of its own, one at a time; a SIGHUP during one runs it again after
/// it, so the last file written is the one read). The handlers are installed here, before
/// serving, so a failure to install them stops start-up (exit 2) instead of a panic.
fn stop_signal(
    reloader: crate::app::Reloader,
    read_again: ReadAgain,
) -> anyhow::Result<impl std::future::Future<Output = Stop>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let mut restart =
        signal(SignalKind::user_defined2()).context("installing the SIGUSR2 handler")?;
    let read_again = std::sync::Arc::new(read_again);
    let start = move || {
        log::info!("SIGHUP: reading the config again");
        let (reloader, read_again) = (reloader.clone(), read_again.clone());
        Some(tokio::task::spawn_blocking(move || {
            read_again.reload(&reloader)
        }))
    };
    Ok(async move {
        let mut running: Option<tokio::task::JoinHandle<Option<Stop>>> = None;
        let mut again = false;
        let stop = loop {
            let reloading = async {
                match running.as_mut() {
                    Some(reload) => reload.await.ok().flatten(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break Stop::Exit,
                _ = term.recv() => break Stop::Exit,
                _ = restart.recv() => break Stop::Restart,
                _ = hangup.recv() => {
                    if running.is_some() {
                        log::info!(
                            "SIGHUP: a reload is running; it runs again once this one ends"
                        );
                        again = true;
                        continue;
                    }
                    running = start();
                }
                outcome = reloading => {
                    running = None;
                    if let Some(stop) = outcome {
                        break stop;
                    }
                    if std::mem::take(&mut again) {
                        running = start();
                    }
                }
            }
        };
        match stop {
            Stop::Exit => log::info!("shutdown signal received"),
            Stop::Restart => log::info!(
                "restart: finishing the requests in flight, then starting again on the same \
                 sockets"
            ),
        }
        stop
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

#[cfg(test)]
mod tests {
    use super::*;

    fn file_config(text: &str) -> Config {
        let mut config: Config = toml::from_str(text).unwrap();
        for source in &mut config.sources {
            source.resolve_secrets(Path::new(".")).unwrap();
        }
        config
    }

    const STRIPE_FILE: &str = r#"
        [[source]]
        name = "stripe"
        scheme = "stripe"
        secrets = ["whsec_from_the_file_1", "whsec_from_the_file_2"]
    "#;

    fn secrets(config: &mut Config) -> Vec<String> {
        let source = config.source_mut("stripe").unwrap();
        source
            .secrets
            .iter()
            .map(|s| s.expose().to_string())
            .collect()
    }

    #[test]
    fn with_a_config_file_the_environment_does_not_replace_the_file_s_stripe_secrets() {
        let mut config = file_config(STRIPE_FILE);
        let env = Some((vec![Secret::new("whsec_from_the_environment")], true));
        overlay_stripe(&mut config, env, None, true).unwrap();
        assert_eq!(
            secrets(&mut config),
            ["whsec_from_the_file_1", "whsec_from_the_file_2"]
        );
        // A flag does.
        let flag = Some((vec![Secret::new("whsec_from_the_flag_0")], false));
        overlay_stripe(&mut config, flag, Some(60), true).unwrap();
        assert_eq!(secrets(&mut config), ["whsec_from_the_flag_0"]);
        let tolerance = config.source_mut("stripe").unwrap().tolerance;
        assert_eq!(tolerance, Some(Duration::from_secs(60)));
    }

    #[test]
    fn without_a_config_file_the_environment_makes_the_quick_start_source() {
        let mut config = Config::default();
        let env = Some((vec![Secret::new("whsec_from_the_environment")], true));
        overlay_stripe(&mut config, env, Some(0), false).unwrap();
        assert_eq!(config.sources.len(), 1);
        assert_eq!(config.sources[0].handlers, ["stripe-billing"]);
        assert_eq!(config.sources[0].tolerance, Some(Duration::ZERO));
    }

    /// `serve` with `args`, through clap as from the command line.
    fn parsed(args: &[&str]) -> ServeArgs {
        #[derive(clap::Parser)]
        struct Serve {
            #[command(flatten)]
            args: ServeArgs,
        }
        <Serve as clap::Parser>::try_parse_from(
            std::iter::once("serve").chain(args.iter().copied()),
        )
        .unwrap()
        .args
    }

    /// The message `serve` stops with for `args`, or `None` when the config is valid.
    fn refusal(args: &[&str], file: Option<&str>) -> Option<String> {
        let args = parsed(args);
        let flags = args.keys_set();
        let config = match file {
            Some(text) => Config::parse(text, Path::new("."), &[]).unwrap(),
            None => Config::default(),
        };
        let config = args.overlay(config, file.is_some()).unwrap();
        let err = config.validate().err()?;
        Some(flags.explain(Error::from(err)).to_string())
    }

    #[test]
    fn an_error_about_a_key_a_flag_set_names_the_flag() {
        let secret = ["--stripe-secret", "whsec_from_the_flag_0"];
        let err = refusal(
            &[
                &secret[..],
                &["--max-body", "4096", "--max-body-in-flight", "1024"],
            ]
            .concat(),
            None,
        );
        assert_eq!(
            err.as_deref(),
            Some(
                "--max-body-in-flight (http.body_budget): must be at least http.max_body, or no \
                 body of the largest size could ever be read"
            )
        );
        let err = refusal(
            &[
                &secret[..],
                &["--forward-to", "ftp://app/hooks"],
                &["--forward-secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
            ]
            .concat(),
            None,
        )
        .unwrap();
        assert!(
            err.starts_with("--forward-to (forward.url): must be an http:// or https:// URL"),
            "{err}"
        );
        // The same setting from the config file: the key alone.
        let file = "[http]\nmax_body = 4096\nbody_budget = 1024\n[[source]]\nname = \"gh\"\n\
                    scheme = \"github\"\nsecrets = [\"gh_literal_secret_123\"]\n";
        let err = refusal(&[], Some(file)).unwrap();
        assert!(
            err.starts_with("http.body_budget: must be at least http.max_body")
                && !err.contains("1024"),
            "{err}"
        );
        // A flag names only its own key: here the file's value is at fault.
        let err = refusal(&["--max-body", "4096"], Some(file)).unwrap();
        assert!(err.starts_with("http.body_budget: must"), "{err}");
        let err = refusal(&[&secret[..], &["--tolerance", "5"]].concat(), None);
        assert_eq!(err, None);
    }

    #[test]
    fn a_stripe_flag_for_a_source_of_another_scheme_or_none_is_refused() {
        let mut config = file_config(
            r#"
            [[source]]
            name = "stripe"
            scheme = "github"
            secrets = ["github_secret_12"]
            "#,
        );
        let flag = Some((vec![Secret::new("whsec_from_the_flag_0")], false));
        let err = overlay_stripe(&mut config, flag.clone(), None, true).unwrap_err();
        assert!(err.to_string().contains("scheme github"), "{err}");
        let mut config = file_config(
            &STRIPE_FILE.replace("\"stripe\"\n        scheme", "\"billing\"\n        scheme"),
        );
        let err = overlay_stripe(&mut config, flag, None, true).unwrap_err();
        assert!(
            err.to_string().contains("no source named `stripe`"),
            "{err}"
        );
    }
}

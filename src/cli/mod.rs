//! The command line: one `match` on the subcommand, each arm a call into the library.

pub mod admin;
pub mod table;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};

use crate::cli::admin as inspect;
use crate::config::{self, Config, ForwardConfig};
use crate::dev::client::Client;
use crate::http::server::Hookledger;
use crate::source::standard::SigningKey;
use crate::source::Secret;
use crate::store::sqlite as db;

#[derive(Debug, Parser)]
#[command(
    name = "hookledger",
    version,
    about = "Webhooks that change your data exactly once, on one SQLite file."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Receive webhooks on POST /webhooks/stripe.
    Serve(ServeArgs),
    /// Sign a file's raw bytes as Stripe does and POST them (the local dev loop).
    Send(SendArgs),
    /// Show the pattern working: a failure, a retry, concurrent duplicates, out-of-order events.
    Demo,
    /// Inspect and revive outbox rows (deliveries to the app).
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Inspect the ledger of received events.
    #[command(subcommand)]
    Events(EventsCommand),
    /// Forward a stored event to the app again (e.g. after the app fixed a bug).
    Replay {
        event_id: String,
        #[command(flatten)]
        db: DbArg,
    },
    /// Delete ledger rows older than the retention age and delivered outbox rows older than
    /// a week, once, and print what was deleted.
    Prune {
        #[arg(long, default_value_t = config::DEFAULT_RETENTION_DAYS)]
        retention_days: u64,
        #[command(flatten)]
        db: DbArg,
    },
    /// Print a new random forwarding secret (whsec_<base64>).
    GenSecret,
    /// Send pre-signed realistic events to a running hookledger and report throughput and
    /// latency; with --db, check the ledger holds exactly the events that got a 200.
    Loadgen(LoadgenArgs),
    /// Measure shipped vs one-event-per-transaction vs the raw SQLite ceiling, in one run.
    Bench {
        /// Requests per measurement at C >= 16 (a fifth at C = 1).
        #[arg(long, default_value_t = 60_000)]
        requests: usize,
        /// Where the databases go: the disk being measured.
        #[arg(long, default_value = "./target/bench")]
        dir: PathBuf,
        /// Instead: latency of normal events under 200 idle and 50 slow-body connections.
        #[arg(long)]
        hostile: bool,
    },
}

#[derive(Debug, Args)]
pub struct LoadgenArgs {
    /// The server's address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Requests in total (new events plus resends).
    #[arg(long, default_value_t = 20_000)]
    pub requests: usize,
    /// Keep-alive connections sending at once.
    #[arg(long, short = 'c', default_value_t = 64)]
    pub connections: usize,
    /// Share of requests that resend an earlier event, 0.0 to 1.0.
    #[arg(long, default_value_t = 0.2)]
    pub resend: f64,
    /// The server's signing secret.
    #[arg(long, env = "STRIPE_WEBHOOK_SECRET", hide_env_values = true)]
    pub secret: String,
    /// The server's database file, for the ledger check.
    #[arg(long)]
    pub db: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Debug, Args)]
pub struct DbArg {
    /// SQLite database file.
    #[arg(long, default_value = "./hookledger.db")]
    pub db: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// List outbox rows.
    List {
        #[arg(long, value_parser = ["pending", "done", "dead"])]
        status: Option<String>,
        /// JSON for scripts.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArg,
    },
    /// Put a dead row (or every dead row) back to pending with a fresh schedule.
    Retry {
        #[arg(required_unless_present = "all_dead", conflicts_with = "all_dead")]
        id: Option<i64>,
        #[arg(long)]
        all_dead: bool,
        #[command(flatten)]
        db: DbArg,
    },
}

#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// List received events, newest first.
    List {
        /// Only events received within this long (e.g. 30m, 2h, 7d).
        #[arg(long, value_parser = config::parse_duration)]
        since: Option<Duration>,
        /// Only events of this type.
        #[arg(long = "type")]
        kind: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArg,
    },
    /// Show one event with its payload, pretty-printed.
    Show {
        event_id: String,
        #[command(flatten)]
        db: DbArg,
    },
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// SQLite database file, created on first start.
    #[arg(long, default_value = "./hookledger.db")]
    pub db: PathBuf,
    /// Stripe signing secret(s), comma-separated during rotation.
    #[arg(long, env = "STRIPE_WEBHOOK_SECRET", hide_env_values = true)]
    pub stripe_secret: Option<String>,
    /// Read the signing secret(s) from a file (one per line or comma-separated), keeping them
    /// out of argv and the environment.
    #[arg(long, conflicts_with = "stripe_secret")]
    pub stripe_secret_file: Option<PathBuf>,
    /// Seconds a signature's timestamp may be old (or ahead); 0 turns the check off.
    #[arg(long, default_value_t = crate::source::stripe::DEFAULT_TOLERANCE_SECS)]
    pub tolerance: u64,
    /// Largest accepted body in bytes.
    #[arg(long, default_value_t = config::DEFAULT_MAX_BODY)]
    pub max_body: usize,
    /// Seconds a client has to send its headers and its body.
    #[arg(long, default_value_t = config::DEFAULT_READ_TIMEOUT.as_secs())]
    pub read_timeout: u64,
    /// Open connections beyond this are refused with a 503.
    #[arg(long, default_value_t = config::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Credits granted per paid invoice.
    #[arg(long, default_value_t = config::DEFAULT_CREDITS_PER_INVOICE)]
    pub credits_per_invoice: i64,
    /// Most events per transaction (1 = one fsync per event, for comparison).
    #[arg(long, default_value_t = crate::writer::DEFAULT_BATCH_MAX)]
    pub batch_max: usize,
    /// Events waiting for the writer beyond this get a 503.
    #[arg(long, default_value_t = crate::writer::DEFAULT_QUEUE_DEPTH)]
    pub queue_depth: usize,
    /// Milliseconds a write waits for another process's lock on the database before the
    /// request gets a 503.
    #[arg(long, default_value_t = crate::store::sqlite::DEFAULT_BUSY_TIMEOUT.as_millis() as u64)]
    pub busy_timeout_ms: u64,
    /// Forward every processed event to this URL (the app), signed with Standard Webhooks.
    #[arg(long)]
    pub forward_to: Option<String>,
    /// The forwarding secret (whsec_<base64>; `hookledger gen-secret` makes one).
    #[arg(long, env = "HOOKLEDGER_FORWARD_SECRET", hide_env_values = true)]
    pub forward_secret: Option<String>,
    /// Read the forwarding secret from a file instead.
    #[arg(long, conflicts_with = "forward_secret")]
    pub forward_secret_file: Option<PathBuf>,
    /// Delays between delivery attempts, comma-separated; after the last one a row is dead.
    /// [default: 5s,30s,2m,10m,30m,1h,2h,4h,8h, then 8h up to 3 days]
    #[arg(long, value_delimiter = ',', value_parser = config::parse_duration)]
    pub forward_schedule: Vec<Duration>,
    /// Timeout of one delivery request.
    #[arg(long, value_parser = config::parse_duration, default_value = "10s")]
    pub forward_timeout: Duration,
    /// Days the ledger remembers events (at least 3, Stripe's retry window).
    #[arg(long, default_value_t = config::DEFAULT_RETENTION_DAYS)]
    pub retention_days: u64,
}

#[derive(Debug, Args)]
pub struct SendArgs {
    /// The event file; its bytes are sent exactly as stored.
    pub file: PathBuf,
    /// Where to send it.
    #[arg(long, default_value = "http://127.0.0.1:8080/webhooks/stripe")]
    pub url: String,
    /// Signing secret (default: the first of STRIPE_WEBHOOK_SECRET).
    #[arg(long, env = "STRIPE_WEBHOOK_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
    /// Signature timestamp (default: now).
    #[arg(long)]
    pub timestamp: Option<i64>,
}

/// What `main` turns into an exit code.
pub enum Exit {
    Ok,
    /// The command ran but its result is a failure (e.g. `send` got a non-2xx answer).
    Failed,
}

pub fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Send(args) => send(args),
        Command::Demo => crate::dev::demo::run().map(|()| Exit::Ok),
        Command::Outbox(command) => outbox(command),
        Command::Events(command) => events(command),
        Command::Replay { event_id, db } => {
            inspect::replay(&mut db::open_existing(&db.db)?, &event_id)?;
            println!("event {event_id} queued for forwarding (a `serve --forward-to` delivers it)");
            Ok(Exit::Ok)
        }
        Command::Prune { retention_days, db } => {
            let pruned = inspect::prune(&mut db::open_existing(&db.db)?, retention_days)?;
            println!(
                "deleted {} ledger rows older than {retention_days} days and {} delivered outbox rows older than 7 days",
                pruned.events, pruned.outbox
            );
            Ok(Exit::Ok)
        }
        Command::Loadgen(args) => loadgen(args),
        Command::Bench {
            requests,
            dir,
            hostile,
        } => {
            let exe = std::env::current_exe().context("finding the hookledger binary")?;
            let config = crate::bench::BenchConfig { requests, dir, exe };
            if hostile {
                crate::bench::hostile(&config)?;
            } else {
                crate::bench::run(&config)?;
            }
            Ok(Exit::Ok)
        }
        Command::GenSecret => {
            println!("{}", SigningKey::generate());
            Ok(Exit::Ok)
        }
    }
}

fn loadgen(args: LoadgenArgs) -> anyhow::Result<Exit> {
    use crate::loadgen;
    let secret = config::parse_secret_list(&args.secret)
        .into_iter()
        .next()
        .context("no signing secret")?;
    let workload = loadgen::Workload {
        requests: args.requests,
        resend_share: args.resend.clamp(0.0, 1.0),
        seed: args.seed,
    };
    let requests = loadgen::prepare(&workload, &secret, &args.addr.to_string());
    let report = loadgen::run(args.addr, &requests, args.connections);
    let ms = |p: f64| format!("{:.2}", report.percentile(p).as_secs_f64() * 1000.0);
    println!(
        "{} requests over {} connections in {:.2} s: {:.0} events/s",
        report.requests(),
        args.connections,
        report.elapsed.as_secs_f64(),
        report.per_second()
    );
    println!(
        "latency ms: p50 {} p90 {} p99 {} max {}",
        ms(50.0),
        ms(90.0),
        ms(99.0),
        ms(100.0)
    );
    println!(
        "statuses: {}; processed {}, duplicate {}",
        report.status_summary(),
        report.processed,
        report.duplicates
    );
    let Some(db) = args.db else {
        return Ok(Exit::Ok);
    };
    let check = loadgen::check_ledger(&db, &report)?;
    println!(
        "ledger: {} events; {} acknowledged; lost {}; in the ledger without a 200: {}",
        check.in_ledger, check.acknowledged, check.lost, check.unacknowledged
    );
    Ok(if check.lost == 0 {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

fn outbox(command: OutboxCommand) -> anyhow::Result<Exit> {
    match command {
        OutboxCommand::List { status, json, db } => {
            let rows = inspect::outbox_list(&inspect::open_read(&db.db)?, status.as_deref())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", inspect::render_outbox(&rows));
            }
        }
        OutboxCommand::Retry { id, all_dead, db } => {
            let mut conn = db::open_existing(&db.db)?;
            if all_dead {
                let n = inspect::outbox_retry_all_dead(&mut conn)?;
                println!("{n} dead row(s) back to pending");
            } else if let Some(id) = id {
                inspect::outbox_retry(&mut conn, id)?;
                println!("row {id} back to pending");
            }
        }
    }
    Ok(Exit::Ok)
}

fn events(command: EventsCommand) -> anyhow::Result<Exit> {
    match command {
        EventsCommand::List {
            since,
            kind,
            limit,
            json,
            db,
        } => {
            let since = since.map(|d| crate::unix_now() - d.as_secs() as i64);
            let rows =
                inspect::events_list(&inspect::open_read(&db.db)?, since, kind.as_deref(), limit)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", inspect::render_events(&rows));
            }
        }
        EventsCommand::Show { event_id, db } => {
            let event = inspect::event_show(&inspect::open_read(&db.db)?, &event_id)?;
            println!("{}", serde_json::to_string_pretty(&event)?);
        }
    }
    Ok(Exit::Ok)
}

fn serve(args: ServeArgs) -> anyhow::Result<Exit> {
    let secrets = match (&args.stripe_secret, &args.stripe_secret_file) {
        (_, Some(file)) => read_secret_file(file)?,
        (Some(list), None) => config::parse_secret_list(list),
        (None, None) => Vec::new(),
    };
    let mut config = Config::new(args.db, secrets);
    config.listen = args.listen;
    config.tolerance_secs = args.tolerance;
    config.max_body = args.max_body;
    config.read_timeout = Duration::from_secs(args.read_timeout.max(1));
    config.max_connections = args.max_connections;
    config.credits_per_invoice = args.credits_per_invoice;
    config.batch_max = args.batch_max;
    config.queue_depth = args.queue_depth;
    config.busy_timeout = Duration::from_millis(args.busy_timeout_ms);
    config.retention_days = args.retention_days;
    if let Some(url) = args.forward_to {
        let secret = match (&args.forward_secret, &args.forward_secret_file) {
            (_, Some(file)) => std::fs::read_to_string(file)
                .with_context(|| format!("cannot read forward secret file {}", file.display()))?
                .trim()
                .to_string(),
            (Some(secret), None) => secret.clone(),
            (None, None) => bail!(
                "--forward-to needs a signing secret: --forward-secret, --forward-secret-file or \
                 HOOKLEDGER_FORWARD_SECRET (make one with: hookledger gen-secret)"
            ),
        };
        let key = SigningKey::from_secret(&secret).map_err(anyhow::Error::msg)?;
        config.forward = Some(ForwardConfig {
            url,
            key,
            schedule: if args.forward_schedule.is_empty() {
                crate::delivery::default_schedule()
            } else {
                args.forward_schedule
            },
            timeout: args.forward_timeout,
        });
    }
    if config.tolerance_secs == 0 {
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
            config.db.display(),
            config.stripe_secrets.len()
        );
        // A machine-readable line for scripts and tests that start us on port 0.
        println!("hookledger listening on {addr}");
        hookledger.serve(listener, shutdown_signal()).await
    })?;
    Ok(Exit::Ok)
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    log::info!("shutdown signal received");
}

fn read_secret_file(path: &Path) -> anyhow::Result<Vec<Secret>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read secret file {}", path.display()))?;
    let secrets = config::parse_secret_list(&text.replace(['\n', '\r'], ","));
    if secrets.is_empty() {
        bail!("secret file {} holds no secret", path.display());
    }
    Ok(secrets)
}

fn send(args: SendArgs) -> anyhow::Result<Exit> {
    let secret = args
        .secret
        .as_deref()
        .map(config::parse_secret_list)
        .and_then(|list| list.into_iter().next())
        .context("no signing secret: pass --secret whsec_... or set STRIPE_WEBHOOK_SECRET")?;
    let body = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let timestamp = args.timestamp.unwrap_or_else(crate::unix_now);
    let reply = Client::default()
        .send(&args.url, &body, &secret, timestamp)
        .with_context(|| format!("cannot reach {}", args.url))?;
    println!("{}", reply.status);
    println!("{}", reply.body.trim_end());
    Ok(if (200..300).contains(&reply.status) {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

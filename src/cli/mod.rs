//! The command line: one `match` on the subcommand, each arm a call into the library.

mod admin;
pub(crate) mod demo;
mod reconcile;
pub(crate) mod send;
mod serve;
pub(crate) mod table;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::config;
use crate::config::Database;
use crate::dev::client::Client;
use crate::source::standard::SigningKey;
use crate::store::{self, listings as listing};

#[derive(Debug, Parser)]
#[command(
    name = "hookledger",
    version,
    about = "Webhooks that change your data exactly once, on one SQLite file or on PostgreSQL."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log lines as plain text, or as one JSON object per line (for a log collector).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "plain",
        env = "HOOKLEDGER_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
}

/// How log lines are written (to stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `2026-11-30T09:40:37.730Z INFO  target: message`
    Plain,
    /// `{"ts":"2026-11-30T09:40:37.730Z","level":"INFO","target":"…","message":"…"}`
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Receive webhooks on POST /webhooks/{source} (without a config file: /webhooks/stripe).
    Serve(Box<serve::ServeArgs>),
    /// Sign a file's raw bytes as a provider does and POST them (the local dev loop).
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
        source: SourceArg,
        #[command(flatten)]
        db: DbArg,
    },
    /// Delete ledger rows older than the claim age, clear payloads older than the payload age
    /// and delete delivered outbox rows older than a week, once, and print what was done.
    Prune {
        /// Days the ledger remembers events (their claims).
        #[arg(long, alias = "claim-days", default_value_t = config::DEFAULT_CLAIM_DAYS)]
        retention_days: u64,
        /// Days events keep their payloads (at most the claim age).
        #[arg(long, default_value_t = config::DEFAULT_PAYLOAD_DAYS)]
        payload_days: u64,
        #[command(flatten)]
        db: DbArg,
    },
    /// Recover events Stripe has and the ledger lacks (webhooks missed for good) from Stripe's
    /// API, through the same claim and effects as a webhook; print found, applied, already
    /// present and failed. It may run while `serve` runs on the same database.
    Reconcile(reconcile::ReconcileArgs),
    /// Copy a SQLite ledger (--db) into an empty PostgreSQL database: the ledger, the outbox
    /// and the stripe-billing tables, keys included. Stop `serve` first; then start it with
    /// the new database.
    MigrateTo {
        /// The PostgreSQL URL (postgres://user:password@host/db) of an empty database.
        target: Database,
        #[command(flatten)]
        db: DbArg,
    },
    /// Print a new random forwarding secret (whsec_<base64>).
    GenSecret,
}

#[derive(Debug, Args)]
pub struct SourceArg {
    /// The source the event came from (needed when two sources sent the same id).
    #[arg(long)]
    pub source: Option<String>,
}

#[derive(Debug, Args)]
pub struct DbArg {
    /// SQLite database file, or a PostgreSQL URL (postgres://user:password@host/db).
    #[arg(
        long,
        env = "HOOKLEDGER_DATABASE",
        hide_env_values = true,
        default_value = "./hookledger.db"
    )]
    pub db: Database,
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
        source: SourceArg,
        #[command(flatten)]
        db: DbArg,
    },
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  Stripe (no config file):  STRIPE_WEBHOOK_SECRET=whsec_... hookledger send event.json
  any source of a config:   hookledger send --config hookledger.toml --source stripe event.json
  GitHub:    hookledger send --config hookledger.toml --source gh --type push push.json
  Shopify:   hookledger send --config hookledger.toml --source shop --type orders/create order.json
  Standard:  hookledger send --config hookledger.toml --source clerk user.json
  hmac:      hookledger send --config hookledger.toml --source acme --type order.paid order.json

With --source, the request is signed as that source's scheme with its first secret, with the
headers the provider sends (an event id is made up unless --id is given), and goes to
http://<listen>/webhooks/<source> unless --url says otherwise.")]
pub struct SendArgs {
    /// The event file; its bytes are sent exactly as stored.
    pub file: PathBuf,
    /// Sign as this source of the config file (its scheme, its first secret) instead of as
    /// Stripe with --secret.
    #[arg(long, requires = "config")]
    pub source: Option<String>,
    /// The config file that names the source.
    #[arg(long, env = "HOOKLEDGER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Where to send it [default: http://127.0.0.1:8080/webhooks/stripe, or the source's URL].
    #[arg(long)]
    pub url: Option<String>,
    /// Signing secret (default: the first of STRIPE_WEBHOOK_SECRET, or the source's first).
    #[arg(long, env = "STRIPE_WEBHOOK_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
    /// Signature timestamp (default: now).
    #[arg(long)]
    pub timestamp: Option<i64>,
    /// The event id, for schemes that send it in a header (default: a random one).
    #[arg(long)]
    pub id: Option<String>,
    /// The event type, for schemes that send it in a header (github, shopify, some hmac).
    #[arg(long = "type")]
    pub kind: Option<String>,
}

/// Whether a flag's `value` came from the environment variable `var`: clap fills the flag from
/// it too, and the same value there means it came from there.
pub(crate) fn from_environment(value: &Option<String>, var: &str) -> bool {
    value.is_some() && std::env::var(var).ok() == *value
}

/// The secret a flag names as `env:NAME` or `file:PATH`; the secret itself is refused, as a
/// command line is visible to every user of the machine.
pub(crate) fn secret_flag(flag: &str, value: &str) -> anyhow::Result<crate::config::Secret> {
    if !(value.starts_with("env:") || value.starts_with("file:")) {
        anyhow::bail!(
            "{flag} takes env:NAME or file:PATH, not the secret itself (a command line is \
             visible to every user of the machine)"
        );
    }
    let reference = crate::config::Secret::new(value);
    Ok(config::one_secret(
        flag,
        &reference,
        std::path::Path::new(""),
    )?)
}

/// A config error about `key`, whose value the flag `flag` gave, as the CLI shows it:
/// `--retention-days (retention.claim_days): …`.
pub(crate) fn flag_error(flag: &str, key: &str, message: &str) -> anyhow::Error {
    anyhow::anyhow!("{flag} ({key}): {message}")
}

/// What `main` turns into an exit code.
pub enum Exit {
    Ok,
    /// The command ran but its result is a failure (e.g. `send` got a non-2xx answer).
    Failed,
}

pub fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Send(args) => send(args),
        Command::Demo => crate::cli::demo::run().map(|()| Exit::Ok),
        Command::Outbox(command) => outbox(command),
        Command::Events(command) => events(command),
        Command::Replay {
            event_id,
            source,
            db,
        } => replay(&event_id, source.source.as_deref(), &db),
        Command::Prune {
            retention_days,
            payload_days,
            db,
        } => prune(
            &config::RetentionConfig {
                claim_days: retention_days,
                payload_days: payload_days.min(retention_days),
            },
            &db,
        ),
        Command::Reconcile(args) => reconcile::run(args),
        Command::MigrateTo { target, db } => migrate_to(&db.db, &target),
        Command::GenSecret => gen_secret(),
    }
}

fn migrate_to(from: &Database, to: &Database) -> anyhow::Result<Exit> {
    let (Database::Sqlite(path), Database::Postgres(url)) = (from, to) else {
        anyhow::bail!(
            "migrate-to copies a SQLite file (--db) into PostgreSQL (a postgres:// URL); got \
             --db {from} and target {to}"
        );
    };
    let copied = store::copy::sqlite_to_postgres(path, url)?;
    for (table, rows) in &copied {
        println!("{table}: {rows} row(s)");
    }
    println!(
        "copied {} into {to}; start serve with --db set to it",
        path.display()
    );
    Ok(Exit::Ok)
}

fn replay(event_id: &str, source: Option<&str>, db: &DbArg) -> anyhow::Result<Exit> {
    let source = match source {
        Some(source) => source.to_string(),
        None => listing::source_of(&*store::open_read(&db.db)?, event_id)?,
    };
    admin::replay(&mut *store::open_existing(&db.db)?, &source, event_id)?;
    println!(
        "event {event_id} of source {source} queued for forwarding (a `serve --forward-to` \
         delivers it)"
    );
    Ok(Exit::Ok)
}

fn prune(retention: &config::RetentionConfig, db: &DbArg) -> anyhow::Result<Exit> {
    // Checked here too, to name the flag.
    config::check_retention(retention.claim_days)
        .map_err(|e| flag_error("--retention-days", &e.key, &e.message))?;
    let pruned = admin::prune(&mut *store::open_existing(&db.db)?, retention)?;
    println!("{}", pruned.describe(retention));
    Ok(Exit::Ok)
}

fn gen_secret() -> anyhow::Result<Exit> {
    let secret = SigningKey::generate().context("reading the operating system's random source")?;
    println!("{secret}");
    Ok(Exit::Ok)
}

fn outbox(command: OutboxCommand) -> anyhow::Result<Exit> {
    match command {
        OutboxCommand::List { status, json, db } => {
            let rows = listing::outbox_list(&*store::open_read(&db.db)?, status.as_deref())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", admin::render_outbox(&rows));
            }
        }
        OutboxCommand::Retry { id, all_dead, db } => {
            let mut store = store::open_existing(&db.db)?;
            if all_dead {
                let n = admin::outbox_retry_all_dead(&mut *store)?;
                println!("{n} dead row(s) back to pending");
            } else if let Some(id) = id {
                admin::outbox_retry(&mut *store, id)?;
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
            let since = since.map(|d| crate::time::unix_now() - d.as_secs() as i64);
            let rows =
                listing::events_list(&*store::open_read(&db.db)?, since, kind.as_deref(), limit)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", admin::render_events(&rows));
            }
        }
        EventsCommand::Show {
            event_id,
            source,
            db,
        } => {
            let conn = store::open_read(&db.db)?;
            let source = match source.source {
                Some(source) => source,
                None => listing::source_of(&*conn, &event_id)?,
            };
            let event = listing::event_show(&*conn, &source, &event_id)?;
            println!("{}", serde_json::to_string_pretty(&event)?);
        }
    }
    Ok(Exit::Ok)
}

fn send(args: SendArgs) -> anyhow::Result<Exit> {
    let body = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let timestamp = args.timestamp.unwrap_or_else(crate::time::unix_now);
    let (url, headers) = match &args.source {
        Some(name) => crate::cli::send::signed_as_source(&args, name, &body, timestamp)?,
        None => {
            let secret = args
                .secret
                .as_deref()
                .map(config::parse_secret_list)
                .and_then(|list| list.into_iter().next())
                .context(
                    "no signing secret: pass --secret whsec_... or set STRIPE_WEBHOOK_SECRET \
                     (or --config and --source to sign as another source)",
                )?;
            let header = crate::source::stripe::sign(&secret, timestamp, &body);
            let url = args
                .url
                .clone()
                .unwrap_or_else(|| "http://127.0.0.1:8080/webhooks/stripe".into());
            (
                url,
                vec![(crate::source::stripe::HEADER.to_string(), header)],
            )
        }
    };
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let reply = Client::default()
        .post(&url, &body, &headers)
        .with_context(|| format!("cannot reach {url}"))?;
    println!("{}", reply.status);
    println!("{}", reply.body.trim_end());
    Ok(if (200..300).contains(&reply.status) {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

//! The command line: one `match` on the subcommand, each arm a call into the library.

mod admin;
mod common;
pub(crate) mod demo;
mod listeners;
mod log_buffer;
mod logging;
mod reconcile;
mod send;
mod serve;
pub(crate) mod table;

pub use common::Exit;
pub use log_buffer::LogGuard;
pub use logging::init as init_logging;

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::config;
use crate::config::{Config, Database};
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
    /// Log lines as text, or as one JSON object per line (for a log collector). `RUST_LOG`
    /// chooses what is logged (default `info`).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "HOOKLEDGER_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
}

/// How log lines are written (to stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `2026-11-30T09:40:37.730Z INFO  target: message key=value …`
    #[value(alias = "plain")]
    Text,
    /// `{"ts":"2026-11-30T09:40:37.730Z","level":"INFO","target":"…","message":"…","key":…}`
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Receive webhooks on POST /webhooks/{source} (without a config file: /webhooks/stripe).
    Serve(Box<serve::ServeArgs>),
    /// Sign a file's raw bytes as a provider does and POST them (the local dev loop).
    Send(send::SendArgs),
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
        /// Days the ledger remembers events (their claims), or `never`. [default: the config
        /// file's retention.claim_days, else 400]
        #[arg(long, alias = "claim-days", value_parser = crate::config::parse_days)]
        retention_days: Option<u64>,
        /// Days events keep their payloads (at most the claim age), or `never`. [default: the
        /// config file's retention.payload_days, else 30]
        #[arg(long, value_parser = crate::config::parse_days)]
        payload_days: Option<u64>,
        #[command(flatten)]
        db: DbArg,
    },
    /// SQLite: rewrite the database file compactly, once, so that it shrinks to what it holds
    /// and from then on gives the space pruning frees back to the file system (databases
    /// made by hookledger 0.x before this switch keep their size otherwise). Stop `serve`
    /// first; it needs about the file's size in free disk while it runs.
    Vacuum {
        #[command(flatten)]
        db: DbArg,
    },
    /// SQLite: check the ledger as the claim path relies on it (an fsck): no (source, event
    /// id) twice, every stored payload decodes, outbox rows refer to events, the saved filter
    /// of keys is whole, and claims hookledger cannot read (keys that are not UTF-8 text).
    /// Read-only, beside `serve` or not; exits 1 on any problem, with what it found.
    Check {
        /// JSON for scripts.
        #[arg(long)]
        json: bool,
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
    /// Print a new random forwarding secret (`whsec_<base64>`).
    GenSecret,
    /// List the providers' presets (`preset = "NAME"` on a source): what each verifies, how a
    /// replay is stopped, and where the provider documents it.
    Presets {
        /// As a Markdown table (the book's preset catalog).
        #[arg(long)]
        markdown: bool,
    },
}

#[derive(Debug, Args)]
pub struct SourceArg {
    /// The source the event came from (needed when two sources sent the same id).
    #[arg(long)]
    pub source: Option<String>,
}

#[derive(Debug, Args)]
pub struct DbArg {
    /// The TOML config file `serve` runs with: its `database` and `[storage]` settings (and
    /// for `prune`, its `[retention]`); --db overrides its database. Its secrets are not read.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// SQLite database file, or a PostgreSQL URL (postgres://user:password@host/db).
    /// [default: the config file's, else ./hookledger.db]
    #[arg(long, env = "HOOKLEDGER_DATABASE", hide_env_values = true)]
    pub db: Option<Database>,
}

impl DbArg {
    /// The config file's settings (its secrets as written, unread: no command here needs
    /// them), or the defaults; with --db over its database.
    fn config(&self) -> anyhow::Result<Config> {
        let mut config = match &self.config {
            Some(path) => Config::read(path)
                .map(|(config, _)| config)
                .with_context(|| format!("config file {}", path.display()))?,
            None => Config::default(),
        };
        if let Some(db) = &self.db {
            config.database = db.clone();
        }
        Ok(config)
    }
}

#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// List outbox rows.
    List {
        #[arg(long, value_parser = ["pending", "done", "dead", "superseded"])]
        status: Option<String>,
        /// JSON for scripts.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArg,
    },
    /// Show one outbox row, with the output of a `[[delivery]]` command.
    Show {
        id: i64,
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
        /// Only events of this source.
        #[arg(long)]
        source: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print the last events (oldest first), then each new one as it arrives, one line
        /// each (with --json, one JSON object a line), until interrupted.
        #[arg(long)]
        follow: bool,
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

pub fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Serve(args) => serve::run(*args, cli.log_format),
        Command::Send(args) => send::run(args),
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
        } => {
            let file = db.config()?.retention;
            let claim_days = retention_days.unwrap_or(file.claim_days);
            let payload_days = payload_days.unwrap_or(file.payload_days);
            prune(
                &config::RetentionConfig {
                    claim_days,
                    payload_days: payload_days.min(claim_days),
                },
                &db,
            )
        }
        Command::Vacuum { db } => vacuum(&db),
        Command::Check { json, db } => check(&db, json),
        Command::Reconcile(args) => reconcile::run(args),
        Command::MigrateTo { target, db } => migrate_to(&db.config()?.database, &target),
        Command::GenSecret => gen_secret(),
        Command::Presets { markdown } => {
            match markdown {
                true => print!("{}", crate::source::catalog::markdown()),
                false => print!("{}", presets()),
            }
            Ok(Exit::Ok)
        }
    }
}

#[cfg(not(feature = "postgres"))]
fn migrate_to(_from: &Database, to: &Database) -> anyhow::Result<Exit> {
    anyhow::bail!("{to} is {}", crate::config::WITHOUT_POSTGRES)
}

#[cfg(feature = "postgres")]
fn migrate_to(from: &Database, to: &Database) -> anyhow::Result<Exit> {
    let copied = store::copy::copy(from, to, &crate::app::builtin_schemas())?;
    for (table, rows) in &copied {
        println!("{table}: {rows} row(s)");
    }
    println!("copied {from} into {to}; start serve with --db set to it");
    Ok(Exit::Ok)
}

/// The database of `db` for one command's writes (next to a running `serve`).
fn writer_of(db: &DbArg) -> anyhow::Result<Box<dyn store::Store>> {
    let config = db.config()?;
    Ok(store::open(&config.database, &config.storage, store::Access::Command)?.writer)
}

/// The database of `db` for one command's reads.
fn reader_of(db: &DbArg) -> anyhow::Result<store::Reader> {
    let config = db.config()?;
    store::open_reader(&config.database, &config.storage)
}

fn replay(event_id: &str, source: Option<&str>, db: &DbArg) -> anyhow::Result<Exit> {
    let source = match source {
        Some(source) => source.to_string(),
        None => reader_of(db)?.read(|ledger| listing::source_of(ledger, event_id))?,
    };
    admin::replay(&mut *writer_of(db)?, &source, event_id)?;
    println!(
        "event {event_id} of source {source} queued for forwarding (a `serve --forward-to` \
         delivers it)"
    );
    Ok(Exit::Ok)
}

fn prune(retention: &config::RetentionConfig, db: &DbArg) -> anyhow::Result<Exit> {
    // Checked here too, to name the flag.
    config::check_retention(retention.claim_days)
        .map_err(|e| common::flag_error("--retention-days", &e.key, &e.message))?;
    let config = db.config()?;
    let store::Stores {
        mut writer, reader, ..
    } = store::open(&config.database, &config.storage, store::Access::Command)?;
    let pruned = reader.read(|ledger| admin::prune(&mut *writer, ledger, retention))?;
    println!("{}", pruned.describe(retention));
    Ok(Exit::Ok)
}

fn vacuum(db: &DbArg) -> anyhow::Result<Exit> {
    let database = db.config()?.database;
    let Database::Sqlite(path) = &database else {
        anyhow::bail!(
            "vacuum is for SQLite: PostgreSQL's autovacuum reuses the space pruning frees \
             (VACUUM FULL, run by hand, gives it back to the file system)"
        );
    };
    let done = store::sqlite::vacuum(path)?;
    println!(
        "{}: {} bytes before, {} bytes after; pruning now gives freed space back{}",
        path.display(),
        done.before,
        done.after,
        if done.was_incremental {
            " (it already did)"
        } else {
            ""
        }
    );
    Ok(Exit::Ok)
}

fn check(db: &DbArg, json: bool) -> anyhow::Result<Exit> {
    let database = db.config()?.database;
    let Database::Sqlite(path) = &database else {
        anyhow::bail!(
            "check is for SQLite: PostgreSQL's primary key on (source, event_id) holds across \
             the whole ledger, and it keeps no saved filter"
        );
    };
    let report = store::sqlite::check::check(path)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", store::sqlite::check::render(path, &report));
    }
    Ok(match report.is_clean() {
        true => Exit::Ok,
        false => Exit::Failed,
    })
}

/// The preset catalog as a table.
fn presets() -> String {
    let rows: Vec<Vec<String>> = crate::source::catalog::PRESETS
        .iter()
        .map(|p| {
            vec![
                p.name.to_string(),
                p.verifies.to_string(),
                p.replay.to_string(),
                p.docs.to_string(),
            ]
        })
        .collect();
    table::render(&["preset", "verifies", "replay stopped by", "docs"], &rows)
}

fn gen_secret() -> anyhow::Result<Exit> {
    let secret = SigningKey::generate().context("reading the operating system's random source")?;
    println!("{secret}");
    Ok(Exit::Ok)
}

fn outbox(command: OutboxCommand) -> anyhow::Result<Exit> {
    match command {
        OutboxCommand::List { status, json, db } => {
            let rows =
                reader_of(&db)?.read(|ledger| listing::outbox_list(ledger, status.as_deref()))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", admin::render_outbox(&rows));
            }
        }
        OutboxCommand::Show { id, json, db } => {
            let Some(row) = reader_of(&db)?.read(|ledger| listing::outbox_show(ledger, id))? else {
                anyhow::bail!("no outbox row {id}");
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&row)?);
            } else {
                print!("{}", admin::render_outbox_row(&row));
            }
        }
        OutboxCommand::Retry { id, all_dead, db } => {
            let mut store = writer_of(&db)?;
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
            source,
            limit,
            follow,
            json,
            db,
        } => {
            let since = since.map(|d| crate::time::unix_now() - d.as_secs() as i64);
            let (kind, source) = (kind.as_deref(), source.as_deref());
            let reader = reader_of(&db)?;
            if follow {
                return admin::follow(&reader, since, kind, source, limit, json);
            }
            let rows =
                reader.read(|ledger| listing::events_list(ledger, since, kind, source, limit))?;
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
            let event = reader_of(&db)?.read(|ledger| {
                let source = match source.source {
                    Some(source) => source,
                    None => listing::source_of(ledger, &event_id)?,
                };
                listing::event_show(ledger, &source, &event_id)
            })?;
            println!("{}", serde_json::to_string_pretty(&event)?);
        }
    }
    Ok(Exit::Ok)
}

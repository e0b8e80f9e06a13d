//! The PostgreSQL store: several hookledger instances on one database, the same contract as
//! on SQLite.
//!
//! - Connections: the writer owns one (the synchronous `postgres` client keeps the writer's
//!   thread model: one thread, one connection, group commit); the outbox worker reads through
//!   a small r2d2 pool; each CLI command opens its own. A connection that broke (the server
//!   restarted, the network failed) is replaced at the next batch; until then requests get
//!   503 `database_unavailable`, and nothing of a failed batch was committed.
//! - Transactions: `BEGIN` per batch (read committed), `SAVEPOINT hookledger_job` per job, one
//!   `COMMIT`. The writer takes a batch's claims in key order, so two instances never wait on
//!   each other's claims in opposite orders. A claim that waits on another instance's
//!   uncommitted claim of the same event sees it once that commits: a duplicate.
//! - `lock_timeout` is the storage busy timeout: a statement waiting longer for a row lock
//!   fails, and that event gets a 503, as do deadlocks and serialization failures.
//! - Migrations: an append-only list (`migrations/`), recorded in `hookledger_migrations`, run
//!   under an advisory lock so that instances starting together migrate once.
//! - Retention: each prune batch first takes a transaction-scoped advisory lock; an instance
//!   that does not get it prunes nothing this round, so one instance prunes at a time.
//! - The outbox: see `due.rs` (leases with `FOR UPDATE SKIP LOCKED`).

mod due;
mod session;

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use postgres::NoTls;

use crate::config::Database;
use crate::handler::Submission;
use crate::outbox::FORWARD;
use crate::store::tx::Session;
use crate::store::{app_schema, ledger, outbox, Outcome, Store, StoreError, Tx, Write};

pub(crate) use due::PgOutbox;
pub(crate) use session::PgSession;

/// Append-only. Never edit a released entry; add a new one.
const MIGRATIONS: &[&str] = &[include_str!("migrations/0001_schema.sql")];

/// The advisory lock keys: migrations (hookledger's and the app's) and retention.
const MIGRATION_LOCK: i64 = 0x0068_6f6f_6b6d_6967; // "hookmig"
const RETENTION_LOCK: i64 = 0x0068_6f6f_6b72_6574; // "hookret"

/// The writer's connection (or one CLI command's).
pub(crate) struct PgStore {
    config: postgres::Config,
    session: PgSession,
    busy_timeout: Duration,
}

/// The connection settings of `url`, checked without showing it (it may hold a password).
pub(crate) fn parse(url: &str) -> anyhow::Result<postgres::Config> {
    url.parse::<postgres::Config>().map_err(|e| {
        anyhow::anyhow!(
            "database: not a valid PostgreSQL URL ({}): {e}",
            Database::Postgres(url.to_string())
        )
    })
}

/// Opens a connection with hookledger's session settings.
fn connect(config: &postgres::Config, busy_timeout: Duration) -> Result<PgSession, StoreError> {
    let mut config = config.clone();
    config.connect_timeout(busy_timeout);
    if config.get_application_name().is_none() {
        config.application_name("hookledger");
    }
    let client = config.connect(NoTls)?;
    let session = PgSession::new(client);
    session.batch(&format!(
        "SET lock_timeout = {}; SET client_min_messages = warning",
        busy_timeout.as_millis().max(1)
    ))?;
    Ok(session)
}

impl PgStore {
    /// Connects to `url` and brings hookledger's schema up to date.
    pub(crate) fn open(url: &str, busy_timeout: Duration) -> anyhow::Result<PgStore> {
        let config = parse(url)?;
        let shown = Database::Postgres(url.to_string());
        let session = connect(&config, busy_timeout)
            .with_context(|| format!("cannot connect to PostgreSQL at {shown}"))?;
        let store = PgStore {
            config,
            session,
            busy_timeout,
        };
        store
            .migrate()
            .with_context(|| format!("cannot migrate {shown}"))?;
        Ok(store)
    }

    /// A connection for reads (a CLI command's listings).
    pub(crate) fn open_read(url: &str) -> anyhow::Result<PgSession> {
        let config = parse(url)?;
        connect(&config, crate::config::DEFAULT_BUSY_TIMEOUT).with_context(|| {
            format!(
                "cannot connect to PostgreSQL at {}",
                Database::Postgres(url.to_string())
            )
        })
    }

    /// The migrations not applied yet, each in its own transaction, under the migration lock.
    fn migrate(&self) -> anyhow::Result<()> {
        self.session.batch(
            "CREATE TABLE IF NOT EXISTS hookledger_migrations (
                 version    BIGINT PRIMARY KEY,
                 applied_at BIGINT NOT NULL
             )",
        )?;
        for (i, sql) in MIGRATIONS.iter().enumerate() {
            let version = i as i64 + 1;
            self.session.batch(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"
            ))?;
            let done = self.session.query(
                "SELECT version FROM hookledger_migrations WHERE version = $1",
                &[&version],
            );
            let result = match done {
                Ok(rows) if !rows.is_empty() => Ok(false),
                Ok(_) => self
                    .session
                    .batch(sql)
                    .map_err(anyhow::Error::from)
                    .and_then(|()| {
                        self.session.execute(
                            "INSERT INTO hookledger_migrations (version, applied_at)
                             VALUES ($1, $2)",
                            &[&version, &crate::unix_now()],
                        )?;
                        Ok(true)
                    }),
                Err(e) => Err(e.into()),
            };
            match result {
                Ok(applied) => {
                    self.session.batch("COMMIT")?;
                    if applied {
                        log::info!("database migrated to schema version {version}");
                    }
                }
                Err(e) => {
                    let _ = self.session.batch("ROLLBACK");
                    return Err(e.context(format!("migration {version} failed")));
                }
            }
        }
        let newest: Option<i64> = self
            .session
            .query("SELECT max(version) FROM hookledger_migrations", &[])?
            .first()
            .map(|r| r.get(0))
            .transpose()?
            .flatten();
        if let Some(v) = newest.filter(|v| *v > MIGRATIONS.len() as i64) {
            bail!(
                "database schema version {v} is newer than this hookledger knows ({}); upgrade \
                 hookledger",
                MIGRATIONS.len()
            );
        }
        Ok(())
    }

    /// Statements on the writer's connection, in its transaction if one is open.
    pub(crate) fn session(&self) -> &PgSession {
        &self.session
    }

    /// A new connection in place of one that broke.
    fn reconnect(&mut self) -> Result<(), StoreError> {
        self.session = connect(&self.config, self.busy_timeout)?;
        log::info!("writer: reconnected to PostgreSQL");
        Ok(())
    }
}

impl Store for PgStore {
    fn migrate_app(&mut self, folder: &Path) -> anyhow::Result<usize> {
        let session = &self.session;
        let batch = |sql: &str| Ok(session.batch(sql)?);
        let begin = format!("BEGIN; SELECT pg_advisory_xact_lock({MIGRATION_LOCK})");
        let migrator = app_schema::Migrator {
            session,
            batch: &batch,
            begin: &begin,
        };
        app_schema::migrate(&migrator, folder)
    }

    fn check_statement(&mut self, sql: &str, parameters: usize) -> Result<bool, String> {
        let (taken, returns_rows) = self.session.describe(sql).map_err(|e| e.to_string())?;
        if taken > parameters {
            return Err(format!(
                "it takes {taken} parameters, and only {parameters} are named"
            ));
        }
        Ok(returns_rows)
    }

    fn begin(&mut self) -> Result<(), StoreError> {
        if self.session.is_closed() {
            self.reconnect()?;
        }
        Ok(self.session.batch("BEGIN")?)
    }

    fn savepoint(&mut self) -> Result<(), StoreError> {
        Ok(self.session.batch("SAVEPOINT hookledger_job")?)
    }

    fn release(&mut self, keep: bool) -> Result<(), StoreError> {
        Ok(self.session.batch(if keep {
            "RELEASE SAVEPOINT hookledger_job"
        } else {
            "ROLLBACK TO SAVEPOINT hookledger_job; RELEASE SAVEPOINT hookledger_job"
        })?)
    }

    fn transaction_lost(&self) -> bool {
        self.session.is_closed()
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        Ok(self.session.batch("COMMIT")?)
    }

    fn rollback(&mut self) {
        if !self.session.is_closed() {
            if let Err(e) = self.session.batch("ROLLBACK") {
                log::error!("writer: rollback failed: {e}");
            }
        }
    }

    fn apply(&mut self, submission: Submission, now: i64) -> Result<Outcome, StoreError> {
        let Submission {
            event,
            handlers,
            forward,
        } = submission;
        if !ledger::claim(&self.session, &event, now)? {
            return Ok(Outcome::Duplicate);
        }
        for (handler, prepared) in handlers {
            handler.handle(&Tx::new(&self.session), &event, prepared)?;
        }
        if forward {
            outbox::enqueue(&self.session, FORWARD, &event, &event.body, now)?;
        }
        Ok(Outcome::Processed)
    }

    fn write(&mut self, write: &Write, now: i64) -> Result<u64, StoreError> {
        if write.is_prune() && !self.holds_retention_lock()? {
            log::debug!("retention: another instance is pruning");
            return Ok(0);
        }
        crate::store::write_in(&self.session, write, now)
    }
}

impl PgStore {
    /// Takes the retention lock for this transaction, unless another instance holds it.
    fn holds_retention_lock(&self) -> Result<bool, StoreError> {
        let row = self
            .session
            .query("SELECT pg_try_advisory_xact_lock($1)", &[&RETENTION_LOCK])?;
        Ok(row.first().map(|r| r.get::<i64>(0)).transpose()? == Some(1))
    }
}

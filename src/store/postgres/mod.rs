//! The PostgreSQL store: several hookledger instances on one database, the same contract as
//! on SQLite.
//!
//! - Connections: the writer owns one (tokio-postgres driven on the writer's own thread, see
//!   `session.rs`: one thread, one connection, group commit, as on SQLite); the outbox worker
//!   has one of its own (it holds the leases); each CLI command opens its own. A connection that
//!   broke (the server restarted, the network failed; TCP keepalives find a silent one) is
//!   replaced at the next batch; until then requests get 503 `database_unavailable`, and
//!   nothing of a failed batch was committed.
//! - Transactions: `BEGIN` per batch (read committed, sent with the first statement), one
//!   `COMMIT`; in between, the claims of the batch in one statement and its handler on all new
//!   events at once, or a `SAVEPOINT hookledger_job` per job (see
//!   [`PgStore::run_and_commit`](Store::run_and_commit)). The writer takes a batch's claims in key order, so two instances never wait on
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
#[cfg(test)]
pub(crate) mod scratch;
mod session;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::config::{parse_postgres, Database};
use crate::handler::{Handler, Prepared, Submission};
use crate::outbox::FORWARD;
use crate::sql::Session;
use crate::sql::{StoreError, Tx};
use crate::store::{app_schema, run_each, Done, Outcome, Store, Work, Write};

pub(crate) use due::PgOutbox;
use session::CommitError;
pub(crate) use session::PgSession;

/// Append-only. Never edit a released entry; add a new one.
const MIGRATIONS: &[&str] = &[
    include_str!("migrations/0001_schema.sql"),
    include_str!("migrations/0002_heartbeat.sql"),
];

/// The advisory lock keys: migrations (hookledger's and the app's) and retention.
const MIGRATION_LOCK: i64 = 0x0068_6f6f_6b6d_6967; // "hookmig"
const RETENTION_LOCK: i64 = 0x0068_6f6f_6b72_6574; // "hookret"

/// The writer's connection (or one CLI command's).
pub(crate) struct PgStore {
    config: tokio_postgres::Config,
    session: PgSession,
    busy_timeout: Duration,
}

/// The one handler every event of `work` has, if they share one (`Some(None)`: none has a
/// handler); `None` when an event has several, or two events have different ones: then their
/// order across events matters, and they run job by job.
fn shared_handler(work: &[Work<'_>]) -> Option<Option<Arc<dyn Handler>>> {
    let mut shared: Option<Arc<dyn Handler>> = None;
    for job in work {
        let Work::Event(submission) = job else {
            continue;
        };
        match submission.handlers.as_slice() {
            [] => {}
            [(handler, _)] if shared.as_ref().is_none_or(|h| Arc::ptr_eq(h, handler)) => {
                shared = Some(handler.clone());
            }
            _ => return None,
        }
    }
    Some(shared)
}

/// Makes again the prepared values a handler's `handle_all` took, for a run job by job.
fn prepare_again(work: &mut [Work<'_>]) {
    for job in work {
        let Work::Event(s) = job else {
            continue;
        };
        for (handler, prepared) in &mut s.handlers {
            match handler.prepare(&s.event) {
                Ok(again) => *prepared = again,
                // It cannot run without its prepared value: the event fails (and is retried).
                Err(e) => {
                    *handler = Arc::new(Unprepared {
                        name: handler.name().to_string(),
                        error: e.to_string(),
                    });
                    *prepared = Prepared::none();
                }
            }
        }
    }
}

/// Stands in for a handler whose `prepare` failed the second time: the event fails.
struct Unprepared {
    name: String,
    error: String,
}

impl Handler for Unprepared {
    fn name(&self) -> &str {
        &self.name
    }

    fn handle(
        &self,
        _: &Tx<'_>,
        event: &crate::event::Event,
        _: Prepared,
    ) -> Result<(), StoreError> {
        Err(StoreError::Database(format!(
            "{} could not prepare {} again: {}",
            self.name, event.id, self.error
        )))
    }
}

/// Opens a connection with hookledger's session settings.
fn connect(
    config: &tokio_postgres::Config,
    busy_timeout: Duration,
) -> Result<PgSession, StoreError> {
    let mut config = config.clone();
    config.connect_timeout(busy_timeout);
    // A peer that went silent (a dropped network, a dead host) is found within about a
    // minute instead of the system's two hours, and the writer gets to reconnect.
    config.keepalives_idle(Duration::from_secs(30));
    config.tcp_user_timeout(Duration::from_secs(60));
    if config.get_application_name().is_none() {
        config.application_name("hookledger");
    }
    let session = PgSession::connect(&config)?;
    session.batch(&format!(
        "SET lock_timeout = {}; SET client_min_messages = warning",
        busy_timeout.as_millis().max(1)
    ))?;
    Ok(session)
}

impl PgStore {
    /// Connects to `url` and brings hookledger's schema up to date.
    pub(crate) fn open(url: &str, busy_timeout: Duration) -> anyhow::Result<PgStore> {
        let config = parse_postgres(url)?;
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
        let config = parse_postgres(url)?;
        connect(&config, crate::config::DEFAULT_BUSY_TIMEOUT).with_context(|| {
            format!(
                "cannot connect to PostgreSQL at {}",
                Database::Postgres(url.to_string())
            )
        })
    }

    /// The migrations not applied yet, each in its own transaction, under the migration lock.
    fn migrate(&self) -> anyhow::Result<()> {
        // Under the lock too: two instances creating the table at once collide in the catalog.
        self.session.batch(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({MIGRATION_LOCK});
             CREATE TABLE IF NOT EXISTS hookledger_migrations (
                 version    BIGINT PRIMARY KEY,
                 applied_at BIGINT NOT NULL
             );
             COMMIT"
        ))?;
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
                            &[&version, &crate::time::unix_now()],
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
        if taken != parameters {
            return Err(format!(
                "PostgreSQL counts {taken} parameter(s) where {parameters} are named (is a \
                 :name inside a string or a $$ quote?)"
            ));
        }
        Ok(returns_rows)
    }

    fn begin(&mut self) -> Result<(), StoreError> {
        if self.session.is_closed() {
            self.reconnect()?;
        }
        // Sent with the batch's first statement, in its round trip.
        self.session.begin();
        Ok(())
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
        self.session.commit().map_err(|e| match e {
            CommitError::Deferred(e) | CommitError::Commit(e) => e,
        })
    }

    fn rollback(&mut self) {
        if !self.session.is_closed() {
            if let Err(e) = self.session.rollback() {
                log::error!("writer: rollback failed: {e}");
            }
        }
    }

    fn apply(&mut self, submission: Submission, now: i64) -> Result<Outcome, StoreError> {
        let session = &self.session;
        crate::store::apply_in(session, submission, now, |handler, event, prepared| {
            handler.handle(&Tx::new(session), event, prepared)
        })
    }

    /// When the batch's new events share one handler (or have none), they run together
    /// ([`PgStore::run_together`]) and commit with the handler's deferred statements in one
    /// round trip. Otherwise, or when the handler fails on the batch (then, or at the commit),
    /// the batch runs again in a new transaction, each job in a savepoint of its own, so that a
    /// bad event fails alone.
    fn run_and_commit(
        &mut self,
        mut work: Vec<Work<'_>>,
        now: i64,
    ) -> Result<Vec<Done>, StoreError> {
        let Some(handler) = shared_handler(&work) else {
            return self.each_and_commit(work, now);
        };
        match self.run_together(&mut work, handler.as_ref(), now)? {
            Some(results) => {
                match self.session.commit() {
                    Ok(()) => return Ok(results),
                    Err(CommitError::Commit(e)) => return Err(e),
                    // Job by job, every event would wait out the same lock again: the whole
                    // batch gets the 503 at once.
                    Err(CommitError::Deferred(e)) if self.session.is_closed() || e.is_busy() => {
                        return Err(e)
                    }
                    Err(CommitError::Deferred(e)) => {
                        let name = handler.as_ref().map_or("a handler", |h| h.name());
                        log::warn!("writer: {name} failed on a batch at commit ({e}); applying it job by job");
                        prepare_again(&mut work);
                    }
                }
            }
            None => self.session.rollback()?,
        }
        self.session.begin();
        self.each_and_commit(work, now)
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
    /// Runs `work` job by job, each in a savepoint, and commits.
    fn each_and_commit(&mut self, work: Vec<Work<'_>>, now: i64) -> Result<Vec<Done>, StoreError> {
        let results = run_each(self, work, now)?;
        self.commit()?;
        Ok(results)
    }

    /// The batch together: the other writes, each in a savepoint (they are few: attempt
    /// results, retention, the CLI's); the events' claims in one statement; the handler they
    /// share on all new events at once ([`Handler::handle_all`]); the outbox rows in one
    /// statement. A few round trips per batch instead of several per event. `None` when the
    /// handler failed: then the transaction is aborted, and the batch must run again job by
    /// job, and each new event's prepared value was made again for that.
    fn run_together(
        &mut self,
        work: &mut [Work<'_>],
        handler: Option<&Arc<dyn Handler>>,
        now: i64,
    ) -> Result<Option<Vec<Done>>, StoreError> {
        let mut results = Vec::with_capacity(work.len());
        let mut events = Vec::new();
        for job in work.iter_mut() {
            match job {
                Work::Write(write) => {
                    self.savepoint()?;
                    let done = self.write(write, now);
                    if let Err(e) = &done {
                        if self.transaction_lost() {
                            return Err(e.clone());
                        }
                    }
                    self.release(done.is_ok())?;
                    results.push(Some(Done::Write(done)));
                }
                Work::Event(submission) => {
                    results.push(None);
                    events.push(submission);
                }
            }
        }
        let new = self.claim_all(&events, now)?;
        let mut fresh: Vec<&mut Submission> = events
            .into_iter()
            .zip(&new)
            .filter_map(|(s, new)| new.then_some(s))
            .collect();
        if let Some(handler) = handler {
            let batch = fresh
                .iter_mut()
                .filter_map(|s| {
                    let (_, prepared) = s.handlers.first_mut()?;
                    Some((&s.event, std::mem::replace(prepared, Prepared::none())))
                })
                .collect();
            if let Err(e) = handler.handle_all(&Tx::new(&self.session), batch) {
                if self.session.is_closed() || e.is_busy() {
                    return Err(e);
                }
                log::warn!(
                    "writer: {} failed on a batch of {} ({e}); applying them one by one",
                    handler.name(),
                    fresh.len()
                );
                prepare_again(work);
                return Ok(None);
            }
        }
        let forwards: Vec<&crate::event::Event> = fresh
            .iter()
            .filter(|s| s.forward)
            .map(|s| &s.event)
            .collect();
        self.enqueue_all(&forwards, now)?;
        let mut new = new.into_iter();
        Ok(Some(
            results
                .into_iter()
                .map(|done| {
                    done.unwrap_or_else(|| {
                        Done::Event(Ok(match new.next() {
                            Some(true) => Outcome::Processed,
                            _ => Outcome::Duplicate,
                        }))
                    })
                })
                .collect(),
        ))
    }

    /// Claims every event of the batch in one statement, in batch (key) order; whether each
    /// is new. Of two copies of one event in a batch, the first is the new one.
    fn claim_all(&self, events: &[&mut Submission], now: i64) -> Result<Vec<bool>, StoreError> {
        let column =
            |f: fn(&Submission) -> &str| events.iter().map(|s| f(s)).collect::<Vec<&str>>();
        let sources = column(|s| &s.event.source);
        let ids = column(|s| &s.event.id);
        let types = column(|s| &s.event.kind);
        let created: Vec<Option<i64>> = events.iter().map(|s| s.event.created).collect();
        let bodies: Vec<&[u8]> = events.iter().map(|s| &s.event.body[..]).collect();
        let inserted: std::collections::HashSet<(String, String)> = self
            .session
            .query_typed(
                "INSERT INTO webhook_events
                     (source, event_id, event_type, created, received_at, payload)
                 SELECT source, event_id, event_type, created, $5, payload
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $6::bytea[])
                     AS e (source, event_id, event_type, created, payload)
                 ON CONFLICT (source, event_id) DO NOTHING
                 RETURNING source, event_id",
                &[&sources, &ids, &types, &created, &now, &bodies],
            )?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let mut seen = std::collections::HashSet::new();
        Ok(events
            .iter()
            .map(|s| {
                let key = (s.event.source.to_string(), s.event.id.clone());
                inserted.contains(&key) && seen.insert(key)
            })
            .collect())
    }

    /// Queues a `forward` row for each event, in one statement.
    fn enqueue_all(&self, events: &[&crate::event::Event], now: i64) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let sources: Vec<&str> = events.iter().map(|e| &*e.source).collect();
        let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        let types: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        let bodies: Vec<&[u8]> = events.iter().map(|e| &e.body[..]).collect();
        self.session.query_typed(
            "INSERT INTO outbox
                 (kind, source, key, event_type, payload, status, next_attempt_at, created_at)
             SELECT $1, source, key, event_type, payload, 'pending', $6, $6
             FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[])
                 AS e (source, key, event_type, payload)
             ON CONFLICT (kind, source, key) DO NOTHING",
            &[&FORWARD, &sources, &ids, &types, &bodies, &now],
        )?;
        Ok(())
    }

    /// Takes the retention lock for this transaction, unless another instance holds it.
    fn holds_retention_lock(&self) -> Result<bool, StoreError> {
        let row = self
            .session
            .query("SELECT pg_try_advisory_xact_lock($1)", &[&RETENTION_LOCK])?;
        Ok(row.first().map(|r| r.get::<i64>(0)).transpose()? == Some(1))
    }
}

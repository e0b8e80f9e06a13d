//! The PostgreSQL store: several hookledger instances on one database, the same contract as
//! on SQLite.
//!
//! - Connections: the writer owns one (tokio-postgres driven on the writer's own thread, see
//!   `session.rs`: one thread, one connection, group commit, as on SQLite); the outbox worker
//!   has one of its own (it holds the leases); each CLI command opens its own. A connection that
//!   broke (the server restarted, the network failed; TCP keepalives find a silent one) is
//!   replaced at the next batch; while attempts fail, the next waits, doubling from 100 ms to
//!   5 s (`backoff.rs`). Until it is back requests get 503 `database_unavailable` at once, and
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
//!   under an advisory lock so that instances starting together migrate once. They make the
//!   core's tables only: a built-in handler's are its own ([`Store::migrate_handler`]), under
//!   the same lock.
//! - Retention: each prune batch first takes a transaction-scoped advisory lock; an instance
//!   that does not get it prunes nothing this round, so one instance prunes at a time.
//! - The outbox: see `due.rs` (leases with `FOR UPDATE SKIP LOCKED`).

mod backoff;
mod due;
#[cfg(test)]
pub(crate) mod scratch;
mod session;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::config::{parse_postgres, Database, PgUrl, DEFAULT_EFFECT_TIMEOUT};
use crate::event::Event;
use crate::handler::{Handler, Prepared, Schema};
use crate::outbox::FORWARD;
use crate::payload::Stored;
use crate::sql::{Session, StoreError, Tx};
use crate::store::owned::{self, Change};
use crate::store::seam::{Done, Store, Work, Write};
use crate::store::{app_schema, pipeline};

use backoff::Backoff;
pub(crate) use due::PgOutbox;
use session::CommitError;
pub(crate) use session::PgSession;

/// Append-only. Never edit a released entry; add a new one.
///
/// One entry was edited once, in a way no existing database sees: migration 1 as released also
/// made the stripe-billing tables (`subscriptions`, `invoice_payments`, `accounts`), which are
/// now that handler's own (`src/stripe/migrations/`). A database that ran it keeps them:
/// `hookledger_migrations` records version 1, which never runs there again, and no later
/// migration reads or changes those tables; the handler's first migration (`CREATE TABLE IF
/// NOT EXISTS`) takes them as they are. A new database runs migration 1 without them, and has
/// them only once a source names stripe-billing.
const MIGRATIONS: &[&str] = &[
    include_str!("migrations/0001_schema.sql"),
    include_str!("migrations/0002_heartbeat.sql"),
    include_str!("migrations/0003_outbox_output.sql"),
    include_str!("migrations/0004_outbox_superseded.sql"),
    include_str!("migrations/0005_refusals.sql"),
    include_str!("migrations/0006_alert_incidents.sql"),
    include_str!("migrations/0007_payload_codec.sql"),
    include_str!("migrations/0008_outbox_pending_indexes.sql"),
    include_str!("migrations/0009_signature_tokens.sql"),
    include_str!("migrations/0010_outbox_repeated_key.sql"),
    include_str!("migrations/0011_lane_turns.sql"),
];

/// The advisory lock keys: migrations (hookledger's and the app's) and retention.
const MIGRATION_LOCK: i64 = 0x0068_6f6f_6b6d_6967; // "hookmig"
const RETENTION_LOCK: i64 = 0x0068_6f6f_6b72_6574; // "hookret"

/// The writer's connection (or one CLI command's).
pub(crate) struct PgStore {
    config: PgUrl,
    session: PgSession,
    busy_timeout: Duration,
    /// When to connect again after the connection was lost and attempts failed.
    backoff: Backoff,
    /// Why the last attempt to connect failed, for the batches that fail while the backoff
    /// waits.
    connect_error: String,
    /// How long one handler run may take ([`Store::limit_handlers`]).
    handler_limit: Duration,
}

/// Read connections, pooled: made when first needed, replaced when broken.
pub(crate) type ReadPool = r2d2::Pool<Reads>;

/// Makes the read connections of `url`.
pub(crate) struct Reads {
    config: PgUrl,
    busy_timeout: Duration,
}

impl r2d2::ManageConnection for Reads {
    type Connection = PgSession;
    type Error = StoreError;

    fn connect(&self) -> Result<PgSession, StoreError> {
        connect(&self.config, self.busy_timeout)
    }

    fn is_valid(&self, conn: &mut PgSession) -> Result<(), StoreError> {
        Ok(conn.batch("")?)
    }

    fn has_broken(&self, conn: &mut PgSession) -> bool {
        conn.is_closed()
    }
}

/// A pool of up to `size` read connections to `url`, none made yet (a server that is down
/// fails the read that needs it, within `busy_timeout`, not the start).
pub(crate) fn read_pool(url: &str, busy_timeout: Duration, size: u32) -> anyhow::Result<ReadPool> {
    let config = parse_postgres(url)?;
    Ok(r2d2::Pool::builder()
        .max_size(size)
        .min_idle(Some(0))
        .connection_timeout(busy_timeout)
        .build_unchecked(Reads {
            config,
            busy_timeout,
        }))
}

/// Opens a connection with hookledger's session settings: set once for the session, or,
/// through a transaction pooler, with each transaction's `BEGIN` (`SET LOCAL`).
fn connect(url: &PgUrl, busy_timeout: Duration) -> Result<PgSession, StoreError> {
    let mut config = url.config.clone();
    config.connect_timeout(busy_timeout);
    // A peer that went silent (a dropped network, a dead host) is found within about a
    // minute instead of the system's two hours, and the writer gets to reconnect.
    config.keepalives_idle(Duration::from_secs(30));
    config.tcp_user_timeout(Duration::from_secs(60));
    if config.get_application_name().is_none() {
        config.application_name("hookledger");
    }
    // `SET` for the session, or `SET LOCAL` for each transaction.
    let settings = |set: &str| {
        format!(
            "{set} lock_timeout = {}; {set} client_min_messages = warning",
            busy_timeout.as_millis().max(1)
        )
    };
    if url.pooler {
        return PgSession::connect(&config, Some(&settings("SET LOCAL")));
    }
    let session = PgSession::connect(&config, None)?;
    session.batch(&settings("SET"))?;
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
            backoff: Backoff::default(),
            connect_error: String::new(),
            handler_limit: DEFAULT_EFFECT_TIMEOUT,
        };
        store
            .migrate()
            .with_context(|| format!("cannot migrate {shown}"))?;
        Ok(store)
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
        let mut applied_now = 0;
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
                    applied_now += usize::from(applied);
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
        if applied_now > 0 {
            log::info!(
                "database at schema version {} ({applied_now} migration(s) applied)",
                MIGRATIONS.len()
            );
        }
        Ok(())
    }

    /// Runs `migrate` (the app's or a handler's migrations) on this connection, each
    /// migration in a transaction under the migration lock.
    fn migrations<T>(
        &self,
        migrate: impl FnOnce(&app_schema::Migrator<'_>) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let session = &self.session;
        let batch = |sql: &str| Ok(session.batch(sql)?);
        let begin = format!("BEGIN; SELECT pg_advisory_xact_lock({MIGRATION_LOCK})");
        migrate(&app_schema::Migrator {
            session,
            batch: &batch,
            begin: &begin,
            level: log::Level::Info,
        })
    }

    /// Statements on the writer's connection, in its transaction if one is open.
    pub(crate) fn session(&self) -> &PgSession {
        &self.session
    }

    /// A new connection in place of one that broke, unless attempts failed lately: then
    /// `Unavailable` at once until the backoff's wait is over (see `backoff.rs`).
    fn reconnect(&mut self) -> Result<(), StoreError> {
        if let Some(left) = self.backoff.remaining(Instant::now()) {
            return Err(StoreError::Unavailable(format!(
                "the last attempt to connect failed ({}); the next in {} ms",
                self.connect_error,
                left.as_millis().max(1)
            )));
        }
        match connect(&self.config, self.busy_timeout) {
            Ok(session) => {
                self.session = session;
                self.backoff.succeeded();
                log::info!("writer: reconnected to PostgreSQL");
                Ok(())
            }
            Err(e) => {
                self.backoff.failed(Instant::now());
                self.connect_error = e.to_string();
                Err(e)
            }
        }
    }
}

impl Store for PgStore {
    /// `BEGIN` (sent with the first statement), the jobs, `COMMIT`. When the batch's new events
    /// share one handler (or have none), they run together ([`pipeline::run_together`]) and
    /// commit with the handler's deferred statements in one round trip. Otherwise, or when the
    /// handler fails on the batch (then, or at the commit), the batch runs again in a new
    /// transaction, each job in a savepoint of its own, so that a bad event fails alone.
    fn run_batch(&mut self, mut work: Vec<Work<'_>>, now: i64) -> Result<Vec<Done>, StoreError> {
        if self.session.is_closed() {
            self.reconnect()?;
        }
        self.session.begin();
        let result = self.run_in_transaction(&mut work, now);
        if result.is_err() {
            self.rollback();
        }
        result
    }

    fn migrate_handler(&mut self, schema: &Schema) -> anyhow::Result<usize> {
        self.migrations(|db| app_schema::migrate_handler(db, schema, |m| m.postgres))
    }

    fn migrate_app(&mut self, folder: &Path) -> anyhow::Result<usize> {
        self.migrations(|db| app_schema::migrate(db, folder))
    }

    fn limit_handlers(&mut self, limit: Duration) {
        self.handler_limit = limit;
    }

    fn check_statement(&mut self, sql: &str, parameters: usize) -> Result<bool, String> {
        let (taken, returns_rows) = self.session.describe(sql).map_err(|e| e.to_string())?;
        if taken != parameters {
            return Err(format!(
                "PostgreSQL counts {taken} parameter(s) where {parameters} are named (is a \
                 :name inside a string or a $$ quote?)"
            ));
        }
        if returns_rows {
            return Ok(true);
        }
        // What the statement does is read from PostgreSQL's own plan of it, not from its text:
        // which tables it changes, and how. That is where the rule on hookledger's own tables
        // is kept on PostgreSQL, at start-up: effects run only the statements checked here. Why
        // not at run time, as SQLite's authorizer does: PostgreSQL has no such hook, and a role
        // without rights on hookledger's tables (`SET LOCAL ROLE` around handlers) needs
        // CREATEROLE and grants a deployment may not allow. What a plan does not show is what
        // functions and triggers do; those are the app's migrations', trusted as its operator.
        match self
            .session
            .plan(sql, parameters)
            .map_err(|e| e.to_string())?
        {
            None => Err(UTILITY.to_string()),
            Some(plan) => match refusal_in_plan(&plan) {
                Some(why) => Err(why),
                None => Ok(false),
            },
        }
    }
}

/// Why a statement that PostgreSQL does not plan is not an effect: a utility statement (DDL,
/// VACUUM, TRUNCATE, CALL, DO, LOCK, SET, …). Some cannot run in a transaction block (VACUUM,
/// CREATE INDEX CONCURRENTLY, …: every event would fail), and what the others change cannot
/// be read from a plan; schema changes belong in the app's migrations.
const UTILITY: &str = "only INSERT, UPDATE, DELETE, MERGE and a data-modifying WITH can be \
                       effects: a utility statement (DDL, VACUUM, TRUNCATE, CALL, DO, LOCK, SET, \
                       ...) is not, and some cannot run inside the event's transaction (put \
                       schema changes in [schema] migrations)";

/// Why an effect may not be the statement PostgreSQL planned as `plan` (`EXPLAIN (FORMAT
/// JSON)`); `None` when it may: a change to one of hookledger's own tables
/// ([`owned::refused`]). Each table a statement changes is a `ModifyTable` node of its plan,
/// its data-modifying WITHs, the views it writes through and the rules it fires included, named
/// as the server resolved it, whatever the text looks like (quoting, schema names, comments).
fn refusal_in_plan(plan: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    let node = match plan {
        Value::Array(plans) => return plans.iter().find_map(refusal_in_plan),
        Value::Object(node) => node,
        _ => return None,
    };
    if node.get("Node Type").and_then(Value::as_str) == Some("ModifyTable") {
        let text = |key: &str| node.get(key).and_then(Value::as_str);
        let change = match text("Operation") {
            Some("Insert") if text("Conflict Resolution") == Some("UPDATE") => Change::Update,
            Some("Insert") => Change::Insert,
            Some("Delete") => Change::Delete,
            // Update, and MERGE (which may do anything to its target).
            _ => Change::Update,
        };
        let targets = node.get("Target Tables").and_then(Value::as_array);
        let refused = std::iter::once(node.get("Relation Name"))
            .chain(
                targets
                    .into_iter()
                    .flatten()
                    .map(|t| t.get("Relation Name")),
            )
            .flatten()
            .filter_map(Value::as_str)
            .find_map(|table| owned::refused(table, change));
        if refused.is_some() {
            return refused;
        }
    }
    node.values().find_map(refusal_in_plan)
}

impl PgStore {
    /// The jobs of [`Store::run_batch`] in the transaction begun, and its commit.
    fn run_in_transaction(
        &mut self,
        work: &mut Vec<Work<'_>>,
        now: i64,
    ) -> Result<Vec<Done>, StoreError> {
        if let Some(handler) = pipeline::shared_handler(work) {
            match pipeline::run_together(self, work, handler.as_ref(), now)? {
                Some(results) => match self.session.commit() {
                    Ok(()) => return Ok(results),
                    Err(CommitError::Commit(e)) => return Err(e),
                    // Job by job, every event would wait out the same lock again: the whole
                    // batch gets the 503 at once.
                    Err(CommitError::Deferred(e)) if self.session.is_closed() || e.is_busy() => {
                        return Err(e)
                    }
                    Err(CommitError::Deferred(e)) => {
                        let name = handler.as_ref().map_or("a handler", |h| h.name());
                        log::warn!(
                            "writer: {name} failed on a batch at commit ({e}); applying it job \
                             by job"
                        );
                        pipeline::prepare_again(work);
                    }
                },
                None => self.session.rollback()?,
            }
            self.session.begin();
        }
        let results = pipeline::run_each(self, work, now)?;
        self.commit()?;
        Ok(results)
    }

    /// Begins a transaction: `BEGIN` goes with the next statement.
    pub(crate) fn begin(&mut self) -> Result<(), StoreError> {
        if self.session.is_closed() {
            self.reconnect()?;
        }
        self.session.begin();
        Ok(())
    }

    /// Commits the open transaction.
    pub(crate) fn commit(&mut self) -> Result<(), StoreError> {
        self.session.commit().map_err(|e| match e {
            CommitError::Deferred(e) | CommitError::Commit(e) => e,
        })
    }

    /// Undoes the open transaction, if there is one.
    pub(crate) fn rollback(&mut self) {
        if !self.session.is_closed() {
            if let Err(e) = self.session.rollback() {
                log::error!("writer: rollback failed: {e}");
            }
        }
    }

    /// Takes the retention lock for this transaction, unless another instance holds it.
    fn holds_retention_lock(&self) -> Result<bool, StoreError> {
        let row = self
            .session
            .query("SELECT pg_try_advisory_xact_lock($1)", &[&RETENTION_LOCK])?;
        Ok(row.first().map(|r| r.get::<i64>(0)).transpose()? == Some(1))
    }
}

/// The open transaction, as the pipeline drives it: a savepoint is a round trip, so the
/// pipeline's batched form takes the claims and the outbox rows in one statement each.
impl pipeline::Batch for PgStore {
    fn session(&self) -> &dyn Session {
        &self.session
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

    fn lost(&self) -> bool {
        self.session.is_closed()
    }

    /// Within the handlers' time limit: a statement still running at the deadline is
    /// cancelled by the server, and fails its event alone (its savepoint's rollback undoes the
    /// limit too).
    fn run_handler(
        &mut self,
        handler: &dyn Handler,
        event: &Event,
        prepared: Prepared,
    ) -> Result<(), StoreError> {
        self.session.limit(Some(self.handler_limit));
        let result = handler.handle(&Tx::new(&self.session), event, prepared);
        self.session.limit(None);
        result
    }

    /// Within one time limit for all: past it the batch runs again job by job, and only the
    /// event that is still too slow fails.
    fn run_handler_all(
        &mut self,
        handler: &dyn Handler,
        events: Vec<(&Event, Prepared)>,
    ) -> Result<(), StoreError> {
        self.session.limit(Some(self.handler_limit));
        let result = handler.handle_all(&Tx::new(&self.session), events);
        self.session.limit(None);
        result
    }

    /// Retention's batches run on one instance at a time (an advisory lock).
    fn write(&mut self, write: &Write, now: i64) -> Result<u64, StoreError> {
        if write.is_prune() && !self.holds_retention_lock()? {
            log::debug!("retention: another instance is pruning");
            return Ok(0);
        }
        pipeline::write_in(&self.session, write, now)
    }

    /// Claims every event of the batch in one statement, in batch (key) order; whether each
    /// is new. Of two copies of one event in a batch, the first is the new one.
    fn claim_all(
        &mut self,
        events: &[(&Event, &Stored)],
        now: i64,
    ) -> Result<Vec<bool>, StoreError> {
        let column =
            |f: fn(&Event) -> &str| events.iter().map(|(e, _)| f(e)).collect::<Vec<&str>>();
        let sources = column(|e| &e.source);
        let ids = column(|e| &e.id);
        let types = column(|e| &e.kind);
        let created: Vec<Option<i64>> = events.iter().map(|(e, _)| e.created).collect();
        let bodies: Vec<&[u8]> = events.iter().map(|(_, s)| &s.bytes[..]).collect();
        let codecs: Vec<i64> = events.iter().map(|(_, s)| s.codec).collect();
        let dicts: Vec<Option<i64>> = events.iter().map(|(_, s)| s.dict).collect();
        let inserted: std::collections::HashSet<(String, String)> = self
            .session
            .query_typed(
                "INSERT INTO webhook_events
                     (source, event_id, event_type, created, received_at, payload,
                      payload_codec, payload_dict)
                 SELECT source, event_id, event_type, created, $5, payload, codec, dict
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $6::bytea[],
                             $7::bigint[], $8::bigint[])
                     AS e (source, event_id, event_type, created, payload, codec, dict)
                 ON CONFLICT (source, event_id) DO NOTHING
                 RETURNING source, event_id",
                &[
                    &sources, &ids, &types, &created, &now, &bodies, &codecs, &dicts,
                ],
            )?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let mut seen = std::collections::HashSet::new();
        Ok(events
            .iter()
            .map(|e| {
                let key = (e.0.source.to_string(), e.0.id.clone());
                inserted.contains(&key) && seen.insert(key)
            })
            .collect())
    }

    /// Queues a `forward` row for each event, in one statement.
    fn enqueue_all(&mut self, events: &[&Event], now: i64) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let sources: Vec<&str> = events.iter().map(|e| &*e.source).collect();
        let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        let types: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        // Each row refers to its event's payload (`outbox::enqueue_forward`).
        self.session.query_typed(
            "INSERT INTO outbox
                 (kind, source, key, event_type, payload, payload_ref, status, next_attempt_at,
                  created_at)
             SELECT $1, source, key, event_type, ''::bytea, 1, 'pending', $5, $5
             FROM unnest($2::text[], $3::text[], $4::text[]) AS e (source, key, event_type)
             ON CONFLICT (kind, source, key) DO NOTHING",
            &[&FORWARD, &sources, &ids, &types, &now],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::scratch::Scratch;

    /// The writer's store on a fresh database, with an app table `t`.
    fn store(db: &Scratch) -> PgStore {
        let store = PgStore::open(&db.url, Duration::from_secs(5)).unwrap();
        store
            .session
            .batch("CREATE TABLE t (x BIGINT, y TEXT)")
            .unwrap();
        store
    }

    /// VACUUM and other statements that cannot run in the event's transaction (or have no plan
    /// to check) pass no start-up check; the statements effects are made of do.
    #[test]
    fn utility_statements_are_refused_at_the_check() {
        let Some(db) = Scratch::new() else { return };
        let mut store = store(&db);
        for sql in [
            "VACUUM",
            "VACUUM t",
            "vacuum (analyze) t",
            "CREATE INDEX CONCURRENTLY t_x ON t (x)",
            "TRUNCATE t",
            "DROP TABLE t",
            "CREATE TABLE u (x INTEGER)",
            "LOCK TABLE t",
            "DO $$ BEGIN DELETE FROM t; END $$",
            "SET LOCAL statement_timeout = 0",
        ] {
            let err = store.check_statement(sql, 0).unwrap_err();
            assert!(
                err.starts_with("only INSERT, UPDATE, DELETE"),
                "{sql}: {err}"
            );
        }
        for (sql, parameters) in [
            ("INSERT INTO t VALUES ($1, $2)", 2),
            ("UPDATE t SET y = $1 WHERE x = 1", 1),
            ("DELETE FROM t WHERE y = $1", 1),
            (
                "WITH gone AS (DELETE FROM t WHERE x = $1 RETURNING x) \
                 INSERT INTO t SELECT x + 1, $2 FROM gone",
                2,
            ),
            ("SELECT FROM pg_sleep(0)", 0),
        ] {
            assert_eq!(store.check_statement(sql, parameters), Ok(false), "{sql}");
        }
        // Nothing of the checks ran or stayed: `t` is there, empty, and no transaction is open.
        let rows = store.session.query("SELECT count(*) FROM t", &[]).unwrap();
        assert_eq!(rows[0].get::<i64>(0), Ok(0));
        store.session.batch("BEGIN; COMMIT").unwrap();
    }

    /// An effect may read hookledger's tables and add outbox rows, and change nothing else of
    /// them, however the statement reaches them (a WITH, a view, upsert, MERGE).
    #[test]
    fn writes_to_hookledgers_own_tables_are_refused_at_the_check() {
        let Some(db) = Scratch::new() else { return };
        let mut store = store(&db);
        store
            .session
            .batch(
                "CREATE VIEW ledger AS SELECT * FROM webhook_events;
                 CREATE TABLE hookledger_extra (x INTEGER)",
            )
            .unwrap();
        let outbox_row = "INSERT INTO outbox (kind, source, key, payload, status, \
                          next_attempt_at, created_at) VALUES ('k', $1, $2, '', 'pending', 0, 0)";
        for (sql, parameters, why) in [
            (
                "DELETE FROM webhook_events WHERE event_id = $1",
                1,
                "is the ledger",
            ),
            ("DELETE FROM public.\"webhook_events\"", 0, "is the ledger"),
            (
                "UPDATE webhook_events SET payload = NULL",
                0,
                "is the ledger",
            ),
            (
                "INSERT INTO webhook_events (source, event_id, event_type, received_at) \
                 VALUES ($1, $2, 'x', 0)",
                2,
                "is the ledger",
            ),
            (
                "WITH gone AS (DELETE FROM webhook_events WHERE event_id = $1 RETURNING 1) \
                 INSERT INTO t SELECT 1, $2 FROM gone",
                2,
                "is the ledger",
            ),
            ("DELETE FROM ledger WHERE source = $1", 1, "is the ledger"),
            (
                "UPDATE outbox SET status = 'pending'",
                0,
                "only add rows to `outbox`",
            ),
            (
                "DELETE FROM outbox WHERE key = $1",
                1,
                "only add rows to `outbox`",
            ),
            (
                &format!(
                    "{outbox_row} ON CONFLICT (kind, source, key) DO UPDATE SET status = 'pending'"
                ),
                2,
                "only add rows to `outbox`",
            ),
            (
                "MERGE INTO outbox o USING (SELECT $1 AS k) s ON o.key = s.k \
                 WHEN MATCHED THEN DELETE",
                1,
                "only add rows to `outbox`",
            ),
            (
                "DELETE FROM hookledger_heartbeat",
                0,
                "hookledger's own table",
            ),
            (
                "INSERT INTO hookledger_extra VALUES (1)",
                0,
                "hookledger's own table",
            ),
            (
                "DROP TABLE webhook_events",
                0,
                "only INSERT, UPDATE, DELETE",
            ),
            ("TRUNCATE outbox", 0, "only INSERT, UPDATE, DELETE"),
        ] {
            let err = store.check_statement(sql, parameters).unwrap_err();
            assert!(err.contains(why), "{sql}: {err}");
        }
        for (sql, parameters) in [
            (format!("{outbox_row} ON CONFLICT DO NOTHING"), 2),
            (outbox_row.to_string(), 2),
            (
                "INSERT INTO t SELECT count(*), $1 FROM webhook_events WHERE event_id = $2".into(),
                2,
            ),
            (
                "INSERT INTO counters (name, value) VALUES ($1, 1) ON CONFLICT (name) \
              DO UPDATE SET value = counters.value + 1"
                    .into(),
                1,
            ),
        ] {
            assert_eq!(store.check_statement(&sql, parameters), Ok(false), "{sql}");
        }
        // Nothing of the checks ran or stayed.
        let rows = store.session.query("SELECT count(*) FROM t", &[]).unwrap();
        assert_eq!(rows[0].get::<i64>(0), Ok(0));
        store.session.batch("BEGIN; COMMIT").unwrap();
    }
}

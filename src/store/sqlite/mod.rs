//! The SQLite store: one file, one write connection owned by the writer thread, read-only
//! connections for everyone else.
//!
//! - Transactions: `BEGIN IMMEDIATE` per batch, `SAVEPOINT hookledger_job` per job (a name no handler uses by mistake), one `COMMIT` (WAL,
//!   `synchronous=FULL`); SQLite's own rollback of a whole transaction (I/O error, full disk)
//!   is seen by `is_autocommit()`.
//! - Errors: busy and locked are [`StoreError::Busy`], a full disk [`StoreError::DiskFull`], a
//!   read-only file [`StoreError::ReadOnly`] (all 503: retry later), anything else
//!   [`StoreError::Database`] (500). A database that is read-only when it is opened for
//!   writing is refused at once.
//! - Migrations are an append-only list keyed by `PRAGMA user_version`: entry `i` moves the
//!   schema from version `i` to `i + 1`. `schema.sql` is migration 1; the later ones are in
//!   `migrations/`. They make the core's tables only: a built-in handler's are its own
//!   ([`Store::migrate_handler`]).
//! - The SQL of the outbox, retention and the listings is shared with PostgreSQL (in
//!   `store/`); which outbox rows are due is here (`due.rs`), and so is the claim: the ledger's
//!   key is unique by block of ids, with an in-memory filter of every key before it (`claims.rs`,
//!   `bloom.rs`). The WAL is copied back by [`checkpoint`], off the commit path.

mod bloom;
pub(crate) mod check;
mod checkpoint;
mod claims;
mod due;
#[cfg(test)]
mod model;
mod tx;

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::hooks::{AuthAction, Authorization};
use rusqlite::{Connection, ErrorCode, OpenFlags};

use crate::config::{DEFAULT_BUSY_TIMEOUT, DEFAULT_EFFECT_TIMEOUT};
use crate::event::Event;
use crate::handler::{Handler, Prepared, Schema};
use crate::outbox::PendingRow;
use crate::payload::Stored;
use crate::sql::{Session, StoreError, Tx};
use crate::store::app_schema;
use crate::store::owned::{self, Change};
use crate::store::pipeline;
use crate::store::seam::{Done, OutboxReader, Poll, Store, Work};

use checkpoint::Checkpointer;
use claims::{Claims, Filter};
use tx::HandlerGuard;

/// Append-only. Never edit a released entry; add a new one.
///
/// One entry was edited once, in a way no existing database sees: migration 1 (`schema.sql`)
/// as released also made the stripe-billing tables (`subscriptions`, `invoice_payments`,
/// `accounts`), which are now that handler's own (`src/stripe/migrations/`). A database that
/// ran it keeps them: `user_version` says it is past migration 1, which never runs there again,
/// and no later migration reads or changes those tables, so such a database is at every later
/// version what a new one is, plus the three tables, which the handler's first migration
/// (`CREATE TABLE IF NOT EXISTS`) then takes as they are. A new database runs migration 1
/// without them, and has them only once a source names stripe-billing.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../schema.sql"),
    include_str!("migrations/0002_outbox_queued.sql"),
    include_str!("migrations/0003_source_in_keys.sql"),
    include_str!("migrations/0004_outbox_lease.sql"),
    include_str!("migrations/0005_heartbeat.sql"),
    include_str!("migrations/0006_outbox_text_identity.sql"),
    include_str!("migrations/0007_outbox_output.sql"),
    include_str!("migrations/0008_outbox_superseded.sql"),
    include_str!("migrations/0009_refusals.sql"),
    include_str!("migrations/0010_alert_incidents.sql"),
    include_str!("migrations/0011_claims_by_block.sql"),
    include_str!("migrations/0012_payload_codec.sql"),
    include_str!("migrations/0013_outbox_pending_indexes.sql"),
    include_str!("migrations/0014_claims_filter.sql"),
    include_str!("migrations/0015_signature_tokens.sql"),
    include_str!("migrations/0016_outbox_repeated_key.sql"),
    include_str!("migrations/0017_claims_integrity.sql"),
];

/// The trigger of migration 16, whose update of an outbox row a running handler may fire.
const REPEATED_KEY_TRIGGER: &str = "outbox_repeated_key";

/// SQLite's virtual machine steps between two looks at a running handler's deadline: a few
/// microseconds of work, so the look (a clock read) costs nothing and the deadline is kept to
/// well under a millisecond.
const PROGRESS_STEPS: std::ffi::c_int = 1000;

/// Prepared statements kept per connection: every hot statement of the ledger, the handlers
/// and the outbox, with room to spare.
const STATEMENT_CACHE: usize = 64;

pub(crate) type ReadPool = r2d2::Pool<SqliteConnectionManager>;

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
                StoreError::Busy(e.to_string())
            }
            Some(ErrorCode::DiskFull) => StoreError::DiskFull(e.to_string()),
            Some(ErrorCode::ReadOnly) => StoreError::ReadOnly(e.to_string()),
            _ => StoreError::Database(e.to_string()),
        }
    }
}

/// The write connection, for the writer thread (and for one CLI command at a time).
pub(crate) struct SqliteStore {
    conn: Connection,
    handler: HandlerGuard,
    /// How long one handler run may take ([`Store::limit_handlers`]).
    handler_limit: Duration,
    /// The event whose handler, interrupted at its deadline, lost the transaction (SQLite
    /// rolls all of it back when it interrupts a write): its source and id.
    over_time: Option<(String, String)>,
    /// Stops with the store: the last checkpoint runs after the last commit.
    checkpoints: Option<Checkpointer>,
    /// Where "applied migration" goes: info, or debug on an in-memory database for a check.
    log_level: log::Level,
    /// The claim path's view of the ledger's keys (`claims.rs`).
    claims: Claims,
}

impl SqliteStore {
    /// Opens (creating if needed) the database for writing, brings its schema up to date and
    /// starts the WAL checkpointer: the writer's store.
    pub(crate) fn open(path: &Path, busy_timeout: Duration) -> anyhow::Result<SqliteStore> {
        SqliteStore::open_bounded(path, busy_timeout, checkpoint::DEFAULT_WAL_LIMIT)
    }

    /// [`SqliteStore::open`], with the WAL file kept within `wal_limit` bytes
    /// (`storage.wal_limit_mb`).
    pub(crate) fn open_bounded(
        path: &Path,
        busy_timeout: Duration,
        wal_limit: u64,
    ) -> anyhow::Result<SqliteStore> {
        let mut store = SqliteStore::open_for_cli(path, busy_timeout)?;
        // The writer's claims consult the filter of every key: loaded if saved, else built
        // in the background while they seek.
        store.claims = Claims::open(&store.conn, Filter::Behind(path.to_path_buf()))
            .with_context(|| format!("cannot read the ledger of {}", path.display()))?;
        store.checkpoints = Some(
            Checkpointer::start(&store.conn, busy_timeout, wal_limit)
                .with_context(|| format!("cannot start checkpoints on {}", path.display()))?,
        );
        Ok(store)
    }

    /// Opens the database for one command's writes, with SQLite's own checkpoints.
    fn open_for_cli(path: &Path, busy_timeout: Duration) -> anyhow::Result<SqliteStore> {
        let mut conn = Connection::open(path)
            .with_context(|| format!("cannot open database file {}", path.display()))?;
        // SQLite opens a file it cannot write read-only, without a word; every write would fail.
        if conn.is_readonly(rusqlite::MAIN_DB)? {
            bail!(
                "database file {} is read-only: hookledger must write to it (check the file's \
                 owner and permissions, and that its file system is not mounted read-only)",
                path.display()
            );
        }
        conn.busy_timeout(busy_timeout)?;
        configure_writer(&conn)
            .with_context(|| format!("cannot configure database file {}", path.display()))?;
        migrate(&mut conn).with_context(|| format!("cannot migrate {}", path.display()))?;
        Ok(SqliteStore::new(conn)?)
    }

    /// Opens an existing database for a CLI command, refusing to create a new empty one (a
    /// typo in `--db` should be an error, not a fresh database that shows nothing).
    pub(crate) fn open_existing(path: &Path) -> anyhow::Result<SqliteStore> {
        if !path.exists() {
            bail!(
                "database file {} does not exist (start `hookledger serve --db {}` first, or pass the right --db)",
                path.display(),
                path.display()
            );
        }
        SqliteStore::open_for_cli(path, DEFAULT_BUSY_TIMEOUT)
    }

    /// A migrated in-memory database: for unit tests, and where a new database's app
    /// migrations and effects are checked before its file is created.
    pub(crate) fn open_in_memory() -> anyhow::Result<SqliteStore> {
        let mut conn = Connection::open_in_memory()?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        // Nothing to tell the operator: this database lives for a check.
        migrate_at(&mut conn, log::Level::Debug)?;
        let mut store = SqliteStore::new(conn)?;
        store.log_level = log::Level::Debug;
        store.claims = Claims::open(&store.conn, Filter::Now)?;
        Ok(store)
    }

    fn new(conn: Connection) -> rusqlite::Result<SqliteStore> {
        let handler = HandlerGuard::default();
        let running = handler.clone();
        conn.authorizer(Some(move |ctx: rusqlite::hooks::AuthContext<'_>| {
            // hookledger's own trigger on a repeated outbox key (migration 16) queues that
            // row again: its update is hookledger's, not the handler's.
            if !running.running() || ctx.accessor == Some(REPEATED_KEY_TRIGGER) {
                return Authorization::Allow;
            }
            match refusal(&ctx.action) {
                Some(why) => {
                    running.refuse(why);
                    Authorization::Deny
                }
                None => Authorization::Allow,
            }
        }))?;
        let interrupt = handler.clone();
        conn.progress_handler(PROGRESS_STEPS, Some(move || interrupt.past_deadline()))?;
        let claims = Claims::open(&conn, Filter::Never)?;
        Ok(SqliteStore {
            conn,
            handler,
            handler_limit: DEFAULT_EFFECT_TIMEOUT,
            over_time: None,
            checkpoints: None,
            log_level: log::Level::Info,
            claims,
        })
    }

    /// `PRAGMA synchronous` for the next transactions: FULL (the connection's setting) or
    /// NORMAL.
    fn set_durability(&self, durability: Durability) -> rusqlite::Result<()> {
        let mode = match durability {
            Durability::Now => "FULL",
            Durability::Later => "NORMAL",
        };
        self.conn.pragma_update(None, "synchronous", mode)
    }

    /// After a batch of `durability` (its transaction ended: committed or rolled back), every
    /// other write on this connection is synced again. A failure is logged, not returned:
    /// the batch's outcome stands, and the next batch sets its own level first.
    fn restore_durability(&self, durability: Durability) {
        if durability == Durability::Later {
            if let Err(e) = self.set_durability(Durability::Now) {
                log::warn!("writer: cannot set synchronous = FULL again after a prune batch: {e}");
            }
        }
    }

    /// Runs `migrate` (the app's or a handler's migrations) on the write connection, each
    /// migration in an immediate transaction.
    fn migrations<T>(
        &self,
        migrate: impl FnOnce(&app_schema::Migrator<'_>) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let conn = &self.conn;
        let batch = |sql: &str| Ok(conn.execute_batch(sql)?);
        migrate(&app_schema::Migrator {
            session: conn,
            batch: &batch,
            begin: "BEGIN IMMEDIATE",
            level: self.log_level,
        })
    }

    /// The transaction as a handler sees it.
    #[cfg(test)]
    pub(crate) fn tx(&self) -> Tx<'_> {
        Tx::new(&self.conn)
    }

    #[cfg(test)]
    pub(crate) fn connection(&self) -> &Connection {
        &self.conn
    }
}

/// When a transaction's COMMIT must be on the disk.
///
/// A batch of retention's alone (nothing is answered after it) commits with `synchronous =
/// NORMAL`: its COMMIT returns without an fsync, so a prune costs the writer its work and
/// not a flush of the disk per batch while requests wait. The next batch that commits FULL
/// (any event) flushes the WAL file with the prune's frames in it, and a checkpoint flushes
/// the WAL before it copies a frame back; a crash before either loses only prune batches
/// (the database stays consistent), which the next prune runs again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    Now,
    Later,
}

impl Durability {
    /// `Later` for a batch of retention's writes alone; `Now` for any other.
    fn of(work: &[Work<'_>]) -> Durability {
        if work
            .iter()
            .all(|w| matches!(w, Work::Write(w) if w.is_prune()))
        {
            Durability::Later
        } else {
            Durability::Now
        }
    }
}

impl Store for SqliteStore {
    /// `BEGIN IMMEDIATE`, the jobs through the pipeline (a savepoint each), `COMMIT`; a
    /// `ROLLBACK` when the transaction failed. A handler interrupted at its time limit in the
    /// middle of a write makes SQLite roll back the whole transaction: then that event fails
    /// alone and the batch runs again without running it.
    fn run_batch(&mut self, mut work: Vec<Work<'_>>, now: i64) -> Result<Vec<Done>, StoreError> {
        let durability = Durability::of(&work);
        loop {
            self.over_time = None;
            self.set_durability(durability)?;
            if let Err(e) = self.conn.execute_batch("BEGIN IMMEDIATE") {
                self.restore_durability(durability);
                return Err(e.into());
            }
            let result = self
                .claims
                .begin(&self.conn)
                .map_err(StoreError::from)
                .and_then(|()| pipeline::run_each(self, &mut work, now))
                .and_then(|done| {
                    self.claims.before_commit(&self.conn)?;
                    Ok(self.conn.execute_batch("COMMIT").map(|()| done)?)
                });
            let Err(e) = result else {
                self.restore_durability(durability);
                self.claims.committed();
                if work
                    .iter()
                    .any(|w| matches!(w, Work::Write(w) if w.is_prune()))
                {
                    if let Err(e) = self.claims.pruned(&self.conn) {
                        log::warn!("retention: reading the ledger's blocks failed: {e}");
                    }
                }
                if let Some(checkpoints) = &self.checkpoints {
                    checkpoints.between_batches(&self.conn);
                }
                return result;
            };
            // Out of the transaction first: SQLite changes `synchronous` only outside one.
            self.rollback();
            self.restore_durability(durability);
            // Each run fails one more event, which runs no handler again: this ends.
            match self.over_time.take() {
                Some((source, id)) if pipeline::fail_event(&mut work, (&source, &id), &e) => {
                    log::warn!("writer: {e}; the batch runs again without that event");
                    pipeline::prepare_again(&mut work);
                }
                _ => return Err(e),
            }
        }
    }

    fn migrate_handler(&mut self, schema: &Schema) -> anyhow::Result<usize> {
        // A handler's migrations make its own tables and write nothing to the ledger: the
        // claims' view of it stays as it is.
        self.migrations(|db| app_schema::migrate_handler(db, schema, |m| m.sqlite))
    }

    fn migrate_app(&mut self, folder: &Path) -> anyhow::Result<usize> {
        let ran = self.migrations(|db| app_schema::migrate(db, folder))?;
        if ran > 0 {
            // An app's migration runs on this connection, unseen by `PRAGMA data_version`.
            self.claims.reload(&self.conn)?;
        }
        Ok(ran)
    }

    fn limit_handlers(&mut self, limit: Duration) {
        self.handler_limit = limit;
    }

    /// Saves the claim filter for the next start (`claims.rs`); the last WAL checkpoint runs
    /// after it, when the store is dropped.
    fn wal_behind(&self) -> Option<crate::store::WalBehind> {
        self.checkpoints.as_ref().map(Checkpointer::behind)
    }

    fn wal_watch(&self) -> Option<std::sync::Arc<crate::store::WalWatch>> {
        self.checkpoints.as_ref().map(Checkpointer::watch)
    }

    fn close(&mut self) {
        if let Err(e) = self.claims.save(&self.conn, crate::time::unix_now()) {
            log::warn!("ledger: saving the filter for the next start failed: {e}");
        }
    }

    fn check_statement(&mut self, sql: &str, parameters: usize) -> Result<bool, String> {
        // Prepared as a handler's statement would be: what a handler may not do is refused
        // here too, with the authorizer's reason (and a PRAGMA, which SQLite applies when
        // preparing, never reaches the connection). Other errors are SQLite's own (no such
        // table, a syntax error, more than one statement).
        let was = self.handler.running();
        self.handler.set(true);
        let checked = self.check_as_handler(sql, parameters);
        self.handler.set(was);
        checked
    }
}

/// Why a handler may not prepare a statement that does `action`; `None` when it may.
fn refusal(action: &AuthAction<'_>) -> Option<String> {
    match *action {
        AuthAction::Transaction { .. } | AuthAction::Savepoint { .. } => {
            Some("hookledger owns the transaction (and its savepoints)".into())
        }
        // A transaction across attached WAL databases is not atomic on a crash, so a handler's
        // effects stay in this file.
        AuthAction::Attach { .. } | AuthAction::Detach { .. } => {
            Some("ATTACH and DETACH are not allowed: effects stay in the ledger's file".into())
        }
        // It changes the writer's connection for every later event (query_only,
        // foreign_keys, ...), and a savepoint does not roll it back.
        AuthAction::Pragma { .. } => Some(
            "PRAGMA is not allowed: it would change the writer's connection for every later event"
                .into(),
        ),
        // Loading a shared library runs its code in hookledger's process (and the extension
        // loader is off, so every event would fail).
        AuthAction::Function { function_name }
            if function_name.eq_ignore_ascii_case("load_extension") =>
        {
            Some(
                "load_extension is not allowed: it would load code into hookledger's process"
                    .into(),
            )
        }
        _ => {
            let (table, change) = change_of(action)?;
            owned::refused(table, change)
        }
    }
}

/// The table `action` changes, and how (SQLite names the table of each insert, update and
/// delete, its triggers' included, and of each schema change).
fn change_of<'a>(action: &AuthAction<'a>) -> Option<(&'a str, Change)> {
    Some(match *action {
        AuthAction::Insert { table_name } => (table_name, Change::Insert),
        AuthAction::Update { table_name, .. } => (table_name, Change::Update),
        AuthAction::Delete { table_name } => (table_name, Change::Delete),
        AuthAction::CreateTable { table_name }
        | AuthAction::CreateTempTable { table_name }
        | AuthAction::DropTable { table_name }
        | AuthAction::DropTempTable { table_name }
        | AuthAction::AlterTable { table_name, .. }
        | AuthAction::CreateIndex { table_name, .. }
        | AuthAction::CreateTempIndex { table_name, .. }
        | AuthAction::DropIndex { table_name, .. }
        | AuthAction::DropTempIndex { table_name, .. }
        | AuthAction::CreateTrigger { table_name, .. }
        | AuthAction::CreateTempTrigger { table_name, .. }
        | AuthAction::DropTrigger { table_name, .. }
        | AuthAction::DropTempTrigger { table_name, .. }
        | AuthAction::CreateVtable { table_name, .. }
        | AuthAction::DropVtable { table_name, .. } => (table_name, Change::Schema),
        AuthAction::CreateView { view_name }
        | AuthAction::CreateTempView { view_name }
        | AuthAction::DropView { view_name }
        | AuthAction::DropTempView { view_name } => (view_name, Change::Schema),
        _ => return None,
    })
}

impl SqliteStore {
    /// [`Store::check_statement`], the guard on.
    fn check_as_handler(&self, sql: &str, parameters: usize) -> Result<bool, String> {
        self.handler.take_refusal();
        // SQLite's own message alone: rusqlite's adds the statement as prepared (with `$1`
        // where the app wrote `:body`); the caller quotes the statement as written.
        let failed = |e: rusqlite::Error| {
            self.handler.take_refusal().unwrap_or_else(|| match e {
                rusqlite::Error::SqlInputError { msg, .. } => msg,
                e => e.to_string(),
            })
        };
        let stmt = self.conn.prepare(sql).map_err(failed)?;
        if stmt.parameter_count() < parameters {
            return Err(format!(
                "SQLite counts {} parameter(s) where {parameters} are named (is a :name \
                 inside a string?)",
                stmt.parameter_count()
            ));
        }
        for i in 1..=stmt.parameter_count() {
            let name = stmt.parameter_name(i);
            if !tx_names(parameters).any(|n| Some(n) == name) {
                return Err(format!("unknown parameter `{}`", name.unwrap_or("?")));
            }
        }
        if stmt.column_count() > 0 {
            return Ok(true);
        }
        // What the authorizer is not asked about, the statement's program shows: VACUUM (which
        // SQLite compiles without a word to the authorizer, and cannot run inside the event's
        // transaction: every event would fail), and the rows an INSERT OR REPLACE deletes (the
        // authorizer sees an insert): each `Delete` names its table.
        let mut program = self
            .conn
            .prepare(&format!("EXPLAIN {sql}"))
            .map_err(failed)?;
        let mut steps = program.raw_query();
        while let Some(step) = steps.next().map_err(|e| e.to_string())? {
            // EXPLAIN's columns: addr, opcode, p1, p2, p3, p4, ...
            let text = |i: usize| step.get_ref(i).ok().and_then(|v| v.as_str().ok());
            match text(1) {
                Some("Vacuum") => {
                    return Err(
                        "VACUUM is not allowed: it cannot run inside the event's transaction"
                            .into(),
                    )
                }
                Some("Delete") => {
                    if let Some(why) = text(5).and_then(|t| owned::refused(t, Change::Delete)) {
                        return Err(why);
                    }
                }
                _ => {}
            }
        }
        Ok(false)
    }
}

impl SqliteStore {
    /// Undoes the open transaction, if there is one.
    fn rollback(&mut self) {
        if !self.conn.is_autocommit() {
            if let Err(e) = self.conn.execute_batch("ROLLBACK") {
                log::error!("writer: rollback failed: {e}");
            }
        }
    }
}

/// The open transaction, as the pipeline drives it.
impl pipeline::Batch for SqliteStore {
    fn session(&self) -> &dyn Session {
        &self.conn
    }

    fn savepoint(&mut self) -> Result<(), StoreError> {
        self.conn
            .prepare_cached("SAVEPOINT hookledger_job")?
            .execute([])?;
        Ok(())
    }

    fn release(&mut self, keep: bool) -> Result<(), StoreError> {
        if !keep {
            self.conn
                .prepare_cached("ROLLBACK TO hookledger_job")?
                .execute([])?;
        }
        self.conn
            .prepare_cached("RELEASE hookledger_job")?
            .execute([])?;
        Ok(())
    }

    /// The claim by block of ids (`claims.rs`).
    fn claim(&mut self, event: &Event, stored: &Stored, now: i64) -> Result<bool, StoreError> {
        self.claims.claim(&self.conn, event, stored, now)
    }

    /// SQLite's own rollback of a whole transaction (an I/O error, a full disk) leaves the
    /// connection in autocommit.
    fn lost(&self) -> bool {
        self.conn.is_autocommit()
    }

    /// The handler runs under the authorizer's guard (no transaction control, ATTACH,
    /// PRAGMA, or change to hookledger's own tables), within its time limit (the progress
    /// handler interrupts its statement at the deadline: the event fails), and must leave the
    /// transaction open.
    fn run_handler(
        &mut self,
        handler: &dyn Handler,
        event: &Event,
        prepared: Prepared,
    ) -> Result<(), StoreError> {
        self.handler.start(self.handler_limit);
        let result = handler.handle(&Tx::new(&self.conn), event, prepared);
        if self.handler.stop() {
            if self.conn.is_autocommit() {
                self.over_time = Some((event.source.to_string(), event.id.clone()));
            }
            return Err(StoreError::Database(format!(
                "{} ran over its time limit (writer.effect_timeout){}",
                handler.name(),
                result.err().map(|e| format!(": {e}")).unwrap_or_default()
            )));
        }
        result?;
        if self.conn.is_autocommit() {
            return Err(StoreError::Database(format!(
                "handler {} ended the transaction",
                handler.name()
            )));
        }
        Ok(())
    }
}

/// The names of the first `n` positional parameters, `$1` to `$n`.
fn tx_names(n: usize) -> impl Iterator<Item = &'static str> {
    crate::sql::DOLLAR_NAMES.iter().copied().take(n)
}

fn configure_writer(conn: &Connection) -> rusqlite::Result<()> {
    // A new database gives the pages pruning frees back to the file system (a batch at a
    // time, after the prune: `Write::Reclaim`). SQLite takes this only before the first table and
    // before the WAL; an existing database keeps its mode until `hookledger vacuum`.
    let tables: i64 = conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
    if tables == 0 {
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    }
    // WAL lets readers (outbox worker, CLI) run while the writer commits.
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        log::warn!("journal_mode is {mode}, not wal (is the file on a network filesystem?)");
    }
    // Durability first: a 200 is only sent after COMMIT, and COMMIT must mean on disk,
    // also on power loss. NORMAL would lose the last commits in WAL mode.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

/// Brings the schema to the newest version, one transaction per migration.
fn migrate(conn: &mut Connection) -> anyhow::Result<()> {
    migrate_at(conn, log::Level::Info)
}

/// [`migrate`], logging at `level` the version reached, in one line, when any migration ran.
fn migrate_at(conn: &mut Connection, level: log::Level) -> anyhow::Result<()> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let version = usize::try_from(version).unwrap_or(usize::MAX);
    if version > MIGRATIONS.len() {
        bail!(
            "database schema version {version} is newer than this hookledger knows ({}); \
             upgrade hookledger",
            MIGRATIONS.len()
        );
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute_batch(sql)
            .with_context(|| format!("migration {} failed", i + 1))?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    if version < MIGRATIONS.len() {
        log::log!(
            level,
            "database at schema version {} ({} migration(s) applied)",
            MIGRATIONS.len(),
            MIGRATIONS.len() - version
        );
    }
    Ok(())
}

/// Held for the life of a server on one database file: a second server on the same file would
/// deliver outbox rows twice and fight for the write lock. CLI commands do not take it.
pub(crate) struct ServeLock {
    _file: std::fs::File,
}

/// Takes the serve lock of the database at `path`: an exclusive lock on `<path>-serve.lock`
/// (a file of its own: closing a second handle on the database file itself would drop
/// SQLite's own locks on it). The lock ends with the process, however it ends.
pub(crate) fn lock_for_serve(path: &Path) -> anyhow::Result<ServeLock> {
    // The same file by another path (a symlink, `./x.db` and `/srv/x.db`) is the same lock,
    // also before the file exists (then its folder is resolved).
    let real = std::fs::canonicalize(path).or_else(|_| {
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .context("the database path names no file")?;
        Ok::<_, anyhow::Error>(std::fs::canonicalize(folder)?.join(name))
    })?;
    let mut name = real.into_os_string();
    name.push("-serve.lock");
    let lock_path = std::path::PathBuf::from(name);
    // Made by another user, it can still be locked through a read-only handle.
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .or_else(|_| std::fs::File::open(&lock_path))
        .with_context(|| format!("cannot create the lock file {}", lock_path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(ServeLock { _file: file }),
        Err(std::fs::TryLockError::WouldBlock) => bail!(
            "another hookledger serve is using this database ({}); stop it first, or give this \
             one its own --db",
            path.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("cannot lock {}", lock_path.display()))
        }
    }
}

/// A pool of read-only connections. The database must already exist (open the writer first).
pub(crate) fn read_pool(path: &Path, size: u32) -> anyhow::Result<ReadPool> {
    let manager = SqliteConnectionManager::file(path)
        .with_flags(OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .with_init(|c| c.busy_timeout(DEFAULT_BUSY_TIMEOUT));
    r2d2::Pool::builder()
        .max_size(size)
        .build(manager)
        .with_context(|| format!("cannot open read connections to {}", path.display()))
}

impl OutboxReader for ReadPool {
    fn due(&self, poll: &Poll<'_>) -> anyhow::Result<Vec<PendingRow>> {
        let in_flight = serde_json::to_string(poll.in_flight)?;
        let (kinds, now, limit) = (poll.kinds, poll.now, poll.limit);
        Ok(due::due(&*self.get()?, kinds, now, limit, &in_flight)?)
    }

    /// No lease to renew: one server a file.
    fn payload(&self, row: &PendingRow, _now: i64) -> anyhow::Result<Option<Vec<u8>>> {
        due::payload(&*self.get()?, row.id, row.queued)
    }

    fn renew(&self, _in_flight: &[i64], _now: i64) -> anyhow::Result<u64> {
        Ok(0)
    }

    fn next_due_at(&self, kinds: &str) -> anyhow::Result<Option<i64>> {
        Ok(due::next_due_at(&*self.get()?, kinds)?)
    }
}

/// Refuses a database file that does not exist (a typo in `--db` should be an error, not a
/// fresh database that shows nothing).
pub(crate) fn check_exists(path: &Path) -> anyhow::Result<()> {
    if !path.exists() {
        bail!(
            "database file {} does not exist (pass --db, or start `hookledger serve` first)",
            path.display()
        );
    }
    Ok(())
}

/// What `hookledger vacuum` did: the database file's size before and after, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Vacuumed {
    pub(crate) before: u64,
    pub(crate) after: u64,
    /// Whether the database gave freed pages back already (`auto_vacuum = INCREMENTAL`).
    pub(crate) was_incremental: bool,
}

/// Rewrites the database at `path` compactly and switches it to `auto_vacuum = INCREMENTAL`,
/// so that from then on pruning gives the space it frees back to the file system. Refused
/// while `serve` runs on it (it takes the serve lock): the rewrite holds the write lock for as
/// long as copying the whole file takes, and needs about the file's size again in free disk
/// (the copy, then the WAL), which it gives back at the end.
pub(crate) fn vacuum(path: &Path) -> anyhow::Result<Vacuumed> {
    check_exists(path)?;
    let _lock = lock_for_serve(path)
        .context("vacuum rewrites the whole file: stop serve on this database first")?;
    let size = || std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let before = size();
    let conn = Connection::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    conn.busy_timeout(DEFAULT_BUSY_TIMEOUT)?;
    let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    conn.execute_batch("VACUUM")
        .with_context(|| format!("VACUUM of {} failed", path.display()))?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    drop(conn);
    Ok(Vacuumed {
        before,
        after: size(),
        was_incremental: mode == 2,
    })
}

/// Opens a read-only connection to an existing database (the copy to PostgreSQL, `check`).
pub(crate) fn open_read(path: &Path) -> anyhow::Result<Connection> {
    check_exists(path)?;
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .with_context(|| format!("cannot open {}", path.display()))?;
    conn.busy_timeout(DEFAULT_BUSY_TIMEOUT)?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::FORWARD;
    use crate::store::outbox;

    /// The trainer's samples are small bodies, by their size as bodies, not only as stored: a
    /// 10 MiB body of one repeated byte is stored in a few hundred bytes, and 33 of them were
    /// read and decompressed at every look of the trainer (every 10 s), 283 MB resident at
    /// once while the outbox's payload budget held 64 MiB.
    #[test]
    fn samples_skip_a_body_over_the_sample_bound_that_compresses_below_it() {
        use crate::payload;
        use crate::store::payload as stored;
        let store = SqliteStore::open_in_memory().unwrap();
        let big = vec![b'x'; 10 << 20];
        let bodies: [&[u8]; 3] = [b"{\"id\":\"evt_1\",\"a\":1}", &big, b"{\"id\":\"evt_3\"}"];
        for (i, body) in bodies.iter().enumerate() {
            let kept = payload::compress(body, None);
            store
                .conn
                .execute(
                    "INSERT INTO webhook_events (source, event_id, event_type, received_at, \
                     payload, payload_codec, payload_dict) VALUES ('s', ?1, 't', ?2, ?3, ?4, ?5)",
                    rusqlite::params![
                        format!("evt_{i}"),
                        i as i64,
                        kept.bytes,
                        kept.codec,
                        kept.dict
                    ],
                )
                .unwrap();
        }
        let stored_big: i64 = store
            .conn
            .query_row(
                "SELECT length(payload) FROM webhook_events WHERE event_id = 'evt_1'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(
            stored_big < 64 * 1024,
            "the big body is stored small: {stored_big} bytes"
        );
        assert!(
            stored::has_samples(&store.conn, "s", 3).unwrap(),
            "three payloads stored small"
        );
        assert!(!stored::has_samples(&store.conn, "s", 4).unwrap());
        let samples = stored::samples(&store.conn, "s", 3).unwrap();
        let sizes: Vec<usize> = samples.iter().map(Vec::len).collect();
        assert_eq!(
            sizes,
            [bodies[2].len(), bodies[0].len()],
            "newest first, the big one skipped"
        );
    }

    /// Retention's batches alone commit without an fsync; a batch with anything else in it
    /// (an event, a delivery's result) commits FULL, and the connection is FULL again after a
    /// prune's batch.
    #[test]
    fn only_a_batch_of_retentions_writes_commits_without_an_fsync() {
        use crate::store::seam::Write;
        let prune = Write::PruneEvents { before: 1 };
        let reclaim = Write::Reclaim;
        let revive = Write::Revive { id: None };
        let of = |writes: &[&Write]| {
            Durability::of(&writes.iter().map(|w| Work::Write(w)).collect::<Vec<_>>())
        };
        assert_eq!(of(&[&prune, &reclaim]), Durability::Later);
        assert_eq!(of(&[&prune, &revive]), Durability::Now);
        assert_eq!(of(&[&revive]), Durability::Now);

        let mut store = SqliteStore::open_in_memory().unwrap();
        store.write_now(&prune, 10).unwrap();
        let synchronous: i64 = store
            .conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(synchronous, 2, "FULL again after the prune's batch");
    }

    /// A prune's batch that fails (here: another connection holds the write lock) leaves the
    /// connection out of any transaction and synced again, so the next batch runs (found by a
    /// review: the level was set back inside the failed transaction, which SQLite refuses, and
    /// the `?` skipped the rollback).
    #[test]
    fn a_failed_batch_of_retention_writes_leaves_the_writer_synced_and_out_of_a_transaction() {
        use crate::store::seam::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("busy.db");
        let mut store = SqliteStore::open_for_cli(&path, Duration::from_millis(50)).unwrap();
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let failed = store.write_now(&Write::PruneEvents { before: 1 }, 10);
        assert!(matches!(failed, Err(StoreError::Busy(_))), "{failed:?}");
        let synchronous: i64 = store
            .conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(synchronous, 2, "FULL again after the failed batch");
        assert!(store.conn.is_autocommit());
        other.execute_batch("ROLLBACK").unwrap();
        assert_eq!(
            store
                .write_now(&Write::PruneEvents { before: 1 }, 10)
                .unwrap(),
            0
        );
    }

    /// The pages a prune frees go back to the file system in batches of at most
    /// RECLAIM_PAGES, until none is left, and the file shrinks.
    #[test]
    fn reclaim_gives_the_freed_pages_back_in_batches() {
        use crate::store::retention::RECLAIM_PAGES;
        use crate::store::seam::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reclaim.db");
        let mut store = SqliteStore::open_for_cli(&path, DEFAULT_BUSY_TIMEOUT).unwrap();
        store
            .conn
            .execute_batch(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000)
                 INSERT INTO webhook_events (source, event_id, event_type, received_at, payload)
                 SELECT 'stripe', 'evt_' || i, 'invoice.paid', 100, randomblob(8000) FROM n;
                 PRAGMA wal_checkpoint(TRUNCATE);",
            )
            .unwrap();
        let pages = |store: &SqliteStore, pragma: &str| -> i64 {
            store.conn.query_row(pragma, [], |r| r.get(0)).unwrap()
        };
        let before = pages(&store, "PRAGMA page_count");
        while store
            .write_now(&Write::PrunePayloads { before: 200 }, 300)
            .unwrap()
            > 0
        {}
        let freed = pages(&store, "PRAGMA freelist_count");
        assert!(freed > RECLAIM_PAGES, "{freed} pages freed");
        let mut batches = Vec::new();
        loop {
            let n = store.write_now(&Write::Reclaim, 300).unwrap();
            if n == 0 {
                break;
            }
            batches.push(n);
        }
        assert!(batches.len() >= 2, "{batches:?}");
        assert!(batches.iter().all(|&n| n <= RECLAIM_PAGES as u64));
        assert_eq!(batches.iter().sum::<u64>(), freed as u64);
        assert_eq!(pages(&store, "PRAGMA freelist_count"), 0);
        // Pointer-map pages at the end go with the pages given back.
        let after = pages(&store, "PRAGMA page_count");
        assert!(
            after <= before - freed,
            "{before} pages, {freed} freed, {after} after"
        );
    }

    #[test]
    fn migrating_twice_changes_nothing_and_a_newer_schema_is_refused() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        migrate(&mut conn).unwrap();
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, MIGRATIONS.len() as i64);
        conn.pragma_update(None, "user_version", 99).unwrap();
        let err = migrate(&mut conn).unwrap_err().to_string();
        assert!(err.contains("newer than this hookledger knows"), "{err}");
    }

    #[test]
    fn migration_3_keys_the_ledger_by_source_and_keeps_every_row() {
        let mut conn = Connection::open_in_memory().unwrap();
        for sql in &MIGRATIONS[..2] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 2).unwrap();
        conn.execute_batch(
            "INSERT INTO webhook_events (event_id, event_type, source, created, received_at, payload)
                 VALUES ('evt_1', 'invoice.paid', 'stripe', 5, 6, x'7b7d'),
                        ('evt_2', 'x', 'stripe', NULL, 7, NULL);
             INSERT INTO outbox (kind, key, payload, status, attempts, next_attempt_at, created_at, queued)
                 VALUES ('forward', 'evt_1', x'7b7d', 'dead', 9, 10, 6, 2);",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        type Row = (String, String, Option<i64>, Option<Vec<u8>>);
        let rows: Vec<Row> = conn
            .prepare(
                "SELECT source, event_id, created, payload FROM webhook_events ORDER BY event_id",
            )
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            rows,
            [
                (
                    "stripe".into(),
                    "evt_1".into(),
                    Some(5),
                    Some(b"{}".to_vec())
                ),
                ("stripe".into(), "evt_2".into(), None, None)
            ]
        );
        let outbox: (String, String, String, i64, i64) = conn
            .query_row(
                "SELECT source, key, status, attempts, queued FROM outbox",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .unwrap();
        assert_eq!(
            outbox,
            ("stripe".into(), "evt_1".into(), "dead".into(), 9, 2)
        );
        // The same id from another source is a new claim.
        conn.execute(
            "INSERT INTO webhook_events (source, event_id, event_type, received_at)
             VALUES ('gh', 'evt_1', 'push', 8)",
            [],
        )
        .unwrap();
    }

    #[test]
    fn migration_2_keeps_the_outbox_rows_of_a_version_1_database() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute_batch(
            "INSERT INTO outbox (kind, key, payload, status, attempts, next_attempt_at, created_at)
             VALUES ('forward', 'evt_1', x'7b7d', 'pending', 3, 10, 5)",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let row: (String, i64, i64) = conn
            .query_row("SELECT key, attempts, queued FROM outbox", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        assert_eq!(row, ("evt_1".to_string(), 3, 0));
    }

    /// Migration 6: an effect's outbox row with a BLOB kind, source, key or event type is
    /// refused (inserted or updated); a number is still taken, and polled as its decimal text.
    #[test]
    fn the_outbox_refuses_a_blob_kind_source_key_or_event_type() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let insert = |kind: &str, source: &str, key: &str, event_type: &str| {
            conn.execute(
                &format!(
                    "INSERT INTO outbox (kind, source, key, event_type, payload)
                     VALUES ({kind}, {source}, {key}, {event_type}, x'7b7d')"
                ),
                [],
            )
        };
        for (kind, source, key, event_type) in [
            ("x'00'", "'s'", "'k1'", "NULL"),
            ("'forward'", "x'7374'", "'k2'", "NULL"),
            ("'forward'", "'s'", "x'ff'", "NULL"),
            ("'forward'", "'s'", "'k4'", "x'74'"),
        ] {
            let err = insert(kind, source, key, event_type).unwrap_err();
            assert!(
                err.to_string().contains("must be text, not a blob"),
                "{err}"
            );
        }
        assert_eq!(insert("'forward'", "'s'", "42", "NULL").unwrap(), 1);
        let err = conn
            .execute("UPDATE outbox SET key = x'00'", [])
            .unwrap_err();
        assert!(
            err.to_string().contains("must be text, not a blob"),
            "{err}"
        );
        let due = due::due(&conn, r#"["forward"]"#, i64::MAX, 10, "[]").unwrap();
        assert_eq!(due[0].key, "42");
    }

    /// Regression: the console counted a kind's dead rows with those an older version let an
    /// effect queue with a BLOB `kind` (shown as the text it spells, or `x'…'`), but retrying
    /// the kind's dead rows matched only TEXT kinds: the button said 3 and retried 1.
    #[test]
    fn retrying_a_kinds_dead_rows_retries_what_the_summary_counts_for_it() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        conn.execute_batch(
            "DROP TRIGGER IF EXISTS outbox_text_identity_insert;
             INSERT INTO outbox (kind, source, key, payload, status) VALUES
                 ('forward', 's', 'k1', x'7b7d', 'dead'),
                 (CAST('forward' AS BLOB), 's', 'k2', x'7b7d', 'dead'),
                 (x'ff', 's', 'k3', x'7b7d', 'dead'),
                 ('forward', 's', 'k4', x'7b7d', 'done'),
                 ('other', 's', 'k5', x'7b7d', 'dead');",
        )
        .unwrap();
        let summary = crate::store::listings::outbox_summary(&conn, &[]).unwrap();
        let dead = |kind: &str| {
            summary
                .counts
                .iter()
                .filter(|c| c.kind == kind && c.status == "dead")
                .map(|c| c.rows)
                .sum::<i64>() as u64
        };
        assert_eq!((dead("forward"), dead("x'FF'")), (2, 1));
        assert_eq!(outbox::retry_dead_of_kind(&conn, "forward", 5).unwrap(), 2);
        assert_eq!(outbox::retry_dead_of_kind(&conn, "x'FF'", 5).unwrap(), 1);
        let dead_left: i64 = conn
            .query_row(
                "SELECT count(*) FROM outbox WHERE status = 'dead'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(dead_left, 1, "only the row of kind `other`");
    }

    #[test]
    fn an_attempt_begun_before_a_replay_does_not_settle_the_replayed_row() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        conn.execute_batch(
            "INSERT INTO webhook_events (event_id, event_type, source, received_at, payload)
             VALUES ('evt_1', 'x', 'stripe', 1, x'7b7d')",
        )
        .unwrap();
        let event = crate::event::Event {
            source: "stripe".into(),
            id: "evt_1".into(),
            kind: "x".into(),
            ..crate::event::Event::default()
        };
        outbox::enqueue(&conn, FORWARD, &event, b"{}", 1, 1).unwrap();
        let row = due::due(&conn, r#"["forward"]"#, 1, 10, "[]")
            .unwrap()
            .remove(0);
        // The attempt is in flight when the event is replayed; then it succeeds.
        assert!(outbox::replay(&conn, "stripe", "evt_1", 2).unwrap());
        let delivered = crate::outbox::Attempt::Delivered { follow_up: None };
        assert_eq!(
            outbox::record(&conn, row.id, row.queued, &delivered, 3).unwrap(),
            0
        );
        let again = due::due(&conn, r#"["forward"]"#, 3, 10, "[]").unwrap();
        assert_eq!(again.len(), 1, "the replay is still to be delivered");
        assert_eq!(
            outbox::record(&conn, row.id, again[0].queued, &delivered, 4).unwrap(),
            1
        );
        assert!(due::due(&conn, r#"["forward"]"#, 5, 10, "[]")
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_write_to_a_read_only_database_is_read_only_not_a_database_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ro.db");
        SqliteStore::open(&path, DEFAULT_BUSY_TIMEOUT).unwrap();
        // What a database that turned read-only under a running server answers.
        let conn = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let err = conn
            .execute("INSERT INTO counters (name, value) VALUES ('x', 1)", [])
            .unwrap_err();
        assert!(
            matches!(StoreError::from(err), StoreError::ReadOnly(_)),
            "classified as read-only"
        );
    }

    /// VACUUM (which the authorizer never hears of) and load_extension pass no start-up check.
    #[test]
    fn vacuum_and_load_extension_are_refused_at_the_check() {
        let mut store = SqliteStore::open_in_memory().unwrap();
        for (sql, why) in [
            ("VACUUM", "VACUUM is not allowed"),
            ("vacuum main", "VACUUM is not allowed"),
            (
                "VACUUM INTO '/nonexistent/copy.db'",
                "VACUUM is not allowed",
            ),
            (
                "INSERT INTO counters (name, value) VALUES (load_extension('/tmp/x.so'), 1)",
                "load_extension is not allowed",
            ),
            (
                "INSERT INTO counters SELECT 'x', LOAD_EXTENSION('/tmp/x.so', 'init')",
                "load_extension is not allowed",
            ),
        ] {
            let err = store.check_statement(sql, 0).unwrap_err();
            assert!(err.contains(why), "{sql}: {err}");
        }
        assert_eq!(
            store.check_statement("INSERT INTO counters (name, value) VALUES ('x', 1)", 0),
            Ok(false)
        );
        assert!(!store.handler.running(), "the guard is off again");
    }

    /// An effect may read hookledger's tables and add outbox rows, and change nothing else of
    /// them: refused at the check with the reason, and denied to a running handler (through an
    /// app trigger too).
    #[test]
    fn writes_to_hookledgers_own_tables_are_refused_at_the_check_and_at_run_time() {
        let mut store = SqliteStore::open_in_memory().unwrap();
        let outbox_row = "INSERT INTO outbox (kind, source, key, payload, status, \
                          next_attempt_at, created_at) VALUES ('k', 's', 'x', x'', 'pending', 0, 0)";
        for (sql, why) in [
            (
                "DELETE FROM webhook_events WHERE event_id = 'x'",
                "is the ledger",
            ),
            ("DELETE FROM main.\"WEBHOOK_EVENTS\"", "is the ledger"),
            ("UPDATE webhook_events SET payload = NULL", "is the ledger"),
            (
                "INSERT INTO webhook_events (source, event_id, event_type, received_at) \
                 VALUES ('s', 'x', 't', 0)",
                "is the ledger",
            ),
            ("DROP TABLE webhook_events", "is the ledger"),
            ("ALTER TABLE webhook_events ADD COLUMN z", "is the ledger"),
            (
                "CREATE INDEX i ON webhook_events (payload)",
                "is the ledger",
            ),
            (
                "CREATE TRIGGER tr AFTER INSERT ON outbox BEGIN DELETE FROM counters; END",
                "only add rows to `outbox`",
            ),
            (
                "UPDATE outbox SET status = 'pending'",
                "only add rows to `outbox`",
            ),
            ("DELETE FROM outbox", "only add rows to `outbox`"),
            (
                &format!("{outbox_row} ON CONFLICT DO UPDATE SET status = 'pending'"),
                "only add rows to `outbox`",
            ),
            (
                &outbox_row.replace("INSERT INTO", "INSERT OR REPLACE INTO"),
                "only add rows to `outbox`",
            ),
            (
                &outbox_row.replace("INSERT INTO", "REPLACE INTO"),
                "only add rows to `outbox`",
            ),
            ("DELETE FROM hookledger_heartbeat", "hookledger's own table"),
            (
                "CREATE TABLE hookledger_extra (x)",
                "hookledger's own table",
            ),
        ] {
            let err = store.check_statement(sql, 0).unwrap_err();
            assert!(err.contains(why), "{sql}: {err}");
        }
        for sql in [
            format!("{outbox_row} ON CONFLICT DO NOTHING"),
            outbox_row.to_string(),
            "INSERT INTO counters SELECT event_id, 1 FROM webhook_events".into(),
            "INSERT OR REPLACE INTO counters (name, value) VALUES ('x', 1)".into(),
            "UPDATE counters SET value = value + 1".into(),
        ] {
            assert_eq!(store.check_statement(&sql, 0), Ok(false), "{sql}");
        }
        // At run time, whatever prepares it: the handler's statement, or an app trigger it
        // fires (made by a migration, the guard off).
        store
            .conn
            .execute_batch(
                "CREATE TABLE orders (id TEXT);
                 CREATE TRIGGER forget AFTER INSERT ON orders BEGIN DELETE FROM webhook_events; END;
                 INSERT INTO webhook_events (source, event_id, event_type, received_at)
                 VALUES ('s', 'evt_1', 't', 0);",
            )
            .unwrap();
        store.handler.set(true);
        for sql in [
            "DELETE FROM webhook_events",
            "INSERT INTO orders VALUES ('o')",
        ] {
            assert!(store.tx().execute(sql, &[]).is_err(), "{sql} ran");
        }
        assert!(store.tx().execute(outbox_row, &[]).is_ok());
        store.handler.set(false);
        let claims: i64 = store
            .conn
            .query_row("SELECT count(*) FROM webhook_events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(claims, 1);
    }

    #[test]
    fn a_handler_cannot_end_the_batch_transaction() {
        let mut store = SqliteStore::open_in_memory().unwrap();
        store.conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        store.handler.set(true);
        for sql in [
            "COMMIT",
            "ROLLBACK",
            "SAVEPOINT x",
            "RELEASE x",
            "BEGIN",
            "ATTACH DATABASE ':memory:' AS other",
            "DETACH DATABASE other",
            "PRAGMA query_only = 1",
            "PRAGMA foreign_keys = OFF",
        ] {
            assert!(store.tx().execute(sql, &[]).is_err(), "{sql} was allowed");
            assert!(
                store.check_statement(sql, 0).is_err(),
                "{sql} passed the start-up check"
            );
        }
        store.handler.set(false);
        let on: i64 = store
            .conn
            .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
            .unwrap();
        assert_eq!(on, 1, "a refused PRAGMA changed nothing");
        assert!(!store.conn.is_autocommit(), "the transaction is still open");
        store.conn.execute_batch("COMMIT").unwrap();
    }
}

/// The console's reads, and the worker's reads of the pending outbox rows, go through indexes:
/// a status page costs the same with a ledger of millions of events as with an empty one, and
/// coalescing or the backlog alert the same with millions of delivered rows.
#[cfg(test)]
mod console_plans {
    use std::cell::RefCell;

    use rusqlite::Connection;

    use super::migrate;
    use crate::sql::{Dialect, Row, Session, StoreError, ToParam};
    use crate::store::console::{self, EventFilter, EventKey};
    use crate::store::{ledger, listings, outbox};

    /// A session that runs each query's `EXPLAIN QUERY PLAN` before it, keeping the plans.
    struct Explained<'c> {
        conn: &'c Connection,
        plans: RefCell<Vec<(String, Vec<String>)>>,
    }

    impl Session for Explained<'_> {
        fn dialect(&self) -> Dialect {
            Dialect::Sqlite
        }

        fn execute(&self, sql: &str, params: &[&dyn ToParam]) -> Result<u64, StoreError> {
            self.explain(sql, params)?;
            Session::execute(self.conn, sql, params)
        }

        fn query(&self, sql: &str, params: &[&dyn ToParam]) -> Result<Vec<Row>, StoreError> {
            self.explain(sql, params)?;
            Session::query(self.conn, sql, params)
        }
    }

    impl Explained<'_> {
        fn explain(&self, sql: &str, params: &[&dyn ToParam]) -> Result<(), StoreError> {
            let plan = Session::query(self.conn, &format!("EXPLAIN QUERY PLAN {sql}"), params)?
                .iter()
                .map(|r| r.get::<String>(3).unwrap())
                .collect();
            self.plans.borrow_mut().push((sql.to_string(), plan));
            Ok(())
        }
    }

    fn explained(
        conn: &Connection,
        read: impl FnOnce(&Explained<'_>),
    ) -> Vec<(String, Vec<String>)> {
        let session = Explained {
            conn,
            plans: RefCell::new(Vec::new()),
        };
        read(&session);
        session.plans.into_inner()
    }

    /// No step of any plan reads a whole table nor sorts: each is a SEARCH of an index.
    fn assert_searched(plans: &[(String, Vec<String>)]) {
        assert!(!plans.is_empty());
        for (sql, plan) in plans {
            for step in plan {
                assert!(
                    step.starts_with("SEARCH ") && !step.contains("TEMP B-TREE"),
                    "`{step}` in the plan of {sql}: {plan:?}"
                );
            }
        }
    }

    /// The plans of `plans` never read the whole ledger, and each that looks a claim up by its
    /// key seeks `webhook_events_key` by block, source and id.
    fn assert_by_key(plans: &[(String, Vec<String>)]) {
        let key = "INDEX webhook_events_key (<expr>=? AND source=? AND event_id=?)";
        for (sql, plan) in plans {
            assert!(
                !plan
                    .iter()
                    .any(|step| step.starts_with("SCAN webhook_events")),
                "{sql}: {plan:?}"
            );
            if sql.contains("event_id = ") {
                let seeks =
                    |s: &String| s.starts_with("SEARCH webhook_events USING ") && s.ends_with(key);
                assert!(plan.iter().any(seeks), "{sql}: {plan:?}");
            }
        }
    }

    /// Every read of a claim by `(source, event_id)` (the console, `hookledger events show`,
    /// replay, reconcile's check, the claim path's seek, a forward row's payload) costs one
    /// seek a block, whatever the ledger holds; retention picks rows by age and deletes them
    /// by id.
    #[test]
    fn every_read_by_key_seeks_the_key_index_once_a_block_and_never_scans_the_ledger() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        conn.execute_batch(
            "INSERT INTO webhook_events (id, source, event_id, event_type, received_at, payload)
             VALUES (1, 'stripe', 'evt_1', 't', 100000, x'7b7d'),
                    (3 << 20, 'gitlab', 'evt_1', 't', 300000, x'7b7d'),
                    (9 << 20, 'stripe', 'evt_2', 't', 900000, x'7b7d');",
        )
        .unwrap();
        let mut found = Vec::new();
        let plans = explained(&conn, |s| {
            found.push(console::event(s, "stripe", "evt_2").unwrap().is_some());
            found.push(listings::event_show(s, "gitlab", "evt_1").is_ok());
            found.push(listings::source_of(s, "evt_2").unwrap() == "stripe");
            found.push(listings::source_of(s, "evt_1").is_err());
            found.push(outbox::replay(s, "stripe", "evt_1", 5).unwrap());
            let none = ledger::by_key(Dialect::Sqlite, "1", "$1", "$2");
            found.push(s.query(&none, &[&"stripe", &"x"]).unwrap().is_empty());
            found.push(
                s.query(
                    &ledger::SQLITE_CLAIMED_IN.replace('?', "$"),
                    &[&ledger::block_of(9 << 20), &"stripe", &"evt_2"],
                )
                .unwrap()
                .len()
                    == 1,
            );
            let payload = crate::store::payload::event_payload(s, "stripe", "evt_1");
            found.push(payload.unwrap().as_deref() == Some(&b"{}"[..]));
            crate::store::retention::delete_events_batch(s, 200000).unwrap();
            crate::store::retention::clear_payloads_batch(s, 400000).unwrap();
        });
        assert_eq!(found, [true; 8], "each read found what is there");
        assert_eq!(plans.len(), 17, "{plans:#?}");
        assert_by_key(&plans);
        let ledger = |sql: &str| {
            sql.starts_with("DELETE FROM webhook_events")
                || sql.starts_with("UPDATE webhook_events")
        };
        let retention: Vec<_> = plans.iter().filter(|(sql, _)| ledger(sql)).collect();
        assert_eq!(retention.len(), 2, "{plans:#?}");
        for (sql, plan) in retention {
            assert!(
                plan.iter()
                    .any(|s| s.contains("USING INTEGER PRIMARY KEY (rowid=?)")),
                "{sql}: {plan:?}"
            );
        }
        // The signatures' tokens go by age too, found through their age index.
        let (sql, plan) = &plans[plans.len() - 2];
        assert!(sql.contains("hookledger_signature_tokens"), "{sql}");
        assert!(
            plan.iter()
                .all(|s| !s.starts_with("SCAN hookledger_signature_tokens")),
            "{sql}: {plan:?}"
        );
    }

    #[test]
    fn the_status_page_and_a_sources_events_search_indexes_and_never_scan_the_ledger() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let sources = vec!["stripe".to_string(), "gitlab".to_string()];
        let plans = explained(&conn, |s| {
            console::summaries(s, &sources, 10_000).unwrap();
            console::refused(s, crate::refusals::UNKNOWN_SOURCE, 10_000).unwrap();
            crate::store::listings::outbox_dead(s, 20).unwrap();
        });
        assert_searched(&plans);
        let filter = EventFilter {
            source: Some("stripe".into()),
            id_prefix: Some("evt_1".into()),
            from: Some(100),
            to: Some(9_000),
            event_type: Some("invoice.paid".into()),
        };
        let key = EventKey {
            received_at: 5_000,
            source: "stripe".into(),
            event_id: "evt_19".into(),
        };
        let plans = explained(&conn, |s| {
            console::events(
                s,
                &EventFilter {
                    source: Some("stripe".into()),
                    ..EventFilter::default()
                },
                51,
                Some(&key),
            )
            .unwrap();
            console::events(s, &filter, 51, None).unwrap();
        });
        assert_searched(&plans);
        // Without a source, a page is a walk down the received_at index from the key.
        let plans = explained(&conn, |s| {
            console::events(s, &EventFilter::default(), 51, Some(&key)).unwrap();
        });
        for (sql, plan) in &plans {
            assert!(
                plan.iter()
                    .any(|step| step.starts_with("SEARCH webhook_events USING")),
                "{sql}: {plan:?}"
            );
        }
    }

    /// Coalescing's update finds a kind's pending rows, and for each a newer one of its
    /// source, by searches of `outbox_coalesce`; the backlog alert's oldest pending row is the
    /// first entry of `outbox_pending_age`, with no sort. Neither scans the outbox.
    #[test]
    fn coalescing_and_the_oldest_pending_row_search_indexes_and_never_scan_the_outbox() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let plans = explained(&conn, |s| {
            crate::store::outbox::coalesce(s, "deploy", &[7, 9], 1_000).unwrap();
        });
        let [(sql, plan)] = &plans[..] else {
            panic!("one statement: {plans:?}")
        };
        for step in plan {
            assert!(
                !step.starts_with("SCAN ") && !step.contains("TEMP B-TREE"),
                "`{step}` in the plan of {sql}: {plan:?}"
            );
        }
        for table in ["outbox", "newer"] {
            let search = format!("SEARCH {table} USING INDEX outbox_coalesce (kind=? AND status=?");
            assert!(
                plan.iter().any(|step| step.starts_with(&search)),
                "{table}: {plan:?}"
            );
        }
        let plans = explained(&conn, |s| {
            crate::store::alerts::oldest_pending(s).unwrap();
        });
        assert_searched(&plans);
        assert!(
            plans[0].1[0].starts_with("SEARCH outbox USING INDEX outbox_pending_age (status=?)"),
            "{plans:?}"
        );
    }
}

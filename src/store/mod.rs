//! The storage seam: what the writer, the outbox worker, retention and the CLI need from a
//! database, and why a write did not happen.
//!
//! [`Store`] is the writer's side: one batch transaction, its jobs ([`Store::run_and_commit`]:
//! by default a savepoint per job), the claim and the handlers of an event ([`Store::apply`]), and the
//! other writes ([`Write`]). Each backend is a module of its own ([`sqlite`], [`postgres`]);
//! its transaction control, its migrations and the classification of its errors into
//! [`StoreError`] stay inside it. The SQL both run is here, on [`Session`]: the claim
//! (`ledger.rs`), the outbox's writes, retention, the listings, the app's migrations, and the
//! copy from one store to the other (`copy.rs`).

mod app_schema;
pub(crate) mod copy;
pub(crate) mod ledger;
pub(crate) mod listings;
pub(crate) mod outbox;
pub(crate) mod postgres;
mod retention;
pub(crate) mod sqlite;

use crate::config::{Database, StorageConfig};
use crate::handler::{Handler, Prepared, Submission};
use crate::outbox::{Attempt, PendingRow};
use crate::sql::{Session, StoreError};

/// What happened to an event that was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// New: claimed, its handlers ran, and (when forwarding) it is queued in the outbox.
    Processed,
    /// Its id was already in the ledger; nothing was written.
    Duplicate,
}

/// A write other than an event, run by the writer as a job of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Write {
    /// The result of a delivery attempt on outbox row `id`, made as it was queued for the
    /// `queued`-th time; changes only that row, still pending (not one queued again since).
    Record {
        id: i64,
        queued: i64,
        attempt: Attempt,
    },
    /// Deletes a batch of ledger rows received before `before`.
    PruneEvents { before: i64 },
    /// Clears the payloads of a batch of ledger rows received before `before`.
    PrunePayloads { before: i64 },
    /// Deletes a batch of delivered outbox rows delivered before `before`.
    PruneOutbox { before: i64 },
    /// Puts dead outbox row `id` back to pending (or, with `None`, every dead row).
    Revive { id: Option<i64> },
    /// Queues a new forward of a stored event of `source`, or puts its existing row back to
    /// pending.
    Replay { source: String, event_id: String },
    /// Rewrites the heartbeat row: `/readyz`'s proof that a write commits.
    Heartbeat { at: i64 },
}

/// One job of a batch, as a store runs it.
pub(crate) enum Work<'a> {
    Event(Submission),
    Write(&'a Write),
}

/// The result of one job before COMMIT decides whether it stands.
pub(crate) enum Done {
    Event(Result<Outcome, StoreError>),
    Write(Result<u64, StoreError>),
}

impl Done {
    pub(crate) fn error(&self) -> Option<&StoreError> {
        match self {
            Done::Event(r) => r.as_ref().err(),
            Done::Write(r) => r.as_ref().err(),
        }
    }
}

/// [`Store::run_and_commit`]'s jobs with a savepoint per job (before the commit).
pub(crate) fn run_each<S: Store + ?Sized>(
    store: &mut S,
    work: Vec<Work<'_>>,
    now: i64,
) -> Result<Vec<Done>, StoreError> {
    let mut results = Vec::with_capacity(work.len());
    for job in work {
        store.savepoint()?;
        let done = match job {
            Work::Event(submission) => Done::Event(store.apply(submission, now)),
            Work::Write(write) => Done::Write(store.write(write, now)),
        };
        if let Some(e) = done.error() {
            // A lost transaction fails the batch; so does a busy or unreachable database,
            // which every other job would wait out again.
            if store.transaction_lost() || e.is_busy() {
                return Err(e.clone());
            }
        }
        store.release(done.error().is_none())?;
        results.push(done);
    }
    Ok(results)
}

/// What must live as long as a server on its database (the SQLite serve lock).
pub(crate) type ServeGuard = Box<dyn std::any::Any + Send>;

/// Opens (creating and migrating if needed) `database` for a server's writer, refusing a
/// second server on a SQLite file.
pub(crate) fn open_for_serve(
    database: &Database,
    storage: &StorageConfig,
) -> anyhow::Result<(Box<dyn Store>, ServeGuard)> {
    match database {
        Database::Sqlite(path) => {
            let lock = sqlite::lock_for_serve(path)?;
            let store = sqlite::SqliteStore::open(path, storage.busy_timeout)?;
            Ok((Box::new(store), Box::new(lock)))
        }
        // Several servers may share it: that is what it is for.
        Database::Postgres(url) => Ok((
            Box::new(postgres::PgStore::open(url, storage.busy_timeout)?),
            Box::new(()),
        )),
    }
}

/// The outbox worker's reads on `database` (opened for serving first).
pub(crate) fn outbox_reader(
    database: &Database,
    storage: &StorageConfig,
) -> anyhow::Result<Box<dyn OutboxReader>> {
    match database {
        Database::Sqlite(path) => Ok(Box::new(sqlite::read_pool(path, 2)?)),
        Database::Postgres(url) => Ok(Box::new(postgres::PgOutbox::open(
            url,
            storage.outbox_lease,
        )?)),
    }
}

/// A store for one CLI command's writes, each its own short transaction. A SQLite file must
/// exist already (a typo in `--db` should be an error, not a fresh database that shows
/// nothing); a PostgreSQL database must exist, and gets hookledger's tables if it has none.
pub(crate) fn open_existing(database: &Database) -> anyhow::Result<Box<dyn Store>> {
    match database {
        Database::Sqlite(path) => Ok(Box::new(sqlite::SqliteStore::open_existing(path)?)),
        Database::Postgres(url) => Ok(Box::new(postgres::PgStore::open(
            url,
            crate::config::DEFAULT_BUSY_TIMEOUT,
        )?)),
    }
}

/// A connection for one CLI command's reads (read-only where the store has such a thing).
pub(crate) fn open_read(database: &Database) -> anyhow::Result<Box<dyn Session>> {
    match database {
        Database::Sqlite(path) => Ok(Box::new(sqlite::open_read(path)?)),
        Database::Postgres(url) => Ok(Box::new(postgres::PgStore::open_read(url)?)),
    }
}

impl Write {
    /// Whether it is one of retention's batches.
    pub(crate) fn is_prune(&self) -> bool {
        matches!(
            self,
            Write::PruneEvents { .. } | Write::PrunePayloads { .. } | Write::PruneOutbox { .. }
        )
    }
}

/// [`Store::apply`] in the open transaction of `tx`: the claim, then the event's handlers (each
/// through `run`, which the store wraps in its own checks), then its outbox row.
pub(crate) fn apply_in(
    tx: &dyn Session,
    submission: Submission,
    now: i64,
    mut run: impl FnMut(&dyn Handler, &crate::event::Event, Prepared) -> Result<(), StoreError>,
) -> Result<Outcome, StoreError> {
    let Submission {
        event,
        handlers,
        forward,
    } = submission;
    if !ledger::claim(tx, &event, now)? {
        return Ok(Outcome::Duplicate);
    }
    for (handler, prepared) in handlers {
        run(&*handler, &event, prepared)?;
    }
    if forward {
        outbox::enqueue(tx, crate::outbox::FORWARD, &event, &event.body, now)?;
    }
    Ok(Outcome::Processed)
}

/// Runs `write` in the open transaction of `tx`: the same SQL on every store. Returns a count
/// for the caller: rows changed or deleted.
pub(crate) fn write_in(tx: &dyn Session, write: &Write, now: i64) -> Result<u64, StoreError> {
    match write {
        Write::Record {
            id,
            queued,
            attempt,
        } => outbox::record(tx, *id, *queued, attempt, now),
        Write::PruneEvents { before } => retention::delete_events_batch(tx, *before),
        Write::PrunePayloads { before } => retention::clear_payloads_batch(tx, *before),
        Write::PruneOutbox { before } => retention::delete_outbox_batch(tx, *before),
        Write::Revive { id: Some(id) } => Ok(u64::from(outbox::retry(tx, *id, now)?)),
        Write::Revive { id: None } => outbox::retry_all_dead(tx, now),
        Write::Replay { source, event_id } => {
            Ok(u64::from(outbox::replay(tx, source, event_id, now)?))
        }
        Write::Heartbeat { at } => tx.execute(
            "INSERT INTO hookledger_heartbeat (id, at) VALUES (1, $1)
             ON CONFLICT (id) DO UPDATE SET at = excluded.at",
            &[at],
        ),
    }
}

/// The writer's view of a database: one transaction per batch, a savepoint per job.
///
/// Every method runs on the writer's thread, in this order for a batch: [`begin`], then per
/// job [`savepoint`], [`apply`] or [`write`], [`release`]; then [`commit`] (or [`rollback`]
/// when the transaction failed).
///
/// [`begin`]: Store::begin
/// [`savepoint`]: Store::savepoint
/// [`apply`]: Store::apply
/// [`write`]: Store::write
/// [`release`]: Store::release
/// [`commit`]: Store::commit
/// [`rollback`]: Store::rollback
pub(crate) trait Store: Send + 'static {
    /// Applies the app's own migrations in `folder`, once each, in name order; how many ran.
    fn migrate_app(&mut self, folder: &std::path::Path) -> anyhow::Result<usize>;
    /// Prepares `sql` (taking `$1` … `$parameters`) as a handler's statement, against the
    /// migrated database: whether it returns rows, or why it cannot run.
    fn check_statement(&mut self, sql: &str, parameters: usize) -> Result<bool, String>;
    fn begin(&mut self) -> Result<(), StoreError>;
    fn savepoint(&mut self) -> Result<(), StoreError>;
    /// Ends the job's savepoint; `keep == false` first undoes the job's writes.
    fn release(&mut self, keep: bool) -> Result<(), StoreError>;
    /// Whether the database itself gave up the whole transaction (an I/O error, a full disk):
    /// then no savepoint can be rolled back to, and the batch is lost.
    fn transaction_lost(&self) -> bool;
    fn commit(&mut self) -> Result<(), StoreError>;
    /// Undoes the open transaction, if there is one.
    fn rollback(&mut self);
    /// The claim, then the event's handlers, then its outbox row.
    fn apply(&mut self, submission: Submission, now: i64) -> Result<Outcome, StoreError>;
    /// Returns a count for the caller: rows changed or deleted.
    fn write(&mut self, write: &Write, now: i64) -> Result<u64, StoreError>;

    /// Runs a batch's jobs, in order, in the open transaction, and commits: a job that fails
    /// changes nothing (its writes are undone) and the others stand. `Err` when the
    /// transaction itself is lost (then nothing of the batch stands). This one takes a
    /// savepoint per job; a store where a round trip costs more than a savepoint may do it its
    /// own way.
    fn run_and_commit(&mut self, work: Vec<Work<'_>>, now: i64) -> Result<Vec<Done>, StoreError> {
        let results = run_each(self, work, now)?;
        self.commit()?;
        Ok(results)
    }
    /// Runs `write` in one short transaction of its own (a CLI command next to a running
    /// `serve`: the database serialises it with the server's writer).
    fn write_now(&mut self, write: &Write, now: i64) -> Result<u64, StoreError> {
        self.begin()?;
        match self.write(write, now) {
            Ok(n) => {
                self.commit()?;
                Ok(n)
            }
            Err(e) => {
                self.rollback();
                Err(e)
            }
        }
    }
}

/// The outbox worker's view of a database: which rows are due. It reads on connections of its
/// own; the results of its attempts go through the writer ([`Write::Record`]).
pub(crate) trait OutboxReader: Send + 'static {
    /// Up to `limit` pending rows of `kinds` (a JSON array) due at `now`, in id order.
    fn due(&self, kinds: &str, now: i64, limit: usize) -> anyhow::Result<Vec<PendingRow>>;

    /// When the next pending row of `kinds` is due, if any.
    fn next_due_at(&self, kinds: &str) -> anyhow::Result<Option<i64>>;
}

impl<T: OutboxReader + ?Sized> OutboxReader for Box<T> {
    fn due(&self, kinds: &str, now: i64, limit: usize) -> anyhow::Result<Vec<PendingRow>> {
        (**self).due(kinds, now, limit)
    }

    fn next_due_at(&self, kinds: &str) -> anyhow::Result<Option<i64>> {
        (**self).next_due_at(kinds)
    }
}

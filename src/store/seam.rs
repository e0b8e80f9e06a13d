//! The storage seam: what the writer, the outbox worker, retention and the CLI ask of a
//! database. Each store (`sqlite/`, `postgres/`) implements it; the pipeline that runs an
//! event (`pipeline.rs`) is written once on top of it.

use std::path::Path;
use std::time::Duration;

use crate::handler::{Schema, Submission};
use crate::outbox::{Attempt, PendingRow};
use crate::sql::StoreError;

/// What happened to an event that was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// New: claimed, its handlers ran, and (when forwarding) it is queued in the outbox.
    Processed,
    /// Its id was already in the ledger; nothing was written.
    Duplicate,
}

/// A write other than an event, run by the writer as a job of its own.
#[derive(Debug, Clone)]
pub(crate) enum Write {
    /// The result of a delivery attempt on outbox row `id`, made as it was queued for the
    /// `queued`-th time; changes only that row, still pending (not one queued again since).
    Record {
        id: i64,
        queued: i64,
        attempt: Attempt,
    },
    /// Makes the pending rows of `kind` waiting on a retry delay due now: its target answers
    /// again after failures (recovery after an outage).
    Recover { kind: String },
    /// Marks `superseded` each queued row of coalescing `kind` that a newer queued row of its
    /// source and `coalesce_key` replaces; the rows `running` here (and rows another instance
    /// leased) are left alone.
    Coalesce { kind: String, running: Vec<i64> },
    /// Says which kinds coalesce (the worker's, at start): a row queued with the key of an
    /// existing row of such a kind supersedes it (migration 16's trigger); of another kind
    /// the insert is ignored, once per key.
    Coalescing { kinds: Vec<String> },
    /// Ends the lease on row `id` (as queued for the `queued`-th time), handed out but not
    /// attempted: due again for every instance at once. Only while the row still has `lease`
    /// (the one the poll took; none on SQLite): a row another instance leased since is its.
    Release {
        id: i64,
        queued: i64,
        lease: Option<crate::outbox::Lease>,
    },
    /// Deletes a batch of ledger rows received before `before`.
    PruneEvents { before: i64 },
    /// Clears the payloads of a batch of ledger rows received before `before`.
    PrunePayloads { before: i64 },
    /// Deletes a batch of delivered outbox rows delivered before `before`.
    PruneOutbox { before: i64 },
    /// Gives a batch of the pages pruning freed back to the file system (SQLite); the count
    /// is of pages.
    Reclaim,
    /// Puts dead outbox row `id` back to pending (or, with `None`, every dead row).
    Revive { id: Option<i64> },
    /// Puts the dead outbox rows of `kind` back to pending.
    ReviveKind { kind: String },
    /// Queues a new forward of a stored event of `source`, or puts its existing row back to
    /// pending.
    Replay { source: String, event_id: String },
    /// Adds refused requests to the counts `/status` reads (per source, reason and minute),
    /// keeps their messages (at most `messages_kept` per source and reason), and deletes what
    /// was refused before `before`: a flood of refusals is counted exactly in bounded room.
    Refusals {
        counts: Vec<crate::store::refusals::RefusalCount>,
        messages: Vec<crate::store::refusals::RefusalMessage>,
        before: i64,
        messages_kept: i64,
    },
    /// Rewrites the heartbeat row: `/readyz`'s proof that a write commits.
    Heartbeat { at: i64 },
    /// Stores `dict` as the payload dictionary of `source`, unless it has one already.
    Dictionary { source: String, dict: Vec<u8> },
    /// Opens, refreshes or clears an `[[alert]]` incident; opening and clearing queue its
    /// message in the same transaction, only when this write is the one that changed it.
    Alert(crate::store::alerts::Incident),
}

impl Write {
    /// Whether, when it changes rows, it may make an outbox row due (or queue one): the
    /// worker is woken after its commit rather than at its next poll.
    pub(crate) fn makes_due(&self) -> bool {
        matches!(
            self,
            Write::Recover { .. }
                | Write::Release { .. }
                | Write::Revive { .. }
                | Write::ReviveKind { .. }
                | Write::Replay { .. }
                | Write::Alert(_)
        )
    }

    /// Whether it is one of retention's batches.
    pub(crate) fn is_prune(&self) -> bool {
        matches!(
            self,
            Write::PruneEvents { .. }
                | Write::PrunePayloads { .. }
                | Write::PruneOutbox { .. }
                | Write::Reclaim
        )
    }
}

/// One job of a batch, as a store runs it.
// Events are nearly every job: boxing them would cost an allocation per event to save room
// in the few other jobs.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Work<'a> {
    Event(Submission),
    Write(&'a Write),
}

/// The result of one job of a committed batch.
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

/// Set while the write-ahead log has grown past a quarter of its bound, the checkpoints
/// behind the writes ([`Store::wal_behind`]).
pub(crate) type WalBehind = std::sync::Arc<std::sync::atomic::AtomicBool>;

/// The write-ahead log's file as the SQLite checkpointer last saw it (every 100 ms), for
/// `/metrics` and `/status` ([`Store::wal_watch`]): its size, its bound, and the times it
/// stayed past the bound, which only a reader's old snapshot (or writes faster than any
/// checkpoint) causes.
#[derive(Debug, Default)]
pub(crate) struct WalWatch {
    /// `storage.wal_limit_mb`, in bytes.
    pub(crate) limit: std::sync::atomic::AtomicU64,
    /// The file's size at the last look.
    pub(crate) bytes: std::sync::atomic::AtomicU64,
    /// How many times the file stayed past its bound (each counted once, when it is told).
    pub(crate) over_total: std::sync::atomic::AtomicU64,
    /// Unix seconds when the file went past its bound, while it is told as past it; 0 otherwise.
    pub(crate) over_since: std::sync::atomic::AtomicI64,
    /// Whether a reader's snapshot is what keeps it past its bound (the checkpoint could not
    /// copy every frame back, the writer idle or not).
    pub(crate) pinned: std::sync::atomic::AtomicBool,
}

/// The writer's view of a database. A store owns its transactions: [`Store::run_batch`] begins,
/// runs the jobs through the pipeline and commits (or rolls back); nobody else does.
pub(crate) trait Store: Send + 'static {
    /// Runs `work` in one transaction of its own, in order, and commits: a job that fails
    /// changes nothing (its writes are undone) and the others stand. `Err` when the
    /// transaction itself failed (busy, lost, or the COMMIT failed): then nothing of the batch
    /// stands, and the store has rolled back.
    fn run_batch(&mut self, work: Vec<Work<'_>>, now: i64) -> Result<Vec<Done>, StoreError>;

    /// Applies the migrations of a built-in handler's `schema` (its own tables) not applied
    /// yet, once each, in order, and checks its tables; how many ran. Before the app's.
    fn migrate_handler(&mut self, schema: &Schema) -> anyhow::Result<usize>;

    /// Applies the app's own migrations in `folder`, once each, in name order; how many ran.
    fn migrate_app(&mut self, folder: &Path) -> anyhow::Result<usize>;

    /// Bounds each run of a handler (an event's SQL effects, say) to `limit`: past it the
    /// handler's statement is interrupted and that event fails alone; the rest of the batch
    /// commits. Until it is called, [`DEFAULT_EFFECT_TIMEOUT`](crate::config::DEFAULT_EFFECT_TIMEOUT).
    fn limit_handlers(&mut self, limit: Duration);

    /// Prepares `sql` (taking `$1` … `$parameters`) as a handler's statement, against the
    /// migrated database: whether it returns rows, or why it cannot run.
    fn check_statement(&mut self, sql: &str, parameters: usize) -> Result<bool, String>;

    /// At a clean stop, after the last batch: keeps what makes the next start quicker (the
    /// SQLite writer's filter of the ledger's keys). Not called when the writer panics or the
    /// process is killed; a failure is logged, and the next start does without.
    fn close(&mut self) {}

    /// Whether the write-ahead log has grown past a quarter of its bound, for a background
    /// job to wait on before it writes more (SQLite's checkpointer; `None` on a store without
    /// one).
    fn wal_behind(&self) -> Option<WalBehind> {
        None
    }

    /// The write-ahead log's size and the times it stayed past its bound (SQLite's
    /// checkpointer; `None` on a store without one).
    fn wal_watch(&self) -> Option<std::sync::Arc<WalWatch>> {
        None
    }

    /// Runs `write` in one short transaction of its own (a CLI command next to a running
    /// `serve`: the database serialises it with the server's writer). Returns a count: rows
    /// changed or deleted.
    fn write_now(&mut self, write: &Write, now: i64) -> Result<u64, StoreError> {
        match self.run_batch(vec![Work::Write(write)], now)?.pop() {
            Some(Done::Write(result)) => result,
            _ => unreachable!("one write in, one result out"),
        }
    }
}

/// A lane's poll: up to `limit` pending rows of `kinds` (a JSON array) due at `now`, other
/// than the rows `in_flight` here.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Poll<'a> {
    pub(crate) kinds: &'a str,
    pub(crate) now: i64,
    pub(crate) limit: usize,
    pub(crate) in_flight: &'a [i64],
    /// The kind's `concurrency`, held across every instance on the database (PostgreSQL:
    /// rows leased by live instances count against it); `None`: no bound but `limit`. Only
    /// PostgreSQL reads it: on SQLite one server holds the file, and `limit` is the bound.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) concurrency: Option<usize>,
}

impl<'a> Poll<'a> {
    /// With no row in flight.
    pub(crate) fn new(kinds: &'a str, now: i64, limit: usize) -> Poll<'a> {
        Poll {
            kinds,
            now,
            limit,
            in_flight: &[],
            concurrency: None,
        }
    }
}

/// The outbox worker's view of a database: which rows are due, and the payload of the one it
/// attempts. It reads on connections of its own; the results of its attempts go through the
/// writer ([`Write::Record`]).
pub(crate) trait OutboxReader: Send + Sync + 'static {
    /// The rows `poll` asks for, in id order, without their payloads (a poll must not hold
    /// `limit` payloads at once). On PostgreSQL the rows returned are leased until `now` + the
    /// lease: the worker asks only for as many as it can start at once.
    fn due(&self, poll: &Poll<'_>) -> anyhow::Result<Vec<PendingRow>>;

    /// The payload of `row`, read when its attempt starts, while the row is pending as queued
    /// for the `row.queued`-th time; `None` when it is not (done, replayed or revived
    /// meanwhile, or pruned): the attempt is skipped, and a row pending again is polled again.
    /// On PostgreSQL the attempt's start renews the lease (to `now` + the lease), and only
    /// while the row still has the lease the poll took: a row whose lease lapsed while it
    /// waited (for a rate's turn, say) and that another instance took is `None` too.
    fn payload(&self, row: &PendingRow, now: i64) -> anyhow::Result<Option<Vec<u8>>>;

    /// Renews, to `now` + the lease, the leases this instance holds on the rows `in_flight`
    /// here (PostgreSQL; SQLite has none): an attempt longer than the lease (a long command)
    /// keeps its row from the other instances. How many rows changed.
    fn renew(&self, in_flight: &[i64], now: i64) -> anyhow::Result<u64>;

    /// When the next pending row of `kinds` is due, if any.
    fn next_due_at(&self, kinds: &str) -> anyhow::Result<Option<i64>>;

    /// Takes the next turn of `kind`, whose attempts keep `spacing` apart across every
    /// instance on the database: how long to wait for it (PostgreSQL: a row per kind that
    /// every instance's attempts queue on). `None`: one server holds the store (SQLite), and
    /// the lane's own bucket spaces its attempts.
    fn turn(
        &self,
        _kind: &str,
        _spacing: std::time::Duration,
    ) -> anyhow::Result<Option<std::time::Duration>> {
        Ok(None)
    }
}

/// What must live as long as a server on its database (the SQLite serve lock).
pub(crate) type ServeGuard = Box<dyn std::any::Any + Send>;

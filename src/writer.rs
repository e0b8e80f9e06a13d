//! The single writer: one thread owns the only write connection and applies every write.
//!
//! Request handlers (and the outbox worker, and retention) send [`Job`]s over a bounded queue.
//! The thread takes every queued job (up to `batch_max`), and runs them in one
//! `BEGIN IMMEDIATE` transaction with a SAVEPOINT per job and one COMMIT: group commit, one
//! fsync for the whole batch. Because this is the only writer in the process, `BEGIN
//! IMMEDIATE` never waits on another hookledger thread; it can only wait on another process
//! (a CLI command, an `sqlite3` shell) and then for at most the busy timeout.
//!
//! # Ordering
//! Each job's reply is sent only after COMMIT returned, so a 200 always means "on disk".
//! Jobs in a batch run in queue order; two copies of one event in the same batch see each
//! other's claim, so the second is a duplicate.
//!
//! # Failure modes
//! - A job that fails (a constraint, a trigger's `RAISE(ABORT)`) is rolled back to its own
//!   savepoint; the other jobs of the batch commit. The failed job gets an error (500).
//! - If the transaction itself fails (BEGIN busy, COMMIT fails, SQLite rolled the whole
//!   transaction back after an I/O error or a full disk) every job of the batch gets the
//!   error; nothing of the batch is on disk.
//! - A full queue is refused at once (503 + Retry-After), never piled up.

use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode};
use tokio::sync::oneshot;

use crate::event::Event;
use crate::handler::stripe_billing as state;
use crate::handler::stripe_billing::Applied;
use crate::store::sqlite::ledger;
use crate::{outbox, unix_now};

/// Default maximum jobs per transaction. Past a few hundred the batch's fsync is already
/// amortised, and a bounded batch keeps the latency of its first job bounded.
pub const DEFAULT_BATCH_MAX: usize = 256;

/// Default queue depth: about two full batches. A deeper queue only adds latency under
/// overload; the provider retries a 503 anyway.
pub const DEFAULT_QUEUE_DEPTH: usize = 512;

/// How often the checkpointer copies the WAL back into the database file.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(500);

/// Why a write did not happen. Mapped to HTTP in `ingest::status`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("the writer queue is full")]
    QueueFull,
    #[error("hookledger is shutting down")]
    ShuttingDown,
    #[error("the database is locked by another process: {0}")]
    Busy(String),
    #[error("the disk is full: {0}")]
    DiskFull(String),
    #[error("database error: {0}")]
    Database(String),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
                StoreError::Busy(e.to_string())
            }
            Some(ErrorCode::DiskFull) => StoreError::DiskFull(e.to_string()),
            _ => StoreError::Database(e.to_string()),
        }
    }
}

/// What happened to an event that was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// New: claimed, applied and (when forwarding) queued in the outbox.
    Processed(Applied),
    /// Its id was already in the ledger; nothing was written.
    Duplicate,
}

/// A write run inside the batch transaction under its own savepoint. Returns a count for its
/// caller (rows deleted, rows updated).
pub type Task = Box<dyn FnOnce(&Connection) -> rusqlite::Result<u64> + Send>;

/// One unit of work for the writer.
pub enum Job {
    /// A verified webhook event. `reply` receives the outcome after COMMIT.
    Event {
        event: Event,
        reply: oneshot::Sender<Result<Outcome, StoreError>>,
    },
    /// Any other write (outbox results, retention, replays). `reply` after COMMIT.
    Task {
        run: Task,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
}

/// Settings the writer applies to every event.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    pub batch_max: usize,
    pub queue_depth: usize,
    pub credits_per_invoice: i64,
    /// Write a `forward` outbox row for every processed event.
    pub forward: bool,
    /// How long a transaction waits for another process's lock before it fails as busy.
    pub busy_timeout: Duration,
}

/// The sending side of the writer's queue. Cloned by every producer; when the last clone is
/// dropped the writer finishes the queued jobs and its thread ends.
#[derive(Clone)]
pub struct WriterHandle {
    queue: SyncSender<Job>,
}

impl WriterHandle {
    /// Queues an event without waiting; a full queue is `QueueFull` at once.
    pub fn try_submit(
        &self,
        event: Event,
    ) -> Result<oneshot::Receiver<Result<Outcome, StoreError>>, StoreError> {
        let (reply, rx) = oneshot::channel();
        match self.queue.try_send(Job::Event { event, reply }) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(_)) => Err(StoreError::QueueFull),
            Err(TrySendError::Disconnected(_)) => Err(StoreError::ShuttingDown),
        }
    }

    /// Runs `task` in the writer and blocks until it committed. For background threads and
    /// the CLI, never for the async request path.
    pub fn run_blocking(&self, task: Task) -> Result<u64, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.queue
            .send(Job::Task { run: task, reply })
            .map_err(|_| StoreError::ShuttingDown)?;
        rx.blocking_recv().map_err(|_| StoreError::ShuttingDown)?
    }
}

/// The running writer thread (and its WAL checkpointer). `join` waits until every job queued
/// before the last handle was dropped has been committed and answered.
pub struct Writer {
    thread: JoinHandle<()>,
}

impl Writer {
    pub fn join(self) {
        if self.thread.join().is_err() {
            log::error!("writer thread panicked");
        }
    }
}

/// Starts the writer on `conn` (opened by `db::open_writer`). `on_commit` runs after every
/// commit that queued outbox rows (it wakes the outbox worker).
pub fn spawn(
    conn: Connection,
    config: WriterConfig,
    on_commit: Option<Box<dyn Fn() + Send>>,
) -> anyhow::Result<(WriterHandle, Writer)> {
    let checkpoints = Checkpointer::start(&conn, config.busy_timeout)?;
    let (queue, rx) = mpsc::sync_channel(config.queue_depth.max(1));
    let thread = std::thread::Builder::new()
        .name("hookledger-writer".into())
        .spawn(move || {
            run(conn, rx, &config, on_commit.as_deref());
            drop(checkpoints);
        })?;
    Ok((WriterHandle { queue }, Writer { thread }))
}

fn run(
    mut conn: Connection,
    rx: Receiver<Job>,
    config: &WriterConfig,
    on_commit: Option<&(dyn Fn() + Send)>,
) {
    let batch_max = config.batch_max.max(1);
    let mut batch = Vec::with_capacity(batch_max);
    while let Ok(first) = rx.recv() {
        batch.push(first);
        while batch.len() < batch_max {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let queued_outbox = run_batch(&mut conn, &mut batch, config);
        if queued_outbox {
            if let Some(wake) = on_commit {
                wake();
            }
        }
    }
    log::debug!("writer: queue closed, exiting");
}

/// The result of one job before COMMIT decides whether it stands.
enum Done {
    Event(Result<Outcome, StoreError>),
    Task(Result<u64, StoreError>),
}

/// Runs one batch in one transaction and answers every job. Returns whether outbox rows
/// were committed.
fn run_batch(conn: &mut Connection, batch: &mut Vec<Job>, config: &WriterConfig) -> bool {
    let started = Instant::now();
    let result = apply_batch(conn, batch, config);
    let (results, forward) = match result {
        Ok(done) => {
            let forward = config.forward
                && done
                    .iter()
                    .any(|d| matches!(d, Done::Event(Ok(Outcome::Processed(_)))));
            (done, forward)
        }
        Err(e) => {
            log::error!("writer: batch of {} failed: {e}", batch.len());
            if !conn.is_autocommit() {
                if let Err(rollback) = conn.execute_batch("ROLLBACK") {
                    log::error!("writer: rollback failed: {rollback}");
                }
            }
            let failed = batch
                .iter()
                .map(|job| match job {
                    Job::Event { .. } => Done::Event(Err(e.clone())),
                    Job::Task { .. } => Done::Task(Err(e.clone())),
                })
                .collect();
            (failed, false)
        }
    };
    log::trace!(
        "writer: batch of {} in {} us",
        batch.len(),
        started.elapsed().as_micros()
    );
    for (job, done) in batch.drain(..).zip(results) {
        // A dropped receiver means the client went away; the write stands either way.
        match (job, done) {
            (Job::Event { reply, .. }, Done::Event(r)) => {
                let _ = reply.send(r);
            }
            (Job::Task { reply, .. }, Done::Task(r)) => {
                let _ = reply.send(r);
            }
            _ => unreachable!("results are built in job order"),
        }
    }
    forward
}

/// BEGIN IMMEDIATE, one savepoint per job, COMMIT. An `Err` means the whole transaction is
/// lost; per-job failures are inside the `Ok`.
fn apply_batch(
    conn: &mut Connection,
    batch: &mut [Job],
    config: &WriterConfig,
) -> Result<Vec<Done>, StoreError> {
    let now = unix_now();
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let mut results = Vec::with_capacity(batch.len());
    for job in batch.iter_mut() {
        conn.prepare_cached("SAVEPOINT job")?.execute([])?;
        let done = match job {
            Job::Event { event, .. } => Done::Event(apply_event(conn, event, now, config)),
            Job::Task { run, .. } => {
                // The task is consumed; a no-op is left in its place.
                let run = std::mem::replace(run, Box::new(|_| Ok(0)));
                Done::Task(run(conn).map_err(StoreError::from))
            }
        };
        let failed = match &done {
            Done::Event(r) => r.as_ref().err(),
            Done::Task(r) => r.as_ref().err(),
        };
        if let Some(e) = failed {
            if conn.is_autocommit() {
                // SQLite rolled back the whole transaction (I/O error, full disk, ...).
                return Err(e.clone());
            }
            conn.prepare_cached("ROLLBACK TO job")?.execute([])?;
        }
        conn.prepare_cached("RELEASE job")?.execute([])?;
        results.push(done);
    }
    conn.execute_batch("COMMIT")?;
    Ok(results)
}

/// The claim, then the effects, then the outbox row: all or nothing under the savepoint.
fn apply_event(
    conn: &Connection,
    event: &Event,
    now: i64,
    config: &WriterConfig,
) -> Result<Outcome, StoreError> {
    if !ledger::claim(conn, event, now)? {
        return Ok(Outcome::Duplicate);
    }
    let applied = state::apply(
        conn,
        &event.id,
        event.created,
        &event.effect,
        config.credits_per_invoice,
    )?;
    if config.forward {
        outbox::enqueue(conn, outbox::FORWARD, &event.id, &event.body, now)?;
    }
    Ok(Outcome::Processed(applied))
}

/// Copies the WAL back into the database on its own connection and thread, off the commit
/// path. A PASSIVE checkpoint never blocks the writer or readers; it does what it can and the
/// next round does the rest. Dropping the value stops the thread after one last checkpoint.
pub struct Checkpointer {
    _stop: SyncSender<()>,
}

impl Checkpointer {
    /// Turns off SQLite's automatic checkpoints on `writer` (they would run inside COMMIT)
    /// and starts the background thread on the same file.
    pub fn start(writer: &Connection, busy_timeout: Duration) -> anyhow::Result<Checkpointer> {
        writer.pragma_update(None, "wal_autocheckpoint", 0)?;
        // After a checkpoint resets the WAL, shrink its file back to this size.
        writer.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)?;
        let conn = Connection::open(writer.path().unwrap_or_default())?;
        conn.busy_timeout(busy_timeout)?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        let (stop, stopped) = mpsc::sync_channel::<()>(0);
        std::thread::Builder::new()
            .name("hookledger-checkpoint".into())
            .spawn(move || loop {
                let last = !matches!(
                    stopped.recv_timeout(CHECKPOINT_INTERVAL),
                    Err(mpsc::RecvTimeoutError::Timeout)
                );
                if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    log::warn!("WAL checkpoint failed: {e}");
                }
                if last {
                    break;
                }
            })?;
        Ok(Checkpointer { _stop: stop })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::stripe_samples::invoice_event;

    fn config() -> WriterConfig {
        WriterConfig {
            batch_max: 16,
            queue_depth: 16,
            credits_per_invoice: 100,
            forward: true,
            busy_timeout: Duration::from_secs(1),
        }
    }

    fn db() -> Connection {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::store::sqlite::migrate(&mut conn).unwrap();
        conn
    }

    fn event_job(id: &str, invoice: &str) -> (Job, oneshot::Receiver<Result<Outcome, StoreError>>) {
        let body = invoice_event(id, "invoice.paid", 1, invoice, "cus_1", "acct_1");
        let event = crate::event::parse_stripe(bytes::Bytes::from(body)).unwrap();
        let (reply, rx) = oneshot::channel();
        (Job::Event { event, reply }, rx)
    }

    fn count(conn: &Connection, sql: &str) -> i64 {
        conn.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn a_failing_event_rolls_back_only_itself() {
        let mut conn = db();
        conn.execute_batch(
            "CREATE TRIGGER fail BEFORE INSERT ON invoice_payments
             WHEN new.stripe_invoice_id = 'in_bad' BEGIN SELECT RAISE(ABORT, 'injected'); END;",
        )
        .unwrap();
        let (jobs, replies): (Vec<_>, Vec<_>) = [
            ("evt_1", "in_1"),
            ("evt_bad", "in_bad"),
            ("evt_2", "in_2"),
            ("evt_1", "in_1"),
        ]
        .into_iter()
        .map(|(id, invoice)| event_job(id, invoice))
        .unzip();
        let mut batch = jobs;
        assert!(
            run_batch(&mut conn, &mut batch, &config()),
            "outbox rows were queued"
        );
        let outcomes: Vec<_> = replies
            .into_iter()
            .map(|rx| rx.blocking_recv().unwrap())
            .collect();
        assert_eq!(outcomes[0], Ok(Outcome::Processed(Applied::Changed)));
        assert!(
            matches!(outcomes[1], Err(StoreError::Database(_))),
            "{:?}",
            outcomes[1]
        );
        assert_eq!(outcomes[2], Ok(Outcome::Processed(Applied::Changed)));
        assert_eq!(
            outcomes[3],
            Ok(Outcome::Duplicate),
            "a copy in the same batch sees the claim"
        );
        assert_eq!(count(&conn, "SELECT count(*) FROM webhook_events"), 2);
        assert_eq!(count(&conn, "SELECT count(*) FROM outbox"), 2);
        assert_eq!(count(&conn, "SELECT credits FROM accounts"), 200);
    }

    #[test]
    fn a_failed_commit_fails_the_whole_batch() {
        let mut conn = db();
        // A deferred foreign key is only checked at COMMIT: a task that violates it makes the
        // COMMIT itself fail.
        conn.execute_batch(
            "CREATE TABLE parent (id INTEGER PRIMARY KEY);
             CREATE TABLE child (parent_id INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);",
        )
        .unwrap();
        let (good, good_rx) = event_job("evt_1", "in_1");
        let (reply, task_rx) = oneshot::channel();
        let violate: Task = Box::new(|tx| {
            tx.execute("INSERT INTO child (parent_id) VALUES (42)", [])
                .map(|n| n as u64)
        });
        let mut batch = vec![
            good,
            Job::Task {
                run: violate,
                reply,
            },
        ];
        assert!(!run_batch(&mut conn, &mut batch, &config()));
        assert!(matches!(
            good_rx.blocking_recv().unwrap(),
            Err(StoreError::Database(_))
        ));
        assert!(task_rx.blocking_recv().unwrap().is_err());
        assert!(
            conn.is_autocommit(),
            "the failed transaction was rolled back"
        );
        assert_eq!(count(&conn, "SELECT count(*) FROM webhook_events"), 0);
        assert_eq!(count(&conn, "SELECT count(*) FROM child"), 0);
        // The writer's connection is usable again.
        let (again, again_rx) = event_job("evt_1", "in_1");
        run_batch(&mut conn, &mut vec![again], &config());
        assert_eq!(
            again_rx.blocking_recv().unwrap(),
            Ok(Outcome::Processed(Applied::Changed))
        );
    }
}

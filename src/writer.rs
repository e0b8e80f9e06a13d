//! The single writer: one thread owns the only write connection and applies every write.
//!
//! Request handlers (and the outbox worker, and retention) send [`Job`]s over a bounded queue;
//! the events of a request that posts an array of them are one job, never split across batches.
//! The thread takes every queued job (up to `batch_max`), and hands them to the [`Store`] as one
//! batch ([`Store::run_batch`]): one transaction, each job undone alone when it fails, one
//! commit: group commit, one fsync for the whole batch. The writer knows no SQL and no
//! provider, and no transaction: begin, commit and rollback are the store's.
//!
//! On SQLite this is the only writer in the process, so the transaction never waits on another
//! hookledger thread; it can only wait on another process (a CLI command, an `sqlite3` shell)
//! and then for at most the busy timeout.
//!
//! # Ordering
//! Each job's reply is sent only after the commit returned, so a 200 always means "on disk".
//! Jobs in a batch run in the order of their ledger keys (other writes first), so that
//! writers sharing one database take claim locks in one order; two copies of one event in the
//! same batch keep their queue order and see each other's claim, so the second is a
//! duplicate.
//!
//! # Failure modes
//! - A job that fails (a constraint, a trigger's `RAISE(ABORT)`) is rolled back to its own
//!   savepoint; the other jobs of the batch commit. The failed job gets an error (500).
//! - If the transaction itself fails (begin busy, commit fails, the database rolled the whole
//!   transaction back after an I/O error or a full disk) every job of the batch gets the
//!   error; nothing of the batch is on disk. When it failed because the database was busy,
//!   the jobs that queued up during that wait get the same error at once, so no request waits
//!   for more than about one busy timeout. That includes the outbox worker's records of its
//!   attempts: such a row stays pending and is delivered again (delivery is at least once).
//! - A full queue is refused at once (503 + Retry-After), never piled up.
//! - A database that is down fails every batch: the failures are logged at most
//!   [`BATCH_FAILURE_LINES`] a second, each line with the count of those not logged.

use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::oneshot;

use crate::config::WriterConfig;
use crate::handler::Submission;
use crate::log_budget::LogBudget;
use crate::metrics::WriterMetrics;
use crate::sql::StoreError;
use crate::store::{Done, Outcome, Store, Work, Write};
use crate::time::unix_now;

/// Failed batches logged a second at most: while the database is down every batch fails (one
/// per request, or more), and two lines a second, each with the count of the others, say so
/// without filling the disk.
const BATCH_FAILURE_LINES: u32 = 2;

/// The budget of the failed batches' log lines, shared by the writers of the process.
static BATCH_FAILURE_LOG: LogBudget = LogBudget::per_second(BATCH_FAILURE_LINES);

/// One unit of work for the writer.
pub(crate) enum Job {
    /// A verified event and its handlers (`None` once the writer has taken it). `reply`
    /// receives the outcome after COMMIT.
    Event {
        submission: Option<Submission>,
        reply: oneshot::Sender<Result<Outcome, StoreError>>,
    },
    /// The events of one request (a body that is an array of them): one job, so all of them
    /// run in the same batch, each in its own savepoint (empty once the writer has taken
    /// them). `reply` receives their outcomes, in order, after COMMIT.
    Events {
        submissions: Vec<Submission>,
        reply: oneshot::Sender<Vec<Result<Outcome, StoreError>>>,
    },
    /// Any other write (outbox results, retention, replays). `reply` receives the count of
    /// rows it changed, after COMMIT.
    Write {
        write: Write,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
}

/// The ledger key an event claims; `None` for another write.
fn claim_key<'w>(work: &'w Work<'_>) -> Option<(&'w str, &'w str)> {
    match work {
        Work::Event(s) => Some((&s.event.source, &s.event.id)),
        Work::Write(_) => None,
    }
}

/// What the queue carries: jobs, and the request to stop after those already queued.
// A job is nearly every message: boxing it would cost an allocation per event to save room
// in the one `Close`.
#[allow(clippy::large_enum_variant)]
enum Message {
    Job(Job),
    /// Work that needs the store itself between two transactions (a reload compiles the new
    /// effects against it, and applies the migrations of new handlers).
    Lend(Lend),
    Close,
}

/// What [`WriterHandle::lend`] runs on the writer's thread.
type Lend = Box<dyn FnOnce(&mut dyn Store) + Send>;

/// The sending side of the writer's queue. Cloned by every producer; the writer ends when the
/// last clone is dropped or when [`Writer::join`] closes it, after the jobs queued before.
#[derive(Clone)]
pub(crate) struct WriterHandle {
    queue: SyncSender<Message>,
    /// Jobs queued and not yet taken (`std::sync::mpsc` does not tell).
    depth: prometheus_client::metrics::gauge::Gauge,
}

impl WriterHandle {
    /// Queues an event without waiting; a full queue is `QueueFull` at once.
    pub(crate) fn try_submit(
        &self,
        submission: Submission,
    ) -> Result<oneshot::Receiver<Result<Outcome, StoreError>>, StoreError> {
        let (job, rx) = event_job(submission);
        self.try_send(job).map(|()| rx)
    }

    /// Queues the events of one request as one job, without waiting: they run in one batch,
    /// each alone in its savepoint; a full queue is `QueueFull` at once.
    pub(crate) fn try_submit_all(
        &self,
        submissions: Vec<Submission>,
    ) -> Result<oneshot::Receiver<Vec<Result<Outcome, StoreError>>>, StoreError> {
        let (reply, rx) = oneshot::channel();
        let job = Job::Events { submissions, reply };
        self.try_send(Message::Job(job)).map(|()| rx)
    }

    fn try_send(&self, job: Message) -> Result<(), StoreError> {
        // Counted before it is sent, so the writer never takes a job not counted yet.
        self.depth.inc();
        let sent = self.queue.try_send(job);
        if sent.is_err() {
            self.depth.dec();
        }
        match sent {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(StoreError::QueueFull),
            Err(TrySendError::Disconnected(_)) => Err(StoreError::ShuttingDown),
        }
    }

    /// Queues an event, waiting for room in the queue: for background threads (reconcile),
    /// never for the request path, which must not wait.
    pub(crate) fn submit_blocking(
        &self,
        submission: Submission,
    ) -> Result<oneshot::Receiver<Result<Outcome, StoreError>>, StoreError> {
        let (job, rx) = event_job(submission);
        self.depth.inc();
        if self.queue.send(job).is_err() {
            self.depth.dec();
            return Err(StoreError::ShuttingDown);
        }
        Ok(rx)
    }

    /// Runs `work` on the writer's thread with its store, between two transactions, and
    /// blocks until it returned. For background threads (a reload), never for a request.
    pub(crate) fn lend<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut dyn Store) -> T + Send + 'static,
    ) -> Result<T, StoreError> {
        let (reply, rx) = oneshot::channel();
        let lend: Lend = Box::new(move |store| {
            let _ = reply.send(work(store));
        });
        if self.queue.send(Message::Lend(lend)).is_err() {
            return Err(StoreError::ShuttingDown);
        }
        rx.blocking_recv().map_err(|_| StoreError::ShuttingDown)
    }

    /// Jobs queued and not yet taken by the writer: 0 when it is idle or busy with its last
    /// batch (retention sends a batch only then).
    pub(crate) fn queued(&self) -> i64 {
        self.depth.get()
    }

    /// Runs `write` in the writer and blocks until it committed. For background threads,
    /// never for the async request path.
    pub(crate) fn run_blocking(&self, write: Write) -> Result<u64, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.depth.inc();
        if self
            .queue
            .send(Message::Job(Job::Write { write, reply }))
            .is_err()
        {
            self.depth.dec();
            return Err(StoreError::ShuttingDown);
        }
        rx.blocking_recv().map_err(|_| StoreError::ShuttingDown)?
    }
}

/// The queue's message for `submission`, and where its outcome will arrive.
fn event_job(submission: Submission) -> (Message, oneshot::Receiver<Result<Outcome, StoreError>>) {
    let (reply, rx) = oneshot::channel();
    let job = Job::Event {
        submission: Some(submission),
        reply,
    };
    (Message::Job(job), rx)
}

/// A thread that runs beside the writer (the outbox worker, retention, a periodic reconcile)
/// and must stop before it: its last writes go through the writer.
pub(crate) trait Background: Send {
    /// Lets the current step finish (an attempt, a batch, a page), and waits for the thread.
    fn stop(self: Box<Self>);
}

/// The running writer thread.
pub(crate) struct Writer {
    thread: JoinHandle<()>,
    close: SyncSender<Message>,
}

impl Writer {
    /// Closes the queue and waits until every job queued before has been committed and
    /// answered. Jobs queued after (by a handle still alive, e.g. a router an app kept) are
    /// answered `ShuttingDown` and never run.
    pub(crate) fn join(self) {
        let _ = self.close.send(Message::Close);
        drop(self.close);
        if self.thread.join().is_err() {
            log::error!("writer thread panicked");
        }
    }
}

/// Starts the writer on `store`. `on_commit` runs after every commit that may have made an
/// outbox row due: an event processed, or a write that revived, replayed, recovered or released
/// rows, or queued an alert's message (it wakes the outbox worker).
pub(crate) fn spawn(
    store: Box<dyn Store>,
    config: WriterConfig,
    on_commit: Option<Box<dyn Fn() + Send>>,
    metrics: WriterMetrics,
) -> std::io::Result<(WriterHandle, Writer)> {
    let (queue, rx) = mpsc::sync_channel(config.queue_depth.max(1));
    let depth = metrics.queue_depth.clone();
    let thread = std::thread::Builder::new()
        .name("hookledger-writer".into())
        .spawn(move || run(store, rx, config.batch_max, on_commit.as_deref(), &metrics))?;
    let close = queue.clone();
    Ok((WriterHandle { queue, depth }, Writer { thread, close }))
}

fn run(
    mut store: Box<dyn Store>,
    rx: Receiver<Message>,
    batch_max: usize,
    on_commit: Option<&(dyn Fn() + Send)>,
    metrics: &WriterMetrics,
) {
    let batch_max = batch_max.max(1);
    let mut batch = Vec::with_capacity(batch_max);
    let mut closing = false;
    let mut lent: Vec<Lend> = Vec::new();
    loop {
        let first = match rx.recv() {
            Ok(Message::Job(job)) => job,
            Ok(Message::Lend(lend)) => {
                lend(&mut *store);
                continue;
            }
            Ok(Message::Close) | Err(_) => break,
        };
        batch.push(first);
        while batch.len() < batch_max {
            match rx.try_recv() {
                Ok(Message::Job(job)) => batch.push(job),
                Ok(Message::Lend(lend)) => {
                    lent.push(lend);
                    break;
                }
                Ok(Message::Close) => {
                    closing = true;
                    break;
                }
                Err(_) => break,
            }
        }
        metrics.queue_depth.dec_by(batch.len() as i64);
        metrics.batch_size.observe(batch.len() as f64);
        match run_batch(&mut *store, &mut batch) {
            Ok(true) => {
                if let Some(wake) = on_commit {
                    wake();
                }
            }
            Ok(false) => {}
            // The jobs that queued up meanwhile have waited out a busy timeout already: they
            // get the same answer now instead of waiting for a second one.
            Err(busy) => loop {
                match rx.try_recv() {
                    Ok(Message::Job(job)) => {
                        metrics.queue_depth.dec();
                        fail(job, &busy);
                    }
                    Ok(Message::Lend(lend)) => lent.push(lend),
                    Ok(Message::Close) => {
                        closing = true;
                        break;
                    }
                    Err(_) => break,
                }
            },
        }
        for lend in lent.drain(..) {
            lend(&mut *store);
        }
        if closing {
            break;
        }
    }
    // Jobs still queued (after a close) are answered unrun: `ShuttingDown`.
    // Work lent the store after a close is dropped unrun: its caller sees `ShuttingDown`.
    for message in rx.try_iter() {
        if let Message::Job(job) = message {
            metrics.queue_depth.dec();
            fail(job, &StoreError::ShuttingDown);
        }
    }
    store.close();
    log::debug!("writer: queue closed, exiting");
}

/// Answers `job` with `err` without running it.
fn fail(job: Job, err: &StoreError) {
    match job {
        Job::Event { reply, .. } => {
            let _ = reply.send(Err(err.clone()));
        }
        Job::Events {
            submissions, reply, ..
        } => {
            let _ = reply.send(vec![Err(err.clone()); submissions.len()]);
        }
        Job::Write { reply, .. } => {
            let _ = reply.send(Err(err.clone()));
        }
    }
}

/// Runs one batch in one transaction of the store and answers every job. Returns whether the
/// commit may have made an outbox row due (an event processed, a [`Write::makes_due`] that
/// changed rows), or the error if the database was busy.
fn run_batch(store: &mut dyn Store, batch: &mut Vec<Job>) -> Result<bool, StoreError> {
    let started = Instant::now();
    let mut busy = None;
    // Each event is a job of the store's batch, the events of a request's array too; each
    // remembers its place (the writer's job, the element in it) for the replies.
    let mut sizes = Vec::with_capacity(batch.len());
    let mut work = Vec::with_capacity(batch.len());
    for (j, job) in batch.iter_mut().enumerate() {
        match job {
            Job::Event { submission, .. } => {
                let submission = submission.take().expect("each job runs once");
                work.push(((j, 0), Work::Event(submission)));
                sizes.push(1);
            }
            Job::Events { submissions, .. } => {
                sizes.push(submissions.len());
                let events = std::mem::take(submissions).into_iter().enumerate();
                work.extend(events.map(|(e, s)| ((j, e), Work::Event(s))));
            }
            Job::Write { write, .. } => {
                work.push(((j, 0), Work::Write(write)));
                sizes.push(1);
            }
        }
    }
    // Claims in key order: two writers sharing a database (PostgreSQL instances) then lock
    // claim rows in the same order and cannot deadlock on them. A stable sort: two copies of
    // one event keep their order, and other writes (no key) go first, in queue order.
    work.sort_by(|a, b| claim_key(&a.1).cmp(&claim_key(&b.1)));
    let (places, work): (Vec<(usize, usize)>, Vec<Work<'_>>) = work.into_iter().unzip();
    let events = work
        .iter()
        .map(|w| matches!(w, Work::Event(_)))
        .collect::<Vec<_>>();
    let due_writes = work
        .iter()
        .map(|w| matches!(w, Work::Write(w) if w.makes_due()))
        .collect::<Vec<_>>();
    let results = match store.run_batch(work, unix_now()) {
        Ok(done) => done,
        Err(e) => {
            if let Some(more) = BATCH_FAILURE_LOG.admit(unix_now(), "failed batches") {
                log::error!("writer: batch of {} failed: {e}{more}", batch.len());
            }
            if e.is_busy() {
                busy = Some(e.clone());
            }
            events
                .iter()
                .map(|&event| {
                    if event {
                        Done::Event(Err(e.clone()))
                    } else {
                        Done::Write(Err(e.clone()))
                    }
                })
                .collect()
        }
    };
    log::trace!(
        "writer: batch of {} in {} us",
        batch.len(),
        started.elapsed().as_micros()
    );
    let made_due = results.iter().zip(&due_writes).any(|(done, &due_write)| {
        matches!(done, Done::Event(Ok(Outcome::Processed)))
            || (due_write && matches!(done, Done::Write(Ok(1..))))
    });
    // Back in each job's place: the events of an array in their order.
    let mut answers: Vec<Vec<Option<Done>>> = sizes
        .iter()
        .map(|&n| std::iter::repeat_with(|| None).take(n).collect())
        .collect();
    for ((j, e), done) in places.into_iter().zip(results) {
        answers[j][e] = Some(done);
    }
    for (job, done) in batch.drain(..).zip(answers) {
        let mut done = done
            .into_iter()
            .map(|d| d.expect("one result per job of the store's batch"));
        // A dropped receiver means the client went away; the write stands either way.
        match (job, done.next()) {
            (Job::Event { reply, .. }, Some(Done::Event(r))) => {
                let _ = reply.send(r);
            }
            (Job::Write { reply, .. }, Some(Done::Write(r))) => {
                let _ = reply.send(r);
            }
            (Job::Events { reply, .. }, first) => {
                let all = first.into_iter().chain(done).map(|d| match d {
                    Done::Event(r) => r,
                    Done::Write(_) => unreachable!("an array holds events only"),
                });
                let _ = reply.send(all.collect());
            }
            _ => unreachable!("results are built in job order"),
        }
    }
    busy.map_or(Ok(made_due), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::contract::submission;
    use crate::store::sqlite::SqliteStore;

    /// A store whose app table `seen` refuses `evt_bad` (a trigger).
    fn store() -> SqliteStore {
        let store = SqliteStore::open_in_memory().unwrap();
        store
            .connection()
            .execute_batch(
                "CREATE TABLE seen (event_id TEXT NOT NULL);
                 CREATE TRIGGER fail BEFORE INSERT ON seen
                 WHEN new.event_id = 'evt_bad' BEGIN SELECT RAISE(ABORT, 'injected'); END;",
            )
            .unwrap();
        store
    }

    fn event_job(id: &str) -> (Job, oneshot::Receiver<Result<Outcome, StoreError>>) {
        let (reply, rx) = oneshot::channel();
        (
            Job::Event {
                submission: Some(submission(id, true)),
                reply,
            },
            rx,
        )
    }

    fn count(store: &SqliteStore, sql: &str) -> i64 {
        store.connection().query_row(sql, [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn a_failing_event_rolls_back_only_itself() {
        let mut store = store();
        let (jobs, replies): (Vec<_>, Vec<_>) = ["evt_1", "evt_bad", "evt_2", "evt_1"]
            .into_iter()
            .map(event_job)
            .unzip();
        let mut batch = jobs;
        assert_eq!(
            run_batch(&mut store, &mut batch),
            Ok(true),
            "events were processed"
        );
        let outcomes: Vec<_> = replies
            .into_iter()
            .map(|rx| rx.blocking_recv().unwrap())
            .collect();
        assert_eq!(outcomes[0], Ok(Outcome::Processed));
        assert!(
            matches!(outcomes[1], Err(StoreError::Database(_))),
            "{:?}",
            outcomes[1]
        );
        assert_eq!(outcomes[2], Ok(Outcome::Processed));
        assert_eq!(
            outcomes[3],
            Ok(Outcome::Duplicate),
            "a copy in the same batch sees the claim"
        );
        assert_eq!(count(&store, "SELECT count(*) FROM webhook_events"), 2);
        assert_eq!(count(&store, "SELECT count(*) FROM outbox"), 2);
        assert_eq!(count(&store, "SELECT count(*) FROM seen"), 2);
    }

    #[test]
    fn the_events_of_an_array_run_in_one_batch_each_alone_and_answer_in_their_order() {
        let mut store = store();
        let (claimed, claimed_rx) = event_job("evt_b");
        assert_eq!(run_batch(&mut store, &mut vec![claimed]), Ok(true));
        assert_eq!(claimed_rx.blocking_recv().unwrap(), Ok(Outcome::Processed));
        // Out of key order on purpose: the answers keep the array's order.
        let (reply, rx) = oneshot::channel();
        let array = Job::Events {
            submissions: ["evt_c", "evt_bad", "evt_b", "evt_a"]
                .into_iter()
                .map(|id| submission(id, true))
                .collect(),
            reply,
        };
        let (single, single_rx) = event_job("evt_0");
        let mut batch = vec![array, single];
        assert_eq!(run_batch(&mut store, &mut batch), Ok(true));
        let outcomes = rx.blocking_recv().unwrap();
        assert_eq!(outcomes.len(), 4);
        assert_eq!(outcomes[0], Ok(Outcome::Processed));
        assert!(matches!(outcomes[1], Err(StoreError::Database(_))));
        assert_eq!(outcomes[2], Ok(Outcome::Duplicate));
        assert_eq!(outcomes[3], Ok(Outcome::Processed));
        assert_eq!(single_rx.blocking_recv().unwrap(), Ok(Outcome::Processed));
        assert_eq!(
            count(&store, "SELECT count(*) FROM webhook_events"),
            4,
            "evt_b, evt_c, evt_a and evt_0"
        );
        assert_eq!(count(&store, "SELECT count(*) FROM seen"), 4);

        // An array whose transaction fails gets the error for each of its events.
        let (reply, rx) = oneshot::channel();
        let array = Job::Events {
            submissions: vec![submission("evt_d", true)],
            reply,
        };
        fail(array, &StoreError::QueueFull);
        assert_eq!(rx.blocking_recv().unwrap(), [Err(StoreError::QueueFull)]);
    }

    #[test]
    fn a_failed_commit_fails_the_whole_batch() {
        let mut store = store();
        // A deferred foreign key is only checked at COMMIT: an event whose handler violates
        // it makes the COMMIT itself fail.
        store
            .connection()
            .execute_batch(
                "CREATE TABLE parent (id INTEGER PRIMARY KEY);
                 CREATE TABLE child (parent_id INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);
                 CREATE TRIGGER violate AFTER INSERT ON seen WHEN new.event_id = 'evt_fk'
                 BEGIN INSERT INTO child (parent_id) VALUES (42); END;",
            )
            .unwrap();
        let (good, good_rx) = event_job("evt_1");
        let (bad, bad_rx) = event_job("evt_fk");
        let (reply, write_rx) = oneshot::channel();
        let revive = Job::Write {
            write: Write::Revive { id: None },
            reply,
        };
        let mut batch = vec![good, bad, revive];
        assert_eq!(run_batch(&mut store, &mut batch), Ok(false));
        assert!(matches!(
            good_rx.blocking_recv().unwrap(),
            Err(StoreError::Database(_))
        ));
        assert!(bad_rx.blocking_recv().unwrap().is_err());
        assert!(write_rx.blocking_recv().unwrap().is_err());
        assert!(
            store.connection().is_autocommit(),
            "the failed transaction was rolled back"
        );
        assert_eq!(count(&store, "SELECT count(*) FROM webhook_events"), 0);
        assert_eq!(count(&store, "SELECT count(*) FROM child"), 0);
        // The writer's connection is usable again.
        let (again, again_rx) = event_job("evt_1");
        assert_eq!(run_batch(&mut store, &mut vec![again]), Ok(true));
        assert_eq!(again_rx.blocking_recv().unwrap(), Ok(Outcome::Processed));
    }

    #[test]
    fn a_commit_that_revives_or_replays_rows_wakes_the_worker_and_one_that_changes_none_does_not() {
        let mut store = store();
        let (claimed, _rx) = event_job("evt_1");
        assert_eq!(run_batch(&mut store, &mut vec![claimed]), Ok(true));
        let write = |write: Write| {
            let (reply, rx) = oneshot::channel();
            (Job::Write { write, reply }, rx)
        };
        let (revive, rx) = write(Write::Revive { id: None });
        assert_eq!(
            run_batch(&mut store, &mut vec![revive]),
            Ok(false),
            "no dead row: nothing became due"
        );
        assert_eq!(rx.blocking_recv().unwrap(), Ok(0));
        store
            .connection()
            .execute_batch("UPDATE outbox SET status = 'dead'")
            .unwrap();
        let (revive, rx) = write(Write::Revive { id: None });
        assert_eq!(run_batch(&mut store, &mut vec![revive]), Ok(true));
        assert_eq!(rx.blocking_recv().unwrap(), Ok(1));
        store
            .connection()
            .execute_batch("UPDATE outbox SET status = 'dead'")
            .unwrap();
        let (kind, rx) = write(Write::ReviveKind {
            kind: crate::outbox::FORWARD.into(),
        });
        assert_eq!(run_batch(&mut store, &mut vec![kind]), Ok(true));
        assert_eq!(rx.blocking_recv().unwrap(), Ok(1));
        let (replay, rx) = write(Write::Replay {
            source: "src".into(),
            event_id: "evt_1".into(),
        });
        assert_eq!(run_batch(&mut store, &mut vec![replay]), Ok(true));
        assert_eq!(rx.blocking_recv().unwrap(), Ok(1));
        let (heartbeat, _) = write(Write::Heartbeat { at: 1 });
        assert_eq!(
            run_batch(&mut store, &mut vec![heartbeat]),
            Ok(false),
            "a heartbeat makes nothing due"
        );
    }
}

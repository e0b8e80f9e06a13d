//! The outbox worker: delivers committed outbox rows to the app, after commit, at least once.
//!
//! Each delivery kind has a lane of its own, so a slow or dead target delays only its own
//! rows: one poller thread reads the kind's due `pending` rows in id order and hands each to
//! one of the kind's `concurrency` attempt threads through a channel, never a row already in
//! flight (on PostgreSQL the lease also keeps other instances off it). An attempt POSTs the row
//! to the app with Standard Webhooks signature headers and writes the result back through the
//! writer (one writer, always).
//!
//! # Ordering
//! A row exists only once its event committed, so the app never hears of an event hookledger
//! might still roll back. A row is marked `done` only after the app answered 2xx: if the
//! process dies during an attempt, the row is still `pending` and is delivered again after the
//! restart. The app must therefore treat `webhook-id` / `Idempotency-Key` (the event id) as
//! its dedupe key; that makes at-least-once effectively once. With `concurrency` above 1 the
//! rows of one kind are attempted side by side, so they may arrive out of id order.
//!
//! # Failure modes
//! - 2xx → done. 410 Gone → dead at once (the app says the endpoint is gone).
//! - Any other status, a timeout, a refused connection → retried after the next delay of the
//!   schedule, ±20 % jitter, later if the app's `Retry-After` asks (at most
//!   [`crate::outbox::MAX_RETRY_AFTER`]).
//! - When the kind's target takes a row after an outage ([`RECOVER_AFTER`] failures in a row, or
//!   at its first answer since the start a row that had failed before), the kind's rows waiting
//!   on a retry delay become due at once ([`Write::Recover`]): the backlog goes out within
//!   seconds of the app answering again, not at each row's next delay. A row that fails alone
//!   between successes keeps its own schedule.
//! - Circuit breaker: `breaker_failures` failures in a row (no answer or an error status) pause
//!   the kind for `breaker_cooldown`: no attempt of it meanwhile (rows already handed out,
//!   and those waiting for their `rate`'s turn, are left due, and on PostgreSQL their leases
//!   released, [`Write::Release`]); then one
//!   probe. Its success closes the breaker (and makes the waiting rows due,
//!   as above), its failure pauses the kind again. `hookledger_delivery_breaker_open{kind}`.
//! - `coalesce = true`: before it hands rows out, and after each commit or attempt, the poller
//!   has the writer mark `superseded` every queued row of the kind that a newer queued row of
//!   its source (and `coalesce_key`) replaces ([`Write::Coalesce`]): "deploy only the newest
//!   push". A row in flight here, or leased by another instance, is never superseded; the
//!   guards are on each row, so a lease and a supersede cannot both take one.
//! - `rate = "20/s"` (or `"600/m"`): a lane makes at most that many attempts, evenly spaced (a
//!   token bucket of one token, taken just before each attempt, so the target sees the
//!   spacing); the other attempt threads wait their turn.
//! - Schedule used up → dead, with `last_error`. `hookledger outbox retry` revives dead rows.
//! - The database is unavailable → the worker logs, waits and polls again; nothing is lost
//!   because nothing is marked before it happened.
//!
//! # Shutdown
//! `stop` ends the pollers, lets each running attempt finish within its kind's timeout (plus a
//! margin to record it), and leaves every other row due for the restart (on PostgreSQL the
//! leases of the rows not attempted end with the worker's connection).
//!
//! # Memory
//! The worker holds at most one payload per attempt in flight, and the payloads in flight
//! across all kinds add up to at most `storage.outbox_payload_budget` (one payload larger
//! than it goes alone): payloads are read one at a time against that budget (`budget.rs`). A poll reads the ids and metadata of at most `concurrency`
//! due rows, no payload ([`PendingRow`]); the payload of a row is read by id when that row is
//! attempted ([`OutboxReader::payload`]) and dropped when its attempt ends.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::{DeliveryTarget, LaneSettings, PostTarget};
use crate::metrics::Metrics;
use crate::outbox::{next_delay, Attempt, Failure, Observer, PendingRow, Target, FORWARD};
use crate::store::{OutboxReader, Poll, Write};
use crate::time::unix_now;
use crate::trace::Tracer;
use crate::writer::WriterHandle;

mod broker;
mod budget;
mod command;
mod lane;
mod orphans;
mod post;

pub(crate) use lane::Lane;
use lane::{Breaker, Bucket, Gate};
pub(crate) use post::{answer, shown_url, Post};

/// How often the poller renews the leases of the rows in flight (PostgreSQL): the lease is in
/// whole seconds, at least one.
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// How long the worker sleeps when nothing is due and nobody wakes it (it also picks up rows
/// revived by the CLI from another process).
const IDLE_POLL: Duration = Duration::from_secs(1);

/// The targets by outbox kind: `forward`, each `[[delivery]]`, and those the composition
/// root adds (a provider wing's fetches).
#[derive(Default)]
pub(crate) struct Targets(
    Vec<(String, Lane)>,
    Option<Arc<dyn Observer>>,
    /// The payload bytes in flight across all lanes (default: the default budget).
    Option<usize>,
);

impl Targets {
    /// The POST targets of `config`: `forward` and each `[[delivery]]`.
    pub(crate) fn of(
        config: &crate::config::Config,
        tracer: Option<&Arc<Tracer>>,
    ) -> anyhow::Result<Targets> {
        let mut targets = Targets(Vec::new(), None, Some(config.storage.outbox_payload_budget));
        if let Some(forward) = &config.forward {
            targets.add_post(FORWARD, &forward.target()?, tracer)?;
        }
        for delivery in &config.deliveries {
            let kind = delivery.kind.as_str();
            match delivery.target(config.forward.as_ref())? {
                DeliveryTarget::Post(target) => targets
                    .add_post(kind, &target, tracer)
                    .map_err(|e| anyhow::anyhow!("delivery `{kind}`: {e}"))?,
                DeliveryTarget::Command(command) => {
                    if !command.program.exists() {
                        log::warn!(
                            "delivery `{kind}`: the program `{}` does not exist; its rows are \
                             attempted and fail, naming it, until it is there again",
                            command.program.display()
                        );
                    }
                    let (lane, timeout) = (command.lane, command.timeout);
                    let tag = orphans::RunTag::new(&database_identity(config), kind);
                    let command = command::Command::new(command, tag);
                    let schedule = command.schedule();
                    targets
                        .add(kind, Box::new(command), schedule)
                        .settings(lane)
                        .timeout(timeout);
                }
                DeliveryTarget::Broker(broker) => {
                    let target = broker::open(kind, &broker)?;
                    targets
                        .add(kind, target, broker.schedule)
                        .settings(broker.lane)
                        .timeout(broker.timeout);
                }
            }
        }
        Ok(targets)
    }

    /// A lane of signed POSTs to `target`.
    fn add_post(
        &mut self,
        kind: &str,
        target: &PostTarget,
        tracer: Option<&Arc<Tracer>>,
    ) -> anyhow::Result<()> {
        let post = Post::new(target, tracer.cloned())?;
        self.add(kind, Box::new(post), target.schedule.clone())
            .settings(target.lane)
            .timeout(target.timeout);
        Ok(())
    }

    /// Delivers rows of `kind` through `target`, retried on `schedule`, one attempt at a time
    /// unless the returned lane says otherwise.
    pub(crate) fn add(
        &mut self,
        kind: &str,
        target: Box<dyn Target>,
        schedule: Vec<Duration>,
    ) -> &mut Lane {
        self.0.push((
            kind.to_string(),
            Lane {
                target,
                schedule,
                timeout: crate::config::DEFAULT_FORWARD_TIMEOUT,
                settings: LaneSettings::default(),
            },
        ));
        &mut self.0.last_mut().expect("just pushed").1
    }

    /// Tells `observer` of each attempt recorded.
    pub(crate) fn observe(&mut self, observer: Arc<dyn Observer>) {
        self.1 = Some(observer);
    }

    /// Whether there is nothing to deliver (no worker is needed).
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The database as the runs of its command kinds name it (`orphans`): a SQLite file by its
/// canonical path, a PostgreSQL URL without its password.
fn database_identity(config: &crate::config::Config) -> String {
    match &config.database {
        crate::config::Database::Sqlite(path) => std::fs::canonicalize(path)
            .unwrap_or_else(|_| path.clone())
            .display()
            .to_string(),
        postgres => postgres.to_string(),
    }
}

/// Handle to the running worker. `stop` lets the running attempts finish (each within its
/// kind's timeout) and ends the lanes.
pub(crate) struct Worker {
    /// Set by `stop`; every thread checks it between attempts and ends.
    stop: Arc<AtomicBool>,
    /// Wakes every lane's poller, so a sleeping one sees the flag at once.
    wake: Waker,
    /// Each lane's poller.
    pollers: Vec<JoinHandle<()>>,
    /// Each lane's attempt threads, with how long stopping waits for them.
    attempts: Vec<(Duration, JoinHandle<()>)>,
}

/// Counts wake-ups; a lane's poller sleeps until the count moves or its wait is over.
#[derive(Default)]
struct Signal {
    count: Mutex<u64>,
    moved: Condvar,
}

impl Signal {
    fn notify(&self) {
        if let Ok(mut count) = self.count.lock() {
            *count = count.wrapping_add(1);
        }
        self.moved.notify_all();
    }

    fn seen(&self) -> u64 {
        self.count.lock().map(|c| *c).unwrap_or(0)
    }

    /// Waits until a notification after `seen`, at most `timeout`.
    fn wait(&self, seen: u64, timeout: Duration) {
        let Ok(count) = self.count.lock() else { return };
        let _ = self
            .moved
            .wait_timeout_while(count, timeout, |c| *c == seen);
    }
}

/// Wakes every lane's poller (after a commit that queued rows). Never blocks.
#[derive(Clone, Default)]
pub(crate) struct Waker(Arc<Mutex<Vec<Arc<Signal>>>>);

impl Waker {
    pub(crate) fn wake(&self) {
        if let Ok(lanes) = self.0.lock() {
            lanes.iter().for_each(|s| s.notify());
        }
    }

    fn register(&self, signal: Arc<Signal>) {
        if let Ok(mut lanes) = self.0.lock() {
            lanes.push(signal);
        }
    }
}

/// What the threads of one lane share.
struct Shared {
    kind: String,
    lane: Lane,
    pool: Arc<dyn OutboxReader>,
    writer: WriterHandle,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
    /// The ids handed to the attempt threads and not recorded yet: the poller never hands a
    /// row out twice (on SQLite a row in flight is still due).
    in_flight: Mutex<HashSet<i64>>,
    /// The target's failures since its last success.
    failures: AtomicU32,
    /// Whether the target has taken a row since the worker started.
    answered: AtomicBool,
    breaker: Mutex<Breaker>,
    /// The lane's `rate` (none: no limit), taken by each attempt.
    bucket: Mutex<Option<Bucket>>,
    /// Wakes the poller: a commit, a free attempt thread, `stop`.
    signal: Arc<Signal>,
    /// Told of each recorded attempt (the alerts).
    observer: Option<Arc<dyn Observer>>,
    /// The payload bytes in flight across all lanes (one budget, shared by every lane).
    budget: Arc<budget::Budget>,
}

impl Shared {
    /// What the breaker lets the poller do, with `busy` attempts in flight.
    fn gate(&self, busy: usize) -> Gate {
        match self.breaker() {
            Breaker::Closed => Gate::Go,
            Breaker::Probing => Gate::Wait(IDLE_POLL),
            Breaker::Open(until) => match until.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Gate::Wait(left),
                // The attempts in flight when it opened end first: the probe goes alone.
                _ if busy > 0 => Gate::Wait(IDLE_POLL),
                _ => Gate::Probe,
            },
        }
    }

    fn breaker(&self) -> Breaker {
        self.breaker.lock().map(|b| *b).unwrap_or(Breaker::Closed)
    }

    /// Whether the breaker is open: no attempt of the kind now.
    fn paused(&self) -> bool {
        matches!(self.breaker(), Breaker::Open(_))
    }

    fn set_breaker(&self, state: Breaker) {
        if let Ok(mut b) = self.breaker.lock() {
            *b = state;
        }
    }

    /// Counts what an attempt said of the target, opens or closes the breaker; returns the
    /// failures before a success (0 otherwise).
    fn observe(&self, health: Health) -> u32 {
        let Ok(mut breaker) = self.breaker.lock() else {
            return 0;
        };
        let was = *breaker;
        let failed_before =
            match health {
                Health::Up => self.failures.swap(0, Ordering::SeqCst),
                Health::Down => {
                    let failures = self.failures.fetch_add(1, Ordering::SeqCst) + 1;
                    let reopen = was == Breaker::Probing;
                    if reopen
                        || (was == Breaker::Closed
                            && failures >= self.lane.settings.breaker_failures)
                    {
                        *breaker =
                            Breaker::Open(Instant::now() + self.lane.settings.breaker_cooldown);
                        log::warn!(
                        "outbox: {} {} after {failures} failures in a row; no attempt for {:.0?}",
                        self.kind,
                        if reopen { "probe failed, paused again" } else { "paused" },
                        self.lane.settings.breaker_cooldown
                    );
                        self.metrics.breaker(&self.kind, true);
                    }
                    0
                }
                Health::Answered => 0,
            };
        if health != Health::Down && was != Breaker::Closed {
            *breaker = Breaker::Closed;
            log::info!("outbox: {} answers again; delivering", self.kind);
            self.metrics.breaker(&self.kind, false);
        }
        failed_before
    }

    /// Waits for a token of the lane's rate (none: no limit); false when stopping. The
    /// attempt threads wait in turn: the one holding the bucket sleeps until its token. On
    /// PostgreSQL the token is the kind's next turn across every instance; if the database
    /// cannot give one, the lane's own bucket does.
    fn turn(&self) -> bool {
        let Ok(mut bucket) = self.bucket.lock() else {
            return false;
        };
        let Some(bucket) = bucket.as_mut() else {
            return !self.stopped();
        };
        match self.pool.turn(&self.kind, bucket.spacing()) {
            Ok(Some(wait)) => {
                let until = Instant::now() + wait;
                while let Some(left) = until.checked_duration_since(Instant::now()) {
                    if self.stopped() {
                        return false;
                    }
                    std::thread::sleep(left.min(IDLE_POLL));
                }
                return !self.stopped();
            }
            Ok(None) => {}
            Err(e) => log::warn!(
                "outbox: {}: no turn from the database ({e:#}); this instance spaces its own",
                self.kind
            ),
        }
        loop {
            if self.stopped() {
                return false;
            }
            match bucket.take(Instant::now()) {
                None => return true,
                Some(wait) => std::thread::sleep(wait.min(IDLE_POLL)),
            }
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn in_flight(&self) -> usize {
        self.in_flight.lock().map(|s| s.len()).unwrap_or(0)
    }

    fn done(&self, id: i64) {
        if let Ok(mut s) = self.in_flight.lock() {
            s.remove(&id);
        }
        self.signal.notify();
    }
}

impl Worker {
    /// The waker to give the writer before the worker starts, and the worker's copy.
    pub(crate) fn channel() -> (Waker, Waker) {
        let waker = Waker::default();
        (waker.clone(), waker)
    }

    /// Starts a lane per kind: a poller and `concurrency` attempt threads.
    pub(crate) fn spawn(
        config: Targets,
        pool: Box<dyn OutboxReader>,
        writer: WriterHandle,
        waker: Waker,
        woken: Waker,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Worker> {
        drop(woken);
        let stop = Arc::new(AtomicBool::new(false));
        let pool: Arc<dyn OutboxReader> = Arc::from(pool);
        let mut worker = Worker {
            stop: stop.clone(),
            wake: waker.clone(),
            pollers: Vec::new(),
            attempts: Vec::new(),
        };
        let observer = config.1;
        // The outbox's trigger on a repeated key reads which kinds coalesce.
        let coalescing = config
            .0
            .iter()
            .filter(|(_, lane)| lane.settings.coalesce)
            .map(|(kind, _)| kind.clone())
            .collect();
        writer
            .run_blocking(Write::Coalescing { kinds: coalescing })
            .map_err(|e| anyhow::anyhow!("outbox: cannot record the coalescing kinds: {e}"))?;
        let budget = Arc::new(budget::Budget::new(
            config
                .2
                .unwrap_or(crate::config::DEFAULT_OUTBOX_PAYLOAD_BUDGET),
        ));
        for (kind, lane) in config.0 {
            metrics.lane(&kind);
            metrics.in_flight(&kind, 0);
            let signal = Arc::new(Signal::default());
            waker.register(signal.clone());
            let bucket = lane.settings.rate.map(|r| Bucket::new(r.spacing(), 1.0));
            let shared = Arc::new(Shared {
                kind,
                lane,
                pool: pool.clone(),
                writer: writer.clone(),
                metrics: metrics.clone(),
                stop: stop.clone(),
                in_flight: Mutex::new(HashSet::new()),
                failures: AtomicU32::new(0),
                answered: AtomicBool::new(false),
                breaker: Mutex::new(Breaker::Closed),
                bucket: Mutex::new(bucket),
                signal,
                observer: observer.clone(),
                budget: budget.clone(),
            });
            let (hand, rows) = mpsc::channel::<PendingRow>();
            let rows = Arc::new(Mutex::new(rows));
            let timeout = shared.lane.timeout;
            for i in 0..shared.lane.settings.concurrency {
                let (shared, rows) = (shared.clone(), rows.clone());
                let thread = std::thread::Builder::new()
                    .name(format!("hookledger-outbox-{}-{i}", shared.kind))
                    .spawn(move || attempts(&shared, &rows));
                match thread {
                    Ok(t) => worker.attempts.push((timeout, t)),
                    Err(e) => {
                        worker.stop();
                        return Err(e.into());
                    }
                }
            }
            let poller = std::thread::Builder::new()
                .name(format!("hookledger-outbox-{}", shared.kind))
                .spawn(move || poll_lane(&shared, hand));
            match poller {
                Ok(t) => worker.pollers.push(t),
                Err(e) => {
                    worker.stop();
                    return Err(e.into());
                }
            }
        }
        Ok(worker)
    }

    /// Asks the lanes to stop, waits for the running attempts (each up to its kind's timeout)
    /// and leaves the rest due.
    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.wake();
        for poller in self.pollers {
            if poller.join().is_err() {
                log::error!("outbox poller panicked");
            }
        }
        let bound = self
            .attempts
            .iter()
            .map(|(t, _)| *t)
            .max()
            .unwrap_or_default()
            + STOP_MARGIN;
        let deadline = std::time::Instant::now() + bound;
        let mut left = self.attempts;
        while !left.is_empty() && std::time::Instant::now() < deadline {
            let (finished, running): (Vec<_>, Vec<_>) =
                left.into_iter().partition(|(_, t)| t.is_finished());
            for (_, t) in finished {
                if t.join().is_err() {
                    log::error!("outbox attempt thread panicked");
                }
            }
            left = running;
            if !left.is_empty() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if !left.is_empty() {
            // Their rows are not marked: still pending, attempted again after the restart.
            log::warn!(
                "outbox: {} attempts still running after {bound:.0?}; left to the restart",
                left.len()
            );
        }
        log::debug!("outbox worker stopped");
    }
}

/// Beyond the kind's timeout, what stopping grants a running attempt to record its result.
const STOP_MARGIN: Duration = Duration::from_secs(2);

impl crate::writer::Background for Worker {
    fn stop(self: Box<Self>) {
        Worker::stop(*self)
    }
}

/// A lane's poller: reads the kind's due rows (ids and metadata, no payload) while an attempt
/// thread is free and hands each row not in flight to one attempt thread.
fn poll_lane(shared: &Shared, hand: mpsc::Sender<PendingRow>) {
    let kinds = serde_json::to_string(&[&shared.kind]).expect("strings serialize");
    let concurrency = shared.lane.settings.concurrency;
    // The wake-up count at the last coalescing: again only after a commit or an attempt.
    let mut coalesced = None;
    let mut renewed = Instant::now();
    while !shared.stopped() {
        let seen = shared.signal.seen();
        // Before anything is handed out, and while the attempts run (a commit wakes the
        // poller), so superseded rows show as such at once.
        if shared.lane.settings.coalesce && coalesced != Some(seen) {
            coalesce(shared);
            coalesced = Some(seen);
        }
        let busy = shared.in_flight();
        // The leases (PostgreSQL) of the rows in flight last as long as their attempts, however
        // long a command runs; the poller wakes at least once a second.
        if busy > 0 && renewed.elapsed() >= RENEW_EVERY {
            renewed = Instant::now();
            let in_flight: Vec<i64> = match shared.in_flight.lock() {
                Ok(in_flight) => in_flight.iter().copied().collect(),
                Err(_) => break,
            };
            if let Err(e) = shared.pool.renew(&in_flight, unix_now()) {
                log::error!("outbox: cannot renew the {} leases: {e:#}", shared.kind);
            }
        }
        // Open: nothing until the cooldown is over, then one probe, alone.
        let probe = match shared.gate(busy) {
            Gate::Go => false,
            Gate::Probe => true,
            Gate::Wait(wait) => {
                shared.signal.wait(seen, wait.min(IDLE_POLL));
                continue;
            }
        };
        if busy >= concurrency {
            shared.signal.wait(seen, IDLE_POLL);
            continue;
        }
        // As many as can start now: on PostgreSQL a row handed out is leased, and a row
        // waiting behind the running attempts would spend its lease there.
        let limit = if probe { 1 } else { concurrency - busy };
        let in_flight: Vec<i64> = match shared.in_flight.lock() {
            Ok(in_flight) => in_flight.iter().copied().collect(),
            Err(_) => break,
        };
        let poll = Poll {
            in_flight: &in_flight,
            concurrency: Some(concurrency),
            ..Poll::new(&kinds, unix_now(), limit)
        };
        let rows = match shared.pool.due(&poll) {
            Ok(rows) => rows,
            Err(e) => {
                log::error!("outbox: cannot read pending {} rows: {e:#}", shared.kind);
                shared.signal.wait(seen, IDLE_POLL);
                continue;
            }
        };
        let fresh: Vec<PendingRow> = match shared.in_flight.lock() {
            Ok(mut in_flight) => rows
                .into_iter()
                .filter(|r| in_flight.insert(r.id))
                .collect(),
            Err(_) => break,
        };
        let handed = fresh.len();
        if probe && handed > 0 {
            shared.set_breaker(Breaker::Probing);
            log::info!("outbox: {} cooldown over; one probe attempt", shared.kind);
        }
        for row in fresh {
            if hand.send(row).is_err() {
                return; // every attempt thread ended
            }
        }
        if handed == 0 {
            let wait = if busy > 0 {
                IDLE_POLL
            } else {
                idle_wait(&*shared.pool, &kinds)
            };
            shared.signal.wait(seen, wait);
        }
    }
}

/// Supersedes the kind's queued rows that a newer one replaces, sparing those in flight here.
fn coalesce(shared: &Shared) {
    let running = match shared.in_flight.lock() {
        Ok(in_flight) => in_flight.iter().copied().collect(),
        Err(_) => return,
    };
    match shared.writer.run_blocking(Write::Coalesce {
        kind: shared.kind.clone(),
        running,
    }) {
        Ok(0) => {}
        Ok(n) => log::info!(
            "outbox: {} {n} queued rows superseded by a newer one",
            shared.kind
        ),
        // Tried again at the next poll; meanwhile an older row may be delivered (at least
        // once allows it).
        Err(e) => log::error!("outbox: cannot coalesce {} rows: {e}", shared.kind),
    }
}

/// A lane's attempt thread: takes the rows the poller hands out, one at a time, until the
/// poller ends.
fn attempts(shared: &Shared, rows: &Mutex<Receiver<PendingRow>>) {
    loop {
        let row = match rows.lock() {
            Ok(rows) => match rows.recv() {
                Ok(row) => row,
                Err(_) => return, // the poller ended
            },
            Err(_) => return,
        };
        let id = row.id;
        // Handed out before the breaker opened: not attempted, still due after the cooldown.
        let paused = shared.paused();
        if paused && !shared.stopped() {
            release(shared, &row);
        }
        if !shared.stopped() && !paused {
            // Not recorded: the row stays pending and is attempted again, after a pause so a
            // database that refuses is not met with a tight loop.
            if deliver(shared, row).is_err() {
                std::thread::sleep(IDLE_POLL);
            }
            // A probe that made no attempt (its row changed, or a read failed) said nothing of
            // the target: the next due row is the probe.
            if shared.breaker() == Breaker::Probing {
                shared.set_breaker(Breaker::Open(Instant::now()));
            }
        }
        shared.done(id);
    }
}

/// Failures in a row before a success that make the kind's waiting rows due at once: an
/// outage, not one row that fails alone between successes (which keeps its schedule, so a row
/// the app always refuses still takes the schedule's days to go dead).
const RECOVER_AFTER: u32 = 3;

/// Makes the kind's rows waiting on a retry delay due now, and wakes the poller.
fn recover(shared: &Shared) {
    match shared.writer.run_blocking(Write::Recover {
        kind: shared.kind.clone(),
    }) {
        Ok(0) => {}
        Ok(n) => log::info!(
            "outbox: {} answers again; {n} rows waiting on a retry are due now",
            shared.kind
        ),
        // They stay on their schedule: later, not lost.
        Err(e) => log::error!("outbox: cannot make {} rows due: {e}", shared.kind),
    }
    shared.signal.notify();
}

/// Its lease (PostgreSQL) ends now, so no instance waits for it to lapse: the row of a paused
/// kind, not attempted.
fn release(shared: &Shared, row: &PendingRow) {
    let (id, queued, lease) = (row.id, row.queued, row.lease);
    if let Err(e) = shared
        .writer
        .run_blocking(Write::Release { id, queued, lease })
    {
        log::error!("outbox: cannot release row {id}: {e}");
    }
}

/// Waits for the row's turn, reads its payload, attempts it and records the result.
fn deliver(shared: &Shared, row: PendingRow) -> Result<(), ()> {
    let (id, queued) = (row.id, row.queued);
    // At most `rate`: taken just before the attempt, so the target sees the spacing.
    if !shared.turn() {
        return Ok(()); // stopping: left due
    }
    // The breaker may have opened while the row waited for its turn: paused, it is not
    // attempted either.
    if shared.paused() {
        log::info!(
            "outbox: {} paused while row {id} waited for its turn; not attempted",
            row.kind
        );
        release(shared, &row);
        return Ok(());
    }
    // One payload read at a time, against the budget of payload bytes in flight: one that
    // does not fit is dropped, room for its size waited for, and it is read again.
    let reading = shared.budget.reading();
    let mut payload = match load(shared, &row)? {
        Some(payload) => payload,
        None => return Ok(()),
    };
    let _held = match shared.budget.try_take(payload.len()) {
        Some(held) => held,
        None => {
            let size = payload.len();
            drop(payload);
            let Some(held) = shared.budget.take(size, &shared.stop) else {
                return Ok(()); // stopping: left due
            };
            payload = match load(shared, &row)? {
                Some(payload) => payload,
                None => return Ok(()),
            };
            held
        }
    };
    drop(reading);
    shared.metrics.in_flight(&row.kind, 1);
    let (attempt, health) = attempt(&shared.lane, &row, &payload);
    shared.metrics.in_flight(&row.kind, -1);
    drop(payload);
    shared.metrics.delivery(&row.kind, attempt.label());
    let failed_before = shared.observe(health);
    let recorded = shared.writer.run_blocking(Write::Record {
        id,
        queued,
        attempt: attempt.clone(),
    });
    if let (Ok(1..), Some(observer)) = (&recorded, &shared.observer) {
        observer.recorded(&row, &attempt);
    }
    // The target answers again after an outage (failures in a row here, or, at its first
    // answer since the start, a row that failed before the restart): the rows waiting on a
    // retry delay need not wait it out. One row that fails alone between successes is not an
    // outage, and keeps its own schedule.
    let first = health == Health::Up && !shared.answered.swap(true, Ordering::SeqCst);
    let outage = failed_before >= RECOVER_AFTER || (first && row.attempts > 0);
    if health == Health::Up && outage && recorded.is_ok() {
        recover(shared);
    }
    match recorded {
        // Replayed, retried or queued again by a repeated key meanwhile (it is attempted
        // again: on PostgreSQL once this instance's lease on it ends, here), or pruned.
        Ok(0) => {
            if row.lease.is_some() {
                release(shared, &row);
            }
            log::info!(
                "outbox row {id} changed while it was being delivered; this attempt's result \
                 is not recorded"
            );
            Ok(())
        }
        Ok(_) => Ok(()),
        Err(e) => {
            log::error!("outbox: cannot record attempt on row {id}: {e}");
            Err(())
        }
    }
}

/// The payload of `row`, read as its attempt starts; `None` when there is nothing to attempt
/// (the row changed since the poll, or its unreadable payload made it dead); `Err` when the
/// database could not be read (the row stays due).
fn load(shared: &Shared, row: &PendingRow) -> Result<Option<Vec<u8>>, ()> {
    let (id, queued) = (row.id, row.queued);
    // Read as the attempt starts (on PostgreSQL, renewing the lease).
    match shared.pool.payload(row, unix_now()) {
        Ok(Some(payload)) => Ok(Some(payload)),
        // Replayed, revived or pruned since the poll (a row pending again is polled again),
        // or, on PostgreSQL, its lease lapsed and another instance took it.
        Ok(None) => {
            log::debug!("outbox row {id} changed before its attempt; skipped");
            Ok(None)
        }
        // A payload that is there but cannot be read (a corrupt blob, a forward row's event
        // without its payload) will not become readable: the row is dead, with the reason,
        // instead of being tried for ever.
        Err(e) if e.downcast_ref::<crate::payload::Unreadable>().is_some() => {
            log::error!("outbox: row {id} cannot be delivered: {e:#}");
            let dead = Attempt::Dead {
                error: format!("{e:#}"),
                output: None,
            };
            match shared.writer.run_blocking(Write::Record {
                id,
                queued,
                attempt: dead,
            }) {
                Ok(_) => Ok(None),
                Err(_) => Err(()),
            }
        }
        Err(e) => {
            log::error!("outbox: cannot read the payload of row {id}: {e:#}");
            Err(())
        }
    }
}

/// How long to sleep until the next row is due (at most [`IDLE_POLL`]).
fn idle_wait(pool: &dyn OutboxReader, kinds: &str) -> Duration {
    let next = pool.next_due_at(kinds).ok().flatten();
    match next {
        Some(at) => Duration::from_secs(at.saturating_sub(unix_now()).max(0) as u64)
            .clamp(Duration::from_millis(50), IDLE_POLL),
        None => IDLE_POLL,
    }
}

/// One delivery attempt of `row` (with its `payload`), classified.
fn attempt(config: &Lane, row: &PendingRow, payload: &[u8]) -> (Attempt, Health) {
    let attempts = usize::try_from(row.attempts)
        .unwrap_or(usize::MAX)
        .saturating_add(1);
    let failed =
        |error: String, retry_after: Option<Duration>, output: Option<String>| match next_delay(
            &config.schedule,
            attempts,
            retry_after,
        ) {
            Some(delay) => {
                tracing::warn!(
                    kind = %row.kind,
                    row_id = row.id,
                    event_id = %row.key,
                    attempt = attempts,
                    result = "retry",
                    error = %error,
                    retry_in_s = delay.as_secs(),
                    "outbox: {} {} attempt {attempts} failed ({error}); retry in {:.0?}",
                    row.kind,
                    row.key,
                    delay
                );
                Attempt::Retry {
                    at: unix_now() + delay.as_secs_f64().ceil() as i64,
                    error,
                    output,
                }
            }
            // The schedule is used up.
            None => dead(row, attempts, error, output),
        };
    let result = config.target.attempt(row, payload);
    let health = Health::of(&result);
    let attempt = match result {
        Ok(follow_up) => {
            tracing::info!(
                kind = %row.kind,
                row_id = row.id,
                event_id = %row.key,
                attempt = attempts,
                result = "delivered",
                "outbox: {} {} delivered (attempt {attempts})",
                row.kind,
                row.key
            );
            Attempt::Delivered { follow_up }
        }
        // Dead at once: nothing a retry would change, or a command's `give_up_exit`.
        Err(Failure::Refused(error)) => dead(row, attempts, error, None),
        Err(Failure::Ran {
            error,
            output,
            give_up: true,
        }) => dead(row, attempts, error, Some(output)),
        Err(Failure::Ran { error, output, .. }) => failed(error, None, Some(output)),
        // The app says the endpoint is gone.
        Err(Failure::Gone(detail)) => dead(row, attempts, format!("HTTP 410 Gone {detail}"), None),
        Err(Failure::Status(status, retry_after, detail)) => {
            failed(format!("HTTP {status} {detail}"), retry_after, None)
        }
        Err(Failure::Transport(error)) => failed(error, None, None),
    };
    (attempt, health)
}

/// A row that goes dead, logged with its error.
fn dead(row: &PendingRow, attempts: usize, error: String, output: Option<String>) -> Attempt {
    tracing::error!(
        kind = %row.kind,
        row_id = row.id,
        event_id = %row.key,
        attempt = attempts,
        result = "dead",
        error = %error,
        "outbox: {} {} dead after {attempts} attempt(s): {error}",
        row.kind,
        row.key
    );
    Attempt::Dead { error, output }
}

/// What one attempt says of its kind's target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    /// It took the row.
    Up,
    /// No answer, or an error status: the target is failing (down, overloaded, broken).
    Down,
    /// It answered about this row alone (gone, refused): nothing about the target.
    Answered,
}

impl Health {
    fn of<T>(result: &Result<T, Failure>) -> Health {
        match result {
            Ok(_) => Health::Up,
            Err(Failure::Ran { give_up: true, .. }) => Health::Answered,
            Err(Failure::Status(..) | Failure::Transport(_) | Failure::Ran { .. }) => Health::Down,
            Err(Failure::Gone(_) | Failure::Refused(_)) => Health::Answered,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{Config, Rate};

    /// The lane of `kind` among `targets`.
    fn lane<'t>(targets: &'t Targets, kind: &str) -> &'t Lane {
        &targets.0.iter().find(|(k, _)| k == kind).expect("a lane").1
    }

    #[test]
    fn each_lane_key_of_forward_reaches_a_post_delivery_and_none_reaches_a_command() {
        let config = Config::from_toml(
            r#"
            [[source]]
            name = "gh"
            scheme = "github"
            secrets = ["a-long-enough-secret"]

            [forward]
            url = "http://127.0.0.1:1/forward"
            secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
            concurrency = 3
            breaker_failures = 7
            breaker_cooldown = "42s"
            rate = "9/m"
            coalesce = true

            [[delivery]]
            kind = "receipts"
            url = "http://127.0.0.1:1/receipts"

            [[delivery]]
            kind = "own"
            url = "http://127.0.0.1:1/own"
            concurrency = 2
            breaker_failures = 4
            breaker_cooldown = "5s"
            rate = "6/s"
            coalesce = false

            [[delivery]]
            kind = "deploy"
            command = ["/bin/sh", "-c", "true"]
            "#,
            Path::new("/"),
        )
        .unwrap();
        config.validate().unwrap();
        let targets = Targets::of(&config, None).unwrap();
        // Every key written out, none from a default: a new lane key fails to compile here
        // until it is set in the file above and checked on every kind.
        let forward = LaneSettings {
            concurrency: 3,
            breaker_failures: 7,
            breaker_cooldown: Duration::from_secs(42),
            rate: Rate::parse("9/m"),
            coalesce: true,
        };
        assert_eq!(lane(&targets, FORWARD).settings, forward);
        assert_eq!(lane(&targets, "receipts").settings, forward);
        let own = LaneSettings {
            concurrency: 2,
            breaker_failures: 4,
            breaker_cooldown: Duration::from_secs(5),
            rate: Rate::parse("6/s"),
            coalesce: false,
        };
        assert_eq!(lane(&targets, "own").settings, own);
        // A command's lane takes nothing from [forward]: one run at a time, no rate.
        assert_eq!(lane(&targets, "deploy").settings, LaneSettings::command());
        assert_eq!(LaneSettings::command().concurrency, 1);
        assert_ne!(LaneSettings::command(), forward);
    }

    #[test]
    fn lane_keys_set_in_code_reach_the_lane_as_those_in_a_file_do() {
        let secret = crate::config::Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let forward = crate::config::ForwardConfig::new("http://127.0.0.1:1/f", secret)
            .with_concurrency(5)
            .with_rate("3/s")
            .with_breaker(2, Duration::from_secs(8));
        let config = Config::default().with_forward(forward);
        let targets = Targets::of(&config, None).unwrap();
        let settings = lane(&targets, FORWARD).settings;
        assert_eq!(
            (
                settings.concurrency,
                settings.rate,
                settings.breaker_failures,
                settings.breaker_cooldown
            ),
            (5, Rate::parse("3/s"), 2, Duration::from_secs(8))
        );
    }
}

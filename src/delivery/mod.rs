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
//! The worker holds at most one payload per attempt in flight: at most `concurrency` per kind
//! (the sum over the kinds in all). A poll reads the ids and metadata of at most `concurrency`
//! due rows, no payload ([`PendingRow`]); the payload of a row is read by id when that row is
//! attempted ([`OutboxReader::payload`]) and dropped when its attempt ends.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::{ForwardConfig, LaneSettings, Rate};
use crate::metrics::Metrics;
use crate::outbox::{
    next_delay, Attempt, Failure, FollowUp, Observer, PendingRow, Target, FORWARD,
};
use crate::source::standard::{self, SigningKey};
use crate::store::{OutboxReader, Write};
use crate::time::unix_now;
use crate::trace::{self, Tracer};
use crate::writer::WriterHandle;

/// How often the poller renews the leases of the rows in flight (PostgreSQL): the lease is in
/// whole seconds, at least one.
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// How long the worker sleeps when nothing is due and nobody wakes it (it also picks up rows
/// revived by the CLI from another process).
const IDLE_POLL: Duration = Duration::from_secs(1);

/// A kind's target, when the worker tries again, and how many attempts of the kind may be in
/// flight at once.
pub(crate) struct Lane {
    target: Box<dyn Target>,
    schedule: Vec<Duration>,
    concurrency: usize,
    /// How long stopping waits for this kind's running attempts.
    timeout: Duration,
    /// Consecutive failures that pause the kind, and for how long.
    breaker: (u32, Duration),
    /// At most so many attempts (none: no limit).
    rate: Option<Rate>,
    /// Whether a newer queued row supersedes the older queued ones of its source and
    /// `coalesce_key` ([`Write::Coalesce`]).
    coalesce: bool,
}

impl Lane {
    /// With `n` attempts in flight at once (at least 1).
    pub(crate) fn concurrency(&mut self, n: usize) -> &mut Lane {
        self.concurrency = n.max(1);
        self
    }

    /// Paused for `cooldown` after `failures` consecutive failures, then one probe.
    pub(crate) fn breaker(&mut self, failures: u32, cooldown: Duration) -> &mut Lane {
        self.breaker = (failures.max(1), cooldown);
        self
    }

    /// At most `rate` attempts, evenly spaced.
    pub(crate) fn rate(&mut self, rate: Option<Rate>) -> &mut Lane {
        self.rate = rate;
        self
    }

    /// Its concurrency, breaker, rate and coalescing as configured.
    pub(crate) fn settings(&mut self, settings: &LaneSettings) -> &mut Lane {
        self.concurrency(settings.concurrency)
            .breaker(settings.breaker_failures, settings.breaker_cooldown)
            .rate(settings.rate.as_deref().and_then(Rate::parse));
        self.coalesce = settings.coalesce;
        self
    }

    /// Stopping waits this long for a running attempt (the target's own timeout).
    pub(crate) fn timeout(&mut self, timeout: Duration) -> &mut Lane {
        self.timeout = timeout;
        self
    }
}

/// POSTs each row to a URL, signed with the Standard Webhooks headers: `forward` and each
/// `[[delivery]]`.
pub(crate) struct Post {
    url: String,
    key: SigningKey,
    agent: ureq::Agent,
    /// The agent's, named in a timeout's cause.
    timeout: Duration,
    /// When traces are on: a span per attempt, its context in the `traceparent` header.
    tracer: Option<Arc<Tracer>>,
}

impl Post {
    /// Decodes the signing secret; a bad one is refused here, at start-up.
    pub(crate) fn new(config: &ForwardConfig, tracer: Option<Arc<Tracer>>) -> anyhow::Result<Post> {
        let key = SigningKey::from_secret(config.secret.expose()).map_err(anyhow::Error::msg)?;
        Ok(Post {
            url: config.url.clone(),
            key,
            timeout: config.timeout,
            agent: ureq::AgentBuilder::new()
                .timeout(config.timeout)
                .redirects(0)
                .user_agent(concat!("hookledger/", env!("CARGO_PKG_VERSION")))
                .build(),
            tracer,
        })
    }
}

impl Target for Post {
    fn attempt(
        &self,
        row: &PendingRow,
        payload: &[u8],
    ) -> Result<Option<Arc<dyn FollowUp>>, Failure> {
        let Some(tracer) = &self.tracer else {
            return post(
                &self.agent,
                self.timeout,
                &self.url,
                &self.key,
                row,
                payload,
                None,
            )
            .map(|()| None);
        };
        // A child of the span of the request that committed the event, when remembered.
        let parent = tracer.recall(&row.source, &row.key);
        let span = tracer.begin("delivery", trace::CLIENT, parent);
        let traceparent = span.context.traceparent();
        let result = post(
            &self.agent,
            self.timeout,
            &self.url,
            &self.key,
            row,
            payload,
            Some(&traceparent),
        );
        let mut attributes: Vec<(&'static str, trace::Value)> = vec![
            ("hookledger.outbox.kind", row.kind.as_str().into()),
            ("hookledger.outbox.row_id", row.id.into()),
            ("hookledger.source", row.source.as_str().into()),
            ("hookledger.event_id", row.key.as_str().into()),
            ("hookledger.outbox.attempt", (row.attempts + 1).into()),
        ];
        let (result_label, status) = match &result {
            Ok(()) => ("delivered", None),
            Err(Failure::Gone(_)) => ("gone", Some(410)),
            Err(Failure::Status(status, _, _)) => ("failed", Some(*status)),
            Err(Failure::Refused(_) | Failure::Transport(_) | Failure::Ran { .. }) => {
                ("failed", None)
            }
        };
        attributes.push(("hookledger.outbox.result", result_label.into()));
        if let Some(status) = status {
            attributes.push(("http.response.status_code", i64::from(status).into()));
        }
        tracer.end(span, attributes, result.is_err());
        result.map(|()| None)
    }
}

/// The targets by outbox kind: `forward`, each `[[delivery]]`, and those the composition
/// root adds (a provider wing's fetches).
#[derive(Default)]
pub(crate) struct Targets(Vec<(String, Lane)>, Option<Arc<dyn Observer>>);

impl Targets {
    /// The POST targets of `config`: `forward` and each `[[delivery]]`.
    pub(crate) fn of(
        config: &crate::config::Config,
        tracer: Option<&Arc<Tracer>>,
    ) -> anyhow::Result<Targets> {
        let mut targets = Targets::default();
        if let Some(forward) = &config.forward {
            targets
                .add(
                    FORWARD,
                    Box::new(Post::new(forward, tracer.cloned())?),
                    forward.schedule.clone(),
                )
                .settings(&forward.lane())
                .timeout(forward.timeout);
        }
        for delivery in &config.deliveries {
            if let Some(command) = delivery.command_target()? {
                let (lane, timeout) = (command.lane.clone(), command.timeout);
                let command = crate::command::Command::new(command);
                let schedule = command.schedule();
                targets
                    .add(&delivery.kind, Box::new(command), schedule)
                    .settings(&lane)
                    .timeout(timeout);
                continue;
            }
            let target = delivery.target(config.forward.as_ref())?;
            let post = Post::new(&target, tracer.cloned())
                .map_err(|e| anyhow::anyhow!("delivery `{}`: {e}", delivery.kind))?;
            targets
                .add(&delivery.kind, Box::new(post), target.schedule.clone())
                .settings(&target.lane())
                .timeout(target.timeout);
        }
        Ok(targets)
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
                concurrency: 1,
                timeout: crate::config::DEFAULT_FORWARD_TIMEOUT,
                breaker: (
                    crate::config::DEFAULT_BREAKER_FAILURES,
                    crate::config::DEFAULT_BREAKER_COOLDOWN,
                ),
                rate: None,
                coalesce: false,
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
struct Shared<P> {
    kind: String,
    lane: Lane,
    pool: Arc<P>,
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
}

/// A kind's circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Breaker {
    /// Attempts go out.
    Closed,
    /// Paused after consecutive failures until then; then one probe.
    Open(Instant),
    /// The probe is in flight; nothing else goes out.
    Probing,
}

/// A token bucket: a token every `spacing`, at most `capacity` saved up.
#[derive(Debug)]
struct Bucket {
    spacing: Duration,
    capacity: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl Bucket {
    /// Full at first.
    fn new(spacing: Duration, capacity: f64) -> Bucket {
        Bucket {
            spacing,
            capacity,
            tokens: capacity,
            last: None,
        }
    }

    /// Takes a token at `now`, or says how long until there is one.
    fn take(&mut self, now: Instant) -> Option<Duration> {
        if let Some(last) = self.last {
            let earned =
                now.saturating_duration_since(last).as_secs_f64() / self.spacing.as_secs_f64();
            self.tokens = (self.tokens + earned).min(self.capacity);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            None
        } else {
            Some(self.spacing.mul_f64(1.0 - self.tokens))
        }
    }
}

/// What the poller may do now.
enum Gate {
    Go,
    /// Hand out one row, the probe.
    Probe,
    Wait(Duration),
}

impl<P> Shared<P> {
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
                    if reopen || (was == Breaker::Closed && failures >= self.lane.breaker.0) {
                        *breaker = Breaker::Open(Instant::now() + self.lane.breaker.1);
                        log::warn!(
                        "outbox: {} {} after {failures} failures in a row; no attempt for {:.0?}",
                        self.kind,
                        if reopen { "probe failed, paused again" } else { "paused" },
                        self.lane.breaker.1
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
    /// attempt threads wait in turn: the one holding the bucket sleeps until its token.
    fn turn(&self) -> bool {
        let Ok(mut bucket) = self.bucket.lock() else {
            return false;
        };
        let Some(bucket) = bucket.as_mut() else {
            return !self.stopped();
        };
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
        pool: impl OutboxReader,
        writer: WriterHandle,
        waker: Waker,
        woken: Waker,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Worker> {
        drop(woken);
        let stop = Arc::new(AtomicBool::new(false));
        let pool = Arc::new(pool);
        let mut worker = Worker {
            stop: stop.clone(),
            wake: waker.clone(),
            pollers: Vec::new(),
            attempts: Vec::new(),
        };
        let observer = config.1;
        for (kind, lane) in config.0 {
            metrics.lane(&kind);
            metrics.in_flight(&kind, 0);
            let signal = Arc::new(Signal::default());
            waker.register(signal.clone());
            let bucket = lane.rate.map(|r| Bucket::new(r.spacing(), 1.0));
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
            });
            let (hand, rows) = mpsc::channel::<PendingRow>();
            let rows = Arc::new(Mutex::new(rows));
            let timeout = shared.lane.timeout;
            for i in 0..shared.lane.concurrency {
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
fn poll_lane<P: OutboxReader + Sync>(shared: &Shared<P>, hand: mpsc::Sender<PendingRow>) {
    let kinds = serde_json::to_string(&[&shared.kind]).expect("strings serialize");
    let concurrency = shared.lane.concurrency;
    // The wake-up count at the last coalescing: again only after a commit or an attempt.
    let mut coalesced = None;
    let mut renewed = Instant::now();
    while !shared.stopped() {
        let seen = shared.signal.seen();
        // Before anything is handed out, and while the attempts run (a commit wakes the
        // poller), so superseded rows show as such at once.
        if shared.lane.coalesce && coalesced != Some(seen) {
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
        let rows = match shared.pool.due(&kinds, unix_now(), limit, &in_flight) {
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
fn coalesce<P>(shared: &Shared<P>) {
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
fn attempts<P: OutboxReader + Sync>(shared: &Shared<P>, rows: &Mutex<Receiver<PendingRow>>) {
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
fn recover<P>(shared: &Shared<P>) {
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
fn release<P>(shared: &Shared<P>, row: &PendingRow) {
    let (id, queued, lease) = (row.id, row.queued, row.lease);
    if let Err(e) = shared
        .writer
        .run_blocking(Write::Release { id, queued, lease })
    {
        log::error!("outbox: cannot release row {id}: {e}");
    }
}

/// Waits for the row's turn, reads its payload, attempts it and records the result.
fn deliver<P: OutboxReader>(shared: &Shared<P>, row: PendingRow) -> Result<(), ()> {
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
    // Read as the attempt starts (on PostgreSQL, renewing the lease).
    let payload = match shared.pool.payload(&row, unix_now()) {
        Ok(Some(payload)) => payload,
        // Replayed, revived or pruned since the poll (a row pending again is polled again),
        // or, on PostgreSQL, its lease lapsed and another instance took it.
        Ok(None) => {
            log::debug!("outbox row {id} changed before its attempt; skipped");
            return Ok(());
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
            return match shared.writer.run_blocking(Write::Record {
                id,
                queued,
                attempt: dead,
            }) {
                Ok(_) => Ok(()),
                Err(_) => Err(()),
            };
        }
        Err(e) => {
            log::error!("outbox: cannot read the payload of row {id}: {e:#}");
            return Err(());
        }
    };
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
        // Replayed or retried meanwhile (it is attempted again), or pruned.
        Ok(0) => {
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

/// How long to sleep until the next row is due (at most [`IDLE_POLL`]).
fn idle_wait(pool: &impl OutboxReader, kinds: &str) -> Duration {
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
        Err(Failure::Gone(detail)) => {
            tracing::error!(
                kind = %row.kind,
                row_id = row.id,
                event_id = %row.key,
                attempt = attempts,
                result = "dead",
                status = 410,
                "outbox: {} {} dead: the app answered 410 Gone",
                row.kind,
                row.key
            );
            Attempt::Dead {
                error: format!("HTTP 410 Gone {detail}"),
                output: None,
            }
        }
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

/// `Retry-After` as delay-seconds or as an HTTP date (a date in the past means now).
fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The header that names the source of a delivered event.
pub(crate) const SOURCE_HEADER: &str = "webhook-source";

/// The header with the delivered event's type (GitHub's and Shopify's are not in the body).
pub(crate) const TYPE_HEADER: &str = "webhook-type";

/// POSTs the verified event body (`payload`) with the Standard Webhooks headers and the
/// source's name.
fn post(
    agent: &ureq::Agent,
    timeout: Duration,
    url: &str,
    key: &SigningKey,
    row: &PendingRow,
    payload: &[u8],
    traceparent: Option<&str>,
) -> Result<(), Failure> {
    let timestamp = unix_now();
    let signature = key.sign(&row.key, timestamp, payload);
    let mut request = agent.post(url);
    if let Some(kind) = &row.event_type {
        request = request.set(TYPE_HEADER, kind);
    }
    if let Some(traceparent) = traceparent {
        request = request.set("traceparent", traceparent);
    }
    let result = request
        .set("Content-Type", "application/json")
        .set("Idempotency-Key", &row.key)
        .set(standard::ID_HEADER, &row.key)
        .set(standard::TIMESTAMP_HEADER, &timestamp.to_string())
        .set(standard::SIGNATURE_HEADER, &signature)
        // Event ids are unique per source; an app fed by several sources dedupes on both.
        .set(SOURCE_HEADER, &row.source)
        .send_bytes(payload);
    answer(result, url, Some(timeout))
}

/// A POST's result as a [`Failure`] that names the cause (refused, timeout, DNS, TLS, or the
/// HTTP status with the start of the body) and the target.
pub(crate) fn answer(
    result: Result<ureq::Response, ureq::Error>,
    url: &str,
    timeout: Option<Duration>,
) -> Result<(), Failure> {
    let target = shown_url(url);
    match result {
        Ok(response) if (200..300).contains(&response.status()) => Ok(()),
        Ok(response) => Err(Failure::Status(
            response.status(),
            None,
            from(&target, response),
        )),
        Err(ureq::Error::Status(410, response)) => Err(Failure::Gone(from(&target, response))),
        Err(ureq::Error::Status(status, response)) => {
            let retry_after = response
                .header("Retry-After")
                .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()));
            Err(Failure::Status(
                status,
                retry_after,
                from(&target, response),
            ))
        }
        Err(ureq::Error::Transport(t)) => Err(Failure::Transport(format!(
            "{} ({target})",
            cause(&t, timeout)
        ))),
    }
}

/// Bytes of an error answer's body kept on the row: enough for a framework's error line.
pub(crate) const BODY_EXCERPT: usize = 200;

/// `from URL: excerpt` of an error answer (the excerpt one line, control characters dropped).
fn from(target: &str, response: ureq::Response) -> String {
    use std::io::Read;
    let mut body = Vec::with_capacity(BODY_EXCERPT);
    // At most a little past the excerpt; a body that does not arrive in time is left.
    let _ = response
        .into_reader()
        .take(BODY_EXCERPT as u64 + 4)
        .read_to_end(&mut body);
    let text = String::from_utf8_lossy(&body);
    let mut excerpt: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if excerpt.len() > BODY_EXCERPT {
        let mut end = BODY_EXCERPT;
        while !excerpt.is_char_boundary(end) {
            end -= 1;
        }
        excerpt.truncate(end);
        excerpt.push('…');
    }
    match excerpt.is_empty() {
        true => format!("from {target}"),
        false => format!("from {target}: {excerpt}"),
    }
}

/// Why a request got no answer, in words an operator acts on: refused, timeout, DNS, TLS.
fn cause(t: &ureq::Transport, timeout: Option<Duration>) -> String {
    use std::io::ErrorKind as Io;
    let io = std::error::Error::source(t).and_then(|e| e.downcast_ref::<std::io::Error>());
    let within = timeout.map_or(String::new(), |t| format!(" within {t:.0?}"));
    let tls = t.message().is_some_and(|m| m.contains("tls"));
    match t.kind() {
        ureq::ErrorKind::Dns => match t.url().and_then(|u| u.host_str()) {
            Some(host) => format!("DNS: cannot resolve {host}"),
            None => "DNS: cannot resolve the host".into(),
        },
        _ if tls => match io {
            Some(e) => format!(
                "TLS: {}",
                e.get_ref().map_or(e.to_string(), |r| r.to_string())
            ),
            None => "TLS: handshake failed".into(),
        },
        ureq::ErrorKind::ConnectionFailed => match io.map(|e| e.kind()) {
            Some(Io::ConnectionRefused) => "connection refused".into(),
            Some(Io::TimedOut | Io::WouldBlock) => format!("timeout: no connection{within}"),
            Some(_) => format!("cannot connect: {}", io.expect("some")),
            None => "cannot connect".into(),
        },
        ureq::ErrorKind::Io => match io.map(|e| e.kind()) {
            Some(Io::TimedOut | Io::WouldBlock) => format!("timeout: no answer{within}"),
            Some(Io::ConnectionReset | Io::ConnectionAborted | Io::BrokenPipe) => {
                "connection reset before an answer".into()
            }
            Some(Io::UnexpectedEof) => "connection closed before an answer".into(),
            Some(_) => format!("network error: {}", io.expect("some")),
            None => "network error".into(),
        },
        ureq::ErrorKind::BadStatus | ureq::ErrorKind::BadHeader => {
            "not an HTTP answer (bad status line or header)".into()
        }
        other => other.to_string(),
    }
}

/// `url` as errors, logs, alerts and the console show it: `scheme://host[:port]`, with its
/// path and query as `/…` and `?…` (credentials, a Slack or Discord webhook's path and a query
/// can each hold a secret).
pub(crate) fn shown_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => {
            let host = u.host_str().unwrap_or_default();
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            let path = if matches!(u.path(), "" | "/") {
                ""
            } else {
                "/…"
            };
            let query = if u.query().is_some() { "?…" } else { "" };
            format!("{}://{host}{port}{path}{query}", u.scheme())
        }
        Err(_) => "(not a URL)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_bucket_spaces_takes_and_saves_up_to_its_capacity() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut b = Bucket::new(ms(50), 1.0);
        assert_eq!(b.take(t0), None, "full at first");
        assert_eq!(b.take(t0), Some(ms(50)));
        assert_eq!(b.take(t0 + ms(20)), Some(ms(30)));
        assert_eq!(b.take(t0 + ms(50)), None);
        // A long pause saves up one token only (the capacity).
        assert_eq!(b.take(t0 + ms(10_000)), None);
        assert!(b.take(t0 + ms(10_000)).is_some());
        let mut burst = Bucket::new(ms(100), 3.0);
        for _ in 0..3 {
            assert_eq!(burst.take(t0), None);
        }
        assert_eq!(burst.take(t0), Some(ms(100)));
        assert_eq!(burst.take(t0 + ms(100)), None);
    }

    #[test]
    fn retry_after_as_seconds_or_http_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(
            parse_retry_after(&later, now),
            Some(Duration::from_secs(90))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }
}

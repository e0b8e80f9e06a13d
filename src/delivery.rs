//! The outbox worker: delivers committed outbox rows to the app, after commit, at least once.
//!
//! One plain thread polls the read pool for due `pending` rows in id order, POSTs each to the
//! app with Standard Webhooks signature headers, and writes the result back through the writer
//! (one writer, always).
//!
//! # Ordering
//! A row exists only once its event committed, so the app never hears of an event hookledger
//! might still roll back. A row is marked `done` only after the app answered 2xx: if the
//! process dies during an attempt, the row is still `pending` and is delivered again after the
//! restart. The app must therefore treat `webhook-id` / `Idempotency-Key` (the event id) as
//! its dedupe key; that makes at-least-once effectively once.
//!
//! # Failure modes
//! - 2xx → done. 410 Gone → dead at once (the app says the endpoint is gone).
//! - Any other status, a timeout, a refused connection → retried after the next delay of the
//!   schedule, ±20 % jitter, later if the app's `Retry-After` asks (at most
//!   [`crate::outbox::MAX_RETRY_AFTER`]).
//! - Schedule used up → dead, with `last_error`. `hookledger outbox retry` revives dead rows.
//! - The database is unavailable → the worker logs, waits and polls again; nothing is lost
//!   because nothing is marked before it happened.
//!
//! # Memory
//! The worker holds at most one payload. A poll reads the ids and metadata of up to [`BATCH`]
//! due rows, no payload ([`PendingRow`]); the payload of a row is read by id when that row is
//! attempted ([`OutboxReader::payload`]) and dropped before the next row's is read.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::config::ForwardConfig;
use crate::metrics::Metrics;
use crate::outbox::{next_delay, Attempt, Failure, FollowUp, PendingRow, Target, FORWARD};
use crate::source::standard::{self, SigningKey};
use crate::store::{OutboxReader, Write};
use crate::time::unix_now;
use crate::writer::WriterHandle;

/// How long the worker sleeps when nothing is due and nobody wakes it (it also picks up rows
/// revived by the CLI from another process).
const IDLE_POLL: Duration = Duration::from_secs(1);

/// Rows fetched per poll: one poll's worth of deliveries at a few per second, small enough
/// that rows revived meanwhile (by the CLI) wait at most one round.
const BATCH: usize = 32;

/// A kind's target and when the worker tries again.
pub(crate) struct Lane {
    target: Box<dyn Target>,
    schedule: Vec<Duration>,
}

/// POSTs each row to a URL, signed with the Standard Webhooks headers: `forward` and each
/// `[[delivery]]`.
pub(crate) struct Post {
    url: String,
    key: SigningKey,
    agent: ureq::Agent,
}

impl Post {
    /// Decodes the signing secret; a bad one is refused here, at start-up.
    pub(crate) fn new(config: &ForwardConfig) -> anyhow::Result<Post> {
        let key = SigningKey::from_secret(config.secret.expose()).map_err(anyhow::Error::msg)?;
        Ok(Post {
            url: config.url.clone(),
            key,
            agent: ureq::AgentBuilder::new()
                .timeout(config.timeout)
                .redirects(0)
                .user_agent(concat!("hookledger/", env!("CARGO_PKG_VERSION")))
                .build(),
        })
    }
}

impl Target for Post {
    fn attempt(
        &self,
        row: &PendingRow,
        payload: &[u8],
    ) -> Result<Option<Arc<dyn FollowUp>>, Failure> {
        post(&self.agent, &self.url, &self.key, row, payload).map(|()| None)
    }
}

/// The targets by outbox kind: `forward`, each `[[delivery]]`, and those the composition
/// root adds (a provider wing's fetches).
#[derive(Default)]
pub(crate) struct Targets(Vec<(String, Lane)>);

impl Targets {
    /// The POST targets of `config`: `forward` and each `[[delivery]]`.
    pub(crate) fn of(config: &crate::config::Config) -> anyhow::Result<Targets> {
        let mut targets = Targets::default();
        if let Some(forward) = &config.forward {
            targets.add(
                FORWARD,
                Box::new(Post::new(forward)?),
                forward.schedule.clone(),
            );
        }
        for delivery in &config.deliveries {
            if let Some(command) = delivery.command_target()? {
                let command = crate::command::Command::new(command);
                let schedule = command.schedule();
                targets.add(&delivery.kind, Box::new(command), schedule);
                continue;
            }
            let target = delivery.target(config.forward.as_ref())?;
            let post = Post::new(&target)
                .map_err(|e| anyhow::anyhow!("delivery `{}`: {e}", delivery.kind))?;
            targets.add(&delivery.kind, Box::new(post), target.schedule);
        }
        Ok(targets)
    }

    /// Delivers rows of `kind` through `target`, retried on `schedule`.
    pub(crate) fn add(&mut self, kind: &str, target: Box<dyn Target>, schedule: Vec<Duration>) {
        self.0.push((kind.to_string(), Lane { target, schedule }));
    }

    /// Whether there is nothing to deliver (no worker is needed).
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn get(&self, kind: &str) -> Option<&Lane> {
        self.0.iter().find(|(k, _)| k == kind).map(|(_, t)| t)
    }

    /// The kinds, as the JSON array the outbox queries take.
    fn kinds(&self) -> String {
        serde_json::to_string(&self.0.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .expect("strings serialize")
    }
}

/// Handle to the running worker. `stop` lets it finish its current attempt and end.
pub(crate) struct Worker {
    /// Set by `stop`; the thread checks it between attempts and ends.
    stop: Arc<AtomicBool>,
    /// The worker's own wake-up channel (shared with the writer's [`Waker`]): `stop` sends on
    /// it so a sleeping worker sees the flag at once.
    wake: SyncSender<()>,
    thread: JoinHandle<()>,
}

/// Wakes the worker (after a commit that queued rows). Never blocks.
#[derive(Clone)]
pub(crate) struct Waker(SyncSender<()>);

impl Waker {
    pub(crate) fn wake(&self) {
        let _ = self.0.try_send(());
    }
}

impl Worker {
    /// The waker to give the writer before the worker starts.
    pub(crate) fn channel() -> (Waker, Receiver<()>) {
        let (tx, rx) = mpsc::sync_channel(1);
        (Waker(tx), rx)
    }

    pub(crate) fn spawn(
        config: Targets,
        pool: impl OutboxReader,
        writer: WriterHandle,
        waker: Waker,
        woken: Receiver<()>,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Worker> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("hookledger-outbox".into())
            .spawn(move || run(&config, &pool, &writer, &woken, &flag, &metrics))?;
        Ok(Worker {
            stop,
            wake: waker.0,
            thread,
        })
    }

    /// Asks the worker to stop after its current attempt and waits for it.
    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.wake.try_send(());
        if self.thread.join().is_err() {
            log::error!("outbox worker panicked");
        }
    }
}

impl crate::writer::Background for Worker {
    fn stop(self: Box<Self>) {
        Worker::stop(*self)
    }
}

fn run(
    targets: &Targets,
    pool: &impl OutboxReader,
    writer: &WriterHandle,
    woken: &Receiver<()>,
    stop: &AtomicBool,
    metrics: &Metrics,
) {
    let kinds = targets.kinds();
    while !stop.load(Ordering::SeqCst) {
        let rows = match poll(pool, &kinds) {
            Ok(rows) => rows,
            Err(e) => {
                log::error!("outbox: cannot read pending rows: {e:#}");
                let _ = woken.recv_timeout(IDLE_POLL);
                continue;
            }
        };
        if rows.is_empty() {
            let _ = woken.recv_timeout(idle_wait(pool, &kinds));
            continue;
        }
        for row in rows {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let (id, queued) = (row.id, row.queued);
            let Some(target) = targets.get(&row.kind) else {
                continue; // only kinds with a target are polled
            };
            let payload = match pool.payload(id, queued) {
                Ok(Some(payload)) => payload,
                // Replayed, revived or pruned since the poll: a row pending again is polled
                // again.
                Ok(None) => {
                    log::debug!("outbox row {id} changed before its attempt; skipped");
                    continue;
                }
                Err(e) => {
                    log::error!("outbox: cannot read the payload of row {id}: {e:#}");
                    let _ = woken.recv_timeout(IDLE_POLL);
                    break;
                }
            };
            let attempt = attempt(target, &row, &payload);
            // Before the next row's is read: one payload at a time.
            drop(payload);
            metrics.delivery(&row.kind, attempt.label());
            match writer.run_blocking(Write::Record {
                id,
                queued,
                attempt,
            }) {
                // Replayed or retried meanwhile (it is attempted again), or pruned.
                Ok(0) => log::info!(
                    "outbox row {id} changed while it was being delivered; this attempt's \
                     result is not recorded"
                ),
                Ok(_) => {}
                Err(e) => {
                    // Not marked: the row stays pending and is attempted again (at least once),
                    // after a pause so a database that refuses writes is not met with a tight loop.
                    log::error!("outbox: cannot record attempt on row {id}: {e}");
                    let _ = woken.recv_timeout(IDLE_POLL);
                    break;
                }
            }
        }
    }
    log::debug!("outbox worker stopped");
}

fn poll(pool: &impl OutboxReader, kinds: &str) -> anyhow::Result<Vec<PendingRow>> {
    pool.due(kinds, unix_now(), BATCH)
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
fn attempt(config: &Lane, row: &PendingRow, payload: &[u8]) -> Attempt {
    let attempts = usize::try_from(row.attempts)
        .unwrap_or(usize::MAX)
        .saturating_add(1);
    let failed = |error: String, retry_after: Option<Duration>| match next_delay(
        &config.schedule,
        attempts,
        retry_after,
    ) {
        Some(delay) => {
            log::warn!(
                "outbox: {} {} attempt {attempts} failed ({error}); retry in {:.0?}",
                row.kind,
                row.key,
                delay
            );
            Attempt::Retry {
                at: unix_now() + delay.as_secs_f64().ceil() as i64,
                error,
            }
        }
        None => {
            log::error!(
                "outbox: {} {} dead after {attempts} attempts ({error})",
                row.kind,
                row.key
            );
            Attempt::Dead { error }
        }
    };
    match config.target.attempt(row, payload) {
        Ok(follow_up) => {
            log::info!(
                "outbox: {} {} delivered (attempt {attempts})",
                row.kind,
                row.key
            );
            Attempt::Delivered { follow_up }
        }
        Err(Failure::Refused(error)) => {
            log::error!("outbox: {} {} dead: {error}", row.kind, row.key);
            Attempt::Dead { error }
        }
        Err(Failure::Gone) => {
            log::error!(
                "outbox: {} {} dead: the app answered 410 Gone",
                row.kind,
                row.key
            );
            Attempt::Dead {
                error: "HTTP 410 Gone".into(),
            }
        }
        Err(Failure::Status(status, retry_after)) => failed(format!("HTTP {status}"), retry_after),
        Err(Failure::Transport(error)) => failed(error, None),
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
    url: &str,
    key: &SigningKey,
    row: &PendingRow,
    payload: &[u8],
) -> Result<(), Failure> {
    let timestamp = unix_now();
    let signature = key.sign(&row.key, timestamp, payload);
    let mut request = agent.post(url);
    if let Some(kind) = &row.event_type {
        request = request.set(TYPE_HEADER, kind);
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
    match result {
        Ok(response) if (200..300).contains(&response.status()) => Ok(()),
        Ok(response) => Err(Failure::Status(response.status(), None)),
        Err(ureq::Error::Status(410, _)) => Err(Failure::Gone),
        Err(ureq::Error::Status(status, response)) => {
            let retry_after = response
                .header("Retry-After")
                .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()));
            Err(Failure::Status(status, retry_after))
        }
        // The kind only: the full message repeats the URL, which may carry credentials.
        Err(ureq::Error::Transport(t)) => Err(Failure::Transport(t.kind().to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

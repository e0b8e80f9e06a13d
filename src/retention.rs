//! Retention: forget what the provider can no longer resend.
//!
//! Two ages: payloads (the stored bodies) are cleared after `payload_days` (30), while the
//! claims (the ledger rows, which make a resend a duplicate) stay for `claim_days` (400):
//! for schemes without a signed timestamp (github, shopify, hmac) the claim is the only replay
//! protection, so a captured delivery resent months later must still find it. `done` outbox
//! rows older than a week are deleted. Pending and dead outbox rows are kept: they still need
//! delivery or a person's attention. Last, on SQLite, the pages the prune freed go back to
//! the file system, so the file shrinks to what it holds.
//!
//! # Pacing
//! A prune of a million rows must not be felt by the requests served meanwhile. Each step is
//! many short batches, each a job of the writer, sized by time (half a millisecond,
//! `store::retention`); between two batches the background job rests four times as long as
//! the batch took and then waits for the writer's queue to be empty ([`YieldToWriter`]), so a
//! batch runs when no request waits, and a request that arrives during one waits for that
//! batch alone. On SQLite a batch of retention's commits without an fsync (the next request's
//! commit flushes it). `hookledger prune`, run by hand, does not pause ([`Flat`]).
//!
//! Either age may be `never` (kept for ever); an age too large to count back from now in
//! seconds is the same as `never`, so no number, however large, can turn the cutoff into the
//! future.
//!
//! # The clock
//! Ages are counted back from the newest claim's `received_at` when the clock is later than
//! it: the cutoff is `min(now, newest claim) - age`. A clock set a year ahead (or a quiet
//! ledger) then prunes nothing that the newest claim's own clock would keep, and a warning
//! says so when the clock is far past the newest claim. For schemes without a signed
//! timestamp the claim is the only replay protection, so a wrong clock must not erase it.
//!
//! # Failure modes
//! A claim age shorter than Stripe's 3-day retry window is refused at start-up
//! (`config::check_retention`): a retried event whose claim was already deleted would be
//! applied twice.

use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::config::{RetentionConfig, NEVER};
use crate::sql::{Session, StoreError};
use crate::store::{Reader, Write};
use crate::writer::WriterHandle;

/// Delivered outbox rows are kept a week for `outbox list`, then deleted.
pub(crate) const DONE_OUTBOX_KEEP: Duration = Duration::from_secs(7 * 86_400);

/// How often the background job runs: the retention age is counted in days, so an hour late
/// is nothing, and most runs find nothing to delete.
pub(crate) const INTERVAL: Duration = Duration::from_secs(3600);

/// A clock more than this past the newest claim is logged: it may be wrong.
const FAR_PAST_NEWEST: i64 = 30 * 86_400;

/// The age of `days` in seconds; `None` for [`NEVER`] and for any age too large to count back
/// from a Unix time (more than `i64::MAX` seconds): nothing is that old.
pub(crate) fn window(days: u64) -> Option<i64> {
    days.checked_mul(86_400)
        .and_then(|secs| i64::try_from(secs).ok())
}

/// When the newest claim in the ledger was received (Unix seconds).
pub(crate) fn newest_claim(ledger: &dyn Session) -> Result<Option<i64>, StoreError> {
    Ok(ledger
        .query("SELECT max(received_at) FROM webhook_events", &[])?
        .first()
        .map(|row| row.get::<Option<i64>>(0))
        .transpose()?
        .flatten())
}

/// What one prune deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pruned {
    /// Claims deleted.
    pub(crate) events: u64,
    /// Payloads cleared (their claims kept).
    pub(crate) payloads: u64,
    pub(crate) outbox: u64,
    /// Free pages given back to the file system (SQLite).
    pub(crate) pages: u64,
    /// Stopped before the end (the server is stopping): the next prune does the rest.
    pub(crate) stopped: bool,
}

impl Pruned {
    /// What was pruned, in words.
    pub(crate) fn describe(&self, retention: &RetentionConfig) -> String {
        let older = |days: u64| match days {
            NEVER => "(kept for ever)".to_string(),
            days => format!("older than {days} days"),
        };
        format!(
            "deleted {} ledger rows {}, cleared {} payloads {}, deleted {} delivered outbox rows \
             older than 7 days",
            self.events,
            older(retention.claim_days),
            self.payloads,
            older(retention.payload_days),
            self.outbox
        )
    }
}

/// Between two batches of a prune, the writer's turn: the requests that arrived while a batch
/// ran, and those after. The background job's is [`YieldToWriter`]; the CLI's does not wait.
pub(crate) trait Pace {
    /// Called after each batch (which took `took`, as seen by the caller); returns before the
    /// next one may run, or `false` when the prune must stop now (the server is stopping).
    fn between(&mut self, took: Duration) -> bool;
}

/// No pause: one batch after the other (`hookledger prune`, a command run by hand).
pub(crate) struct Flat;

impl Pace for Flat {
    fn between(&mut self, _took: Duration) -> bool {
        true
    }
}

/// Rest after a batch, as a multiple of the batch's time: the writer spends at most a fifth
/// of its time on a prune. With the writer's time shared half and half, a prune of 1 M
/// random-id claims under 500 events/s saw p50 34 ms and p99 0.8 s (`hookledger-bench
/// prune`, 2 shared cores): the requests' writes, the prune and the checkpoints of its WAL
/// frames were more than the machine kept up with.
const REST_FACTOR: u32 = 4;

/// The shortest rest between two batches.
const REST_MIN: Duration = Duration::from_millis(1);

/// How often a prune looks again whether the writer's queue is empty.
const QUEUE_POLL: Duration = Duration::from_millis(1);

/// The longest a batch waits for the writer's queue to empty: under a load that never lets it
/// empty, a prune still goes on (a batch per this, beside the requests).
const QUEUE_WAIT: Duration = Duration::from_millis(200);

/// How often a prune looks again whether the checkpoints have caught up.
const WAL_POLL: Duration = Duration::from_millis(10);

/// The longest a batch waits for the checkpoints to catch up: a reader that holds them back
/// (a backup) does not stop a prune.
const WAL_WAIT: Duration = Duration::from_secs(2);

/// The background job's [`Pace`]: after each batch it rests ([`REST_FACTOR`] times the
/// batch), then sends the next one only when no job waits in the writer's queue (at most
/// [`QUEUE_WAIT`]), so a batch runs while the writer is idle instead of ahead of requests or
/// beside them in their transaction; and, on SQLite, only once the checkpoints have caught
/// up with what it wrote (at most [`WAL_WAIT`]), so that the WAL starts over instead of
/// filling up to the writer's own checkpoint, which requests would wait behind. `stop` ends
/// the prune early.
pub(crate) struct YieldToWriter<'a> {
    /// Jobs waiting in the writer's queue.
    pub(crate) queued: &'a dyn Fn() -> i64,
    /// The write-ahead log has grown past a quarter of its bound.
    pub(crate) wal_behind: &'a dyn Fn() -> bool,
    /// Waits up to the given time; `true` when the job must stop (the server is stopping).
    pub(crate) sleep: &'a mut dyn FnMut(Duration) -> bool,
}

/// The rest after a batch that took `took`.
fn rest_after(took: Duration) -> Duration {
    took.saturating_mul(REST_FACTOR).max(REST_MIN)
}

impl Pace for YieldToWriter<'_> {
    fn between(&mut self, took: Duration) -> bool {
        if (self.sleep)(rest_after(took)) {
            return false;
        }
        let mut waited = Duration::ZERO;
        while (self.wal_behind)() && waited < WAL_WAIT {
            if (self.sleep)(WAL_POLL) {
                return false;
            }
            waited += WAL_POLL;
        }
        let mut waited = Duration::ZERO;
        while (self.queued)() > 0 && waited < QUEUE_WAIT {
            if (self.sleep)(QUEUE_POLL) {
                return false;
            }
            waited += QUEUE_POLL;
        }
        true
    }
}

/// Runs `batch` until it does nothing (a batch is sized by time, so a short one does not
/// mean the last), pausing between batches as `pace` says; returns the total, and whether
/// the prune was stopped before the end.
fn drain(
    pace: &mut dyn Pace,
    mut batch: impl FnMut() -> Result<u64, StoreError>,
) -> Result<(u64, bool), StoreError> {
    let mut total = 0;
    loop {
        let started = std::time::Instant::now();
        let n = batch()?;
        total += n;
        if n == 0 {
            return Ok((total, false));
        }
        if !pace.between(started.elapsed()) {
            return Ok((total, true));
        }
    }
}

/// One prune as of `now`, each batch through `run` (the writer, or the CLI's connection),
/// paced by `pace`. `newest` is when the newest claim was received ([`newest_claim`]): ages
/// are counted back from it when `now` is later (see the module doc). Last, the pages the
/// prune freed go back to the file system, in batches too.
pub(crate) fn prune(
    now: i64,
    newest: Option<i64>,
    retention: &RetentionConfig,
    pace: &mut dyn Pace,
    mut run: impl FnMut(Write) -> Result<u64, StoreError>,
) -> Result<Pruned, StoreError> {
    let from = match newest {
        Some(newest) if now > newest => {
            if now - newest > FAR_PAST_NEWEST {
                log::warn!(
                    "retention: the clock ({}) is {} days past the newest claim ({}); ages are \
                     counted from the newest claim, not the clock (check the clock if it is \
                     wrong)",
                    crate::time::format_time(now),
                    (now - newest) / 86_400,
                    crate::time::format_time(newest)
                );
            }
            newest
        }
        _ => now,
    };
    let cutoff = |days: u64| window(days).map(|age| from.saturating_sub(age));
    let outbox_cutoff = now - DONE_OUTBOX_KEEP.as_secs() as i64;
    let mut pruned = Pruned::default();
    if let Some(before) = cutoff(retention.claim_days) {
        let (n, stopped) = drain(pace, || run(Write::PruneEvents { before }))?;
        pruned.events = n;
        if stopped {
            pruned.stopped = true;
            return Ok(pruned);
        }
    }
    if let Some(before) = cutoff(retention.payload_days) {
        let (n, stopped) = drain(pace, || run(Write::PrunePayloads { before }))?;
        pruned.payloads = n;
        if stopped {
            pruned.stopped = true;
            return Ok(pruned);
        }
    }
    let (n, stopped) = drain(pace, || {
        run(Write::PruneOutbox {
            before: outbox_cutoff,
        })
    })?;
    pruned.outbox = n;
    pruned.stopped = stopped;
    if !stopped {
        (pruned.pages, pruned.stopped) = drain(pace, || run(Write::Reclaim))?;
    }
    Ok(pruned)
}

/// The hourly background job. Dropping or calling `stop` ends it.
pub(crate) struct Retention {
    /// Never sent on: dropping it (in `stop`) wakes the thread, which then ends.
    stop: SyncSender<()>,
    thread: JoinHandle<()>,
}

impl Retention {
    /// Prunes once at start, then every [`INTERVAL`]; `reader` is read for the newest claim;
    /// `wal_behind`, the store's checkpoints falling behind ([`crate::store::Store::wal_behind`]).
    pub(crate) fn spawn(
        writer: WriterHandle,
        retention: RetentionConfig,
        reader: Reader,
        wal_behind: Option<crate::store::WalBehind>,
    ) -> anyhow::Result<Retention> {
        let (stop, stopped) = mpsc::sync_channel::<()>(0);
        let thread = std::thread::Builder::new()
            .name("hookledger-retention".into())
            .spawn(move || loop {
                // Without the newest claim there is no prune: the clock alone is not trusted.
                let started = std::time::Instant::now();
                let mut sleep = |rest: Duration| {
                    !matches!(stopped.recv_timeout(rest), Err(RecvTimeoutError::Timeout))
                };
                let behind = || {
                    wal_behind
                        .as_ref()
                        .is_some_and(|b| b.load(std::sync::atomic::Ordering::Relaxed))
                };
                let mut pace = YieldToWriter {
                    queued: &|| writer.queued(),
                    wal_behind: &behind,
                    sleep: &mut sleep,
                };
                let result = reader
                    .read(|ledger| Ok(newest_claim(ledger)?))
                    .map_err(|e| StoreError::Unavailable(format!("{e:#}")))
                    .and_then(|newest| {
                        prune(
                            crate::time::unix_now(),
                            newest,
                            &retention,
                            &mut pace,
                            |write| writer.run_blocking(write),
                        )
                    });
                match result {
                    Ok(p) if p.stopped => log::info!(
                        "retention: stopped with the server, the next start goes on; so far it {}",
                        p.describe(&retention)
                    ),
                    Ok(p) if p.events + p.payloads + p.outbox + p.pages > 0 => log::info!(
                        "retention: {}; gave {} free pages back to the file system; in {:.1} s",
                        p.describe(&retention),
                        p.pages,
                        started.elapsed().as_secs_f64()
                    ),
                    Ok(_) => {}
                    Err(e) => log::error!("retention: prune failed, will try again: {e}"),
                }
                match stopped.recv_timeout(INTERVAL) {
                    Err(RecvTimeoutError::Timeout) => continue,
                    _ => break,
                }
            })?;
        Ok(Retention { stop, thread })
    }

    pub(crate) fn stop(self) {
        drop(self.stop);
        if self.thread.join().is_err() {
            log::error!("retention thread panicked");
        }
    }
}

impl crate::writer::Background for Retention {
    fn stop(self: Box<Self>) {
        Retention::stop(*self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{describe_days, parse_days};
    use crate::store::retention::BATCH_ROWS;
    use crate::store::sqlite::SqliteStore;
    use crate::store::Store;

    const DAY: i64 = 86_400;
    /// When the newest claim of [`ledger`] was received.
    const T0: i64 = 1_750_000_000;

    /// A ledger with claims received 500, 31 and 1 day(s) before [`T0`] and at it, each with
    /// its payload.
    fn ledger() -> SqliteStore {
        let store = SqliteStore::open_in_memory().unwrap();
        for (id, days) in [("evt_500", 500), ("evt_31", 31), ("evt_1", 1), ("evt_0", 0)] {
            store
                .connection()
                .execute(
                    "INSERT INTO webhook_events (event_id, event_type, source, received_at, payload)
                     VALUES (?1, 'invoice.paid', 'stripe', ?2, x'7b7d')",
                    rusqlite::params![id, T0 - days * DAY],
                )
                .unwrap();
        }
        store
    }

    /// Prunes `store` as of `now` as the CLI does; what is left: `id:kept|cleared`.
    fn prune_at(
        store: &mut SqliteStore,
        now: i64,
        claim_days: u64,
        payload_days: u64,
    ) -> Vec<String> {
        let retention = RetentionConfig {
            claim_days,
            payload_days,
        };
        let newest = newest_claim(store.connection()).unwrap();
        prune(now, newest, &retention, &mut Flat, |write| {
            store.write_now(&write, now)
        })
        .unwrap();
        let mut statement = store
            .connection()
            .prepare(
                "SELECT event_id || ':' || CASE WHEN payload IS NULL THEN 'cleared' ELSE 'kept' END
                 FROM webhook_events ORDER BY received_at",
            )
            .unwrap();
        let rows = statement.query_map([], |row| row.get(0)).unwrap();
        rows.collect::<Result<_, _>>().unwrap()
    }

    #[test]
    fn ages_prune_as_of_now_when_the_clock_agrees_with_the_ledger() {
        let mut store = ledger();
        assert_eq!(
            prune_at(&mut store, T0 + 3600, 400, 30),
            ["evt_31:cleared", "evt_1:kept", "evt_0:kept"]
        );
    }

    /// `u64::MAX` days once made the cutoff wrap into the future: every claim was deleted.
    #[test]
    fn an_age_too_large_to_count_back_or_never_deletes_nothing() {
        let all = ["evt_500:kept", "evt_31:kept", "evt_1:kept", "evt_0:kept"];
        for days in [106_751_991_167_301, 1 << 62, u64::MAX - 1, NEVER] {
            assert_eq!(window(days), None, "{days}");
            let mut store = ledger();
            assert_eq!(prune_at(&mut store, T0, days, days), all, "{days} days");
        }
        assert_eq!(window(106_751_991_167_300), Some(106_751_991_167_300 * DAY));
        // Claims for ever, payloads 30 days.
        let mut store = ledger();
        assert_eq!(
            prune_at(&mut store, T0, NEVER, 30),
            [
                "evt_500:cleared",
                "evt_31:cleared",
                "evt_1:kept",
                "evt_0:kept"
            ]
        );
    }

    /// One start with the clock 500 days ahead once pruned every claim.
    #[test]
    fn a_clock_far_ahead_of_the_newest_claim_prunes_only_what_the_newest_claim_would() {
        let mut store = ledger();
        assert_eq!(
            prune_at(&mut store, T0 + 500 * DAY, 400, 30),
            ["evt_31:cleared", "evt_1:kept", "evt_0:kept"],
            "as if pruned at the newest claim's time: only the 500-day-old claim goes"
        );
        // And a clock behind the ledger prunes as of the clock.
        let mut store = ledger();
        assert_eq!(
            prune_at(&mut store, T0 - 2 * DAY, 400, 30),
            ["evt_31:kept", "evt_1:kept", "evt_0:kept"]
        );
    }

    /// A [`Pace`] that, between two batches, runs `between` (a request's write) and says
    /// whether to go on.
    struct Between<F: FnMut() -> bool>(F);

    impl<F: FnMut() -> bool> Pace for Between<F> {
        fn between(&mut self, _took: Duration) -> bool {
            (self.0)()
        }
    }

    /// 1,200 old payloads in a ledger of `store`, and the insert of a fresh event.
    fn old_payloads(store: &SqliteStore) {
        for i in 0..1200 {
            insert(store, &format!("evt_old_{i}"), T0 - 40 * DAY);
        }
    }

    fn insert(store: &SqliteStore, id: &str, at: i64) {
        store
            .connection()
            .execute(
                "INSERT INTO webhook_events (event_id, event_type, source, received_at, payload)
                 VALUES (?1, 'invoice.paid', 'stripe', ?2, x'7b7d')",
                rusqlite::params![id, at],
            )
            .unwrap();
    }

    fn count(store: &SqliteStore, sql: &str) -> i64 {
        store.connection().query_row(sql, [], |r| r.get(0)).unwrap()
    }

    /// A prune is many short writer jobs, never one long one: 1,200 old payloads take at least
    /// three batches of at most [`BATCH_ROWS`] (fewer rows when a batch's time runs out), the
    /// pace runs between every two of them, and other writes (requests) made there stand.
    #[test]
    fn a_prune_is_short_batches_with_other_writes_between_them() {
        let store = std::cell::RefCell::new(SqliteStore::open_in_memory().unwrap());
        old_payloads(&store.borrow());
        let retention = RetentionConfig {
            claim_days: 400,
            payload_days: 30,
        };
        let mut batches = Vec::new();
        let mut between = 0;
        let mut pace = Between(|| {
            between += 1;
            insert(&store.borrow(), &format!("evt_between_{between}"), T0);
            true
        });
        let pruned = prune(T0, Some(T0), &retention, &mut pace, |write| {
            let n = store.borrow_mut().write_now(&write, T0)?;
            if matches!(write, Write::PrunePayloads { .. }) {
                batches.push(n);
            }
            Ok(n)
        })
        .unwrap();
        let store = store.into_inner();
        assert_eq!(pruned.payloads, 1200);
        assert!(!pruned.stopped);
        assert_eq!(batches.iter().sum::<u64>(), 1200);
        assert!(batches.len() >= 4, "{batches:?}");
        assert!(
            batches.iter().all(|&n| n <= BATCH_ROWS as u64),
            "{batches:?}"
        );
        assert_eq!(batches.last(), Some(&0), "the prune ends on an empty batch");
        // One pause after each batch that did something: no claim or outbox row was old
        // enough, and an in-memory database has no pages to give back.
        let payload_batches = batches.iter().filter(|&&n| n > 0).count();
        assert_eq!(between, payload_batches);
        assert_eq!(
            pruned.pages, 0,
            "an in-memory database has no file to shrink"
        );
        assert_eq!(
            count(
                &store,
                "SELECT count(*) FROM webhook_events WHERE payload IS NULL"
            ),
            1200
        );
        assert_eq!(
            count(
                &store,
                "SELECT count(*) FROM webhook_events
                 WHERE event_id LIKE 'evt_between_%' AND payload IS NOT NULL"
            ),
            payload_batches as i64,
            "the writes between the batches stand, with their payloads"
        );
    }

    /// A pace that says stop (the server is stopping) ends the prune after the batch that
    /// ran: what is left is for the next prune, and no later step runs.
    #[test]
    fn a_prune_stops_between_two_batches_when_told() {
        let mut store = SqliteStore::open_in_memory().unwrap();
        old_payloads(&store);
        let retention = RetentionConfig {
            claim_days: 400,
            payload_days: 30,
        };
        let mut writes = Vec::new();
        let pruned = prune(T0, Some(T0), &retention, &mut Between(|| false), |write| {
            writes.push(format!("{write:?}"));
            store.write_now(&write, T0)
        })
        .unwrap();
        assert_eq!(
            writes.len(),
            2,
            "the claims' empty batch, one of payloads: {writes:?}"
        );
        assert!(pruned.payloads > 0 && pruned.payloads <= BATCH_ROWS as u64);
        assert_eq!(
            count(
                &store,
                "SELECT count(*) FROM webhook_events WHERE payload IS NULL"
            ),
            pruned.payloads as i64
        );
        assert_eq!((pruned.outbox, pruned.pages), (0, 0));
        assert!(pruned.stopped);
    }

    /// The background job's pace: it rests [`REST_FACTOR`] times the batch, then waits while
    /// jobs are queued for the writer (looking every [`QUEUE_POLL`]), at most [`QUEUE_WAIT`];
    /// a stop while it waits ends the prune. The sleeps are recorded, not slept.
    #[test]
    fn the_writers_pace_rests_then_waits_for_an_empty_queue() {
        let run = |depths: Vec<i64>, stop_at: Option<usize>, took: Duration| {
            let depths = std::cell::RefCell::new(depths.into_iter());
            let queued = || depths.borrow_mut().next().unwrap_or(0);
            let mut slept = Vec::new();
            let mut sleep = |d: Duration| {
                slept.push(d);
                Some(slept.len()) == stop_at
            };
            let mut pace = YieldToWriter {
                queued: &queued,
                wal_behind: &|| false,
                sleep: &mut sleep,
            };
            let go_on = pace.between(took);
            (go_on, slept)
        };
        let ms = Duration::from_millis;
        // An idle writer: the rest only.
        assert_eq!(run(vec![0], None, ms(2)), (true, vec![ms(2) * REST_FACTOR]));
        // A fast batch rests at least REST_MIN.
        assert_eq!(run(vec![], None, Duration::ZERO), (true, vec![REST_MIN]));
        // Jobs queued: it looks again until the queue is empty.
        assert_eq!(
            run(vec![3, 1, 0, 5], None, ms(2)),
            (true, vec![ms(2) * REST_FACTOR, QUEUE_POLL, QUEUE_POLL])
        );
        // A queue that never empties: the batch goes after QUEUE_WAIT.
        let (go_on, slept) = run(vec![1; 10_000], None, ms(2));
        assert!(go_on);
        assert_eq!(
            slept.len() as u32,
            1 + QUEUE_WAIT.as_millis() as u32 / QUEUE_POLL.as_millis() as u32
        );
        // Stopped during the rest, or while it waits for the queue.
        assert_eq!(
            run(vec![0], Some(1), ms(2)),
            (false, vec![ms(2) * REST_FACTOR])
        );
        assert_eq!(
            run(vec![1, 1, 1], Some(3), ms(2)),
            (false, vec![ms(2) * REST_FACTOR, QUEUE_POLL, QUEUE_POLL])
        );
    }

    /// While the checkpoints are behind, the pace waits for them (looking every
    /// [`WAL_POLL`], at most [`WAL_WAIT`]) before it waits for the queue.
    #[test]
    fn the_writers_pace_waits_for_the_checkpoints_to_catch_up() {
        let run = |behind: Vec<bool>, stop_at: Option<usize>| {
            let behind = std::cell::RefCell::new(behind.into_iter());
            let wal_behind = || behind.borrow_mut().next().unwrap_or(false);
            let mut slept = Vec::new();
            let mut sleep = |d: Duration| {
                slept.push(d);
                Some(slept.len()) == stop_at
            };
            let mut pace = YieldToWriter {
                queued: &|| 0,
                wal_behind: &wal_behind,
                sleep: &mut sleep,
            };
            let go_on = pace.between(Duration::from_millis(2));
            (go_on, slept)
        };
        let rest = Duration::from_millis(2) * REST_FACTOR;
        assert_eq!(
            run(vec![true, true, false], None),
            (true, vec![rest, WAL_POLL, WAL_POLL])
        );
        // Checkpoints held back for good (a long reader): the batch goes after WAL_WAIT.
        let (go_on, slept) = run(vec![true; 10_000], None);
        assert!(go_on);
        assert_eq!(
            slept.len() as u32,
            1 + WAL_WAIT.as_millis() as u32 / WAL_POLL.as_millis() as u32
        );
        assert_eq!(run(vec![true; 5], Some(2)), (false, vec![rest, WAL_POLL]));
    }

    #[test]
    fn days_are_a_number_or_never() {
        assert_eq!(parse_days("400"), Ok(400));
        assert_eq!(parse_days("never"), Ok(NEVER));
        assert_eq!(parse_days("18446744073709551615"), Ok(u64::MAX));
        assert!(parse_days("forever").unwrap_err().contains("never"));
        let config = |text: &str| toml::from_str::<RetentionConfig>(text);
        let r = config("claim_days = \"never\"\npayload_days = 9223372036854775807").unwrap();
        assert_eq!((r.claim_days, r.payload_days), (NEVER, i64::MAX as u64));
        let err = config("claim_days = \"forever\"").unwrap_err();
        assert!(
            err.message().contains("must be a number of days or never"),
            "{err}"
        );
        assert_eq!(describe_days(NEVER), "for ever");
        assert_eq!(describe_days(400), "400 days");
        assert!(crate::config::check_retention(NEVER).is_ok());
    }
}

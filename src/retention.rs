//! Retention: forget what the provider can no longer resend.
//!
//! Two ages: payloads (the stored bodies) are cleared after `payload_days` (30), while the
//! claims (the ledger rows, which make a resend a duplicate) stay for `claim_days` (400):
//! for schemes without a signed timestamp (github, shopify, hmac) the claim is the only replay
//! protection, so a captured delivery resent months later must still find it. `done` outbox
//! rows older than a week are deleted. All in small batches, each batch a job of the writer,
//! so a prune never holds the write lock long enough to delay webhooks. Pending and dead
//! outbox rows are kept: they still need delivery or a person's attention.
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
use crate::store::retention::BATCH_ROWS;
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

/// Runs `batch` until it deletes less than a full batch; returns the total.
fn drain(mut batch: impl FnMut() -> Result<u64, StoreError>) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let n = batch()?;
        total += n;
        if n < BATCH_ROWS as u64 {
            return Ok(total);
        }
    }
}

/// One prune as of `now`, each batch through `run` (the writer, or the CLI's connection).
/// `newest` is when the newest claim was received ([`newest_claim`]): ages are counted back
/// from it when `now` is later (see the module doc).
pub(crate) fn prune(
    now: i64,
    newest: Option<i64>,
    retention: &RetentionConfig,
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
    let events = match cutoff(retention.claim_days) {
        Some(before) => drain(|| run(Write::PruneEvents { before }))?,
        None => 0,
    };
    let payloads = match cutoff(retention.payload_days) {
        Some(before) => drain(|| run(Write::PrunePayloads { before }))?,
        None => 0,
    };
    let outbox = drain(|| {
        run(Write::PruneOutbox {
            before: outbox_cutoff,
        })
    })?;
    Ok(Pruned {
        events,
        payloads,
        outbox,
    })
}

/// The hourly background job. Dropping or calling `stop` ends it.
pub(crate) struct Retention {
    /// Never sent on: dropping it (in `stop`) wakes the thread, which then ends.
    stop: SyncSender<()>,
    thread: JoinHandle<()>,
}

impl Retention {
    /// Prunes once at start, then every [`INTERVAL`]; `reader` is read for the newest claim.
    pub(crate) fn spawn(
        writer: WriterHandle,
        retention: RetentionConfig,
        reader: Reader,
    ) -> anyhow::Result<Retention> {
        let (stop, stopped) = mpsc::sync_channel::<()>(0);
        let thread = std::thread::Builder::new()
            .name("hookledger-retention".into())
            .spawn(move || loop {
                // Without the newest claim there is no prune: the clock alone is not trusted.
                let result = reader
                    .read(|ledger| Ok(newest_claim(ledger)?))
                    .map_err(|e| StoreError::Unavailable(format!("{e:#}")))
                    .and_then(|newest| {
                        prune(crate::time::unix_now(), newest, &retention, |write| {
                            writer.run_blocking(write)
                        })
                    });
                match result {
                    Ok(p) if p.events + p.payloads + p.outbox > 0 => {
                        log::info!("retention: {}", p.describe(&retention))
                    }
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
        prune(now, newest, &retention, |write| {
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

    /// A prune is many short writer jobs, never one long one: 1,200 old payloads take three
    /// batches of at most [`BATCH_ROWS`], and other writes (requests) run between them.
    #[test]
    fn a_prune_is_short_batches_with_other_writes_between_them() {
        let mut store = SqliteStore::open_in_memory().unwrap();
        let insert = |store: &SqliteStore, id: &str, at: i64| {
            store
                .connection()
                .execute(
                    "INSERT INTO webhook_events (event_id, event_type, source, received_at, payload)
                     VALUES (?1, 'invoice.paid', 'stripe', ?2, x'7b7d')",
                    rusqlite::params![id, at],
                )
                .unwrap();
        };
        for i in 0..1200 {
            insert(&store, &format!("evt_old_{i}"), T0 - 40 * DAY);
        }
        let retention = RetentionConfig {
            claim_days: 400,
            payload_days: 30,
        };
        let mut batches = Vec::new();
        let pruned = prune(T0, Some(T0), &retention, |write| {
            let n = store.write_now(&write, T0)?;
            if matches!(write, Write::PrunePayloads { .. }) {
                batches.push(n);
                insert(&store, &format!("evt_between_{}", batches.len()), T0);
            }
            Ok(n)
        })
        .unwrap();
        assert_eq!(batches, [500, 500, 200]);
        assert_eq!(pruned.payloads, 1200);
        let count =
            |sql: &str| -> i64 { store.connection().query_row(sql, [], |r| r.get(0)).unwrap() };
        assert_eq!(
            count("SELECT count(*) FROM webhook_events WHERE payload IS NULL"),
            1200
        );
        assert_eq!(
            count(
                "SELECT count(*) FROM webhook_events
                 WHERE event_id LIKE 'evt_between_%' AND payload IS NOT NULL"
            ),
            3,
            "the writes between the batches stand, with their payloads"
        );
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

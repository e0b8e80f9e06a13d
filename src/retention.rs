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
//! # Failure modes
//! A claim age shorter than Stripe's 3-day retry window is refused at start-up
//! (`config::check_retention`): a retried event whose claim was already deleted would be
//! applied twice.

use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::config::RetentionConfig;
use crate::sql::StoreError;
use crate::store::retention::BATCH_ROWS;
use crate::store::Write;
use crate::writer::WriterHandle;

/// Delivered outbox rows are kept a week for `outbox list`, then deleted.
pub(crate) const DONE_OUTBOX_KEEP: Duration = Duration::from_secs(7 * 86_400);

/// How often the background job runs: the retention age is counted in days, so an hour late
/// is nothing, and most runs find nothing to delete.
pub(crate) const INTERVAL: Duration = Duration::from_secs(3600);

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
        format!(
            "deleted {} ledger rows older than {} days, cleared {} payloads older than {} days, \
             deleted {} delivered outbox rows older than 7 days",
            self.events, retention.claim_days, self.payloads, retention.payload_days, self.outbox
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
pub(crate) fn prune(
    now: i64,
    retention: &RetentionConfig,
    mut run: impl FnMut(Write) -> Result<u64, StoreError>,
) -> Result<Pruned, StoreError> {
    let days_ago = |days: u64| now.saturating_sub(days.saturating_mul(86_400) as i64);
    let outbox_cutoff = now - DONE_OUTBOX_KEEP.as_secs() as i64;
    let events = drain(|| {
        run(Write::PruneEvents {
            before: days_ago(retention.claim_days),
        })
    })?;
    let payloads = drain(|| {
        run(Write::PrunePayloads {
            before: days_ago(retention.payload_days),
        })
    })?;
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
    /// Prunes once at start, then every [`INTERVAL`].
    pub(crate) fn spawn(
        writer: WriterHandle,
        retention: RetentionConfig,
    ) -> anyhow::Result<Retention> {
        let (stop, stopped) = mpsc::sync_channel::<()>(0);
        let thread = std::thread::Builder::new()
            .name("hookledger-retention".into())
            .spawn(move || loop {
                match prune(crate::time::unix_now(), &retention, |write| {
                    writer.run_blocking(write)
                }) {
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

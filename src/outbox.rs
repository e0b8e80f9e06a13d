//! The outbox: external calls written in the event's transaction as rows with a unique
//! `(kind, key)`, delivered after commit by the worker ([`crate::delivery`]). This module holds
//! what is the same on every store and every target: the row as the worker sees it, the
//! [`Target`] that attempts a row of its kind, the result of an attempt, and the retry
//! schedule (data, not code). The SQL is the store's.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::sql::{StoreError, Tx};

/// The outbox kind of "POST this event to the app", and the default retry schedule: the
/// config's, which checks deliveries against them.
pub(crate) use crate::config::{default_schedule, FORWARD};

/// A row a route queues for a new event (`on = [...]` on `[forward]` or a `[[delivery]]`): its
/// kind and the value of the route's `key` pointer, if it has one (the row's `coalesce_key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Routed {
    pub(crate) kind: Arc<str>,
    pub(crate) coalesce_key: Option<String>,
}

/// A pending row, as the worker polls it: its id and what the attempt needs to know, not its
/// payload. The worker reads the payload by id when it attempts the row, so a poll of many
/// rows holds no payload at all.
#[derive(Debug, Clone)]
pub(crate) struct PendingRow {
    pub(crate) id: i64,
    pub(crate) kind: String,
    /// The source of the event that queued the row.
    pub(crate) source: String,
    pub(crate) key: String,
    /// The type of the event a `forward` row delivers (rows made before 0.2 may have none).
    pub(crate) event_type: Option<String>,
    pub(crate) attempts: i64,
    /// How many times the row was queued (see `store::outbox::record`).
    pub(crate) queued: i64,
    /// The lease the poll took on the row (PostgreSQL; SQLite has none): releasing the row or
    /// starting its attempt changes it only while this instance still holds it.
    pub(crate) lease: Option<Lease>,
}

/// A row's lease on PostgreSQL, as a poll took it: the server process of the connection that
/// holds it (its `leased_until` moves on as the worker renews it). Once the lease lapsed,
/// another instance may lease the row: its holder is then another process, so the first
/// instance can neither release nor attempt it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) by: i32,
}

/// What attempts the rows of one kind: a POST to a URL ([`crate::delivery`]), or a fetch from
/// a provider's API whose answer goes back to the handler that queued the row (a provider
/// wing's refresh). The worker calls it after commit, outside any transaction.
pub(crate) trait Target: Send + Sync + 'static {
    /// One attempt at `row`, whose payload is `payload`: on success, what to write as the row
    /// is marked done (usually nothing); on failure, why, which decides between a retry and a
    /// dead row.
    fn attempt(
        &self,
        row: &PendingRow,
        payload: &[u8],
    ) -> Result<Option<Arc<dyn FollowUp>>, Failure>;
}

/// Why an attempt failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The target said it is gone for good (HTTP 410): dead at once. With where it was sent
    /// and the start of the answer's body.
    Gone(String),
    /// Nothing a retry would change (a key the API refuses, an object it does not have): dead
    /// at once.
    Refused(String),
    /// An HTTP status, with the `Retry-After` the target asked for, and where it was sent
    /// with the start of the answer's body (`from URL: excerpt`): retried.
    Status(u16, Option<Duration>, String),
    /// No answer (refused, timed out, reset, DNS, TLS), its cause and the target: retried.
    Transport(String),
    /// A command ran and failed (an exit, a signal, its timeout): retried, or dead at once
    /// when `give_up` (an exit in `give_up_exit`); `output` is the tail of what it printed.
    Ran {
        error: String,
        output: String,
        give_up: bool,
    },
}

/// Told of each attempt the worker recorded (the alerts watch rows going dead and kinds
/// delivering again). Called on the attempt's thread, after the write committed.
pub(crate) trait Observer: Send + Sync {
    fn recorded(&self, row: &PendingRow, attempt: &Attempt);
}

/// A write a [`Target`] hands back with its success: it runs in the transaction that marks its
/// row done, and only when the row is still the one attempted (not replayed meanwhile).
pub(crate) trait FollowUp: Send + Sync + fmt::Debug {
    fn apply(&self, tx: &Tx<'_>) -> Result<(), StoreError>;
}

/// The result of one delivery attempt, written back by the writer.
#[derive(Debug, Clone)]
pub(crate) enum Attempt {
    /// Done; `follow_up` is written with it.
    Delivered {
        follow_up: Option<Arc<dyn FollowUp>>,
    },
    /// Try again at `at` (Unix seconds). `output`: the tail of a failed command's output.
    Retry {
        at: i64,
        error: String,
        output: Option<String>,
    },
    Dead {
        error: String,
        output: Option<String>,
    },
}

impl Attempt {
    /// The result as counted: `delivered`, `retry` or `dead`.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Attempt::Delivered { .. } => "delivered",
            Attempt::Retry { .. } => "retry",
            Attempt::Dead { .. } => "dead",
        }
    }
}

/// An app's `Retry-After` can push a retry later than the schedule, but not past this.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The delay before attempt number `attempts + 1` (after `attempts` failures), or `None` when
/// the schedule is used up. `retry_after` (from the app) can make it later, within bounds.
pub(crate) fn next_delay(
    schedule: &[Duration],
    attempts: usize,
    retry_after: Option<Duration>,
) -> Option<Duration> {
    let base = *schedule.get(attempts.checked_sub(1)?)?;
    let jitter = 0.8 + fastrand::f64() * 0.4;
    let delay = base.mul_f64(jitter);
    Some(match retry_after {
        Some(asked) => delay.max(asked.min(MAX_RETRY_AFTER)),
        None => delay,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_follow_the_schedule_with_jitter_and_bounded_retry_after() {
        let s = [Duration::from_secs(10), Duration::from_secs(100)];
        for _ in 0..100 {
            let d = next_delay(&s, 1, None).unwrap();
            assert!(
                d >= Duration::from_secs(8) && d <= Duration::from_secs(12),
                "{d:?}"
            );
        }
        assert!(next_delay(&s, 2, None).unwrap() >= Duration::from_secs(80));
        assert_eq!(next_delay(&s, 3, None), None, "schedule used up");
        let asked = next_delay(&s, 1, Some(Duration::from_secs(600))).unwrap();
        assert_eq!(asked, Duration::from_secs(600));
        let capped = next_delay(&s, 1, Some(Duration::from_secs(999_999))).unwrap();
        assert_eq!(capped, MAX_RETRY_AFTER);
        let sooner = next_delay(&s, 1, Some(Duration::from_secs(1))).unwrap();
        assert!(
            sooner >= Duration::from_secs(8),
            "never sooner than the schedule"
        );
    }
}

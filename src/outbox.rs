//! The outbox: external calls written in the event's transaction as rows with a unique
//! `(kind, key)`, delivered after commit by the worker ([`crate::delivery`]). This module holds
//! what is the same on every store: the row as the worker sees it, the result of an attempt,
//! and the retry schedule (data, not code). The SQL is the store's.

use std::time::Duration;

use crate::stripe::billing::SubscriptionChange;

/// The outbox kind of "POST this event to the app", and the default retry schedule: the
/// config's, which checks deliveries against them.
pub(crate) use crate::config::{default_schedule, FORWARD};

/// A pending row, as the worker reads it.
#[derive(Debug, Clone)]
pub(crate) struct PendingRow {
    pub(crate) id: i64,
    pub(crate) kind: String,
    /// The source of the event that queued the row.
    pub(crate) source: String,
    pub(crate) key: String,
    /// The type of the event a `forward` row delivers (rows made before 0.2 may have none).
    pub(crate) event_type: Option<String>,
    pub(crate) payload: Vec<u8>,
    pub(crate) attempts: i64,
    /// How many times the row was queued (see `store::outbox::record`).
    pub(crate) queued: i64,
}

/// The result of one delivery attempt, written back by the writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt {
    Delivered,
    /// Try again at `at` (Unix seconds).
    Retry {
        at: i64,
        error: String,
    },
    Dead {
        error: String,
    },
    /// A [`REFRESH`] row's fetch: `snapshot` of the subscription, by a request begun at second
    /// `started`, for a tie at second `at`, is stored as the row is marked done.
    ///
    /// [`REFRESH`]: crate::stripe::billing::REFRESH
    Fetched {
        snapshot: SubscriptionChange,
        at: i64,
        started: i64,
    },
}

impl Attempt {
    /// The result as counted: `delivered`, `retry` or `dead`.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Attempt::Delivered | Attempt::Fetched { .. } => "delivered",
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

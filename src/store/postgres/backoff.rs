//! When the writer may connect to PostgreSQL again after a connection was lost: at once the
//! first time (a restart or a dropped connection usually comes back at the first try), then,
//! while attempts fail, after [`FIRST_WAIT`], doubling up to [`MAX_WAIT`]. Until then each batch
//! fails at once with [`StoreError::Unavailable`](crate::sql::StoreError::Unavailable) (503
//! `database_unavailable`), without a connect attempt of its own: a server that is down is
//! not asked a thousand times a second, and no request waits for a connect that will fail.

use std::time::{Duration, Instant};

/// The wait after the first failed attempt: short enough that a server back from a restart
/// is found within a tenth of a second.
pub(super) const FIRST_WAIT: Duration = Duration::from_millis(100);

/// The longest wait between attempts: a server that has been down for a while is tried every
/// five seconds, so it is back in use at most five seconds after it is.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(5);

/// The state of the attempts since the connection was lost.
#[derive(Debug, Default)]
pub(super) struct Backoff {
    /// The last wait (zero: no attempt has failed since the last success).
    wait: Duration,
    /// No attempt before this.
    until: Option<Instant>,
}

impl Backoff {
    /// How long to wait yet at `now` before the next attempt; `None` when it may be made.
    pub(super) fn remaining(&self, now: Instant) -> Option<Duration> {
        self.until
            .and_then(|until| until.checked_duration_since(now))
            .filter(|left| !left.is_zero())
    }

    /// An attempt failed at `now`: the next waits twice as long as the last (at most
    /// [`MAX_WAIT`]).
    pub(super) fn failed(&mut self, now: Instant) {
        self.wait = if self.wait.is_zero() {
            FIRST_WAIT
        } else {
            (self.wait * 2).min(MAX_WAIT)
        };
        self.until = Some(now + self.wait);
    }

    /// An attempt succeeded: the next lost connection is tried again at once.
    pub(super) fn succeeded(&mut self) {
        *self = Backoff::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_from_a_tenth_of_a_second_to_five_seconds_and_reset_on_success() {
        let mut backoff = Backoff::default();
        let mut now = Instant::now();
        assert_eq!(backoff.remaining(now), None, "the first attempt at once");
        let mut waits = Vec::new();
        for _ in 0..9 {
            backoff.failed(now);
            let wait = backoff.remaining(now).expect("a wait after a failure");
            assert_eq!(
                backoff.remaining(now + wait / 2),
                Some(wait - wait / 2),
                "no attempt meanwhile"
            );
            now += wait;
            assert_eq!(backoff.remaining(now), None, "an attempt once it is over");
            waits.push(wait.as_millis());
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        backoff.succeeded();
        assert_eq!(backoff.remaining(now), None);
        backoff.failed(now);
        assert_eq!(
            backoff.remaining(now),
            Some(FIRST_WAIT),
            "from the start again"
        );
    }
}

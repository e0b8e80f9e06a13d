//! A kind's lane: its target and schedule, how many attempts run at once, its breaker and its
//! rate (the worker in `mod.rs` runs it).

use std::time::{Duration, Instant};

use crate::config::LaneSettings;
use crate::outbox::Target;

/// A kind's target, when the worker tries again, and its lane's settings (how many attempts
/// may be in flight at once, the breaker, the rate, coalescing).
pub(crate) struct Lane {
    pub(super) target: Box<dyn Target>,
    pub(super) schedule: Vec<Duration>,
    /// How long stopping waits for this kind's running attempts.
    pub(super) timeout: Duration,
    pub(super) settings: LaneSettings,
}

impl Lane {
    /// Its concurrency, breaker, rate and coalescing as configured.
    pub(crate) fn settings(&mut self, settings: LaneSettings) -> &mut Lane {
        self.settings = LaneSettings {
            concurrency: settings.concurrency.max(1),
            breaker_failures: settings.breaker_failures.max(1),
            ..settings
        };
        self
    }

    /// Stopping waits this long for a running attempt (the target's own timeout).
    pub(crate) fn timeout(&mut self, timeout: Duration) -> &mut Lane {
        self.timeout = timeout;
        self
    }
}

/// A kind's circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Breaker {
    /// Attempts go out.
    Closed,
    /// Paused after consecutive failures until then; then one probe.
    Open(Instant),
    /// The probe is in flight; nothing else goes out.
    Probing,
}

/// A token bucket: a token every `spacing`, at most `capacity` saved up.
#[derive(Debug)]
pub(super) struct Bucket {
    spacing: Duration,
    capacity: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl Bucket {
    /// Full at first.
    pub(super) fn new(spacing: Duration, capacity: f64) -> Bucket {
        Bucket {
            spacing,
            capacity,
            tokens: capacity,
            last: None,
        }
    }

    /// Takes a token at `now`, or says how long until there is one.
    /// The time between two tokens.
    pub(super) fn spacing(&self) -> Duration {
        self.spacing
    }

    pub(super) fn take(&mut self, now: Instant) -> Option<Duration> {
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
pub(super) enum Gate {
    Go,
    /// Hand out one row, the probe.
    Probe,
    Wait(Duration),
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
}

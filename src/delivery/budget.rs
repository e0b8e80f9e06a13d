//! The payload bytes in flight across all lanes: one budget (`storage.outbox_payload_budget`)
//! that every attempt takes its payload's size from before it is attempted and gives back when
//! its attempt ends. Payloads are read one at a time against it: a payload that does not fit
//! is dropped, its size waited for, and read again; so the payloads held by the worker never
//! add up to more than the budget, except one payload larger than the whole budget, which is
//! attempted alone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How often a wait for room looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(200);

pub(crate) struct Budget {
    limit: usize,
    in_use: Mutex<usize>,
    freed: Condvar,
    /// Held while a payload is read and its room taken: one payload at a time is outside the
    /// budget's count.
    reading: Mutex<()>,
}

/// Bytes taken from the budget, given back when dropped.
pub(crate) struct Held<'b> {
    budget: &'b Budget,
    bytes: usize,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Budget {
        Budget {
            limit: limit.max(1),
            in_use: Mutex::new(0),
            freed: Condvar::new(),
            reading: Mutex::new(()),
        }
    }

    /// The turn to read a payload (one reader at a time across the lanes).
    pub(crate) fn reading(&self) -> MutexGuard<'_, ()> {
        self.reading.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fits(&self, in_use: usize, bytes: usize) -> bool {
        in_use == 0 || in_use.saturating_add(bytes) <= self.limit
    }

    /// `bytes` if they fit now (or nothing else is in flight), else `None`.
    pub(crate) fn try_take(&self, bytes: usize) -> Option<Held<'_>> {
        let mut in_use = self.in_use.lock().unwrap_or_else(|e| e.into_inner());
        self.fits(*in_use, bytes).then(|| {
            *in_use += bytes;
            Held {
                budget: self,
                bytes,
            }
        })
    }

    /// `bytes`, once they fit; `None` if `stop` is set first.
    pub(crate) fn take(&self, bytes: usize, stop: &AtomicBool) -> Option<Held<'_>> {
        let mut in_use = self.in_use.lock().unwrap_or_else(|e| e.into_inner());
        while !self.fits(*in_use, bytes) {
            if stop.load(Ordering::SeqCst) {
                return None;
            }
            in_use = self
                .freed
                .wait_timeout(in_use, STOP_CHECK)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *in_use += bytes;
        Some(Held {
            budget: self,
            bytes,
        })
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut in_use = self.budget.in_use.lock().unwrap_or_else(|e| e.into_inner());
        *in_use -= self.bytes;
        self.budget.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_taken_up_to_the_limit_and_one_larger_payload_goes_alone() {
        let budget = Budget::new(10);
        let stop = AtomicBool::new(false);
        let a = budget.try_take(6).unwrap();
        assert!(budget.try_take(5).is_none());
        let b = budget.try_take(4).unwrap();
        drop(a);
        assert!(budget.try_take(7).is_none());
        drop(b);
        // Larger than the whole budget: alone.
        let big = budget.take(25, &stop).unwrap();
        assert!(budget.try_take(1).is_none());
        stop.store(true, Ordering::SeqCst);
        assert!(budget.take(1, &stop).is_none(), "a stop ends the wait");
        drop(big);
        assert!(budget.try_take(10).is_some());
    }
}

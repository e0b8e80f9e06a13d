//! A budget for log lines of one kind: a flood (forged requests, a full body budget, a
//! database that fails every batch) must not become a flood of log lines that fills the disk.
//! At most so many lines are written each second ([`LINES_PER_SECOND`] unless the budget says
//! otherwise); the rest are counted, and the count is written with the next line that is.

use std::sync::{Mutex, PoisonError};

/// Rejection lines written per second at most.
pub(crate) const LINES_PER_SECOND: u32 = 10;

pub(crate) struct LogBudget {
    /// Lines written per second at most.
    per_second: u32,
    state: Mutex<State>,
}

impl Default for LogBudget {
    fn default() -> Self {
        LogBudget::new()
    }
}

impl LogBudget {
    /// [`LINES_PER_SECOND`] lines a second.
    pub(crate) const fn new() -> Self {
        LogBudget::per_second(LINES_PER_SECOND)
    }

    /// `lines` lines a second.
    pub(crate) const fn per_second(lines: u32) -> Self {
        LogBudget {
            per_second: lines,
            state: Mutex::new(State {
                second: 0,
                written: 0,
                held_back: 0,
            }),
        }
    }
}

struct State {
    /// The second (Unix time) the count is for.
    second: i64,
    written: u32,
    /// Lines held back since the last one written.
    held_back: u64,
}

impl LogBudget {
    /// Whether a line may be written at `now` (Unix seconds): `Some` with what to add to it
    /// (empty, or how many earlier `what` were held back), or `None` (this one is held back
    /// and counted).
    pub(crate) fn admit(&self, now: i64, what: &str) -> Option<String> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.second != now {
            state.second = now;
            state.written = 0;
        }
        if state.written < self.per_second {
            state.written += 1;
            Some(match std::mem::take(&mut state.held_back) {
                0 => String::new(),
                n => format!(" ({n} earlier {what} not logged)"),
            })
        } else {
            state.held_back += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_ten_a_second_and_reports_the_rest_with_the_next() {
        let budget = LogBudget::default();
        let first: Vec<_> = (0..25).map(|_| budget.admit(100, "lines")).collect();
        assert_eq!(first.iter().filter(|a| a.is_some()).count(), 10);
        assert!(first[..10].iter().all(|a| a.as_deref() == Some("")));
        assert!(first[10..].iter().all(Option::is_none));
        assert_eq!(
            budget.admit(101, "lines").as_deref(),
            Some(" (15 earlier lines not logged)"),
            "the next second reports what was held"
        );
        assert_eq!(budget.admit(101, "lines").as_deref(), Some(""));
    }

    #[test]
    fn a_budget_of_two_a_second_writes_two() {
        let budget = LogBudget::per_second(2);
        let first: Vec<_> = (0..5).map(|_| budget.admit(7, "failures")).collect();
        assert_eq!(
            first,
            [Some(String::new()), Some(String::new()), None, None, None]
        );
        assert_eq!(
            budget.admit(8, "failures").as_deref(),
            Some(" (3 earlier failures not logged)")
        );
    }
}

//! `rate = "20/s"`: at most so many delivery attempts of a kind per second or per minute.

use std::time::Duration;

/// Attempts per period, evenly spaced: one every `period / count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rate {
    pub(crate) count: u32,
    pub(crate) period: Duration,
}

impl Rate {
    /// `N/s` or `N/m` (N at least 1, at most 1,000,000); `None` when it is not.
    pub(crate) fn parse(text: &str) -> Option<Rate> {
        let (count, unit) = text.trim().split_once('/')?;
        let count: u32 = count.trim().parse().ok()?;
        let period = match unit.trim() {
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            _ => return None,
        };
        (1..=1_000_000)
            .contains(&count)
            .then_some(Rate { count, period })
    }

    /// The time between two attempts.
    pub(crate) fn spacing(&self) -> Duration {
        self.period / self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_per_second_or_minute_and_nothing_else() {
        assert_eq!(
            Rate::parse("20/s"),
            Some(Rate {
                count: 20,
                period: Duration::from_secs(1)
            })
        );
        assert_eq!(
            Rate::parse(" 30 / m "),
            Some(Rate {
                count: 30,
                period: Duration::from_secs(60)
            })
        );
        assert_eq!(
            Rate::parse("20/s").unwrap().spacing(),
            Duration::from_millis(50)
        );
        assert_eq!(
            Rate::parse("30/m").unwrap().spacing(),
            Duration::from_secs(2)
        );
        for bad in [
            "",
            "20",
            "/s",
            "0/s",
            "-1/s",
            "x/s",
            "20/h",
            "20/sec",
            "1.5/s",
            "20/s/s",
            "9999999/s",
        ] {
            assert_eq!(Rate::parse(bad), None, "{bad:?}");
        }
    }
}

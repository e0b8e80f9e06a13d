//! Time as hookledger reads and writes it: Unix seconds, RFC 3339 text. A leaf: it imports
//! nothing of the crate.

/// Seconds since the Unix epoch.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `2026-11-30 03:15:58` (UTC) for a Unix time.
pub(crate) fn format_time(t: i64) -> String {
    format_rfc3339(t)
        .replacen('T', " ", 1)
        .trim_end_matches('Z')
        .to_string()
}

/// `2026-11-30T07:18:39.123Z` or `...+01:00` → Unix seconds (fractions dropped).
pub(crate) fn parse_rfc3339(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |range| num_in(text, range);
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[13] != b':' || b[16] != b':' || !(1..=12).contains(&month) {
        return None;
    }
    if day < 1 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &fraction[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            if rest.len() != 6 || rest.as_bytes()[3] != b':' {
                return None;
            }
            sign * (num_in(rest, 1..3)? * 3600 + num_in(rest, 4..6)? * 60)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm), proleptic Gregorian.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

/// Unix seconds as `2026-11-30T07:18:39Z` (the inverse of [`parse_rfc3339`], for `send`).
pub(crate) fn format_rfc3339(secs: i64) -> String {
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days (Howard Hinnant's algorithm), proleptic Gregorian.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The days of `month` (1 to 12) of `year`, proleptic Gregorian: February has 29 in a year
/// divisible by 4, except centuries not divisible by 400.
fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn num_in(text: &str, range: std::ops::Range<usize>) -> Option<i64> {
    let part = text.get(range)?;
    part.bytes()
        .all(|c| c.is_ascii_digit())
        .then(|| part.parse().ok())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips() {
        for secs in [0, 951_782_400, 1_721_954_054, 4_102_444_799] {
            assert_eq!(parse_rfc3339(&format_rfc3339(secs)), Some(secs));
        }
        assert_eq!(format_rfc3339(1_721_954_054), "2024-07-26T00:34:14Z");
    }

    #[test]
    fn a_day_the_month_does_not_have_is_refused() {
        assert_eq!(
            parse_rfc3339("2024-02-29T00:00:00Z").map(format_rfc3339),
            Some("2024-02-29T00:00:00Z".into())
        );
        assert_eq!(
            parse_rfc3339("2000-02-29T12:00:00Z").map(format_rfc3339),
            Some("2000-02-29T12:00:00Z".into())
        );
        for date in [
            "2023-02-29T00:00:00Z",
            "2026-02-31T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2026-06-31T00:00:00+02:00",
            "2026-01-00T00:00:00Z",
            "2026-01-32T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(date), None, "{date}");
        }
        assert!(parse_rfc3339("2026-01-31T00:00:00Z").is_some());
        assert!(parse_rfc3339("2026-12-31T23:59:59Z").is_some());
    }
}

//! Wall-clock timestamps as RFC 3339 UTC strings (`2009-02-13T23:31:30Z`,
//! or with milliseconds `2009-02-13T23:31:30.123Z`).
//!
//! The calendar conversion is the proleptic Gregorian "days from civil" inverse:
//! shift the epoch to 0000-03-01 so leap days fall at the end of a 400-year era,
//! then split days into era, year of era, day of year and month.

use std::time::{SystemTime, UNIX_EPOCH};

/// Formats `t` as RFC 3339 UTC with millisecond precision (`YYYY-MM-DDTHH:MM:SS.mmmZ`).
///
/// Times before 1970 are clamped to the epoch (receipts never need them).
pub fn rfc3339_utc(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (date, time) = split_secs(secs);
    format!("{date}T{time}.{:03}Z", d.subsec_millis())
}

/// Formats whole seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339_utc_secs(secs: u64) -> String {
    let (date, time) = split_secs(secs);
    format!("{date}T{time}Z")
}

/// The current time, as [`rfc3339_utc`] formats it.
pub fn now_rfc3339() -> String {
    rfc3339_utc(SystemTime::now())
}

fn split_secs(secs: u64) -> (String, String) {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{:02}:{:02}:{:02}", rem / 3600, rem / 60 % 60, rem % 60),
    )
}

/// (year, month 1..=12, day 1..=31) of `days` after 1970-01-01.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // 719_468 days from 0000-03-01 to 1970-01-01.
    let z = days + 719_468;
    let era = z / 146_097; // 400-year eras of 146 097 days
    let doe = z % 146_097; // day of era, 0..=146 096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // 0..=399
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of March-based year
    let mp = (5 * doy + 2) / 153; // month, March = 0
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn matches_gnu_date() {
        // Expected strings from `date -u -d @SECS +%Y-%m-%dT%H:%M:%SZ`.
        for (secs, want) in [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_234_567_890, "2009-02-13T23:31:30Z"),
            (1_700_000_000, "2023-11-14T22:13:20Z"),
            (4_102_444_799, "2099-12-31T23:59:59Z"),
        ] {
            assert_eq!(rfc3339_utc_secs(secs), want, "secs {secs}");
        }
    }

    #[test]
    fn millis_are_kept() {
        let t = UNIX_EPOCH + Duration::from_millis(1_234_567_890_123);
        assert_eq!(rfc3339_utc(t), "2009-02-13T23:31:30.123Z");
    }
}

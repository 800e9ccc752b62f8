//! Window arithmetic, with the time passed in (Unix milliseconds, UTC).
//!
//! Fixed units align to the Unix epoch, as envoyproxy/ratelimit's keys do.
//! Calendar units align to the UTC calendar: ISO weeks from Monday 00:00,
//! calendar months and calendar years, leap years included.
//!
//! A sliding window of one unit, at time `now` in the window `[start, end)`,
//! is estimated as the current window's count plus the previous window's,
//! weighted by the part of the current window still ahead
//! (`(end - now) / (end - start)`, in millionths: [`sliding_weight_ppm`]).

use crate::model::Unit;

const DAY_MS: u64 = 86_400_000;

/// The window of `unit` that holds `now_ms`: `(start, end)` in Unix
/// milliseconds, `start <= now_ms < end`.
pub fn window_at(unit: Unit, now_ms: u64) -> (u64, u64) {
    let days = now_ms / DAY_MS;
    let (start_day, end_day) = match unit {
        Unit::Week => {
            // 1970-01-01 was a Thursday: Monday is 3 days before it.
            let end = days + 7 - (days + 3) % 7;
            (end.saturating_sub(7), end)
        }
        Unit::Month => {
            let (y, m, _) = civil_from_days(days);
            let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            (days_from_civil(y, m, 1), days_from_civil(ny, nm, 1))
        }
        Unit::Year => {
            let (y, _, _) = civil_from_days(days);
            (days_from_civil(y, 1, 1), days_from_civil(y + 1, 1, 1))
        }
        fixed => {
            let len = fixed.seconds() * 1_000;
            let start = now_ms - now_ms % len;
            return (start, start.saturating_add(len));
        }
    };
    (
        start_day.saturating_mul(DAY_MS),
        end_day.saturating_mul(DAY_MS),
    )
}

/// The window before the one that holds `now_ms`.
pub fn previous_window(unit: Unit, now_ms: u64) -> (u64, u64) {
    let (start, _) = window_at(unit, now_ms);
    match start.checked_sub(1) {
        Some(before) => window_at(unit, before),
        None => (0, 0),
    }
}

/// The previous window's weight in a sliding estimate at `now_ms`, in
/// millionths: the part of the current window `[start, end)` still ahead.
pub fn sliding_weight_ppm(start: u64, end: u64, now_ms: u64) -> u64 {
    let len = end.saturating_sub(start).max(1);
    let ahead = end.saturating_sub(now_ms).min(len);
    // Both below 2^45 for any date before the year 3000: no overflow.
    ahead.saturating_mul(1_000_000) / len
}

/// The sliding estimate: `current + ceil(previous * weight)`, weight in
/// millionths. Rounded up so that the estimate never admits more than the
/// exact weighted count would.
pub fn sliding_estimate(previous: u64, current: u64, weight_ppm: u64) -> u64 {
    let weighted = (u128::from(previous) * u128::from(weight_ppm)).div_ceil(1_000_000);
    current.saturating_add(u64::try_from(weighted).unwrap_or(u64::MAX))
}

/// How long, from `now_ms`, until a sliding window of `limit` admits
/// `hits` more, given the counts of its current window `[start, end)` and
/// of the previous one, when nothing else is admitted meanwhile. 0 when it
/// admits them now; `None` when it never will (`hits > limit`).
pub fn sliding_wait_ms(
    limit: u64,
    hits: u64,
    previous: u64,
    current: u64,
    (start, end): (u64, u64),
    next_end: u64,
    now_ms: u64,
) -> Option<u64> {
    if hits > limit {
        return None;
    }
    let admits_at = |prev: u64, cur: u64, s: u64, e: u64, from: u64| -> Option<u64> {
        // The first t in [from, e] with cur + ceil(prev * (e - t) / (e - s)) + hits <= limit.
        let room = limit.checked_sub(cur.saturating_add(hits))?;
        if prev == 0 {
            return Some(from);
        }
        let len = e.saturating_sub(s).max(1);
        // prev * (e - t) / len <= room  <=>  e - t <= room * len / prev.
        let ahead = u128::from(room) * u128::from(len) / u128::from(prev);
        let ahead = u64::try_from(ahead).unwrap_or(u64::MAX);
        let mut t = e.saturating_sub(ahead).max(from);
        // The ppm rounding can leave the estimate one above: step on until
        // the estimate the counter computes admits.
        while t < e
            && sliding_estimate(prev, cur, sliding_weight_ppm(s, e, t)).saturating_add(hits) > limit
        {
            t = t.saturating_add((len / 1_000_000).max(1));
        }
        Some(t.min(e))
    };
    let at = admits_at(previous, current, start, end, now_ms)
        .or_else(|| admits_at(current, 0, end, next_end, end))?;
    Some(at.saturating_sub(now_ms))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (month 1..=12).
pub fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    // Years start in March, so that the leap day ends a year.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).saturating_sub(719_468)
}

/// The date (year, month 1..=12, day 1..=31) of a day since 1970-01-01.
pub fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(y: u64, m: u64, d: u64, secs: u64) -> u64 {
        days_from_civil(y, m, d) * DAY_MS + secs * 1_000
    }

    #[test]
    fn dates_round_trip_and_the_epoch_is_day_zero() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
    }

    #[test]
    fn months_end_on_their_last_day() {
        // 31 January to 1 February.
        let last = ms(2027, 1, 31, 86_399);
        assert_eq!(
            window_at(Unit::Month, last),
            (ms(2027, 1, 1, 0), ms(2027, 2, 1, 0))
        );
        let first = ms(2027, 2, 1, 0);
        assert_eq!(window_at(Unit::Month, first), (first, ms(2027, 3, 1, 0)));
        // February: 28 days in a common year, 29 in a leap year.
        assert_eq!(
            window_at(Unit::Month, ms(2027, 2, 28, 86_399)).1,
            ms(2027, 3, 1, 0)
        );
        assert_eq!(
            window_at(Unit::Month, ms(2028, 2, 28, 86_399)).1,
            ms(2028, 3, 1, 0)
        );
        assert_eq!(
            window_at(Unit::Month, ms(2028, 2, 29, 0)),
            (ms(2028, 2, 1, 0), ms(2028, 3, 1, 0))
        );
        assert_eq!(ms(2028, 3, 1, 0) - ms(2028, 2, 1, 0), 29 * DAY_MS);
        assert_eq!(ms(2027, 3, 1, 0) - ms(2027, 2, 1, 0), 28 * DAY_MS);
        // 2100 is not a leap year, 2000 was.
        assert_eq!(ms(2100, 3, 1, 0) - ms(2100, 2, 1, 0), 28 * DAY_MS);
        assert_eq!(ms(2000, 3, 1, 0) - ms(2000, 2, 1, 0), 29 * DAY_MS);
    }

    #[test]
    fn years_turn_on_the_first_of_january() {
        let eve = ms(2026, 12, 31, 86_399) + 999;
        assert_eq!(
            window_at(Unit::Year, eve),
            (ms(2026, 1, 1, 0), ms(2027, 1, 1, 0))
        );
        assert_eq!(
            window_at(Unit::Year, eve + 1),
            (ms(2027, 1, 1, 0), ms(2028, 1, 1, 0))
        );
        assert_eq!(window_at(Unit::Month, eve).1, eve + 1);
        assert_eq!(ms(2029, 1, 1, 0) - ms(2028, 1, 1, 0), 366 * DAY_MS);
    }

    #[test]
    fn weeks_run_from_monday_to_sunday() {
        // 2026-12-06 is a Sunday, 2026-12-07 a Monday.
        let sunday = ms(2026, 12, 6, 86_399);
        assert_eq!(
            window_at(Unit::Week, sunday),
            (ms(2026, 11, 30, 0), ms(2026, 12, 7, 0))
        );
        let monday = ms(2026, 12, 7, 0);
        assert_eq!(window_at(Unit::Week, monday), (monday, ms(2026, 12, 14, 0)));
        // A week across a year's end: Monday 2026-12-28 to Monday 2027-01-04.
        assert_eq!(
            window_at(Unit::Week, ms(2027, 1, 1, 0)),
            (ms(2026, 12, 28, 0), ms(2027, 1, 4, 0))
        );
        // The epoch's week began on Monday 1969-12-29: clamped to 0.
        assert_eq!(window_at(Unit::Week, 0).1, ms(1970, 1, 5, 0));
    }

    #[test]
    fn fixed_units_align_to_the_epoch() {
        assert_eq!(window_at(Unit::Minute, 125_000), (120_000, 180_000));
        assert_eq!(window_at(Unit::Second, 999), (0, 1_000));
        assert_eq!(window_at(Unit::Day, DAY_MS), (DAY_MS, 2 * DAY_MS));
        assert_eq!(previous_window(Unit::Minute, 125_000), (60_000, 120_000));
        assert_eq!(
            previous_window(Unit::Month, ms(2027, 3, 5, 0)),
            (ms(2027, 2, 1, 0), ms(2027, 3, 1, 0))
        );
    }

    #[test]
    fn custom_windows_align_to_multiples_of_their_length() {
        let five = Unit::Custom(300);
        // 2026-12-05 13:04:59.999 is in the window from 13:00 to 13:05.
        let t = ms(2026, 12, 5, 13 * 3_600 + 4 * 60 + 59) + 999;
        let start = ms(2026, 12, 5, 13 * 3_600);
        assert_eq!(window_at(five, t), (start, start + 300_000));
        assert_eq!(window_at(five, t + 1), (start + 300_000, start + 600_000));
        assert_eq!(previous_window(five, t), (start - 300_000, start));
        // 90 days from the epoch, not from a calendar date.
        let ninety = Unit::Custom(90 * 86_400);
        assert_eq!(window_at(ninety, 91 * DAY_MS), (90 * DAY_MS, 180 * DAY_MS));
        // A custom 31 days is no month.
        let (s, e) = window_at(Unit::Custom(31 * 86_400), ms(2027, 3, 5, 0));
        assert_eq!(e - s, 31 * DAY_MS);
        assert_eq!(s % (31 * DAY_MS), 0);
        assert_ne!(s, ms(2027, 3, 1, 0));
    }

    #[test]
    fn the_sliding_estimate_weights_the_previous_window() {
        // 15 s into a minute: three quarters of the previous one still count.
        let w = sliding_weight_ppm(60_000, 120_000, 75_000);
        assert_eq!(w, 750_000);
        assert_eq!(sliding_estimate(100, 10, w), 85);
        assert_eq!(sliding_estimate(1, 0, 1), 1, "rounded up");
        assert_eq!(sliding_estimate(0, 7, 1_000_000), 7);
        assert_eq!(sliding_estimate(u64::MAX, u64::MAX, 1_000_000), u64::MAX);
    }

    #[test]
    fn the_wait_is_until_the_estimate_admits_one_more() {
        let win = (60_000, 120_000);
        // Previous 100, current 0, limit 100: one more at 0.6 s to the end.
        let wait = sliding_wait_ms(100, 1, 100, 0, win, 180_000, 60_000).unwrap();
        let at = 60_000 + wait;
        assert!(sliding_estimate(100, 0, sliding_weight_ppm(60_000, 120_000, at)) < 100);
        assert!(sliding_estimate(100, 0, sliding_weight_ppm(60_000, 120_000, at - 1)) >= 100);
        // Room now: no wait.
        assert_eq!(
            sliding_wait_ms(100, 1, 10, 10, win, 180_000, 61_000),
            Some(0)
        );
        // The current window is full: into the next one.
        let wait = sliding_wait_ms(10, 1, 0, 10, win, 180_000, 119_000).unwrap();
        assert!(wait > 1_000, "{wait}");
        assert_eq!(sliding_wait_ms(10, 11, 0, 0, win, 180_000, 61_000), None);
    }

    proptest::proptest! {
        #[test]
        fn every_instant_is_in_its_window(now in 0u64..32_503_680_000_000, u in 0usize..8, custom in 1u32..crate::model::MAX_CUSTOM_SECONDS) {
            let unit = Unit::ALL.get(u).copied().unwrap_or(Unit::Custom(custom));
            let (s, e) = window_at(unit, now);
            proptest::prop_assert!(s <= now && now < e);
            proptest::prop_assert!(e - s <= unit.seconds() * 1_000);
            // The next window starts where this one ends.
            proptest::prop_assert_eq!(window_at(unit, e).0, e);
            proptest::prop_assert_eq!(window_at(unit, s), (s, e));
            if unit.is_calendar() {
                let (y, m, d) = civil_from_days(s / DAY_MS);
                match unit {
                    Unit::Week => proptest::prop_assert_eq!((s / DAY_MS + 3) % 7, 0),
                    Unit::Month => proptest::prop_assert_eq!(d, 1),
                    _ => proptest::prop_assert_eq!((m, d), (1, 1)),
                }
                proptest::prop_assert_eq!(days_from_civil(y, m, d), s / DAY_MS);
            }
        }

        #[test]
        fn after_the_wait_the_estimate_admits(
            limit in 1u64..1_000, prev in 0u64..2_000, cur in 0u64..1_000, at in 0u64..60_000,
        ) {
            let win = (60_000, 120_000);
            let now = 60_000 + at;
            if let Some(wait) = sliding_wait_ms(limit, 1, prev, cur, win, 180_000, now) {
                let t = now + wait;
                let (p, c, (s, e)) = if t >= 120_000 { (cur, 0, (120_000, 180_000)) } else { (prev, cur, win) };
                proptest::prop_assert!(sliding_estimate(p, c, sliding_weight_ppm(s, e, t)) < limit);
            }
        }
    }
}

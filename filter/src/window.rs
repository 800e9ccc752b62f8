//! Window arithmetic. The service counts in windows aligned to the clock,
//! and so does everything the filter keeps per window: a lease's tokens, a
//! sync view, a cached refusal, the local fallback's counts. A window of a
//! fixed length `W` ms ends at a multiple of `W` since the epoch; weeks,
//! months and years follow the UTC calendar (ISO weeks from Monday 00:00,
//! calendar months and years, leap years included), as the counter counts
//! them: `ratelimit_config::window::window_at`, the counter's own code.

use ratelimit_config::window::window_at;
use ratelimit_config::{Group, Unit};

/// The most units a group limits in the filter: the plugin configuration
/// refuses a group of more (`FILTER_MAX_UNITS`).
pub const UNITS: usize = ratelimit_config::plugin::FILTER_MAX_UNITS;

/// The window of `unit`, in ms: its `Unit::seconds()` (a custom window's
/// length too), for a calendar unit its longest (7, 31, 366 days) and one
/// ms more: a length no fixed window has (those are whole seconds), by
/// which `same` and `end` know to follow the calendar, and a custom
/// `per31days` is not taken for a month.
pub fn of_unit(unit: Unit) -> u64 {
    let ms = unit.seconds().saturating_mul(1_000);
    if unit.is_calendar() {
        ms.saturating_add(1)
    } else {
        ms
    }
}

/// The window (ms) and the limit of each unit `group` limits, shortest
/// first, and how many there are.
pub fn of_group(group: &Group) -> ([(u64, u32); UNITS], usize) {
    let mut windows = [(1_000, 0); UNITS];
    let mut units = 0;
    for ((unit, limit), w) in group.limits.iter().zip(windows.iter_mut()) {
        *w = (of_unit(unit), limit);
        units += 1;
    }
    (windows, units)
}

/// The window of `window_ms` that holds `now_ms`, `(start, end)`: the
/// calendar's for the length of a week, a month or a year
/// (`of_unit`), else from a multiple of `window_ms` (a window of 0
/// counts as 1 ms).
fn bounds(window_ms: u64, now_ms: u64) -> (u64, u64) {
    let calendar = [Unit::Week, Unit::Month, Unit::Year]
        .into_iter()
        .find(|u| of_unit(*u) == window_ms);
    match calendar {
        Some(unit) => window_at(unit, now_ms),
        None => {
            let w = window_ms.max(1);
            let start = now_ms - now_ms % w;
            (start, start.saturating_add(w))
        }
    }
}

/// Whether `a_ms` and `b_ms` fall in the same window of `window_ms`.
#[inline(never)]
pub fn same(window_ms: u64, a_ms: u64, b_ms: u64) -> bool {
    bounds(window_ms, a_ms).0 == bounds(window_ms, b_ms).0
}

/// The end of the window of `window_ms` holding `now_ms` (a week's on
/// Monday 00:00 UTC, a month's on the 1st of the next, a year's on 1
/// January).
#[inline(never)]
pub fn end(window_ms: u64, now_ms: u64) -> u64 {
    bounds(window_ms, now_ms).1
}

fn floor_second(ms: u64) -> u64 {
    ms - ms % 1_000
}

/// When a window the service reported on ends, as an absolute time. The
/// service reports whole seconds until the end, from its own clock, which
/// read a second `s` between the call's dispatch (`asked_at_ms`) and its
/// answer (`answered_at_ms`): the end is `s + duration`. Of those
/// candidates, the one where a window of `window_ms` ends (see `end`: on the
/// calendar for weeks, months and years) is the end; a server whose windows
/// are not aligned (none is) gets the earliest, `floor(asked_at) +
/// duration`, which is never late.
pub fn reported_end(
    asked_at_ms: u64,
    answered_at_ms: u64,
    duration_ms: u64,
    window_ms: u64,
) -> u64 {
    let earliest = floor_second(asked_at_ms).saturating_add(duration_ms);
    let latest = floor_second(answered_at_ms.max(asked_at_ms)).saturating_add(duration_ms);
    if window_ms <= 1_000 || duration_ms % 1_000 != 0 {
        return earliest;
    }
    // The first window end at or after `earliest`.
    let aligned = end(window_ms, earliest.saturating_sub(1));
    if aligned <= latest {
        aligned
    } else {
        earliest
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_window_ends_at_the_next_multiple_of_its_length() {
        assert_eq!(end(60_000, 1_700_000_000_250), 1_700_000_040_000);
        assert_eq!(end(60_000, 1_700_000_040_000), 1_700_000_100_000);
        assert_eq!(end(1_000, 999), 1_000);
        assert_eq!(end(0, 5), 6);
        assert_eq!(end(60_000, u64::MAX), u64::MAX);
    }

    const DAY: u64 = 86_400_000;
    const WEEK: u64 = 7 * DAY + 1;
    const MONTH: u64 = 31 * DAY + 1;
    const YEAR: u64 = 366 * DAY + 1;

    /// Unix ms of `y-m-d` UTC at `hour`.
    fn at(y: u64, m: u64, d: u64, hour: u64) -> u64 {
        ratelimit_config::window::days_from_civil(y, m, d) * DAY + hour * 3_600_000
    }

    #[test]
    fn calendar_units_have_lengths_no_fixed_unit_has() {
        assert_eq!(of_unit(Unit::Week), WEEK);
        assert_eq!(of_unit(Unit::Month), MONTH);
        assert_eq!(of_unit(Unit::Year), YEAR);
        for u in Unit::ALL {
            let alike = Unit::ALL.iter().filter(|v| of_unit(**v) == of_unit(u));
            assert_eq!(alike.count(), 1, "{u:?}");
        }
        // A custom window of a calendar unit's longest is no calendar unit.
        for days in [7, 31, 366] {
            let custom = of_unit(Unit::Custom(days * 86_400));
            assert_eq!(custom, u64::from(days) * DAY);
            assert!(![WEEK, MONTH, YEAR].contains(&custom));
        }
    }

    #[test]
    fn custom_windows_end_at_multiples_of_their_length() {
        // 5 minutes: 13:04:59.999 ends at 13:05, 13:05 at 13:10.
        let five = of_unit(Unit::Custom(300));
        let t = at(2026, 12, 5, 13) + 4 * 60_000 + 59_999;
        assert_eq!(end(five, t), at(2026, 12, 5, 13) + 300_000);
        assert_eq!(end(five, t + 1), at(2026, 12, 5, 13) + 600_000);
        assert!(same(five, t - 299_999, t) && !same(five, t, t + 1));
        // A custom 31 days ends 31 days from a multiple of 31 days, not on
        // the 1st; a month on the 1st.
        let d31 = of_unit(Unit::Custom(31 * 86_400));
        let now = at(2026, 12, 5, 13);
        assert_eq!(end(d31, now) % (31 * DAY), 0);
        assert_eq!(end(MONTH, now), at(2027, 1, 1, 0));
        assert_ne!(end(d31, now), at(2027, 1, 1, 0));
    }

    #[test]
    fn a_week_ends_on_monday_utc() {
        // Sunday 6 December 2026 23:00 UTC; the week ends on Monday the 7th.
        let sunday = at(2026, 12, 6, 23);
        let monday = at(2026, 12, 7, 0);
        assert_eq!(end(WEEK, sunday), monday);
        assert_eq!(end(WEEK, monday), monday + 7 * DAY);
        assert!(!same(WEEK, sunday, monday));
        assert!(same(WEEK, monday, monday + 7 * DAY - 1));
        // Across a year's end: Monday 28 December 2026 to Monday 4 January.
        assert_eq!(end(WEEK, at(2026, 12, 31, 12)), at(2027, 1, 4, 0));
        // 1970-01-01, a Thursday: its week ended on Monday 5 January.
        assert_eq!(end(WEEK, 0), 4 * DAY);
    }

    #[test]
    fn a_month_ends_on_the_first_of_the_next() {
        // 31 January to 1 February.
        let jan31 = at(2027, 1, 31, 23) + 3_599_999;
        let feb1 = at(2027, 2, 1, 0);
        assert_eq!(end(MONTH, jan31), feb1);
        assert!(!same(MONTH, jan31, feb1));
        assert!(same(MONTH, at(2027, 1, 1, 0), jan31));
        // 28 February to 1 March, 2027 (no leap day).
        let feb28 = at(2027, 2, 28, 12);
        assert_eq!(end(MONTH, feb1), at(2027, 3, 1, 0));
        assert_eq!(end(MONTH, feb28), at(2027, 3, 1, 0));
        assert!(same(MONTH, feb1, feb28));
        assert!(!same(MONTH, feb28, at(2027, 3, 1, 0)));
        // 2028, a leap year: 28 and 29 February are one month, 1 March the next.
        let (feb28, feb29, mar1) = (at(2028, 2, 28, 23), at(2028, 2, 29, 0), at(2028, 3, 1, 0));
        assert!(same(MONTH, feb28, feb29));
        assert_eq!(end(MONTH, feb28), mar1);
        assert_eq!(end(MONTH, feb29), mar1);
        assert!(!same(MONTH, feb29, mar1));
        assert!(same(MONTH, feb29, mar1 - 1));
        // The days themselves: 28 to 29 February, 29 February to 1 March.
        assert_eq!(end(DAY, feb28), feb29);
        assert_eq!(end(DAY, feb29), mar1);
        // From mid-month: 15 April ends on 1 May (30 days), 15 May on 1 June.
        assert_eq!(end(MONTH, at(2027, 4, 15, 13)), at(2027, 5, 1, 0));
        assert_eq!(end(MONTH, at(2027, 5, 15, 13)), at(2027, 6, 1, 0));
        // 31 December to 1 January.
        let dec31 = at(2027, 12, 31, 23);
        assert_eq!(end(MONTH, dec31), at(2028, 1, 1, 0));
        assert!(!same(MONTH, dec31, at(2028, 1, 1, 0)));
    }

    #[test]
    fn a_year_ends_on_the_first_of_january() {
        let (dec31, jan1) = (at(2027, 12, 31, 23), at(2028, 1, 1, 0));
        assert_eq!(end(YEAR, dec31), jan1);
        assert!(!same(YEAR, dec31, jan1));
        assert!(same(YEAR, at(2027, 1, 1, 0), dec31));
        // 2028 has 366 days; 2027 had 365.
        assert_eq!(end(YEAR, jan1) - jan1, 366 * DAY);
        assert_eq!(end(YEAR, at(2027, 6, 1, 0)) - at(2027, 1, 1, 0), 365 * DAY);
        assert!(same(YEAR, at(2028, 2, 28, 0), at(2028, 12, 31, 23)));
        assert_eq!(end(YEAR, u64::MAX), u64::MAX);
    }

    #[test]
    fn the_reported_end_is_the_aligned_candidate_or_the_earliest() {
        // Asked at 100.7 s, answered at 101.2 s: the service read 100 or 101.
        // "19 s" of a minute: only 101 + 19 = 120 is a multiple of 60.
        assert_eq!(reported_end(100_700, 101_200, 19_000, 60_000), 120_000);
        // "20 s": 100 + 20 = 120.
        assert_eq!(reported_end(100_700, 101_200, 20_000, 60_000), 120_000);
        // No aligned candidate (a server with windows of its own): the
        // earliest, never late.
        assert_eq!(reported_end(100_700, 101_200, 7_000, 60_000), 107_000);
        // Seconds, and sub-second durations: the earliest.
        assert_eq!(reported_end(100_700, 101_200, 1_000, 1_000), 101_000);
        assert_eq!(reported_end(100_700, 101_200, 19_500, 60_000), 119_500);
        // An answer read before the dispatch time (a clock step back).
        assert_eq!(reported_end(100_700, 90_000, 20_000, 60_000), 120_000);
        assert_eq!(reported_end(u64::MAX, u64::MAX, u64::MAX, 60_000), u64::MAX);
    }

    #[test]
    fn the_reported_end_of_a_calendar_window_is_on_the_calendar() {
        // A month: asked at 15 January 2027 10:00:00.700, answered at
        // 10:00:01.200; the service says how long to 1 February 00:00.
        let asked = at(2027, 1, 15, 10) + 700;
        let feb1 = at(2027, 2, 1, 0);
        for read_at in [at(2027, 1, 15, 10), at(2027, 1, 15, 10) + 1_000] {
            let duration = feb1 - read_at;
            assert_eq!(reported_end(asked, asked + 500, duration, MONTH), feb1);
        }
        // Not a month's end: the earliest.
        let early = at(2027, 1, 15, 10) + 5_000;
        assert_eq!(reported_end(asked, asked + 500, 5_000, MONTH), early);
        // A week ends on Monday: asked on Sunday 6 December 2026 at 23:00.
        let sunday = at(2026, 12, 6, 23);
        let monday = at(2026, 12, 7, 0);
        assert_eq!(
            reported_end(sunday + 700, sunday + 1_200, 3_599_000, WEEK),
            monday
        );
        // A year: from 31 December 2027 23:00 to 1 January 2028.
        let dec31 = at(2027, 12, 31, 23);
        assert_eq!(
            reported_end(dec31, dec31 + 400, 3_600_000, YEAR),
            at(2028, 1, 1, 0)
        );
    }
}

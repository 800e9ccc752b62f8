//! Window arithmetic. The service counts in windows aligned to the clock (a
//! window of `W` ms ends at a multiple of `W`), and so does everything the
//! filter keeps per window: a lease's tokens, a sync view, a cached refusal.

use ratelimit_config::Group;

/// The most units a group limits in the filter: the plugin configuration
/// refuses a group of more (`FILTER_MAX_UNITS`).
pub const UNITS: usize = ratelimit_config::plugin::FILTER_MAX_UNITS;

/// The window (ms) and the limit of each unit `group` limits, shortest
/// first, and how many there are.
pub fn of_group(group: &Group) -> ([(u64, u32); UNITS], usize) {
    let mut windows = [(1_000, 0); UNITS];
    let mut units = 0;
    for ((unit, limit), w) in group.limits.iter().zip(windows.iter_mut()) {
        *w = (unit.seconds().saturating_mul(1_000), limit);
        units += 1;
    }
    (windows, units)
}

/// A week's window (`Unit::Week.seconds()`), and how far before a multiple
/// of it an ISO week starts: 1970-01-01 was a Thursday, so weeks start on
/// Mondays, 4 days after a multiple of 7 days since the epoch (3 days before
/// the next one). Weeks follow the UTC calendar; months and years (of
/// varying length) are still windows of `Unit::seconds()` from the epoch.
const WEEK_MS: u64 = 604_800_000;
const MONDAY_SHIFT_MS: u64 = 3 * 86_400_000;

/// `now_ms` moved so that a window of `w` starts at a multiple of it.
fn shifted(w: u64, now_ms: u64) -> u64 {
    if w == WEEK_MS {
        now_ms.saturating_add(MONDAY_SHIFT_MS)
    } else {
        now_ms
    }
}

/// Whether `a_ms` and `b_ms` fall in the same window of `window_ms`.
#[inline(never)]
pub fn same(window_ms: u64, a_ms: u64, b_ms: u64) -> bool {
    let w = window_ms.max(1);
    shifted(w, a_ms) / w == shifted(w, b_ms) / w
}

/// The end of the window of `window_ms` holding `now_ms` (a window of 0
/// counts as 1 ms; a week's on Monday 00:00 UTC).
#[inline(never)]
pub fn end(window_ms: u64, now_ms: u64) -> u64 {
    let w = window_ms.max(1);
    let end = (shifted(w, now_ms) / w).saturating_add(1).saturating_mul(w);
    if w == WEEK_MS {
        end.saturating_sub(MONDAY_SHIFT_MS)
    } else {
        end
    }
}

fn floor_second(ms: u64) -> u64 {
    ms - ms % 1_000
}

/// When a window the service reported on ends, as an absolute time. The
/// service reports whole seconds until the end, from its own clock, which
/// read a second `s` between the call's dispatch (`asked_at_ms`) and its
/// answer (`answered_at_ms`): the end is `s + duration`. Of those
/// candidates, the one that is a multiple of the window is the end; a
/// server whose windows are not aligned (none is) gets the earliest,
/// `floor(asked_at) + duration`, which is never late.
pub fn reported_end(asked_at_ms: u64, answered_at_ms: u64, duration_ms: u64, window_s: u64) -> u64 {
    let earliest = floor_second(asked_at_ms).saturating_add(duration_ms);
    let latest = floor_second(answered_at_ms.max(asked_at_ms)).saturating_add(duration_ms);
    let window_ms = window_s.saturating_mul(1_000);
    if window_ms <= 1_000 || duration_ms % 1_000 != 0 {
        return earliest;
    }
    let aligned = earliest.div_ceil(window_ms).saturating_mul(window_ms);
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

    #[test]
    fn a_week_ends_on_monday_utc() {
        let day = 86_400_000;
        // Sunday 6 December 2026 23:00 UTC; the week ends on Monday the 7th.
        let sunday = 20_793 * day + 23 * 3_600_000;
        let monday = 20_794 * day;
        assert_eq!(end(WEEK_MS, sunday), monday);
        assert_eq!(end(WEEK_MS, monday), monday + 7 * day);
        assert!(!same(WEEK_MS, sunday, monday));
        assert!(same(WEEK_MS, monday, monday + 7 * day - 1));
        // 1970-01-01, a Thursday: its week ended on Monday 5 January.
        assert_eq!(end(WEEK_MS, 0), 4 * day);
        assert_eq!(WEEK_MS, ratelimit_config::Unit::Week.seconds() * 1_000);
    }

    #[test]
    fn the_reported_end_is_the_aligned_candidate_or_the_earliest() {
        // Asked at 100.7 s, answered at 101.2 s: the service read 100 or 101.
        // "19 s" of a minute: only 101 + 19 = 120 is a multiple of 60.
        assert_eq!(reported_end(100_700, 101_200, 19_000, 60), 120_000);
        // "20 s": 100 + 20 = 120.
        assert_eq!(reported_end(100_700, 101_200, 20_000, 60), 120_000);
        // No aligned candidate (a server with windows of its own): the
        // earliest, never late.
        assert_eq!(reported_end(100_700, 101_200, 7_000, 60), 107_000);
        // Seconds, and sub-second durations: the earliest.
        assert_eq!(reported_end(100_700, 101_200, 1_000, 1), 101_000);
        assert_eq!(reported_end(100_700, 101_200, 19_500, 60), 119_500);
        // An answer read before the dispatch time (a clock step back).
        assert_eq!(reported_end(100_700, 90_000, 20_000, 60), 120_000);
        assert_eq!(reported_end(u64::MAX, u64::MAX, u64::MAX, 60), u64::MAX);
    }
}

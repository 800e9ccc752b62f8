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

/// Whether `a_ms` and `b_ms` fall in the same window of `window_ms`.
pub fn same(window_ms: u64, a_ms: u64, b_ms: u64) -> bool {
    let w = window_ms.max(1);
    a_ms / w == b_ms / w
}

/// The end of the window of `window_ms` holding `now_ms` (a window of 0
/// counts as 1 ms).
pub fn end(window_ms: u64, now_ms: u64) -> u64 {
    let w = window_ms.max(1);
    (now_ms / w).saturating_add(1).saturating_mul(w)
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

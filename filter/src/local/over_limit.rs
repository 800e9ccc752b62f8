//! The over-limit cache: what the service said when it refused a tenant,
//! kept in the tenant's slot until every window it was over has reset, and
//! the headers of a refusal answered from it.

use ratelimit_config::HeaderMode;

use crate::headers::{limit_headers, RETRY_AFTER};
use crate::proto::{Code, DescriptorStatus, Duration, RateLimit, RateLimitUnit};
use crate::window;

/// What the service said about one descriptor, kept to answer from the cache.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StatusSnapshot {
    pub requests_per_unit: u32,
    /// `RateLimitUnit` as its protobuf number.
    pub unit: i32,
    pub remaining: u32,
    pub over_limit: bool,
    /// When this descriptor's window resets.
    pub reset_at_ms: u64,
    /// The id of the rule's name in `names` (0: none, or not kept).
    pub name: u8,
}

/// The statuses a cached refusal keeps: the first four of its answer (a
/// refusal by a later window is not cached: the next request asks again).
/// Four keep a slot at 180 bytes.
pub const MAX_STATUSES: usize = 4;

/// A tenant the service has refused, until `until_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct OverLimit {
    pub until_ms: u64,
    pub statuses: Vec<StatusSnapshot>,
}

fn duration_ms(d: Option<&Duration>) -> u64 {
    d.map(|d| {
        let s = u64::try_from(d.seconds).unwrap_or(0);
        let n = u64::try_from(d.nanos).unwrap_or(0);
        s.saturating_mul(1_000).saturating_add(n / 1_000_000)
    })
    .unwrap_or(0)
}

/// What the cache keeps of the service's refusal, for a call sent at
/// `asked_at_ms` and answered at `answered_at_ms`; `names[i]` is the id of
/// status `i`'s rule name in `names` (missing: none). Each window's end is
/// `window::reported_end`: exact for the service's clock-aligned windows,
/// else at most a second early (costing one more call), never late. It
/// refuses until every over-limit window has reset, because until then the
/// service would refuse too. None when no over-limit window is left to wait
/// for.
pub fn refusal(
    asked_at_ms: u64,
    answered_at_ms: u64,
    statuses: &[DescriptorStatus],
    names: &[u8],
) -> Option<OverLimit> {
    let snapshots: Vec<StatusSnapshot> = statuses
        .iter()
        .take(MAX_STATUSES)
        .enumerate()
        .map(|(i, s)| {
            let limit = s.current_limit.as_ref();
            let unit = limit.map_or(0, |l| l.unit);
            StatusSnapshot {
                requests_per_unit: limit.map_or(0, |l| l.requests_per_unit),
                unit,
                remaining: s.limit_remaining,
                over_limit: s.code() == Code::OverLimit,
                reset_at_ms: window::reported_end(
                    asked_at_ms,
                    answered_at_ms,
                    duration_ms(s.duration_until_reset.as_ref()),
                    window_ms(unit),
                ),
                name: names.get(i).copied().unwrap_or(0),
            }
        })
        .collect();
    let until_ms = snapshots
        .iter()
        .filter(|s| s.over_limit)
        .map(|s| s.reset_at_ms)
        .max()?;
    let now_ms = answered_at_ms.max(asked_at_ms);
    if until_ms <= now_ms {
        return None;
    }
    Some(OverLimit {
        until_ms,
        statuses: snapshots,
    })
}

/// The headers of a refusal from the cache: the X-RateLimit-* headers the
/// service's answer gave, as they stand now (a window that has reset since
/// counts as full again, and its reset moves to the next window end), and
/// Retry-After counting down to the end of the cached refusal.
pub fn cached_headers(o: &OverLimit, now_ms: u64, mode: HeaderMode) -> Vec<(&'static str, String)> {
    cached_headers_named(o, now_ms, mode, &|_| None)
}

/// `cached_headers`, with the rule names the statuses refer to (`name`
/// reads one from `names`; only called for a status that has one).
pub fn cached_headers_named(
    o: &OverLimit,
    now_ms: u64,
    mode: HeaderMode,
    name: &dyn Fn(u8) -> Option<String>,
) -> Vec<(&'static str, String)> {
    let mut headers = if mode == HeaderMode::Off {
        Vec::with_capacity(1)
    } else {
        // A slot holds at most MAX_STATUSES; built on the stack.
        let mut now_statuses: [DescriptorStatus; MAX_STATUSES] = Default::default();
        let mut n = 0;
        for (to, s) in now_statuses.iter_mut().zip(&o.statuses) {
            *to = status_at(s, now_ms);
            if s.name != 0 && mode == HeaderMode::DraftVersion03 {
                if let (Some(limit), Some(n)) = (to.current_limit.as_mut(), name(s.name)) {
                    limit.name = n;
                }
            }
            n += 1;
        }
        limit_headers(mode, now_statuses.get(..n).unwrap_or_default())
    };
    let retry_ms = o.until_ms.saturating_sub(now_ms);
    headers.push((RETRY_AFTER, retry_ms.div_ceil(1_000).max(1).to_string()));
    headers
}

/// The window (ms, `window::of_unit`) of a `RateLimitUnit` as its protobuf
/// number; 0 for an unknown one.
fn window_ms(unit: i32) -> u64 {
    RateLimitUnit::try_from(unit)
        .ok()
        .and_then(RateLimitUnit::unit)
        .map_or(0, window::of_unit)
}

fn status_at(s: &StatusSnapshot, now_ms: u64) -> DescriptorStatus {
    let window_ms = window_ms(s.unit);
    // A window that has reset counts as full again, until the end of the
    // window holding `now_ms` (on the calendar for weeks, months, years).
    let (remaining, reset_at) = if now_ms < s.reset_at_ms || window_ms == 0 {
        (s.remaining, s.reset_at_ms)
    } else {
        (s.requests_per_unit, window::end(window_ms, now_ms))
    };
    // Whole seconds, rounded up, as the service reports them: the service
    // reads its clock in whole seconds, so at 100.7 s it says 20 s to a
    // window ending at 120 s. Never 0 while the window lasts.
    let left_s = reset_at.saturating_sub(now_ms).div_ceil(1_000);
    DescriptorStatus {
        code: if s.over_limit && now_ms < s.reset_at_ms {
            Code::OverLimit as i32
        } else {
            Code::Ok as i32
        },
        current_limit: Some(RateLimit {
            requests_per_unit: s.requests_per_unit,
            unit: s.unit,
            ..RateLimit::default()
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(Duration {
            seconds: i64::try_from(left_s).unwrap_or(i64::MAX),
            nanos: 0,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::names::{intern, lookup, MAX_KEPT_NAME};
    use crate::local::placement::SlotRef;
    use crate::local::slot::Slot;
    use crate::local::{admit, remember_over_limit, remember_refusal, LocalVerdict};
    use crate::testing::status;
    use crate::testing::MemHost;
    use ratelimit_config::BucketParams;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const AT: SlotRef = SlotRef {
        index: 0,
        fingerprint: 42,
    };

    #[test]
    fn the_cache_refuses_until_every_over_limit_window_has_reset() {
        // Asked at 100.7 s: over the minute (resets in 20 s) and the second.
        let statuses = [
            status(Code::OverLimit, 5, RateLimitUnit::Second, 0, 1),
            status(Code::OverLimit, 20, RateLimitUnit::Minute, 0, 20),
            status(Code::Ok, 30, RateLimitUnit::Hour, 9, 3_500),
        ];
        let slot = remember_over_limit(None, AT, 100_700, &statuses).unwrap();
        let o = slot.over_limit.clone().unwrap();
        assert_eq!(o.until_ms, 120_000);
        let stored = slot.encode();
        let mode = HeaderMode::DraftVersion03;
        let (v, write) = admit(Some(&stored), AT, 100_800, None, mode);
        assert_eq!(write, None);
        assert_eq!(
            v,
            LocalVerdict::CachedOverLimit(vec![
                (
                    "x-ratelimit-limit",
                    "5, 5;w=1, 20;w=60, 30;w=3600".to_string()
                ),
                ("x-ratelimit-remaining", "0".to_string()),
                ("x-ratelimit-reset", "1".to_string()),
                ("retry-after", "20".to_string()),
            ])
        );
        // After the second has reset, the minute is the tightest.
        let (v, _) = admit(Some(&stored), AT, 110_500, None, mode);
        assert_eq!(
            v,
            LocalVerdict::CachedOverLimit(vec![
                (
                    "x-ratelimit-limit",
                    "20, 5;w=1, 20;w=60, 30;w=3600".to_string()
                ),
                ("x-ratelimit-remaining", "0".to_string()),
                ("x-ratelimit-reset", "10".to_string()),
                ("retry-after", "10".to_string()),
            ])
        );
        // At the end of the minute the tenant is asked about again.
        let (v, write) = admit(Some(&stored), AT, 120_000, None, mode);
        assert_eq!(v, LocalVerdict::Proceed);
        assert_eq!(write.unwrap().over_limit, None);
        // Headers off: only Retry-After.
        let (v, _) = admit(Some(&stored), AT, 119_001, None, HeaderMode::Off);
        assert_eq!(
            v,
            LocalVerdict::CachedOverLimit(vec![("retry-after", "1".to_string())])
        );
    }

    #[test]
    fn the_cache_never_outlives_the_window_even_across_a_boundary() {
        // The call went out at 9.999 s; the service read its clock at 10.001
        // s and said "resets in 1 s" (at 11 s). The cache ends at 10 s: a
        // second early (one more call), never late.
        let statuses = [status(Code::OverLimit, 5, RateLimitUnit::Second, 0, 1)];
        let o = remember_over_limit(None, AT, 9_999, &statuses)
            .unwrap()
            .over_limit
            .unwrap();
        assert_eq!(o.until_ms, 10_000);
        // An answer that is already over by the time it is read caches nothing.
        assert_eq!(
            remember_over_limit(
                None,
                AT,
                9_999,
                &[status(Code::OverLimit, 5, RateLimitUnit::Second, 0, 0)]
            ),
            None
        );
        // No over-limit status: nothing to remember.
        assert_eq!(
            remember_over_limit(
                None,
                AT,
                0,
                &[status(Code::Ok, 5, RateLimitUnit::Second, 1, 1)]
            ),
            None
        );
    }

    #[test]
    fn a_cached_refusal_reports_the_reset_the_service_would() {
        // The service counts at 100 s (call out at 100.9, answer at 101.1):
        // 20 s to the end of the minute. A cache entry that counted from
        // the dispatch second and truncated said 18 at 101.5; the service
        // then says 19 (120 - 101).
        let statuses = [status(Code::OverLimit, 20, RateLimitUnit::Minute, 0, 20)];
        let slot = remember_refusal(None, AT, 100_900, 101_100, &statuses, &[]).unwrap();
        let o = slot.over_limit.unwrap();
        assert_eq!(o.until_ms, 120_000);
        for (now, service_says) in [(101_500, 19), (110_000, 10), (119_001, 1), (119_999, 1)] {
            let h = cached_headers(&o, now, HeaderMode::DraftVersion03);
            assert_eq!(
                h[2],
                ("x-ratelimit-reset", service_says.to_string()),
                "at {now}"
            );
            assert_eq!(h[3], ("retry-after", service_says.to_string()), "at {now}");
        }
    }

    #[test]
    fn a_cached_monthly_refusal_lasts_until_the_first_of_the_next_month() {
        let day = 86_400_000;
        let at = |y, m, d| ratelimit_config::window::days_from_civil(y, m, d) * day;
        // Refused on 31 January 2027 at 12:00:00.400 (the answer read
        // 0.6 s later) over a month of 1,000, with an hour of 50 left:
        // the counter counts to 1 February.
        let asked = at(2027, 1, 31) + day / 2 + 400;
        let feb1 = at(2027, 2, 1);
        let statuses = [
            status(Code::Ok, 100, RateLimitUnit::Hour, 50, 3_600),
            status(Code::OverLimit, 1_000, RateLimitUnit::Month, 0, 43_200),
        ];
        let o = remember_refusal(None, AT, asked, asked + 600, &statuses, &[])
            .unwrap()
            .over_limit
            .unwrap();
        assert_eq!(o.until_ms, feb1);
        let h = cached_headers(&o, feb1 - 1_500, HeaderMode::DraftVersion03);
        assert_eq!(h[0].1, "1000, 100;w=3600");
        assert_eq!(h[2], ("x-ratelimit-reset", "2".to_string()));
        assert_eq!(h[3], ("retry-after", "2".to_string()));
        // The IETF family has no month to name; its Retry-After is the same.
        let h = cached_headers(&o, feb1 - 1_500, HeaderMode::IetfDraft10);
        assert_eq!(h.last(), Some(&("retry-after", "2".to_string())));
        // Had it lasted longer, the month would count as full from
        // 1 February, resetting on 1 March (28 days, 2027 is no leap year).
        let mut late = o.clone();
        late.until_ms = feb1 + 10 * day;
        let h = cached_headers(&late, feb1 + day, HeaderMode::DraftVersion03);
        assert_eq!(h[1], ("x-ratelimit-remaining", "100".to_string()));
        let s = status_at(&late.statuses[1], feb1 + day);
        assert_eq!(s.limit_remaining, 1_000);
        assert_eq!(s.reset_seconds(), 27 * 86_400);
    }

    #[test]
    fn cached_refusals_carry_the_rule_names_the_table_kept() {
        let named = |unit, reset, name: &str| {
            let mut s = status(Code::OverLimit, 5, unit, 0, reset);
            s.current_limit.as_mut().unwrap().name = name.to_string();
            s
        };
        let statuses = [
            named(
                RateLimitUnit::Minute,
                20,
                "per-minute \"gold\"\r\nx-injected: 1",
            ),
            named(RateLimitUnit::Hour, 200, &"h".repeat(MAX_KEPT_NAME + 1)),
            named(RateLimitUnit::Day, 2_000, "daily"),
        ];
        let h = MemHost::new();
        h.create_slots(1);
        let ids: Vec<u8> = statuses
            .iter()
            .map(|s| intern(&h, &s.current_limit.as_ref().unwrap().name))
            .collect();
        assert!(ids[0] != 0 && ids[1] == 0 && ids[2] != 0, "{ids:?}");
        let slot = remember_refusal(None, AT, 100_000, 100_000, &statuses, &ids).unwrap();
        let o = Slot::decode(&slot.encode()).unwrap().over_limit.unwrap();
        let read = |id| lookup(&h, id);
        let got = cached_headers_named(&o, 101_000, HeaderMode::DraftVersion03, &read);
        // Cleaned and escaped; the one too long for the table is left out,
        // not cut.
        assert_eq!(
            got[0].1,
            r#"5, 5;w=60;name="per-minute \"gold\"x-injected: 1", 5;w=3600, 5;w=86400;name="daily""#
        );
        // The service's own 429 for the same answer says the same, but for
        // the name the table could not keep.
        let service = crate::headers::draft03_headers(&statuses);
        let long = format!(r#";name="{}""#, "h".repeat(MAX_KEPT_NAME + 1));
        assert_eq!(service[0].1.replace(&long, ""), got[0].1);
        // Without names (no table), the same headers without `;name=`.
        let bare = cached_headers(&o, 101_000, HeaderMode::DraftVersion03);
        assert_eq!(bare[0].1, "5, 5;w=60, 5;w=3600, 5;w=86400");
    }

    #[test]
    fn remembering_keeps_the_tenants_bucket() {
        let p = BucketParams {
            tokens_per_second: 5,
            burst: 5,
        };
        let (v, write) = admit(None, AT, 1_000, Some(p), HeaderMode::Off);
        assert_eq!(v, LocalVerdict::Proceed);
        let stored = write.unwrap().encode();
        let statuses = [status(Code::OverLimit, 5, RateLimitUnit::Minute, 0, 30)];
        let slot = remember_over_limit(Some(&stored), AT, 1_000, &statuses).unwrap();
        assert_eq!(slot.bucket.unwrap().milli_tokens, 4_000);
    }
}

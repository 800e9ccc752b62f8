//! The over-limit cache: what the service said when it refused a tenant,
//! kept in the tenant's slot until every window it was over has reset, and
//! the headers of a refusal answered from it.

use ratelimit_config::HeaderMode;

use crate::decision::{draft03_headers, RETRY_AFTER};
use crate::local::slot::{Claim, Slot, SlotRef};
use crate::proto::{Code, DescriptorStatus, Duration, RateLimit, RateLimitUnit};

/// What the service said about one descriptor, kept to answer from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StatusSnapshot {
    pub requests_per_unit: u32,
    /// `RateLimitUnit` as its protobuf number.
    pub unit: i32,
    pub remaining: u32,
    pub over_limit: bool,
    /// When this descriptor's window resets.
    pub reset_at_ms: u64,
}

/// At most one descriptor per unit is sent.
pub const MAX_STATUSES: usize = 4;

/// A tenant the service has refused, until `until_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct OverLimit {
    pub until_ms: u64,
    pub statuses: Vec<StatusSnapshot>,
}

fn floor_second(ms: u64) -> u64 {
    ms - ms % 1_000
}

fn duration_ms(d: Option<&Duration>) -> u64 {
    d.map(|d| {
        let s = u64::try_from(d.seconds).unwrap_or(0);
        let n = u64::try_from(d.nanos).unwrap_or(0);
        s.saturating_mul(1_000).saturating_add(n / 1_000_000)
    })
    .unwrap_or(0)
}

/// The slot after the service refused the tenant, for a call sent at
/// `asked_at_ms`. The service counts in windows aligned to whole seconds and
/// reports whole seconds until the reset, from its own clock, which read at
/// or after the call went out; so the reset is at or after
/// `floor_second(asked_at) + duration_until_reset`. Taking that lower bound
/// means the cache can end early by at most a second (costing one more
/// call), never late: it stops refusing when the window ends. It refuses
/// until every over-limit window has reset, because until then the service
/// would refuse too.
pub fn remember_over_limit(
    stored: Option<&[u8]>,
    at: SlotRef,
    asked_at_ms: u64,
    statuses: &[DescriptorStatus],
) -> Option<Slot> {
    let base = floor_second(asked_at_ms);
    let snapshots: Vec<StatusSnapshot> = statuses
        .iter()
        .take(MAX_STATUSES)
        .map(|s| StatusSnapshot {
            requests_per_unit: s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit),
            unit: s.current_limit.as_ref().map_or(0, |l| l.unit),
            remaining: s.limit_remaining,
            over_limit: s.code() == Code::OverLimit,
            reset_at_ms: base.saturating_add(duration_ms(s.duration_until_reset.as_ref())),
        })
        .collect();
    let until_ms = snapshots
        .iter()
        .filter(|s| s.over_limit)
        .map(|s| s.reset_at_ms)
        .max()?;
    if until_ms <= asked_at_ms {
        return None;
    }
    let mut slot = Slot::claim(stored, at.fingerprint, asked_at_ms, Claim::Refusal)?;
    slot.over_limit = Some(OverLimit {
        until_ms,
        statuses: snapshots,
    });
    Some(slot)
}

/// The headers of a refusal from the cache: the X-RateLimit-* headers the
/// service's answer gave, as they stand now (a window that has reset since
/// counts as full again, and its reset moves to the next window end), and
/// Retry-After counting down to the end of the cached refusal.
pub fn cached_headers(o: &OverLimit, now_ms: u64, mode: HeaderMode) -> Vec<(&'static str, String)> {
    let mut headers = match mode {
        HeaderMode::DraftVersion03 => {
            // A slot holds at most MAX_STATUSES; built on the stack.
            let mut now_statuses: [DescriptorStatus; MAX_STATUSES] = Default::default();
            let mut n = 0;
            for (to, s) in now_statuses.iter_mut().zip(&o.statuses) {
                *to = status_at(s, now_ms);
                n += 1;
            }
            draft03_headers(now_statuses.get(..n).unwrap_or_default())
        }
        HeaderMode::Off => Vec::with_capacity(1),
    };
    let retry_ms = o.until_ms.saturating_sub(now_ms);
    headers.push((RETRY_AFTER, retry_ms.div_ceil(1_000).max(1).to_string()));
    headers
}

fn status_at(s: &StatusSnapshot, now_ms: u64) -> DescriptorStatus {
    let window_ms = RateLimitUnit::try_from(s.unit)
        .map(|u| u.window_seconds() * 1_000)
        .unwrap_or(0);
    let (remaining, reset_at) = if now_ms < s.reset_at_ms || window_ms == 0 {
        (s.remaining, s.reset_at_ms)
    } else {
        let windows_past = (now_ms - s.reset_at_ms) / window_ms + 1;
        (
            s.requests_per_unit,
            s.reset_at_ms + windows_past * window_ms,
        )
    };
    let left = reset_at.saturating_sub(now_ms);
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
            seconds: i64::try_from(left / 1_000).unwrap_or(i64::MAX),
            nanos: i32::try_from((left % 1_000) * 1_000_000).unwrap_or(0),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::{admit, LocalVerdict};
    use crate::testing::status;
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
                ("x-ratelimit-reset", "0".to_string()),
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
                ("x-ratelimit-reset", "9".to_string()),
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

//! Token-bucket arithmetic: how many tokens a tenant has at a given time.
//! Pure, with time passed in as milliseconds since the Unix epoch.

use ratelimit_config::BucketParams;

/// Refill time of one token is counted in milli-tokens, so that a rate of
/// `r` tokens per second adds exactly `r` milli-tokens per millisecond.
pub const MILLI: u64 = 1_000;

/// A clock that goes back by less than this is taken as two workers reading
/// the clock in a different order than they write; the bucket keeps its
/// reference time. A larger step back is a real clock step: the bucket
/// re-anchors on the new time (without refilling).
pub const CLOCK_REORDER_TOLERANCE_MS: u64 = 1_000;

/// A token bucket: `milli_tokens` available at `updated_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    pub milli_tokens: u64,
    pub updated_ms: u64,
}

impl TokenBucket {
    /// A full bucket.
    pub fn full(p: BucketParams, now_ms: u64) -> TokenBucket {
        TokenBucket {
            milli_tokens: u64::from(p.burst).saturating_mul(MILLI),
            updated_ms: now_ms,
        }
    }

    /// The bucket as it stands at `now_ms`: refilled for the time since it
    /// was last updated, never above `burst`.
    pub fn refilled(self, p: BucketParams, now_ms: u64) -> TokenBucket {
        let cap = u64::from(p.burst).saturating_mul(MILLI);
        if now_ms < self.updated_ms {
            let back = self.updated_ms - now_ms;
            return TokenBucket {
                milli_tokens: self.milli_tokens.min(cap),
                updated_ms: if back > CLOCK_REORDER_TOLERANCE_MS {
                    now_ms
                } else {
                    self.updated_ms
                },
            };
        }
        let added = (now_ms - self.updated_ms).saturating_mul(u64::from(p.tokens_per_second));
        TokenBucket {
            milli_tokens: self.milli_tokens.saturating_add(added).min(cap),
            updated_ms: now_ms,
        }
    }

    /// Takes one token at `now_ms`: the new bucket, or the seconds until a
    /// token will be there (rounded up, at least 1) when there is none.
    pub fn take(self, p: BucketParams, now_ms: u64) -> Result<TokenBucket, u64> {
        self.take_n(p, now_ms, 1)
    }

    /// Takes `cost` tokens at `now_ms` (a request that costs that many
    /// hits), all or none: the new bucket, or the seconds until `cost`
    /// tokens will be there (rounded up, at least 1). A cost above `burst`
    /// never fits: it is always refused, as the service refuses a cost
    /// above the per-second limit.
    pub fn take_n(self, p: BucketParams, now_ms: u64, cost: u32) -> Result<TokenBucket, u64> {
        let b = self.refilled(p, now_ms);
        let need = u64::from(cost.max(1)).saturating_mul(MILLI);
        if b.milli_tokens >= need {
            Ok(TokenBucket {
                milli_tokens: b.milli_tokens - need,
                ..b
            })
        } else {
            let missing = need - b.milli_tokens;
            let rate = u64::from(p.tokens_per_second.max(1));
            let wait_ms = missing.div_ceil(rate);
            Err(wait_ms.div_ceil(1_000).max(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn params(rate: u32, burst: u32) -> BucketParams {
        BucketParams {
            tokens_per_second: rate,
            burst,
        }
    }

    #[test]
    fn a_full_bucket_admits_burst_then_refills_at_rate() {
        let p = params(10, 20);
        let mut b = TokenBucket::full(p, 1_000);
        for _ in 0..20 {
            b = b.take(p, 1_000).unwrap();
        }
        assert_eq!(b.take(p, 1_000), Err(1));
        // 100 ms at 10/s is one token.
        assert_eq!(b.take(p, 1_099), Err(1));
        let b = b.take(p, 1_100).unwrap();
        assert_eq!(b.milli_tokens, 0);
        // A long idle gap refills to burst, not beyond.
        let b = b.refilled(p, 1_100 + 3_600_000);
        assert_eq!(b.milli_tokens, 20_000);
    }

    #[test]
    fn retry_after_is_the_time_to_the_next_token_rounded_up() {
        let p = params(1, 1);
        let empty = TokenBucket {
            milli_tokens: 0,
            updated_ms: 0,
        };
        assert_eq!(empty.take(p, 0), Err(1));
        assert_eq!(empty.take(p, 999), Err(1));
        assert!(empty.take(p, 1_000).is_ok());
    }

    #[test]
    fn a_clock_step_back_neither_refills_nor_freezes_the_bucket() {
        let p = params(10, 10);
        let b = TokenBucket {
            milli_tokens: 0,
            updated_ms: 10_000_000,
        };
        // A small step back (workers' reads out of order): keep the reference.
        let small = b.refilled(p, 10_000_000 - 500);
        assert_eq!(small, b);
        // An hour back: re-anchor, so the bucket refills from the new time
        // instead of staying empty for an hour.
        let big = b.refilled(p, 10_000_000 - 3_600_000);
        assert_eq!(big.milli_tokens, 0);
        assert_eq!(big.updated_ms, 10_000_000 - 3_600_000);
        assert!(big.take(p, 10_000_000 - 3_600_000 + 100).is_ok());
    }

    #[test]
    fn extreme_values_saturate_instead_of_overflowing() {
        let p = params(u32::MAX, u32::MAX);
        let b = TokenBucket {
            milli_tokens: 0,
            updated_ms: 0,
        };
        let b = b.refilled(p, u64::MAX);
        assert_eq!(b.milli_tokens, u64::from(u32::MAX) * 1_000);
    }

    #[test]
    fn a_request_of_cost_n_takes_n_tokens_or_none() {
        let p = params(10, 20);
        let b = TokenBucket::full(p, 1_000);
        let b = b.take_n(p, 1_000, 15).unwrap();
        assert_eq!(b.milli_tokens, 5_000);
        // 10 do not fit in 5, and nothing is taken: 5 tokens take 0.5 s.
        assert_eq!(b.take_n(p, 1_000, 10), Err(1));
        let b = b.take_n(p, 1_000, 5).unwrap();
        assert_eq!(b.milli_tokens, 0);
        // 2 s at 10/s refill 20 tokens: 20 fit, so exactly the burst.
        assert!(b.take_n(p, 3_000, 20).is_ok());
        // Retry-After is the wait for all of them: 10 tokens at 1/s.
        let slow = params(1, 20);
        let empty = TokenBucket {
            milli_tokens: 0,
            updated_ms: 0,
        };
        assert_eq!(empty.take_n(slow, 0, 10), Err(10));
        // More than the burst never fits, however long the bucket refills.
        assert!(TokenBucket::full(p, 0).take_n(p, 10_000_000, 21).is_err());
        // Cost 0 is not free: it takes one token, as cost 1.
        assert_eq!(
            TokenBucket::full(p, 0).take_n(p, 0, 0),
            TokenBucket::full(p, 0).take(p, 0)
        );
    }

    proptest! {
        /// "Exactly N" in units of cost: with costs of any size, the tokens
        /// taken never exceed burst + rate × elapsed.
        #[test]
        fn costs_never_take_more_than_burst_plus_rate_times_elapsed(
            rate in 1u32..1_000,
            burst in 1u32..200,
            steps in prop::collection::vec((0u64..50, 1u32..30), 1..400),
        ) {
            let p = params(rate, burst);
            let start = 1_700_000_000_000u64;
            let mut b = TokenBucket::full(p, start);
            let mut now = start;
            let mut taken = 0u64;
            for (step, cost) in steps {
                now += step;
                if let Ok(next) = b.take_n(p, now, cost) {
                    b = next;
                    taken += u64::from(cost);
                }
                let bound = u64::from(burst) * 1_000 + (now - start) * u64::from(rate);
                prop_assert!(taken * 1_000 <= bound, "taken {taken} by {now}");
            }
        }

        /// With a clock that only moves forward, any run of requests admits
        /// at most burst + rate × elapsed.
        #[test]
        fn never_admits_more_than_burst_plus_rate_times_elapsed(
            rate in 1u32..1_000,
            burst in 1u32..200,
            steps in prop::collection::vec(0u64..50, 1..400),
        ) {
            let p = params(rate, burst);
            let start = 1_700_000_000_000u64;
            let mut b = TokenBucket::full(p, start);
            let mut now = start;
            let mut admitted = 0u64;
            for step in steps {
                now += step;
                if let Ok(next) = b.take(p, now) {
                    b = next;
                    admitted += 1;
                }
                let bound = u64::from(burst) * 1_000 + (now - start) * u64::from(rate);
                prop_assert!(admitted * 1_000 <= bound, "admitted {admitted} by {now}");
            }
        }

        /// With a clock that jumps both ways, nothing panics, tokens stay
        /// within [0, burst], and admissions stay within burst + rate × the
        /// forward movement of the bucket's reference time.
        #[test]
        fn clock_steps_both_ways_are_safe(
            rate in 1u32..1_000,
            burst in 1u32..200,
            steps in prop::collection::vec(-5_000i64..5_000, 1..400),
        ) {
            let p = params(rate, burst);
            let mut now: u64 = 1_000_000_000;
            let mut b = TokenBucket::full(p, now);
            let mut admitted = 0u64;
            let mut forward = 0u64;
            for step in steps {
                now = now.saturating_add_signed(step);
                let before = b.updated_ms;
                if let Ok(next) = b.take(p, now) {
                    b = next;
                    admitted += 1;
                } else {
                    b = b.refilled(p, now);
                }
                forward += b.updated_ms.saturating_sub(before);
                prop_assert!(b.milli_tokens <= u64::from(burst) * 1_000);
                prop_assert!(admitted * 1_000 <= u64::from(burst) * 1_000 + forward * u64::from(rate));
            }
        }

    }
}

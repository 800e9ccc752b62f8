//! Target `verdict`: the rate-limit service's answer as the filter takes
//! it, over arbitrary bytes: the gRPC status, the `RateLimitResponse`
//! decoder, the verdict and its headers in both header modes, and, for a
//! refusal, the slot the over-limit cache writes from it.
//!
//! Input: byte 0 chooses (bit 0) the header mode, (bit 1) no body at all,
//! (bit 2) a gRPC status other than OK, `(byte 0 >> 3) + 1`; the rest is
//! the body.
//!
//! Checks: it never panics; a non-OK status or a missing body is an error
//! and nothing else; `headers: "off"` adds no X-RateLimit-* header; a
//! refusal whose statuses say when an over-limit window resets carries a
//! Retry-After of at least one second, last; one without such a status
//! carries none of the filter's own (only one the service's own headers
//! give, at least one second, never a guess); the slot a
//! refusal writes decodes, and answers from the cache with the same headers
//! as before it was encoded (a unit number the slot's byte cannot hold is
//! stored as 0, unknown, which the headers treat alike).

use ratelimit_config::HeaderMode;
use tenant_ratelimit::answer::RlsError;
use tenant_ratelimit::decision::{verdict, Verdict};
use tenant_ratelimit::headers::{retry_after, RETRY_AFTER};
use tenant_ratelimit::local::{cached_headers, remember_over_limit, Slot, SlotRef};

/// Some time in 2026, in milliseconds.
const ASKED_AT_MS: u64 = 1_796_061_600_123;

pub fn check(data: &[u8]) {
    let (head, body) = data.split_first().map_or((0, data), |(h, b)| (*h, b));
    let mode = if head & 1 == 0 {
        HeaderMode::DraftVersion03
    } else {
        HeaderMode::Off
    };
    let body = (head & 2 == 0).then_some(body);
    let status = if head & 4 == 0 {
        0
    } else {
        u32::from(head >> 3) + 1
    };
    let v = verdict(mode, status, body);
    if status != 0 {
        assert_eq!(v, Verdict::Error(RlsError::Grpc(status)));
    } else if body.is_none() {
        assert_eq!(v, Verdict::Error(RlsError::Undecodable));
    }
    match v {
        Verdict::Allow(headers, _) => {
            assert!(mode == HeaderMode::DraftVersion03 || headers.is_empty());
        }
        Verdict::OverLimit(headers, statuses) => {
            let rest = match headers.split_last() {
                Some(((last, retry), rest)) if *last == RETRY_AFTER => {
                    assert!(
                        retry.parse::<u64>().is_ok_and(|s| s >= 1),
                        "Retry-After {retry}"
                    );
                    if let Some(own) = retry_after(&statuses) {
                        assert_eq!(*retry, own.to_string());
                    }
                    rest
                }
                _ => {
                    assert_eq!(
                        retry_after(&statuses),
                        None,
                        "a refusal without Retry-After"
                    );
                    headers.as_slice()
                }
            };
            assert!(rest.iter().all(|(k, _)| *k != RETRY_AFTER));
            assert!(mode == HeaderMode::DraftVersion03 || rest.is_empty());
            let at = SlotRef {
                index: 0,
                fingerprint: 7,
            };
            if let Some(slot) = remember_over_limit(None, at, ASKED_AT_MS, &statuses) {
                let back = Slot::decode(&slot.encode());
                let (Some(o), Some(b)) = (&slot.over_limit, back.and_then(|b| b.over_limit)) else {
                    unreachable!("the slot a refusal writes does not decode");
                };
                let now = ASKED_AT_MS + 1;
                assert_eq!(cached_headers(o, now, mode), cached_headers(&b, now, mode));
            }
        }
        Verdict::Error(_) => {}
    }
}

//! Request cost (`cost_header`, `max_cost`): a request carrying the header
//! costs that many hits, in the service's counters (`hits_addend`) and in
//! the local bucket, so that "exactly N" holds in units of cost.
//!
//! - No header (or no `cost_header` configured): cost 1.
//! - An integer from 1 to `max_cost`, in plain ASCII digits: that cost.
//! - Anything else (empty, not a number, a sign, 0, above `max_cost`, or
//!   the header sent more than once): the request is refused with 400 and
//!   counted (`cost_invalid`), with no call.
//!   Never a cost of 1: a client could then pay 1 for a request it declared
//!   costs more. And never clamped down to `max_cost`, for the same reason.
//!
//! The header is read only for a request whose tenant is limited, in one
//! host call that gives all its values (Envoy's `request.headers[name]`,
//! joined by `,`): a header sent twice is refused as a repeated tenant
//! header is, rather than charged its first value (`1` then `1000` would
//! otherwise cost 1).
//!
//! A cost the upstream reports (`response_cost_header`, in the response's
//! headers or, for gRPC and streamed responses, its trailers) is charged
//! when the response tells it (`charge_response`): what it cost beyond what
//! its request was charged, on the same descriptors, in a call that goes at
//! once (or joins the worker's queue, which goes with the next call while
//! `max_in_flight` calls are under way). Nothing waits for it: the client
//! already has its response, and the charge counts against the tenant's
//! next requests. A lower cost is not refunded:
//! the service's counters only go up. A value that is not an integer from 1
//! to `max_cost` is counted (`response_cost_invalid`), warned about at most
//! once a minute per VM, and charges nothing more; the response is never
//! touched.

use std::fmt;

use crate::batch::TenantCall;
use crate::compiled::Compiled;
use crate::counters::Counter;
use crate::health::{LogThrottle, WARN_INTERVAL_MS};
use crate::host::{Host, HostError};

/// Why a request has no cost.
#[derive(Debug, PartialEq, Eq)]
pub enum CostError {
    /// The header's value is not a cost: the 400's body says why.
    Invalid(String),
    /// The host could not read the header (a limiter failure).
    Host(HostError),
}

impl fmt::Display for CostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CostError::Invalid(why) => f.write_str(why.trim_end()),
            CostError::Host(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for CostError {}

/// The cost of the request: 1 without the header.
pub fn request_cost<H: Host + ?Sized>(c: &Compiled, host: &H) -> Result<u32, CostError> {
    let (Some(cost), Some(all_values)) = (&c.config.cost, &c.cost_values) else {
        return Ok(1);
    };
    match host.property(all_values).map_err(CostError::Host)? {
        None => Ok(1),
        // Several values, or one holding a `,`: never a cost.
        Some(v) if v.contains(&b',') => Err(CostError::Invalid(format!(
            "invalid {} header: sent more than once, or not one integer from 1 to {}\n",
            cost.header, cost.max
        ))),
        Some(v) => parse_cost(&v, cost.max).ok_or_else(|| {
            CostError::Invalid(format!(
                "invalid {} header: the cost must be an integer from 1 to {}\n",
                cost.header, cost.max
            ))
        }),
    }
}

/// An integer from 1 to `max` in ASCII digits, nothing else.
pub fn parse_cost(v: &[u8], max: u32) -> Option<u32> {
    // More digits than any u32 has cannot be a cost (and must not overflow).
    if v.is_empty() || v.len() > 10 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    u32::try_from(n).ok().filter(|n| (1..=max).contains(n))
}

/// The charge of a response whose cost field holds `value`: `call` (its
/// `hits` what the request was charged) with the difference, when the
/// response cost more; None when it did not, or `value` is not a cost.
pub fn charge_response<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    warnings: &LogThrottle,
    mut call: TenantCall,
    value: &[u8],
) -> Option<TenantCall> {
    let rc = c.config.response_cost.as_ref()?;
    let Some(cost) = parse_cost(value, rc.max) else {
        host.count(Counter::ResponseCostInvalid);
        if let Some(held) = warnings.due(host.now_ms(), WARN_INTERVAL_MS) {
            let shown = String::from_utf8_lossy(value.get(..32).unwrap_or(value));
            log::warn!(
                "response cost {shown:?} in {} is not an integer from 1 to {} (max_cost): nothing more charged ({held} more since the last warning)",
                rc.header,
                rc.max
            );
        }
        return None;
    };
    // No refund: the service's counters only go up.
    call.hits = cost.checked_sub(call.hits).filter(|n| *n > 0)?;
    Some(call)
}

/// The request's `hits_addend` for a cost: 0 (left out, counts 1) for 1,
/// so that a request without a cost is encoded as before.
pub fn hits_addend(cost: u32) -> u32 {
    if cost == 1 {
        0
    } else {
        cost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn only_plain_integers_from_1_to_max_are_costs() {
        assert_eq!(parse_cost(b"1", 100), Some(1));
        assert_eq!(parse_cost(b"10", 100), Some(10));
        assert_eq!(parse_cost(b"100", 100), Some(100));
        assert_eq!(parse_cost(b"007", 100), Some(7));
        for bad in [
            &b""[..],
            b"0",
            b"000",
            b"101",
            b"-1",
            b"+5",
            b"5 ",
            b" 5",
            b"1.5",
            b"1e3",
            b"0x10",
            b"ten",
            b"5,5",
            b"\xff",
            b"4294967296",
            b"99999999999999999999",
        ] {
            assert_eq!(parse_cost(bad, 100), None, "{bad:?}");
        }
        assert_eq!(parse_cost(b"4294967295", u32::MAX), Some(u32::MAX));
    }

    #[test]
    fn cost_one_is_encoded_as_before() {
        assert_eq!(hits_addend(1), 0);
        assert_eq!(hits_addend(10), 10);
    }
}

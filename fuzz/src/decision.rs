//! Target `decision`: the counter's decision, over calls built from the
//! bytes: requests split at marks, descriptors of several tenants, units
//! (calendar ones too), routes, `hits_addend` from 0 to 2^64 - 1, decided
//! again and again against the memory store at one instant.
//!
//! Input: bytes 0..4 move the instant (seconds into 2026 and a bit more),
//! byte 4 is the call's `hits_addend`, byte 5 how many times the call is
//! decided (1 to 4); then three bytes per descriptor: what it is (a mark,
//! a unit, a route's unit, a malformed one), the tenant, its own hits.
//!
//! Checks: it never panics; every answer passes the checks of
//! `rls_request`; and, the counter's promise, a counter never holds more
//! than its limit: the hits of the admitted requests, summed per counter
//! key, stay within the limit, and a refused request adds nothing.

use std::collections::HashMap;

use ratelimit_counter::decide::{answer, plan};
use ratelimit_counter::proto::{Entry, RateLimitDescriptor, RateLimitRequest, UInt64Value};
use ratelimit_counter::store::memory::MemoryCounts;

use crate::rls_request::{decide_and_check, domain, NOW_MS};

const UNITS: [&str; 8] = [
    "per_second",
    "per_minute",
    "per_hour",
    "per_day",
    "per_week",
    "per_month",
    "per_year",
    "per_fortnight",
];
const TENANTS: [&str; 5] = ["a", "b", "c", "other", "a}b"];

fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.into(),
        value: value.into(),
    }
}

/// The call the bytes describe, and the instant.
pub fn call(data: &[u8]) -> (RateLimitRequest, u64, usize) {
    let byte = |i: usize| data.get(i).copied().unwrap_or(0);
    let shift = u32::from_le_bytes([byte(0), byte(1), byte(2), byte(3)]);
    let now = NOW_MS.saturating_add(u64::from(shift).saturating_mul(37));
    let repeat = usize::from(byte(5) % 4) + 1;
    let mut descriptors = Vec::new();
    for spec in data.get(6..).unwrap_or_default().chunks(3) {
        let [kind, tenant, hits] = [0, 1, 2].map(|i| spec.get(i).copied().unwrap_or(0));
        let unit = UNITS
            .get(usize::from(kind >> 3) % UNITS.len())
            .copied()
            .unwrap_or("per_minute");
        let tenant = TENANTS
            .get(usize::from(tenant) % TENANTS.len())
            .copied()
            .unwrap_or("a");
        let entries = match kind & 7 {
            0 => vec![entry("trl.request", "")],
            1..=3 => vec![entry("generic_key", unit), entry("tenant", tenant)],
            4 => vec![
                entry("generic_key", unit),
                entry("tenant", tenant),
                entry("route", "export"),
            ],
            5 => vec![
                entry("generic_key", unit),
                entry("tenant", tenant),
                entry("route", "other"),
            ],
            6 => vec![entry("generic_key", unit)],
            _ => vec![entry("tenant", tenant), entry("generic_key", unit)],
        };
        let hits_addend = match hits {
            0 => None,
            255 => Some(UInt64Value { value: u64::MAX }),
            254 => Some(UInt64Value {
                value: u64::from(u32::MAX),
            }),
            n => Some(UInt64Value {
                value: u64::from(n - 1) % 4,
            }),
        };
        descriptors.push(RateLimitDescriptor {
            entries,
            hits_addend,
        });
    }
    let req = RateLimitRequest {
        domain: "d".into(),
        descriptors,
        hits_addend: u32::from(byte(4) % 3),
    };
    (req, now, repeat)
}

pub fn check(data: &[u8]) {
    let (req, now, repeat) = call(data);
    let d = domain();
    assert!(d.is_some(), "the team file of the target is refused");
    let Some(d) = d else { return };
    let Ok(planned) = plan(Some(&d), &req, now) else {
        return;
    };
    let mut store = MemoryCounts::default();
    // What the admitted requests added to each counter, and its limit.
    let mut held: HashMap<String, (u64, u64)> = HashMap::new();
    for _ in 0..repeat {
        let mut decided = Vec::new();
        for r in &planned.requests {
            let d = store.apply(r, now);
            if d.admitted {
                for check in &r.checks {
                    let e = held.entry(check.key.clone()).or_insert((0, check.limit));
                    e.0 = e.0.saturating_add(check.hits);
                    e.1 = e.1.min(check.limit);
                }
            }
            decided.push(d);
        }
        for (key, (hits, limit)) in &held {
            assert!(hits <= limit, "{key}: {hits} admitted, limit {limit}");
        }
        let (response, _) = answer(&planned, &decided, now);
        assert_eq!(response.statuses.len(), req.descriptors.len());
        // The same counts through the shared checks.
        decide_and_check(Some(&d), &req, now, &|i, j| {
            decided
                .get(i)
                .and_then(|d| d.counts.get(j))
                .copied()
                .unwrap_or_default()
        });
    }
}

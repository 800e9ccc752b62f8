//! Target `rls_request`: a `ShouldRateLimit` call as the counter reads it,
//! over arbitrary bytes: the `RateLimitRequest` decoder, then the plan and
//! the answer of a team file with fixed, sliding and calendar windows and
//! a route.
//!
//! Input: the message's bytes, as gRPC hands them over.
//!
//! Checks: it never panics; a decoded message encodes and decodes to
//! itself; the plan refuses exactly the calls over the counter's bounds
//! (descriptors, entries per descriptor); a planned call is answered with
//! one status per descriptor, each check at its own descriptor's index,
//! `overall_code` OVER_LIMIT exactly when a status is, no remaining
//! count above its limit, a push always admitted, and only a push past a
//! limit.

use prost::Message;
use ratelimit_config::team_file::check_team_file_for;
use ratelimit_config::Service;
use ratelimit_counter::decide::{
    admits, answer, plan, BadCall, Counts, Decision, Domain, MAX_DESCRIPTORS, MAX_ENTRIES,
};
use ratelimit_counter::proto::{Code, RateLimitRequest};

/// Some time in 2026, in milliseconds.
pub const NOW_MS: u64 = 1_796_061_600_123;

/// The team file the fuzzed calls are decided against.
pub const TEAM: &str = r#"{"x-tenant-id": {
  "default": {"persecond": 5, "perminute": 20, "perhour": 30},
  "gold": {"perminute": 3, "permonth": 1000, "window": "sliding", "header_value": ["a", "b"],
           "routes": {"export": {"perminute": 1}}},
  "calendar": {"perweek": 2, "peryear": 5, "header_value": ["c"], "shadow": true}
}}"#;

/// The domain of [`TEAM`], as the counter serves it.
pub fn domain() -> Option<Domain> {
    let (_, limits) = check_team_file_for("d.json", TEAM, Service::Counter).parsed?;
    Some(Domain {
        limits,
        descriptor_key: "tenant".into(),
    })
}

/// The plan and answer of `req` with `counts` (per request, per check) and
/// each request admitted as the counter decides it; checks the answer.
pub fn decide_and_check(
    domain: Option<&Domain>,
    req: &RateLimitRequest,
    now_ms: u64,
    counts: &dyn Fn(usize, usize) -> Counts,
) {
    let planned = match plan(domain, req, now_ms) {
        Ok(p) => p,
        Err(BadCall::TooManyDescriptors(n)) => {
            assert!(n > MAX_DESCRIPTORS && n == req.descriptors.len());
            return;
        }
        Err(BadCall::TooManyEntries(n)) => {
            assert!(n > MAX_ENTRIES && req.descriptors.iter().any(|d| d.entries.len() == n));
            return;
        }
    };
    assert!(req.descriptors.len() <= MAX_DESCRIPTORS);
    assert!(req
        .descriptors
        .iter()
        .all(|d| d.entries.len() <= MAX_ENTRIES));
    assert_eq!(planned.descriptors, req.descriptors.len());
    let decided: Vec<Decision> = planned
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let counts: Vec<Counts> = (0..r.checks.len()).map(|j| counts(i, j)).collect();
            Decision {
                admitted: admits(r, &counts),
                counts,
                failed: false,
                allocations: Vec::new(),
            }
        })
        .collect();
    let (response, outcomes) = answer(&planned, &decided, now_ms);
    assert_eq!(response.statuses.len(), req.descriptors.len());
    assert_eq!(outcomes.len(), planned.requests.len());
    let any_over = response
        .statuses
        .iter()
        .any(|s| s.code == Code::OverLimit as i32);
    assert_eq!(response.overall_code == Code::OverLimit as i32, any_over);
    for s in &response.statuses {
        assert!(s.code == Code::Ok as i32 || s.code == Code::OverLimit as i32);
        if let Some(l) = &s.current_limit {
            assert!(s.limit_remaining <= l.requests_per_unit);
        }
    }
    for ((r, d), o) in planned.requests.iter().zip(&decided).zip(&outcomes) {
        let ok = &d.admitted;
        assert_eq!(o.admitted, *ok);
        let mut seen = Vec::new();
        for c in &r.checks {
            assert!(c.index < req.descriptors.len());
            assert!(!seen.contains(&c.index), "two checks of one descriptor");
            seen.push(c.index);
            let over = response
                .statuses
                .get(c.index)
                .is_some_and(|s| s.code == Code::OverLimit as i32);
            // An admitted request has no status over its limit (but a
            // push, counted whatever the limit, may); a refused one has at
            // least one.
            if *ok && !r.push {
                assert!(!over);
            }
        }
        // Only a push takes a count past a limit.
        assert!(r.push || o.overshoot == 0, "{o:?}");
        assert!(!r.push || *ok, "a push is always counted");
        if !*ok {
            assert!(r.checks.iter().any(|c| response
                .statuses
                .get(c.index)
                .is_some_and(|s| s.code == Code::OverLimit as i32)));
        }
    }
}

pub fn check(data: &[u8]) {
    let Ok(req) = RateLimitRequest::decode(data) else {
        return;
    };
    let again = RateLimitRequest::decode(req.encode_to_vec().as_slice());
    assert_eq!(again.as_ref().ok(), Some(&req));
    let d = domain();
    // Fresh counters, then counters near and at their limits.
    decide_and_check(d.as_ref(), &req, NOW_MS, &|_, _| Counts::default());
    decide_and_check(d.as_ref(), &req, NOW_MS, &|i, j| Counts {
        current: u64::try_from(i + j).unwrap_or(0),
        previous: 2,
    });
    // Unknown domain: every descriptor OK, nothing planned.
    decide_and_check(None, &req, NOW_MS, &|_, _| Counts::default());
}

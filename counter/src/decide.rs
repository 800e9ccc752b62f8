//! The pure core: a call's descriptors split into requests at the marks,
//! each descriptor resolved to the team file's rule, the counter keys of
//! its windows at `now`, and the decision from the counts. No I/O, time
//! passed in. Every store applies this decision ([`admits`]): the memory
//! store calls it, the Redis stores' script is tested against it (the
//! tests below run on every store, `test_with_all_stores!`).

use std::collections::HashMap;

use ratelimit_config::window::{
    previous_window, sliding_estimate, sliding_wait_ms, sliding_weight_ppm, window_at,
};
use ratelimit_config::{counter_keys, TeamLimits, Unit};

use crate::proto::{
    Code, DescriptorStatus, Duration, RateLimit, RateLimitRequest, RateLimitResponse,
    RateLimitUnit, PUSH, REQUEST_MARK,
};

/// The most descriptors one call may carry.
pub const MAX_DESCRIPTORS: usize = 4_096;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 8;

/// One domain's team file, as the counter serves it.
#[derive(Debug)]
pub struct Domain {
    pub limits: TeamLimits,
    pub descriptor_key: String,
}

/// What a call asks for that the counter refuses to read.
#[derive(Debug, PartialEq, Eq)]
pub enum BadCall {
    TooManyDescriptors(usize),
    TooManyEntries(usize),
}

impl std::fmt::Display for BadCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadCall::TooManyDescriptors(n) => write!(
                f,
                "{n} descriptors in one call; at most {MAX_DESCRIPTORS} are read"
            ),
            BadCall::TooManyEntries(n) => write!(
                f,
                "a descriptor of {n} entries; at most {MAX_ENTRIES} are read"
            ),
        }
    }
}

/// One descriptor with a rule: what to count and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// Its place among the call's descriptors.
    pub index: usize,
    pub unit: Unit,
    pub limit: u64,
    pub hits: u64,
    /// The hits of every check of its request on the same counter (itself
    /// included): what the decision adds to that counter.
    pub key_hits: u64,
    pub sliding: bool,
    pub shadow: bool,
    /// The group's index in `all_groups()`, and its name (the rule's name).
    pub group: usize,
    pub name: String,
    /// The Redis Cluster hash tag: one per domain and tenant.
    pub tag: String,
    /// The counter of the current window, and for a sliding one the
    /// previous window's.
    pub key: String,
    pub prev_key: Option<String>,
    /// The current window, and where the next one ends.
    pub window: (u64, u64),
    pub next_end: u64,
    /// The previous window's weight (millionths) in a sliding estimate.
    pub weight_ppm: u64,
    /// How long the current window's counter must live.
    pub ttl_ms: u64,
    /// A global group's check on a counter serving a region
    /// (`--region`): decided against the region's allocation.
    pub regional: Option<Regional>,
}

/// Where a global group's check finds its region's allocation, and what
/// it holds before one was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Regional {
    /// The tenant's regions hash for this limit (`crate::regions`): its
    /// allocation, its demand.
    pub key: String,
    /// The allocation before the rebalancer wrote one.
    pub floor: u64,
}

/// One request: the descriptors from one mark to the next.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    pub checks: Vec<Check>,
    /// A push (its mark's value `push`): admitted whatever its counts,
    /// its hits added to every window, its statuses what the counts are
    /// once they are.
    pub push: bool,
}

/// A call, planned: its requests and how many descriptors it had.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub requests: Vec<Request>,
    pub descriptors: usize,
}

/// The counts a store read for one check: the current window's, and the
/// previous one's (0 for a fixed window).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub current: u64,
    pub previous: u64,
}

/// How one request was decided: the counts of its checks as read before
/// its hits were added (in its checks' order), and whether it was admitted.
/// A failed one (a key of it holds something else than a count) was
/// neither decided nor counted: its statuses say so (UNKNOWN), and the
/// call's other requests are decided as usual.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    pub counts: Vec<Counts>,
    pub admitted: bool,
    pub failed: bool,
    /// Per regional check (its position among the request's checks), the
    /// allocation it was decided against: its limit in the answer.
    pub allocations: Vec<(usize, u64)>,
}

/// The hits of a descriptor: its own `hits_addend` when set (0 checks
/// without counting), else the request's (0, unset, counts 1).
fn hits_of(own: Option<u64>, request: u32) -> u64 {
    own.unwrap_or(u64::from(request.max(1)))
}

/// Splits a call into requests and resolves each descriptor's rule at
/// `now_ms`. A descriptor without a rule (or of an unknown domain) is
/// answered OK with no limit, as envoyproxy/ratelimit answers it.
pub fn plan(domain: Option<&Domain>, req: &RateLimitRequest, now_ms: u64) -> Result<Plan, BadCall> {
    let n = req.descriptors.len();
    if n > MAX_DESCRIPTORS {
        return Err(BadCall::TooManyDescriptors(n));
    }
    let mut plan = Plan {
        requests: Vec::new(),
        descriptors: n,
    };
    let mut current = Request::default();
    let mut started = false;
    for (index, d) in req.descriptors.iter().enumerate() {
        if d.entries.len() > MAX_ENTRIES {
            return Err(BadCall::TooManyEntries(d.entries.len()));
        }
        if let Some(mark) = d.entries.first().filter(|e| e.key == REQUEST_MARK) {
            if started {
                plan.requests.push(std::mem::take(&mut current));
            }
            current.push = mark.value == PUSH;
            started = true;
            continue;
        }
        started = true;
        let Some(domain_limits) = domain else {
            continue;
        };
        let hits = hits_of(d.hits_addend.map(|h| h.value), req.hits_addend);
        if let Some(check) = resolve(&req.domain, domain_limits, &d.entries, index, hits, now_ms) {
            current.checks.push(check);
        }
    }
    if started {
        plan.requests.push(current);
    }
    for r in &mut plan.requests {
        sum_hits_per_key(r);
    }
    Ok(plan)
}

/// A request that names one counter twice adds both checks' hits to it:
/// each is decided on their sum.
fn sum_hits_per_key(r: &mut Request) {
    if r.checks.len() > 16 {
        let mut totals: HashMap<&str, u64> = HashMap::new();
        for c in &r.checks {
            let t = totals.entry(c.key.as_str()).or_default();
            *t = t.saturating_add(c.hits);
        }
        let totals: Vec<u64> = r
            .checks
            .iter()
            .map(|c| totals.get(c.key.as_str()).copied().unwrap_or(c.hits))
            .collect();
        for (c, t) in r.checks.iter_mut().zip(totals) {
            c.key_hits = t;
        }
        return;
    }
    // Few checks: compared pairwise, nothing allocated.
    for i in 0..r.checks.len() {
        let Some(key) = r.checks.get(i).map(|c| c.key.as_str()) else {
            continue;
        };
        let total = r
            .checks
            .iter()
            .filter(|c| c.key == key)
            .fold(0u64, |t, c| t.saturating_add(c.hits));
        if let Some(c) = r.checks.get_mut(i) {
            c.key_hits = total;
        }
    }
}

/// The rule of one descriptor: `[generic_key=per_<unit>, <key>=<tenant>]`,
/// with `[route=<name>]` on a route the tenant's group limits.
fn resolve(
    domain_name: &str,
    domain: &Domain,
    entries: &[crate::proto::Entry],
    index: usize,
    hits: u64,
    now_ms: u64,
) -> Option<Check> {
    let (unit_entry, tenant_entry, route_entry) = match entries {
        [u, t] => (u, t, None),
        [u, t, r] => (u, t, Some(r)),
        _ => return None,
    };
    if unit_entry.key != "generic_key" || tenant_entry.key != domain.descriptor_key {
        return None;
    }
    let unit = Unit::from_descriptor_value(&unit_entry.value)?;
    let tenant = tenant_entry.value.as_str();
    let (group, g) = domain.limits.group_index_for(tenant)?;
    let (limit, route, name) = match route_entry {
        None => (g.limits.get(unit)?, None, g.name.clone()),
        Some(r) if r.key == ratelimit_config::model::ROUTE_DESCRIPTOR_KEY => {
            let route = g.route(r.value.as_bytes())?;
            (
                route.limits.get(unit)?,
                Some(route.name.as_str()),
                format!("{}/{}", g.name, route.name),
            )
        }
        Some(_) => return None,
    };
    let sliding = g.slides(unit);
    let tag = counter_keys::tag(domain_name, tenant);
    let window = window_at(unit, now_ms);
    let (_, next_end) = window_at(unit, window.1);
    let prev_key =
        sliding.then(|| counter_keys::key(&tag, unit, previous_window(unit, now_ms).0, route));
    // A sliding window's counter is read again as the previous one.
    let lives_until = if sliding { next_end } else { window.1 };
    let regional = crate::regions::regional_key(&tag, unit, route, g.global).map(|key| Regional {
        key,
        floor: crate::regions::floor(u64::from(limit)),
    });
    Some(Check {
        regional,
        index,
        unit,
        limit: u64::from(limit),
        hits,
        key_hits: hits,
        sliding,
        shadow: g.shadow,
        group,
        name,
        key: counter_keys::key(&tag, unit, window.0, route),
        tag,
        prev_key,
        window,
        next_end,
        weight_ppm: if sliding {
            sliding_weight_ppm(window.0, window.1, now_ms)
        } else {
            0
        },
        ttl_ms: lives_until.saturating_sub(now_ms).max(1),
    })
}

/// The count a check is decided on: the current window's, or the
/// sliding estimate.
pub fn estimate(c: &Check, n: Counts) -> u64 {
    if c.sliding {
        sliding_estimate(n.previous, n.current, c.weight_ppm)
    } else {
        n.current
    }
}

/// Whether one check refuses: the count plus its hits above the limit; a
/// check of 0 hits refuses when not even one more would fit.
pub fn over(c: &Check, n: Counts) -> bool {
    let est = estimate(c, n);
    if c.key_hits == 0 {
        est >= c.limit
    } else {
        est.saturating_add(c.key_hits) > c.limit
    }
}

/// A request is admitted only if every one of its windows admits it; a
/// push always is.
pub fn admits(r: &Request, counts: &[Counts]) -> bool {
    r.push
        || r.checks
            .iter()
            .zip(
                counts
                    .iter()
                    .copied()
                    .chain(std::iter::repeat(Counts::default())),
            )
            .all(|(c, n)| !over(c, n))
}

/// What happened to one request, for the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub group: usize,
    pub admitted: bool,
    pub shadow: bool,
    pub near_limit: bool,
    /// The hits this request took a window past its limit (the most of
    /// any of its windows); only a push can (`overshoot`).
    pub overshoot: u64,
    /// Failed, not decided (a key of it holds something else than a
    /// count): neither admitted nor refused.
    pub failed: bool,
}

/// Near the limit: an admitted request that leaves at most a fifth of a
/// window's limit (envoyproxy/ratelimit's NEAR_LIMIT_RATIO of 0.8).
fn near(c: &Check, after: u64) -> bool {
    after.saturating_mul(5) >= c.limit.saturating_mul(4)
}

/// How far past `c`'s limit a request's hits took its count: from
/// `before` (the count it was decided on) to `after`, the part above both
/// the limit and `before`. 0 unless the request was a push: an ordinary
/// request is admitted only when its hits fit.
fn overshoot(c: &Check, before: u64, after: u64) -> u64 {
    after.saturating_sub(before.max(c.limit))
}

/// The answer to a call from each request's decision (one per request, in
/// the plan's order; a request without one is refused): one status per descriptor, in
/// order; marks and descriptors without a rule OK with no limit. A push's
/// status is OVER_LIMIT where its hits took the count past the limit (0
/// left), as envoyproxy/ratelimit answers hits it counts whatever the
/// limit.
pub fn answer(
    plan: &Plan,
    decisions: &[Decision],
    now_ms: u64,
) -> (RateLimitResponse, Vec<Outcome>) {
    let ok = DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    };
    let mut statuses = vec![ok; plan.descriptors];
    let mut overall = Code::Ok;
    let mut outcomes = Vec::with_capacity(plan.requests.len());
    for (i, r) in plan.requests.iter().enumerate() {
        let (counts, admitted, failed) = match decisions.get(i) {
            Some(d) => (d.counts.as_slice(), d.admitted, d.failed),
            None => (&[][..], false, false),
        };
        let mut outcome = Outcome {
            group: r.checks.first().map_or(0, |c| c.group),
            admitted,
            shadow: r.checks.iter().any(|c| c.shadow),
            near_limit: false,
            overshoot: 0,
            failed,
        };
        if failed {
            // Its statuses UNKNOWN, with no limit: the call's other
            // requests are answered as usual.
            for c in &r.checks {
                if let Some(s) = statuses.get_mut(c.index) {
                    *s = DescriptorStatus {
                        code: Code::Unknown as i32,
                        ..DescriptorStatus::default()
                    };
                }
            }
            outcomes.push(outcome);
            continue;
        }
        for (j, c) in r.checks.iter().enumerate() {
            // A regional check answers with its region's allocation.
            let held;
            let c = match decisions
                .get(i)
                .and_then(|d| d.allocations.iter().find(|(at, _)| *at == j))
            {
                Some(&(_, limit)) => {
                    held = Check { limit, ..c.clone() };
                    &held
                }
                None => c,
            };
            let n = counts.get(j).copied().unwrap_or_default();
            let is_over = over(c, n);
            let added = if admitted { c.key_hits } else { 0 };
            let before = estimate(c, n);
            let after = before.saturating_add(added);
            outcome.near_limit |= admitted && near(c, after);
            outcome.overshoot = outcome.overshoot.max(overshoot(c, before, after));
            // Until the window resets; a sliding window over its limit,
            // until it admits one more. Never 0: a sliding window with
            // room now resets with its current window too.
            let reset_ms = c.window.1.saturating_sub(now_ms);
            let wait_ms = if c.sliding {
                let cur = n.current.saturating_add(added);
                sliding_wait_ms(c.limit, 1, n.previous, cur, c.window, c.next_end, now_ms)
                    .filter(|w| *w > 0)
                    .unwrap_or(reset_ms)
            } else {
                reset_ms
            };
            let code = if is_over { Code::OverLimit } else { Code::Ok };
            if code == Code::OverLimit {
                overall = Code::OverLimit;
            }
            if let Some(s) = statuses.get_mut(c.index) {
                *s = DescriptorStatus {
                    code: code as i32,
                    current_limit: Some(RateLimit {
                        name: c.name.clone(),
                        requests_per_unit: u32::try_from(c.limit).unwrap_or(u32::MAX),
                        unit: RateLimitUnit::from(c.unit) as i32,
                    }),
                    limit_remaining: u32::try_from(c.limit.saturating_sub(after))
                        .unwrap_or(u32::MAX),
                    duration_until_reset: Some(Duration {
                        seconds: i64::try_from(wait_ms.div_ceil(1_000)).unwrap_or(i64::MAX),
                        nanos: 0,
                    }),
                };
            }
        }
        outcomes.push(outcome);
    }
    (
        RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            ..RateLimitResponse::default()
        },
        outcomes,
    )
}

#[cfg(test)]
mod tests;

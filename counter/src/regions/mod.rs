//! Regional allocations: a global group's limits held across regions.
//!
//! Each region runs its own counters and Redis. A counter started with
//! `--region NAME --regions N` decides a global group's checks (the team
//! file's `"regions": "global"`) against the tenant's **allocation** in its
//! region, read in the same script as the count, and records there what it
//! admitted and refused (the demand). Per tenant and limit, a region's
//! Redis holds one hash (its key: [`regional_key`]):
//!
//! - `alloc`: the region's allocation, written only by the rebalancer;
//!   missing, the counter holds [`floor`] (the limit / N, rounded down:
//!   the floors of N regions add up to at most the limit);
//! - `admitted`, `refused`: hits, ever growing, written by the counters;
//! - `limit`: the limit the counters last decided on;
//! - `d_total`, `d_ms`, `d_rate`: the demand the rebalancer last saw
//!   (its only memory, kept in the region's own Redis).
//!
//! The counters also keep [`REGISTRY`], a sorted set of these hashes
//! scored by when they were last used: the rebalancer
//! (`ratelimit-counter rebalance`, [`rebalance`]) reads it instead of
//! scanning keys, and moves allocations toward each region's share of the
//! demand ([`plan`]: pure, the invariants tested there).

pub mod plan;
pub mod rebalance;

use std::sync::atomic::{AtomicU64, Ordering};

use ratelimit_config::Unit;

/// The sorted set of the regions hashes the counters used, scored by
/// Redis's time (ms) of their last use.
pub const REGISTRY: &str = "trl:regions";

/// The number of regions this process's counter shares global limits
/// with (`--regions`); 0: not a regional counter (global groups count to
/// the whole limit, as any other).
static REGIONS: AtomicU64 = AtomicU64::new(0);

/// Makes this process a regional counter among `regions` regions.
pub fn serve_regions(regions: u64) {
    REGIONS.store(regions, Ordering::Relaxed);
}

/// The number of regions, when this counter serves one.
pub fn regions() -> Option<u64> {
    match REGIONS.load(Ordering::Relaxed) {
        0 => None,
        n => Some(n),
    }
}

/// What a region holds of `limit` before the rebalancer wrote its
/// allocation: the limit over the number of regions, rounded down.
pub fn floor(limit: u64) -> u64 {
    floor_of(limit, regions().unwrap_or(1))
}

/// [`floor`] for `regions` regions.
pub fn floor_of(limit: u64, regions: u64) -> u64 {
    limit / regions.max(1)
}

/// The regions hash of a global group's limit (`tag`, `unit`, `route`) on
/// a regional counter; `None` otherwise.
pub fn regional_key(tag: &str, unit: Unit, route: Option<&str>, global: bool) -> Option<String> {
    if !global || regions().is_none() {
        return None;
    }
    Some(key_of(tag, unit, route))
}

/// `trl:<tag>:<unit>:regions[:r:<route>]`: beside the counters of the
/// windows (`trl:<tag>:<unit>:<start>[:r:<route>]`), in the same slot.
pub fn key_of(tag: &str, unit: Unit, route: Option<&str>) -> String {
    let mut k = format!("trl:{tag}:{}:regions", unit.descriptor_value());
    if let Some(r) = route {
        k.push_str(":r:");
        k.push_str(r);
    }
    k
}

/// A regions hash's key, read back: the window counters' key around the
/// window's start, and the unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// `trl:<tag>:<unit>:`
    pub head: String,
    /// `` or `:r:<route>`
    pub tail: String,
    pub unit: Unit,
}

impl Parsed {
    /// The counter key of the window that starts at `start`.
    pub fn counter_key(&self, start: u64) -> String {
        format!("{}{start}{}", self.head, self.tail)
    }
}

/// Reads a key [`key_of`] wrote. The tag ends at its first `}` (a `}`
/// inside is written `%7D`).
pub fn parse(key: &str) -> Option<Parsed> {
    let rest = key.strip_prefix("trl:{")?;
    let close = rest.find('}')?;
    let after = rest.get(close + 1..)?;
    let after = after.strip_prefix(':')?;
    let (unit, tail) = after.split_once(":regions")?;
    if !(tail.is_empty() || tail.starts_with(":r:")) {
        return None;
    }
    let unit = Unit::from_descriptor_value(unit)?;
    let head_len = key.len() - tail.len() - "regions".len();
    Some(Parsed {
        head: key.get(..head_len)?.to_string(),
        tail: tail.to_string(),
        unit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regions_key_reads_back_to_its_window_counters() {
        let k = key_of("{1:d:a:regions}", Unit::Minute, Some("checkout"));
        assert_eq!(k, "trl:{1:d:a:regions}:per_minute:regions:r:checkout");
        let p = parse(&k).unwrap();
        assert_eq!(p.unit, Unit::Minute);
        assert_eq!(
            p.counter_key(60_000),
            "trl:{1:d:a:regions}:per_minute:60000:r:checkout"
        );
        let p = parse("trl:{1:d:b}:per_hour:regions").unwrap();
        assert_eq!(p.counter_key(0), "trl:{1:d:b}:per_hour:0");
        assert_eq!(parse("trl:{1:d:b}:per_hour:0"), None);
        assert_eq!(parse("trl:{1:d:b}:per_fortnight:regions"), None);
        assert_eq!(parse("other"), None);
    }

    #[test]
    fn the_floors_of_every_region_add_up_to_at_most_the_limit() {
        for limit in 0..200 {
            for n in 1..7 {
                assert!(floor_of(limit, n) * n <= limit);
            }
        }
    }
}

#[cfg(test)]
mod script_tests {
    use crate::decide::{Regional, Request};
    use crate::store::testing::{minute_check, Kind, Under};

    fn regional(limit: u64, floor: u64) -> Request {
        let mut c = minute_check("trl:{1:d:a}:per_minute:0", limit);
        c.regional = Some(Regional {
            key: "trl:{1:d:a}:per_minute:regions".into(),
            floor,
        });
        // A local limit beside it, in the same request.
        let other = minute_check("trl:{1:d:a}:per_hour:0", 1_000);
        Request {
            checks: vec![c, other],
            ..Request::default()
        }
    }

    /// On one Redis: a global group's check is decided against the
    /// region's allocation (its floor before one is written, never above
    /// the limit), the demand recorded, the allocation answered.
    #[test]
    fn a_regional_check_admits_against_its_allocation_and_records_its_demand() {
        Under::run(Kind::Redis, |u| {
            let r = regional(10, 5);
            let decided: Vec<bool> = (0..6)
                .map(|_| u.decide(std::slice::from_ref(&r), 1_000)[0].admitted)
                .collect();
            assert_eq!(decided, [true, true, true, true, true, false]);
            let d = &u.decide(std::slice::from_ref(&r), 1_000)[0];
            assert_eq!(d.allocations, [(0, 5)]);
            let h = u.hash("trl:{1:d:a}:per_minute:regions");
            assert_eq!(h.get("admitted").map(String::as_str), Some("5"));
            assert_eq!(h.get("refused").map(String::as_str), Some("2"));
            assert_eq!(h.get("limit").map(String::as_str), Some("10"));
            // The local limit counted only what was admitted.
            assert_eq!(u.value("trl:{1:d:a}:per_hour:0", 1_000), 5);
            // An allocation written: two more.
            u.poison("HSET", "trl:{1:d:a}:per_minute:regions", &["alloc", "7"]);
            let decided: Vec<bool> = (0..3)
                .map(|_| u.decide(std::slice::from_ref(&r), 1_000)[0].admitted)
                .collect();
            assert_eq!(decided, [true, true, false]);
            // Never above the limit.
            u.poison("HSET", "trl:{1:d:a}:per_minute:regions", &["alloc", "50"]);
            let decided: Vec<bool> = (0..4)
                .map(|_| u.decide(std::slice::from_ref(&r), 1_000)[0].admitted)
                .collect();
            assert_eq!(decided, [true, true, true, false]);
            assert_eq!(
                u.decide(std::slice::from_ref(&r), 1_000)[0].allocations,
                [(0, 10)]
            );
            // A push is counted, not decided: no allocation, no demand.
            let push = Request {
                push: true,
                ..r.clone()
            };
            let d = &u.decide(&[push], 1_000)[0];
            assert!(d.admitted && d.allocations.is_empty());
        });
    }
}

#[cfg(test)]
mod answer_tests {
    use crate::decide::{answer, Counts, Decision, Plan, Regional, Request};
    use crate::proto::Code;
    use crate::store::testing::minute_check;

    #[test]
    fn a_regional_check_is_answered_with_its_region_s_allocation() {
        let mut c = minute_check("k", 10);
        c.regional = Some(Regional {
            key: "h".into(),
            floor: 5,
        });
        let plan = Plan {
            requests: vec![Request {
                checks: vec![c],
                ..Request::default()
            }],
            descriptors: 1,
        };
        let counts = |n| {
            vec![Counts {
                current: n,
                previous: 0,
            }]
        };
        // 3 counted of an allocation of 4: admitted, none left.
        let (r, _) = answer(
            &plan,
            &[Decision {
                counts: counts(3),
                admitted: true,
                failed: false,
                allocations: vec![(0, 4)],
            }],
            1_000,
        );
        let s = &r.statuses[0];
        assert_eq!(s.code, Code::Ok as i32);
        assert_eq!(s.limit_remaining, 0);
        assert_eq!(s.current_limit.as_ref().unwrap().requests_per_unit, 4);
        // 4 of 4: refused (its limit of 10 is not what it is decided on).
        let (r, _) = answer(
            &plan,
            &[Decision {
                counts: counts(4),
                admitted: false,
                failed: false,
                allocations: vec![(0, 4)],
            }],
            1_000,
        );
        assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
        assert_eq!(r.overall_code, Code::OverLimit as i32);
    }
}

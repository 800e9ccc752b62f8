//! The rebalancer's decisions, pure: time passed in, no I/O.
//!
//! Per tenant limit, from what each region's Redis holds (or `None` for a
//! region the rebalancer cannot reach):
//!
//! - [`demand_rate`]: each region's demand (hits admitted and refused per
//!   second), smoothed over `tau_ms`;
//! - [`targets`]: allocations proportional to demand, none below what its
//!   region admitted in the current window, adding up to at most the limit
//!   when every region is reachable, and to what the reachable regions
//!   hold otherwise (a cut-off region keeps its allocation, and its share
//!   is given to nobody);
//! - [`lowered`] (run in the region's Redis, atomically with its counts):
//!   a lowering never below the count it finds there;
//! - [`raises`]: once every lowering is written and confirmed, the raises,
//!   within what the lowerings freed.
//!
//! Together: at every instant the allocations of a tenant's limit add up
//! to at most the limit, and no region's count exceeds its allocation, so
//! the regions together admit at most the limit in every window.

/// What the rebalancer read of one region for one tenant limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Seen {
    /// The allocation the region holds (its floor when none was written),
    /// at most the limit.
    pub alloc: u64,
    /// What it admitted in the current window (the most of the windows
    /// around now, for clocks that differ a little).
    pub used: u64,
    /// Its demand, hits per second ([`demand_rate`]).
    pub demand: f64,
}

/// The demand the rebalancer last saw in a region (kept in that region's
/// Redis: the rebalancer keeps nothing of its own).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DemandSeen {
    /// Hits admitted and refused, ever, as counted then.
    pub total: u64,
    pub at_ms: u64,
    /// The smoothed rate then, hits per second.
    pub rate: f64,
}

/// The smoothed demand now: the hits since `last` over the time since,
/// averaged exponentially with `last.rate` (time constant `tau_ms`). The
/// first sight (or counts that went back: a flushed Redis) starts from 0.
pub fn demand_rate(last: Option<DemandSeen>, total: u64, now_ms: u64, tau_ms: u64) -> f64 {
    let Some(last) = last else {
        return 0.0;
    };
    let rate = if last.rate.is_finite() && last.rate > 0.0 {
        last.rate
    } else {
        0.0
    };
    if total < last.total || now_ms <= last.at_ms {
        return rate;
    }
    let dt = (now_ms - last.at_ms) as f64;
    let instant = (total - last.total) as f64 * 1_000.0 / dt;
    let keep = if tau_ms == 0 {
        0.0
    } else {
        (-dt / tau_ms as f64).exp()
    };
    instant + (rate - instant) * keep
}

/// The allocations to move toward, one per region (`None` where the
/// region is unreachable), or `None` when there is nothing to go by (no
/// demand seen in any reachable region: allocations stay).
///
/// The total shared is the limit when every region is reachable, else
/// what the reachable ones hold (at most the limit). Each region first
/// keeps what it has admitted in the current window; the rest goes in
/// proportion to how far each region's share of the demand is above
/// that, rounded down, the units left over to the largest remainders.
pub fn targets(limit: u64, regions: &[Option<Seen>]) -> Option<Vec<Option<u64>>> {
    let reachable: Vec<&Seen> = regions.iter().flatten().collect();
    if reachable.is_empty() {
        return None;
    }
    let demand = |s: &Seen| {
        if s.demand.is_finite() && s.demand > 0.0 {
            s.demand
        } else {
            0.0
        }
    };
    let total_demand: f64 = reachable.iter().map(|s| demand(s)).sum();
    if total_demand <= 0.0 {
        return None;
    }
    let total = if reachable.len() == regions.len() {
        limit
    } else {
        reachable
            .iter()
            .fold(0u64, |t, s| t.saturating_add(s.alloc))
            .min(limit)
    };
    let used: u64 = reachable.iter().fold(0u64, |t, s| t.saturating_add(s.used));
    let spare = total.saturating_sub(used);
    // Per region: how much its share of the demand wants above what it used.
    let wants: Vec<f64> = regions
        .iter()
        .map(|r| match r {
            Some(s) => (total as f64 * demand(s) / total_demand - s.used as f64).max(0.0),
            None => 0.0,
        })
        .collect();
    let wanted: f64 = wants.iter().sum();
    let mut extra: Vec<u64> = vec![0; regions.len()];
    let mut remainders: Vec<(f64, usize)> = Vec::new();
    if wanted > 0.0 {
        let mut given = 0u64;
        for (i, w) in wants.iter().enumerate() {
            let exact = spare as f64 * w / wanted;
            let whole = (exact.floor() as u64).min(spare);
            if let Some(e) = extra.get_mut(i) {
                *e = whole;
            }
            given = given.saturating_add(whole);
            if *w > 0.0 {
                remainders.push((exact - whole as f64, i));
            }
        }
        // Rounding can only leave units over (never give too many).
        if given > spare {
            return None;
        }
        let mut left = spare - given;
        remainders.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for (_, i) in remainders.iter().cycle().take(remainders.len() * 2) {
            if left == 0 {
                break;
            }
            if let Some(e) = extra.get_mut(*i) {
                *e += 1;
                left -= 1;
            }
        }
    }
    Some(
        regions
            .iter()
            .zip(extra)
            .map(|(r, e)| r.map(|s| s.used.saturating_add(e)))
            .collect(),
    )
}

/// A lowering as the region's Redis applies it, atomically with its
/// counts: toward `target`, never below `used_now` (what the region has
/// admitted by then), never above what it held.
pub fn lowered(held: u64, target: u64, used_now: u64) -> u64 {
    target.max(used_now).min(held)
}

/// The raises, once the lowerings are written: `held[i]` what region `i`
/// holds now (`None`: unreachable, or its lowering not confirmed: it is
/// taken to hold `before[i]`), `before[i]` what it held when read. Each
/// region below its target is raised toward it, in order, within what is
/// left of `total` (the limit when every region was reachable, else what
/// the reachable ones held when read). Returns the new allocation of each
/// region raised.
pub fn raises(
    limit: u64,
    before: &[Option<u64>],
    held: &[Option<u64>],
    targets: &[Option<u64>],
) -> Vec<Option<u64>> {
    let all = before.iter().all(Option::is_some);
    let total = if all {
        limit
    } else {
        before
            .iter()
            .flatten()
            .fold(0u64, |t, a| t.saturating_add(*a))
            .min(limit)
    };
    // What the reachable regions hold now, an unconfirmed one counted at
    // the most it may hold.
    let holding = before
        .iter()
        .zip(held)
        .fold(0u64, |t, (b, h)| match (b, h) {
            (Some(b), None) => t.saturating_add(*b),
            (Some(_), Some(h)) => t.saturating_add(*h),
            (None, _) => t,
        });
    let mut free = total.saturating_sub(holding);
    before
        .iter()
        .zip(held)
        .zip(targets)
        .map(|((b, h), t)| match (b, h, t) {
            (Some(_), Some(h), Some(t)) if t > h && free > 0 => {
                let up = (t - h).min(free);
                free -= up;
                Some(h + up)
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seen(alloc: u64, used: u64, demand: f64) -> Option<Seen> {
        Some(Seen {
            alloc,
            used,
            demand,
        })
    }

    #[test]
    fn targets_follow_the_demand_and_add_up_to_the_limit() {
        let t = targets(300, &[seen(150, 0, 9.0), seen(150, 0, 1.0)]).unwrap();
        assert_eq!(t, [Some(270), Some(30)]);
        // What a region admitted stays its own.
        let t = targets(300, &[seen(150, 100, 1.0), seen(150, 0, 9.0)]).unwrap();
        assert_eq!(t, [Some(100), Some(200)]);
        // Every unit given: 100 in three equal shares.
        let t = targets(100, &[seen(33, 0, 1.0), seen(33, 0, 1.0), seen(33, 0, 1.0)]).unwrap();
        assert_eq!(t.iter().flatten().sum::<u64>(), 100);
        // No demand: nothing to go by.
        assert_eq!(targets(300, &[seen(150, 0, 0.0), seen(150, 0, 0.0)]), None);
        assert_eq!(targets(300, &[None, None]), None);
    }

    #[test]
    fn a_cut_off_region_keeps_its_share_and_nobody_is_given_it() {
        let t = targets(300, &[seen(100, 0, 1.0), None, seen(50, 0, 9.0)]).unwrap();
        assert_eq!(t, [Some(15), None, Some(135)]);
        let r = raises(
            300,
            &[Some(100), None, Some(50)],
            &[Some(15), None, Some(50)],
            &t,
        );
        assert_eq!(r, [None, None, Some(135)]);
    }

    #[test]
    fn a_lowering_not_confirmed_frees_nothing() {
        let t = [Some(30), Some(270)];
        // The first region's lowering was not confirmed: it may still
        // hold 270; nothing can be raised.
        assert_eq!(
            raises(300, &[Some(270), Some(30)], &[None, Some(30)], &t),
            [None, None]
        );
        // Lowered to 120 only (it had admitted 120 by then).
        assert_eq!(
            raises(300, &[Some(270), Some(30)], &[Some(120), Some(30)], &t),
            [None, Some(180)]
        );
    }

    #[test]
    fn a_lowering_keeps_what_was_admitted() {
        assert_eq!(lowered(270, 30, 0), 30);
        assert_eq!(lowered(270, 30, 120), 120);
        assert_eq!(lowered(100, 30, 120), 100);
        assert_eq!(lowered(100, 200, 0), 100);
    }

    #[test]
    fn demand_is_smoothed_over_its_time_constant() {
        assert_eq!(demand_rate(None, 500, 1_000, 10_000), 0.0);
        let last = DemandSeen {
            total: 0,
            at_ms: 0,
            rate: 0.0,
        };
        // 100 hits in a second: 100/s at once without smoothing.
        assert!((demand_rate(Some(last), 100, 1_000, 0) - 100.0).abs() < 1e-9);
        // With a 1 s time constant, 1 - 1/e of it.
        let r = demand_rate(Some(last), 100, 1_000, 1_000);
        assert!((r - 100.0 * (1.0 - (-1.0f64).exp())).abs() < 1e-9);
        // Counts that went back (a flushed Redis): the last rate kept.
        let last = DemandSeen {
            total: 500,
            at_ms: 0,
            rate: 7.0,
        };
        assert_eq!(demand_rate(Some(last), 10, 1_000, 1_000), 7.0);
    }

    /// One region in the simulation: what its Redis holds.
    #[derive(Clone, Debug)]
    struct Region {
        alloc: u64,
        count: u64,
        reachable: bool,
    }

    /// A region's counter admitting `hits` against its allocation, as the
    /// script does.
    fn admit(r: &mut Region, hits: u64) {
        if r.count + hits <= r.alloc {
            r.count += hits;
        }
    }

    fn check(limit: u64, regions: &[Region]) -> Result<(), TestCaseError> {
        let sum: u64 = regions.iter().map(|r| r.alloc).sum();
        prop_assert!(
            sum <= limit,
            "allocations {sum} > limit {limit}: {regions:?}"
        );
        for r in regions {
            prop_assert!(
                r.count <= r.alloc,
                "count above its allocation: {regions:?}"
            );
        }
        let admitted: u64 = regions.iter().map(|r| r.count).sum();
        prop_assert!(admitted <= limit);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Rounds of the rebalancer over random demand, admissions between
        /// its reads and its writes, windows that turn, regions cut off and
        /// back: the allocations never add up past the limit, no region
        /// counts past its allocation, no lowering goes below what was
        /// admitted.
        #[test]
        fn the_allocations_never_add_up_past_the_limit(
            limit in 0u64..2_000,
            n in 1usize..5,
            rounds in proptest::collection::vec(
                (
                    proptest::collection::vec((0u64..50, 0.0f64..100.0, any::<bool>(), 0u64..60), 5),
                    any::<bool>(),
                ),
                1..30,
            ),
        ) {
            let mut regions: Vec<Region> = (0..n)
                .map(|_| Region { alloc: super::super::floor_of(limit, n as u64), count: 0, reachable: true })
                .collect();
            check(limit, &regions)?;
            for (per_region, new_window) in rounds {
                if new_window {
                    for r in &mut regions {
                        r.count = 0;
                    }
                }
                for (r, (hits, _, cut, _)) in regions.iter_mut().zip(&per_region) {
                    r.reachable = !*cut || n == 1;
                    admit(r, *hits);
                }
                check(limit, &regions)?;
                // Read.
                let read: Vec<Option<Seen>> = regions
                    .iter()
                    .zip(&per_region)
                    .map(|(r, (_, demand, _, _))| {
                        r.reachable.then_some(Seen { alloc: r.alloc, used: r.count, demand: *demand })
                    })
                    .collect();
                let Some(t) = targets(limit, &read) else { continue };
                let total_reachable: u64 = read.iter().flatten().map(|s| s.alloc).sum();
                prop_assert!(t.iter().flatten().sum::<u64>() <= limit);
                if read.iter().any(Option::is_none) {
                    prop_assert!(t.iter().flatten().sum::<u64>() <= total_reachable);
                }
                for (s, t) in read.iter().zip(&t) {
                    if let (Some(s), Some(t)) = (s, t) {
                        prop_assert!(*t >= s.used);
                    }
                }
                // Admissions between the read and the writes.
                for (r, (_, _, _, late)) in regions.iter_mut().zip(&per_region) {
                    admit(r, *late);
                }
                // The lowerings, atomically with the counts; a few lost.
                let before: Vec<Option<u64>> = read.iter().map(|s| s.map(|s| s.alloc)).collect();
                let mut held: Vec<Option<u64>> = before.clone();
                for (i, r) in regions.iter_mut().enumerate() {
                    if let (Some(b), Some(Some(tt))) = (before[i], t.get(i)) {
                        if *tt < b {
                            let was = r.count;
                            r.alloc = lowered(r.alloc, *tt, r.count);
                            prop_assert!(r.alloc >= was);
                            // Every third lowering's answer lost: written, not confirmed.
                            held[i] = if (i + r.alloc as usize) % 3 == 0 { None } else { Some(r.alloc) };
                        }
                    }
                }
                check(limit, &regions)?;
                for r in &mut regions {
                    admit(r, 1);
                }
                for (i, up) in raises(limit, &before, &held, &t).into_iter().enumerate() {
                    if let Some(up) = up {
                        regions[i].alloc = up;
                    }
                }
                check(limit, &regions)?;
            }
        }
    }
}

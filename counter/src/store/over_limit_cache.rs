//! The over-limit cache: in front of a Redis store, the keys this process
//! saw full, so that a request one of them refuses is refused without a
//! script call (docs/counter.md#the-over-limit-cache).

use std::collections::HashMap;
use std::sync::Mutex;

use ratelimit_config::window::sliding_wait_ms;

use crate::decide::{estimate, over, Check, Counts, Decision, Request};

/// The most keys the over-limit cache remembers.
pub const ENTRIES: usize = 65_536;

/// The longest an entry is believed: after it, the store is asked again
/// (and the entry learned again if the key is still full). A count the
/// store lost (a FLUSHALL, a failover to a replica that had not received
/// it) is refused from the cache at most this long.
pub const MAX_AGE_MS: u64 = 1_000;

/// The over-limit cache: keys this process saw full (not even one more hit
/// fits), with the counts it saw, until the window ends (a sliding
/// window's: until its estimate admits one more), and at most
/// [`MAX_AGE_MS`]. A count never falls inside its window in a store that
/// keeps it, so a request that one of these counts refuses is refused
/// without asking the store: the same decision, nothing counted. An entry
/// is dropped as soon as the store answers a count under the limit for
/// its key. Bounded: past `capacity`, expired entries go, then arbitrary
/// ones.
#[derive(Debug)]
pub struct OverLimitCache {
    entries: Mutex<HashMap<String, (Counts, u64)>>,
    capacity: usize,
}

impl OverLimitCache {
    pub fn new(capacity: usize) -> OverLimitCache {
        OverLimitCache {
            entries: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Counts, u64)>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Per request, its decision when the cache refuses it (the counts it
    /// is refused on; a check of a key not remembered: 0), else None.
    pub fn refuse(&self, requests: &[Request], now_ms: u64) -> Vec<Option<Decision>> {
        let m = self.lock();
        if m.is_empty() {
            return vec![None; requests.len()];
        }
        let seen = |key: &str| match m.get(key) {
            Some(&(n, until)) if until > now_ms => Some(n),
            _ => None,
        };
        requests
            .iter()
            .map(|r| {
                // A push is counted whatever the counts: never refused.
                let refused = !r.push
                    && r.checks
                        .iter()
                        .any(|c| seen(&c.key).is_some_and(|n| over(c, n)));
                refused.then(|| Decision {
                    counts: r
                        .checks
                        .iter()
                        .map(|c| seen(&c.key).unwrap_or_default())
                        .collect(),
                    admitted: false,
                    failed: false,
                    allocations: Vec::new(),
                })
            })
            .collect()
    }

    /// Remembers the keys the store's answer shows full: each request's
    /// counts, with its hits when admitted. A request with a full key has
    /// its other keys' counts remembered too (what the cache's refusals
    /// report for them). A key the store answers under its limit is
    /// forgotten (the store lost its count, or it was never full for that
    /// limit).
    pub fn learn<'a>(
        &self,
        decided: impl IntoIterator<Item = (&'a Request, &'a Decision)>,
        now_ms: u64,
    ) {
        let mut m: Option<std::sync::MutexGuard<'_, _>> = None;
        for (r, d) in decided {
            if d.failed {
                continue;
            }
            let (counts, ok) = (&d.counts, d.admitted);
            let after = |c: &Check, n: Counts| Counts {
                current: n.current.saturating_add(if ok { c.key_hits } else { 0 }),
                previous: n.previous,
            };
            let full = r
                .checks
                .iter()
                .zip(counts)
                .any(|(c, &n)| estimate(c, after(c, n)) >= c.limit);
            let m = m.get_or_insert_with(|| self.lock());
            if !full {
                if !m.is_empty() {
                    for c in &r.checks {
                        m.remove(&c.key);
                    }
                }
                continue;
            }
            for (c, &n) in r.checks.iter().zip(counts) {
                let n = after(c, n);
                let until = if c.sliding {
                    let wait = sliding_wait_ms(
                        c.limit, 1, n.previous, n.current, c.window, c.next_end, now_ms,
                    )
                    .unwrap_or(c.next_end.saturating_sub(now_ms));
                    now_ms.saturating_add(wait)
                } else {
                    c.window.1
                }
                .min(now_ms.saturating_add(MAX_AGE_MS));
                if until <= now_ms {
                    continue;
                }
                if m.len() >= self.capacity && !m.contains_key(&c.key) {
                    m.retain(|_, (_, u)| *u > now_ms);
                    if m.len() >= self.capacity {
                        let drop: Vec<String> =
                            m.keys().take(self.capacity / 8 + 1).cloned().collect();
                        for k in drop {
                            m.remove(&k);
                        }
                    }
                }
                let e = m.entry(c.key.clone()).or_insert((n, until));
                e.0.current = e.0.current.max(n.current);
                e.0.previous = e.0.previous.max(n.previous);
                e.1 = e.1.max(until);
            }
        }
    }

    /// Drops the entries that have expired.
    pub fn sweep(&self, now_ms: u64) {
        self.lock().retain(|_, (_, u)| *u > now_ms);
    }

    /// How many keys it remembers.
    #[cfg(test)]
    pub fn remembered(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::minute_check;

    #[test]
    fn the_over_limit_cache_stays_within_its_bound_under_a_flood_of_keys() {
        let cache = OverLimitCache::new(100);
        let admitted = Decision {
            counts: vec![Counts::default()],
            admitted: true,
            failed: false,
            allocations: Vec::new(),
        };
        for i in 0..10_000 {
            let r = Request {
                checks: vec![minute_check(&format!("k{i}"), 1)],
                ..Request::default()
            };
            cache.learn([(&r, &admitted)], 1_000);
            assert!(cache.remembered() <= 100);
        }
        // A full key refuses for MAX_AGE_MS (inside its window), then no
        // longer: the store is asked again.
        let r = Request {
            checks: vec![minute_check("k9999", 1)],
            ..Request::default()
        };
        let aged = 1_000 + MAX_AGE_MS;
        assert!(cache.refuse(std::slice::from_ref(&r), aged - 1)[0].is_some());
        assert!(cache.refuse(std::slice::from_ref(&r), aged)[0].is_none());
        cache.sweep(aged);
        assert_eq!(cache.remembered(), 0);
    }

    #[test]
    fn an_entry_is_dropped_when_the_store_answers_its_key_under_the_limit() {
        let cache = OverLimitCache::new(100);
        let r = Request {
            checks: vec![minute_check("k", 2)],
            ..Request::default()
        };
        let full = Decision {
            counts: vec![Counts {
                current: 1,
                previous: 0,
            }],
            admitted: true,
            failed: false,
            allocations: Vec::new(),
        };
        cache.learn([(&r, &full)], 1_000);
        assert!(cache.refuse(std::slice::from_ref(&r), 1_001)[0].is_some());
        // The store lost the count (a FLUSHALL): its next answer for the
        // key is under the limit, and the entry goes.
        let fresh = Decision {
            counts: vec![Counts::default()],
            admitted: true,
            failed: false,
            allocations: Vec::new(),
        };
        cache.learn([(&r, &fresh)], 1_002);
        assert_eq!(cache.remembered(), 0);
        assert!(cache.refuse(std::slice::from_ref(&r), 1_003)[0].is_none());
    }
}

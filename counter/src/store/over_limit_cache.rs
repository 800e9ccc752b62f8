//! The over-limit cache: in front of a Redis store, the keys this process
//! saw full, so that a request one of them refuses is refused without a
//! script call (docs/counter.md#the-over-limit-cache).

use std::collections::HashMap;
use std::sync::Mutex;

use ratelimit_config::window::sliding_wait_ms;

use crate::decide::{estimate, over, Check, Counts, Decision, Request};

/// The most keys the over-limit cache remembers.
pub const ENTRIES: usize = 65_536;

/// The over-limit cache: keys this process saw full (not even one more hit
/// fits), with the counts it saw, until the window ends (a sliding
/// window's: until its estimate admits one more). A count never falls
/// inside its window, so a request that one of these counts refuses is
/// refused without asking the store: the same decision, nothing counted.
/// Bounded: past `capacity`, expired entries go, then arbitrary ones.
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
                })
            })
            .collect()
    }

    /// Remembers the keys the store's answer shows full: each request's
    /// counts, with its hits when admitted. A request with a full key has
    /// its other keys' counts remembered too (what the cache's refusals
    /// report for them).
    pub fn learn<'a>(
        &self,
        decided: impl IntoIterator<Item = (&'a Request, &'a Decision)>,
        now_ms: u64,
    ) {
        let mut m: Option<std::sync::MutexGuard<'_, _>> = None;
        for (r, d) in decided {
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
            if !full {
                continue;
            }
            let m = m.get_or_insert_with(|| self.lock());
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
                };
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
        };
        for i in 0..10_000 {
            let r = Request {
                checks: vec![minute_check(&format!("k{i}"), 1)],
                ..Request::default()
            };
            cache.learn([(&r, &admitted)], 1_000);
            assert!(cache.remembered() <= 100);
        }
        // A full key refuses until its window ends, then no longer.
        let r = Request {
            checks: vec![minute_check("k9999", 1)],
            ..Request::default()
        };
        assert!(cache.refuse(std::slice::from_ref(&r), 59_999)[0].is_some());
        assert!(cache.refuse(std::slice::from_ref(&r), 60_000)[0].is_none());
        cache.sweep(60_000);
        assert_eq!(cache.remembered(), 0);
    }
}

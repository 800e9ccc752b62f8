//! The memory store: counts in this process, bounded in keys. A restart
//! forgets every count.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::decide::{admits, Counts, Decision, Request};

use super::{Deciding, Pending, Storage, StoreError};

/// The default bound: about 28 MB at the bytes per key measured (see
/// docs/counter.md#the-memory-store).
pub const DEFAULT_MAX_KEYS: usize = 200_000;

/// How long between two sweeps forced by a full store, so that a flood
/// of new keys into a full store does not sweep on every call.
const FULL_SWEEP_EVERY_MS: u64 = 1_000;

pub struct MemoryStore {
    counts: Mutex<MemoryCounts>,
    max_keys: usize,
    /// Calls refused because they would have added keys past the bound.
    full: AtomicU64,
    last_full_sweep_ms: AtomicU64,
}

impl MemoryStore {
    pub fn new(max_keys: usize) -> MemoryStore {
        MemoryStore {
            counts: Mutex::new(MemoryCounts::default()),
            max_keys: max_keys.max(1),
            full: AtomicU64::new(0),
            last_full_sweep_ms: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryCounts> {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Decides every request in order. A call that would take the store
    /// past its bound in new keys (after expired counts are dropped) is
    /// refused whole, before anything is counted: it fails as the store
    /// failing (the filter fails open, or denies with failure_mode_deny),
    /// and is counted in `trl_counter_memory_full_total`. Keys already
    /// held keep counting exactly.
    pub fn decide_now(
        &self,
        requests: &[Request],
        now_ms: u64,
    ) -> Result<Vec<Decision>, StoreError> {
        let mut m = self.lock();
        if m.held() + self.new_keys(&m, requests) > self.max_keys {
            let last = self.last_full_sweep_ms.load(Ordering::Relaxed);
            if now_ms >= last.saturating_add(FULL_SWEEP_EVERY_MS) {
                self.last_full_sweep_ms.store(now_ms, Ordering::Relaxed);
                m.sweep(now_ms);
            }
            if m.held() + self.new_keys(&m, requests) > self.max_keys {
                self.full.fetch_add(1, Ordering::Relaxed);
                return Err(StoreError::Full(self.max_keys));
            }
        }
        Ok(requests.iter().map(|r| m.apply(r, now_ms)).collect())
    }

    /// The distinct keys the requests would add (if all were admitted).
    fn new_keys(&self, m: &MemoryCounts, requests: &[Request]) -> usize {
        let mut new: Option<HashSet<&str>> = None;
        for c in requests
            .iter()
            .flat_map(|r| &r.checks)
            .filter(|c| c.hits > 0)
        {
            if !m.holds(&c.key) {
                new.get_or_insert_with(HashSet::new).insert(&c.key);
            }
        }
        new.map_or(0, |n| n.len())
    }
}

impl Storage for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn decide<'a>(&'a self, requests: &'a [Request], now_ms: u64) -> Deciding<'a> {
        Box::pin(std::future::ready(self.decide_now(requests, now_ms)))
    }

    fn ping(&self) -> Pending<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn sweep(&self, now_ms: u64) {
        self.lock().sweep(now_ms);
    }

    #[cfg(test)]
    fn value<'a>(&'a self, key: &'a str, now_ms: u64) -> Pending<'a, Result<u64, StoreError>> {
        Box::pin(std::future::ready(Ok(self.lock().value(key, now_ms))))
    }

    /// Its gauges and counters, in Prometheus text.
    fn metrics(&self) -> String {
        let mut registry = Registry::default();
        registry.register(
            "trl_counter_memory_keys",
            "Keys the memory store holds (expired ones not yet swept included)",
            ConstGauge::new(self.lock().held()),
        );
        registry.register(
            "trl_counter_memory_max_keys",
            "The most keys the memory store holds (--memory-max-keys)",
            ConstGauge::new(self.max_keys),
        );
        registry.register(
            "trl_counter_memory_full",
            "Calls refused because they would have taken the memory store past --memory-max-keys",
            ConstCounter::new(self.full.load(Ordering::Relaxed)),
        );
        super::metrics_text(&registry)
    }
}

/// The in-process store: counts per key with the instant they expire.
#[derive(Debug, Default)]
pub struct MemoryCounts {
    counts: HashMap<String, (u64, u64)>,
}

impl MemoryCounts {
    fn get(&self, key: &str, now_ms: u64) -> u64 {
        match self.counts.get(key) {
            Some(&(n, expires)) if expires > now_ms => n,
            _ => 0,
        }
    }

    /// Decides one request and adds its hits when it is admitted.
    pub fn apply(&mut self, r: &Request, now_ms: u64) -> Decision {
        let counts: Vec<Counts> = r
            .checks
            .iter()
            .map(|c| Counts {
                current: self.get(&c.key, now_ms),
                previous: c.prev_key.as_deref().map_or(0, |k| self.get(k, now_ms)),
            })
            .collect();
        let admitted = admits(r, &counts);
        if admitted {
            for c in r.checks.iter().filter(|c| c.hits > 0) {
                let e = self
                    .counts
                    .entry(c.key.clone())
                    .or_insert((0, now_ms.saturating_add(c.ttl_ms)));
                if e.1 <= now_ms {
                    *e = (0, now_ms.saturating_add(c.ttl_ms));
                }
                e.0 = e.0.saturating_add(c.hits);
            }
        }
        Decision {
            counts,
            admitted,
            failed: false,
            allocations: Vec::new(),
        }
    }

    /// Drops the counters that have expired.
    pub fn sweep(&mut self, now_ms: u64) {
        self.counts.retain(|_, (_, expires)| *expires > now_ms);
    }

    /// How many counters it holds (expired ones not yet swept included).
    pub fn held(&self) -> usize {
        self.counts.len()
    }

    /// Whether it holds a counter (maybe expired) for `key`.
    pub fn holds(&self, key: &str) -> bool {
        self.counts.contains_key(key)
    }

    /// A counter's value.
    pub fn value(&self, key: &str, now_ms: u64) -> u64 {
        self.get(key, now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::minute_check;

    fn request(key: &str) -> Request {
        Request {
            checks: vec![minute_check(key, 10)],
            ..Request::default()
        }
    }

    #[test]
    fn a_full_store_refuses_new_keys_whole_counts_held_ones_and_frees_expired_ones() {
        let s = MemoryStore::new(3);
        for k in ["a", "b", "c"] {
            assert!(s.decide_now(&[request(k)], 1_000).is_ok());
        }
        // A call with one held key and one new one: refused whole,
        // nothing counted.
        let e = s
            .decide_now(&[request("a"), request("d")], 1_000)
            .unwrap_err();
        assert!(matches!(e, StoreError::Full(3)), "{e}");
        assert!(e.to_string().contains("--memory-max-keys"), "{e}");
        let decided = s.decide_now(&[request("a")], 1_000).unwrap();
        assert_eq!(
            decided[0].counts[0].current, 1,
            "the refused call counted nothing"
        );
        assert!(decided[0].admitted);
        assert!(s.metrics().contains("trl_counter_memory_full_total 1\n"));
        assert!(s.metrics().contains("trl_counter_memory_keys 3\n"));
        // Once the counts have expired, new keys take their place.
        assert!(s.decide_now(&[request("d")], 61_000).is_ok());
        assert!(s.metrics().contains("trl_counter_memory_keys 1\n"));
    }

    /// Not a test of behaviour: prints the memory a key takes, for the
    /// docs. `cargo test -p ratelimit-counter -- --ignored
    /// --nocapture bytes_per_key`.
    #[test]
    #[ignore = "a measurement"]
    fn bytes_per_key() {
        fn rss_kb() -> u64 {
            std::fs::read_to_string("/proc/self/status")
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap()
        }
        let n = 200_000;
        let s = MemoryStore::new(n);
        let before = rss_kb();
        for i in 0..n {
            // A key as the counter builds it: domain, unit, tenant, window.
            let key =
                format!("trl:{{19:internal-api-orders:tenant-{i:08}}}:per_hour:1764921600000");
            s.decide_now(&[request(&key)], 1_000).unwrap();
        }
        let after = rss_kb();
        println!(
            "{} bytes per key ({n} keys)",
            (after - before) * 1024 / n as u64
        );
    }
}

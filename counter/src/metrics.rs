//! The counter's Prometheus metrics: counted here (atomics, and maps under
//! a lock that copy a name only the first time it is seen), written at each
//! scrape by prometheus-client in the Prometheus text format. A new counter
//! is an `AtomicU64` field and a line in [`COUNTERS`] (or a `GroupCounts`
//! field and a line in [`GROUP_COUNTERS`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use ratelimit_counter::store::metrics_text;

/// Upper bounds of the store latency histogram, in microseconds.
const BUCKETS_US: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// One group's request counts (a call's, or since the start).
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupCounts {
    pub admitted: u64,
    pub refused: u64,
    pub near_limit: u64,
    pub shadow_refused: u64,
    /// Hits pushes counted past a limit (`decide::Outcome::overshoot`).
    pub overshoot_hits: u64,
}

impl GroupCounts {
    /// Counts one request.
    pub fn add(&mut self, o: &crate::decide::Outcome) {
        match (o.admitted, o.shadow) {
            (true, _) => self.admitted += 1,
            (false, true) => self.shadow_refused += 1,
            (false, false) => self.refused += 1,
        }
        if o.near_limit {
            self.near_limit += 1;
        }
        self.overshoot_hits = self.overshoot_hits.saturating_add(o.overshoot);
    }

    fn merge(&mut self, o: &GroupCounts) {
        self.admitted += o.admitted;
        self.refused += o.refused;
        self.near_limit += o.near_limit;
        self.shadow_refused += o.shadow_refused;
        self.overshoot_hits = self.overshoot_hits.saturating_add(o.overshoot_hits);
    }
}

pub struct Metrics {
    /// Per domain, per group.
    groups: Mutex<BTreeMap<String, BTreeMap<String, GroupCounts>>>,
    reloads: Mutex<BTreeMap<(String, &'static str), u64>>,
    store_seconds: Histogram,
    pub store_errors: AtomicU64,
    pub bad_calls: AtomicU64,
    pub calls: AtomicU64,
    pub cache_refused: AtomicU64,
    pub tls_handshakes_failed: AtomicU64,
    /// Limits and faults.
    pub limits: LimitMetrics,
    /// Requests failed alone because a key of theirs holds something else
    /// than a count (store/script.lua).
    pub store_bad_values: AtomicU64,
    /// Writes of the fleet's Envoys to the store that failed (`fleet`).
    pub fleet_sync_failed: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            groups: Mutex::default(),
            reloads: Mutex::default(),
            store_seconds: Histogram::new(BUCKETS_US.map(|us| us as f64 / 1e6)),
            store_errors: AtomicU64::default(),
            bad_calls: AtomicU64::default(),
            calls: AtomicU64::default(),
            cache_refused: AtomicU64::default(),
            tls_handshakes_failed: AtomicU64::default(),
            limits: LimitMetrics::default(),
            store_bad_values: AtomicU64::default(),
            fleet_sync_failed: AtomicU64::default(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Metrics {
    /// Adds a call's counts per group, under one lock; names are copied
    /// only the first time they are seen.
    pub fn requests<'a>(
        &self,
        domain: &str,
        counts: impl IntoIterator<Item = (&'a str, GroupCounts)>,
    ) {
        let mut g = lock(&self.groups);
        let d = match g.get_mut(domain) {
            Some(d) => d,
            None => g.entry(domain.to_string()).or_default(),
        };
        for (group, c) in counts {
            match d.get_mut(group) {
                Some(t) => t.merge(&c),
                None => {
                    d.insert(group.to_string(), c);
                }
            }
        }
    }

    pub fn reload(&self, domain: &str, result: &'static str) {
        *lock(&self.reloads)
            .entry((domain.to_string(), result))
            .or_default() += 1;
    }

    pub fn latency(&self, us: u64) {
        self.store_seconds.observe(us as f64 / 1e6);
    }

    /// The page, in the Prometheus text format (0.0.4), written by
    /// prometheus-client from a registry of this scrape's values.
    /// The page; `fleet`: each domain's fleet size (`fleet::Fleet::sizes`).
    pub fn render(&self, store: &str, fleet: &[(String, u32)]) -> String {
        let mut registry = Registry::default();
        let groups = lock(&self.groups).clone();
        for (name, help, get) in GROUP_COUNTERS {
            let family = Family::<[(&'static str, String); 2], Counter>::default();
            for (d, g, c) in groups
                .iter()
                .flat_map(|(d, gs)| gs.iter().map(move |(g, c)| (d, g, c)))
            {
                family
                    .get_or_create(&[("domain", d.clone()), ("group", g.clone())])
                    .inc_by(get(c));
            }
            registry.register(name, help, family);
        }
        let reloads = Family::<[(&'static str, String); 2], Counter>::default();
        for ((d, r), n) in lock(&self.reloads).iter() {
            reloads
                .get_or_create(&[("domain", d.clone()), ("result", r.to_string())])
                .inc_by(*n);
        }
        registry.register(
            "trl_counter_reloads",
            "Team file loads, by result (ok, failed: the last good one kept)",
            reloads,
        );
        registry
            .sub_registry_with_label(("store".into(), store.to_string().into()))
            .register(
                "trl_counter_store_seconds",
                "Time of one call's store work (the script calls)",
                self.store_seconds.clone(),
            );
        for (name, help, get) in COUNTERS {
            registry.register(
                name,
                help,
                ConstCounter::new(get(self).load(Ordering::Relaxed)),
            );
        }
        registry.register(
            "trl_counter_store_down",
            "1 while the store's connection is known down (calls fail at once; it is retried in the background)",
            ConstGauge::new(self.limits.store_down.load(Ordering::Relaxed) as i64),
        );
        let sizes = Family::<[(&'static str, String); 1], Gauge>::default();
        for (d, n) in fleet {
            sizes
                .get_or_create(&[("domain", d.clone())])
                .set(i64::from(*n));
        }
        registry.register(
            "trl_counter_fleet_envoys",
            "Envoys that called for the domain within --fleet-interval-ms (all replicas', with a Redis store): the fleet size the counter answers",
            sizes,
        );
        metrics_text(&registry)
    }
}

/// The per-group counters: name (prometheus-client appends `_total`),
/// help (it appends the period), the count.
type GroupCounter = (&'static str, &'static str, fn(&GroupCounts) -> u64);
const GROUP_COUNTERS: [GroupCounter; 5] = [
    ("trl_counter_admitted", "Requests admitted", |c| c.admitted),
    (
        "trl_counter_refused",
        "Requests refused (nothing counted)",
        |c| c.refused,
    ),
    (
        "trl_counter_near_limit",
        "Admitted requests that left at most a fifth of a window's limit",
        |c| c.near_limit,
    ),
    (
        "trl_counter_shadow_refused",
        "Requests of shadow groups that were over a limit",
        |c| c.shadow_refused,
    ),
    (
        "trl_counter_overshoot_hits",
        "Hits of sync pushes counted past a limit: per push, the most of its windows by which its hits took the count past the limit (0 in exact and lease modes)",
        |c| c.overshoot_hits,
    ),
];

/// The counters without labels, as [`GROUP_COUNTERS`].
type PlainCounter = (&'static str, &'static str, fn(&Metrics) -> &AtomicU64);
const COUNTERS: [PlainCounter; 11] = [
    (
        "trl_counter_store_errors",
        "Calls the store failed (Redis down, slow past the deadline, or an error)",
        |m| &m.store_errors,
    ),
    (
        "trl_counter_bad_calls",
        "Calls refused as malformed or oversized",
        |m| &m.bad_calls,
    ),
    ("trl_counter_calls", "ShouldRateLimit calls", |m| &m.calls),
    (
        "trl_counter_cache_refused",
        "Requests refused from the over-limit cache, without asking the store",
        |m| &m.cache_refused,
    ),
    (
        "trl_counter_tls_handshakes_failed",
        "gRPC connections refused in the TLS handshake (no client certificate, one the client CA did not sign, a name not allowed, or no handshake within 10 s)",
        |m| &m.tls_handshakes_failed,
    ),
    (
        "trl_counter_hits_refused",
        "Calls refused (INVALID_ARGUMENT) for hits over the counter's bounds",
        |m| &m.limits.hits_refused,
    ),
    (
        "trl_counter_tenant_too_long",
        "Calls refused (INVALID_ARGUMENT) for a tenant longer than --max-tenant-length",
        |m| &m.limits.tenant_too_long,
    ),
    (
        "trl_counter_bytes_refused",
        "gRPC calls refused (RESOURCE_EXHAUSTED) because their connection or the counter held its most unfinished message bytes",
        |m| &m.limits.bytes_refused,
    ),
    (
        "trl_counter_store_fast_failed",
        "Calls answered UNAVAILABLE at once while the store's connection was known down",
        |m| &m.limits.store_fast_failed,
    ),
    (
        "trl_counter_store_bad_values",
        "Requests failed alone (nothing counted) because a Redis key of theirs holds something else than a count",
        |m| &m.store_bad_values,
    ),
    (
        "trl_counter_fleet_sync_failed",
        "Writes of the Envoys this replica heard to the store (once a second) that failed; the fleet size is then this replica's own count",
        |m| &m.fleet_sync_failed,
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The names, labels and types docs/counter.md lists, as a scraper
    /// reads them (the text format's `_total` on counters included).
    #[test]
    fn the_page_names_what_the_docs_list() {
        let m = Metrics::default();
        let outcome = |admitted| crate::decide::Outcome {
            group: 0,
            admitted,
            shadow: false,
            near_limit: false,
            overshoot: 0,
            failed: false,
        };
        let mut counts = GroupCounts::default();
        counts.add(&outcome(true));
        counts.add(&outcome(false));
        m.requests("d\"1", [("g", counts)]);
        m.reload("d\"1", "ok");
        m.latency(300);
        m.calls.fetch_add(2, Ordering::Relaxed);
        let page = m.render("memory", &[("d\"1".into(), 6)]);
        for line in [
            "# TYPE trl_counter_admitted_total counter",
            "trl_counter_admitted_total{domain=\"d\\\"1\",group=\"g\"} 1",
            "trl_counter_refused_total{domain=\"d\\\"1\",group=\"g\"} 1",
            "trl_counter_overshoot_hits_total{domain=\"d\\\"1\",group=\"g\"} 0",
            "trl_counter_reloads_total{domain=\"d\\\"1\",result=\"ok\"} 1",
            "# TYPE trl_counter_store_seconds histogram",
            "trl_counter_store_seconds_bucket{store=\"memory\",le=\"0.00025\"} 0",
            "trl_counter_store_seconds_bucket{store=\"memory\",le=\"0.0005\"} 1",
            "trl_counter_store_seconds_count{store=\"memory\"} 1",
            "# HELP trl_counter_calls_total ShouldRateLimit calls.",
            "# TYPE trl_counter_calls_total counter",
            "trl_counter_calls_total 2",
            "trl_counter_tls_handshakes_failed_total 0",
            "trl_counter_hits_refused_total 0",
            "trl_counter_store_fast_failed_total 0",
            "# TYPE trl_counter_store_down gauge",
            "trl_counter_store_down 0",
            "# TYPE trl_counter_fleet_envoys gauge",
            "trl_counter_fleet_envoys{domain=\"d\\\"1\"} 6",
            "trl_counter_fleet_sync_failed_total 0",
        ] {
            assert!(page.lines().any(|l| l == line), "{line} not in\n{page}");
        }
        assert!(!page.contains("# EOF"), "{page}");
    }
}

// Limits and faults: what the counter refused to hold, and the store's
// fast failures (in [`COUNTERS`], and the `trl_counter_store_down` gauge).

/// What the bounds, the connection limits and the store's fail-fast refused.
#[derive(Default)]
pub struct LimitMetrics {
    /// Calls refused for hits over the bounds (`bounds::MAX_HITS_*`).
    pub hits_refused: AtomicU64,
    /// Calls refused for a tenant over `--max-tenant-length`.
    pub tenant_too_long: AtomicU64,
    /// gRPC calls refused because their connection (or the counter) held
    /// its most message bytes.
    pub bytes_refused: AtomicU64,
    /// Calls answered UNAVAILABLE at once, the store's connection known down.
    pub store_fast_failed: AtomicU64,
    /// 1 while the store's connection is known down, else 0.
    pub store_down: AtomicU64,
}

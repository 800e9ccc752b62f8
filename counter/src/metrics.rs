//! The counter's Prometheus metrics, written in the text format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

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

#[derive(Default)]
pub struct Metrics {
    /// Per domain, per group.
    groups: Mutex<BTreeMap<String, BTreeMap<String, GroupCounts>>>,
    reloads: Mutex<BTreeMap<(String, &'static str), u64>>,
    buckets: [AtomicU64; BUCKETS_US.len()],
    latency_count: AtomicU64,
    latency_sum_us: AtomicU64,
    pub store_errors: AtomicU64,
    pub bad_calls: AtomicU64,
    pub calls: AtomicU64,
    pub cache_refused: AtomicU64,
    pub tls_handshakes_failed: AtomicU64,
    // --- The store's faults, per request (store/script.lua) ---
    /// Requests failed alone because a key of theirs holds something else
    /// than a count.
    pub store_bad_values: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A label value, escaped as the text format wants.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
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
        for (b, bound) in self.buckets.iter().zip(BUCKETS_US) {
            if us <= bound {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us.fetch_add(us, Ordering::Relaxed);
    }

    pub fn render(&self, store: &str) -> String {
        let mut out = String::new();
        let groups = lock(&self.groups).clone();
        for (name, help, get) in [
            (
                "admitted",
                "Requests admitted.",
                (|c: &GroupCounts| c.admitted) as fn(&GroupCounts) -> u64,
            ),
            ("refused", "Requests refused (nothing counted).", |c| {
                c.refused
            }),
            (
                "near_limit",
                "Admitted requests that left at most a fifth of a window's limit.",
                |c| c.near_limit,
            ),
            (
                "shadow_refused",
                "Requests of shadow groups that were over a limit.",
                |c| c.shadow_refused,
            ),
            (
                "overshoot_hits",
                "Hits of sync pushes counted past a limit: per push, the most of its windows by which its hits took the count past the limit (0 in exact and lease modes).",
                |c| c.overshoot_hits,
            ),
        ] {
            let _ = writeln!(out, "# HELP trl_counter_{name}_total {help}");
            let _ = writeln!(out, "# TYPE trl_counter_{name}_total counter");
            for (d, g, c) in groups
                .iter()
                .flat_map(|(d, gs)| gs.iter().map(move |(g, c)| (d, g, c)))
            {
                let _ = writeln!(
                    out,
                    "trl_counter_{name}_total{{domain=\"{}\",group=\"{}\"}} {}",
                    label(d),
                    label(g),
                    get(c)
                );
            }
        }
        let _ = writeln!(out, "# HELP trl_counter_reloads_total Team file loads, by result (ok, failed: the last good one kept).");
        let _ = writeln!(out, "# TYPE trl_counter_reloads_total counter");
        for ((d, r), n) in lock(&self.reloads).iter() {
            let _ = writeln!(
                out,
                "trl_counter_reloads_total{{domain=\"{}\",result=\"{r}\"}} {n}",
                label(d)
            );
        }
        let _ = writeln!(
            out,
            "# HELP trl_counter_store_seconds Time of one call's store work (the script calls)."
        );
        let _ = writeln!(out, "# TYPE trl_counter_store_seconds histogram");
        for (b, bound) in self.buckets.iter().zip(BUCKETS_US) {
            let _ = writeln!(
                out,
                "trl_counter_store_seconds_bucket{{store=\"{store}\",le=\"{}\"}} {}",
                bound as f64 / 1e6,
                b.load(Ordering::Relaxed)
            );
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "trl_counter_store_seconds_bucket{{store=\"{store}\",le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "trl_counter_store_seconds_sum{{store=\"{store}\"}} {}",
            self.latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(
            out,
            "trl_counter_store_seconds_count{{store=\"{store}\"}} {count}"
        );
        for (name, help, v) in [
            (
                "store_errors",
                "Calls the store failed (Redis down, slow past the deadline, or an error).",
                &self.store_errors,
            ),
            (
                "bad_calls",
                "Calls refused as malformed or oversized.",
                &self.bad_calls,
            ),
            ("calls", "ShouldRateLimit calls.", &self.calls),
            (
                "cache_refused",
                "Requests refused from the over-limit cache, without asking the store.",
                &self.cache_refused,
            ),
            (
                "tls_handshakes_failed",
                "gRPC connections refused in the TLS handshake (no client certificate, one the client CA did not sign, a name not allowed, or no handshake within 10 s).",
                &self.tls_handshakes_failed,
            ),
        ] {
            let _ = writeln!(out, "# HELP trl_counter_{name}_total {help}");
            let _ = writeln!(out, "# TYPE trl_counter_{name}_total counter");
            let _ = writeln!(
                out,
                "trl_counter_{name}_total {}",
                v.load(Ordering::Relaxed)
            );
        }
        // --- The store's faults, per request (store/script.lua) ---
        let _ = writeln!(out, "# HELP trl_counter_store_bad_values_total Requests failed alone (nothing counted) because a Redis key of theirs holds something else than a count.");
        let _ = writeln!(out, "# TYPE trl_counter_store_bad_values_total counter");
        let _ = writeln!(
            out,
            "trl_counter_store_bad_values_total {}",
            self.store_bad_values.load(Ordering::Relaxed)
        );
        out
    }
}

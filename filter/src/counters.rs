//! The filter's counters, as Envoy stats (`wasmcustom.tenant_ratelimit.*`).
//!
//! One table gives each counter its variant, its position and its stat name:
//! `counters!` writes the enum and the name array from the same list, so a
//! counter cannot be shown under another one's name, whatever the order.

use std::cell::RefCell;

macro_rules! counters {
    ($($(#[$doc:meta])* $variant:ident => $name:literal,)+) => {
        /// A counter the request flow increments.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Counter {
            $($(#[$doc])* $variant,)+
        }

        impl Counter {
            /// Every counter, in table order (`ALL[c.index()] == c`).
            pub const ALL: &'static [Counter] = &[$(Counter::$variant,)+];

            /// The stat name Envoy shows, after `wasmcustom.`.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Counter::$variant => $name,)+
                }
            }

            /// The counter's position in the table (its id in the glue's
            /// array of metric ids).
            pub const fn index(self) -> usize {
                self as usize
            }
        }
    };
}

counters! {
    /// Admitted by the rate-limit service.
    Allowed => "tenant_ratelimit.allowed",
    /// Refused by the rate-limit service.
    OverLimit => "tenant_ratelimit.over_limit",
    /// The limiter failed and the request was let through.
    FailureModeAllowed => "tenant_ratelimit.failure_mode_allowed",
    /// The limiter failed and the request was refused (`failure_mode_deny`).
    FailureModeDenied => "tenant_ratelimit.failure_mode_denied",
    /// The call failed, timed out, or its answer was unusable.
    RlsError => "tenant_ratelimit.rls_error",
    /// No tenant (no header, or no attribute), allowed or denied by the
    /// policy.
    MissingTenant => "tenant_ratelimit.missing_tenant",
    /// Refused by the token bucket, no call.
    LocalOverLimit => "tenant_ratelimit.local_over_limit",
    /// Refused from the over-limit cache, no call.
    CachedOverLimit => "tenant_ratelimit.cached_over_limit",
    /// Local layer skipped: every CAS attempt lost its race.
    CasRetriesExhausted => "tenant_ratelimit.cas_retries_exhausted",
    /// Local layer skipped: shared data failed.
    LocalError => "tenant_ratelimit.local_error",
    /// Local layer skipped: another tenant uses the slot.
    SlotContended => "tenant_ratelimit.slot_contended",
    /// Refused (431): the tenant header value is longer than
    /// `max_tenant_length`; no call.
    TenantTooLong => "tenant_ratelimit.tenant_too_long",
    /// WASI `random_get` failed when the slot secret was drawn: the secret
    /// came from the host's clock (counted once, by the VM that drew it).
    SlotSecretFallback => "tenant_ratelimit.slot_secret_fallback",
    /// The call could not even be sent (`dispatch_grpc_call` failed): on
    /// Envoy, a `rate_limit_service.cluster` that Envoy does not have. Also
    /// counted in `rls_error` (and failed open or denied like any failure).
    RlsDispatchFailed => "tenant_ratelimit.rls_dispatch_failed",
    /// Refused (400): the `cost_header` value is not an integer from 1 to
    /// `max_cost`; no call.
    CostInvalid => "tenant_ratelimit.cost_invalid",
    /// Refused in sync mode by the Envoy's own view of the fleet's count
    /// (at the limit), no call. Not in `over_limit`, which counts the
    /// service's refusals only.
    SyncOverLimit => "tenant_ratelimit.sync_over_limit",
    /// A group left lease mode (a new configuration): tokens of its
    /// tenants' leases dropped unspent (the service counted them:
    /// undershoot), counted when each tenant's next request drops its lease.
    ModeChangeLeaseTokens => "tenant_ratelimit.mode_change_lease_tokens",
    /// A group left sync mode (a new configuration): hits its tenants had
    /// admitted that no push had taken yet. Each tenant's next request
    /// carries them in its own call to the service (`hits_addend`), so the
    /// service still counts them.
    ModeChangeSyncHits => "tenant_ratelimit.mode_change_sync_hits",
    /// Descriptors sent to the service, in every call (a request sends one
    /// per unit of its group): with the calls (the rate-limit cluster's
    /// `upstream_rq_total`), the descriptors per call.
    RlsDescriptors => "tenant_ratelimit.rls_descriptors",
    /// Requests that waited for the worker's next call, because
    /// `rate_limit_service.batch.max_in_flight` calls were under way.
    BatchQueued => "tenant_ratelimit.batch_queued",
    /// The service answered a call of several requests without one status
    /// per descriptor (it cannot answer batches): the worker sends one
    /// request per call from then on. Counted once per worker.
    BatchUnsplittable => "tenant_ratelimit.batch_unsplittable",
    /// The breaker opened: `breaker.failures` calls failed in a row.
    BreakerOpened => "tenant_ratelimit.breaker_opened",
    /// The breaker closed: a call was answered while it was open.
    BreakerClosed => "tenant_ratelimit.breaker_closed",
    /// Calls sent while the breaker was open to probe the service.
    BreakerProbes => "tenant_ratelimit.breaker_probes",
    /// Milliseconds the breaker was open, added when it closes.
    BreakerOpenMs => "tenant_ratelimit.breaker_open_ms",
    /// What the open breaker kept from the service, one per part of each
    /// call not made (a batched call counts each of its requests, refills,
    /// pushes and charges): each such request was answered by `on_failure`
    /// at once (a lease refill or sync push was settled as failed).
    BreakerSkipped => "tenant_ratelimit.breaker_skipped",
    /// `on_failure: local`: admitted by the fallback, within this Envoy's
    /// share of the limits.
    FallbackAllowed => "tenant_ratelimit.fallback_allowed",
    /// `on_failure: local`: refused by the fallback (429, source
    /// `fallback`).
    FallbackOverLimit => "tenant_ratelimit.fallback_over_limit",
    /// A `response_cost_header` value (header or trailer) that is not an
    /// integer from 1 to `max_cost`: nothing more charged, the response
    /// untouched.
    ResponseCostInvalid => "tenant_ratelimit.response_cost_invalid",
    /// Refused (400): the tenant header was sent more than once; no call.
    TenantRepeated => "tenant_ratelimit.tenant_repeated",
    /// Flushes of a VM's counts to Envoy, one per VM every
    /// `STATS_FLUSH_MS` (counted in the flush it counts): a count is in Envoy's stats once its VM has
    /// flushed after it (`Pending`).
    StatsFlushes => "tenant_ratelimit.stats_flushes",
}

/// How many counters there are.
pub const COUNTERS: usize = Counter::ALL.len();

/// How often a VM's counts reach Envoy's stats: the root's tick is at
/// most this long (`root::tick_ms`'s or this, the shorter), and the first
/// tick this long after the last flush flushes (`flush_due`). A scrape
/// every 15 s sees the same.
pub const STATS_FLUSH_MS: u64 = 250;

/// Whether a tick at `now_ms` flushes, the last flush at `last_ms`, the
/// tick `tick_ms` long: once `STATS_FLUSH_MS` has passed, give or take
/// half a tick (a tick of `STATS_FLUSH_MS` flushes every time, however
/// its timer drifts; a lease tick of 20 ms every 240 ms or so).
pub fn flush_due(now_ms: u64, last_ms: u64, tick_ms: u64) -> bool {
    now_ms.saturating_sub(last_ms).saturating_add(tick_ms / 2) >= STATS_FLUSH_MS
}

/// Counter increments kept in the VM, by metric id, until the next flush
/// (a tick, every `STATS_FLUSH_MS`: `flush_due`): a request adds to a
/// counter with no host call, and a flush makes one `increment_metric` per
/// counter that moved. A count is in Envoy's stats at most one flush
/// period after it was made. Bounded by the
/// metrics defined at configure (ids are keys); a borrow that fails (never,
/// in one thread) drops that count.
#[derive(Debug, Default)]
pub struct Pending {
    /// (metric id, count), sorted by id: a binary search per add, and the
    /// allocation kept from one flush to the next.
    counts: RefCell<Vec<(u32, u64)>>,
}

impl Pending {
    /// Adds `n` to the counter with metric id `id`.
    pub fn add(&self, id: u32, n: u64) {
        if let Ok(mut counts) = self.counts.try_borrow_mut() {
            match counts.binary_search_by_key(&id, |&(k, _)| k) {
                Ok(i) => {
                    if let Some((_, count)) = counts.get_mut(i) {
                        *count = count.saturating_add(n);
                    }
                }
                Err(i) => counts.insert(i, (id, n)),
            }
        }
    }

    /// Hands every count kept to `increment` (one call per counter that
    /// moved since the last flush), and forgets it.
    pub fn flush(&self, mut increment: impl FnMut(u32, u64)) {
        let mut counts = match self.counts.try_borrow_mut() {
            Ok(mut counts) => std::mem::take(&mut *counts),
            Err(_) => return,
        };
        for &(id, n) in &counts {
            if n > 0 {
                increment(id, n);
            }
        }
        counts.clear();
        if let Ok(mut kept) = self.counts.try_borrow_mut() {
            if kept.is_empty() {
                *kept = counts;
            }
        }
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.counts.try_borrow().is_ok_and(|c| c.is_empty())
    }
}

/// A histogram the request flow records values in (an Envoy histogram:
/// `wasmcustom.<name>` in `/stats`, `<name with _>_bucket{le=…}` in
/// `/stats/prometheus`, with Envoy's default bucket bounds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Histogram {
    /// Milliseconds from sending the call to the service's answer, for calls
    /// the service answered (gRPC status 0): failed calls (timeouts,
    /// refused connections) are in `rls_error`, not here.
    RlsLatencyMs,
}

impl Histogram {
    /// Every histogram (`ALL[h.index()] == h`).
    pub const ALL: &'static [Histogram] = &[Histogram::RlsLatencyMs];

    /// The stat name Envoy shows, after `wasmcustom.`.
    pub const fn name(self) -> &'static str {
        match self {
            Histogram::RlsLatencyMs => "tenant_ratelimit.rls_latency_ms",
        }
    }

    pub const fn index(self) -> usize {
        self as usize
    }
}

/// How many histograms there are.
pub const HISTOGRAMS: usize = Histogram::ALL.len();

/// A gauge (an Envoy gauge, shared by every VM of the plugin: the last
/// value set wins).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gauge {
    /// 1 while the breaker is open, else 0 (set by the worker that opens
    /// or closes it).
    BreakerOpen,
    /// The fleet's size (Envoys) this Envoy last heard from the counter
    /// (`fleet`); 0 until it heard one.
    FleetEnvoys,
}

impl Gauge {
    pub const ALL: &'static [Gauge] = &[Gauge::BreakerOpen, Gauge::FleetEnvoys];

    pub const fn name(self) -> &'static str {
        match self {
            Gauge::BreakerOpen => "tenant_ratelimit.breaker_open",
            Gauge::FleetEnvoys => "tenant_ratelimit.fleet_envoys",
        }
    }

    pub const fn index(self) -> usize {
        self as usize
    }
}

/// How many gauges there are.
pub const GAUGES: usize = Gauge::ALL.len();

use ratelimit_config::plugin::OTHER_GROUP;

use crate::group::GroupId;

macro_rules! group_counters {
    ($($(#[$doc:meta])* $variant:ident => $name:literal,)+) => {
        /// A counter kept once per group (`default` included): its stat is
        /// `tenant_ratelimit.group.<group>.<name>`, so the number of series
        /// is bounded by the groups of the configuration, never by tenants.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum GroupCounter {
            $($(#[$doc])* $variant,)+
        }

        impl GroupCounter {
            /// Every group counter, in table order.
            pub const ALL: &'static [GroupCounter] = &[$(GroupCounter::$variant,)+];

            /// The stat name's last part, after the group's name.
            pub const fn name(self) -> &'static str {
                match self {
                    $(GroupCounter::$variant => $name,)+
                }
            }

            /// The counter's position in the table.
            pub const fn index(self) -> usize {
                self as usize
            }

            /// The full stat name for `group` (after `wasmcustom.`).
            pub fn stat_name(self, group: &str) -> String {
                format!("tenant_ratelimit.group.{group}.{}", self.name())
            }
        }
    };
}

group_counters! {
    /// Admitted by the service. A shadow refusal let through is not here
    /// but in `shadow_refused`: admitted, refused, shadow_refused and
    /// failed_open add up to the group's limited requests.
    Admitted => "admitted",
    /// Refused by the rate-limit service.
    RefusedService => "refused.service",
    /// Refused from the over-limit cache.
    RefusedCache => "refused.cache",
    /// Refused by the token bucket.
    RefusedBucket => "refused.bucket",
    /// Would have been refused by the service; let through (shadow).
    ShadowRefusedService => "shadow_refused.service",
    /// Would have been refused from the over-limit cache (shadow).
    ShadowRefusedCache => "shadow_refused.cache",
    /// Would have been refused by the token bucket (shadow).
    ShadowRefusedBucket => "shadow_refused.bucket",
    /// Admitted with at most `1 - near_limit_ratio` of a window left.
    NearLimit => "near_limit",
    /// The limiter failed and the request was let through.
    FailedOpen => "failed_open",
    /// The service answered a call with a descriptor that matched none of
    /// its rules (an unknown domain, a descriptor key or a tenant value its
    /// rules do not name): that limit is not applied. Also in `admitted`
    /// or `refused` (by another of the call's limits).
    NoRule => "no_rule",
    /// Lease mode: batches the service granted.
    LeasesTaken => "lease.taken",
    /// Lease mode: tokens those batches reserved.
    LeaseTokens => "lease.tokens",
    /// Lease mode: requests admitted with a token of a lease, no call.
    LeaseSpent => "lease.spent",
    /// Lease mode: tokens reserved and never spent (their window ended, or
    /// the slot went to another tenant): undershoot this Envoy observed
    /// (with the global `mode_change_lease_tokens`).
    LeaseStranded => "lease.stranded",
    /// Lease mode: batches the service refused (the limit was near).
    LeasesRefused => "lease.refused",
    /// Lease mode: the hits those refused batches asked for (the service
    /// still counts them: at most this many tokens were lost below the limit).
    LeaseRefusedTokens => "lease.refused_tokens",
    /// Lease mode: calls for a batch that failed or timed out.
    LeasesFailed => "lease.failed",
    /// Sync mode: requests admitted locally (no call).
    SyncLocal => "sync.local",
    /// Sync mode: refused locally, the view at the limit (no call): the
    /// refusals of source `sync`.
    SyncRefused => "refused.sync",
    /// Sync mode: pushes of unsynced hits the service answered.
    Syncs => "sync.pushes",
    /// Sync mode: the hits those pushes carried.
    SyncHits => "sync.hits",
    /// Sync mode: pushed hits the service answered OVER_LIMIT for (it still
    /// counts them): at most this much overshoot this Envoy observed.
    SyncOverLimitHits => "sync.over_limit_hits",
    /// Sync mode: pushes that failed or timed out (their hits are pushed
    /// again with the next one).
    SyncFailed => "sync.failed",
    /// Sync mode: would have been refused locally (shadow).
    ShadowRefusedSync => "shadow_refused.sync",
    /// `on_failure: local`: admitted by the fallback while the service
    /// could not decide (also in `admitted`).
    FallbackAdmitted => "fallback.admitted",
    /// `on_failure: local`: refused by the fallback (source `fallback`).
    FallbackRefused => "refused.fallback",
    /// `on_failure: local`: would have been refused by the fallback
    /// (shadow).
    ShadowRefusedFallback => "shadow_refused.fallback",
    /// Response costs charged after the response (`response_cost_header`):
    /// charges the service answered.
    ResponseCostCharges => "response_cost.charges",
    /// The hits those charges added (each the response's cost less what its
    /// request was charged).
    ResponseCostHits => "response_cost.hits",
    /// Charges that failed, timed out or were dropped (a full mailbox): those
    /// hits were never counted (undershoot).
    ResponseCostFailed => "response_cost.failed",
}

/// The stat of a team-file route's counter (after `wasmcustom.`): the
/// requests a group's route limits applied to (their Envoy route carried
/// that name). A route of several groups is one stat: the host gives each
/// definition of a name the same counter.
pub fn route_stat_name(route: &str) -> String {
    format!("tenant_ratelimit.route.{route}.requests")
}

/// How many counters each group has.
pub const GROUP_COUNTERS: usize = GroupCounter::ALL.len();

/// A kind of metric to define.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Histogram,
    Gauge,
}

/// The ids the host gave every metric when they were defined (None: that
/// one could not be defined, and is not updated): the counters by
/// `Counter::index`, the group counters by the group's series then
/// `GroupCounter::index`, the histograms by `Histogram::index`.
#[derive(Debug)]
pub struct MetricIds {
    counters: [Option<u32>; COUNTERS],
    /// The group counters of each series: one per group that has its own,
    /// and one for `OTHER_GROUP` when some group has not.
    series: Vec<[Option<u32>; GROUP_COUNTERS]>,
    /// By group index (`limits.all_groups()` order): its series.
    series_of: Vec<u32>,
    histograms: [Option<u32>; HISTOGRAMS],
    gauges: [Option<u32>; GAUGES],
    /// Each team-file route's `tenant_ratelimit.route.<route>.requests`,
    /// the routes of every group in `limits.all_groups()` order (set once
    /// the others are defined: `route_stat_name`).
    pub routes: Vec<Option<u32>>,
    /// By group index: the index in `routes` of its first route.
    pub route_base: Vec<usize>,
    /// The counts not yet flushed to Envoy.
    pub pending: Pending,
}

impl MetricIds {
    /// Defines every metric through `define`, with the group counters of
    /// these groups (in `limits.all_groups()` order, each with whether its
    /// counters are series of their own: `metrics.groups`); the counters of
    /// the others are one series, group `OTHER_GROUP`, defined once.
    pub fn define<'a>(
        groups: impl Iterator<Item = (&'a str, bool)>,
        mut define: impl FnMut(MetricKind, &str) -> Option<u32>,
    ) -> MetricIds {
        let mut counters = [None; COUNTERS];
        for (id, c) in counters.iter_mut().zip(Counter::ALL) {
            *id = define(MetricKind::Counter, c.name());
        }
        let mut series = Vec::new();
        let mut other = None;
        let mut of_group = |name: &str| {
            let mut ids = [None; GROUP_COUNTERS];
            for (id, c) in ids.iter_mut().zip(GroupCounter::ALL) {
                *id = define(MetricKind::Counter, &c.stat_name(name));
            }
            ids
        };
        let series_of = groups
            .map(|(name, own)| match (own, other) {
                (false, Some(i)) => i,
                _ => {
                    series.push(of_group(if own { name } else { OTHER_GROUP }));
                    let i = u32::try_from(series.len().saturating_sub(1)).unwrap_or(u32::MAX);
                    if !own {
                        other = Some(i);
                    }
                    i
                }
            })
            .collect();
        let mut histograms = [None; HISTOGRAMS];
        for (id, h) in histograms.iter_mut().zip(Histogram::ALL) {
            *id = define(MetricKind::Histogram, h.name());
        }
        let mut gauges = [None; GAUGES];
        for (id, g) in gauges.iter_mut().zip(Gauge::ALL) {
            *id = define(MetricKind::Gauge, g.name());
        }
        MetricIds {
            counters,
            series,
            series_of,
            histograms,
            gauges,
            routes: Vec::new(),
            route_base: Vec::new(),
            pending: Pending::default(),
        }
    }

    /// The requests counter of the route at `route` in the routes of the
    /// group `group`.
    pub fn route(&self, group: GroupId, route: usize) -> Option<u32> {
        let at = self.route_base.get(group.index())? + route;
        self.routes.get(at).copied().flatten()
    }

    pub fn counter(&self, c: Counter) -> Option<u32> {
        self.counters.get(c.index()).copied().flatten()
    }

    /// A counter of group `group` (of its own series, or of
    /// `OTHER_GROUP`'s).
    pub fn group(&self, group: GroupId, c: GroupCounter) -> Option<u32> {
        let series = usize::try_from(*self.series_of.get(group.index())?).ok()?;
        self.series.get(series)?.get(c.index()).copied().flatten()
    }

    pub fn histogram(&self, h: Histogram) -> Option<u32> {
        self.histograms.get(h.index()).copied().flatten()
    }

    pub fn gauge(&self, g: Gauge) -> Option<u32> {
        self.gauges.get(g.index()).copied().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn names_are_unique_and_ids_match_positions() {
        let mut names: Vec<&str> = Counter::ALL.iter().map(|c| c.name()).collect();
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(c.index(), i, "{c:?}");
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), COUNTERS);
    }

    #[test]
    fn names_are_what_dashboards_read() {
        // The README lists these; renaming one breaks every dashboard.
        assert_eq!(Counter::Allowed.name(), "tenant_ratelimit.allowed");
        assert_eq!(
            Counter::SlotContended.name(),
            "tenant_ratelimit.slot_contended"
        );
        assert!(Counter::ALL
            .iter()
            .all(|c| c.name().starts_with("tenant_ratelimit.")));
        assert_eq!(COUNTERS, 31);
        assert_eq!(
            Counter::StatsFlushes.name(),
            "tenant_ratelimit.stats_flushes"
        );
        assert_eq!(Gauge::BreakerOpen.name(), "tenant_ratelimit.breaker_open");
        assert_eq!(
            Counter::TenantRepeated.name(),
            "tenant_ratelimit.tenant_repeated"
        );
        assert_eq!(
            Counter::SyncOverLimit.name(),
            "tenant_ratelimit.sync_over_limit"
        );
        assert_eq!(
            Counter::RlsDispatchFailed.name(),
            "tenant_ratelimit.rls_dispatch_failed"
        );
        assert_eq!(
            Histogram::RlsLatencyMs.name(),
            "tenant_ratelimit.rls_latency_ms"
        );
    }

    #[test]
    fn every_metric_is_defined_once_under_its_name_and_found_by_its_id() {
        let mut defined = Vec::new();
        let ids = MetricIds::define(
            [("default", true), ("gold", true)].into_iter(),
            |kind, name| {
                defined.push((kind, name.to_string()));
                // One that the host refuses.
                (name != "tenant_ratelimit.group.gold.admitted").then_some(defined.len() as u32)
            },
        );
        assert_eq!(
            defined.len(),
            COUNTERS + 2 * GROUP_COUNTERS + HISTOGRAMS + GAUGES
        );
        let id_of = |name: &str| {
            defined
                .iter()
                .position(|(_, n)| n == name)
                .map(|i| i as u32 + 1)
        };
        assert_eq!(
            ids.counter(Counter::SyncOverLimit),
            id_of("tenant_ratelimit.sync_over_limit")
        );
        assert_eq!(
            ids.group(GroupId::new(0), GroupCounter::SyncRefused),
            id_of("tenant_ratelimit.group.default.refused.sync")
        );
        assert_eq!(ids.group(GroupId::new(1), GroupCounter::Admitted), None);
        assert_eq!(ids.group(GroupId::new(2), GroupCounter::Admitted), None);
        assert_eq!(
            ids.histogram(Histogram::RlsLatencyMs),
            id_of("tenant_ratelimit.rls_latency_ms")
        );
        assert_eq!(defined.last().map(|(k, _)| *k), Some(MetricKind::Gauge));
        assert_eq!(
            ids.gauge(Gauge::BreakerOpen),
            id_of("tenant_ratelimit.breaker_open")
        );
    }

    #[test]
    fn groups_without_series_of_their_own_share_the_other_series() {
        let mut defined = Vec::new();
        let groups = [
            ("default", false),
            ("gold", true),
            ("silver", false),
            ("bronze", false),
        ];
        let ids = MetricIds::define(groups.into_iter(), |_, name| {
            defined.push(name.to_string());
            Some(defined.len() as u32)
        });
        // gold's counters, then other's once (default, silver and bronze).
        assert_eq!(
            defined.len(),
            COUNTERS + 2 * GROUP_COUNTERS + HISTOGRAMS + GAUGES
        );
        let id_of = |name: &str| defined.iter().position(|n| n == name).map(|i| i as u32 + 1);
        let other = id_of("tenant_ratelimit.group.other.admitted");
        assert!(other.is_some());
        for g in [0, 2, 3] {
            assert_eq!(ids.group(GroupId::new(g), GroupCounter::Admitted), other);
        }
        assert_eq!(
            ids.group(GroupId::new(1), GroupCounter::NoRule),
            id_of("tenant_ratelimit.group.gold.no_rule")
        );
        assert!(!defined
            .iter()
            .any(|n| n.contains(".silver.") || n.contains(".default.")));
        assert_eq!(ids.group(GroupId::new(4), GroupCounter::Admitted), None);
    }

    #[test]
    fn each_route_has_a_requests_counter_by_its_index() {
        assert_eq!(
            route_stat_name("export"),
            "tenant_ratelimit.route.export.requests"
        );
        let mut ids = MetricIds::define([("default", true)].into_iter(), |_, _| None);
        assert_eq!(ids.route(GroupId::new(0), 0), None);
        // Routes 7 and 8 of group 0, none of group 1, 9 of group 2.
        ids.routes = vec![Some(7), Some(8), Some(9)];
        ids.route_base = vec![0, 2, 2];
        assert_eq!(
            (ids.route(GroupId::new(0), 0), ids.route(GroupId::new(0), 1)),
            (Some(7), Some(8))
        );
        assert_eq!(
            (
                ids.route(GroupId::new(2), 0),
                ids.route(GroupId::new(2), 1),
                ids.route(GroupId::new(3), 0)
            ),
            (Some(9), None, None)
        );
    }

    #[test]
    fn each_group_takes_the_series_the_configuration_says() {
        // ratelimit-config's warning counts what a group costs.
        assert_eq!(GROUP_COUNTERS, ratelimit_config::plugin::SERIES_PER_GROUP);
    }

    #[test]
    fn pending_counts_reach_the_host_once_each_on_the_next_flush() {
        let pending = Pending::default();
        let flushed = |p: &Pending| {
            let mut out = Vec::new();
            p.flush(|id, n| out.push((id, n)));
            out.sort_unstable();
            out
        };
        assert!(pending.is_empty());
        assert_eq!(flushed(&pending), vec![]);
        // Between two ticks: no host call, only sums.
        pending.add(7, 1);
        pending.add(9, 2);
        pending.add(7, 1);
        pending.add(3, 0);
        assert!(!pending.is_empty());
        // The tick: one increment per counter that moved, with its sum.
        assert_eq!(flushed(&pending), vec![(7, 2), (9, 2)]);
        // Counted once: the next tick has nothing (stale by one tick at most).
        assert!(pending.is_empty());
        assert_eq!(flushed(&pending), vec![]);
        pending.add(9, u64::MAX);
        pending.add(9, 5);
        assert_eq!(flushed(&pending), vec![(9, u64::MAX)]);
    }

    #[test]
    fn every_tick_of_the_flush_period_flushes_a_shorter_one_about_every_period() {
        // The tick of the flush period itself: every tick, early or late.
        for now in [1_125, 1_200, 1_250, 1_400] {
            assert!(flush_due(now, 1_000, STATS_FLUSH_MS), "{now}");
        }
        // A lease tick of 20 ms: not before 240 ms have passed.
        assert!(!flush_due(1_220, 1_000, 20));
        assert!(flush_due(1_240, 1_000, 20));
        let (mut last, mut flushes) = (0, 0);
        for tick in 1..=100 {
            let now = tick * 20;
            if flush_due(now, last, 20) {
                (last, flushes) = (now, flushes + 1);
            }
        }
        // 2 s of 20 ms ticks: 8 flushes (every 240 ms), none 260 ms apart.
        assert_eq!(flushes, 8);
        // The first tick after configure (the last flush at 0, the epoch)
        // flushes.
        assert!(flush_due(1_764_000_000_000, 0, 20));
    }

    #[test]
    fn group_counter_names_are_unique_and_carry_the_group() {
        let mut names: Vec<&str> = GroupCounter::ALL.iter().map(|c| c.name()).collect();
        for (i, c) in GroupCounter::ALL.iter().enumerate() {
            assert_eq!(c.index(), i, "{c:?}");
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), GROUP_COUNTERS);
        assert_eq!(
            GroupCounter::RefusedCache.stat_name("gold"),
            "tenant_ratelimit.group.gold.refused.cache"
        );
    }
}

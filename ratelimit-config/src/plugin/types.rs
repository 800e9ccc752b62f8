//! The plugin configuration, as the filter uses it once parsed.

use crate::model::{Group, Service, TeamLimits, Unit};

use super::defaults::{
    lease_batch_cap, max_unsynced_bound, DEFAULT_BATCH_ENABLED, DEFAULT_BATCH_MAX_DESCRIPTORS,
    DEFAULT_BATCH_MAX_IN_FLIGHT, DEFAULT_LEASE_MAX_BATCH, DEFAULT_LOCAL_ENABLED,
    DEFAULT_LOCAL_SLOTS, DEFAULT_MODE, DEFAULT_SYNC_INTERVAL_MS, DEFAULT_SYNC_MAX_UNSYNCED,
};
use super::names::{HeaderMode, MissingTenant, Mode, OnFailure, Share};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginConfig {
    pub domain: String,
    pub limits: TeamLimits,
    pub cluster: String,
    /// `rate_limit_service.service`: which service counts.
    pub service: Service,
    pub timeout_ms: u32,
    /// `rate_limit_service.batch`: how a worker's requests share calls.
    pub batch: BatchConfig,
    /// What a request gets when the service cannot decide (`on_failure`,
    /// or `failure_mode_deny: true` for `Deny`).
    pub on_failure: OnFailure,
    /// The status of a refusal by `OnFailure::Deny`.
    pub status_on_error: u16,
    /// When to stop calling a service that keeps failing (`breaker`).
    pub breaker: BreakerConfig,
    /// How `OnFailure::Local` shares each limit (`fallback`).
    pub fallback: FallbackConfig,
    pub missing_tenant: MissingTenant,
    /// A tenant header value longer than this many bytes is refused (431).
    pub max_tenant_length: u32,
    pub descriptor_key: String,
    pub headers: HeaderMode,
    pub local: LocalConfig,
    /// `"shadow": true`: every group's refusals are counted, never enforced
    /// (a group's own `"shadow": true` shadows only that group).
    pub shadow: bool,
    /// `near_limit_ratio` in millionths (0 < r <= 1): an admitted request
    /// that leaves at most `1 - r` of a window's limit is near the limit.
    pub near_limit_ppm: u32,
    /// Request cost (`cost_header`, `max_cost`): None, every request costs 1.
    pub cost: Option<CostConfig>,
    /// A cost the upstream reports (`response_cost_header`, in a response
    /// header or trailer; at most `max_cost`): None, the request's cost is
    /// all that is charged.
    pub response_cost: Option<CostConfig>,
    /// Where the tenant comes from (`tenant_source`): the team file's
    /// header unless it says otherwise.
    pub tenant_source: TenantSource,
    /// Which groups' counters are series of their own (`metrics`).
    pub metrics: MetricsConfig,
}

/// Where the filter reads a request's tenant (`tenant_source`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TenantSource {
    /// The request header the team file names (`limits`' top-level key).
    #[default]
    Header,
    /// An Envoy attribute, by its path (`{"property": [...]}`): for example
    /// the claim that `jwt_authn` verified and put in the request's dynamic
    /// metadata (`payload_in_metadata`). No header is read.
    Property(Vec<String>),
}

impl TenantSource {
    /// The property path, dotted, as the docs and `explain` show it.
    pub fn dotted(path: &[String]) -> String {
        path.join(".")
    }
}

impl PluginConfig {
    /// Whether `group`'s refusals are only counted: the global `shadow`, or
    /// the group's own.
    pub fn shadowed(&self, group: &Group) -> bool {
        self.shadow || group.shadow
    }
}

/// Batched calls (`rate_limit_service.batch`): per worker, a request that
/// must ask the service joins the worker's next call while `max_in_flight`
/// calls are under way; a call carries at most `max_descriptors`
/// descriptors (whole requests). `enabled` false: one request per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchConfig {
    pub enabled: bool,
    pub max_descriptors: u32,
    pub max_in_flight: u32,
}

impl Default for BatchConfig {
    fn default() -> BatchConfig {
        BatchConfig {
            enabled: DEFAULT_BATCH_ENABLED,
            max_descriptors: DEFAULT_BATCH_MAX_DESCRIPTORS,
            max_in_flight: DEFAULT_BATCH_MAX_IN_FLIGHT,
        }
    }
}

/// The breaker (`breaker`): after `failures` failed calls in a row the
/// filter stops calling the service, answers from `on_failure`, and lets
/// one call probe every `probe_interval_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    pub enabled: bool,
    pub failures: u32,
    pub probe_interval_ms: u32,
}

/// The local fallback (`fallback`): each Envoy enforces a share of every
/// limit, `1 / envoys` or learned (`share`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FallbackConfig {
    /// The Envoys sharing each limit (1 when `on_failure` is not `local`).
    pub envoys: u32,
    pub share: Share,
}

/// Request cost: a request carrying `header` costs that many hits (an
/// integer from 1 to `max`); without it, 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CostConfig {
    /// The request header (lowercase) that carries the cost.
    pub header: String,
    /// The largest cost accepted; a larger one is refused (400).
    pub max: u32,
}

/// A token bucket's parameters: refill rate and capacity, in requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketParams {
    pub tokens_per_second: u32,
    pub burst: u32,
}

/// The local layer (`local`): a token bucket and an over-limit cache per
/// tenant, in proxy-wasm shared data, in front of the rate-limit service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalConfig {
    pub enabled: bool,
    /// Shared-data slots; tenants hash into them, a newcomer takes a slot over.
    pub slots: u32,
    /// The mode of every group that does not set its own (`local.mode`).
    pub mode: Mode,
    /// Per-group settings (`local.groups.<group>`), by group name.
    pub groups: Vec<(String, GroupLocal)>,
    /// The most tokens one lease reserves (`local.lease.max_batch`).
    pub lease_max_batch: u32,
    /// `local.sync.interval_ms`.
    pub sync_interval_ms: u32,
    /// `local.sync.max_unsynced`: for a group, at most `max_unsynced_for`.
    pub sync_max_unsynced: u32,
}

/// One group's `local.groups.<group>` entry: each key is optional.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupLocal {
    /// Its own bucket (`tokens_per_second`, `burst`).
    pub bucket: Option<BucketParams>,
    /// Its own mode.
    pub mode: Option<Mode>,
}

impl Default for LocalConfig {
    fn default() -> LocalConfig {
        LocalConfig {
            enabled: DEFAULT_LOCAL_ENABLED,
            slots: DEFAULT_LOCAL_SLOTS,
            mode: DEFAULT_MODE,
            groups: Vec::new(),
            lease_max_batch: DEFAULT_LEASE_MAX_BATCH,
            sync_interval_ms: DEFAULT_SYNC_INTERVAL_MS,
            sync_max_unsynced: DEFAULT_SYNC_MAX_UNSYNCED,
        }
    }
}

impl LocalConfig {
    /// A group's `local.groups` entry, if it has one.
    pub fn group(&self, name: &str) -> Option<&GroupLocal> {
        self.groups.iter().find(|(n, _)| n == name).map(|(_, g)| g)
    }

    /// The mode of a group: its own, else `local.mode`. Always `Exact`
    /// when the local layer is off (lease and sync keep their state in it;
    /// the parser refuses another mode there).
    pub fn mode_for(&self, group: &Group) -> Mode {
        if !self.enabled {
            return Mode::Exact;
        }
        self.group(&group.name)
            .and_then(|g| g.mode)
            .unwrap_or(self.mode)
    }

    /// The largest lease batch of a tenant of `group`:
    /// `local.lease.max_batch`, at most a twentieth of the group's smallest
    /// limit (`lease_batch_cap`).
    pub fn lease_max_batch_for(&self, group: &Group) -> u32 {
        let smallest = group
            .limits
            .iter()
            .map(|(_, l)| l)
            .min()
            .unwrap_or(u32::MAX);
        lease_batch_cap(self.lease_max_batch, smallest)
    }

    /// The most unsynced hits of a tenant of `group` in sync mode:
    /// `local.sync.max_unsynced`, but never more than half of the group's
    /// smallest limit (a value set above that is refused by the parser; the
    /// default is lowered to it).
    pub fn max_unsynced_for(&self, group: &Group) -> u32 {
        let smallest = group
            .limits
            .iter()
            .map(|(_, l)| l)
            .min()
            .unwrap_or(u32::MAX);
        self.sync_max_unsynced.min(max_unsynced_bound(smallest))
    }

    /// The bucket of a group: its own `local.groups` entry, else its
    /// per-second limit as both rate and burst, else none (a group without
    /// a per-second limit has no bucket unless it sets one).
    pub fn bucket_for(&self, group: &Group) -> Option<BucketParams> {
        if !self.enabled {
            return None;
        }
        if let Some(p) = self.group(&group.name).and_then(|g| g.bucket) {
            return Some(p);
        }
        group.limits.get(Unit::Second).map(|n| BucketParams {
            tokens_per_second: n,
            burst: n,
        })
    }
}

/// `metrics`: which groups' counters are series of their own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsConfig {
    /// `metrics.groups`: the groups whose counters are their own series;
    /// every other group's are summed under `OTHER_GROUP`. None (the
    /// default): every group has its own. Searched one by one at configure
    /// (a sort or a set would add code to the filter for a list that is
    /// short when it is useful).
    pub groups: Option<Vec<String>>,
}

impl MetricsConfig {
    /// Whether `group`'s counters are series of their own.
    pub fn exported(&self, group: &str) -> bool {
        match &self.groups {
            None => true,
            Some(listed) => listed.binary_search_by(|g| g.as_str().cmp(group)).is_ok(),
        }
    }
}

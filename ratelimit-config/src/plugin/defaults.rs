//! Every default and bound of the plugin configuration, written once: the
//! parser takes a default for a key left out, `generate` writes them out,
//! and the CLI's flags default to them.

use super::names::{HeaderMode, MissingTenant, Mode, OnFailure};

pub const DEFAULT_TIMEOUT_MS: u32 = 20;
pub const DEFAULT_FAILURE_MODE_DENY: bool = false;
pub const DEFAULT_STATUS_ON_ERROR: u16 = 500;
/// `on_failure` when neither it nor `failure_mode_deny` is set: fail open.
pub const DEFAULT_ON_FAILURE: OnFailure = OnFailure::Allow;
/// The breaker opens after this many failed calls in a row
/// (`breaker.failures`), and may be set from 1 to the maximum.
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
pub const MAX_BREAKER_FAILURES: u32 = 1_000;
/// While the breaker is open, one call per `breaker.probe_interval_ms`
/// probes the service.
pub const DEFAULT_PROBE_INTERVAL_MS: u32 = 1_000;
pub const MIN_PROBE_INTERVAL_MS: u32 = 10;
pub const MAX_PROBE_INTERVAL_MS: u32 = 600_000;
/// The most Envoys `fallback.envoys` may count.
pub const MAX_FALLBACK_ENVOYS: u32 = 10_000;
pub const DEFAULT_MISSING_TENANT: MissingTenant = MissingTenant::Allow;
pub const DEFAULT_DESCRIPTOR_KEY: &str = "tenant";
pub const DEFAULT_HEADERS: HeaderMode = HeaderMode::DraftVersion03;
pub const DEFAULT_LOCAL_ENABLED: bool = true;
pub const DEFAULT_MODE: Mode = Mode::Exact;
pub const DEFAULT_SHADOW: bool = false;
/// `near_limit_ratio` when it is left out (the rate-limit service's own
/// default), in millionths.
pub const DEFAULT_NEAR_LIMIT_PPM: u32 = 800_000;
/// `near_limit_ratio` is kept in millionths: an integer comparison, so 0.8
/// of 100 is exactly 80.
pub const PPM: u32 = 1_000_000;
/// Slots of the local layer when `local.slots` is not set.
pub const DEFAULT_LOCAL_SLOTS: u32 = 4_096;
/// Longest tenant header value, in bytes, when `max_tenant_length` is not
/// set: a longer one is refused with 431 and never reaches the service.
pub const DEFAULT_MAX_TENANT_LENGTH: u32 = 128;
/// The most `max_tenant_length` may be (Envoy's own default header limit is
/// 60 KiB; no tenant needs more than this).
pub const MAX_MAX_TENANT_LENGTH: u32 = 4_096;
pub const MAX_TIMEOUT_MS: u32 = 60_000;
/// The most slots `local.slots` may ask for (about 320 MiB of shared data).
pub const MAX_LOCAL_SLOTS: u32 = 1_048_576;
/// The largest cost a request may carry when `cost_header` is set and
/// `max_cost` is not.
pub const DEFAULT_MAX_COST: u32 = 1_000;
/// The most `max_cost` may be.
pub const MAX_MAX_COST: u32 = 1_000_000;
/// The most tokens one lease reserves when `local.lease.max_batch` is not
/// set (the batch is about one second of the Envoy's own rate, at most this).
pub const DEFAULT_LEASE_MAX_BATCH: u32 = 100;
/// The most `local.lease.max_batch` may be.
pub const MAX_LEASE_MAX_BATCH: u32 = 100_000;
/// How often each worker's root context sends the lease refills its
/// requests asked for (the period of `on_tick`), in milliseconds.
pub const LEASE_TICK_MS: u32 = 20;
/// How often sync mode pushes each active tenant's unsynced hits
/// (`local.sync.interval_ms`), and the range it may be set in.
pub const DEFAULT_SYNC_INTERVAL_MS: u32 = 100;
pub const MIN_SYNC_INTERVAL_MS: u32 = 10;
pub const MAX_SYNC_INTERVAL_MS: u32 = 60_000;
/// The most hits of one tenant an Envoy admits without the service having
/// seen them (`local.sync.max_unsynced`); past it, requests ask the service
/// one by one until the next sync. The overshoot bound scales with it.
pub const DEFAULT_SYNC_MAX_UNSYNCED: u32 = 1_000;
pub const MAX_SYNC_MAX_UNSYNCED: u32 = 1_000_000;
/// The most units (windows) one group may limit in the filter: a tenant's
/// local state (sync views, fallback buckets, a cached refusal's statuses)
/// has room for this many.
pub const FILTER_MAX_UNITS: usize = crate::model::MAX_UNITS_PER_GROUP;
/// Batched calls to the service (`rate_limit_service.batch`): on unless
/// `"batch": false`.
pub const DEFAULT_BATCH_ENABLED: bool = true;
/// The most descriptors one call carries (`batch.max_descriptors`): a call
/// holds whole requests, so one request with more still goes, alone.
pub const DEFAULT_BATCH_MAX_DESCRIPTORS: u32 = 100;
pub const MAX_BATCH_MAX_DESCRIPTORS: u32 = 1_000;
/// Calls one worker has under way before its requests queue for the next
/// one (`batch.max_in_flight`).
pub const DEFAULT_BATCH_MAX_IN_FLIGHT: u32 = 1;
pub const MAX_BATCH_MAX_IN_FLIGHT: u32 = 64;

/// A lease batch is at most this fraction (1/n) of its group's tightest
/// limit. The service adds a refused batch to every descriptor's counter
/// anyway: a batch the minute refuses still counts in the hour, and one
/// that crosses the limit loses what was left below it. Each costs at most
/// one batch: so at most a twentieth (5%) of a window.
pub const LEASE_BATCH_SHARE_OF_LIMIT: u32 = 20;

/// The largest lease batch of a group whose smallest limit is `smallest`:
/// `max_batch`, at most `smallest / LEASE_BATCH_SHARE_OF_LIMIT`, at least 1.
pub const fn lease_batch_cap(max_batch: u32, smallest: u32) -> u32 {
    let share = smallest / LEASE_BATCH_SHARE_OF_LIMIT;
    let cap = if max_batch < share { max_batch } else { share };
    if cap == 0 {
        1
    } else {
        cap
    }
}

/// The most hits `local.sync.max_unsynced` may leave unsynced for a group
/// whose smallest limit is `smallest`: half of it (at least 1), so that
/// sync's overshoot bound, 2 × (Envoys − 1) × max_unsynced, stays below
/// what the Envoys could overshoot without syncing at all.
pub const fn max_unsynced_bound(smallest: u32) -> u32 {
    let half = smallest / 2;
    if half == 0 {
        1
    } else {
        half
    }
}

/// The most segments `tenant_source.property` may have (`PROPERTY_SHAPE`
/// in the parser says it too).
pub const MAX_PROPERTY_SEGMENTS: usize = 16;
/// The group under which `metrics.groups` sums the counters of every group
/// it does not list (`tenant_ratelimit_group_admitted{group="other"}`).
pub const OTHER_GROUP: &str = "other";
/// The series each group's counters take on every Envoy (the filter's
/// `GroupCounter`s: a test there keeps the two equal).
pub const SERIES_PER_GROUP: usize = 30;
/// Above this many groups exported one by one, the configuration gets a
/// warning: each costs `SERIES_PER_GROUP` series on every Envoy.
pub const METRICS_GROUPS_WARN: usize = 100;

/// `max_tenant_length` for a team file whose longest listed tenant is
/// `longest` bytes: the default, or that length when it is longer (a team
/// file may list values up to 256 bytes), so that limits the CLI accepts are
/// never refused by the filter.
pub(super) fn max_tenant_length_fitting(longest: usize) -> u32 {
    u32::try_from(longest)
        .unwrap_or(u32::MAX)
        .clamp(DEFAULT_MAX_TENANT_LENGTH, MAX_MAX_TENANT_LENGTH)
}

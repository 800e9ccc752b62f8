//! What Envoy's access log learns about a refused or shadow-refused
//! request, and about one the fallback admitted: four stream properties,
//! which Envoy keeps as filter state `wasm.<name>` and prints with
//! `%FILTER_STATE(wasm.<name>:PLAIN)%`. Only those set them (a request the
//! service admits costs no host call here); the README's access-log format
//! prints them.

use crate::counters::{Counter, GroupCounter};
use crate::host::Host;

/// The tenant as the service sees it (`ratelimit_config::tenant_value`: a
/// byte that is not UTF-8, and `%`, written `%XX`; from at most
/// `max_tenant_length` raw bytes).
pub const TENANT: &str = "tenant_ratelimit_tenant";
/// The tenant's group (`default` or a named one).
pub const GROUP: &str = "tenant_ratelimit_group";
/// `refused` or `shadow_refused`; `admitted` for the fallback's admissions.
pub const VERDICT: &str = "tenant_ratelimit_verdict";
/// What decided: `service`, `cache`, `bucket`, `sync`, `fallback`,
/// `missing_tenant`, `tenant_too_long`, `tenant_repeated` or `limiter_error`.
pub const SOURCE: &str = "tenant_ratelimit_source";

/// What refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecidedBy {
    /// The rate-limit service answered OVER_LIMIT.
    Service,
    /// The over-limit cache remembered an earlier OVER_LIMIT.
    Cache,
    /// The tenant's token bucket was empty.
    Bucket,
    /// Sync mode: the Envoy's view of the fleet's count is at the limit.
    Sync,
    /// `on_failure: local`: the Envoy's share of a limit is used up while
    /// the service cannot decide.
    Fallback,
    /// No tenant header, and `missing_tenant: deny`.
    MissingTenant,
    /// The tenant header value is longer than `max_tenant_length` (431).
    TenantTooLong,
    /// The tenant header was sent more than once (400).
    TenantRepeated,
    /// The limiter failed and `failure_mode_deny` refused.
    LimiterError,
}

impl DecidedBy {
    pub const fn name(self) -> &'static str {
        match self {
            DecidedBy::Service => "service",
            DecidedBy::Cache => "cache",
            DecidedBy::Bucket => "bucket",
            DecidedBy::Sync => "sync",
            DecidedBy::Fallback => "fallback",
            DecidedBy::MissingTenant => "missing_tenant",
            DecidedBy::TenantTooLong => "tenant_too_long",
            DecidedBy::TenantRepeated => "tenant_repeated",
            DecidedBy::LimiterError => "limiter_error",
        }
    }

    /// The global counter of an enforced refusal by this source; None for
    /// the sources that are not a rate limit (they have counters of their
    /// own). Only the service's refusals are `over_limit`.
    pub const fn counter(self) -> Option<Counter> {
        match self {
            DecidedBy::Service => Some(Counter::OverLimit),
            DecidedBy::Cache => Some(Counter::CachedOverLimit),
            DecidedBy::Bucket => Some(Counter::LocalOverLimit),
            DecidedBy::Sync => Some(Counter::SyncOverLimit),
            DecidedBy::Fallback => Some(Counter::FallbackOverLimit),
            DecidedBy::MissingTenant
            | DecidedBy::TenantTooLong
            | DecidedBy::TenantRepeated
            | DecidedBy::LimiterError => None,
        }
    }

    /// The group counter of a refusal by this source (`shadow`: of a
    /// would-be refusal let through); None for the sources that are not
    /// a rate limit.
    pub const fn group_counter(self, shadow: bool) -> Option<GroupCounter> {
        match (self, shadow) {
            (DecidedBy::Service, false) => Some(GroupCounter::RefusedService),
            (DecidedBy::Cache, false) => Some(GroupCounter::RefusedCache),
            (DecidedBy::Bucket, false) => Some(GroupCounter::RefusedBucket),
            (DecidedBy::Sync, false) => Some(GroupCounter::SyncRefused),
            (DecidedBy::Sync, true) => Some(GroupCounter::ShadowRefusedSync),
            (DecidedBy::Fallback, false) => Some(GroupCounter::FallbackRefused),
            (DecidedBy::Fallback, true) => Some(GroupCounter::ShadowRefusedFallback),
            (DecidedBy::Service, true) => Some(GroupCounter::ShadowRefusedService),
            (DecidedBy::Cache, true) => Some(GroupCounter::ShadowRefusedCache),
            (DecidedBy::Bucket, true) => Some(GroupCounter::ShadowRefusedBucket),
            _ => None,
        }
    }
}

/// `refused`, or `shadow_refused` for a refusal let through.
pub const fn verdict_name(shadow: bool) -> &'static str {
    if shadow {
        "shadow_refused"
    } else {
        "refused"
    }
}

/// Sets the access-log properties of a refusal. A tenant or group that is
/// not known (a missing or too long tenant) is left unset: the log prints
/// `-`. A host failure is not worth failing the request for.
pub fn record<H: Host + ?Sized>(
    host: &H,
    tenant: Option<&str>,
    group: Option<&str>,
    shadow: bool,
    source: DecidedBy,
) {
    set(host, tenant, group, verdict_name(shadow), source);
}

/// Sets the access-log properties of a request `source` admitted while the
/// service could not decide (the fallback), verdict `admitted`.
pub fn record_admitted<H: Host + ?Sized>(
    host: &H,
    tenant: Option<&str>,
    group: Option<&str>,
    source: DecidedBy,
) {
    set(host, tenant, group, "admitted", source);
}

fn set<H: Host + ?Sized>(
    host: &H,
    tenant: Option<&str>,
    group: Option<&str>,
    verdict: &str,
    source: DecidedBy,
) {
    let fields = [
        (TENANT, tenant),
        (GROUP, group),
        (VERDICT, Some(verdict)),
        (SOURCE, Some(source.name())),
    ];
    for (name, value) in fields {
        if let Some(value) = value {
            if let Err(e) = host.set_property(name, value) {
                log::debug!("cannot set {name}: {e}");
            }
        }
    }
}

//! The `local` section: the local layer, the mode of every group, the
//! lease and sync settings, and each group's own bucket and mode.

use serde_json::{Map, Value};

use crate::error::{join, Errors};
use crate::field::{
    boolean, object, positive_u32, positive_u32_at_most, positive_u32_in, FieldError,
};
use crate::model::{TeamLimits, Window};

use super::super::defaults::{
    max_unsynced_bound, DEFAULT_LEASE_MAX_BATCH, DEFAULT_LOCAL_ENABLED, DEFAULT_SYNC_INTERVAL_MS,
    DEFAULT_SYNC_MAX_UNSYNCED, MAX_LEASE_MAX_BATCH, MAX_LOCAL_SLOTS, MAX_SYNC_INTERVAL_MS,
    MAX_SYNC_MAX_UNSYNCED, MIN_SYNC_INTERVAL_MS,
};
use super::super::names::{Mode, Named};
use super::super::types::{BucketParams, GroupLocal, LocalConfig};
use super::{check_keys, no_such_group, one_of};

const LOCAL_KEYS: &[&str] = &["enabled", "slots", "mode", "groups", "lease", "sync"];
const LEASE_KEYS: &[&str] = &["max_batch"];
const SYNC_KEYS: &[&str] = &["interval_ms", "max_unsynced"];
const GROUP_LOCAL_KEYS: &[&str] = &["tokens_per_second", "burst", "mode"];

/// `local`, checked against the groups of `limits` when those parsed.
pub(super) fn local_config(
    v: Option<&Value>,
    limits: Option<&TeamLimits>,
    errors: &mut Errors,
) -> LocalConfig {
    const BASE: &str = "local";
    let mut local = LocalConfig::default();
    let Some(v) = v else {
        return local;
    };
    let Some(obj) = errors.record(BASE, object(v)) else {
        return local;
    };
    check_keys(obj, BASE, LOCAL_KEYS, errors);
    if let Some(e) = obj.get("enabled") {
        local.enabled = errors
            .record(&join(BASE, "enabled"), boolean(e))
            .unwrap_or(DEFAULT_LOCAL_ENABLED);
    }
    if let Some(s) = obj.get("slots") {
        let slots = positive_u32_at_most(s, MAX_LOCAL_SLOTS);
        if let Some(n) = errors.record(&join(BASE, "slots"), slots) {
            local.slots = n;
        }
    }
    if let Some(m) = obj.get("mode") {
        let path = join(BASE, "mode");
        if let Some(mode) = one_of(m, &path, errors) {
            needs_local_layer(mode, local.enabled, &path, errors);
            local.mode = mode;
        }
    }
    if let Some(l) = obj.get("lease") {
        local.lease_max_batch = lease_max_batch(l, &join(BASE, "lease"), errors);
    }
    if let Some(s) = obj.get("sync") {
        sync_settings(s, &join(BASE, "sync"), &mut local, errors);
    }
    if let Some(groups) = obj.get("groups") {
        group_settings(groups, limits, &mut local, errors);
    }
    let explicit = obj
        .get("sync")
        .and_then(|s| s.get("max_unsynced"))
        .is_some();
    if let (true, Some(limits)) = (explicit, limits) {
        max_unsynced_fits(&local, limits, errors);
    }
    local
}

/// What the filter cannot count of a group: a sliding window in lease or sync mode (they count a fixed window
/// locally, so their bounds would not hold), named at the mode that
/// applies: the group's own (`local.groups.<group>.mode`) or `local.mode`.
const SLIDING_NEEDS_EXACT: &str = "lease and sync count fixed windows locally: their bounds do not hold for a \"sliding\" group; count it in \"exact\" mode";

pub(super) fn groups_fit(local: &LocalConfig, limits: &TeamLimits, errors: &mut Errors) {
    for g in limits.all_groups() {
        let mode = local.mode_for(g);
        if g.window == Window::Sliding && mode != Mode::Exact {
            let path = match local.group(&g.name).and_then(|l| l.mode) {
                Some(_) => join(&join(&join("local", "groups"), &g.name), "mode"),
                None => join("local", "mode"),
            };
            errors.push(path, SLIDING_NEEDS_EXACT);
        }
    }
}

/// A `local.sync.max_unsynced` set above half of a sync group's smallest
/// limit makes sync's overshoot bound larger than the limit it bounds.
fn max_unsynced_fits(local: &LocalConfig, limits: &TeamLimits, errors: &mut Errors) {
    let max = local.sync_max_unsynced;
    for g in limits.all_groups() {
        if local.mode_for(g) != Mode::Sync {
            continue;
        }
        let Some((unit, smallest)) = g.limits.iter().min_by_key(|(_, l)| *l) else {
            continue;
        };
        let bound = max_unsynced_bound(smallest);
        if max > bound {
            errors.push(
                "local.sync.max_unsynced",
                format!(
                    "{max} is more than half of group {:?}'s smallest limit ({smallest} per {}): \
                     sync's overshoot bound, 2 × (Envoys − 1) × max_unsynced per window, would \
                     exceed the limit itself; at most {bound} for this group",
                    g.name,
                    unit.service_unit()
                ),
            );
        }
    }
}

/// `local.groups`: each entry names a group of `limits`.
fn group_settings(
    groups: &Value,
    limits: Option<&TeamLimits>,
    local: &mut LocalConfig,
    errors: &mut Errors,
) {
    const BASE: &str = "local";
    let base = join(BASE, "groups");
    let Some(groups) = errors.record(&base, object(groups)) else {
        return;
    };
    for (name, params) in groups {
        let path = join(&base, name);
        // Only checkable when the limits themselves parsed.
        if let Some(limits) = limits {
            if !limits.all_groups().any(|g| g.name == *name) {
                errors.push(&path, no_such_group(limits));
            }
        }
        if let Some(g) = group_local(params, &path, local.enabled, errors) {
            local.groups.push((name.clone(), g));
        }
    }
}

/// `local.lease`: `{"max_batch": n}`, 1 to `MAX_LEASE_MAX_BATCH`.
fn lease_max_batch(v: &Value, path: &str, errors: &mut Errors) -> u32 {
    let Some(obj) = errors.record(path, object(v)) else {
        return DEFAULT_LEASE_MAX_BATCH;
    };
    check_keys(obj, path, LEASE_KEYS, errors);
    obj.get("max_batch")
        .and_then(|m| {
            let batch = positive_u32_at_most(m, MAX_LEASE_MAX_BATCH);
            errors.record(&join(path, "max_batch"), batch)
        })
        .unwrap_or(DEFAULT_LEASE_MAX_BATCH)
}

/// `local.sync`: `interval_ms` and `max_unsynced`, each within its range.
fn sync_settings(v: &Value, path: &str, local: &mut LocalConfig, errors: &mut Errors) {
    let Some(sync) = errors.record(path, object(v)) else {
        return;
    };
    check_keys(sync, path, SYNC_KEYS, errors);
    let mut bounded = |key: &str, min: u32, max: u32, default: u32| match sync.get(key) {
        None => default,
        Some(v) => errors
            .record(&join(path, key), positive_u32_in(v, min, max))
            .unwrap_or(default),
    };
    local.sync_interval_ms = bounded(
        "interval_ms",
        MIN_SYNC_INTERVAL_MS,
        MAX_SYNC_INTERVAL_MS,
        DEFAULT_SYNC_INTERVAL_MS,
    );
    local.sync_max_unsynced = bounded(
        "max_unsynced",
        1,
        MAX_SYNC_MAX_UNSYNCED,
        DEFAULT_SYNC_MAX_UNSYNCED,
    );
}

/// Lease and sync keep their tokens and counts in the local layer's shared
/// data: without it they cannot work.
fn needs_local_layer(mode: Mode, enabled: bool, path: &str, errors: &mut Errors) {
    if mode != Mode::Exact && !enabled {
        errors.push(
            path,
            format!(
                "{:?} needs the local layer, which local.enabled turns off",
                mode.name()
            ),
        );
    }
}

/// A `local.groups.<group>` entry: a bucket, a mode, or both.
fn group_local(v: &Value, path: &str, enabled: bool, errors: &mut Errors) -> Option<GroupLocal> {
    let obj = errors.record(path, object(v))?;
    check_keys(obj, path, GROUP_LOCAL_KEYS, errors);
    let mode = obj.get("mode").and_then(|m| {
        let mode_path = join(path, "mode");
        let mode = one_of(m, &mode_path, errors)?;
        needs_local_layer(mode, enabled, &mode_path, errors);
        Some(mode)
    });
    let has_bucket = obj.contains_key("tokens_per_second") || obj.contains_key("burst");
    let bucket = if has_bucket || !obj.contains_key("mode") {
        Some(bucket_params(obj, path, errors)?)
    } else {
        None
    };
    Some(GroupLocal { bucket, mode })
}

fn bucket_params(
    obj: &Map<String, Value>,
    path: &str,
    errors: &mut Errors,
) -> Option<BucketParams> {
    // None: left out; Some(None): invalid (recorded).
    let mut field = |key: &str| {
        obj.get(key)
            .map(|v| errors.record(&join(path, key), positive_u32(v)))
    };
    let rate = field("tokens_per_second");
    let burst = field("burst");
    match (rate, burst) {
        (Some(Some(r)), Some(Some(b))) => Some(BucketParams {
            tokens_per_second: r,
            burst: b,
        }),
        (Some(Some(r)), None) => Some(BucketParams {
            tokens_per_second: r,
            burst: r,
        }),
        (None, _) => {
            errors.push(
                join(path, "tokens_per_second"),
                FieldError::Missing("a group's bucket needs its refill rate"),
            );
            None
        }
        _ => None,
    }
}

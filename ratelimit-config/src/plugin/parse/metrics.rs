//! The `metrics` section: which groups' counters are series of their own.
//! Every group has its own by default; with `metrics.groups`, only the
//! listed ones, and the counters of every other group are summed under one
//! group, `other`. A configuration that exports more groups than
//! `METRICS_GROUPS_WARN` one by one gets a warning: each costs
//! `SERIES_PER_GROUP` series on every Envoy.

use serde_json::Value;

use crate::error::{join, Errors, Warning};
use crate::field::{non_empty_string, object};
use crate::model::TeamLimits;

use super::super::defaults::{METRICS_GROUPS_WARN, OTHER_GROUP, SERIES_PER_GROUP};
use super::super::types::MetricsConfig;
use super::{check_keys, no_such_group};

const METRICS_KEYS: &[&str] = &["groups"];

/// `metrics`, checked against the groups of `limits` when those parsed.
pub(super) fn metrics_config(
    v: Option<&Value>,
    limits: Option<&TeamLimits>,
    errors: &mut Errors,
    warnings: &mut Vec<Warning>,
) -> MetricsConfig {
    const BASE: &str = "metrics";
    let mut metrics = MetricsConfig::default();
    if let Some(obj) = v.and_then(|v| errors.record(BASE, object(v))) {
        check_keys(obj, BASE, METRICS_KEYS, errors);
        if let Some(g) = obj.get("groups") {
            metrics.groups = groups(g, &join(BASE, "groups"), limits, errors);
        }
    }
    if let Some(limits) = limits {
        let own = limits
            .all_groups()
            .filter(|g| metrics.exported(&g.name))
            .count();
        if own > METRICS_GROUPS_WARN {
            warnings.push(Warning {
                path: BASE.into(),
                message: format!(
                    "{own} groups have counters of their own ({SERIES_PER_GROUP} series each, {} in all, on every Envoy): list the groups to watch in metrics.groups; the others are then summed under group \"{OTHER_GROUP}\"",
                    own * SERIES_PER_GROUP
                ),
            });
        }
    }
    metrics
}

/// `metrics.groups`: group names of `limits` (one listed twice is listed);
/// no group may be named `other` (its series would be the sum's).
fn groups(
    v: &Value,
    path: &str,
    limits: Option<&TeamLimits>,
    errors: &mut Errors,
) -> Option<Vec<String>> {
    let Some(items) = v.as_array() else {
        errors.push(
            path,
            "must be an array of group names (the groups whose counters are series of their own)",
        );
        return None;
    };
    let before = errors.len();
    let mut names: Vec<String> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let Some(name) = errors.record(&at, non_empty_string(item)) else {
            continue;
        };
        if let Some(l) = limits.filter(|l| !l.all_groups().any(|g| g.name == name)) {
            errors.push(&at, no_such_group(l));
        }
        names.push(name.to_string());
    }
    if limits.is_some_and(|l| l.all_groups().any(|g| g.name == OTHER_GROUP)) {
        errors.push(
            path,
            format!(
                "a group is named \"{OTHER_GROUP}\", the name under which metrics.groups sums the groups it does not list: rename that group"
            ),
        );
    }
    if errors.len() > before {
        return None;
    }
    Some(names)
}

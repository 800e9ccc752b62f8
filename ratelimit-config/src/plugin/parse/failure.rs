//! What a request gets when the service cannot decide: `on_failure` (and
//! the older `failure_mode_deny`, which maps onto it), `status_on_error`,
//! the `breaker` and the `fallback`. A combination that contradicts itself
//! is refused, naming the field.

use serde_json::{Map, Value};

use crate::error::{join, Errors};
use crate::field::{boolean, describe, object, positive_u32_in, FieldError};

use super::super::defaults::{
    DEFAULT_BREAKER_FAILURES, DEFAULT_ON_FAILURE, DEFAULT_PROBE_INTERVAL_MS,
    DEFAULT_STATUS_ON_ERROR, MAX_BREAKER_FAILURES, MAX_FALLBACK_ENVOYS, MAX_PROBE_INTERVAL_MS,
    MIN_PROBE_INTERVAL_MS,
};
use super::super::names::{OnFailure, Share};
use super::super::types::{BreakerConfig, FallbackConfig};
use super::{check_keys, one_of};

const BREAKER_KEYS: &[&str] = &["enabled", "failures", "probe_interval_ms"];
const FALLBACK_KEYS: &[&str] = &["envoys", "share"];

/// The failure policy, as the configuration sets it.
pub(super) struct Failure {
    pub on_failure: OnFailure,
    pub status_on_error: u16,
    pub breaker: BreakerConfig,
    pub fallback: FallbackConfig,
}

/// `on_failure`, `failure_mode_deny`, `status_on_error`, `breaker` and
/// `fallback`, from the top-level object; `local_enabled` says whether the
/// local layer (where `local` keeps its counts) is on.
pub(super) fn failure_policy(
    obj: &Map<String, Value>,
    local_enabled: bool,
    errors: &mut Errors,
) -> Failure {
    let deny = obj
        .get("failure_mode_deny")
        .and_then(|v| errors.record("failure_mode_deny", boolean(v)));
    let named = obj
        .get("on_failure")
        .and_then(|v| one_of::<OnFailure>(v, "on_failure", errors));
    let on_failure = match (deny, named) {
        (Some(true), None) => OnFailure::Deny,
        (None | Some(false), None) => DEFAULT_ON_FAILURE,
        (None, Some(p)) | (Some(true), Some(p @ OnFailure::Deny)) => p,
        (Some(false), Some(p)) if p != OnFailure::Deny => p,
        (Some(d), Some(p)) => {
            errors.push(
                "failure_mode_deny",
                format!("{d} contradicts on_failure \"{}\"", p.as_str()),
            );
            p
        }
    };
    if on_failure == OnFailure::Local && !local_enabled {
        errors.push("on_failure", "\"local\" needs local.enabled");
    }
    let status_on_error = obj
        .get("status_on_error")
        .map_or(DEFAULT_STATUS_ON_ERROR, |v| {
            status(v, on_failure, errors).unwrap_or(DEFAULT_STATUS_ON_ERROR)
        });
    let breaker = breaker(obj.get("breaker"), errors);
    let fallback = fallback(obj.get("fallback"), on_failure, errors);
    Failure {
        on_failure,
        status_on_error,
        breaker,
        fallback,
    }
}

/// `status_on_error`: an HTTP status; an error status when it is what a
/// refused request gets.
fn status(v: &Value, on_failure: OnFailure, errors: &mut Errors) -> Option<u16> {
    let status = v
        .as_u64()
        .and_then(|n| u16::try_from(n).ok())
        .filter(|n| (200..=599).contains(n));
    let Some(s) = status else {
        errors.push(
            "status_on_error",
            format!(
                "must be an HTTP status from 200 to 599, got {}",
                describe(v)
            ),
        );
        return None;
    };
    if on_failure == OnFailure::Deny && s < 400 {
        errors.push(
            "status_on_error",
            format!("{s} would refuse with a success, the upstream never reached: on_failure \"deny\" needs 400 to 599"),
        );
    }
    Some(s)
}

fn breaker(v: Option<&Value>, errors: &mut Errors) -> BreakerConfig {
    const BASE: &str = "breaker";
    let mut b = BreakerConfig {
        enabled: true,
        failures: DEFAULT_BREAKER_FAILURES,
        probe_interval_ms: DEFAULT_PROBE_INTERVAL_MS,
    };
    let Some(obj) = v.and_then(|v| errors.record(BASE, object(v))) else {
        return b;
    };
    check_keys(obj, BASE, BREAKER_KEYS, errors);
    if let Some(e) = obj.get("enabled") {
        b.enabled = errors
            .record(&join(BASE, "enabled"), boolean(e))
            .unwrap_or(true);
    }
    let mut bounded = |key: &str, min: u32, max: u32, default: u32| {
        obj.get(key).map_or(default, |v| {
            errors
                .record(&join(BASE, key), positive_u32_in(v, min, max))
                .unwrap_or(default)
        })
    };
    b.failures = bounded(
        "failures",
        1,
        MAX_BREAKER_FAILURES,
        DEFAULT_BREAKER_FAILURES,
    );
    b.probe_interval_ms = bounded(
        "probe_interval_ms",
        MIN_PROBE_INTERVAL_MS,
        MAX_PROBE_INTERVAL_MS,
        DEFAULT_PROBE_INTERVAL_MS,
    );
    b
}

fn fallback(v: Option<&Value>, on_failure: OnFailure, errors: &mut Errors) -> FallbackConfig {
    const BASE: &str = "fallback";
    let mut f = FallbackConfig {
        envoys: 1,
        share: Share::Configured,
    };
    let local = on_failure == OnFailure::Local;
    let Some(v) = v else {
        if local {
            errors.push(
                join(BASE, "envoys"),
                FieldError::Missing("on_failure \"local\" needs the Envoys sharing each limit"),
            );
        }
        return f;
    };
    if !local {
        errors.push(
            BASE,
            format!(
                "only with on_failure \"local\", not \"{}\"",
                on_failure.as_str()
            ),
        );
    }
    let Some(obj) = errors.record(BASE, object(v)) else {
        return f;
    };
    check_keys(obj, BASE, FALLBACK_KEYS, errors);
    match obj.get("envoys") {
        Some(n) => {
            let envoys = positive_u32_in(n, 1, MAX_FALLBACK_ENVOYS);
            f.envoys = errors.record(&join(BASE, "envoys"), envoys).unwrap_or(1);
        }
        None if local => errors.push(
            join(BASE, "envoys"),
            FieldError::Missing("the Envoys sharing each limit"),
        ),
        None => {}
    }
    if let Some(s) = obj.get("share") {
        f.share = one_of(s, &join(BASE, "share"), errors).unwrap_or(Share::Configured);
    }
    f
}

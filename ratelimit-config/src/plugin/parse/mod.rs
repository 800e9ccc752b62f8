//! The parser of the plugin configuration: every key is checked, every
//! problem reported with its path, and a configuration is built only when
//! there is none. Unknown keys are errors, never silent defaults. Each
//! part is read by its own module: [`service`] (and the team file),
//! [`tenant`], [`local`], [`failure`], [`cost`], [`metrics`].

mod cost;
mod failure;
mod local;
mod metrics;
mod service;
mod tenant;
#[cfg(test)]
mod tests;

use serde_json::{Map, Value};

use crate::error::{join, ConfigError, Errors, Warning};
use crate::field::{
    boolean, describe, non_empty_string, starts_with_bom, unknown_keys, FieldError, BOM_MESSAGE,
};
use crate::json_text::duplicate_keys;
use crate::model::TeamLimits;

use super::defaults::{
    DEFAULT_DESCRIPTOR_KEY, DEFAULT_HEADERS, DEFAULT_MISSING_TENANT, DEFAULT_NEAR_LIMIT_PPM,
    DEFAULT_SHADOW, PPM,
};
use super::names::Named;
use super::types::{PluginConfig, TenantSource};

pub use tenant::default_max_tenant_length;

const KEYS: &[&str] = &[
    "domain",
    "limits",
    "rate_limit_service",
    "on_failure",
    "failure_mode_deny",
    "status_on_error",
    "breaker",
    "fallback",
    "missing_tenant",
    "max_tenant_length",
    "descriptor_key",
    "headers",
    "local",
    "shadow",
    "near_limit_ratio",
    "cost_header",
    "max_cost",
    "response_cost_header",
    "tenant_source",
    "metrics",
];

/// Records an error for each key of `obj` (at `base`) not in `allowed`.
fn check_keys(
    obj: &Map<String, Value>,
    base: &str,
    allowed: &'static [&'static str],
    errors: &mut Errors,
) {
    for (key, e) in unknown_keys(obj, allowed) {
        errors.push(join(base, key), e);
    }
}

/// The option named by `v`, or None with the names it may take recorded.
fn one_of<T: Named>(v: &Value, path: &str, errors: &mut Errors) -> Option<T> {
    let found = v
        .as_str()
        .and_then(|s| T::ALL.iter().copied().find(|t| t.name() == s));
    if found.is_none() {
        errors.push(
            path,
            FieldError::NotOneOf {
                expected: T::ALL.iter().map(|t| t.name()).collect(),
                got: describe(v),
            },
        );
    }
    found
}

/// The message for a name that is no group of `limits`.
fn no_such_group(limits: &TeamLimits) -> String {
    let names: Vec<&str> = limits.all_groups().map(|g| g.name.as_str()).collect();
    format!(
        "no such group in limits, expected one of {}",
        names.join(", ")
    )
}

/// The value of an optional key: its default when it is left out, and also
/// when it is invalid (the error is recorded, and no configuration is built).
fn or_default<T>(v: Option<&Value>, default: T, parse: impl FnOnce(&Value) -> Option<T>) -> T {
    v.and_then(parse).unwrap_or(default)
}

/// A problem with the whole text: nothing else can be checked.
fn refused(message: String) -> Vec<ConfigError> {
    vec![ConfigError {
        path: String::new(),
        message,
    }]
}

/// The text as a JSON object, with the keys it holds twice as errors; a
/// text that is no JSON object is refused whole.
fn document(bytes: &[u8]) -> Result<(Map<String, Value>, Errors), Vec<ConfigError>> {
    if starts_with_bom(bytes) {
        return Err(refused(BOM_MESSAGE.into()));
    }
    let doc: Value =
        serde_json::from_slice(bytes).map_err(|e| refused(format!("not valid JSON: {e}")))?;
    let Value::Object(obj) = doc else {
        return Err(refused(format!(
            "must be a JSON object, got {}",
            describe(&doc)
        )));
    };
    let mut errors = Errors::default();
    // serde_json keeps the last of two equal keys without a word: a group
    // pasted twice would silently replace the first. The text says where.
    // (It parsed as JSON, so it is UTF-8.)
    if let Ok(text) = std::str::from_utf8(bytes) {
        for d in duplicate_keys(text) {
            let message = d.message(true);
            errors.push(d.path, message);
        }
    }
    Ok((obj, errors))
}

/// `domain`, required.
fn domain(v: Option<&Value>, errors: &mut Errors) -> Option<String> {
    match v {
        Some(v) => errors
            .record("domain", non_empty_string(v))
            .map(str::to_string),
        None => {
            errors.push(
                "domain",
                FieldError::Missing("the rate-limit service domain is required"),
            );
            None
        }
    }
}

/// Parses the plugin configuration. On success also returns the warnings of
/// its team limits.
pub fn parse_plugin_config(bytes: &[u8]) -> Result<(PluginConfig, Vec<Warning>), Vec<ConfigError>> {
    let (obj, mut errors) = document(bytes)?;
    check_keys(&obj, "", KEYS, &mut errors);
    let get = |k: &str| obj.get(k);
    // Every field is checked, in the order of the fields, so that every
    // problem is reported.
    let domain = domain(get("domain"), &mut errors);
    let (rls, limits, mut warnings) =
        service::service_and_limits(get("rate_limit_service"), get("limits"), &mut errors);
    let missing_tenant = or_default(get("missing_tenant"), DEFAULT_MISSING_TENANT, |v| {
        one_of(v, "missing_tenant", &mut errors)
    });
    let max_tenant_length =
        tenant::max_tenant_length(get("max_tenant_length"), limits.as_ref(), &mut errors);
    let descriptor_key = or_default(
        get("descriptor_key"),
        DEFAULT_DESCRIPTOR_KEY.to_string(),
        |v| {
            errors
                .record("descriptor_key", non_empty_string(v))
                .map(str::to_string)
        },
    );
    let headers = or_default(get("headers"), DEFAULT_HEADERS, |v| {
        one_of(v, "headers", &mut errors)
    });
    let local = local::local_config(get("local"), limits.as_ref(), &mut errors);
    if let Some(l) = &limits {
        local::groups_fit(&local, l, &mut errors);
    }
    let failure = failure::failure_policy(&obj, local.enabled, &mut errors);
    let shadow = or_default(get("shadow"), DEFAULT_SHADOW, |v| {
        errors.record("shadow", boolean(v))
    });
    let near_limit_ppm = or_default(get("near_limit_ratio"), DEFAULT_NEAR_LIMIT_PPM, |v| {
        near_limit_ratio(v, &mut errors)
    });
    let costs = cost::costs(&obj, limits.as_ref(), &mut errors);
    let tenant_source = get("tenant_source").map_or(TenantSource::Header, |v| {
        tenant::tenant_source(v, &mut errors)
    });
    let metrics =
        metrics::metrics_config(get("metrics"), limits.as_ref(), &mut errors, &mut warnings);
    // Built only when there was no problem.
    match (limits, errors.is_empty()) {
        (Some(limits), true) => Ok((
            PluginConfig {
                domain: domain.unwrap_or_default(),
                limits,
                cluster: rls.cluster.unwrap_or_default(),
                service: rls.service,
                timeout_ms: rls.timeout_ms,
                batch: rls.batch,
                on_failure: failure.on_failure,
                status_on_error: failure.status_on_error,
                breaker: failure.breaker,
                fallback: failure.fallback,
                missing_tenant,
                max_tenant_length,
                descriptor_key,
                headers,
                local,
                shadow,
                near_limit_ppm,
                cost: costs.cost,
                response_cost: costs.response_cost,
                tenant_source,
                metrics,
            },
            warnings,
        )),
        _ => Err(errors.0),
    }
}

/// `near_limit_ratio`: a number with 0 < r <= 1, kept in millionths.
fn near_limit_ratio(v: &Value, errors: &mut Errors) -> Option<u32> {
    let ppm = v
        .as_f64()
        .filter(|r| *r > 0.0 && *r <= 1.0)
        .map(|r| (r * f64::from(PPM)).round())
        // A ratio under half a millionth rounds to 0: refused with the rest.
        .filter(|ppm| *ppm >= 1.0);
    match ppm {
        // In 1..=PPM, so the conversion is exact.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Some(ppm) => Some(ppm as u32),
        None => {
            errors.push(
                "near_limit_ratio",
                format!(
                    "must be a number greater than 0 and at most 1 (the share of a window's limit used), got {}",
                    describe(v)
                ),
            );
            None
        }
    }
}

//! The parser of the plugin configuration: every key is checked, every
//! problem reported with its path, and a configuration is built only when
//! there is none. Unknown keys are errors, never silent defaults. The
//! `local` section is read by [`local`].

mod failure;
mod local;
mod metrics;
#[cfg(test)]
mod tests;

use serde_json::{Map, Value};

use crate::error::{excerpt, join, ConfigError, Errors, Warning};
use crate::field::{
    boolean, describe, header_name, non_empty_string, object, positive_u32, positive_u32_at_most,
    starts_with_bom, unknown_keys, FieldError, BOM_MESSAGE,
};
use crate::json_text::duplicate_keys;
use crate::model::{Service, TeamLimits};
use crate::validate::parse_team_limits_for;

use super::defaults::{
    max_tenant_length_fitting, DEFAULT_DESCRIPTOR_KEY, DEFAULT_HEADERS, DEFAULT_MAX_COST,
    DEFAULT_MAX_TENANT_LENGTH, DEFAULT_MISSING_TENANT, DEFAULT_NEAR_LIMIT_PPM, DEFAULT_SHADOW,
    DEFAULT_TIMEOUT_MS, MAX_BATCH_MAX_DESCRIPTORS, MAX_BATCH_MAX_IN_FLIGHT, MAX_MAX_COST,
    MAX_MAX_TENANT_LENGTH, MAX_PROPERTY_SEGMENTS, MAX_TIMEOUT_MS, PPM,
};
use super::names::Named;
use super::types::{BatchConfig, CostConfig, PluginConfig, TenantSource};

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
const TENANT_SOURCE_KEYS: &[&str] = &["property"];
const PROPERTY_SHAPE: &str = "must be an array of 1 to 16 path segments (strings)";
const SERVICE_KEYS: &[&str] = &["cluster", "service", "timeout_ms", "batch"];
const BATCH_KEYS: &[&str] = &["max_descriptors", "max_in_flight"];

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

/// Parses the plugin configuration. On success also returns the warnings of
/// its team limits.
pub fn parse_plugin_config(bytes: &[u8]) -> Result<(PluginConfig, Vec<Warning>), Vec<ConfigError>> {
    if starts_with_bom(bytes) {
        return Err(refused(BOM_MESSAGE.into()));
    }
    let doc: Value =
        serde_json::from_slice(bytes).map_err(|e| refused(format!("not valid JSON: {e}")))?;
    let Value::Object(obj) = &doc else {
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
    check_keys(obj, "", KEYS, &mut errors);
    let get = |k: &str| obj.get(k);

    let domain = match get("domain") {
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
    };
    // Read first (the team file's rules depend on the service), reported
    // after the limits' problems, in the order of the fields.
    let mut service_errors = Errors::default();
    let (cluster, service, timeout_ms, batch) =
        rate_limit_service(get("rate_limit_service"), &mut service_errors);
    let mut warnings = Vec::new();
    let limits = match get("limits") {
        Some(v) => match parse_team_limits_for(v, "limits", service) {
            Ok((l, w)) => {
                warnings = w;
                Some(l)
            }
            Err(e) => {
                errors.0.extend(e);
                None
            }
        },
        None => {
            errors.push(
                "limits",
                FieldError::Missing("the team limits JSON is required"),
            );
            None
        }
    };
    errors.0.extend(service_errors.0);
    let missing_tenant = or_default(get("missing_tenant"), DEFAULT_MISSING_TENANT, |v| {
        one_of(v, "missing_tenant", &mut errors)
    });
    let max_tenant_length = match get("max_tenant_length") {
        None => limits
            .as_ref()
            .map_or(DEFAULT_MAX_TENANT_LENGTH, default_max_tenant_length),
        Some(v) => {
            let n = positive_u32(v).and_then(|n| match n {
                n if n <= MAX_MAX_TENANT_LENGTH => Ok(n),
                got => Err(FieldError::AboveMax {
                    max: MAX_MAX_TENANT_LENGTH,
                    got,
                    unit: Some("bytes"),
                }),
            });
            match errors.record("max_tenant_length", n) {
                Some(n) => {
                    if let Some(limits) = &limits {
                        listed_tenants_fit(limits, n, &mut errors);
                    }
                    n
                }
                None => DEFAULT_MAX_TENANT_LENGTH,
            }
        }
    };
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
    let failure = failure::failure_policy(obj, local.enabled, &mut errors);
    let shadow = or_default(get("shadow"), DEFAULT_SHADOW, |v| {
        errors.record("shadow", boolean(v))
    });
    let near_limit_ppm = or_default(get("near_limit_ratio"), DEFAULT_NEAR_LIMIT_PPM, |v| {
        near_limit_ratio(v, &mut errors)
    });
    let response_cost = response_cost_header(get("response_cost_header"), &mut errors);
    let (cost, max_cost) = cost_config(
        get("cost_header"),
        get("max_cost"),
        limits.as_ref(),
        response_cost.is_some(),
        &mut errors,
    );
    let response_cost = response_cost.map(|header| CostConfig {
        header,
        max: max_cost,
    });
    let tenant_source =
        get("tenant_source").map_or(TenantSource::Header, |v| tenant_source(v, &mut errors));
    let metrics =
        metrics::metrics_config(get("metrics"), limits.as_ref(), &mut errors, &mut warnings);

    // Every field was checked, so every problem is reported; build only
    // when there were none.
    match (limits, errors.is_empty()) {
        (Some(limits), true) => Ok((
            PluginConfig {
                domain: domain.unwrap_or_default(),
                limits,
                cluster: cluster.unwrap_or_default(),
                service,
                timeout_ms,
                batch,
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
                cost,
                response_cost,
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

/// `max_tenant_length` when it is left out: the default, or the longest
/// tenant value listed in `header_value` when that is longer (a team file may
/// list values up to 256 bytes), so that limits the CLI accepts are never
/// refused by the filter.
pub fn default_max_tenant_length(limits: &TeamLimits) -> u32 {
    let longest = limits
        .groups
        .iter()
        .flat_map(|g| g.tenants.iter())
        .map(String::len)
        .max()
        .unwrap_or(0);
    max_tenant_length_fitting(longest)
}

/// A tenant listed in `header_value` that is longer than `max_tenant_length`
/// could never be served: every request carrying it would be refused (431).
fn listed_tenants_fit(limits: &TeamLimits, max: u32, errors: &mut Errors) {
    let max_len = usize::try_from(max).unwrap_or(usize::MAX);
    for g in &limits.groups {
        for (i, t) in g.tenants.iter().enumerate() {
            if t.len() > max_len {
                let path = join(
                    &join(&join("limits", &limits.header), &g.name),
                    "header_value",
                );
                errors.push(
                    format!("{path}[{i}]"),
                    format!(
                        "tenant value {} is {} bytes, longer than max_tenant_length ({max}): its requests would all be refused with 431; raise max_tenant_length",
                        excerpt(t),
                        t.len()
                    ),
                );
            }
        }
    }
}

/// `response_cost_header`: the response header (and trailer) whose value
/// the upstream sets to what the request cost.
fn response_cost_header(v: Option<&Value>, errors: &mut Errors) -> Option<String> {
    let name = errors.record("response_cost_header", non_empty_string(v?))?;
    errors.record("response_cost_header", header_name(name))?;
    Some(name.to_string())
}

/// `cost_header` and `max_cost`: both optional; `max_cost` only with a
/// `cost_header` or a `response_cost_header` (alone it would do nothing,
/// which is a mistake to report). Also returns `max_cost`, which bounds a
/// response's cost too.
fn cost_config(
    header: Option<&Value>,
    max_value: Option<&Value>,
    limits: Option<&TeamLimits>,
    response_cost: bool,
    errors: &mut Errors,
) -> (Option<CostConfig>, u32) {
    let max = match max_value {
        None => Some(DEFAULT_MAX_COST),
        Some(v) => errors.record("max_cost", positive_u32_at_most(v, MAX_MAX_COST)),
    };
    let cost = request_cost(
        header,
        max_value.is_some(),
        max,
        limits,
        response_cost,
        errors,
    );
    (cost, max.unwrap_or(DEFAULT_MAX_COST))
}

fn request_cost(
    header: Option<&Value>,
    max_given: bool,
    max: Option<u32>,
    limits: Option<&TeamLimits>,
    response_cost: bool,
    errors: &mut Errors,
) -> Option<CostConfig> {
    let Some(header) = header else {
        if max_given && !response_cost {
            errors.push(
                "max_cost",
                "needs cost_header or response_cost_header (the header that carries the cost)",
            );
        }
        return None;
    };
    let name = errors.record("cost_header", non_empty_string(header))?;
    errors.record("cost_header", header_name(name))?;
    if limits.is_some_and(|l| l.header == name) {
        errors.push(
            "cost_header",
            format!(
                "{} is the tenant header; the cost needs a header of its own",
                excerpt(name)
            ),
        );
        return None;
    }
    Some(CostConfig {
        header: name.to_string(),
        max: max?,
    })
}

/// `tenant_source`: `{"property": [segment, ...]}`, the path of an Envoy
/// attribute (each segment a non-empty string; proxy-wasm joins them with
/// NUL, so a segment cannot hold one).
fn tenant_source(v: &Value, errors: &mut Errors) -> TenantSource {
    const BASE: &str = "tenant_source";
    let Some(obj) = errors.record(BASE, object(v)) else {
        return TenantSource::Header;
    };
    check_keys(obj, BASE, TENANT_SOURCE_KEYS, errors);
    let path = join(BASE, "property");
    let Some(p) = obj.get("property") else {
        errors.push(
            path,
            FieldError::Missing(
                "the path of the Envoy attribute that holds the tenant, e.g. [\"metadata\", \"filter_metadata\", \"envoy.filters.http.jwt_authn\", \"jwt_payload\", \"tenant\"]",
            ),
        );
        return TenantSource::Header;
    };
    let items = match p.as_array() {
        Some(items) if (1..=MAX_PROPERTY_SEGMENTS).contains(&items.len()) => items,
        _ => {
            errors.push(path, PROPERTY_SHAPE);
            return TenantSource::Header;
        }
    };
    let mut segments = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{path}[{i}]");
        match errors.record(&at, non_empty_string(item)) {
            Some(s) if s.contains('\0') => errors.push(at, "must not contain a NUL character"),
            Some(s) => segments.push(s.to_string()),
            None => {}
        }
    }
    TenantSource::Property(segments)
}

fn rate_limit_service(
    v: Option<&Value>,
    errors: &mut Errors,
) -> (Option<String>, Service, u32, BatchConfig) {
    const BASE: &str = "rate_limit_service";
    let none = |timeout| (None, Service::default(), timeout, BatchConfig::default());
    let Some(v) = v else {
        errors.push(
            BASE,
            FieldError::Missing(
                "{\"cluster\": <name of the Envoy cluster of the rate-limit service>} is required",
            ),
        );
        return none(DEFAULT_TIMEOUT_MS);
    };
    let Some(obj) = errors.record(BASE, object(v)) else {
        return none(DEFAULT_TIMEOUT_MS);
    };
    check_keys(obj, BASE, SERVICE_KEYS, errors);
    let cluster_path = join(BASE, "cluster");
    let cluster = match obj.get("cluster") {
        Some(c) => errors
            .record(&cluster_path, non_empty_string(c))
            .map(str::to_string),
        None => {
            errors.push(
                cluster_path,
                FieldError::Missing("the Envoy cluster of the rate-limit service is required"),
            );
            None
        }
    };
    let service = match obj.get("service") {
        None => Service::default(),
        Some(v) => match v.as_str().and_then(Service::from_name) {
            Some(s) => s,
            None => {
                errors.push(
                    join(BASE, "service"),
                    "must be \"envoy-ratelimit\" or \"counter\"",
                );
                Service::default()
            }
        },
    };
    let timeout = or_default(obj.get("timeout_ms"), DEFAULT_TIMEOUT_MS, |t| {
        errors.record(
            &join(BASE, "timeout_ms"),
            positive_u32_at_most(t, MAX_TIMEOUT_MS),
        )
    });
    let batch = obj.get("batch").map_or_else(BatchConfig::default, |b| {
        batch(b, &join(BASE, "batch"), errors)
    });
    (cluster, service, timeout, batch)
}

/// `rate_limit_service.batch`: `false` (one request per call), `true` (the
/// defaults), or `{"max_descriptors": n, "max_in_flight": n}`, each key
/// optional.
fn batch(v: &Value, path: &str, errors: &mut Errors) -> BatchConfig {
    let mut batch = BatchConfig::default();
    let obj = match v {
        Value::Bool(enabled) => {
            batch.enabled = *enabled;
            return batch;
        }
        Value::Object(obj) => obj,
        other => {
            errors.push(
                path,
                format!(
                    "must be false (one request per call), true, or an object {{\"max_descriptors\": n, \"max_in_flight\": n}}, got {}",
                    describe(other)
                ),
            );
            return batch;
        }
    };
    check_keys(obj, path, BATCH_KEYS, errors);
    let mut bounded = |key: &str, max: u32, default: u32| match obj.get(key) {
        None => default,
        Some(v) => errors
            .record(&join(path, key), positive_u32_at_most(v, max))
            .unwrap_or(default),
    };
    batch.max_descriptors = bounded(
        "max_descriptors",
        MAX_BATCH_MAX_DESCRIPTORS,
        batch.max_descriptors,
    );
    batch.max_in_flight = bounded(
        "max_in_flight",
        MAX_BATCH_MAX_IN_FLIGHT,
        batch.max_in_flight,
    );
    batch
}

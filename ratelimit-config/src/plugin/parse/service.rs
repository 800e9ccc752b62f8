//! `rate_limit_service` (the cluster, the service that counts, the
//! timeout, batching) and `limits`, the team file, read for that service.

use serde_json::Value;

use crate::error::{join, Errors, Warning};
use crate::field::{describe, non_empty_string, object, positive_u32_at_most, FieldError};
use crate::model::{Service, TeamLimits};
use crate::validate::parse_team_limits_for;

use super::super::defaults::{
    DEFAULT_TIMEOUT_MS, MAX_BATCH_MAX_DESCRIPTORS, MAX_BATCH_MAX_IN_FLIGHT, MAX_TIMEOUT_MS,
};
use super::super::types::BatchConfig;
use super::{check_keys, or_default};

const SERVICE_KEYS: &[&str] = &["cluster", "service", "timeout_ms", "batch"];
const BATCH_KEYS: &[&str] = &["max_descriptors", "max_in_flight"];

/// `rate_limit_service`, checked.
pub(super) struct RateLimitService {
    pub cluster: Option<String>,
    pub service: Service,
    pub timeout_ms: u32,
    pub batch: BatchConfig,
}

/// `rate_limit_service` and `limits`: the service is read first (the team
/// file's rules depend on it), its problems reported after the limits',
/// in the order of the fields. Also returns the team file's warnings.
pub(super) fn service_and_limits(
    service: Option<&Value>,
    limits: Option<&Value>,
    errors: &mut Errors,
) -> (RateLimitService, Option<TeamLimits>, Vec<Warning>) {
    let mut service_errors = Errors::default();
    let service = rate_limit_service(service, &mut service_errors);
    let mut warnings = Vec::new();
    let limits = match limits {
        Some(v) => match parse_team_limits_for(v, "limits", service.service) {
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
    (service, limits, warnings)
}

fn rate_limit_service(v: Option<&Value>, errors: &mut Errors) -> RateLimitService {
    const BASE: &str = "rate_limit_service";
    let none = |timeout_ms| RateLimitService {
        cluster: None,
        service: Service::default(),
        timeout_ms,
        batch: BatchConfig::default(),
    };
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
    let timeout_ms = or_default(obj.get("timeout_ms"), DEFAULT_TIMEOUT_MS, |t| {
        errors.record(
            &join(BASE, "timeout_ms"),
            positive_u32_at_most(t, MAX_TIMEOUT_MS),
        )
    });
    let batch = obj.get("batch").map_or_else(BatchConfig::default, |b| {
        batch(b, &join(BASE, "batch"), errors)
    });
    RateLimitService {
        cluster,
        service,
        timeout_ms,
        batch,
    }
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

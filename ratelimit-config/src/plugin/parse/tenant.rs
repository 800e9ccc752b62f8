//! The tenant's settings: `missing_tenant`, `max_tenant_length` (checked
//! against the tenants the team file lists), `descriptor_key` and
//! `tenant_source`.

use serde_json::Value;

use crate::error::{excerpt, join, Errors};
use crate::field::{non_empty_string, object, positive_u32, FieldError};
use crate::model::TeamLimits;

use super::super::defaults::{
    max_tenant_length_fitting, DEFAULT_MAX_TENANT_LENGTH, MAX_MAX_TENANT_LENGTH,
    MAX_PROPERTY_SEGMENTS,
};
use super::super::types::TenantSource;
use super::check_keys;

const TENANT_SOURCE_KEYS: &[&str] = &["property"];
const PROPERTY_SHAPE: &str = "must be an array of 1 to 16 path segments (strings)";

/// `max_tenant_length`: when it is left out, what fits the listed tenants
/// ([`default_max_tenant_length`]); when given, every listed tenant must fit.
pub(super) fn max_tenant_length(
    v: Option<&Value>,
    limits: Option<&TeamLimits>,
    errors: &mut Errors,
) -> u32 {
    let Some(v) = v else {
        return limits.map_or(DEFAULT_MAX_TENANT_LENGTH, default_max_tenant_length);
    };
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
            if let Some(limits) = limits {
                listed_tenants_fit(limits, n, errors);
            }
            n
        }
        None => DEFAULT_MAX_TENANT_LENGTH,
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

/// `tenant_source`: `{"property": [segment, ...]}`, the path of an Envoy
/// attribute (each segment a non-empty string; proxy-wasm joins them with
/// NUL, so a segment cannot hold one).
pub(super) fn tenant_source(v: &Value, errors: &mut Errors) -> TenantSource {
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

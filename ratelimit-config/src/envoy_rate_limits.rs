//! Generation of the `rate_limits` block for Envoy's own rate-limit filter
//! (`envoy.filters.http.ratelimit`), for teams that use it instead of the
//! wasm filter: per unit, `generic_key: per_<unit>` then the tenant header,
//! the same descriptors the wasm filter sends, matching the service YAML.
//!
//! Envoy's filter sends every unit to every tenant, whatever its group; the
//! service YAML gives a tenant whose group leaves a unit out an `unlimited`
//! rule for it, so the default group's rule never catches it.
//!
//! Route limits (`routes` in the team file) are the route's own
//! `rate_limits` (envoy-route-rate-limits.yaml): Envoy has no action that
//! names the matched route, so the route's entry is a `generic_key` with
//! `descriptor_key: route` and the route's name as its value, written on
//! that route. Its descriptors are then the filter's, entry for entry:
//! `[generic_key=per_<unit>, tenant=<t>, route=<name>]`. Envoy sends them
//! for every tenant on the route; the service YAML's rules give them a
//! limit only for the groups that set one (a listed tenant's rule stops the
//! walk before the default's route rules).

use std::fmt::Write;

use crate::model::{TeamLimits, Unit, ROUTE_DESCRIPTOR_KEY};
use crate::service_yaml::{comment_text, generated_header, scalar};

/// The `rate_limits` block, as a YAML document of its own.
pub fn envoy_rate_limits_yaml(
    limits: &TeamLimits,
    domain: &str,
    descriptor_key: &str,
    source: &str,
) -> String {
    let mut out = String::new();
    generated_header(&mut out, source);
    let _ = writeln!(
        out,
        "# For envoy.filters.http.ratelimit with domain {}: put rate_limits on the",
        comment_text(&scalar(domain))
    );
    let _ = writeln!(
        out,
        "# route or virtual host. A request without the {} header sends no",
        comment_text(&limits.header)
    );
    let _ = writeln!(out, "# descriptor and is not limited.");
    let _ = writeln!(out, "rate_limits:");
    for unit in limits.units_in_use() {
        tenant_actions(&mut out, "  ", limits, unit, descriptor_key);
    }
    out
}

/// The actions of one `rate_limits` entry of the tenant's descriptor for
/// `unit`, at `indent`.
fn tenant_actions(out: &mut String, indent: &str, limits: &TeamLimits, unit: Unit, key: &str) {
    let _ = writeln!(out, "{indent}- actions:");
    let _ = writeln!(
        out,
        "{indent}    - generic_key: {{ descriptor_value: {} }}",
        unit.descriptor_value()
    );
    let _ = writeln!(
        out,
        "{indent}    - request_headers: {{ header_name: {}, descriptor_key: {} }}",
        scalar(&limits.header),
        scalar(key)
    );
}

/// The `rate_limits` of every route some group limits, as a YAML mapping of
/// route name to the route's `rate_limits`; None when no group has routes.
/// A route's own `rate_limits` replace the virtual host's (Envoy's default,
/// `vh_rate_limits: OVERRIDE`), so each repeats the tenant's entries and
/// adds one per unit some group limits on the route.
pub fn envoy_route_rate_limits_yaml(
    limits: &TeamLimits,
    domain: &str,
    descriptor_key: &str,
    source: &str,
) -> Option<String> {
    let mut names: Vec<&str> = Vec::new();
    for r in limits.all_groups().flat_map(|g| g.routes.iter()) {
        if !names.contains(&r.name.as_str()) {
            names.push(&r.name);
        }
    }
    if names.is_empty() {
        return None;
    }
    let mut out = String::new();
    generated_header(&mut out, source);
    let _ = writeln!(
        out,
        "# For envoy.filters.http.ratelimit with domain {}: each route named below",
        comment_text(&scalar(domain))
    );
    let _ = writeln!(
        out,
        "# (its `name` in the route configuration) takes these rate_limits on its"
    );
    let _ = writeln!(
        out,
        "# `route:`. They repeat the tenant's: a route's own rate_limits replace the"
    );
    let _ = writeln!(out, "# virtual host's.");
    for name in names {
        let _ = writeln!(out, "{}:", scalar(name));
        let _ = writeln!(out, "  rate_limits:");
        for unit in limits.units_in_use() {
            tenant_actions(&mut out, "    ", limits, unit, descriptor_key);
        }
        let on_route: Vec<_> = limits
            .all_groups()
            .flat_map(|g| g.routes.iter())
            .filter(|r| r.name == name)
            .collect();
        for unit in Unit::ALL {
            if on_route.iter().any(|r| r.limits.get(unit).is_some()) {
                tenant_actions(&mut out, "    ", limits, unit, descriptor_key);
                let _ = writeln!(
                    out,
                    "        - generic_key: {{ descriptor_key: {ROUTE_DESCRIPTOR_KEY}, descriptor_value: {} }}",
                    scalar(name)
                );
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::parse_team_limits;
    use serde_json::json;

    #[test]
    fn one_entry_per_unit_in_use() {
        let doc = json!({"x-tenant-id": {
            "default": {"persecond": 5},
            "gold": {"perday": 9, "header_value": ["t"]}}});
        let (l, _) = parse_team_limits(&doc, "").unwrap();
        assert_eq!(
            envoy_rate_limits_yaml(&l, "api", "tenant", "limits.json"),
            r#"# generated from limits.json by ratelimit-config; do not edit
# For envoy.filters.http.ratelimit with domain api: put rate_limits on the
# route or virtual host. A request without the x-tenant-id header sends no
# descriptor and is not limited.
rate_limits:
  - actions:
      - generic_key: { descriptor_value: per_second }
      - request_headers: { header_name: x-tenant-id, descriptor_key: tenant }
  - actions:
      - generic_key: { descriptor_value: per_day }
      - request_headers: { header_name: x-tenant-id, descriptor_key: tenant }
"#
        );
    }

    #[test]
    fn each_limited_route_repeats_the_tenants_entries_and_adds_its_own() {
        let doc = json!({"x-tenant-id": {
            "default": {"perminute": 600, "routes": {"reports": {"perminute": 5}}},
            "gold": {"perminute": 6000, "header_value": ["t"],
                     "routes": {"reports": {"perday": 50}, "a b": {"perminute": 9}}}}});
        let (l, _) = parse_team_limits(&doc, "").unwrap();
        assert_eq!(
            envoy_route_rate_limits_yaml(&l, "api", "tenant", "limits.json").unwrap(),
            r#"# generated from limits.json by ratelimit-config; do not edit
# For envoy.filters.http.ratelimit with domain api: each route named below
# (its `name` in the route configuration) takes these rate_limits on its
# `route:`. They repeat the tenant's: a route's own rate_limits replace the
# virtual host's.
reports:
  rate_limits:
    - actions:
        - generic_key: { descriptor_value: per_minute }
        - request_headers: { header_name: x-tenant-id, descriptor_key: tenant }
    - actions:
        - generic_key: { descriptor_value: per_day }
        - request_headers: { header_name: x-tenant-id, descriptor_key: tenant }
    - actions:
        - generic_key: { descriptor_value: per_minute }
        - request_headers: { header_name: x-tenant-id, descriptor_key: tenant }
        - generic_key: { descriptor_key: route, descriptor_value: reports }
    - actions:
        - generic_key: { descriptor_value: per_day }
        - request_headers: { header_name: x-tenant-id, descriptor_key: tenant }
        - generic_key: { descriptor_key: route, descriptor_value: reports }
"a b":
  rate_limits:
    - actions:
        - generic_key: { descriptor_value: per_minute }
        - request_headers: { header_name: x-tenant-id, descriptor_key: tenant }
    - actions:
        - generic_key: { descriptor_value: per_day }
        - request_headers: { header_name: x-tenant-id, descriptor_key: tenant }
    - actions:
        - generic_key: { descriptor_value: per_minute }
        - request_headers: { header_name: x-tenant-id, descriptor_key: tenant }
        - generic_key: { descriptor_key: route, descriptor_value: "a b" }
"#
        );
        let (none, _) =
            parse_team_limits(&json!({"x-t": {"default": {"perhour": 1}}}), "").unwrap();
        assert_eq!(
            envoy_route_rate_limits_yaml(&none, "api", "tenant", "l.json"),
            None
        );
    }
}

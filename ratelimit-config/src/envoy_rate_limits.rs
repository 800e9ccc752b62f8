//! Generation of the `rate_limits` block for Envoy's own rate-limit filter
//! (`envoy.filters.http.ratelimit`), for teams that use it instead of the
//! wasm filter: per unit, `generic_key: per_<unit>` then the tenant header,
//! the same descriptors the wasm filter sends, matching the service YAML.
//!
//! Envoy's filter sends every unit to every tenant, whatever its group; the
//! service YAML gives a tenant whose group leaves a unit out an `unlimited`
//! rule for it, so the default group's rule never catches it.

use std::fmt::Write;

use crate::model::TeamLimits;
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
        let _ = writeln!(out, "  - actions:");
        let _ = writeln!(
            out,
            "      - generic_key: {{ descriptor_value: {} }}",
            unit.descriptor_value()
        );
        let _ = writeln!(
            out,
            "      - request_headers: {{ header_name: {}, descriptor_key: {} }}",
            scalar(&limits.header),
            scalar(descriptor_key)
        );
    }
    out
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
}

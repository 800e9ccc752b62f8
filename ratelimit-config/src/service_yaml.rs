//! Generation of the envoyproxy/ratelimit service configuration.
//!
//! One top-level descriptor per unit (`generic_key: per_<unit>`), and under
//! it a bare `<descriptor key>` rule for the default group plus one
//! value-specific rule per listed tenant. A tenant whose group leaves a unit
//! out gets an `unlimited` rule for it, so that the default rule cannot catch
//! it when a client (Envoy's native filter, for one) sends every unit.

use std::fmt::Write;

use crate::model::{Group, TeamLimits, Unit};

/// A YAML double-quoted scalar; JSON string escapes are valid YAML ones.
fn quoted(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

fn rule(out: &mut String, key: &str, value: Option<&str>, unit: Unit, limit: Option<u32>) {
    let _ = writeln!(out, "      - key: {}", quoted(key));
    if let Some(v) = value {
        let _ = writeln!(out, "        value: {}", quoted(v));
    }
    match limit {
        Some(n) => {
            let _ = writeln!(out, "        rate_limit:");
            let _ = writeln!(out, "          unit: {}", unit.service_unit());
            let _ = writeln!(out, "          requests_per_unit: {n}");
        }
        None => {
            let _ = writeln!(out, "        rate_limit:");
            let _ = writeln!(out, "          unlimited: true");
        }
    }
}

/// The service YAML for `limits` under `domain`. `source` names the team
/// file in the header comment.
pub fn service_yaml(
    limits: &TeamLimits,
    domain: &str,
    descriptor_key: &str,
    source: &str,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# generated from {source} by ratelimit-config; do not edit"
    );
    let _ = writeln!(out, "domain: {}", quoted(domain));
    let _ = writeln!(out, "descriptors:");
    for unit in limits.units_in_use() {
        let _ = writeln!(out, "  - key: generic_key");
        let _ = writeln!(out, "    value: {}", unit.descriptor_value());
        let _ = writeln!(out, "    descriptors:");
        if let Some(limit) = limits.default.as_ref().and_then(|d| d.limits.get(unit)) {
            rule(&mut out, descriptor_key, None, unit, Some(limit));
        }
        for g in &limits.groups {
            group_rules(&mut out, g, descriptor_key, unit);
        }
    }
    out
}

fn group_rules(out: &mut String, g: &Group, descriptor_key: &str, unit: Unit) {
    let limit = g.limits.get(unit);
    for t in &g.tenants {
        rule(out, descriptor_key, Some(t), unit, limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::parse_team_limits;
    use serde_json::json;

    #[test]
    fn seed_example() {
        let doc = json!({"x-tenant-id": {
            "default": {"persecond": 5, "perminute": 20, "perhour": 30},
            "group_1": {"persecond": 50, "perhour": 100, "perday": 1000,
                        "header_value": ["tenant-b"]}}});
        let (l, _) = parse_team_limits(&doc, "").unwrap();
        let y = service_yaml(&l, "internal-api", "tenant", "limits.json");
        let expected = r#"# generated from limits.json by ratelimit-config; do not edit
domain: "internal-api"
descriptors:
  - key: generic_key
    value: per_second
    descriptors:
      - key: "tenant"
        rate_limit:
          unit: second
          requests_per_unit: 5
      - key: "tenant"
        value: "tenant-b"
        rate_limit:
          unit: second
          requests_per_unit: 50
  - key: generic_key
    value: per_minute
    descriptors:
      - key: "tenant"
        rate_limit:
          unit: minute
          requests_per_unit: 20
      - key: "tenant"
        value: "tenant-b"
        rate_limit:
          unlimited: true
  - key: generic_key
    value: per_hour
    descriptors:
      - key: "tenant"
        rate_limit:
          unit: hour
          requests_per_unit: 30
      - key: "tenant"
        value: "tenant-b"
        rate_limit:
          unit: hour
          requests_per_unit: 100
  - key: generic_key
    value: per_day
    descriptors:
      - key: "tenant"
        value: "tenant-b"
        rate_limit:
          unit: day
          requests_per_unit: 1000
"#;
        assert_eq!(y, expected);
    }
}

//! Generation of the envoyproxy/ratelimit service configuration.
//!
//! One top-level descriptor per unit (`generic_key: per_<unit>`), and under
//! it a bare `<descriptor key>` rule for the default group plus one
//! value-specific rule per listed tenant. A tenant whose group leaves a unit
//! out gets an `unlimited` rule for it, so that the default rule cannot catch
//! it when a client (Envoy's native filter, for one) sends every unit.
//!
//! A group's route limits nest one level deeper, under each of its tenant
//! rules: `route: <name>` with the route's limit. The service counts a
//! descriptor under all of its entries, so the route's counter is the
//! tenant's own, even under the default (value-less) tenant rule. A default
//! rule that limits only on routes has no `rate_limit` of its own (no
//! limit for the tenant's own descriptor). A listed tenant's rule stops the
//! walk before the default rule's routes: a tenant never gets another
//! group's route limits.

use std::fmt::Write;

use crate::model::{tenant_value, Group, TeamLimits, Unit, ROUTE_DESCRIPTOR_KEY};

/// `s` as a YAML scalar that Go's yaml.v2 (YAML 1.1, what the rate-limit
/// service reads with) and any YAML 1.2 reader both read back as this exact
/// string: plain when it cannot be taken for anything else (`tenant-b`),
/// else double-quoted (JSON string escapes are valid YAML ones). Words such
/// as `yes`, `off` or `null` are quoted: yaml.v2 would read `null` as no
/// value, and a rule without a value is the default rule.
pub fn scalar(s: &str) -> String {
    const WORDS: &[&str] = &["y", "n", "yes", "no", "on", "off", "true", "false", "null"];
    let plain = s.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !WORDS.contains(&s.to_ascii_lowercase().as_str());
    if plain {
        s.to_string()
    } else {
        serde_json::Value::String(s.to_string()).to_string()
    }
}

/// `s` made safe to follow `#` on one line of a comment.
pub(crate) fn comment_text(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

pub(crate) fn generated_header(out: &mut String, source: &str) {
    let _ = writeln!(
        out,
        "# generated from {} by ratelimit-config; do not edit",
        comment_text(source)
    );
}

/// One rule at `indent` spaces: its key (and value), the comment naming
/// its group, its limit (None: `unlimited`), and nothing else: children
/// follow with `children`.
#[allow(clippy::too_many_arguments)]
fn rule(
    out: &mut String,
    indent: usize,
    key: &str,
    value: Option<&str>,
    group: &str,
    unit: Unit,
    limit: Option<Option<u32>>,
) {
    let pad = " ".repeat(indent);
    match value {
        None => {
            let _ = writeln!(out, "{pad}- key: {}  # {group}", scalar(key));
        }
        Some(v) => {
            let _ = writeln!(out, "{pad}- key: {}", scalar(key));
            let _ = writeln!(out, "{pad}  value: {}  # {group}", scalar(v));
        }
    }
    match limit {
        Some(Some(n)) => {
            let _ = writeln!(
                out,
                "{pad}  rate_limit: {{ unit: {}, requests_per_unit: {n} }}",
                unit.service_unit()
            );
        }
        Some(None) => {
            let _ = writeln!(out, "{pad}  rate_limit: {{ unlimited: true }}");
        }
        // A rule without a limit: only its children limit.
        None => {}
    }
}

/// The group's route rules under a tenant rule, for `unit`: one per route
/// that limits it (nested: generic_key, then tenant, then route).
fn route_rules(out: &mut String, g: &Group, label: &str, unit: Unit) {
    let mut routes = g
        .routes
        .iter()
        .filter_map(|r| r.limits.get(unit).map(|n| (r, n)))
        .peekable();
    if routes.peek().is_none() {
        return;
    }
    let _ = writeln!(out, "        descriptors:");
    for (r, n) in routes {
        let name = Some(r.name.as_str());
        rule(
            out,
            10,
            ROUTE_DESCRIPTOR_KEY,
            name,
            label,
            unit,
            Some(Some(n)),
        );
    }
}

/// Whether the group limits `unit` on any of its routes.
fn routes_limit(g: &Group, unit: Unit) -> bool {
    g.routes.iter().any(|r| r.limits.get(unit).is_some())
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
    generated_header(&mut out, source);
    if limits.all_groups().any(|g| g.shadow) {
        // The service's own shadow_mode would answer OK: the filter could
        // then neither count the would-be refusals nor tell them apart.
        let _ = writeln!(
            out,
            "# shadow groups: no shadow_mode here on purpose; the service answers OVER_LIMIT, the filter counts it and lets the request through"
        );
    }
    let _ = writeln!(out, "domain: {}", scalar(domain));
    // Calendar units and custom windows are the counter's only:
    // envoyproxy/ratelimit's weeks, months and years are not the
    // calendar's, and its protocol has no other length.
    let units: Vec<Unit> = limits
        .units_in_use()
        .into_iter()
        .filter(|u| !u.is_calendar() && !u.is_custom())
        .collect();
    if units.is_empty() {
        let _ = writeln!(out, "descriptors: []");
    } else {
        let _ = writeln!(out, "descriptors:");
    }
    for unit in units {
        let _ = writeln!(out, "  - key: generic_key");
        let _ = writeln!(out, "    value: {}", unit.descriptor_value());
        let _ = writeln!(out, "    descriptors:");
        if let Some(d) = &limits.default {
            let limit = d.limits.get(unit);
            if limit.is_some() || routes_limit(d, unit) {
                let label = label(d);
                let limit = limit.map(Some);
                rule(&mut out, 6, descriptor_key, None, &label, unit, limit);
                route_rules(&mut out, d, &label, unit);
            }
        }
        for g in &limits.groups {
            group_rules(&mut out, g, descriptor_key, unit);
        }
    }
    out
}

fn group_rules(out: &mut String, g: &Group, descriptor_key: &str, unit: Unit) {
    let limit = g.limits.get(unit);
    let label = label(g);
    for t in &g.tenants {
        // The value as the filter sends it (a `%` written `%25`).
        let sent = tenant_value(t.as_bytes());
        rule(
            out,
            6,
            descriptor_key,
            Some(&sent),
            &label,
            unit,
            Some(limit),
        );
        route_rules(out, g, &label, unit);
    }
}

/// The comment that names a rule's group (and says when it is shadowed).
fn label(g: &Group) -> String {
    if g.shadow {
        format!("{} (shadow)", g.name)
    } else {
        g.name.clone()
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
domain: internal-api
descriptors:
  - key: generic_key
    value: per_second
    descriptors:
      - key: tenant  # default
        rate_limit: { unit: second, requests_per_unit: 5 }
      - key: tenant
        value: tenant-b  # group_1
        rate_limit: { unit: second, requests_per_unit: 50 }
  - key: generic_key
    value: per_minute
    descriptors:
      - key: tenant  # default
        rate_limit: { unit: minute, requests_per_unit: 20 }
      - key: tenant
        value: tenant-b  # group_1
        rate_limit: { unlimited: true }
  - key: generic_key
    value: per_hour
    descriptors:
      - key: tenant  # default
        rate_limit: { unit: hour, requests_per_unit: 30 }
      - key: tenant
        value: tenant-b  # group_1
        rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: generic_key
    value: per_day
    descriptors:
      - key: tenant
        value: tenant-b  # group_1
        rate_limit: { unit: day, requests_per_unit: 1000 }
"#;
        assert_eq!(y, expected);
    }

    #[test]
    fn shadow_groups_are_named_and_never_in_shadow_mode() {
        let doc = json!({"x-t": {
            "default": {"perhour": 30, "shadow": true},
            "gold": {"perhour": 100, "header_value": ["tenant-b"]}}});
        let (l, _) = parse_team_limits(&doc, "").unwrap();
        let y = service_yaml(&l, "d", "tenant", "limits.json");
        assert!(
            y.contains("      - key: tenant  # default (shadow)\n"),
            "{y}"
        );
        assert!(y.contains("        value: tenant-b  # gold\n"), "{y}");
        assert!(y.contains("# shadow groups: no shadow_mode here on purpose"));
        assert!(!y.contains("shadow_mode:"), "{y}");
    }

    #[test]
    fn scalars_that_yaml_could_misread_are_quoted() {
        assert_eq!(scalar("tenant-b"), "tenant-b");
        assert_eq!(scalar("Acme_Corp.eu"), "Acme_Corp.eu");
        for s in [
            "null",
            "No",
            "ON",
            "y",
            "123",
            "1e3",
            "-x",
            ".inf",
            "a b",
            "a:b",
            "a#b",
            "",
            "\u{e9}t\u{e9}",
            "x\"y",
        ] {
            assert!(scalar(s).starts_with('"'), "{s}");
            let back: String = serde_json::from_str(&scalar(s)).unwrap();
            assert_eq!(back, s);
        }
        assert_eq!(comment_text("a\nb"), "a\\nb");
    }

    #[test]
    fn route_rules_nest_under_each_tenant_rule() {
        let doc = json!({"x-tenant-id": {
            "default": {"perminute": 600, "routes": {"reports": {"perminute": 5, "perday": 50}}},
            "gold": {"perminute": 6000, "header_value": ["acme"],
                     "routes": {"reports": {"perminute": 50}, "search": {"perminute": 100}}},
            "free": {"perminute": 60, "header_value": ["b"]}}});
        let (l, _) = parse_team_limits(&doc, "").unwrap();
        let y = service_yaml(&l, "api", "tenant", "limits.json");
        let expected = r#"# generated from limits.json by ratelimit-config; do not edit
domain: api
descriptors:
  - key: generic_key
    value: per_minute
    descriptors:
      - key: tenant  # default
        rate_limit: { unit: minute, requests_per_unit: 600 }
        descriptors:
          - key: route
            value: reports  # default
            rate_limit: { unit: minute, requests_per_unit: 5 }
      - key: tenant
        value: acme  # gold
        rate_limit: { unit: minute, requests_per_unit: 6000 }
        descriptors:
          - key: route
            value: reports  # gold
            rate_limit: { unit: minute, requests_per_unit: 50 }
          - key: route
            value: search  # gold
            rate_limit: { unit: minute, requests_per_unit: 100 }
      - key: tenant
        value: b  # free
        rate_limit: { unit: minute, requests_per_unit: 60 }
  - key: generic_key
    value: per_day
    descriptors:
      - key: tenant  # default
        descriptors:
          - key: route
            value: reports  # default
            rate_limit: { unit: day, requests_per_unit: 50 }
      - key: tenant
        value: acme  # gold
        rate_limit: { unlimited: true }
      - key: tenant
        value: b  # free
        rate_limit: { unlimited: true }
"#;
        assert_eq!(y, expected);
    }
}

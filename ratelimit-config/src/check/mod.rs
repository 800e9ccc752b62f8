//! `check`: proves that every descriptor the filter can send is answered by
//! a rule of the rate-limit service with the same limit and unit, and names
//! each one that is not.
//!
//! A descriptor that differs from its rule by one character matches no rule
//! (or the default one), and the service then answers OK: the limit is
//! silently off. So the service YAML is read as envoyproxy/ratelimit reads
//! it (src/config/config_impl.go): one node per `key` or `key_value`, and a
//! descriptor walks down them entry by entry, trying `key_value`, then the
//! level's wildcard rules in file order, then the bare `key`; only a rule
//! reached by the last entry applies.
//!
//! CLI only (feature `cli`): it needs a YAML parser, the filter does not.

mod counter;
mod lookup;
mod service;
pub mod tls;
pub mod yaml_tree;

use std::collections::BTreeSet;

pub use counter::{check_counter, is_counter_team_file, parse_counter_team_file, CounterTeamFile};
pub use lookup::lookup;
pub use service::{parse_service_config, Problem, Rule, RuleLimit, ServiceConfig};

use crate::error::excerpt;
use crate::explain::tenant_from;
use crate::model::{descriptors, tenant_value, Group, RequestDescriptors, Unit};
use crate::plugin::PluginConfig;
use crate::span::Position;

/// What `check` found.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub problems: Vec<Problem>,
    pub warnings: Vec<Problem>,
    /// Descriptors checked.
    pub checked: usize,
    /// Groups checked.
    pub groups: usize,
    /// Groups in shadow (the plugin's `shadow`, or their own): the service
    /// must still refuse them, the filter lets those refusals through.
    pub shadowed: Vec<String>,
    /// Where the filter reads the tenant (`explain::tenant_from`).
    pub tenant_from: String,
}

/// Values under `key` in any rule one level down: tenants the service knows
/// by name, and wildcard patterns.
fn named_values(roots: &[Rule], key: &str) -> BTreeSet<String> {
    let prefix = format!("{key}_");
    roots
        .iter()
        .flat_map(|r| r.children.iter())
        .filter_map(|c| c.composite.strip_prefix(&prefix))
        .map(str::to_string)
        .collect()
}

/// Checks every descriptor the filter configured by `plugin` can send
/// against `services` (every config file the service loads).
pub fn check(plugin: &PluginConfig, services: &[ServiceConfig]) -> CheckReport {
    let mut report = CheckReport {
        tenant_from: tenant_from(&plugin.limits, &plugin.tenant_source),
        ..CheckReport::default()
    };
    let domain = plugin.domain.as_str();
    let matching: Vec<&ServiceConfig> = services.iter().filter(|s| s.domain == domain).collect();
    let service = match matching.as_slice() {
        [one] => *one,
        [] => {
            let found: Vec<String> = services.iter().map(|s| excerpt(&s.domain)).collect();
            for s in services {
                report.problems.push(Problem {
                    file: s.file.clone(),
                    at: s.domain_at,
                    message: format!(
                        "domain {} is not the filter's domain {domain:?}; no service config has that one (found {}), and the service answers OK to an unknown domain, so nothing is limited",
                        excerpt(&s.domain),
                        found.join(", ")
                    ),
                });
            }
            return report;
        }
        [_, second, ..] => {
            report.problems.push(Problem {
                file: second.file.clone(),
                at: second.domain_at,
                message: format!(
                    "domain {domain:?} is in more than one file: the service refuses them (unless MERGE_DOMAIN_CONFIG is set); keep one generated file per domain"
                ),
            });
            return report;
        }
    };
    let limits = &plugin.limits;
    let key = plugin.descriptor_key.as_str();
    // Listed tenants as the filter sends them (a `%` written `%25`).
    let listed: BTreeSet<String> = limits
        .groups
        .iter()
        .flat_map(|g| {
            g.tenants
                .iter()
                .map(|t| tenant_value(t.as_bytes()).into_owned())
        })
        .collect();
    for group in limits.all_groups() {
        report.groups += 1;
        if plugin.shadowed(group) {
            report.shadowed.push(group.name.clone());
        }
        let tenants: Vec<(String, String)> = if group.tenants.is_empty() {
            // Any unlisted tenant: one the service has no value rule for,
            // and each it does have one for (such a rule would catch it).
            let mut any = "<any other tenant>".to_string();
            let named = named_values(&service.descriptors, key);
            while named.contains(&any) || listed.contains(&any) {
                any.push('_');
            }
            let mut t = vec![(any, "any other tenant".to_string())];
            for v in named {
                if v.contains('*') {
                    // The shortest value the pattern matches stands for all.
                    let sample = v.replace('*', "");
                    if !listed.contains(&sample) {
                        t.push((sample, format!("tenants matching {}", excerpt(&v))));
                    }
                } else if !listed.contains(&v) {
                    t.push((v.clone(), format!("tenant {}", excerpt(&v))));
                }
            }
            t
        } else {
            group
                .tenants
                .iter()
                .map(|t| {
                    (
                        tenant_value(t.as_bytes()).into_owned(),
                        format!("tenant {t:?}"),
                    )
                })
                .collect()
        };
        for (tenant, shown) in &tenants {
            check_tenant(&mut report, service, group, key, tenant, shown);
        }
    }
    report
}

fn check_tenant(
    report: &mut CheckReport,
    service: &ServiceConfig,
    group: &Group,
    key: &str,
    tenant: &str,
    shown: &str,
) {
    for (unit, entries) in descriptors(group, key, tenant) {
        let want = group.limits.get(unit).unwrap_or_default();
        let who = format!("{} {shown}, {}", group.name, unit.descriptor_value());
        check_descriptor(report, service, &who, unit, want, &entries);
    }
    for route in &group.routes {
        let all = RequestDescriptors::new(group, Some(route), key, tenant);
        for &(unit, entries) in all.as_slice().iter().skip(group.limits.len()) {
            let want = route.limits.get(unit).unwrap_or_default();
            let who = format!(
                "{} {shown} on route {}, {}",
                group.name,
                excerpt(&route.name),
                unit.descriptor_value()
            );
            check_descriptor(report, service, &who, unit, want, entries.as_ref());
        }
    }
}

/// Checks that `entries` match a rule of `service` that allows `want` per
/// `unit`; `who` names the descriptor in a problem.
fn check_descriptor(
    report: &mut CheckReport,
    service: &ServiceConfig,
    who: &str,
    unit: Unit,
    want: u32,
    entries: &[(&str, &str)],
) {
    report.checked += 1;
    let want_text = format!("{} {}", unit.json_key(), want);
    let (found, walked) = lookup(&service.descriptors, entries);
    let path: Vec<&str> = walked.iter().map(|r| r.composite.as_str()).collect();
    let rule_name = format!("{}.{}", service.domain, path.join("."));
    let mut problem = |at: Position, message: String| {
        report.problems.push(Problem {
            file: service.file.clone(),
            at,
            message: format!("{who}: {message}"),
        });
    };
    let shown_entries: Vec<String> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let Some(rule) = found else {
        let at = walked.last().map_or(service.domain_at, |r| r.at);
        problem(
            at,
            format!(
                "no rule matches the descriptor [{}]; the service answers OK, so {want_text} is not enforced",
                shown_entries.join(", ")
            ),
        );
        return;
    };
    let Some(limit) = &rule.limit else { return };
    if limit.unlimited {
        problem(
            limit.at,
            format!("matches {rule_name}, which is unlimited, but the group sets {want_text}"),
        );
    } else if limit.unit != unit.service_unit() || limit.requests_per_unit != want {
        let at = if limit.unit == unit.service_unit() {
            limit.count_at
        } else {
            limit.unit_at
        };
        problem(
            at,
            format!(
                "matches {rule_name}, which allows {} per {}, but the group sets {want_text}",
                limit.requests_per_unit, limit.unit
            ),
        );
    } else if rule.shadow_mode {
        // The service answers OK to a rule in its shadow_mode: the
        // filter never sees the refusal, so it can neither enforce it
        // nor count it as a shadow refusal.
        problem(
            rule.at,
            format!(
                "{rule_name} is in the service's shadow_mode: the service answers OK, so the filter never sees a refusal (not enforced, and not counted as a shadow refusal either); remove shadow_mode and set \"shadow\": true on the group in the team file instead"
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::lookup::wildcard_match;
    use super::*;
    use crate::plugin::parse_plugin_config;
    use crate::service_yaml::service_yaml;

    const TEAM: &str = r#"{"x-tenant-id": {
        "default": {"persecond": 5, "perminute": 20, "perhour": 30},
        "group_1": {"persecond": 50, "perminute": 70, "perhour": 100,
                    "header_value": ["tenant-b", "tenant-c"]}}}"#;

    fn plugin() -> PluginConfig {
        let text = format!(
            r#"{{"domain": "internal-api", "limits": {TEAM}, "rate_limit_service": {{"cluster": "rl"}}}}"#
        );
        parse_plugin_config(text.as_bytes()).unwrap().0
    }

    fn generated() -> String {
        let p = plugin();
        service_yaml(&p.limits, "internal-api", "tenant", "limits.json")
    }

    fn run(yaml: &str) -> Vec<String> {
        match parse_service_config("ratelimit.yaml", yaml) {
            Ok(s) => {
                let r = check(&plugin(), &[s]);
                r.problems.iter().map(ToString::to_string).collect()
            }
            Err(p) => p.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn the_generated_config_passes() {
        let s = parse_service_config("ratelimit.yaml", &generated()).unwrap();
        let r = check(&plugin(), &[s]);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert!(r.warnings.is_empty());
        // default: 3 units for any other tenant; group_1: 3 units × 2 tenants.
        assert_eq!((r.groups, r.checked), (2, 9));
    }

    #[test]
    fn a_listed_tenant_with_a_percent_sign_is_named_as_the_filter_sends_it() {
        let text = r#"{"domain": "d", "limits": {"x-t": {"default": {"perhour": 1},
            "g": {"perhour": 5, "header_value": ["50%off"]}}}, "rate_limit_service": {"cluster": "rl"}}"#;
        let p = parse_plugin_config(text.as_bytes()).unwrap().0;
        let yaml = service_yaml(&p.limits, "d", "tenant", "limits.json");
        assert!(yaml.contains("value: \"50%25off\"  # g"), "{yaml}");
        let r = check(
            &p,
            &[parse_service_config("ratelimit.yaml", &yaml).unwrap()],
        );
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(r.tenant_from, "header x-t");
        // The raw value in the YAML would match nothing the filter sends.
        let raw = yaml.replace("50%25off", "50%off");
        let r = check(&p, &[parse_service_config("ratelimit.yaml", &raw).unwrap()]);
        let found: Vec<String> = r.problems.iter().map(|p| p.message.clone()).collect();
        assert!(
            found.iter().any(|m| m.starts_with(
                "g tenant \"50%off\", per_hour: matches d.generic_key_per_hour.tenant,"
            )),
            "{found:?}"
        );
    }

    #[test]
    fn a_one_character_edit_is_named() {
        let y = generated().replace("requests_per_unit: 70", "requests_per_unit: 71");
        assert_eq!(
            run(&y),
            vec![
                "ratelimit.yaml:22:56: group_1 tenant \"tenant-b\", per_minute: matches internal-api.generic_key_per_minute.tenant_tenant-b, which allows 71 per minute, but the group sets perminute 70",
                "ratelimit.yaml:25:56: group_1 tenant \"tenant-c\", per_minute: matches internal-api.generic_key_per_minute.tenant_tenant-c, which allows 71 per minute, but the group sets perminute 70",
            ]
        );
        let y = generated().replace("value: per_hour", "value: per_hours");
        let out = run(&y);
        assert_eq!(out.len(), 3, "{out:?}");
        assert!(out[0].contains("default any other tenant, per_hour: no rule matches the descriptor [generic_key=per_hour, tenant=<any other tenant>]; the service answers OK, so perhour 30 is not enforced"), "{out:?}");
        // tenant-c loses its rule (the default one catches it), and
        // tenant-x, a default tenant, gets group_1's.
        let y = generated().replacen("value: tenant-c", "value: tenant-x", 1);
        assert_eq!(
            run(&y),
            vec![
                "ratelimit.yaml:14:56: default tenant \"tenant-x\", per_second: matches internal-api.generic_key_per_second.tenant_tenant-x, which allows 50 per second, but the group sets persecond 5",
                "ratelimit.yaml:8:56: group_1 tenant \"tenant-c\", per_second: matches internal-api.generic_key_per_second.tenant, which allows 5 per second, but the group sets persecond 50",
            ]
        );
    }

    #[test]
    fn domains_units_and_unlimited() {
        let out = run(&generated().replace("domain: internal-api", "domain: internal_api"));
        assert_eq!(out.len(), 1);
        assert!(out[0].starts_with("ratelimit.yaml:2:9: domain \"internal_api\" is not the filter's domain \"internal-api\""), "{out:?}");
        let out = run(&generated().replacen(
            "unit: second, requests_per_unit: 5 ",
            "unit: minute, requests_per_unit: 5 ",
            1,
        ));
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(
            out[0].contains("which allows 5 per minute, but the group sets persecond 5"),
            "{out:?}"
        );
        let out = run(&generated().replacen(
            "{ unit: hour, requests_per_unit: 100 }",
            "{ unlimited: true }",
            1,
        ));
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].contains("group_1 tenant \"tenant-b\", per_hour: matches internal-api.generic_key_per_hour.tenant_tenant-b, which is unlimited"), "{out:?}");
    }

    #[test]
    fn what_the_service_itself_refuses() {
        assert_eq!(
            run("domain: d\ndescriptors:\n  - key: a\n    valu: b\n  - key: a\n  - value: x\n"),
            vec![
                "ratelimit.yaml:4:5: unknown key \"valu\": the service refuses this file",
                "ratelimit.yaml:5:5: duplicate descriptor \"d.a\": the service refuses this file",
                "ratelimit.yaml:6:5: descriptor has an empty key: the service refuses this file",
            ]
        );
        assert_eq!(
            run("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: weeks, requests_per_unit: x}\n"),
            vec![
                "ratelimit.yaml:4:50: requests_per_unit must be a whole number",
                "ratelimit.yaml:4:24: invalid rate limit unit \"weeks\": the service refuses this file",
            ]
        );
        assert_eq!(run("domain: [\n"), vec!["ratelimit.yaml:2:1: not valid YAML: while parsing a node, did not find expected node content"]);
        assert_eq!(
            run(""),
            vec!["ratelimit.yaml:1:1: empty: no domain and no descriptors"]
        );
        assert_eq!(
            run("a: &x 1\nb: *x\n"),
            vec!["ratelimit.yaml:2:4: aliases (*name) are not supported here"]
        );
    }

    #[test]
    fn wildcards_as_the_service_matches_them() {
        assert!(wildcard_match("tenant_a*", "tenant_abc"));
        assert!(wildcard_match("tenant_*c", "tenant_abc"));
        assert!(wildcard_match("t*_a*c", "tenant_abc"));
        assert!(!wildcard_match("tenant_b*", "tenant_abc"));
        assert!(!wildcard_match("ab*ba", "aba"));
        assert!(wildcard_match("*", ""));
        let y = generated().replacen("value: tenant-b", "value: tenant-*", 1);
        // tenant-b is still limited right, but so is every default tenant
        // whose value starts with "tenant-".
        assert_eq!(
            run(&y),
            vec!["ratelimit.yaml:11:56: default tenants matching \"tenant-*\", per_second: matches internal-api.generic_key_per_second.tenant_tenant-*, which allows 50 per second, but the group sets persecond 5"]
        );
    }

    #[test]
    fn the_services_shadow_mode_is_a_problem() {
        // The filter's shadow needs the service to keep refusing: its own
        // shadow_mode answers OK, and the filter would count nothing.
        let y = generated().replacen(
            "        value: tenant-b  # group_1\n",
            "        value: tenant-b  # group_1\n        shadow_mode: true\n",
            1,
        );
        let s = parse_service_config("ratelimit.yaml", &y).unwrap();
        let r = check(&plugin(), &[s]);
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
        let p = r.problems[0].to_string();
        assert!(
            p.contains("is in the service's shadow_mode: the service answers OK"),
            "{p}"
        );
        assert!(p.contains("set \"shadow\": true on the group"), "{p}");
        assert!(r.shadowed.is_empty());
    }

    #[test]
    fn shadowed_groups_are_reported_and_still_need_their_rules() {
        let text = format!(
            r#"{{"domain": "internal-api", "limits": {TEAM}, "rate_limit_service": {{"cluster": "rl"}}, "shadow": true}}"#
        );
        let p = parse_plugin_config(text.as_bytes()).unwrap().0;
        let s = parse_service_config("ratelimit.yaml", &generated()).unwrap();
        let r = check(&p, &[s]);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(r.shadowed, vec!["default", "group_1"]);
    }

    #[test]
    fn route_limits_are_checked_and_a_wrong_one_is_named() {
        let team = r#"{"x-tenant-id": {
            "default": {"perminute": 600, "routes": {"reports": {"perminute": 5}}},
            "gold": {"perminute": 6000, "header_value": ["acme"],
                     "routes": {"reports": {"perday": 50}}}}}"#;
        let text = format!(
            r#"{{"domain": "api", "limits": {team}, "rate_limit_service": {{"cluster": "rl"}}}}"#
        );
        let p = parse_plugin_config(text.as_bytes()).unwrap().0;
        let yaml = service_yaml(&p.limits, "api", "tenant", "limits.json");
        let s = parse_service_config("ratelimit.yaml", &yaml).unwrap();
        let r = check(&p, &[s]);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        // default: 1 own + 1 route; gold: 1 own + 1 route.
        assert_eq!(r.checked, 4);
        let y = yaml.replacen("requests_per_unit: 5 ", "requests_per_unit: 6 ", 1);
        let s = parse_service_config("ratelimit.yaml", &y).unwrap();
        let out: Vec<String> = check(&p, &[s])
            .problems
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].contains("default any other tenant on route \"reports\", per_minute: matches api.generic_key_per_minute.tenant.route_reports, which allows 6 per minute, but the group sets perminute 5"), "{out:?}");
        // A route rule with another name: the route's limit is off, named.
        let y = yaml.replace("value: reports  # gold", "value: report  # gold");
        let s = parse_service_config("ratelimit.yaml", &y).unwrap();
        let out: Vec<String> = check(&p, &[s])
            .problems
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(out.len(), 1, "{y}\n{out:?}");
        assert!(out[0].contains("gold tenant \"acme\" on route \"reports\", per_day: no rule matches the descriptor [generic_key=per_day, tenant=acme, route=reports]"), "{out:?}");
    }
}

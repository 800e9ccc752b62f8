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

use std::collections::BTreeSet;

use yaml_rust2::parser::{MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};
use yaml_rust2::Event;

use crate::model::{descriptors, Group};
use crate::plugin::PluginConfig;
use crate::span::Position;

// ------------------------------------------------------------------ YAML

/// A YAML node with where it starts; scalars keep their text as written.
#[derive(Clone, Debug)]
enum Node {
    Scalar { text: String, plain: bool },
    Map(Vec<(String, Position, Marked)>),
    Seq(Vec<Marked>),
}

#[derive(Clone, Debug)]
struct Marked {
    at: Position,
    node: Node,
}

enum Frame {
    Map {
        at: Position,
        entries: Vec<(String, Position, Marked)>,
        key: Option<(String, Position)>,
    },
    Seq {
        at: Position,
        items: Vec<Marked>,
    },
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    root: Option<Marked>,
    error: Option<(Position, String)>,
}

fn position(m: &Marker) -> Position {
    Position {
        line: m.line(),
        column: m.col() + 1,
    }
}

impl Builder {
    fn fail(&mut self, at: Position, message: &str) {
        if self.error.is_none() {
            self.error = Some((at, message.to_string()));
        }
    }

    fn add(&mut self, value: Marked) {
        match self.stack.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(value);
                }
            }
            Some(Frame::Seq { items, .. }) => items.push(value),
            Some(Frame::Map { entries, key, .. }) => match key.take() {
                Some((k, at)) => entries.push((k, at, value)),
                None => match value.node {
                    Node::Scalar { text, .. } => *key = Some((text, value.at)),
                    _ => self.fail(value.at, "a key that is not a string"),
                },
            },
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let at = position(&mark);
        match ev {
            Event::Scalar(text, style, _, _) => self.add(Marked {
                at,
                node: Node::Scalar {
                    text,
                    plain: style == TScalarStyle::Plain,
                },
            }),
            Event::MappingStart(..) => self.stack.push(Frame::Map {
                at,
                entries: Vec::new(),
                key: None,
            }),
            Event::SequenceStart(..) => self.stack.push(Frame::Seq {
                at,
                items: Vec::new(),
            }),
            Event::MappingEnd | Event::SequenceEnd => match self.stack.pop() {
                Some(Frame::Map { at, entries, .. }) => self.add(Marked {
                    // A block mapping is where its first key is.
                    at: entries.first().map_or(at, |(_, k, _)| *k),
                    node: Node::Map(entries),
                }),
                Some(Frame::Seq { at, items }) => self.add(Marked {
                    at,
                    node: Node::Seq(items),
                }),
                None => self.fail(at, "unbalanced document"),
            },
            Event::Alias(_) => self.fail(at, "aliases (*name) are not supported here"),
            _ => {}
        }
    }
}

fn load_yaml(text: &str) -> Result<Option<Marked>, (Position, String)> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, false).map_err(|e| {
        (
            position(e.marker()),
            format!("not valid YAML: {}", e.info()),
        )
    })?;
    match builder.error {
        Some(e) => Err(e),
        None => Ok(builder.root),
    }
}

// ------------------------------------------------------------------ service config

/// The keys envoyproxy/ratelimit accepts anywhere in its YAML; any other
/// makes it refuse the file.
const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

const SERVICE_UNITS: &[&str] = &["second", "minute", "hour", "day", "week", "month", "year"];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleLimit {
    /// Lowercase; empty when absent.
    pub unit: String,
    pub requests_per_unit: u32,
    pub unlimited: bool,
    /// Of the `rate_limit` mapping, its `unit` value, its `requests_per_unit` value.
    pub at: Position,
    pub unit_at: Position,
    pub count_at: Position,
}

/// One descriptor rule of the service config.
#[derive(Clone, Debug)]
pub struct Rule {
    /// `key` or `key_value`: what the service matches on.
    pub composite: String,
    pub limit: Option<RuleLimit>,
    pub shadow_mode: bool,
    pub children: Vec<Rule>,
    pub at: Position,
}

/// One service config file.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    pub file: String,
    pub domain: String,
    pub domain_at: Position,
    pub descriptors: Vec<Rule>,
}

/// A problem, at a place in one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub file: String,
    pub at: Position,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.at.line, self.at.column, self.message
        )
    }
}

struct Reader<'a> {
    file: &'a str,
    problems: Vec<Problem>,
}

impl Reader<'_> {
    fn problem(&mut self, at: Position, message: impl Into<String>) {
        self.problems.push(Problem {
            file: self.file.to_string(),
            at,
            message: message.into(),
        });
    }

    fn map<'m>(&mut self, m: &'m Marked, what: &str) -> Option<&'m [(String, Position, Marked)]> {
        match &m.node {
            Node::Map(entries) => {
                for (k, at, _) in entries {
                    if !VALID_KEYS.contains(&k.as_str()) {
                        self.problem(
                            *at,
                            format!("unknown key {k:?}: the service refuses this file"),
                        );
                    }
                }
                Some(entries)
            }
            _ => {
                self.problem(m.at, format!("{what} must be a mapping"));
                None
            }
        }
    }

    /// A string field as yaml.v2 reads it into a Go string: a plain `~`,
    /// `null` or nothing is no value.
    fn string(&mut self, m: &Marked, what: &str) -> String {
        match &m.node {
            Node::Scalar { text, plain: true }
                if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL") =>
            {
                String::new()
            }
            Node::Scalar { text, .. } => text.clone(),
            _ => {
                self.problem(m.at, format!("{what} must be a string"));
                String::new()
            }
        }
    }

    fn boolean(&mut self, m: &Marked, what: &str) -> bool {
        match &m.node {
            Node::Scalar { text, plain: true } => match text.as_str() {
                "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "y"
                | "Y" => true,
                "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "n"
                | "N" | "" | "~" | "null" => false,
                _ => {
                    self.problem(m.at, format!("{what} must be true or false"));
                    false
                }
            },
            _ => {
                self.problem(m.at, format!("{what} must be true or false"));
                false
            }
        }
    }

    fn count(&mut self, m: &Marked) -> u32 {
        match &m.node {
            Node::Scalar { text, plain: true } if text.bytes().all(|b| b.is_ascii_digit()) => {
                text.parse().unwrap_or_else(|_| {
                    self.problem(m.at, "requests_per_unit does not fit in 32 bits");
                    0
                })
            }
            _ => {
                self.problem(m.at, "requests_per_unit must be a whole number");
                0
            }
        }
    }

    fn rules(&mut self, m: &Marked, parent: &str) -> Vec<Rule> {
        let Node::Seq(items) = &m.node else {
            self.problem(m.at, "descriptors must be a list");
            return Vec::new();
        };
        let mut out: Vec<Rule> = Vec::new();
        for item in items {
            let Some(entries) = self.map(item, "a descriptor") else {
                continue;
            };
            let mut key = String::new();
            let mut value = String::new();
            let mut limit = None;
            let mut shadow_mode = false;
            let mut children_node = None;
            for (k, _, v) in entries {
                match k.as_str() {
                    "key" => key = self.string(v, "key"),
                    "value" => value = self.string(v, "value"),
                    "rate_limit" => limit = self.rate_limit(v),
                    "shadow_mode" => shadow_mode = self.boolean(v, "shadow_mode"),
                    "descriptors" => children_node = Some(v),
                    _ => {}
                }
            }
            if key.is_empty() {
                self.problem(
                    item.at,
                    "descriptor has an empty key: the service refuses this file",
                );
                continue;
            }
            let composite = if value.is_empty() {
                key
            } else {
                format!("{key}_{value}")
            };
            let full = format!("{parent}{composite}");
            if out.iter().any(|r| r.composite == composite) {
                self.problem(
                    item.at,
                    format!("duplicate descriptor {full:?}: the service refuses this file"),
                );
                continue;
            }
            let children = match children_node {
                Some(c) => self.rules(c, &format!("{full}.")),
                None => Vec::new(),
            };
            out.push(Rule {
                composite,
                limit,
                shadow_mode,
                children,
                at: item.at,
            });
        }
        out
    }

    fn rate_limit(&mut self, m: &Marked) -> Option<RuleLimit> {
        let entries = self.map(m, "rate_limit")?;
        let mut limit = RuleLimit {
            unit: String::new(),
            requests_per_unit: 0,
            unlimited: false,
            at: m.at,
            unit_at: m.at,
            count_at: m.at,
        };
        for (k, _, v) in entries {
            match k.as_str() {
                "unit" => {
                    limit.unit = self.string(v, "unit").to_ascii_lowercase();
                    limit.unit_at = v.at;
                }
                "requests_per_unit" => {
                    limit.requests_per_unit = self.count(v);
                    limit.count_at = v.at;
                }
                "unlimited" => limit.unlimited = self.boolean(v, "unlimited"),
                _ => {}
            }
        }
        let valid_unit = SERVICE_UNITS.contains(&limit.unit.as_str());
        if limit.unlimited && valid_unit {
            self.problem(
                m.at,
                "an unlimited rate_limit must not set a unit: the service refuses this file",
            );
        } else if !limit.unlimited && !valid_unit {
            self.problem(
                limit.unit_at,
                format!(
                    "invalid rate limit unit {:?}: the service refuses this file",
                    limit.unit
                ),
            );
        }
        Some(limit)
    }
}

/// Reads one service config file (`file` names it in problems).
pub fn parse_service_config(file: &str, text: &str) -> Result<ServiceConfig, Vec<Problem>> {
    let mut r = Reader {
        file,
        problems: Vec::new(),
    };
    let root = match load_yaml(text) {
        Ok(Some(root)) => root,
        Ok(None) => {
            r.problem(Position::START, "empty: no domain and no descriptors");
            return Err(r.problems);
        }
        Err((at, message)) => {
            r.problem(at, message);
            return Err(r.problems);
        }
    };
    let mut config = ServiceConfig {
        file: file.to_string(),
        domain: String::new(),
        domain_at: root.at,
        descriptors: Vec::new(),
    };
    if let Some(entries) = r.map(&root, "the document") {
        for (k, _, v) in entries {
            match k.as_str() {
                "domain" => {
                    config.domain = r.string(v, "domain");
                    config.domain_at = v.at;
                }
                "descriptors" => {
                    let parent = format!("{}.", config.domain);
                    config.descriptors = r.rules(v, &parent);
                }
                _ => {}
            }
        }
    }
    if config.domain.is_empty() {
        r.problem(root.at, "no domain: the service refuses this file");
    }
    if r.problems.is_empty() {
        Ok(config)
    } else {
        Err(r.problems)
    }
}

// ------------------------------------------------------------------ lookup

/// envoyproxy/ratelimit's wildcard match: each `*` matches any run of
/// characters.
fn wildcard_match(pattern: &str, value: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return false;
    };
    if parts.len() == 1 {
        return pattern == value;
    }
    let fixed: usize = parts.iter().map(|p| p.len()).sum();
    if value.len() < fixed || !value.starts_with(first) || !value.ends_with(last) {
        return false;
    }
    let mut rest = value
        .get(first.len()..value.len() - last.len())
        .unwrap_or("");
    for part in parts.iter().skip(1).take(parts.len().saturating_sub(2)) {
        match rest.find(part) {
            Some(i) => rest = rest.get(i + part.len()..).unwrap_or(""),
            None => return false,
        }
    }
    true
}

/// The rule whose limit the service applies to `entries`, and the path of
/// rules the walk went through.
pub fn lookup<'a>(
    roots: &'a [Rule],
    entries: &[(&str, &str)],
) -> (Option<&'a Rule>, Vec<&'a Rule>) {
    let mut level = roots;
    let mut walked = Vec::new();
    let mut found = None;
    for (i, (key, value)) in entries.iter().enumerate() {
        let composite = format!("{key}_{value}");
        let next = level
            .iter()
            .find(|r| r.composite == composite)
            .or_else(|| {
                level
                    .iter()
                    .filter(|r| r.composite.contains('*'))
                    .find(|r| wildcard_match(&r.composite, &composite))
            })
            .or_else(|| level.iter().find(|r| r.composite == *key));
        let Some(rule) = next else { break };
        walked.push(rule);
        if rule.limit.is_some() && i + 1 == entries.len() {
            found = Some(rule);
        }
        if rule.children.is_empty() {
            break;
        }
        level = &rule.children;
    }
    (found, walked)
}

// ------------------------------------------------------------------ check

/// What `check` found.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub problems: Vec<Problem>,
    pub warnings: Vec<Problem>,
    /// Descriptors checked.
    pub checked: usize,
    /// Groups checked.
    pub groups: usize,
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
    let mut report = CheckReport::default();
    let domain = plugin.domain.as_str();
    let matching: Vec<&ServiceConfig> = services.iter().filter(|s| s.domain == domain).collect();
    let service = match matching.as_slice() {
        [one] => *one,
        [] => {
            let found: Vec<String> = services.iter().map(|s| format!("{:?}", s.domain)).collect();
            for s in services {
                report.problems.push(Problem {
                    file: s.file.clone(),
                    at: s.domain_at,
                    message: format!(
                        "domain {:?} is not the filter's domain {domain:?}; no service config has that one (found {}), and the service answers OK to an unknown domain, so nothing is limited",
                        s.domain,
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
    let listed: BTreeSet<&str> = limits
        .groups
        .iter()
        .flat_map(|g| g.tenants.iter().map(String::as_str))
        .collect();
    for group in limits.all_groups() {
        report.groups += 1;
        let tenants: Vec<(String, String)> = if group.tenants.is_empty() {
            // Any unlisted tenant: one the service has no value rule for,
            // and each it does have one for (such a rule would catch it).
            let mut any = "<any other tenant>".to_string();
            let named = named_values(&service.descriptors, key);
            while named.contains(&any) || listed.contains(any.as_str()) {
                any.push('_');
            }
            let mut t = vec![(any, "any other tenant".to_string())];
            for v in named {
                if v.contains('*') {
                    // The shortest value the pattern matches stands for all.
                    let sample = v.replace('*', "");
                    if !listed.contains(sample.as_str()) {
                        t.push((sample, format!("tenants matching {v:?}")));
                    }
                } else if !listed.contains(v.as_str()) {
                    t.push((v.clone(), format!("tenant {v:?}")));
                }
            }
            t
        } else {
            group
                .tenants
                .iter()
                .map(|t| (t.clone(), format!("tenant {t:?}")))
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
        report.checked += 1;
        let want = group.limits.get(unit).unwrap_or_default();
        let want_text = format!("{} {}", unit.json_key(), want);
        let who = format!("{} {shown}, {}", group.name, unit.descriptor_value());
        let (found, walked) = lookup(&service.descriptors, &entries);
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
            continue;
        };
        let Some(limit) = &rule.limit else { continue };
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
            report.warnings.push(Problem {
                file: service.file.clone(),
                at: rule.at,
                message: format!("{who}: {rule_name} is in shadow_mode: counted, never enforced"),
            });
        }
    }
}

#[cfg(test)]
mod tests {
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
    fn shadow_mode_is_a_warning() {
        let y = generated().replacen(
            "        value: tenant-b  # group_1\n",
            "        value: tenant-b  # group_1\n        shadow_mode: true\n",
            1,
        );
        let s = parse_service_config("ratelimit.yaml", &y).unwrap();
        let r = check(&plugin(), &[s]);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(r.warnings.len(), 1);
        assert!(r.warnings[0]
            .to_string()
            .contains("is in shadow_mode: counted, never enforced"));
    }
}

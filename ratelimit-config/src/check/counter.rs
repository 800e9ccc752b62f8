//! `check` against ratelimit-counter: the counter reads the team file
//! itself (`<domain>.json`), so there is no rule tree to walk; what can go
//! wrong is a file for another domain, a file that is not the filter's
//! team file (a group missing, other limits, another window), or a filter
//! that calls envoyproxy/ratelimit instead.

use crate::error::excerpt;
use crate::explain::tenant_from;
use crate::model::{Group, Service, TeamLimits, UnitLimits};
use crate::plugin::PluginConfig;
use crate::span::Position;
use crate::team_file::{check_team_file_for, Severity};

use super::{CheckReport, Problem};

/// A counter's team file: the domain it serves (its file name without
/// `.json`) and its limits, or why the counter would refuse it.
#[derive(Debug)]
pub struct CounterTeamFile {
    pub file: String,
    pub domain: String,
    pub limits: Result<TeamLimits, Vec<Problem>>,
}

/// Reads `text` as ratelimit-counter reads the file `file` of its
/// `--limits` directory.
pub fn parse_counter_team_file(file: &str, text: &str) -> CounterTeamFile {
    let name = file.rsplit(['/', '\\']).next().unwrap_or(file);
    let domain = name.strip_suffix(".json").unwrap_or(name).to_string();
    let report = check_team_file_for(file, text, Service::Counter);
    let limits = match report.parsed {
        Some((_, limits)) => Ok(limits),
        None => Err(report
            .findings
            .into_iter()
            .filter(|f| f.severity == Severity::Error)
            .map(|f| Problem {
                file: f.file,
                at: f.at,
                message: f.error.to_string(),
            })
            .collect()),
    };
    CounterTeamFile {
        file: file.to_string(),
        domain,
        limits,
    }
}

/// Whether a service config's text is a counter's team file (JSON) rather
/// than envoyproxy/ratelimit's YAML.
pub fn is_counter_team_file(file: &str, text: &str) -> bool {
    file.ends_with(".json") || text.trim_start().starts_with('{')
}

fn units(l: &UnitLimits) -> String {
    let all: Vec<String> = l
        .iter()
        .map(|(u, n)| format!("{} {n}", u.json_key()))
        .collect();
    if all.is_empty() {
        "no limit".into()
    } else {
        all.join(", ")
    }
}

/// How `counter`'s group differs from the filter's `filter` group.
fn differences(filter: &Group, counter: &Group) -> Vec<String> {
    let mut out = Vec::new();
    if filter.limits != counter.limits {
        out.push(format!(
            "the filter sends {}, the counter counts {}",
            units(&filter.limits),
            units(&counter.limits)
        ));
    }
    if filter.window != counter.window {
        out.push(format!(
            "window {} in the filter's team file, {} in the counter's",
            filter.window.json_value(),
            counter.window.json_value()
        ));
    }
    if filter.tenants != counter.tenants {
        out.push("other tenants (header_value) in the counter's file".into());
    }
    if filter.shadow != counter.shadow {
        out.push(format!(
            "shadow {} in the filter's team file, {} in the counter's",
            filter.shadow, counter.shadow
        ));
    }
    for r in &filter.routes {
        match counter.routes.iter().find(|c| c.name == r.name) {
            None => out.push(format!(
                "route {}: not in the counter's file, which answers OK to its descriptors",
                excerpt(&r.name)
            )),
            Some(c) if c.limits != r.limits => out.push(format!(
                "route {}: the filter sends {}, the counter counts {}",
                excerpt(&r.name),
                units(&r.limits),
                units(&c.limits)
            )),
            Some(_) => {}
        }
    }
    out
}

/// Checks the filter configured by `plugin` against the team files a
/// counter serves.
pub fn check_counter(plugin: &PluginConfig, files: &[CounterTeamFile]) -> CheckReport {
    let mut report = CheckReport {
        tenant_from: tenant_from(&plugin.limits, &plugin.tenant_source),
        ..CheckReport::default()
    };
    let problem = |f: &CounterTeamFile, message: String| Problem {
        file: f.file.clone(),
        at: Position::START,
        message,
    };
    if plugin.service != Service::Counter {
        for f in files {
            report.problems.push(problem(
                f,
                format!(
                    "a team file is ratelimit-counter's configuration, but the filter's rate_limit_service.service is {:?}: it sends envoyproxy/ratelimit's descriptors, which needs the ratelimit.yaml that generate writes (or set \"service\": \"counter\")",
                    plugin.service.name()
                ),
            ));
        }
        return report;
    }
    let domain = plugin.domain.as_str();
    let matching: Vec<&CounterTeamFile> = files.iter().filter(|f| f.domain == domain).collect();
    let file = match matching.as_slice() {
        [one] => *one,
        [] => {
            let found: Vec<String> = files.iter().map(|f| excerpt(&f.domain)).collect();
            for f in files {
                report.problems.push(problem(
                    f,
                    format!(
                        "serves domain {} (the file's name), not the filter's domain {domain:?} (found {}); the counter answers OK to an unknown domain, so nothing is limited: name the file {domain}.json",
                        excerpt(&f.domain),
                        found.join(", ")
                    ),
                ));
            }
            return report;
        }
        [_, second, ..] => {
            report.problems.push(problem(
                second,
                format!("domain {domain:?} is served from more than one file: keep one"),
            ));
            return report;
        }
    };
    let counter = match &file.limits {
        Ok(l) => l,
        Err(problems) => {
            report.problems.extend(problems.iter().cloned());
            return report;
        }
    };
    for group in plugin.limits.all_groups() {
        report.groups += 1;
        report.checked +=
            group.limits.len() + group.routes.iter().map(|r| r.limits.len()).sum::<usize>();
        if plugin.shadowed(group) {
            report.shadowed.push(group.name.clone());
        }
        match counter.all_groups().find(|g| g.name == group.name) {
            None => report.problems.push(problem(
                file,
                format!(
                    "group {}: not in the counter's team file, which decides its tenants by another group or none",
                    excerpt(&group.name)
                ),
            )),
            Some(c) => {
                for d in differences(group, c) {
                    report.problems.push(problem(
                        file,
                        format!("group {}: {d}", excerpt(&group.name)),
                    ));
                }
            }
        }
    }
    for c in counter.all_groups() {
        if !plugin.limits.all_groups().any(|g| g.name == c.name) {
            report.problems.push(problem(
                file,
                format!(
                    "group {}: in the counter's team file, not in the filter's",
                    excerpt(&c.name)
                ),
            ));
        }
    }
    report
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::plugin::parse_plugin_config;

    const TEAM: &str = r#"{"x-tenant-id": {"default": {"perminute": 20}, "gold": {"perminute": 100, "window": "sliding", "header_value": ["a"]}}}"#;

    fn plugin(service: &str) -> PluginConfig {
        let text = format!(
            r#"{{"domain": "d", "limits": {TEAM}, "rate_limit_service": {{"cluster": "c", "service": "{service}"}}}}"#
        );
        parse_plugin_config(text.as_bytes()).unwrap().0
    }

    #[test]
    fn the_same_team_file_under_the_domain_agrees() {
        let r = check_counter(
            &plugin("counter"),
            &[parse_counter_team_file("x/d.json", TEAM)],
        );
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!((r.groups, r.checked), (2, 2));
    }

    #[test]
    fn another_domain_another_limit_or_another_service_is_named() {
        let other = parse_counter_team_file("e.json", TEAM);
        let r = check_counter(&plugin("counter"), &[other]);
        assert!(r.problems[0]
            .message
            .contains("not the filter's domain \"d\""));
        let changed = TEAM.replace("100", "90");
        let r = check_counter(
            &plugin("counter"),
            &[parse_counter_team_file("d.json", &changed)],
        );
        assert_eq!(r.problems.len(), 1);
        assert!(
            r.problems[0].message.contains(
                "group \"gold\": the filter sends perminute 100, the counter counts perminute 90"
            ),
            "{}",
            r.problems[0]
        );
        let fixed = TEAM.replace(r#""sliding""#, r#""fixed""#);
        let r = check_counter(
            &plugin("counter"),
            &[parse_counter_team_file("d.json", &fixed)],
        );
        assert!(
            r.problems[0].message.contains("window sliding"),
            "{}",
            r.problems[0]
        );
        let plain = r#"{"x-tenant-id": {"default": {"perminute": 20}}}"#;
        let text = format!(
            r#"{{"domain": "d", "limits": {plain}, "rate_limit_service": {{"cluster": "c"}}}}"#
        );
        let p = parse_plugin_config(text.as_bytes()).unwrap().0;
        let r = check_counter(&p, &[parse_counter_team_file("d.json", plain)]);
        assert!(r.problems[0].message.contains("envoyproxy/ratelimit"));
    }
}

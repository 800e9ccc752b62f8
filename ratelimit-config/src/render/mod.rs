//! `render`: every deployment artifact from the team file, for one target
//! (Istio, Envoy Gateway, plain Envoy), with the rate-limit service, its
//! Redis and the NetworkPolicies around them. What is written is a
//! function of the team file, the deployment description and the flags:
//! running it twice gives the same bytes, and `deploy/` in the repository
//! is its output for the example (a test fails when it is stale).
//!
//! - [`deployment`]: the description, checked;
//! - [`envoy`]: what an Envoy needs (the filter, the rate-limit cluster, the
//!   per-group labels), shared by every target;
//! - [`kube`]: the rate-limit service, Redis, NetworkPolicies, kustomization;
//! - [`monitoring`]: the Prometheus Operator's monitors and what they scrape;
//! - [`targets`]: the files of each target;
//! - [`vm`]: the counter on a VM (a systemd unit).

pub mod deployment;
pub mod envoy;
pub mod kube;
pub mod monitoring;
pub mod targets;
pub mod vm;

use serde_json::{Map, Value};

use crate::check::{check, parse_service_config, Problem};
use crate::error::ConfigError;
use crate::model::{Service, TeamLimits};
use crate::plugin::{
    parse_plugin_config, plugin_config_json, PluginConfig, PluginOptions, DEFAULT_DESCRIPTOR_KEY,
    DEFAULT_TIMEOUT_MS,
};
use crate::service_yaml::service_yaml;

pub use deployment::{Deployment, FailStrategy, IstioMode, Target};

/// The plugin's name everywhere: Envoy's filter `name` and `root_id`,
/// Istio's `pluginName`, Envoy Gateway's `rootID`.
pub const ROOT_ID: &str = "tenant_ratelimit";
/// The name of the resources `render` writes for the filter.
pub const RESOURCE_NAME: &str = "tenant-ratelimit";
/// The name of the one route of an Istio sidecar's inbound listener
/// (Istio's `DefaultRouteName`), whatever the VirtualServices say.
pub const ISTIO_INBOUND_ROUTE: &str = "default";
/// The static cluster of the rate-limit service (Envoy Gateway, plain Envoy).
pub const STATIC_CLUSTER: &str = "tenant_ratelimit";

/// One file `render` writes: its name in the output directory and its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct File {
    pub name: String,
    pub text: String,
}

/// What the team file gives every target: where it came from, the
/// document and its model.
pub struct Team<'a> {
    /// The team file's name (only its name: the output must not depend on
    /// where it ran).
    pub source: &'a str,
    pub json: &'a Value,
    pub limits: &'a TeamLimits,
}

/// A plugin configuration the filter refuses (what `render` or `generate`
/// would have written): each error with the place that set it, a flag or
/// a line of the description.
#[derive(Debug)]
pub struct Refused(pub Vec<(String, ConfigError)>);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (place, e)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{place}: plugin configuration: {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Refused {}

/// Why `render` wrote nothing.
#[derive(Debug)]
pub enum RenderError {
    /// The plugin configuration the settings make is one the filter refuses.
    Refused(Refused),
    /// What render wrote does not agree with itself: a bug.
    Disagree(Vec<Problem>),
}

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RenderError::Refused(refused) => refused.fmt(f),
            RenderError::Disagree(problems) => {
                for (i, p) in problems.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    write!(f, "rendered files disagree (a bug): {p}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for RenderError {}

/// The plugin configuration as the target deploys it, checked by the
/// filter's own parser: `generate`'s defaults, the description's `plugin`
/// settings over them, the domain and the target's cluster.
pub struct Plugin {
    /// In the order operators read it (what is written).
    pub json: Value,
    pub config: PluginConfig,
    /// Its warnings of its own (the team file's are the team file's).
    pub warnings: Vec<ConfigError>,
}

/// Merges `over` into `base`: objects key by key, anything else replaced.
pub fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// The plugin configuration for `dep` with `cluster`; `place` says where a
/// plugin setting came from (for errors).
pub fn plugin(
    team: &Team<'_>,
    dep: &Deployment,
    cluster: &str,
    place: &dyn Fn(&str) -> String,
) -> Result<Plugin, RenderError> {
    let generated = plugin_config_json(
        team.json,
        &PluginOptions {
            domain: &dep.domain,
            cluster,
            service: dep.service.kind,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            descriptor_key: DEFAULT_DESCRIPTOR_KEY,
        },
    );
    let mut json = serde_json::to_value(&generated).unwrap_or(Value::Null);
    merge(&mut json, &Value::Object(dep.plugin.clone()));
    let text = json.to_string();
    match parse_plugin_config(text.as_bytes()) {
        Ok((config, warnings)) => Ok(Plugin {
            json,
            config,
            warnings: warnings
                .into_iter()
                .filter(|w| !w.path.starts_with("limits"))
                .collect(),
        }),
        Err(errors) => Err(RenderError::Refused(Refused(
            errors
                .into_iter()
                .map(|e| (place(&format!("plugin.{}", e.path)), e))
                .collect(),
        ))),
    }
}

/// The service's rules for the plugin configuration, checked against it
/// as `check` would (so a rendered pair always agrees): envoyproxy/ratelimit's
/// `ratelimit.yaml`, or the counter's team file, `<domain>.json`.
pub fn service_rules(
    team: &Team<'_>,
    dep: &Deployment,
    config: &PluginConfig,
) -> Result<File, RenderError> {
    if dep.service.kind == Service::Counter {
        return counter_rules(team, dep, config);
    }
    let yaml = service_yaml(
        team.limits,
        &config.domain,
        &config.descriptor_key,
        team.source,
    );
    let service = parse_service_config("ratelimit.yaml", &yaml).map_err(RenderError::Disagree)?;
    let report = check(config, &[service]);
    if report.problems.is_empty() {
        Ok(File {
            name: "ratelimit.yaml".into(),
            text: yaml,
        })
    } else {
        Err(RenderError::Disagree(report.problems))
    }
}

/// The counter's team file: the team file as the counter reads it, checked
/// as `check` checks a counter's team file against the plugin configuration.
fn counter_rules(
    team: &Team<'_>,
    dep: &Deployment,
    config: &PluginConfig,
) -> Result<File, RenderError> {
    let name = kube::counter_limits_file(dep);
    let text = serde_json::to_string_pretty(team.json).unwrap_or_default() + "\n";
    let counter = crate::check::parse_counter_team_file(&name, &text);
    let report = crate::check::check_counter(config, &[counter]);
    if report.problems.is_empty() {
        Ok(File { name, text })
    } else {
        Err(RenderError::Disagree(report.problems))
    }
}

/// Every file of `target`, with the plugin configuration's own warnings.
pub fn render(
    team: &Team<'_>,
    dep: &Deployment,
    target: Target,
    place: &dyn Fn(&str) -> String,
) -> Result<(Vec<File>, Vec<ConfigError>), RenderError> {
    let cluster = match target {
        Target::Istio => istio_cluster(dep),
        Target::EnvoyGateway | Target::Envoy => STATIC_CLUSTER.to_string(),
    };
    let p = plugin(team, dep, &cluster, place)?;
    let rules = service_rules(team, dep, &p.config)?;
    let files = match target {
        Target::Istio => targets::istio(team, dep, &p, &rules),
        Target::EnvoyGateway => targets::envoy_gateway(team, dep, &p, &rules),
        Target::Envoy => targets::envoy(team, dep, &p, &rules),
    };
    Ok((files, p.warnings))
}

/// Istio's outbound cluster of the rate-limit Service:
/// `outbound|<port>||<service>.<namespace>.svc.<cluster domain>`.
pub fn istio_cluster(dep: &Deployment) -> String {
    format!("outbound|{}||{}", dep.service.port, service_host(dep))
}

/// The rate-limit Service's DNS name.
pub fn service_host(dep: &Deployment) -> String {
    format!(
        "{}.{}.svc.{}",
        dep.service.name,
        dep.namespace.as_deref().unwrap_or("default"),
        dep.cluster_domain
    )
}

/// The header comment of every file: what wrote it, from what.
pub fn header(team: &Team<'_>, target: Target, lines: &[&str]) -> Vec<String> {
    let mut out = vec![
        format!(
            "generated by `ratelimit-config render --target {}` from {}; do not edit: render again",
            target.name(),
            crate::service_yaml::comment_text(team.source)
        ),
        String::new(),
    ];
    out.extend(lines.iter().map(|l| l.to_string()));
    out
}

/// `lines` as a YAML stream's comment, then `docs`.
pub fn yaml_file(name: &str, comment: &[String], docs: &[Value]) -> File {
    let lines: Vec<&str> = comment.iter().map(String::as_str).collect();
    File {
        name: name.to_string(),
        text: crate::yaml_out::stream(&lines, docs),
    }
}

/// An object from pairs, in order.
pub fn object<'a>(pairs: impl IntoIterator<Item = (&'a str, Value)>) -> Value {
    Value::Object(
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<Map<String, Value>>(),
    )
}

/// The team file's route names, each with the groups that limit it, sorted.
pub fn team_routes(limits: &TeamLimits) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for g in limits.default.iter().chain(limits.groups.iter()) {
        for r in &g.routes {
            match out.iter_mut().find(|(n, _)| *n == r.name) {
                Some((_, groups)) => groups.push(g.name.clone()),
                None => out.push((r.name.clone(), vec![g.name.clone()])),
            }
        }
    }
    out.sort();
    out
}

/// What `render` tells about the team file's per-route limits: for plain
/// Envoy, a warning for each route that no route it writes carries (the
/// limit would never apply); for Istio and Envoy Gateway, where the route
/// names come from the platform, where to find them.
pub fn route_notes(limits: &TeamLimits, dep: &Deployment, target: Target) -> Vec<String> {
    let routes = team_routes(limits);
    if routes.is_empty() {
        return Vec::new();
    }
    let quoted = |names: &[&str]| {
        names
            .iter()
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let names: Vec<&str> = routes.iter().map(|(n, _)| n.as_str()).collect();
    match target {
        Target::Envoy => routes
            .iter()
            .filter(|(name, _)| !dep.envoy.routes.iter().any(|(n, _)| n == name))
            .map(|(name, groups)| {
                format!(
                    "warning: envoy.routes: the team file limits route {name:?} ({}) but no route of envoy.yaml is named so: the limit never applies there; name the route in your own bootstrap, or give its prefix (envoy: routes: {{{name}: /{name}}} or --set envoy.routes.{name}=/{name})",
                    groups.join(", ")
                )
            })
            .collect(),
        // A sidecar's inbound listener has one route, always named
        // "default" (Istio's BuildDefaultHTTPInboundRoute): a VirtualService
        // names the routes of outbound and gateway listeners only.
        Target::Istio if dep.istio.mode == IstioMode::Server => routes
            .iter()
            .filter(|(name, _)| name != ISTIO_INBOUND_ROUTE)
            .map(|(name, groups)| {
                format!(
                    "warning: istio.mode: the team file limits route {name:?} ({}) but a sidecar's inbound route is always named \"{ISTIO_INBOUND_ROUTE}\" under Istio, whatever the VirtualServices say: the limit never applies there; run the filter on an ingress gateway (--set istio.mode=CLIENT, workload: the gateway), where routes carry the VirtualService's http[].name (docs/deploying.md#route-names)",
                    groups.join(", ")
                )
            })
            .collect(),
        Target::Istio => vec![format!(
            "note: the team file limits route {}: on an Istio gateway, Envoy's route name is the VirtualService's http[].name (\"<http name>.<match name>\" when the match is named); give each HTTP route that name (docs/deploying.md#route-names)",
            quoted(&names)
        )],
        Target::EnvoyGateway => vec![format!(
            "note: the team file limits route {}: Envoy Gateway names each Envoy route after its HTTPRoute rule, httproute/<namespace>/<name>/rule/<rule>/match/<match>/<hostname, dots as _>; use those names in the team file (docs/deploying.md#route-names)",
            quoted(&names)
        )],
    }
}

//! `check`: every descriptor the filter can send against the service's
//! rules (envoyproxy/ratelimit's YAML or the counter's team file), and the
//! team file's routes against Envoy's.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use ratelimit_config::check::{
    check, check_counter, is_counter_team_file, parse_counter_team_file, tls, ServiceConfig,
};
use ratelimit_config::deployed;
use ratelimit_config::render::team_routes;

use super::args::CheckArgs;
use super::error::CliError;
use super::load::{load_plugin, load_service, placed, read, shown};

/// The route names of the Envoy configurations `check` was given.
struct DeployedRoutes {
    names: Vec<String>,
    /// The files that had routes, as messages name them.
    files: Vec<String>,
}

/// The route names of the Envoy configurations given (and of the plugin
/// configuration's file when it is one); None when no file carries a route.
fn deployed_routes(a: &CheckArgs) -> Result<Option<DeployedRoutes>, CliError> {
    let mut names = Vec::new();
    let mut files = Vec::new();
    let plugin_file = std::iter::once(&a.plugin_config).filter(|p| *p != Path::new("-"));
    for path in plugin_file.chain(&a.envoy_config) {
        let text = read(path)?;
        match deployed::route_names(&text) {
            Some(routes) if !routes.is_empty() => {
                names.extend(routes.into_iter().flatten());
                files.push(shown(path));
            }
            _ if a.envoy_config.contains(path) => {
                return Err(CliError::Usage(format!(
                "--envoy-config {}: no Envoy route in it (expected a bootstrap or a /config_dump)",
                shown(path)
            )))
            }
            _ => {}
        }
    }
    Ok((!files.is_empty()).then_some(DeployedRoutes { names, files }))
}

/// `--deployed`: the TLS of the hop from Envoy to the service, each side
/// read back from what is deployed; each disagreement, or a missing side.
fn deployed_tls(a: &CheckArgs, cluster: &str) -> Result<Vec<String>, CliError> {
    if a.deployed.is_empty() {
        return Ok(Vec::new());
    }
    let mut all = tls::Deployed::default();
    for path in &a.deployed {
        let d = tls::read_deployed(&shown(path), &read(path)?, cluster);
        all.clusters.extend(d.clusters);
        all.services.extend(d.services);
    }
    if let Some(m) = tls::missing_side(&all, cluster) {
        return Err(CliError::Usage(m));
    }
    let problems = tls::disagreements(&all, cluster);
    if problems.is_empty() {
        println!(
            "ok: the rate-limit cluster {cluster:?} and the service agree on TLS ({})",
            match all.clusters.first() {
                Some(c) if c.client_cert => "mutual TLS",
                Some(c) if c.tls => "TLS",
                _ => "plaintext",
            }
        );
    }
    Ok(problems)
}

/// Checks the filter's configuration against the service's rules; every
/// input's problems are shown.
pub fn run(a: CheckArgs) -> Result<ExitCode, CliError> {
    let a = &a;
    let (plugin_config, service_configs) = (&a.plugin_config, &a.service_config);
    // Every input is read, so that every one's problems are shown.
    let mut errors = Vec::new();
    let routes = deployed_routes(a)
        .map_err(|e| errors.push(e))
        .ok()
        .flatten();
    let plugin = load_plugin(plugin_config).map_err(|e| errors.push(e)).ok();
    let mut places = BTreeMap::new();
    // ratelimit-counter's team files (<domain>.json), or envoyproxy/ratelimit's YAML.
    let mut counter_files = Vec::new();
    let mut yaml_configs = Vec::new();
    for s in service_configs {
        if s == Path::new("-") {
            yaml_configs.push(s);
            continue;
        }
        match read(s) {
            Ok(text) if is_counter_team_file(&shown(s), &text) => {
                counter_files.push(parse_counter_team_file(&shown(s), &text));
            }
            Ok(_) => yaml_configs.push(s),
            Err(e) => errors.push(e),
        }
    }
    let services: Vec<ServiceConfig> = yaml_configs
        .iter()
        .filter_map(|s| {
            load_service(s, &mut places)
                .map_err(|e| errors.push(e))
                .ok()
        })
        .flatten()
        .collect();
    if !counter_files.is_empty() && !yaml_configs.is_empty() {
        errors.push(CliError::Usage(
            "--service-config: give the counter's team file (<domain>.json) or envoyproxy/ratelimit's YAML, not both".into(),
        ));
    }
    let (Some(plugin), true) = (plugin, errors.is_empty()) else {
        for e in &errors {
            eprintln!("{e}");
        }
        return Ok(ExitCode::FAILURE);
    };
    let mut report = if counter_files.is_empty() {
        check(&plugin, &services)
    } else {
        check_counter(&plugin, &counter_files)
    };
    for p in report.problems.iter_mut().chain(report.warnings.iter_mut()) {
        *p = placed(p.clone(), &places);
    }
    for w in &report.warnings {
        let w = w.to_string();
        // `file:line:col: warning: …`, as validate prints warnings.
        match w.split_once(": ") {
            Some((at, rest)) => eprintln!("{at}: warning: {rest}"),
            None => eprintln!("warning: {w}"),
        }
    }
    if let Some(DeployedRoutes { names, files }) = &routes {
        for (route, groups) in team_routes(&plugin.limits) {
            if !names.contains(&route) {
                let paths: Vec<String> = groups
                    .iter()
                    .map(|g| format!("limits.{}.{g}.routes.{route}", plugin.limits.header))
                    .collect();
                eprintln!(
                    "{}: warning: {}: no Envoy route there is named {route:?}: that limit never applies; name the route so in Envoy's configuration (docs/deploying.md#route-names)",
                    files.join(", "),
                    paths.join(", "),
                );
            }
        }
    }
    for p in &report.problems {
        eprintln!("{p}");
    }
    let tls_problems = deployed_tls(a, &plugin.cluster)?;
    for p in &tls_problems {
        eprintln!("{p}");
    }
    if !tls_problems.is_empty() {
        return Ok(ExitCode::FAILURE);
    }
    if report.problems.is_empty() {
        println!(
            "ok: {} descriptors of {} groups match the rules of domain {:?}",
            report.checked, report.groups, plugin.domain
        );
        println!("tenant from: {}", report.tenant_from);
        if !report.shadowed.is_empty() {
            println!(
                "shadow (refusals counted, never enforced): {}",
                report.shadowed.join(", ")
            );
        }
        Ok(ExitCode::SUCCESS)
    } else if report.checked == 0 {
        eprintln!(
            "no descriptor checked: the filter's domain {:?} is in no service config given",
            plugin.domain
        );
        Ok(ExitCode::FAILURE)
    } else {
        eprintln!(
            "{} of {} descriptors do not match",
            report.problems.len(),
            report.checked
        );
        Ok(ExitCode::FAILURE)
    }
}

//! `generate`: ratelimit.yaml, envoy-rate-limits.yaml (and the routes'
//! one) and plugin-config.json from a team file.

use std::process::ExitCode;

use ratelimit_config::check::{check, parse_service_config};
use ratelimit_config::envoy_rate_limits::{envoy_rate_limits_yaml, envoy_route_rate_limits_yaml};
use ratelimit_config::owned::Output;
use ratelimit_config::plugin::{plugin_config_json, PluginOptions};
use ratelimit_config::render::deployment::Sources;
use ratelimit_config::render::{merge, Refused};
use ratelimit_config::service_yaml::service_yaml;
use ratelimit_config::{parse_plugin_config, Service};

use super::args::GenerateArgs;
use super::error::CliError;
use super::load::{load_team_for, source_name};
use super::write_out;

/// Writes the service's rules, Envoy's own rate_limits and the filter's
/// configuration, after checking that they agree.
pub fn run(a: GenerateArgs) -> Result<ExitCode, CliError> {
    let (doc, limits) = load_team_for(&a.file, a.service.service)?;
    let source = source_name(&a.file);
    let yaml = service_yaml(&limits, &a.domain, &a.descriptor_key, &source);
    let native = envoy_rate_limits_yaml(&limits, &a.domain, &a.descriptor_key, &source);
    let native_routes =
        envoy_route_rate_limits_yaml(&limits, &a.domain, &a.descriptor_key, &source);
    let plugin = plugin_config_json(
        &doc,
        &PluginOptions {
            domain: &a.domain,
            cluster: &a.cluster,
            service: a.service.service,
            timeout_ms: a.timeout_ms,
            descriptor_key: &a.descriptor_key,
        },
    );
    // The paths generate's own flags set; --plugin sets any other.
    let owned = [
        ("domain", "--domain"),
        ("limits", "the team file"),
        ("rate_limit_service.cluster", "--cluster"),
        ("rate_limit_service.service", "--service"),
        ("rate_limit_service.timeout_ms", "--timeout-ms"),
        ("descriptor_key", "--descriptor-key"),
    ];
    let (settings, flags) = a.plugin.read(&owned)?;
    let sources = Sources {
        flags,
        ..Sources::default()
    };
    // A problem is the flag's that set its path (or a parent), else the
    // --plugin settings'.
    let place = |path: &str| {
        owned
            .iter()
            .find(|(p, _)| path == *p || path.starts_with(&format!("{p}.")))
            .map_or_else(
                || sources.place(&format!("plugin.{path}")),
                |(_, flag)| flag.to_string(),
            )
    };
    let mut plugin = serde_json::to_value(&plugin).map_err(|source| CliError::Serialise {
        what: "plugin configuration",
        source,
    })?;
    merge(&mut plugin, &settings);
    let plugin_text = serde_json::to_string_pretty(&plugin)
        .map(|t| t + "\n")
        .map_err(|source| CliError::Serialise {
            what: "plugin configuration",
            source,
        })?;
    // What is written must be what the filter accepts, and agree with the
    // service YAML: run both checks before writing anything.
    let (parsed, warnings) = parse_plugin_config(plugin_text.as_bytes()).map_err(|errors| {
        CliError::Refused(Refused(
            errors.into_iter().map(|e| (place(&e.path), e)).collect(),
        ))
    })?;
    for w in warnings.iter().filter(|w| !w.path.starts_with("limits")) {
        eprintln!("{}: warning: plugin configuration: {w}", place(&w.path));
    }
    let service = parse_service_config("ratelimit.yaml", &yaml).map_err(CliError::GeneratedYaml)?;
    // For the counter, which reads the team file itself, ratelimit.yaml
    // (without the calendar units) is not what counts.
    if a.service.service == Service::EnvoyRatelimit {
        let report = check(&parsed, &[service]);
        if !report.problems.is_empty() {
            return Err(CliError::Disagree(report.problems));
        }
    }
    let outputs: Vec<Output<'_>> = [
        ("ratelimit.yaml", Some(&yaml)),
        ("envoy-rate-limits.yaml", Some(&native)),
        ("envoy-route-rate-limits.yaml", native_routes.as_ref()),
        ("plugin-config.json", Some(&plugin_text)),
    ]
    .into_iter()
    .filter_map(|(name, text)| text.map(|text| Output { name, text }))
    .collect();
    write_out(&a.out, &outputs, "generate")?;
    Ok(ExitCode::SUCCESS)
}

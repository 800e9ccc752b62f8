//! `explain`: one tenant's group, limits, descriptors and Redis keys.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use ratelimit_config::explain::{explain, ExplainOptions};
use ratelimit_config::plugin::DEFAULT_DESCRIPTOR_KEY;
use ratelimit_config::{Service, TenantSource};

use super::args::ExplainArgs;
use super::error::CliError;
use super::load::{load_plugin, load_team_for};

/// Prints how the filter and the service treat one tenant.
pub fn run(a: ExplainArgs) -> Result<ExitCode, CliError> {
    let plugin = match &a.plugin_config {
        Some(p) => Some(load_plugin(p)?),
        None => None,
    };
    // --service wins over the plugin configuration's: one can ask what
    // the other service would do with the same configuration.
    let (service, service_from) = match (a.service, &plugin) {
        (Some(s), Some(c)) if s != c.service => (
            s,
            format!(
                "--service; the plugin configuration's rate_limit_service.service is {}",
                c.service.name()
            ),
        ),
        (Some(s), _) => (s, "--service".to_string()),
        (None, Some(c)) => (
            c.service,
            "the plugin configuration's rate_limit_service.service".to_string(),
        ),
        (None, None) => (Service::EnvoyRatelimit, "the default".to_string()),
    };
    if service == Service::Counter && !a.key_prefix.is_empty() {
        return Err(CliError::Usage(
            "--key-prefix is envoyproxy/ratelimit's CACHE_KEY_PREFIX; ratelimit-counter's keys have none (trl:{...})".into(),
        ));
    }
    let (limits, domain, descriptor_key, shadow, source) = match (&a.file, &plugin) {
        (_, Some(c)) => {
            // The filter refuses a tenant longer than max_tenant_length
            // before any limit applies.
            let max = usize::try_from(c.max_tenant_length).unwrap_or(usize::MAX);
            if a.tenant.len() > max {
                println!(
                    "tenant: {} bytes, over max_tenant_length {}: the filter answers 431 (Request Header Fields Too Large), counted in tenant_too_long; no group, no limit applies",
                    a.tenant.len(),
                    c.max_tenant_length
                );
                return Ok(ExitCode::SUCCESS);
            }
            (
                c.limits.clone(),
                c.domain.clone(),
                c.descriptor_key.clone(),
                c.shadow,
                c.tenant_source.clone(),
            )
        }
        (Some(f), None) => {
            let (_, limits) = load_team_for(f, service)?;
            let key = a
                .descriptor_key
                .unwrap_or_else(|| DEFAULT_DESCRIPTOR_KEY.to_string());
            let source = TenantSource::Header;
            (limits, a.domain.unwrap_or_default(), key, false, source)
        }
        // clap requires one of them.
        (None, None) => {
            return Err(CliError::Usage(
                "give a team file or --plugin-config".into(),
            ))
        }
    };
    let now = a.at.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    let opts = ExplainOptions {
        domain: &domain,
        descriptor_key: &descriptor_key,
        key_prefix: &a.key_prefix,
        shadow,
        local: plugin.as_ref().map(|c| &c.local),
        batch: plugin.as_ref().map(|c| &c.batch),
        plugin: plugin.as_ref(),
        route: a.route.as_deref(),
        tenant_source: &source,
        service,
        service_from: &service_from,
    };
    print!("{}", explain(&limits, &opts, &a.tenant, now));
    Ok(ExitCode::SUCCESS)
}

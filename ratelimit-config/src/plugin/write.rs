//! What `ratelimit-config generate` writes as the filter's plugin
//! configuration (`plugin-config.json`): the team file verbatim and every
//! default written out, in the order operators read it. CLI only.

use serde_json::Value;

use super::defaults::{
    max_tenant_length_fitting, DEFAULT_BATCH_MAX_DESCRIPTORS, DEFAULT_BATCH_MAX_IN_FLIGHT,
    DEFAULT_BREAKER_FAILURES, DEFAULT_HEADERS, DEFAULT_LOCAL_ENABLED, DEFAULT_LOCAL_SLOTS,
    DEFAULT_MISSING_TENANT, DEFAULT_ON_FAILURE, DEFAULT_PROBE_INTERVAL_MS, DEFAULT_STATUS_ON_ERROR,
};
use super::names::{HeaderMode, MissingTenant, OnFailure};

/// Options for the generated plugin configuration.
pub struct PluginOptions<'a> {
    pub domain: &'a str,
    pub cluster: &'a str,
    /// Written only when it is not the default.
    pub service: crate::model::Service,
    pub timeout_ms: u32,
    pub descriptor_key: &'a str,
}

/// The plugin configuration `generate` writes, in the order of its fields.
#[derive(serde::Serialize)]
pub struct PluginConfigJson<'a> {
    pub domain: &'a str,
    /// The team file, verbatim.
    pub limits: &'a Value,
    pub rate_limit_service: RateLimitServiceJson<'a>,
    pub on_failure: OnFailure,
    pub status_on_error: u16,
    pub breaker: BreakerJson,
    pub missing_tenant: MissingTenant,
    pub max_tenant_length: u32,
    pub descriptor_key: &'a str,
    pub headers: HeaderMode,
    pub local: LocalJson,
}

#[derive(serde::Serialize)]
pub struct RateLimitServiceJson<'a> {
    pub cluster: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<&'static str>,
    pub timeout_ms: u32,
    pub batch: BatchJson,
}

#[derive(serde::Serialize)]
pub struct BatchJson {
    pub max_descriptors: u32,
    pub max_in_flight: u32,
}

#[derive(serde::Serialize)]
pub struct BreakerJson {
    pub enabled: bool,
    pub failures: u32,
    pub probe_interval_ms: u32,
}

#[derive(serde::Serialize)]
pub struct LocalJson {
    pub enabled: bool,
    pub slots: u32,
}

/// `default_max_tenant_length`, from the team file's JSON (what `generate`
/// has): the parser takes the same value for a key left out.
fn max_tenant_length_for(team_json: &Value) -> u32 {
    let longest = team_json
        .as_object()
        .into_iter()
        .flat_map(|o| o.values())
        .filter_map(Value::as_object)
        .flat_map(|groups| groups.values())
        .filter_map(|g| g.get("header_value")?.as_array())
        .flatten()
        .filter_map(Value::as_str)
        .map(str::len)
        .max()
        .unwrap_or(0);
    max_tenant_length_fitting(longest)
}

/// The plugin configuration for a team limits document, with every default
/// written out so that operators see what is in force.
pub fn plugin_config_json<'a>(
    team_json: &'a Value,
    opts: &PluginOptions<'a>,
) -> PluginConfigJson<'a> {
    PluginConfigJson {
        domain: opts.domain,
        limits: team_json,
        rate_limit_service: RateLimitServiceJson {
            cluster: opts.cluster,
            service: (opts.service != crate::model::Service::EnvoyRatelimit)
                .then(|| opts.service.name()),
            timeout_ms: opts.timeout_ms,
            batch: BatchJson {
                max_descriptors: DEFAULT_BATCH_MAX_DESCRIPTORS,
                max_in_flight: DEFAULT_BATCH_MAX_IN_FLIGHT,
            },
        },
        on_failure: DEFAULT_ON_FAILURE,
        status_on_error: DEFAULT_STATUS_ON_ERROR,
        breaker: BreakerJson {
            enabled: true,
            failures: DEFAULT_BREAKER_FAILURES,
            probe_interval_ms: DEFAULT_PROBE_INTERVAL_MS,
        },
        missing_tenant: DEFAULT_MISSING_TENANT,
        max_tenant_length: max_tenant_length_for(team_json),
        descriptor_key: opts.descriptor_key,
        headers: DEFAULT_HEADERS,
        local: LocalJson {
            enabled: DEFAULT_LOCAL_ENABLED,
            slots: DEFAULT_LOCAL_SLOTS,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::{parse_plugin_config, DEFAULT_MAX_TENANT_LENGTH};

    const LIMITS: &str = r#"{"x-tenant-id": {"default": {"perhour": 100}}}"#;

    #[test]
    fn generate_writes_a_max_tenant_length_every_listed_tenant_fits() {
        let opts = PluginOptions {
            domain: "d",
            cluster: "rl",
            service: crate::model::Service::EnvoyRatelimit,
            timeout_ms: 20,
            descriptor_key: "tenant",
        };
        let short: Value = serde_json::from_str(LIMITS).unwrap();
        assert_eq!(
            plugin_config_json(&short, &opts).max_tenant_length,
            DEFAULT_MAX_TENANT_LENGTH
        );
        let long_tenant = "t".repeat(200);
        let long: Value = serde_json::json!({"x-t": {"default": {"perhour": 1},
            "gold": {"perhour": 2, "header_value": ["a", long_tenant]}}});
        let generated = plugin_config_json(&long, &opts);
        assert_eq!(generated.max_tenant_length, 200);
        let text = serde_json::to_string(&generated).unwrap();
        let (with_key, _) = parse_plugin_config(text.as_bytes()).unwrap();
        // Left out, the parser takes the same value.
        let mut without = serde_json::to_value(&generated).unwrap();
        without.as_object_mut().unwrap().remove("max_tenant_length");
        let (without_key, _) = parse_plugin_config(without.to_string().as_bytes()).unwrap();
        assert_eq!(with_key, without_key);
        assert_eq!(without_key.max_tenant_length, 200);
    }

    #[test]
    fn generated_config_round_trips() {
        let team: Value = serde_json::from_str(LIMITS).unwrap();
        let v = plugin_config_json(
            &team,
            &PluginOptions {
                domain: "internal-api",
                cluster: "ratelimit",
                service: crate::model::Service::EnvoyRatelimit,
                timeout_ms: 25,
                descriptor_key: "tenant",
            },
        );
        let text = serde_json::to_string(&v).unwrap();
        let (c, _) = parse_plugin_config(text.as_bytes()).unwrap();
        assert_eq!(c.domain, "internal-api");
        assert_eq!(c.cluster, "ratelimit");
        assert_eq!(c.timeout_ms, 25);
        // Every default written out is the one the parser takes.
        let minimal = format!(
            r#"{{"domain": "internal-api", "limits": {LIMITS}, "rate_limit_service": {{"cluster": "ratelimit", "timeout_ms": 25}}}}"#
        );
        assert_eq!(c, parse_plugin_config(minimal.as_bytes()).unwrap().0);
    }
}

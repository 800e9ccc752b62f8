//! Target `plugin_config`: the filter's plugin configuration parser
//! (`on_configure`), over arbitrary bytes.
//!
//! Checks: it never panics; a refusal names at least one error; an accepted
//! configuration lists each tenant in exactly the group that has it, every
//! group limits some unit, and the configuration `ratelimit-config
//! generate` writes for the same `limits` (with the accepted options) is
//! accepted too, with the same limits.

use ratelimit_config::parse_plugin_config;
use ratelimit_config::plugin::{plugin_config_json, PluginOptions};

pub fn check(data: &[u8]) {
    let config = match parse_plugin_config(data) {
        Ok((config, _warnings)) => config,
        Err(errors) => {
            assert!(!errors.is_empty(), "a refusal without an error");
            return;
        }
    };
    for g in config.limits.all_groups() {
        assert!(!g.limits.is_empty(), "group {:?} limits nothing", g.name);
        for t in &g.tenants {
            let found = config.limits.group_for(t).map(|f| f.name.as_str());
            assert_eq!(found, Some(g.name.as_str()), "tenant {t:?}");
        }
    }
    // The JSON text parsed, so it is one object that has `limits`.
    let doc: serde_json::Value = serde_json::from_slice(data).unwrap_or_default();
    let opts = PluginOptions {
        domain: &config.domain,
        cluster: &config.cluster,
        service: config.service,
        timeout_ms: config.timeout_ms,
        descriptor_key: &config.descriptor_key,
    };
    let limits = doc.get("limits").unwrap_or(&serde_json::Value::Null);
    let generated = match serde_json::to_string(&plugin_config_json(limits, &opts)) {
        Ok(text) => text,
        Err(e) => unreachable!("the generated configuration does not serialise: {e}"),
    };
    match parse_plugin_config(generated.as_bytes()) {
        Ok((again, _)) => assert_eq!(again.limits, config.limits),
        Err(e) => unreachable!("the generated configuration is refused: {e:?}"),
    }
}

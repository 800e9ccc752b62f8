//! The seed example of the design generates the checked-in files in
//! tests/golden/, byte for byte. `UPDATE_GOLDEN=1 cargo test` rewrites them
//! (then read the diff: it is what every user of the generated files gets).
// A test crate: helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use ratelimit_config::check::{lookup, parse_service_config};
use ratelimit_config::envoy_rate_limits::envoy_rate_limits_yaml;
use ratelimit_config::plugin::{plugin_config_json, PluginOptions};
use ratelimit_config::service_yaml::service_yaml;
use ratelimit_config::team_file::check_team_file;
use ratelimit_config::Unit;

const LIMITS: &str = include_str!("golden/limits.json");
const SERVICE: &str = include_str!("golden/ratelimit.yaml");
const NATIVE: &str = include_str!("golden/envoy-rate-limits.yaml");
const PLUGIN: &str = include_str!("golden/plugin-config.json");

fn generated() -> [(&'static str, String, &'static str); 3] {
    let f = check_team_file("limits.json", LIMITS);
    assert!(f.findings.is_empty(), "{:?}", f.findings);
    let (doc, limits) = f.parsed.unwrap();
    let plugin = plugin_config_json(
        &doc,
        &PluginOptions {
            domain: "internal-api",
            cluster: "ratelimit",
            service: ratelimit_config::Service::EnvoyRatelimit,
            timeout_ms: 20,
            descriptor_key: "tenant",
        },
    );
    [
        (
            "ratelimit.yaml",
            service_yaml(&limits, "internal-api", "tenant", "limits.json"),
            SERVICE,
        ),
        (
            "envoy-rate-limits.yaml",
            envoy_rate_limits_yaml(&limits, "internal-api", "tenant", "limits.json"),
            NATIVE,
        ),
        (
            "plugin-config.json",
            serde_json::to_string_pretty(&plugin).unwrap() + "\n",
            PLUGIN,
        ),
    ]
}

#[test]
fn the_seed_generates_the_golden_files() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    for (name, got, want) in generated() {
        if update {
            std::fs::write(format!("tests/golden/{name}"), &got).unwrap();
        } else {
            assert_eq!(got, want, "{name} differs from tests/golden/{name}");
        }
    }
}

/// The design's Envoy fragment, as the seed article prints it.
const DESIGN_RATE_LIMITS: &str = "rate_limits:
  - actions:
      - generic_key: { descriptor_value: per_second }
      - request_headers: { header_name: x-tenant-id, descriptor_key: tenant }
  - actions:
      - generic_key: { descriptor_value: per_minute }
      - request_headers: { header_name: x-tenant-id, descriptor_key: tenant }
  - actions:
      - generic_key: { descriptor_value: per_hour }
      - request_headers: { header_name: x-tenant-id, descriptor_key: tenant }
";

/// The design's service config fragment (it elides per_hour and tenant-c).
const DESIGN_SERVICE: &str = "domain: internal-api
descriptors:
  - key: generic_key
    value: per_second
    descriptors:
      - key: tenant                 # default for any tenant
        rate_limit: { unit: second, requests_per_unit: 5 }
      - key: tenant
        value: tenant-b             # a premium group, listed explicitly
        rate_limit: { unit: second, requests_per_unit: 50 }
  - key: generic_key
    value: per_minute
    descriptors:
      - key: tenant
        rate_limit: { unit: minute, requests_per_unit: 20 }
  # ...per_hour follows the same shape
";

#[test]
fn the_native_block_is_the_designs_without_the_comments() {
    let body: String = NATIVE
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(body, DESIGN_RATE_LIMITS);
}

#[test]
fn every_rule_of_the_design_is_in_the_service_yaml() {
    let design = parse_service_config("design", DESIGN_SERVICE).unwrap();
    let ours = parse_service_config("ratelimit.yaml", SERVICE).unwrap();
    assert_eq!(design.domain, ours.domain);
    let mut compared = 0;
    for unit in [Unit::Second, Unit::Minute] {
        for tenant in ["tenant-a", "tenant-b"] {
            let value = unit.descriptor_value();
            let entries = [("generic_key", value.as_ref()), ("tenant", tenant)];
            let (Some(want), _) = lookup(&design.descriptors, &entries) else {
                continue;
            };
            // Where the design elides tenant-b's rule, its default one is no claim.
            if tenant == "tenant-b" && want.composite != "tenant_tenant-b" {
                continue;
            }
            let (got, _) = lookup(&ours.descriptors, &entries);
            let (want, got) = (
                want.limit.as_ref().unwrap(),
                got.unwrap().limit.as_ref().unwrap(),
            );
            assert_eq!(
                (&want.unit, want.requests_per_unit, want.unlimited),
                (&got.unit, got.requests_per_unit, got.unlimited),
                "{entries:?}"
            );
            compared += 1;
        }
    }
    // per_second for both, per_minute for the default tenant (the design
    // leaves tenant-b's per-minute rule out).
    assert_eq!(compared, 3);
}

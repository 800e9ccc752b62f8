//! The parser's tests: every key's default, and every bad value named
//! by its path with its exact message.

use crate::plugin::*;

fn errs(text: &str) -> Vec<String> {
    match parse_plugin_config(text.as_bytes()) {
        Ok(_) => vec![],
        Err(e) => e.iter().map(ToString::to_string).collect(),
    }
}

const LIMITS: &str = r#"{"x-tenant-id": {"default": {"perhour": 100}}}"#;

#[test]
fn minimal_config_takes_defaults() {
    let text = format!(
        r#"{{"domain": "d", "limits": {LIMITS}, "rate_limit_service": {{"cluster": "rl"}}}}"#
    );
    let (c, _) = parse_plugin_config(text.as_bytes()).unwrap();
    assert_eq!(c.timeout_ms, 20);
    assert_eq!(c.on_failure, OnFailure::Allow);
    assert_eq!(c.status_on_error, 500);
    assert_eq!(
        c.breaker,
        BreakerConfig {
            enabled: true,
            failures: 5,
            probe_interval_ms: 1_000
        }
    );
    assert_eq!(
        c.fallback,
        FallbackConfig {
            envoys: 1,
            share: Share::Configured
        }
    );
    assert_eq!(c.missing_tenant, MissingTenant::Allow);
    assert_eq!(c.max_tenant_length, 128);
    assert_eq!(c.descriptor_key, "tenant");
    assert_eq!(c.headers, HeaderMode::DraftVersion03);
    assert_eq!(c.local, LocalConfig::default());
    assert!(!c.shadow);
    assert_eq!(c.near_limit_ppm, 800_000);
    assert_eq!(
        c.batch,
        BatchConfig {
            enabled: true,
            max_descriptors: DEFAULT_BATCH_MAX_DESCRIPTORS,
            max_in_flight: DEFAULT_BATCH_MAX_IN_FLIGHT,
        }
    );
    assert_eq!(c.tenant_source, TenantSource::Header);
}

fn with_batch(batch: &str) -> Result<BatchConfig, Vec<String>> {
    let text = format!(
        r#"{{"domain": "d", "limits": {LIMITS}, "rate_limit_service": {{"cluster": "rl", "batch": {batch}}}}}"#
    );
    parse_plugin_config(text.as_bytes())
        .map(|(c, _)| c.batch)
        .map_err(|e| e.iter().map(ToString::to_string).collect())
}

#[test]
fn batch_is_false_true_or_its_settings() {
    let on = BatchConfig::default();
    assert!(!with_batch("false").unwrap().enabled);
    assert_eq!(with_batch("true").unwrap(), on);
    assert_eq!(with_batch("{}").unwrap(), on);
    assert_eq!(
        with_batch(r#"{"max_descriptors": 40, "max_in_flight": 1}"#).unwrap(),
        BatchConfig {
            enabled: true,
            max_descriptors: 40,
            max_in_flight: 1,
        }
    );
    assert_eq!(
        with_batch(r#"{"max_descriptors": 0, "max_in_flight": 65, "size": 3}"#).unwrap_err(),
        vec![
            "rate_limit_service.batch.size: unknown key \"size\", expected one of max_descriptors, max_in_flight",
            "rate_limit_service.batch.max_descriptors: must be a positive integer, got 0",
            "rate_limit_service.batch.max_in_flight: must be at most 64, got 65",
        ]
    );
    assert_eq!(
        with_batch(r#"{"max_descriptors": 1001}"#).unwrap_err(),
        vec!["rate_limit_service.batch.max_descriptors: must be at most 1000, got 1001"]
    );
    assert_eq!(
        with_batch(r#""off""#).unwrap_err(),
        vec!["rate_limit_service.batch: must be false (one request per call), true, or an object {\"max_descriptors\": n, \"max_in_flight\": n}, got string \"off\""]
    );
}

#[test]
fn the_tenant_comes_from_the_header_or_a_property_path() {
    let c = with_top(
        r#", "tenant_source": {"property": ["metadata", "filter_metadata", "envoy.filters.http.jwt_authn", "jwt_payload", "tenant"]}"#,
    )
    .unwrap();
    let TenantSource::Property(path) = &c.tenant_source else {
        panic!("{:?}", c.tenant_source)
    };
    assert_eq!(
        TenantSource::dotted(path),
        "metadata.filter_metadata.envoy.filters.http.jwt_authn.jwt_payload.tenant"
    );
    let cases = [
        (r#""jwt""#.to_string(), "tenant_source: must be an object, got string \"jwt\""),
        ("{}".into(), "tenant_source.property: missing: the path of the Envoy attribute that holds the tenant, e.g. [\"metadata\", \"filter_metadata\", \"envoy.filters.http.jwt_authn\", \"jwt_payload\", \"tenant\"]"),
        (r#"{"property": "metadata.x"}"#.into(), "tenant_source.property: must be an array of 1 to 16 path segments (strings)"),
        (r#"{"property": []}"#.into(), "tenant_source.property: must be an array of 1 to 16 path segments (strings)"),
        (format!(r#"{{"property": {:?}}}"#, ["a"; 17]), "tenant_source.property: must be an array of 1 to 16 path segments (strings)"),
        (r#"{"property": ["metadata", ""]}"#.into(), "tenant_source.property[1]: must not be empty"),
        (r#"{"property": ["a\u0000b"]}"#.into(), "tenant_source.property[0]: must not contain a NUL character"),
    ];
    for (v, want) in cases {
        let got = with_top(&format!(r#", "tenant_source": {v}"#)).unwrap_err();
        assert_eq!(got, vec![want], "{v}");
    }
    assert_eq!(
        with_top(r#", "tenant_source": {"header": "x"}"#).unwrap_err(),
        vec!["tenant_source.header: unknown key \"header\", expected one of property", "tenant_source.property: missing: the path of the Envoy attribute that holds the tenant, e.g. [\"metadata\", \"filter_metadata\", \"envoy.filters.http.jwt_authn\", \"jwt_payload\", \"tenant\"]"]
    );
}

fn with_top(extra: &str) -> Result<PluginConfig, Vec<String>> {
    let text = format!(
        r#"{{"domain": "d", "limits": {{"x-t": {{"default": {{"perhour": 1}}, "gold": {{"perhour": 2, "header_value": ["b"], "shadow": true}}}}}}, "rate_limit_service": {{"cluster": "rl"}}{extra}}}"#
    );
    parse_plugin_config(text.as_bytes())
        .map(|(c, _)| c)
        .map_err(|e| e.iter().map(ToString::to_string).collect())
}

#[test]
fn shadow_is_global_or_per_group() {
    let c = with_top("").unwrap();
    let default = c.limits.default.as_ref().unwrap();
    let gold = c.limits.groups.first().unwrap();
    assert!(!c.shadowed(default));
    assert!(c.shadowed(gold));
    let all = with_top(r#", "shadow": true"#).unwrap();
    assert!(all.shadowed(all.limits.default.as_ref().unwrap()));
    assert_eq!(
        with_top(r#", "shadow": "yes""#).unwrap_err(),
        vec!["shadow: must be true or false, got string \"yes\""]
    );
}

#[test]
fn near_limit_ratio_is_above_0_and_at_most_1() {
    assert_eq!(
        with_top(r#", "near_limit_ratio": 0.9"#)
            .unwrap()
            .near_limit_ppm,
        900_000
    );
    assert_eq!(
        with_top(r#", "near_limit_ratio": 1"#)
            .unwrap()
            .near_limit_ppm,
        PPM
    );
    for bad in ["0", "1.5", "-0.2", "\"0.8\"", "0.0000001"] {
        let e = with_top(&format!(r#", "near_limit_ratio": {bad}"#)).unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("near_limit_ratio: must be a number greater than 0 and at most 1"),
            "{e:?}"
        );
    }
}

#[test]
fn headers_take_each_family_by_name() {
    let with = |h: &str| {
        let text = format!(
            r#"{{"domain": "d", "limits": {LIMITS}, "rate_limit_service": {{"cluster": "rl"}}, "headers": {h}}}"#
        );
        parse_plugin_config(text.as_bytes())
            .map(|(c, _)| c.headers)
            .map_err(|e| e.iter().map(ToString::to_string).collect::<Vec<_>>())
    };
    assert_eq!(with(r#""ietf_draft_10""#), Ok(HeaderMode::IetfDraft10));
    assert_eq!(with(r#""off""#), Ok(HeaderMode::Off));
    assert_eq!(
        with(r#""ietf""#),
        Err(vec![
            "headers: must be one of \"draft_version_03\", \"off\", \"ietf_draft_10\", got string \"ietf\"".to_string()
        ])
    );
}

fn with_cost(keys: &str) -> Result<PluginConfig, Vec<String>> {
    let text = format!(
        r#"{{"domain": "d", "rate_limit_service": {{"cluster": "rl"}},
            "limits": {{"x-t": {{"default": {{"perhour": 30}}}}}}{keys}}}"#
    );
    parse_plugin_config(text.as_bytes())
        .map(|(c, _)| c)
        .map_err(|e| e.iter().map(ToString::to_string).collect())
}

#[test]
fn request_cost_is_off_unless_a_cost_header_is_named() {
    assert_eq!(with_cost("").unwrap().cost, None);
    let c = with_cost(r#", "cost_header": "x-cost""#).unwrap();
    assert_eq!(
        c.cost,
        Some(CostConfig {
            header: "x-cost".into(),
            max: DEFAULT_MAX_COST
        })
    );
    let c = with_cost(r#", "cost_header": "x-cost", "max_cost": 50"#).unwrap();
    assert_eq!(c.cost.unwrap().max, 50);
}

#[test]
fn a_response_cost_header_is_bounded_by_max_cost() {
    assert_eq!(with_cost("").unwrap().response_cost, None);
    let c = with_cost(r#", "response_cost_header": "x-cost""#).unwrap();
    assert_eq!(
        c.response_cost,
        Some(CostConfig {
            header: "x-cost".into(),
            max: 1000
        })
    );
    assert_eq!(c.cost, None);
    // max_cost bounds it, without a cost_header too; the same name as the
    // request's cost header is fine (one is a request header, one a response's).
    let c = with_cost(r#", "response_cost_header": "x-cost", "max_cost": 100000"#).unwrap();
    assert_eq!(c.response_cost.unwrap().max, 100_000);
    let c =
        with_cost(r#", "response_cost_header": "x-cost", "cost_header": "x-cost", "max_cost": 7"#)
            .unwrap();
    assert_eq!((c.cost.unwrap().max, c.response_cost.unwrap().max), (7, 7));
    let err = |keys: &str| with_cost(keys).unwrap_err();
    assert_eq!(
        err(r#", "response_cost_header": "X-Cost""#),
        vec!["response_cost_header: header name \"X-Cost\" must be lowercase (Envoy matches header names in lowercase)"]
    );
    assert_eq!(
        err(r#", "response_cost_header": 5"#),
        vec!["response_cost_header: must be a string, got 5"]
    );
}

#[test]
fn bad_cost_settings_are_named() {
    let err = |keys: &str| with_cost(keys).unwrap_err();
    assert_eq!(
        err(r#", "max_cost": 10"#),
        vec!["max_cost: needs cost_header or response_cost_header (the header that carries the cost)"]
    );
    assert_eq!(
        err(r#", "cost_header": "x-cost", "max_cost": 0"#),
        vec!["max_cost: must be a positive integer, got 0"]
    );
    assert_eq!(
        err(r#", "cost_header": "x-cost", "max_cost": 1000001"#),
        vec!["max_cost: must be at most 1000000, got 1000001"]
    );
    assert_eq!(
        err(r#", "cost_header": "x-cost", "max_cost": "5""#),
        vec!["max_cost: must be a positive integer, got string \"5\""]
    );
    assert_eq!(
        err(r#", "cost_header": "X-Cost""#),
        vec!["cost_header: header name \"X-Cost\" must be lowercase (Envoy matches header names in lowercase)"]
    );
    assert_eq!(
        err(r#", "cost_header": """#),
        vec!["cost_header: must not be empty"]
    );
    assert_eq!(
        err(r#", "cost_header": "x-t""#),
        vec!["cost_header: \"x-t\" is the tenant header; the cost needs a header of its own"]
    );
}

#[test]
fn lease_max_batch_is_validated_and_defaults() {
    let c = with_local(r#"{"mode": "lease"}"#).unwrap();
    assert_eq!(c.local.lease_max_batch, DEFAULT_LEASE_MAX_BATCH);
    let c = with_local(r#"{"mode": "lease", "lease": {"max_batch": 7}}"#).unwrap();
    assert_eq!(c.local.lease_max_batch, 7);
    assert_eq!(
        with_local(r#"{"lease": {"max_batch": 0, "size": 1}}"#).unwrap_err(),
        vec![
            "local.lease.size: unknown key \"size\", expected one of max_batch",
            "local.lease.max_batch: must be a positive integer, got 0",
        ]
    );
    assert_eq!(
        with_local(r#"{"lease": {"max_batch": 100001}}"#).unwrap_err(),
        vec!["local.lease.max_batch: must be at most 100000, got 100001"]
    );
    assert_eq!(
        with_local(r#"{"lease": 5}"#).unwrap_err(),
        vec!["local.lease: must be an object, got 5"]
    );
}

#[test]
fn sync_settings_are_validated_and_default() {
    let c = with_local(r#"{"mode": "sync"}"#).unwrap();
    assert_eq!(
        (c.local.sync_interval_ms, c.local.sync_max_unsynced),
        (DEFAULT_SYNC_INTERVAL_MS, DEFAULT_SYNC_MAX_UNSYNCED)
    );
    let c = with_local(r#"{"sync": {"interval_ms": 250, "max_unsynced": 9}}"#).unwrap();
    assert_eq!(
        (c.local.sync_interval_ms, c.local.sync_max_unsynced),
        (250, 9)
    );
    assert_eq!(
        with_local(r#"{"sync": {"interval_ms": 5, "max_unsynced": 0, "x": 1}}"#).unwrap_err(),
        vec![
            "local.sync.x: unknown key \"x\", expected one of interval_ms, max_unsynced",
            "local.sync.interval_ms: must be from 10 to 60000, got 5",
            "local.sync.max_unsynced: must be a positive integer, got 0",
        ]
    );
    assert_eq!(
        with_local(r#"{"sync": []}"#).unwrap_err(),
        vec!["local.sync: must be an object, got an array"]
    );
}

#[test]
fn max_unsynced_is_at_most_half_of_a_sync_groups_smallest_limit() {
    // Left out, each sync group takes the default lowered to half of its
    // smallest limit: default 5/s (2), gold 70/min (35), silver 9/s (4).
    let c = with_local(r#"{"mode": "sync"}"#).unwrap();
    let l = &c.limits;
    let bounds: Vec<u32> = l
        .all_groups()
        .map(|g| c.local.max_unsynced_for(g))
        .collect();
    assert_eq!(bounds, [2, 35, 4]);
    // Set: at most that, in every group in sync mode.
    let c = with_local(r#"{"mode": "sync", "sync": {"max_unsynced": 2}}"#).unwrap();
    let bounds: Vec<u32> = l
        .all_groups()
        .map(|g| c.local.max_unsynced_for(g))
        .collect();
    assert_eq!(bounds, [2, 2, 2]);
    assert_eq!(
        with_local(r#"{"mode": "sync", "sync": {"max_unsynced": 1000000}}"#).unwrap_err(),
        vec![
            "local.sync.max_unsynced: 1000000 is more than half of group \"default\"'s smallest limit (5 per second): sync's overshoot bound, 2 × (Envoys − 1) × max_unsynced per window, would exceed the limit itself; at most 2 for this group",
            "local.sync.max_unsynced: 1000000 is more than half of group \"gold\"'s smallest limit (70 per minute): sync's overshoot bound, 2 × (Envoys − 1) × max_unsynced per window, would exceed the limit itself; at most 35 for this group",
            "local.sync.max_unsynced: 1000000 is more than half of group \"silver\"'s smallest limit (9 per second): sync's overshoot bound, 2 × (Envoys − 1) × max_unsynced per window, would exceed the limit itself; at most 4 for this group",
        ]
    );
    // Only groups in sync mode are held to it.
    let c = with_local(r#"{"groups": {"gold": {"mode": "sync"}}, "sync": {"max_unsynced": 30}}"#)
        .unwrap();
    assert_eq!(c.local.sync_max_unsynced, 30);
    assert_eq!(
        with_local(r#"{"groups": {"gold": {"mode": "sync"}}, "sync": {"max_unsynced": 36}}"#)
            .unwrap_err()
            .len(),
        1
    );
}

#[test]
fn a_lease_batch_is_at_most_a_twentieth_of_the_groups_smallest_limit() {
    // default 5/s and 30/h (1), gold 70/min (3), silver 9/s (1).
    let c = with_local(r#"{"mode": "lease"}"#).unwrap();
    let caps: Vec<u32> = c
        .limits
        .all_groups()
        .map(|g| c.local.lease_max_batch_for(g))
        .collect();
    assert_eq!(caps, [1, 3, 1]);
    assert_eq!(lease_batch_cap(100, 1_500), 75);
    assert_eq!(lease_batch_cap(50, 1_500), 50);
    assert_eq!(lease_batch_cap(100, 19), 1);
    assert_eq!(lease_batch_cap(100, u32::MAX), 100);
}

fn with_local(local: &str) -> Result<PluginConfig, Vec<String>> {
    let text = format!(
        r#"{{"domain": "d", "rate_limit_service": {{"cluster": "rl"}},
            "limits": {{"x-t": {{"default": {{"persecond": 5, "perhour": 30}},
                                "gold": {{"perminute": 70, "header_value": ["b"]}},
                                "silver": {{"persecond": 9, "header_value": ["c"]}}}}}},
            "local": {local}}}"#
    );
    parse_plugin_config(text.as_bytes())
        .map(|(c, _)| c)
        .map_err(|e| e.iter().map(ToString::to_string).collect())
}

#[test]
fn buckets_default_to_the_per_second_limit_and_groups_override_them() {
    let c = with_local(r#"{"slots": 64, "groups": {"gold": {"tokens_per_second": 2, "burst": 10}, "silver": {"tokens_per_second": 3}}}"#).unwrap();
    assert_eq!(c.local.slots, 64);
    let bucket = |t: &str| c.local.bucket_for(c.limits.group_for(t).unwrap());
    assert_eq!(
        bucket("a"),
        Some(BucketParams {
            tokens_per_second: 5,
            burst: 5
        })
    );
    assert_eq!(
        bucket("b"),
        Some(BucketParams {
            tokens_per_second: 2,
            burst: 10
        })
    );
    assert_eq!(
        bucket("c"),
        Some(BucketParams {
            tokens_per_second: 3,
            burst: 3
        })
    );
    let plain = with_local("{}").unwrap();
    // gold has no per-second limit and no override: no bucket.
    assert_eq!(
        plain.local.bucket_for(plain.limits.group_for("b").unwrap()),
        None
    );
    let off = with_local(r#"{"enabled": false}"#).unwrap();
    assert_eq!(
        off.local.bucket_for(off.limits.group_for("a").unwrap()),
        None
    );
}

fn with_max_tenant_length(v: &str, tenant: &str) -> Result<PluginConfig, Vec<String>> {
    let text = format!(
        r#"{{"domain": "d", "rate_limit_service": {{"cluster": "rl"}}, "max_tenant_length": {v},
            "limits": {{"x-t": {{"default": {{"perhour": 30}}, "gold": {{"perhour": 70, "header_value": ["{tenant}"]}}}}}}}}"#
    );
    parse_plugin_config(text.as_bytes())
        .map(|(c, _)| c)
        .map_err(|e| e.iter().map(ToString::to_string).collect())
}

#[test]
fn max_tenant_length_is_bytes_from_1_to_4096() {
    assert_eq!(
        with_max_tenant_length("1", "b").unwrap().max_tenant_length,
        1
    );
    assert_eq!(
        with_max_tenant_length("4096", "b")
            .unwrap()
            .max_tenant_length,
        4096
    );
    assert_eq!(
        with_max_tenant_length("0", "b").unwrap_err(),
        vec!["max_tenant_length: must be a positive integer, got 0"]
    );
    assert_eq!(
        with_max_tenant_length("4097", "b").unwrap_err(),
        vec!["max_tenant_length: must be at most 4096 (bytes), got 4097"]
    );
    assert_eq!(
        with_max_tenant_length("\"128\"", "b").unwrap_err(),
        vec!["max_tenant_length: must be a positive integer, got string \"128\""]
    );
    // A listed tenant longer than the cap could never be served. Bytes,
    // not characters: "é" is two.
    assert_eq!(
        with_max_tenant_length("3", "ééé").unwrap_err(),
        vec!["limits.x-t.gold.header_value[0]: tenant value \"ééé\" is 6 bytes, longer than max_tenant_length (3): its requests would all be refused with 431; raise max_tenant_length"]
    );
    assert!(with_max_tenant_length("6", "ééé").is_ok());
}

#[test]
fn modes_are_global_or_per_group() {
    let c = with_local(r#"{"mode": "sync", "groups": {"gold": {"mode": "lease"}, "silver": {"tokens_per_second": 3}}}"#).unwrap();
    let group = |name: &str| c.limits.all_groups().find(|g| g.name == name).unwrap();
    assert_eq!(c.local.mode_for(group("gold")), Mode::Lease);
    assert_eq!(c.local.mode_for(group("silver")), Mode::Sync);
    assert_eq!(c.local.mode_for(group("default")), Mode::Sync);
    // A mode alone keeps the group's default bucket.
    assert_eq!(c.local.bucket_for(group("gold")), None);
    assert_eq!(
        c.local.bucket_for(group("silver")),
        Some(BucketParams {
            tokens_per_second: 3,
            burst: 3
        })
    );
    let exact = with_local("{}").unwrap();
    assert_eq!(exact.local.mode_for(group("gold")), Mode::Exact);
}

#[test]
fn bad_modes_name_their_field() {
    assert_eq!(
        with_local(r#"{"mode": "fast", "groups": {"gold": {"mode": 1}}}"#).unwrap_err(),
        vec![
            "local.mode: must be one of \"exact\", \"lease\", \"sync\", got string \"fast\"",
            "local.groups.gold.mode: must be one of \"exact\", \"lease\", \"sync\", got 1",
        ]
    );
    assert_eq!(
        with_local(r#"{"enabled": false, "mode": "lease", "groups": {"gold": {"mode": "sync"}}}"#)
            .unwrap_err(),
        vec![
            "local.mode: \"lease\" needs the local layer, which local.enabled turns off",
            "local.groups.gold.mode: \"sync\" needs the local layer, which local.enabled turns off",
        ]
    );
}

#[test]
fn bad_local_sections_name_their_field() {
    assert_eq!(
        with_local(r#"{"slots": 0, "enabled": "yes", "size": 1, "groups": {"bronze": {"burst": 3}, "gold": {"tokens_per_second": 1.5, "burst": -1}}}"#).unwrap_err(),
        vec![
            "local.size: unknown key \"size\", expected one of enabled, slots, mode, groups, lease, sync",
            "local.enabled: must be true or false, got string \"yes\"",
            "local.slots: must be a positive integer, got 0",
            "local.groups.bronze: no such group in limits, expected one of default, gold, silver",
            "local.groups.bronze.tokens_per_second: missing: a group's bucket needs its refill rate",
            "local.groups.gold.tokens_per_second: must be a positive integer, got 1.5",
            "local.groups.gold.burst: must be a positive integer, got -1",
        ]
    );
    assert_eq!(
        with_local(r#"{"slots": 2000000}"#).unwrap_err(),
        vec!["local.slots: must be at most 1048576, got 2000000"]
    );
    assert_eq!(
        with_local("[]").unwrap_err(),
        vec!["local: must be an object, got an array"]
    );
}

#[test]
fn bad_configs_name_their_field() {
    assert_eq!(
        errs(&format!(
            r#"{{"domain": "d", "limits": {LIMITS}, "rate_limit_service": {{"cluster": "rl"}}, "bogus": 1}}"#
        )),
        vec!["bogus: unknown key \"bogus\", expected one of domain, limits, rate_limit_service, on_failure, failure_mode_deny, status_on_error, breaker, fallback, missing_tenant, max_tenant_length, descriptor_key, headers, local, shadow, near_limit_ratio, cost_header, max_cost, response_cost_header, tenant_source, metrics"]
    );
    assert_eq!(
        errs(r#"{"domain": "d", "rate_limit_service": {"cluster": "rl"}}"#),
        vec!["limits: missing: the team limits JSON is required"]
    );
    assert_eq!(
        errs(
            r#"{"domain": "d", "limits": {"x-t": {"default": {"perhour": -5}}}, "rate_limit_service": {"cluster": "rl", "timeout_ms": 0, "x": 1}, "missing_tenant": "block", "status_on_error": 42}"#
        ),
        vec![
            "limits.x-t.default.perhour: must be a positive integer, got -5",
            "rate_limit_service.x: unknown key \"x\", expected one of cluster, service, timeout_ms, batch",
            "rate_limit_service.timeout_ms: must be a positive integer, got 0",
            "missing_tenant: must be one of \"allow\", \"deny\", got string \"block\"",
            "status_on_error: must be an HTTP status from 200 to 599, got 42",
        ]
    );
    assert_eq!(errs("[1]"), vec!["must be a JSON object, got an array"]);
    assert_eq!(
        errs("\u{feff}{}"),
        vec!["starts with a UTF-8 byte order mark (BOM), which JSON does not allow: save it as UTF-8 without a BOM"]
    );
    let long = "d".repeat(1 << 20);
    let out = errs(&format!(r#"{{"domain": 7, "missing_tenant": "{long}"}}"#));
    assert!(out.iter().all(|l| l.len() < 300), "{out:?}");
    assert!(out.contains(&format!("missing_tenant: must be one of \"allow\", \"deny\", got string \"{}\"… (1048576 bytes)", &long[..64])), "{out:?}");
    assert_eq!(
        errs(&format!(
            "{{\"domain\": \"d\", \"limits\": {LIMITS}, \"rate_limit_service\": {{\"cluster\": \"rl\"}},\n \"domain\": \"e\"}}"
        )),
        vec!["domain: duplicate key \"domain\" at 2:2 (first at 1:2): JSON keeps only the last one"]
    );
    assert_eq!(
        errs(r#"{"domain": "d", "limits": {"x-t": {"default": {"perhour": 1, "perhour": 2}}}, "rate_limit_service": {"cluster": "rl"}}"#),
        vec!["limits.x-t.default.perhour: duplicate key \"perhour\" at 1:62 (first at 1:48): JSON keeps only the last one"]
    );
    assert!(errs("{").first().unwrap().starts_with("not valid JSON: "));
}

#[test]
fn failure_mode_deny_maps_onto_on_failure_and_contradictions_are_refused() {
    let policy = |extra: &str| with_top(extra).map(|c| (c.on_failure, c.status_on_error));
    assert_eq!(
        policy(r#", "failure_mode_deny": true, "status_on_error": 503"#),
        Ok((OnFailure::Deny, 503))
    );
    assert_eq!(
        policy(r#", "failure_mode_deny": false"#),
        Ok((OnFailure::Allow, 500))
    );
    assert_eq!(
        policy(r#", "on_failure": "deny", "failure_mode_deny": true"#),
        Ok((OnFailure::Deny, 500))
    );
    // A generated configuration says failure_mode_deny false: "local" and
    // "allow" agree with it.
    assert_eq!(
        policy(r#", "on_failure": "local", "failure_mode_deny": false, "fallback": {"envoys": 3}"#),
        Ok((OnFailure::Local, 500))
    );
    // Not a failure policy: 200 with deny, allow with failure_mode_deny.
    assert_eq!(
        policy(r#", "failure_mode_deny": true, "status_on_error": 200"#).unwrap_err(),
        vec!["status_on_error: 200 would refuse with a success, the upstream never reached: on_failure \"deny\" needs 400 to 599"]
    );
    // Unused with "allow": any status is taken, as before.
    assert_eq!(
        policy(r#", "status_on_error": 200"#),
        Ok((OnFailure::Allow, 200))
    );
    assert_eq!(
        policy(r#", "failure_mode_deny": true, "on_failure": "allow""#).unwrap_err(),
        vec!["failure_mode_deny: true contradicts on_failure \"allow\""]
    );
    assert_eq!(
        policy(r#", "failure_mode_deny": false, "on_failure": "deny""#).unwrap_err(),
        vec!["failure_mode_deny: false contradicts on_failure \"deny\""]
    );
    assert_eq!(
        policy(r#", "on_failure": "block""#).unwrap_err(),
        vec!["on_failure: must be one of \"allow\", \"deny\", \"local\", got string \"block\""]
    );
}

#[test]
fn metrics_groups_lists_the_groups_with_series_of_their_own() {
    let all = with_top("").unwrap();
    assert_eq!(all.metrics, MetricsConfig::default());
    assert!(all.metrics.exported("gold") && all.metrics.exported("default"));
    let some = with_top(r#", "metrics": {"groups": ["gold"]}"#).unwrap();
    assert_eq!(some.metrics.groups, Some(vec!["gold".to_string()]));
    assert!(some.metrics.exported("gold"));
    assert!(!some.metrics.exported("default"));
    let none = with_top(r#", "metrics": {"groups": []}"#).unwrap();
    assert!(!none.metrics.exported("gold"));
    assert_eq!(
        with_top(r#", "metrics": {"groups": ["gold", "silver", "gold", 3], "group": 1}"#)
            .unwrap_err(),
        vec![
            "metrics.group: unknown key \"group\", expected one of groups",
            "metrics.groups[1]: no such group in limits, expected one of default, gold",
            "metrics.groups[3]: must be a string, got 3",
        ]
    );
    assert_eq!(
        with_top(r#", "metrics": {"groups": "gold"}"#).unwrap_err(),
        vec!["metrics.groups: must be an array of group names (the groups whose counters are series of their own)"]
    );
}

#[test]
fn the_breaker_and_the_fallback_are_checked() {
    let c = with_top(
        r#", "on_failure": "local", "fallback": {"envoys": 3, "share": "learned"}, "breaker": {"failures": 3, "probe_interval_ms": 250}"#,
    )
    .unwrap();
    assert_eq!(c.on_failure, OnFailure::Local);
    assert_eq!(
        c.fallback,
        FallbackConfig {
            envoys: 3,
            share: Share::Learned
        }
    );
    assert_eq!((c.breaker.failures, c.breaker.probe_interval_ms), (3, 250));
    assert!(
        !with_top(r#", "breaker": {"enabled": false}"#)
            .unwrap()
            .breaker
            .enabled
    );
    assert_eq!(
        with_top(r#", "breaker": {"failures": 0, "probe_interval_ms": 5, "x": 1, "enabled": 1}"#)
            .unwrap_err(),
        vec![
            "breaker.x: unknown key \"x\", expected one of enabled, failures, probe_interval_ms",
            "breaker.enabled: must be true or false, got 1",
            "breaker.failures: must be a positive integer, got 0",
            "breaker.probe_interval_ms: must be from 10 to 600000, got 5",
        ]
    );
    assert_eq!(
        with_top(r#", "on_failure": "local""#).unwrap_err(),
        vec!["fallback.envoys: missing: on_failure \"local\" needs the Envoys sharing each limit"]
    );
    assert_eq!(
        with_top(r#", "on_failure": "local", "fallback": {"envoys": 0, "share": "guessed"}"#)
            .unwrap_err(),
        vec![
            "fallback.envoys: must be a positive integer, got 0",
            "fallback.share: must be one of \"configured\", \"learned\", got string \"guessed\"",
        ]
    );
    // A fallback that would never be used is a mistake to report.
    assert_eq!(
        with_top(r#", "fallback": {"envoys": 3}"#).unwrap_err(),
        vec!["fallback: only with on_failure \"local\", not \"allow\""]
    );
    assert_eq!(
        with_top(
            r#", "on_failure": "local", "fallback": {"envoys": 3}, "local": {"enabled": false}"#
        )
        .unwrap_err(),
        vec!["on_failure: \"local\" needs local.enabled"]
    );
}

#[test]
fn a_group_named_other_cannot_be_told_from_the_sum() {
    let text = r#"{"domain": "d", "rate_limit_service": {"cluster": "rl"}, "metrics": {"groups": []},
        "limits": {"x-t": {"default": {"perhour": 1}, "other": {"perhour": 2, "header_value": ["b"]}}}}"#;
    assert_eq!(
        errs(text),
        vec!["metrics.groups: a group is named \"other\", the name under which metrics.groups sums the groups it does not list: rename that group"]
    );
}

#[test]
fn many_groups_with_series_of_their_own_warn() {
    let groups: Vec<String> = (0..=METRICS_GROUPS_WARN)
        .map(|i| format!(r#""g{i}": {{"perhour": 1, "header_value": ["t{i}"]}}"#))
        .collect();
    let config = |metrics: &str| {
        format!(
            r#"{{"domain": "d", "rate_limit_service": {{"cluster": "rl"}}{metrics},
                "limits": {{"x-t": {{"default": {{"perhour": 1}}, {}}}}}}}"#,
            groups.join(", ")
        )
    };
    let (_, warnings) = parse_plugin_config(config("").as_bytes()).unwrap();
    let shown: Vec<String> = warnings.iter().map(ToString::to_string).collect();
    assert_eq!(shown, vec![format!(
        "metrics: 102 groups have counters of their own ({SERIES_PER_GROUP} series each, {} in all, on every Envoy): list the groups to watch in metrics.groups; the others are then summed under group \"other\"",
        102 * SERIES_PER_GROUP
    )]);
    let bounded = config(r#", "metrics": {"groups": ["default", "g1"]}"#);
    let (c, warnings) = parse_plugin_config(bounded.as_bytes()).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(c.metrics.exported("g1") && !c.metrics.exported("g2"));
}

#[test]
fn sliding_and_calendar_limits_need_the_counter() {
    let limits = r#"{"x-t": {"default": {"permonth": 9, "window": "sliding"},
        "gold": {"header_value": ["g"], "perminute": 5, "routes": {"r": {"perweek": 2}}}}}"#;
    let envoy = format!(
        r#"{{"domain": "d", "limits": {limits}, "rate_limit_service": {{"cluster": "rl"}}}}"#
    );
    let cal = "needs rate_limit_service.service \"counter\" (--service counter): envoyproxy/ratelimit has no calendar weeks, months or years";
    assert_eq!(
        errs(&envoy),
        vec![
            format!("limits.x-t.default.permonth: {cal}"),
            "limits.x-t.default.window: sliding needs rate_limit_service.service \"counter\" (--service counter): envoyproxy/ratelimit has fixed windows only".into(),
            format!("limits.x-t.gold.routes.r.perweek: {cal}"),
        ]
    );
    let counter = format!(
        r#"{{"domain": "d", "limits": {limits}, "rate_limit_service": {{"cluster": "rl", "service": "counter"}}}}"#
    );
    let (c, _) = parse_plugin_config(counter.as_bytes()).unwrap();
    assert_eq!(c.service, Svc::Counter);
    let d = c.limits.default.as_ref().unwrap();
    assert_eq!(d.window, crate::model::Window::Sliding);
    assert_eq!(d.limits.get(crate::model::Unit::Month), Some(9));
    let bad = format!(
        r#"{{"domain": "d", "limits": {LIMITS}, "rate_limit_service": {{"cluster": "rl", "service": "redis"}}}}"#
    );
    assert_eq!(
        errs(&bad),
        vec!["rate_limit_service.service: must be \"envoy-ratelimit\" or \"counter\""]
    );
    let fixed = format!(
        r#"{{"domain": "d", "limits": {LIMITS}, "rate_limit_service": {{"cluster": "rl"}}}}"#
    );
    assert_eq!(
        parse_plugin_config(fixed.as_bytes()).unwrap().0.service,
        Svc::EnvoyRatelimit
    );
}

use crate::model::Service as Svc;

#[test]
fn a_window_is_fixed_or_sliding() {
    let text = r#"{"domain": "d", "limits": {"x-t": {"default": {"perhour": 1, "window": "rolling"}}}, "rate_limit_service": {"cluster": "rl", "service": "counter"}}"#;
    assert_eq!(
        errs(text),
        vec!["limits.x-t.default.window: must be \"fixed\" or \"sliding\", got string \"rolling\""]
    );
}

#[test]
fn lease_and_sync_are_refused_for_a_sliding_window_at_the_mode_that_applies() {
    let limits = r#"{"x-t": {"default": {"perminute": 600, "window": "sliding"},
        "gold": {"header_value": ["g"], "perminute": 600, "window": "sliding"},
        "silver": {"header_value": ["s"], "perminute": 600}}}"#;
    let config = |local: &str| {
        format!(
            r#"{{"domain": "d", "limits": {limits}, "local": {local}, "rate_limit_service": {{"cluster": "rl", "service": "counter"}}}}"#
        )
    };
    let why = "lease and sync count fixed windows locally: their bounds do not hold for a \"sliding\" group; count it in \"exact\" mode";
    assert_eq!(
        errs(&config(
            r#"{"mode": "lease", "groups": {"gold": {"mode": "sync"}, "silver": {"mode": "sync"}}}"#
        )),
        vec![
            format!("local.mode: {why}"),
            format!("local.groups.gold.mode: {why}"),
        ]
    );
    // Exact for the sliding groups, lease or sync for the fixed one: fine.
    let ok = config(
        r#"{"mode": "exact", "groups": {"gold": {"mode": "exact"}, "silver": {"mode": "sync"}}}"#,
    );
    assert_eq!(errs(&ok), Vec::<String>::new());
    let ok = config(
        r#"{"mode": "lease", "groups": {"default": {"mode": "exact"}, "gold": {"mode": "exact"}}}"#,
    );
    assert_eq!(errs(&ok), Vec::<String>::new());
    // The local layer off: every group is exact.
    assert_eq!(errs(&config(r#"{"enabled": false}"#)), Vec::<String>::new());
}

#[test]
fn a_group_of_more_units_than_the_filter_keeps_is_refused() {
    let text = r#"{"domain": "d", "rate_limit_service": {"cluster": "rl", "service": "counter"},
        "limits": {"x-t": {"default": {"persecond": 1, "perminute": 2, "perhour": 3, "perday": 4, "permonth": 5},
            "gold": {"header_value": ["g"], "perminute": 2, "perhour": 3, "perday": 4, "perweek": 5}}}}"#;
    assert_eq!(errs(text), Vec::<String>::new(), "five are kept");
    let text = r#"{"domain": "d", "rate_limit_service": {"cluster": "rl", "service": "counter"},
        "limits": {"x-t": {"default": {"persecond": 1, "perminute": 2, "per5minutes": 5, "perhour": 3, "perday": 4, "permonth": 5, "peryear": 6}}}}"#;
    assert_eq!(
        errs(text),
        vec!["limits.x-t.default: limits more than 6 windows: a group or route limits at most 6 (the windows the filter keeps per group)"]
    );
}

//! What happens to one tenant's requests: its group, its limits per unit,
//! the descriptors the filter sends, the service rule each one matches and
//! the Redis key it is counted under at a given moment. A pure function of
//! the limits and the time.
//!
//! The key is envoyproxy/ratelimit's (`src/limiter/cache_key.go`): the
//! service's CACHE_KEY_PREFIX (empty unless set), the domain, then `key_value_`
//! for every descriptor entry, then the window start, `now / unit * unit`.

use std::fmt::Write;

use crate::model::{descriptors, tenant_value, RequestDescriptors, TeamLimits, Unit};
use crate::plugin::{BatchConfig, LocalConfig, Mode, OnFailure, PluginConfig, Share, TenantSource};
use crate::window::civil_from_days;

/// The Redis key the service counts `entries` under at `now`.
pub fn redis_key(
    prefix: &str,
    domain: &str,
    entries: &[(&str, &str)],
    unit: Unit,
    now: u64,
) -> String {
    let mut key = format!("{prefix}{domain}_");
    for (k, v) in entries {
        key.push_str(k);
        key.push('_');
        key.push_str(v);
        key.push('_');
    }
    let _ = write!(key, "{}", window_start(unit, now));
    key
}

/// Windows align to the clock: the start of the one holding `now`.
pub fn window_start(unit: Unit, now: u64) -> u64 {
    now / unit.seconds() * unit.seconds()
}

/// `2026-12-01T12:00:12Z`.
pub fn utc(unix: u64) -> String {
    let days = unix / 86_400;
    let secs = unix % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// The group's mode and what it means, for `explain`.
fn mode_line(local: &LocalConfig, group: &crate::model::Group) -> String {
    let whence = if local.group(&group.name).and_then(|g| g.mode).is_some() {
        format!("local.groups.{}.mode", group.name)
    } else {
        "local.mode".to_string()
    };
    match local.mode_for(group) {
        Mode::Exact => format!("exact ({whence}): the service decides every request"),
        Mode::Lease => {
            let n = local.lease_max_batch_for(group);
            let s = if n == 1 { "" } else { "s" };
            format!(
                "lease ({whence}): batches of up to {n} token{s} reserved with one call, spent without calls \
                 (local.lease.max_batch, at most a twentieth of the group's smallest limit)"
            )
        }
        Mode::Sync => {
            let n = local.max_unsynced_for(group);
            format!(
                "sync ({whence}): admitted locally, hits pushed every {} ms, at most {n} unsynced per Envoy: \
                 overshoot at most 2 × (Envoys − 1) × {n} per window",
                local.sync_interval_ms
            )
        }
    }
}

/// How the tenant's calls to the service go, for `explain`.
fn calls_line(batch: &BatchConfig) -> String {
    if batch.enabled {
        let under_way = match batch.max_in_flight {
            1 => "a call is".to_string(),
            n => format!("{n} calls are"),
        };
        format!(
            "batched per worker (rate_limit_service.batch): while {under_way} under way, requests \
             queue and go together in the next one, at most {} descriptors per call",
            batch.max_descriptors
        )
    } else {
        "one request per call (rate_limit_service.batch false)".to_string()
    }
}

/// What a request of `group` gets when the service cannot decide, and
/// when the filter stops asking, for `explain`.
fn failure_lines(c: &PluginConfig) -> String {
    let policy = match c.on_failure {
        OnFailure::Allow => "allow: let through, unlimited (fail open)".to_string(),
        OnFailure::Deny => format!("deny: answered {} (status_on_error)", c.status_on_error),
        OnFailure::Local => {
            let learned = match c.fallback.share {
                Share::Configured => "",
                Share::Learned => ", or the share of this tenant's traffic it was seen to send (fallback.share \"learned\")",
            };
            format!(
                "local: each Envoy enforces 1/{} of each limit alone (fallback.envoys){learned}",
                c.fallback.envoys
            )
        }
    };
    let b = &c.breaker;
    let breaker = if b.enabled {
        format!(
            "after {} failed calls in a row, no calls: one probe every {} ms until the service answers",
            b.failures, b.probe_interval_ms
        )
    } else {
        format!(
            "off: every request calls, and waits up to {} ms",
            c.timeout_ms
        )
    };
    format!("failure: {policy}\nbreaker: {breaker}\n")
}

pub struct ExplainOptions<'a> {
    pub domain: &'a str,
    pub descriptor_key: &'a str,
    /// The service's CACHE_KEY_PREFIX.
    pub key_prefix: &'a str,
    /// The plugin configuration's global `shadow`.
    pub shadow: bool,
    /// The plugin configuration's `local`, when explaining one: shows the
    /// group's mode.
    pub local: Option<&'a LocalConfig>,
    /// The plugin configuration's `rate_limit_service.batch`, when
    /// explaining one: shows how its calls go.
    pub batch: Option<&'a BatchConfig>,
    /// The plugin configuration, when explaining one: shows what a
    /// request gets when the service cannot decide.
    pub plugin: Option<&'a PluginConfig>,
    /// The Envoy route (its name) to explain the tenant's limits on.
    pub route: Option<&'a str>,
    /// Where the filter reads the tenant (`tenant_source`).
    pub tenant_source: &'a TenantSource,
}

/// One descriptor's section: its limit, entries, rule, Redis key and window.
fn descriptor_section(
    out: &mut String,
    opts: &ExplainOptions<'_>,
    (unit, limit): (Unit, u32),
    entries: &[(&str, &str)],
    rule: &str,
    now: u64,
) {
    let start = window_start(unit, now);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{}: {limit} per {}",
        unit.json_key(),
        unit.service_unit()
    );
    let shown: Vec<String> = entries
        .iter()
        .map(|(k, v)| format!("({k:?}, {v:?})"))
        .collect();
    let _ = writeln!(out, "  descriptor: [{}]", shown.join(", "));
    let _ = writeln!(
        out,
        "  rule:       {}.generic_key_{}.{rule}",
        opts.domain,
        unit.descriptor_value()
    );
    let _ = writeln!(
        out,
        "  redis key:  {}",
        redis_key(opts.key_prefix, opts.domain, entries, unit, now)
    );
    let _ = writeln!(
        out,
        "  window:     {} to {} ({start} + {}s)",
        utc(start),
        utc(start + unit.seconds()),
        unit.seconds()
    );
}

/// Where the tenant comes from, as `explain` and `check` say it.
pub fn tenant_from(limits: &TeamLimits, source: &TenantSource) -> String {
    match source {
        TenantSource::Header => format!("header {}", limits.header),
        TenantSource::Property(path) => format!(
            "property {} (tenant_source; the {} header is not read)",
            TenantSource::dotted(path),
            limits.header
        ),
    }
}

/// The explanation, as the CLI prints it.
pub fn explain(limits: &TeamLimits, opts: &ExplainOptions<'_>, tenant: &str, now: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tenant:  {tenant:?} ({})",
        tenant_from(limits, opts.tenant_source)
    );
    // Envoy strips a header value's leading and trailing whitespace: such
    // a value never reaches the filter; the stripped one does.
    let stripped = tenant.trim_matches([' ', '\t']);
    if stripped != tenant && matches!(opts.tenant_source, TenantSource::Header) {
        let _ = writeln!(
            out,
            "note:    Envoy strips leading and trailing whitespace from header values, so the filter never sees {tenant:?}: a request sending it is counted as {stripped:?}, explained below"
        );
    }
    let tenant = if matches!(opts.tenant_source, TenantSource::Header) {
        stripped
    } else {
        tenant
    };
    let sent = tenant_value(tenant.as_bytes());
    if sent != tenant {
        let _ = writeln!(
            out,
            "sent as: {sent:?} (a '%' is written %25, so that no two tenant values share a counter)"
        );
    }
    let Some(group) = limits.group_for(tenant) else {
        let _ = writeln!(
            out,
            "group:   none: no named group lists it and there is no default group, so the filter sends no descriptor and it is not limited"
        );
        return out;
    };
    let listed = limits.groups.iter().any(|g| g.name == group.name);
    let why = if listed {
        "listed in its header_value"
    } else {
        "not listed in any named group"
    };
    let _ = writeln!(out, "group:   {} ({why})", group.name);
    let tenant = sent.as_ref();
    if opts.shadow || group.shadow {
        let whose = if group.shadow {
            "the group's \"shadow\": true"
        } else {
            "the plugin configuration's \"shadow\": true"
        };
        let _ = writeln!(
            out,
            "shadow:  yes ({whose}): a refusal is counted (shadow_refused) and the request let through"
        );
    }
    if let Some(local) = opts.local {
        let _ = writeln!(out, "mode:    {}", mode_line(local, group));
    }
    if let Some(batch) = opts.batch {
        let _ = writeln!(out, "calls:   {}", calls_line(batch));
    }
    if let Some(c) = opts.plugin {
        out.push_str(&failure_lines(c));
    }
    let _ = writeln!(out, "domain:  {}", opts.domain);
    let _ = writeln!(out, "at:      {now} = {}", utc(now));
    let tenant_rule = if listed {
        format!("{}_{tenant}", opts.descriptor_key)
    } else {
        opts.descriptor_key.to_string()
    };
    for (unit, entries) in descriptors(group, opts.descriptor_key, tenant) {
        let limit = group.limits.get(unit).unwrap_or_default();
        let rule_tail = if listed {
            tenant_rule.clone()
        } else {
            format!("{tenant_rule} (the default rule; the counter is still this tenant's own)")
        };
        descriptor_section(&mut out, opts, (unit, limit), &entries, &rule_tail, now);
        if let Some(c) = opts.plugin.filter(|c| c.on_failure == OnFailure::Local) {
            let _ = writeln!(
                out,
                "  fallback:   {} per {} on each Envoy while the service cannot decide",
                limit / c.fallback.envoys.max(1),
                unit.service_unit()
            );
        }
    }
    let route = opts.route.map(|name| (name, group.route(name.as_bytes())));
    match route {
        Some((name, Some(r))) => {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "on route {name:?}: also these, the tenant's own counters on the route (both must admit a request)"
            );
            let all = RequestDescriptors::new(group, Some(r), opts.descriptor_key, tenant);
            for &(unit, entries) in all.as_slice().iter().skip(group.limits.len()) {
                let limit = r.limits.get(unit).unwrap_or_default();
                let rule = format!("{tenant_rule}.route_{name}");
                descriptor_section(&mut out, opts, (unit, limit), entries.as_ref(), &rule, now);
            }
        }
        Some((name, None)) => {
            let _ = writeln!(out);
            let _ = write!(
                out,
                "on route {name:?}: {} sets no limits on it: only the limits above apply",
                group.name
            );
            let mut known: Vec<&str> = limits
                .groups
                .iter()
                .chain(limits.default.as_ref())
                .flat_map(|g| g.routes.iter().map(|r| r.name.as_str()))
                .collect();
            known.sort_unstable();
            known.dedup();
            let limited_by: Vec<&str> = limits
                .groups
                .iter()
                .chain(limits.default.as_ref())
                .filter(|g| g.route(name.as_bytes()).is_some())
                .map(|g| g.name.as_str())
                .collect();
            if !limited_by.is_empty() {
                let _ = write!(out, " ({} limits it)", limited_by.join(", "));
            } else if known.is_empty() {
                let _ = write!(out, "; the team file limits no route");
            } else {
                let names: Vec<String> = known.iter().map(|n| format!("{n:?}")).collect();
                let _ = write!(
                    out,
                    "; no group limits a route of that name: the team file's routes are {} (a route name must be Envoy's exactly)",
                    names.join(", ")
                );
            }
            let _ = writeln!(out);
        }
        None if !group.routes.is_empty() => {
            let names: Vec<String> = group
                .routes
                .iter()
                .map(|r| format!("{:?}", r.name))
                .collect();
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "routes:  {} has limits of its own on {} (see one with --route)",
                group.name,
                names.join(", ")
            );
        }
        None => {}
    }
    let unset: Vec<String> = limits
        .units_in_use()
        .into_iter()
        .filter(|u| group.limits.get(*u).is_none())
        .map(|u| u.json_key().into_owned())
        .collect();
    if !unset.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "not limited: {} ({} sets none; the filter sends no descriptor for it)",
            unset.join(", "),
            group.name
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::parse_team_limits;
    use serde_json::json;

    #[test]
    fn the_design_key_example() {
        // 10:00 to 10:59:59 UTC, 6 Dec 2022.
        let now = 1_670_320_800 + 1234;
        assert_eq!(utc(now), "2022-12-06T10:20:34Z");
        assert_eq!(
            redis_key(
                "",
                "internal-api",
                &[("generic_key", "per_hour"), ("tenant", "tenant-a")],
                Unit::Hour,
                now
            ),
            "internal-api_generic_key_per_hour_tenant_tenant-a_1670320800"
        );
        assert_eq!(
            redis_key(
                "p:",
                "d",
                &[("generic_key", "per_minute"), ("tenant", "t")],
                Unit::Minute,
                119
            ),
            "p:d_generic_key_per_minute_tenant_t_60"
        );
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(4_102_444_799), "2099-12-31T23:59:59Z");
        assert_eq!(utc(u64::MAX).len(), "584554051223-11-09T07:00:15Z".len());
    }

    fn seed() -> TeamLimits {
        let doc = json!({"x-tenant-id": {
            "default": {"persecond": 5, "perminute": 20, "perhour": 30},
            "group_1": {"persecond": 50, "perminute": 70, "perhour": 100, "perday": 1000,
                        "header_value": ["tenant-b", "tenant-c"]}}});
        parse_team_limits(&doc, "").unwrap().0
    }

    const OPTS: ExplainOptions<'static> = ExplainOptions {
        domain: "internal-api",
        descriptor_key: "tenant",
        key_prefix: "",
        shadow: false,
        local: None,
        batch: None,
        plugin: None,
        route: None,
        tenant_source: &TenantSource::Header,
    };

    #[test]
    fn the_tenant_source_and_the_value_sent_are_named() {
        let limits = seed();
        let a = explain(&limits, &OPTS, "tenant-a", 0);
        assert!(
            a.starts_with("tenant:  \"tenant-a\" (header x-tenant-id)\ngroup:"),
            "{a}"
        );
        let path = vec![
            "metadata".to_string(),
            "filter_metadata".into(),
            "jwt".into(),
            "tenant".into(),
        ];
        let source = TenantSource::Property(path);
        let opts = ExplainOptions {
            tenant_source: &source,
            ..OPTS
        };
        let a = explain(&limits, &opts, "50%off", 0);
        assert!(
            a.starts_with("tenant:  \"50%off\" (property metadata.filter_metadata.jwt.tenant (tenant_source; the x-tenant-id header is not read))\nsent as: \"50%25off\" (a '%' is written %25, so that no two tenant values share a counter)\ngroup:   default"),
            "{a}"
        );
        assert!(
            a.contains("redis key:  internal-api_generic_key_per_second_tenant_50%25off_0"),
            "{a}"
        );
    }

    #[test]
    fn a_shadowed_group_says_so() {
        let doc = json!({"x-t": {
            "default": {"perhour": 30},
            "gold": {"perhour": 100, "header_value": ["b"], "shadow": true}}});
        let limits = parse_team_limits(&doc, "").unwrap().0;
        let gold = explain(&limits, &OPTS, "b", 0);
        assert!(gold.contains("shadow:  yes (the group's \"shadow\": true): a refusal is counted (shadow_refused) and the request let through\n"), "{gold}");
        assert!(!explain(&limits, &OPTS, "a", 0).contains("shadow:"));
        let global = ExplainOptions {
            shadow: true,
            ..OPTS
        };
        assert!(explain(&limits, &global, "a", 0)
            .contains("shadow:  yes (the plugin configuration's \"shadow\": true)"));
    }

    #[test]
    fn the_mode_of_the_tenants_group_with_a_plugin_configuration() {
        let local = LocalConfig {
            mode: Mode::Lease,
            groups: vec![(
                "group_1".to_string(),
                crate::plugin::GroupLocal {
                    bucket: None,
                    mode: Some(Mode::Sync),
                },
            )],
            ..LocalConfig::default()
        };
        let opts = ExplainOptions {
            local: Some(&local),
            ..OPTS
        };
        let a = explain(&seed(), &opts, "tenant-a", 0);
        assert!(
            a.contains("\nmode:    lease (local.mode): batches of up to 1 token reserved with one call, spent without calls \
                       (local.lease.max_batch, at most a twentieth of the group's smallest limit)\n"),
            "{a}"
        );
        let c = explain(&seed(), &opts, "tenant-c", 0);
        assert!(
            c.contains("\nmode:    sync (local.groups.group_1.mode): admitted locally, hits pushed every 100 ms, at most 25 unsynced per Envoy: overshoot at most 2 × (Envoys − 1) × 25 per window\n"),
            "{c}"
        );
    }

    #[test]
    fn how_the_calls_go_with_a_plugin_configuration() {
        let on = BatchConfig::default();
        let opts = ExplainOptions {
            batch: Some(&on),
            ..OPTS
        };
        let a = explain(&seed(), &opts, "tenant-a", 0);
        assert!(
            a.contains("\ncalls:   batched per worker (rate_limit_service.batch): while a call is under way, requests queue and go together in the next one, at most 100 descriptors per call\n"),
            "{a}"
        );
        let three = BatchConfig {
            max_in_flight: 3,
            ..on
        };
        let opts3 = ExplainOptions {
            batch: Some(&three),
            ..OPTS
        };
        let a3 = explain(&seed(), &opts3, "tenant-a", 0);
        assert!(
            a3.contains("while 3 calls are under way, requests queue"),
            "{a3}"
        );
        let off = BatchConfig {
            enabled: false,
            ..on
        };
        let opts = ExplainOptions {
            batch: Some(&off),
            ..OPTS
        };
        let a = explain(&seed(), &opts, "tenant-a", 0);
        assert!(
            a.contains("\ncalls:   one request per call (rate_limit_service.batch false)\n"),
            "{a}"
        );
        assert!(!explain(&seed(), &OPTS, "tenant-a", 0).contains("calls:"));
    }

    #[test]
    fn what_a_request_gets_when_the_service_cannot_decide() {
        let text = |extra: &str| {
            let t = format!(
                r#"{{"domain": "d", "rate_limit_service": {{"cluster": "c"}}, "limits": {{"x-t": {{"default": {{"perminute": 20}}}}}}{extra}}}"#
            );
            let c = crate::parse_plugin_config(t.as_bytes()).unwrap().0;
            let opts = ExplainOptions {
                plugin: Some(&c),
                ..OPTS
            };
            explain(&c.limits, &opts, "a", 0)
        };
        let allow = text("");
        assert!(allow.contains("\nfailure: allow: let through, unlimited (fail open)\nbreaker: after 5 failed calls in a row, no calls: one probe every 1000 ms until the service answers\n"), "{allow}");
        assert!(!allow.contains("fallback:"), "{allow}");
        let deny = text(
            r#", "failure_mode_deny": true, "status_on_error": 503, "breaker": {"enabled": false}"#,
        );
        assert!(deny.contains("\nfailure: deny: answered 503 (status_on_error)\nbreaker: off: every request calls, and waits up to 20 ms\n"), "{deny}");
        let local =
            text(r#", "on_failure": "local", "fallback": {"envoys": 3, "share": "learned"}"#);
        assert!(local.contains("\nfailure: local: each Envoy enforces 1/3 of each limit alone (fallback.envoys), or the share of this tenant's traffic it was seen to send (fallback.share \"learned\")\n"), "{local}");
        assert!(
            local.contains(
                "\n  fallback:   6 per minute on each Envoy while the service cannot decide\n"
            ),
            "{local}"
        );
    }

    #[test]
    fn a_default_tenant() {
        let text = explain(&seed(), &OPTS, "tenant-a", 1_670_320_834);
        assert_eq!(
            text,
            r#"tenant:  "tenant-a" (header x-tenant-id)
group:   default (not listed in any named group)
domain:  internal-api
at:      1670320834 = 2022-12-06T10:00:34Z

persecond: 5 per second
  descriptor: [("generic_key", "per_second"), ("tenant", "tenant-a")]
  rule:       internal-api.generic_key_per_second.tenant (the default rule; the counter is still this tenant's own)
  redis key:  internal-api_generic_key_per_second_tenant_tenant-a_1670320834
  window:     2022-12-06T10:00:34Z to 2022-12-06T10:00:35Z (1670320834 + 1s)

perminute: 20 per minute
  descriptor: [("generic_key", "per_minute"), ("tenant", "tenant-a")]
  rule:       internal-api.generic_key_per_minute.tenant (the default rule; the counter is still this tenant's own)
  redis key:  internal-api_generic_key_per_minute_tenant_tenant-a_1670320800
  window:     2022-12-06T10:00:00Z to 2022-12-06T10:01:00Z (1670320800 + 60s)

perhour: 30 per hour
  descriptor: [("generic_key", "per_hour"), ("tenant", "tenant-a")]
  rule:       internal-api.generic_key_per_hour.tenant (the default rule; the counter is still this tenant's own)
  redis key:  internal-api_generic_key_per_hour_tenant_tenant-a_1670320800
  window:     2022-12-06T10:00:00Z to 2022-12-06T11:00:00Z (1670320800 + 3600s)

not limited: perday (default sets none; the filter sends no descriptor for it)
"#
        );
    }

    #[test]
    fn a_listed_tenant_and_an_unlimited_one() {
        let text = explain(&seed(), &OPTS, "tenant-c", 1_670_371_199);
        assert!(
            text.contains("group:   group_1 (listed in its header_value)\n"),
            "{text}"
        );
        assert!(
            text.contains("  rule:       internal-api.generic_key_per_day.tenant_tenant-c\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "  redis key:  internal-api_generic_key_per_day_tenant_tenant-c_1670284800\n"
            ),
            "{text}"
        );
        assert!(!text.contains("not limited"), "{text}");

        let doc = json!({"x-t": {"gold": {"perhour": 1, "header_value": ["a"]}}});
        let l = parse_team_limits(&doc, "").unwrap().0;
        assert_eq!(
            explain(&l, &OPTS, "b", 0),
            "tenant:  \"b\" (header x-t)\ngroup:   none: no named group lists it and there is no default group, so the filter sends no descriptor and it is not limited\n"
        );
    }

    #[test]
    fn a_tenants_limits_on_a_route() {
        let doc = json!({"x-tenant-id": {
            "default": {"perminute": 600, "routes": {"reports": {"perminute": 5}}},
            "gold": {"perminute": 6000, "header_value": ["acme"],
                     "routes": {"reports": {"perminute": 50}}}}});
        let limits = parse_team_limits(&doc, "").unwrap().0;
        let on = |tenant, route| {
            let opts = ExplainOptions {
                route,
                domain: "api",
                ..OPTS
            };
            explain(&limits, &opts, tenant, 1_670_320_834)
        };
        let text = on("acme", Some("reports"));
        assert!(
            text.ends_with(
                r#"
perminute: 6000 per minute
  descriptor: [("generic_key", "per_minute"), ("tenant", "acme")]
  rule:       api.generic_key_per_minute.tenant_acme
  redis key:  api_generic_key_per_minute_tenant_acme_1670320800
  window:     2022-12-06T10:00:00Z to 2022-12-06T10:01:00Z (1670320800 + 60s)

on route "reports": also these, the tenant's own counters on the route (both must admit a request)

perminute: 50 per minute
  descriptor: [("generic_key", "per_minute"), ("tenant", "acme"), ("route", "reports")]
  rule:       api.generic_key_per_minute.tenant_acme.route_reports
  redis key:  api_generic_key_per_minute_tenant_acme_route_reports_1670320800
  window:     2022-12-06T10:00:00Z to 2022-12-06T10:01:00Z (1670320800 + 60s)
"#
            ),
            "{text}"
        );
        let text = on("b", Some("reports"));
        assert!(
            text.contains("  rule:       api.generic_key_per_minute.tenant.route_reports\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "  redis key:  api_generic_key_per_minute_tenant_b_route_reports_1670320800\n"
            ),
            "{text}"
        );
        assert!(on("b", Some("search")).ends_with(
            "\non route \"search\": default sets no limits on it: only the limits above apply; no group limits a route of that name: the team file's routes are \"reports\" (a route name must be Envoy's exactly)\n"
        ));
        assert!(on("b", None).ends_with(
            "\nroutes:  default has limits of its own on \"reports\" (see one with --route)\n"
        ));
    }
}

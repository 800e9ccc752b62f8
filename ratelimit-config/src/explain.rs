//! What happens to one tenant's requests: its group, its limits per unit,
//! the descriptors the filter sends, the rule each one matches and the
//! Redis key it is counted under at a given moment, for the service that
//! counts (envoyproxy/ratelimit or ratelimit-counter). A pure function of
//! the limits and the time.
//!
//! envoyproxy/ratelimit's key (`src/limiter/cache_key.go`): the service's
//! CACHE_KEY_PREFIX (empty unless set), the domain, then `key_value_` for
//! every descriptor entry, then the window start, `now / unit * unit`.
//!
//! ratelimit-counter's key ([`counter_keys::key`], the counter's own): `trl:{<domain length>:<domain>:<tenant>}:per_<unit>:<window
//! start ms>[:r:<route>]`, its windows from [`crate::window`] (calendar
//! weeks, months and years; a sliding window's previous window too).

use std::fmt::Write;

use crate::counter_keys;
use crate::model::{
    descriptors, tenant_value, Group, RequestDescriptors, Service, TeamLimits, Unit, Window,
};
use crate::plugin::{BatchConfig, LocalConfig, Mode, OnFailure, PluginConfig, Share, TenantSource};
use crate::window::{civil_from_days, previous_window, sliding_weight_ppm, window_at};

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

/// Whether the counter counts `unit` of `group` as a sliding window (as
/// `counter/src/decide.rs` decides it; the counter's tests check that the
/// two agree).
pub fn counter_sliding(group: &Group, unit: Unit) -> bool {
    group.slides(unit)
}

/// Where ratelimit-counter counts one descriptor at `now_ms`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterWindow {
    /// The current window's counter.
    pub key: String,
    /// A sliding window's: the previous window's counter, which the
    /// estimate reads too.
    pub prev_key: Option<String>,
    pub sliding: bool,
    /// The current window, `[start, end)` in Unix ms.
    pub window: (u64, u64),
    /// The previous window, for a sliding one.
    pub previous: Option<(u64, u64)>,
}

/// Where ratelimit-counter counts the descriptor of `unit` that a tenant
/// of `group` sends (`tenant` as sent), on `route` if given, at `now_ms`.
pub fn counter_window(
    domain: &str,
    tenant: &str,
    group: &Group,
    unit: Unit,
    route: Option<&str>,
    now_ms: u64,
) -> CounterWindow {
    let tag = counter_keys::tag(domain, tenant);
    let window = window_at(unit, now_ms);
    let sliding = counter_sliding(group, unit);
    let previous = sliding.then(|| previous_window(unit, now_ms));
    CounterWindow {
        key: counter_keys::key(&tag, unit, window.0, route),
        prev_key: previous.map(|p| counter_keys::key(&tag, unit, p.0, route)),
        sliding,
        window,
        previous,
    }
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
/// when the filter stops asking, for `explain`. With the counter as the
/// service, the local fallback's `N` is the fleet's size it answers.
fn failure_lines(c: &PluginConfig, service: Service) -> String {
    let policy = match c.on_failure {
        OnFailure::Allow => "allow: let through, unlimited (fail open)".to_string(),
        OnFailure::Deny => format!("deny: answered {} (status_on_error)", c.status_on_error),
        OnFailure::Local => {
            let learned = match c.fallback.share {
                Share::Configured => "",
                Share::Learned => ", or the share of this tenant's traffic it was seen to send (fallback.share \"learned\")",
            };
            match service {
                Service::Counter => format!(
                    "local: each Envoy enforces 1/N of each limit alone, N the fleet's size the \
                     counter answers (the Envoys that called it for the domain within its \
                     --fleet-interval-ms), {} until one is heard (fallback.envoys){learned}",
                    c.fallback.envoys
                ),
                Service::EnvoyRatelimit => format!(
                    "local: each Envoy enforces 1/{} of each limit alone (fallback.envoys){learned}",
                    c.fallback.envoys
                ),
            }
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
    /// The service that counts: its rules and keys are the ones shown.
    pub service: Service,
    /// Where `service` was read (`--service`, the plugin configuration),
    /// as the `service:` line says it.
    pub service_from: &'a str,
}

/// A moment in Unix ms, as [`utc`] writes seconds (with `.mmm` when not
/// a whole second).
fn utc_ms(ms: u64) -> String {
    let text = utc(ms / 1_000);
    match ms % 1_000 {
        0 => text,
        frac => format!("{}.{frac:03}Z", text.trim_end_matches('Z')),
    }
}

/// Which tenant a section counts, and where.
struct Counted<'a> {
    group: &'a Group,
    /// The tenant value as the filter sends it.
    tenant: &'a str,
    /// The route, for a route's section.
    route: Option<&'a str>,
}

/// One descriptor's section: its limit, entries, rule, Redis key and window.
fn descriptor_section(
    out: &mut String,
    opts: &ExplainOptions<'_>,
    (unit, limit): (Unit, u32),
    entries: &[(&str, &str)],
    (rule, counted): (&str, &Counted<'_>),
    now: u64,
) {
    if opts.service == Service::Counter {
        return counter_section(out, opts, (unit, limit), entries, counted, now);
    }
    let start = window_start(unit, now);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{}: {limit} per {}",
        unit.json_key(),
        unit.service_unit()
    );
    // Only the counter counts these (a plugin configuration for the
    // counter, explained with --service envoy-ratelimit).
    if unit.is_calendar() || counted.group.window == Window::Sliding {
        let _ = writeln!(
            out,
            "  note:       envoyproxy/ratelimit counts no {}: only the counter does (--service counter)",
            if unit.is_calendar() {
                "calendar week, month or year"
            } else {
                "sliding window"
            }
        );
    }
    let _ = writeln!(out, "  descriptor: [{}]", shown_entries(entries));
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

fn shown_entries(entries: &[(&str, &str)]) -> String {
    let shown: Vec<String> = entries
        .iter()
        .map(|(k, v)| format!("({k:?}, {v:?})"))
        .collect();
    shown.join(", ")
}

/// A window's length in words: `60s`, `1 day` for whole days.
fn length(ms: u64) -> String {
    let secs = ms / 1_000;
    match secs {
        s if s >= 86_400 && s % 86_400 == 0 => {
            let d = s / 86_400;
            format!("{d} day{}", if d == 1 { "" } else { "s" })
        }
        s => format!("{s}s"),
    }
}

/// One descriptor's section as ratelimit-counter counts it: the group it
/// resolves to, its keys and its window (fixed, calendar or sliding).
fn counter_section(
    out: &mut String,
    opts: &ExplainOptions<'_>,
    (unit, limit): (Unit, u32),
    entries: &[(&str, &str)],
    counted: &Counted<'_>,
    now: u64,
) {
    let now_ms = now.saturating_mul(1_000);
    let w = counter_window(
        opts.domain,
        counted.tenant,
        counted.group,
        unit,
        counted.route,
        now_ms,
    );
    let (start, end) = w.window;
    let kind = match (w.sliding, unit.is_calendar()) {
        (true, true) => format!(", sliding over calendar {}s", unit.service_unit()),
        (true, false) => ", sliding".to_string(),
        (false, true) => format!(" (calendar {}, UTC)", unit.service_unit()),
        (false, false) => String::new(),
    };
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{}: {limit} per {}{kind}",
        unit.json_key(),
        unit.service_unit()
    );
    let _ = writeln!(out, "  descriptor: [{}]", shown_entries(entries));
    let name = match counted.route {
        Some(r) => format!("{}/{r}", counted.group.name),
        None => counted.group.name.clone(),
    };
    let _ = writeln!(
        out,
        "  rule:       {name} (the counter reads the team file: the group{}, no service YAML)",
        if counted.route.is_some() {
            " and its route"
        } else {
            ""
        }
    );
    let _ = writeln!(out, "  redis key:  {}", w.key);
    let bounds = format!("{} to {}", utc_ms(start), utc_ms(end));
    let how = if unit.is_calendar() {
        let turns = match unit {
            Unit::Week => "a week starts on Monday 00:00",
            Unit::Year => "a year starts on 1 January",
            _ => "a month starts on the 1st",
        };
        format!("the calendar's, UTC: {turns}")
    } else {
        let len = end.saturating_sub(start);
        format!(
            "{} long, from a multiple of it since the Unix epoch",
            length(len)
        )
    };
    if let (Some(prev_key), Some((prev_start, prev_end))) = (&w.prev_key, w.previous) {
        let _ = writeln!(out, "  previous:   {prev_key}");
        let _ = writeln!(out, "  window:     {bounds} ({how})");
        let weight = sliding_weight_ppm(start, end, now_ms);
        let _ = writeln!(
            out,
            "  sliding:    estimate = this window's count + the previous window's ({} to {}) × {}.{}% \
             (the part of this window still ahead), rounded up; a request is admitted while the estimate \
             plus its hits is at most {limit}",
            utc_ms(prev_start),
            utc_ms(prev_end),
            weight / 10_000,
            weight % 10_000 / 1_000,
        );
    } else {
        let _ = writeln!(out, "  window:     {bounds} ({how})");
    }
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
        out.push_str(&failure_lines(c, opts.service));
    }
    if opts.service == Service::Counter {
        let _ = writeln!(
            out,
            "service: counter ({}): ratelimit-counter's rules and keys",
            opts.service_from
        );
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
        let counted = Counted {
            group,
            tenant,
            route: None,
        };
        descriptor_section(
            &mut out,
            opts,
            (unit, limit),
            &entries,
            (&rule_tail, &counted),
            now,
        );
        if let Some(c) = opts.plugin.filter(|c| c.on_failure == OnFailure::Local) {
            let _ = writeln!(
                out,
                "  fallback:   {} per {} on each Envoy while the service cannot decide{}",
                limit / c.fallback.envoys.max(1),
                unit.service_unit(),
                match opts.service {
                    Service::Counter => " (until the fleet's size is heard; then the limit / N)",
                    Service::EnvoyRatelimit => "",
                }
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
                let counted = Counted {
                    group,
                    tenant,
                    route: Some(r.name.as_str()),
                };
                descriptor_section(
                    &mut out,
                    opts,
                    (unit, limit),
                    entries.as_ref(),
                    (&rule, &counted),
                    now,
                );
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
        service: Service::EnvoyRatelimit,
        service_from: "the default",
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
    fn with_the_counter_the_fallback_share_follows_the_fleet() {
        let t = r#"{"domain": "d", "rate_limit_service": {"cluster": "c"}, "limits": {"x-t": {"default": {"perminute": 20}}}, "on_failure": "local", "fallback": {"envoys": 3}}"#;
        let c = crate::parse_plugin_config(t.as_bytes()).unwrap().0;
        let opts = ExplainOptions {
            plugin: Some(&c),
            service: Service::Counter,
            ..OPTS
        };
        let local = explain(&c.limits, &opts, "a", 0);
        assert!(local.contains("\nfailure: local: each Envoy enforces 1/N of each limit alone, N the fleet's size the counter answers (the Envoys that called it for the domain within its --fleet-interval-ms), 3 until one is heard (fallback.envoys)\n"), "{local}");
        assert!(
            local.contains(
                "\n  fallback:   6 per minute on each Envoy while the service cannot decide (until the fleet's size is heard; then the limit / N)\n"
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

    const COUNTER: ExplainOptions<'static> = ExplainOptions {
        service: Service::Counter,
        service_from: "--service",
        ..OPTS
    };

    fn counter_limits() -> TeamLimits {
        let doc = json!({"x-tenant-id": {
            "default": {"persecond": 2, "perminute": 10, "window": "sliding",
                        "routes": {"reports": {"perminute": 5}}},
            "gold": {"perhour": 100, "perweek": 500, "permonth": 1000, "peryear": 9000,
                     "header_value": ["acme", "50%off"]}}});
        crate::validate::parse_team_limits_for(&doc, "", Service::Counter)
            .unwrap()
            .0
    }

    #[test]
    fn the_counters_keys_are_spelled_as_the_counter_spells_them() {
        assert_eq!(
            counter_keys::tag("internal-api", "tenant-a"),
            "{12:internal-api:tenant-a}"
        );
        // A '}' would end the hash tag; a '%' is escaped so that no two
        // tenants share a key.
        assert_eq!(counter_keys::tag("d}", "a}%b"), "{2:d%7D:a%7D%25b}");
        assert_eq!(
            counter_keys::key("{1:d:t}", Unit::Minute, 120_000, None),
            "trl:{1:d:t}:per_minute:120000"
        );
        assert_eq!(
            counter_keys::key("{1:d:t}", Unit::Month, 0, Some("reports")),
            "trl:{1:d:t}:per_month:0:r:reports"
        );
    }

    #[test]
    fn the_counters_month_ends_on_the_first_of_the_next() {
        // 2026-12-05T11:30:12Z.
        let at = 1_796_470_212;
        let text = explain(&counter_limits(), &COUNTER, "acme", at);
        assert!(
            text.contains("\nservice: counter (--service): ratelimit-counter's rules and keys\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "\npermonth: 1000 per month (calendar month, UTC)\n\
                 \x20 descriptor: [(\"generic_key\", \"per_month\"), (\"tenant\", \"acme\")]\n\
                 \x20 rule:       gold (the counter reads the team file: the group, no service YAML)\n\
                 \x20 redis key:  trl:{12:internal-api:acme}:per_month:1796083200000\n\
                 \x20 window:     2026-12-01T00:00:00Z to 2027-01-01T00:00:00Z (the calendar's, UTC: a month starts on the 1st)\n"
            ),
            "{text}"
        );
        assert_eq!(utc(1_796_083_200), "2026-12-01T00:00:00Z");
        assert!(
            text.contains("  window:     2026-11-30T00:00:00Z to 2026-12-07T00:00:00Z (the calendar's, UTC: a week starts on Monday 00:00)\n"),
            "{text}"
        );
        assert!(
            text.contains("  window:     2026-01-01T00:00:00Z to 2027-01-01T00:00:00Z (the calendar's, UTC: a year starts on 1 January)\n"),
            "{text}"
        );
        assert!(
            text.contains("  window:     2026-12-05T11:00:00Z to 2026-12-05T12:00:00Z (3600s long, from a multiple of it since the Unix epoch)\n"),
            "{text}"
        );
        assert!(!text.contains("sliding"), "{text}");
        assert!(!text.contains("generic_key_per"), "{text}");
        // February of a leap year: 29 days, to 1 March.
        let feb = explain(&counter_limits(), &COUNTER, "acme", 1_835_395_200);
        assert!(
            feb.contains("  window:     2028-02-01T00:00:00Z to 2028-03-01T00:00:00Z"),
            "{feb}"
        );
    }

    #[test]
    fn a_sliding_window_is_named_with_its_previous_windows_key() {
        // 12 s into the minute: 48/60 of the previous minute still counts.
        let at = 1_796_470_212;
        let opts = ExplainOptions {
            route: Some("reports"),
            ..COUNTER
        };
        let text = explain(&counter_limits(), &opts, "tenant-a", at);
        assert!(
            text.contains(
                "\nperminute: 10 per minute, sliding\n\
                 \x20 descriptor: [(\"generic_key\", \"per_minute\"), (\"tenant\", \"tenant-a\")]\n\
                 \x20 rule:       default (the counter reads the team file: the group, no service YAML)\n\
                 \x20 redis key:  trl:{12:internal-api:tenant-a}:per_minute:1796470200000\n\
                 \x20 previous:   trl:{12:internal-api:tenant-a}:per_minute:1796470140000\n\
                 \x20 window:     2026-12-05T11:30:00Z to 2026-12-05T11:31:00Z (60s long, from a multiple of it since the Unix epoch)\n\
                 \x20 sliding:    estimate = this window's count + the previous window's (2026-12-05T11:29:00Z to 2026-12-05T11:30:00Z) × 80.0% \
                 (the part of this window still ahead), rounded up; a request is admitted while the estimate plus its hits is at most 10\n"
            ),
            "{text}"
        );
        // The route's counter: the same tag, the route after the window.
        assert!(
            text.contains(
                "  rule:       default/reports (the counter reads the team file: the group and its route, no service YAML)\n\
                 \x20 redis key:  trl:{12:internal-api:tenant-a}:per_minute:1796470200000:r:reports\n\
                 \x20 previous:   trl:{12:internal-api:tenant-a}:per_minute:1796470140000:r:reports\n"
            ),
            "{text}"
        );
        assert!(!text.contains("internal-api_generic_key"), "{text}");
    }

    #[test]
    fn the_counter_counts_the_value_the_filter_sends() {
        let text = explain(&counter_limits(), &COUNTER, "50%off", 1_796_470_212);
        assert!(text.contains("sent as: \"50%25off\""), "{text}");
        // The filter sends 50%25off; the counter's tag escapes its '%' again.
        assert!(
            text.contains(
                "  redis key:  trl:{12:internal-api:50%2525off}:per_hour:1796468400000\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn counter_windows_follow_the_window_functions() {
        let limits = counter_limits();
        let gold = limits.group_for("acme").unwrap();
        let default = limits.group_for("b").unwrap();
        for now_ms in [0, 1_796_470_212_345, 1_835_395_199_999] {
            for unit in Unit::ALL {
                let w = counter_window("d", "t", gold, unit, None, now_ms);
                assert_eq!(w.window, window_at(unit, now_ms));
                assert!(!w.sliding && w.prev_key.is_none() && w.previous.is_none());
                let s = counter_window("d", "t", default, unit, Some("r"), now_ms);
                // A sliding group's weeks, months and years stay calendar.
                if unit.is_calendar() {
                    assert!(!s.sliding && s.prev_key.is_none(), "{unit:?}");
                    assert_eq!(s.window, window_at(unit, now_ms));
                    continue;
                }
                assert!(s.sliding);
                let prev = previous_window(unit, now_ms);
                assert_eq!(s.previous, Some(prev));
                assert_eq!(
                    s.prev_key.as_deref(),
                    Some(counter_keys::key("{1:d:t}", unit, prev.0, Some("r")).as_str())
                );
            }
        }
    }

    #[test]
    fn envoy_ratelimit_says_it_counts_no_calendar_or_sliding_window() {
        let text = explain(&counter_limits(), &OPTS, "acme", 0);
        assert!(
            text.contains("\npermonth: 1000 per month\n  note:       envoyproxy/ratelimit counts no calendar week, month or year: only the counter does (--service counter)\n"),
            "{text}"
        );
        let text = explain(&counter_limits(), &OPTS, "b", 0);
        assert!(
            text.contains("  note:       envoyproxy/ratelimit counts no sliding window: only the counter does (--service counter)\n"),
            "{text}"
        );
        assert!(!explain(&seed(), &OPTS, "b", 0).contains("note:"));
    }

    #[test]
    fn moments_in_ms() {
        assert_eq!(utc_ms(1_000), "1970-01-01T00:00:01Z");
        assert_eq!(utc_ms(1_005), "1970-01-01T00:00:01.005Z");
        assert_eq!(length(60_000), "60s");
        assert_eq!(length(86_400_000), "1 day");
        assert_eq!(length(3 * 86_400_000), "3 days");
    }
}

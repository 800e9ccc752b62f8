"""Per-group counters on Envoy's /stats/prometheus (issue 11 items 2 and 3),
parsed with the real Prometheus text parser (PyPI prometheus-client).

With the project's bootstrap (envoy/envoy.yaml.tmpl `stats_config.stats_tags`)
every group counter is one metric with the group as a label, and the refusals
also carry their source: one query sums them or splits them. The number of
series depends on the groups, never on the tenants.
"""

from __future__ import annotations

from collections import Counter

import harness
from harness import ensure_window_room, run_sequential, tally, unique

DAY_ROOM_S = 120
GROUP_METRICS = {
    "tenant_ratelimit_group_admitted": {"group"},
    "tenant_ratelimit_group_refused": {"group", "source"},
    "tenant_ratelimit_group_shadow_refused": {"group", "source"},
    "tenant_ratelimit_group_near_limit": {"group"},
    "tenant_ratelimit_group_failed_open": {"group"},
    "tenant_ratelimit_group_no_rule": {"group"},
    "tenant_ratelimit_group_fallback_admitted": {"group"},
}
SOURCES = ("service", "cache", "bucket", "sync", "fallback")
# Every per-group counter (filter/src/counters.rs GroupCounter): the seven
# families above (refused and shadow_refused by 5 sources: 15 series), the
# 12 of lease and sync mode, and the 3 of response costs.
PER_GROUP = 30


def scrape(envoy: harness.Envoy) -> dict[tuple[str, tuple], float]:
    """{(metric name, sorted label pairs): value} of the filter's counters,
    keyed by the family's name, the one Envoy writes (harness.prometheus_series)."""
    return envoy.prometheus("tenant_ratelimit_", types=("counter",))


def value(samples, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_the_scrape_shows_each_groups_counters_with_group_and_source_labels(stack):
    gold, bronze = unique("tenant-gold"), unique("tenant-bronze")
    limits = {"x-tenant-id": {
        "default": {"perday": 10},
        "gold": {"perday": 100, "header_value": [gold]},
        "bronze": {"perday": 2, "header_value": [bronze], "shadow": True},
    }}
    fleet = stack.fleet(limits, envoys=1, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    envoy = fleet.envoys[0]
    ensure_window_room(86400, DAY_ROOM_S)

    a = unique("tenant-a")
    assert tally(run_sequential(fleet.urls, 15, tenant=a)) == Counter({200: 10, 429: 5})
    assert tally(run_sequential(fleet.urls, 5, tenant=gold)) == Counter({200: 5})
    assert tally(run_sequential(fleet.urls, 4, tenant=bronze)) == Counter({200: 4})
    # Twenty more default tenants, one request each: more tenants, no more series.
    for i in range(20):
        assert run_sequential(fleet.urls, 1, tenant=unique(f"tenant-{i}"))[0].status == 200

    m = scrape(envoy)
    # default: 30 admitted; tenant a's 5 refusals: the service once, then
    # the over-limit cache. Near the limit (0.8 of 10): a's 8th, 9th, 10th.
    assert value(m, "tenant_ratelimit_group_admitted", group="default") == 30
    assert value(m, "tenant_ratelimit_group_refused", group="default", source="service") == 1
    assert value(m, "tenant_ratelimit_group_refused", group="default", source="cache") == 4
    assert value(m, "tenant_ratelimit_group_near_limit", group="default") == 3
    # gold: 5 of 100, nowhere near.
    assert value(m, "tenant_ratelimit_group_admitted", group="gold") == 5
    assert value(m, "tenant_ratelimit_group_near_limit", group="gold") == 0
    # bronze (shadow): 2 admitted (the second used 2 of 2: near), 2 let
    # through and counted.
    assert value(m, "tenant_ratelimit_group_admitted", group="bronze") == 2
    assert value(m, "tenant_ratelimit_group_near_limit", group="bronze") == 1
    assert value(m, "tenant_ratelimit_group_shadow_refused", group="bronze", source="service") == 1
    assert value(m, "tenant_ratelimit_group_shadow_refused", group="bronze", source="cache") == 1
    for group in ("default", "gold", "bronze"):
        assert value(m, "tenant_ratelimit_group_failed_open", group=group) == 0
    # Summed over the source label, as a query would.
    refused = sum(v for (name, labels), v in m.items()
                  if name == "tenant_ratelimit_group_refused" and ("group", "default") in labels)
    assert refused == 5

    # Exactly these series: 3 groups x (admitted, near_limit, failed_open,
    # no_rule, fallback_admitted, and refused and shadow_refused by 5
    # sources), whatever the tenants.
    group_series = [(n, dict(l)) for (n, l) in m if n in GROUP_METRICS]
    assert len(group_series) == 3 * 15, group_series
    every = [(n, dict(l)) for (n, l) in m if n.startswith("tenant_ratelimit_group_")]
    assert len(every) == 3 * PER_GROUP, sorted(n for n, _ in every)
    assert all(set(l) <= {"group", "source"} for _, l in every), every
    for name, labels in group_series:
        assert set(labels) == GROUP_METRICS[name], (name, labels)
        assert labels["group"] in ("default", "gold", "bronze")
        assert labels.get("source", "service") in SOURCES
    # The global counters are there too, without labels.
    assert value(m, "tenant_ratelimit_allowed") == 37
    assert value(m, "tenant_ratelimit_over_limit") == 1
    assert value(m, "tenant_ratelimit_cached_over_limit") == 4


def test_metrics_groups_bounds_the_series(stack):
    """metrics.groups: the groups listed have series of their own, every
    other group's requests are summed under group "other"."""
    gold, silver = unique("tenant-gold"), unique("tenant-silver")
    limits = {"x-tenant-id": {
        "default": {"perday": 10},
        "gold": {"perday": 100, "header_value": [gold]},
        "silver": {"perday": 100, "header_value": [silver]},
    }}
    fleet = stack.fleet(limits, envoys=1, timeout_ms=harness.COUNTING_TIMEOUT_MS,
                        metrics={"groups": ["gold"]})
    ensure_window_room(86400, DAY_ROOM_S)
    assert tally(run_sequential(fleet.urls, 3, tenant=gold)) == Counter({200: 3})
    assert tally(run_sequential(fleet.urls, 2, tenant=silver)) == Counter({200: 2})
    assert tally(run_sequential(fleet.urls, 4, tenant=unique("tenant-d"))) == Counter({200: 4})
    m = scrape(fleet.envoys[0])
    groups = {dict(l)["group"] for (n, l) in m if n.startswith("tenant_ratelimit_group_")}
    assert groups == {"gold", "other"}, groups
    assert value(m, "tenant_ratelimit_group_admitted", group="gold") == 3
    assert value(m, "tenant_ratelimit_group_admitted", group="other") == 6
    every = [n for (n, _) in m if n.startswith("tenant_ratelimit_group_")]
    assert len(every) == 2 * PER_GROUP


def test_a_descriptor_the_service_has_no_rule_for_is_counted_and_logged(stack):
    """The filter's domain is not the service's: the service answers OK to
    every call, nothing is limited, and the filter says so: no_rule per
    group, and a warning naming the domain and the descriptor."""
    gen = stack.generate({"x-tenant-id": {"default": {"perhour": 3}}})
    rls = stack.ratelimit(stack.redis(), gen)
    cfg = gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS,
                            domain="not-the-services-domain")
    envoy = stack.envoy(cfg, rls, stack.upstream())
    tenant = unique("tenant")
    assert tally(run_sequential([envoy.url], 6, tenant=tenant)) == Counter({200: 6})
    m = scrape(envoy)
    assert value(m, "tenant_ratelimit_group_no_rule", group="default") == 6
    assert value(m, "tenant_ratelimit_group_admitted", group="default") == 6
    log = envoy.process.log_text()
    warnings = [line for line in log.splitlines() if "has no rule for domain" in line]
    # Throttled: at most one warning a minute per worker (each its own VM; 2 here).
    assert 1 <= len(warnings) <= 2, warnings
    assert ('no rule for domain "not-the-services-domain", descriptor '
            f'[generic_key=per_hour, tenant={tenant}] (group default)') in warnings[0], warnings

"""Per-group counters on Envoy's /stats/prometheus (issue 11 items 2 and 3),
parsed with the real Prometheus text parser (PyPI prometheus-client).

With the project's bootstrap (envoy/envoy.yaml.tmpl `stats_config.stats_tags`)
every group counter is one metric with the group as a label, and the refusals
also carry their source: one query sums them or splits them. The number of
series depends on the groups, never on the tenants.
"""

from __future__ import annotations

from collections import Counter

import requests
from prometheus_client.parser import text_string_to_metric_families

import harness
from harness import ensure_window_room, run_sequential, tally, unique

DAY_ROOM_S = 120
GROUP_METRICS = {
    "tenant_ratelimit_group_admitted": {"group"},
    "tenant_ratelimit_group_refused": {"group", "source"},
    "tenant_ratelimit_group_shadow_refused": {"group", "source"},
    "tenant_ratelimit_group_near_limit": {"group"},
    "tenant_ratelimit_group_failed_open": {"group"},
    "tenant_ratelimit_group_fallback_admitted": {"group"},
}
SOURCES = ("service", "cache", "bucket", "sync", "fallback")
# Every per-group counter (filter/src/counters.rs GroupCounter): the six
# families above (refused and shadow_refused by 5 sources: 14 series) and
# the 12 of lease and sync mode.
PER_GROUP = 26


def scrape(envoy: harness.Envoy) -> dict[tuple[str, tuple], float]:
    """{(metric name, sorted label pairs): value} of the filter's counters.

    Keyed by the family's name, the one Envoy writes: the parser gives a
    counter's samples the `_total` suffix of the OpenMetrics convention.
    """
    text = requests.get(f"{envoy.admin_url}/stats/prometheus", timeout=5).text
    out = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("tenant_ratelimit_") or family.type != "counter":
            continue
        for s in family.samples:
            assert s.name == family.name + "_total", s
            out[(family.name, tuple(sorted(s.labels.items())))] = s.value
    return out


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
    # fallback_admitted, and refused and shadow_refused by 5 sources),
    # whatever the tenants.
    group_series = [(n, dict(l)) for (n, l) in m if n in GROUP_METRICS]
    assert len(group_series) == 3 * 14, group_series
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

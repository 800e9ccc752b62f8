"""Limiter health on a real Envoy: the service call's latency histogram counts
every answered call, and a rate_limit_service.cluster that Envoy does not have
shows in a counter and in a warning that names the cluster."""

from __future__ import annotations

import json
import re
from collections import Counter

import requests

import harness
from harness import ensure_window_room, run_sequential, tally, unique, wait_until

LIMITS = {"x-tenant-id": {"default": {"perhour": 5}}}
HISTOGRAM = "tenant_ratelimit_rls_latency_ms"
# Envoy merges the workers' histograms into what admin shows every stats
# flush (5 s by default): poll for the count, with a deadline.
FLUSH_DEADLINE_S = 30.0


def histogram(envoy: harness.Envoy) -> dict[str, float]:
    """The latency histogram's series: `le` bucket bounds → count, plus count and sum."""
    out: dict[str, float] = {}
    for (name, labels), value in envoy.prometheus(HISTOGRAM, types=("histogram",)).items():
        if name in (f"{HISTOGRAM}_count", f"{HISTOGRAM}_sum"):
            out[name.rsplit("_", 1)[1]] = value
        elif name == f"{HISTOGRAM}_bucket":
            out[dict(labels)["le"]] = value
    return out


def test_the_latency_histogram_counts_every_answered_call(stack):
    fleet = stack.fleet(LIMITS, envoys=1, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    envoy = fleet.envoys[0]
    ensure_window_room(3600, 120)

    # 5 admitted, then refusals: by the service, then from the over-limit
    # cache (no call, so not in the histogram).
    results = run_sequential(fleet.urls, 12, tenant=unique("tenant"))
    assert tally(results) == Counter({200: 5, 429: 7}), harness.summary(results)
    c = fleet.counters()
    calls = c["allowed"] + c["over_limit"]
    assert c["allowed"] == 5 and c["over_limit"] >= 1 and c["cached_over_limit"] >= 1, c
    assert c["rls_error"] == 0, c

    # The service saw exactly the calls the histogram counts.
    m = fleet.ratelimit.settled_metrics()
    served = m.get('ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}', 0)
    assert served == calls, (served, c)

    wait_until(lambda: histogram(envoy).get("count") == calls,
               f"{HISTOGRAM}_count == {calls}", FLUSH_DEADLINE_S)
    h = histogram(envoy)
    # Prometheus buckets, cumulative, ending in +Inf == count.
    assert h["+Inf"] == calls, h
    bounds = sorted(float(k) for k in h if k not in ("count", "sum", "+Inf"))
    assert len(bounds) >= 10, h
    counts = [h[k] for k in sorted((k for k in h if k not in ("count", "sum", "+Inf")),
                                   key=float)]
    assert counts == sorted(counts), h
    # Recorded in milliseconds: no answered call outlasts the call timeout (a
    # call that does is a timeout, not recorded), so a sum above this would
    # mean another unit (µs, ns).
    assert h["sum"] <= calls * harness.COUNTING_TIMEOUT_MS, h

    # /stats shows it too, under the proxy-wasm name.
    text = requests.get(f"{envoy.admin_url}/stats", params={"filter": "rls_latency"},
                        timeout=5).text
    assert "wasmcustom.tenant_ratelimit.rls_latency_ms" in text, text


def typo_config(fleet_cfg: dict, typo: str) -> dict:
    cfg = json.loads(json.dumps(fleet_cfg))
    cfg["rate_limit_service"]["cluster"] = typo
    return cfg


def test_a_missing_cluster_is_counted_and_logged_by_name(stack):
    gen = stack.generate(LIMITS)
    redis = stack.redis()
    rls = stack.ratelimit(redis, gen)
    upstream = stack.upstream()
    good = gen.plugin_config()
    cluster = good["rate_limit_service"]["cluster"]
    typo = cluster[:-1]
    # Envoy defines the real cluster; the filter names one letter less.
    concurrency = 2
    envoy = stack.envoy(typo_config(good, typo), rls, upstream, name="envoy-typo",
                        concurrency=concurrency, rls_cluster=cluster)

    # It starts (Envoy may learn the cluster later), and nothing is limited.
    n = 20
    results = run_sequential([envoy.url], n, tenant=unique("tenant"))
    assert tally(results) == Counter({200: n}), harness.summary(results)
    c = envoy.filter_counters()
    # Each request tried to call until the breaker opened (5 in a row
    # failed), the rest were answered at once without a call.
    assert c["rls_dispatch_failed"] >= 5 and c["breaker_opened"] == 1, c
    assert c["rls_dispatch_failed"] + c["breaker_skipped"] == n, c
    assert c["rls_error"] == c["rls_dispatch_failed"] and c["failure_mode_allowed"] == n, c
    assert c["allowed"] == 0, c

    # The metric an alert reads.
    name = "tenant_ratelimit_rls_dispatch_failed"
    assert envoy.prometheus(name)[(name, ())] == c["rls_dispatch_failed"]

    # The log names the cluster, once per worker VM, not once per request.
    warning = re.compile(r'cannot call the rate-limit service: dispatch to cluster "'
                         + re.escape(typo) + r'" failed')
    wait_until(lambda: warning.search(envoy.process.log_text()), "the warning in Envoy's log",
               10.0)
    lines = [line for line in envoy.process.log_text().splitlines() if warning.search(line)]
    assert 1 <= len(lines) <= concurrency, lines
    assert "[warning]" in lines[0], lines[0]

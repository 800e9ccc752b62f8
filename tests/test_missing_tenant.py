"""A request without the tenant header: not limited by default, 429 with missing_tenant "deny"."""

from __future__ import annotations

from collections import Counter

import harness
from harness import ensure_window_room, run_sequential, tally, unique

LIMITS = {"x-tenant-id": {"default": {"persecond": 2, "perminute": 3, "perhour": 3}}}


def test_missing_header_passes_unlimited_by_default(stack):
    fleet = stack.fleet(LIMITS, envoys=2, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    ensure_window_room(3600, 60)
    before = fleet.counters()

    results = run_sequential(fleet.urls, 30, tenant=None)  # 10x every limit
    assert tally(results) == Counter({200: 30}), harness.summary(results)
    for r in results:
        assert "x-ratelimit-limit" not in r.headers, r.headers

    after = fleet.counters()
    assert after["missing_tenant"] - before.get("missing_tenant", 0) == 30, after
    # Nothing was counted for anyone: the service was never asked.
    assert fleet.redis.keys(f"{fleet.domain}_*") == []

    # The same fleet still limits a request that names a tenant.
    # (perhour 3 bounds the admissions whatever second or minute boundary
    # the run crosses.)
    tenant_results = run_sequential(fleet.urls, 10, tenant=unique("tenant"))
    statuses = [r.status for r in tenant_results]
    assert statuses[:2] == [200, 200] and set(statuses) == {200, 429}, statuses
    assert statuses.count(200) <= 3, statuses


def test_missing_header_is_refused_with_missing_tenant_deny(stack):
    fleet = stack.fleet(LIMITS, envoys=1, missing_tenant="deny",
                        timeout_ms=harness.COUNTING_TIMEOUT_MS)
    ensure_window_room(3600, 60)

    results = run_sequential(fleet.urls, 10, tenant=None)
    assert tally(results) == Counter({429: 10}), harness.summary(results)
    assert fleet.counters()["missing_tenant"] == 10
    assert fleet.redis.keys(f"{fleet.domain}_*") == []

    ok = run_sequential(fleet.urls, 2, tenant=unique("tenant"))
    assert tally(ok) == Counter({200: 2})

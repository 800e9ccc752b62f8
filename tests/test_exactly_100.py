"""Exactly 100, not 101: one quota held across two Envoys sharing one service
(envoyproxy/ratelimit, or the counter: `pytest --service counter`) and one Redis."""

from __future__ import annotations

from collections import Counter

import expect
import harness
from harness import ensure_window_room, run_concurrent, run_sequential, tally, unique

RULE = {"perhour": 100}
LIMITS = {"x-tenant-id": {"default": RULE}}
# Everything a test sends must land in one hour window: a run straddling the
# top of the hour would rightly get up to 100 in each window.
HOUR_ROOM_S = 180


def test_1000_sequential_requests_over_two_envoys_admit_exactly_100(stack):
    fleet = stack.fleet(LIMITS, envoys=2, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    tenant = unique("tenant-a")
    ensure_window_room(3600, HOUR_ROOM_S)

    run1 = run_sequential(fleet.urls, 1000, tenant=tenant)
    assert tally(run1) == Counter({200: 100, 429: 900}), harness.summary(run1)
    # Sequential, so the first 100 are the admitted ones, and they were
    # spread over both Envoys.
    assert [r.status for r in run1[:100]] == [200] * 100
    assert Counter(r.target for r in run1 if r.status == 200) == Counter({0: 50, 1: 50})

    # Each admission saw the shared counter: remaining counts down 99 … 0.
    remaining = [expect.admitted(r, RULE, tightest_window=3600).remaining for r in run1[:100]]
    assert remaining == list(range(99, -1, -1))
    for r in run1[100:]:
        h = expect.limited(r, RULE, tightest_window=3600)
        assert h.limit == 100

    run2 = run_sequential(fleet.urls, 1000, tenant=tenant)
    assert tally(run2) == Counter({429: 1000}), harness.summary(run2)
    for r in run2:
        expect.limited(r, RULE, tightest_window=3600)

    # The service's view agrees: 100 within the limit for this domain.
    if stack.service == "counter":
        assert fleet.ratelimit.group_total("admitted", fleet.domain) == 100
        assert fleet.ratelimit.group_total("refused", fleet.domain) == 2
    else:
        m = fleet.ratelimit.settled_metrics()
        assert fleet.ratelimit.rule_counter("within_limit", fleet.domain, "hour", metrics=m) == 100
    # And the filters' own counters, summed over the fleet.
    c = fleet.counters()
    assert c["allowed"] == 100, c
    assert c["over_limit"] + c["cached_over_limit"] == 1900, c
    # Each Envoy asked once more, heard OVER_LIMIT, and answered the rest of
    # the hour from its over-limit cache.
    assert c["over_limit"] == 2, c
    assert c["failure_mode_allowed"] == 0 and c["rls_error"] == 0, c

    if stack.service == "counter":
        # One counter in Redis for this tenant's hour window, holding what
        # was admitted: the two refused calls added nothing.
        key = harness.counter_key(fleet.domain, "hour", tenant)
        assert fleet.redis.keys("trl:*") == [key]
        assert fleet.redis.get_int(key) == 100
    else:
        # One counter in Redis for this tenant's hour window: the service
        # counts the refused calls too, and there were two of them.
        key = harness.redis_key(fleet.domain, "hour", tenant)
        assert fleet.redis.keys(f"{fleet.domain}_*") == [key]
        assert fleet.redis.get_int(key) == 102


def test_50_concurrent_clients_over_two_envoys_admit_exactly_100(stack):
    fleet = stack.fleet(LIMITS, envoys=2, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    tenant = unique("tenant-a")
    ensure_window_room(3600, HOUR_ROOM_S)

    results = run_concurrent(fleet.urls, 1000, clients=50, tenant=tenant)
    assert tally(results) == Counter({200: 100, 429: 900}), harness.summary(results)
    for r in results:
        if r.status == 200:
            expect.admitted(r, RULE, tightest_window=3600)
        else:
            expect.limited(r, RULE, tightest_window=3600)
    # Every remaining value 99 … 0 was handed out exactly once.
    assert sorted(harness.parse_ratelimit_headers(r.headers).remaining
                  for r in results if r.status == 200) == list(range(100))

    again = run_concurrent(fleet.urls, 200, clients=50, tenant=tenant)
    assert tally(again) == Counter({429: 200}), harness.summary(again)

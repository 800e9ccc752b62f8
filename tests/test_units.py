"""Three units at once: per-second, per-minute and per-hour descriptors in one call.

A burst trips the per-second limit first; slower traffic, kept under the
per-second limit, trips the per-minute one. The x-ratelimit-limit header names
the tightest window first.
"""

from __future__ import annotations

import expect
import harness
from harness import ensure_window_room, run_sequential, unique, wait_next_second

RULE = {"persecond": 5, "perminute": 20, "perhour": 1000}
LIMITS = {"x-tenant-id": {"default": RULE}}
BURST = 12
MAX_ATTEMPTS = 5


def test_a_burst_trips_the_per_second_limit_first(stack):
    fleet = stack.fleet(LIMITS, envoys=2, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    ensure_window_room(3600, 60)

    # A burst that straddled a second boundary meets two windows, each
    # admitting up to 5: right, but not what this test is about. Fresh
    # counters (a new tenant) for every attempt.
    results = harness.in_one_second(
        lambda: run_sequential(fleet.urls, BURST, tenant=unique("burst")), MAX_ATTEMPTS,
        what=f"burst of {BURST}")

    statuses = [r.status for r in results]
    assert statuses == [200] * 5 + [429] * (BURST - 5), statuses
    for r in results[:5]:
        expect.admitted(r, RULE)
    for r in results[5:]:
        h = expect.limited(r, RULE, tightest_window=1)
        assert h.limit == 5
        assert h.reset <= 1
        assert h.retry_after == 1


def test_slower_traffic_trips_the_per_minute_limit(stack):
    fleet = stack.fleet(LIMITS, envoys=2, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    tenant = unique("steady")
    # Six batches, one per second: they must all fall in one minute window.
    ensure_window_room(60, 20)
    window = harness.window_start(60)

    batches = []
    for _ in range(6):
        wait_next_second()
        batches.append(run_sequential(fleet.urls, 4, tenant=tenant))  # 4 < 5 per second
    assert harness.window_start(60) == window, "the run left its minute window"

    statuses = [[r.status for r in b] for b in batches]
    assert statuses == [[200] * 4] * 5 + [[429] * 4], statuses
    for b in batches[:5]:
        for r in b:
            expect.admitted(r, RULE)
    for r in batches[5]:
        h = expect.limited(r, RULE, tightest_window=60)
        assert h.limit == 20
        assert h.reset <= 60
        assert 1 <= h.retry_after <= 60

"""headers: "off" leaves the x-ratelimit-* headers out; the limiting is the same."""

from __future__ import annotations

from collections import Counter

import harness
from harness import ensure_window_room, run_sequential, tally, unique

LIMITS = {"x-tenant-id": {"default": {"perhour": 3}}}


def test_headers_off_limits_without_x_ratelimit_headers(stack):
    fleet = stack.fleet(LIMITS, envoys=1, headers="off", timeout_ms=harness.COUNTING_TIMEOUT_MS)
    ensure_window_room(3600, 60)
    results = run_sequential(fleet.urls, 6, tenant=unique("tenant"))
    assert tally(results) == Counter({200: 3, 429: 3}), harness.summary(results)
    for r in results:
        assert not any(h.startswith("x-ratelimit-") for h in r.headers), r.headers

"""How stale the filter's counters may be in Envoy's stats: at most one tick.

Each VM keeps its counts and hands them to Envoy on its tick (every 250 ms
at the longest, docs/operating.md#metrics), so a request costs no host call
for its counters. Read right after the requests, /stats may not show them
yet (and never more than were made); once every VM has flushed after them
(`tenant_ratelimit.stats_flushes` moved on by two per VM), it shows every
one. The exact figures are read without waiting for any clock: the wait is
on Envoy's own count of the flushes."""

from __future__ import annotations

from collections import Counter

import requests

import harness
from harness import ensure_window_room, run_sequential, tally, unique

REQUESTS = 12


def raw_counters(envoy: harness.Envoy) -> dict[str, int]:
    """The filter's counters in /stats as they are now, without waiting for a flush."""
    text = requests.get(f"{envoy.admin_url}/stats", params={"filter": "tenant_ratelimit"},
                        timeout=2).text
    return {name.partition("tenant_ratelimit.")[2]: v
            for name, v in harness.parse_stats(text).items()
            if name.startswith("wasmcustom.")}


def test_a_count_is_in_envoys_stats_once_every_vm_has_flushed_after_it(stack):
    tenant = unique("tenant-flush")
    limits = {"x-tenant-id": {"default": {"perhour": 1000},
                              "limited": {"perhour": 5, "header_value": [tenant]}}}
    fleet = stack.fleet(limits, envoys=1)
    envoy = fleet.envoys[0]
    ensure_window_room(3600, 60)
    flushes = raw_counters(envoy)["stats_flushes"]

    results = run_sequential(fleet.urls, REQUESTS, tenant=tenant)
    assert tally(results) == Counter({200: 5, 429: REQUESTS - 5}), harness.summary(results)

    # Right after: at most what was made (some VM may not have ticked yet).
    now = raw_counters(envoy)
    assert now.get("allowed", 0) <= 5
    refused = ("over_limit", "cached_over_limit", "local_over_limit")
    assert sum(now.get(k, 0) for k in refused) <= REQUESTS - 5
    # Every VM ticks, whatever the mode (exact here: no lease or sync tick).
    harness.wait_flushed(envoy.admin_url)
    after = raw_counters(envoy)
    assert after["stats_flushes"] >= flushes + 2 * 3  # 2 workers and the main thread
    assert after["allowed"] == 5
    assert sum(after.get(k, 0) for k in refused) == REQUESTS - 5
    assert after["group.limited.admitted"] == 5
    # Counted once: another round of flushes adds nothing.
    harness.wait_flushed(envoy.admin_url)
    again = raw_counters(envoy)
    assert {k: v for k, v in again.items() if k != "stats_flushes"} == \
        {k: v for k, v in after.items() if k != "stats_flushes"}

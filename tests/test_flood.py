"""A flood of 100,000 distinct tenants through one Envoy, sent by the
benchmark's load generator (wrk, bench/flood.lua): every request is
answered 200, none fails open, and Envoy's heap stays within the slot bound
the README states (320 bytes per slot, all allocated at start-up). The
10^6 version is `make bench BENCH_ARGS="--flood 1000000"`."""

from __future__ import annotations

import flood

TENANTS = 100_000
SLOTS = 65_536


def test_100k_distinct_tenants_through_one_envoy_stay_within_the_slot_bound(stack):
    # Bounded: 100,000 requests in at most 5 minutes, or the test fails.
    f = flood.run_flood(stack, TENANTS, slots=SLOTS, max_s=300)
    print(f"\nflood: {f}")
    assert f["warm_statuses"] == {200: sum(f["warm_statuses"].values())}, f
    # Every response wrk read was a 200, and wrk saw no error of any kind.
    assert f["statuses"] == {200: f["answered"]}, f
    assert all(v == 0 for v in f["wrk_errors"].values()), f
    assert f["answered"] >= TENANTS, f
    c = f["counters"]
    # Envoy admitted each of them after asking the service (a request still
    # in flight when a wrk thread stopped was admitted too, never read).
    assert f["answered"] <= c["allowed"] <= f["answered"] + f["connections"], f
    assert c.get("failure_mode_allowed", 0) == 0 and c.get("rls_error", 0) == 0, f
    assert c.get("local_error", 0) == 0, f
    assert f["slots_bytes"] + f["heap_growth"] <= f["bound_bytes"], f

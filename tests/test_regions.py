"""Global limits across regions (`"regions": "global"`): two regions on
loopback, each a Redis, a ratelimit-counter (`--region NAME --regions 2`)
and a filter Envoy, and one `ratelimit-counter rebalance` over both Redis.

Each region admits against its allocation, counted exactly in its own
Redis; the rebalancer moves the allocations toward the regions' shares of
the demand. The counters and the rebalancer share one test clock (moved to
the start of a fresh minute window for each phase), so that every phase
stays in one window. Figures are printed (`-s`): the total admitted per
window against the limit, the undershoot, the periods an allocation took
to follow its demand."""

from __future__ import annotations

import math

from harness.regions import Regions as SharedRegions

LIMIT = 600
PERIOD_MS = 200
DEMAND_MS = 1_000
# docs/scaling.md, "Several regions": a region whose demand moved reaches
# (within a tenth) its new share in at most ceil(3 × demand_ms / period) + 2
# periods.
FOLLOW_PERIODS = math.ceil(3 * DEMAND_MS / PERIOD_MS) + 2


def Regions(stack) -> SharedRegions:
    """The two regions (harness/regions.py), a per-minute limit, every
    clock at the start of a fresh minute window."""
    r = SharedRegions(stack, LIMIT, "perminute", period_ms=PERIOD_MS, demand_ms=DEMAND_MS)
    r.fresh_window()
    return r


def test_regions_admit_at_most_the_limit_together_and_follow_the_demand(stack):
    r = Regions(stack)
    try:
        w1 = r.start_ms
        # 90/10: a's allocation follows its demand.
        first = r.drive((9, 1), lambda: r.held(r.a) >= 0.8 * LIMIT, "a's allocation at 80%")
        assert r.held(r.a) + r.held(r.b) <= LIMIT
        # Moved to 10/90 in the same window: b's allocation follows,
        # never taking what a admitted.
        p0 = r.periods()
        moved = r.drive((1, 9), lambda: r.held(r.b) >= 0.9 * (LIMIT - r.admitted(r.a)),
                        "b's allocation following its demand")
        periods = r.periods() - p0
        assert r.held(r.a) >= r.admitted(r.a) and r.held(r.b) >= r.admitted(r.b)
        assert r.held(r.a) + r.held(r.b) <= LIMIT
        assert periods <= FOLLOW_PERIODS, (periods, FOLLOW_PERIODS)
        total_w1 = r.total(w1)
        assert total_w1 <= LIMIT
        # The undershoot: refusals while the tenant's window was under its
        # limit (it never reached it here), at most the moved demand over
        # the periods the allocation took to follow (b's requests per period).
        refused_w1 = sum(t[429] for t in (first["a"], first["b"], moved["a"], moved["b"]))
        b_per_period = sum(moved["b"].values()) / max(periods, 1)
        assert refused_w1 <= b_per_period * FOLLOW_PERIODS, (refused_w1, b_per_period)

        # A fresh window flooded at 10/90: together never past the limit.
        w2 = r.fresh_window()
        flood = r.fill((2, 18), "the window flooded")
        total_w2 = r.total(w2)
        assert total_w2 <= LIMIT, total_w2
        admitted_w2 = flood["a"][200] + flood["b"][200]
        assert admitted_w2 == total_w2, (flood, total_w2)
        print(f"\nregions: limit {LIMIT}/min; window 1 (90/10 then 10/90, paced): admitted "
              f"{total_w1}, refused {refused_w1} (the undershoot: the window was never full); "
              f"b's allocation followed its demand in {periods} periods of {PERIOD_MS} ms "
              f"(bound {FOLLOW_PERIODS}); window 2 (10/90, flooded): admitted {total_w2} "
              f"= a {r.admitted(r.a, w2)} + b {r.admitted(r.b, w2)}, undershoot "
              f"{LIMIT - total_w2}")
    finally:
        r.close()


def test_a_region_cut_off_keeps_its_allocation_and_the_total_stays_within_the_limit(stack):
    r = Regions(stack)
    try:
        # 70/30: the allocations move (a above its floor).
        r.drive((7, 3), lambda: r.alloc(r.a) is not None and r.alloc(r.a) >= 0.6 * LIMIT,
                "a's allocation at 60%")
        # b's Redis cut off from the rebalancer (its counter still reaches it).
        r.cut()
        last_a, last_b = r.held(r.a), r.held(r.b)
        assert last_a + last_b <= LIMIT
        # A fresh window, the demand moved to b, flooded: each region
        # admits within its last allocation; nothing moves.
        w2 = r.fresh_window()
        seen = r.fill((2, 18), "both regions full")
        assert r.admitted(r.a, w2) <= last_a and r.admitted(r.b, w2) <= last_b, seen
        assert r.total(w2) <= LIMIT
        assert (r.held(r.a), r.held(r.b)) == (last_a, last_b)
        print(f"\nregions cut off: b unreachable; window admitted a {r.admitted(r.a, w2)} "
              f"(held {last_a}) + b {r.admitted(r.b, w2)} (held {last_b}) = {r.total(w2)} "
              f"of {LIMIT}")
        # Reachable again: rebalancing resumes, b's allocation follows its demand.
        r.mend()
        w3 = r.fresh_window()
        r.drive((1, 9), lambda: r.held(r.b) >= 0.6 * LIMIT, "b's allocation after the cut")
        assert r.total(w3) <= LIMIT
        assert r.held(r.a) + r.held(r.b) <= LIMIT
    finally:
        r.close()

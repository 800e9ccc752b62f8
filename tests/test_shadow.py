"""Shadow mode (issue 11 item 1), against real Envoys, the real service and Redis.

A shadowed group's would-be refusals are let through (200, with the
X-RateLimit-* headers an admitted request gets, never Retry-After) and counted
as shadow_refused.<source> of the group; a group beside it that is not
shadowed is still enforced. The service itself is never told about shadow: it
answers OVER_LIMIT, and the over-limit cache remembers it as when enforcing,
so the split by source is the one enforcing would have had.
"""

from __future__ import annotations

from collections import Counter

import harness
from harness import ensure_window_room, run_sequential, tally, unique

QUOTA = 10
# Every request of a test must land in one day window (counted in Redis).
DAY_ROOM_S = 120


def limits(gold_tenant: str, gold_shadow: bool) -> dict:
    gold = {"perday": QUOTA, "header_value": [gold_tenant]}
    if gold_shadow:
        gold["shadow"] = True
    return {"x-tenant-id": {"default": {"perday": QUOTA}, "gold": gold}}


def remaining(results) -> list[int]:
    return [int(r.headers["x-ratelimit-remaining"]) for r in results]


def test_a_shadowed_group_far_over_its_quota_is_let_through_and_counted(stack):
    gold = unique("tenant-gold")
    fleet = stack.fleet(limits(gold, gold_shadow=True), envoys=2,
                        timeout_ms=harness.COUNTING_TIMEOUT_MS)
    ensure_window_room(86400, DAY_ROOM_S)

    shadowed = run_sequential(fleet.urls, 6 * QUOTA, tenant=gold)
    assert tally(shadowed) == Counter({200: 6 * QUOTA}), harness.summary(shadowed)
    # The headers of an admitted request: the count goes down to 0 and stays
    # there; no Retry-After, no x-envoy-ratelimited.
    assert remaining(shadowed) == list(range(QUOTA - 1, -1, -1)) + [0] * (5 * QUOTA)
    for r in shadowed:
        assert "retry-after" not in r.headers and "x-envoy-ratelimited" not in r.headers, r.headers

    # The group beside it is enforced.
    enforced_tenant = unique("tenant-a")
    enforced = run_sequential(fleet.urls, 3 * QUOTA, tenant=enforced_tenant)
    assert tally(enforced) == Counter({200: QUOTA, 429: 2 * QUOTA}), harness.summary(enforced)

    c = fleet.counters()
    shadow = {s: c[f"group.gold.shadow_refused.{s}"] for s in ("service", "cache", "bucket")}
    # One would-be refusal per request over the quota, by the first source
    # that would refuse: each Envoy heard OVER_LIMIT once, then its cache.
    assert sum(shadow.values()) == 5 * QUOTA, c
    assert shadow == {"service": 2, "cache": 5 * QUOTA - 2, "bucket": 0}, c
    assert c["group.gold.admitted"] == QUOTA, c
    assert sum(c[f"group.gold.refused.{s}"] for s in ("service", "cache", "bucket")) == 0, c
    assert c["group.default.admitted"] == QUOTA, c
    assert c["group.default.refused.service"] + c["group.default.refused.cache"] == 2 * QUOTA, c
    assert sum(c[f"group.default.shadow_refused.{s}"] for s in ("service", "cache", "bucket")) == 0
    # The global counters count what was enforced only.
    assert c["over_limit"] + c["cached_over_limit"] == 2 * QUOTA, c
    assert c["allowed"] == 2 * QUOTA, c

    # The service counted the shadowed tenant as it would an enforced one:
    # the admitted calls and the two refused ones.
    assert fleet.redis.get_int(harness.redis_key(fleet.domain, "day", gold)) == QUOTA + 2


def test_global_shadow_covers_every_group(stack):
    gold = unique("tenant-gold")
    fleet = stack.fleet(limits(gold, gold_shadow=False), envoys=1,
                        timeout_ms=harness.COUNTING_TIMEOUT_MS, shadow=True)
    ensure_window_room(86400, DAY_ROOM_S)
    other = unique("tenant-a")
    for tenant in (gold, other):
        results = run_sequential(fleet.urls, 3 * QUOTA, tenant=tenant)
        assert tally(results) == Counter({200: 3 * QUOTA}), harness.summary(results)
    c = fleet.counters()
    for group in ("gold", "default"):
        would_be = sum(c[f"group.{group}.shadow_refused.{s}"] for s in ("service", "cache", "bucket"))
        assert would_be == 2 * QUOTA, (group, c)
        assert c[f"group.{group}.admitted"] == QUOTA, (group, c)
    assert c["over_limit"] == 0 and c["cached_over_limit"] == 0, c

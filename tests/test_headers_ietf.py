"""headers: "ietf_draft_10": RateLimit-Policy and RateLimit, valid RFC 9651
lists (parsed with http-sfv), saying what X-RateLimit-* says for the same
answer.

Two Envoys share one service: one writes X-RateLimit-* (draft_version_03),
the other the IETF headers. Two tenants of the default group (each its own
counter) send the same sequence, one to each Envoy, request by request, so
the i-th answers are the same answer told in two families: admitted ones,
the service's refusal, and refusals from the over-limit cache.
"""

from __future__ import annotations

from collections import Counter

import http_sfv

import harness
from harness import (ensure_window_room, parse_ratelimit_headers, seconds_crossed, send, tally,
                     unique)

RULE = {"perminute": 5, "perhour": 100}
LIMITS = {"x-tenant-id": {"default": RULE}}
REQUESTS = 8


def sf_list(value: str) -> list[tuple[str, dict]]:
    """An RFC 9651 List of Items with String values; raises if it is not one."""
    parsed = http_sfv.List()
    parsed.parse(value.encode("ascii"))
    items = []
    for member in parsed:
        assert isinstance(member, http_sfv.Item), f"{value!r}: inner lists are not items"
        assert isinstance(member.value, str), f"{value!r}: item value {member.value!r} is not a String"
        items.append((member.value, dict(member.params)))
    return items


def test_ietf_headers_parse_and_agree_with_x_ratelimit(stack):
    gen = stack.generate(LIMITS)
    redis = stack.redis()
    rls = stack.ratelimit(redis, gen)
    upstream = stack.upstream()
    timeout = harness.COUNTING_TIMEOUT_MS
    draft = stack.envoy(gen.plugin_config(timeout_ms=timeout), rls, upstream, name="envoy-draft03")
    ietf = stack.envoy(gen.plugin_config(timeout_ms=timeout, headers="ietf_draft_10"), rls,
                       upstream, name="envoy-ietf")
    ensure_window_room(60, 20)
    a, b = unique("tenant-x"), unique("tenant-y")
    pairs = []
    for _ in range(REQUESTS):
        pairs.append((send(draft.url, a), send(ietf.url, b)))
    assert tally(x for x, _ in pairs) == Counter({200: 5, 429: 3})
    assert tally(y for _, y in pairs) == Counter({200: 5, 429: 3})

    for i, (x, y) in enumerate(pairs):
        assert x.status == y.status, (i, x, y)
        # Each Envoy writes its own family only.
        assert not {"ratelimit", "ratelimit-policy"} & set(x.headers), x.headers
        assert not any(k.startswith("x-ratelimit-") for k in y.headers), y.headers
        d = parse_ratelimit_headers(x.headers)

        policy = sf_list(y.headers["ratelimit-policy"])
        # One item per window of the group, the windows X-RateLimit-Limit lists.
        assert sorted((p["q"], p["w"]) for _, p in policy) == sorted(d.windows), (policy, d)
        assert [name for name, _ in policy] == ["per_minute", "per_hour"], policy
        assert all(set(p) == {"q", "w"} for _, p in policy), policy

        limit = sf_list(y.headers["ratelimit"])
        assert len(limit) == 1, limit
        name, params = limit[0]
        assert set(params) == {"r", "t"}, params
        # The tightest window, as X-RateLimit-* picks it.
        assert dict((n, p["q"]) for n, p in policy)[name] == d.limit, (limit, d)
        assert params["r"] == d.remaining, (i, limit, x.headers)
        # The same answer's reset, give or take the second boundaries crossed
        # between sending x and y's answer (each Envoy, or the service, read
        # its clock somewhere in that span, in whole seconds).
        crossed = seconds_crossed(x, y)
        assert 0 <= d.reset - params["t"] <= crossed, (i, crossed, limit, x, y)

        if x.status == 429:
            # Retry-After stays on every 429, in both families.
            ry, rx = int(y.headers["retry-after"]), d.retry_after
            assert rx is not None and 0 <= rx - ry <= crossed, (i, crossed, x, y)
            assert params["r"] == 0

    # The last two refusals came from the over-limit cache of each Envoy.
    assert draft.filter_counters().get("cached_over_limit") == 2
    assert ietf.filter_counters().get("cached_over_limit") == 2


def test_a_bucket_refusal_carries_the_groups_policy(stack):
    """The bucket knows no window: its 429 has RateLimit-Policy (the group's
    limits) and Retry-After, and no RateLimit."""
    limits = {"x-tenant-id": {"default": {"persecond": 2, "perhour": 1000}}}
    fleet = stack.fleet(limits, envoys=1, headers="ietf_draft_10",
                        timeout_ms=harness.COUNTING_TIMEOUT_MS)
    tenant = unique("tenant")
    ensure_window_room(1, 0.5)
    results = harness.run_concurrent(fleet.urls, 12, clients=12, tenant=tenant)
    refused = [r for r in results if r.status == 429]
    assert refused, harness.summary(results)
    c = fleet.counters()
    assert c.get("local_over_limit", 0) >= 1, c
    for r in refused:
        policy = sf_list(r.headers["ratelimit-policy"])
        assert policy == [("per_second", {"q": 2, "w": 1}), ("per_hour", {"q": 1000, "w": 3600})]
        assert int(r.headers["retry-after"]) >= 1
    bucket_only = [r for r in refused if "ratelimit" not in r.headers]
    assert len(bucket_only) == c["local_over_limit"], (c, [r.headers for r in refused])

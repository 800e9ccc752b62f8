"""This filter against ratelimit-counter (`"rate_limit_service": {"service":
"counter"}`): batched calls carry a mark before each request, so the counter
decides each request of a call apart and Redis holds exactly what was
admitted; the headers and Retry-After of its answers; a sliding window's
refusal kept for the counter's `duration_until_reset`; lease and sync modes.

Every run stays inside one clock-aligned window of the quota's unit
(`ensure_window_room`)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import random
import time
from collections import Counter as Tally

import pytest

import expect
import harness
from counter import Counter
from harness import ensure_window_room, run_concurrent, run_sequential, send, tally, unique

# A run must land in one minute window (and one hour).
MINUTE_ROOM_S = 40


def counter_envoys(stack, limits: dict, envoys: int = 2, store: str = "redis",
                   **plugin) -> tuple[harness.Generated, Counter, list[harness.Envoy],
                                      harness.Redis | None]:
    """`envoys` filter Envoys of 2 workers, configured for one counter (on
    its own Redis, or in memory); `plugin`: top-level keys of the plugin
    configuration. Batched, one call under way per worker (the default),
    so that a worker's waiting requests share its next call."""
    gen = stack.generate(limits, service="counter")
    redis = stack.redis() if store == "redis" else None
    url = redis.url if redis else "memory"
    counter = Counter(stack, {gen.domain: limits}, store=url)
    cfg = gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS, **plugin)
    service = cfg["rate_limit_service"]
    assert service.get("service") == "counter", service
    service["batch"] = {"max_in_flight": 1, "max_descriptors": 100}
    upstream = stack.upstream()
    members = [stack.envoy(cfg, counter.grpc_port, upstream, name=f"envoy-{i + 1}")
               for i in range(envoys)]
    return gen, counter, members, redis


def fleet_counters(envoys: list[harness.Envoy]) -> Tally:
    total: Tally = Tally()
    for e in envoys:
        total.update(e.filter_counters())
    return total


def held(redis: harness.Redis, tenant: str, unit: str) -> int:
    """What Redis holds for `tenant`'s windows of `unit` (the counter's
    keys: trl:{<len>:<domain>:<tenant>}:per_<unit>:<window start ms>), summed
    over the windows the run touched (one, with the room ensured)."""
    keys = [k for k in redis.keys("trl:*") if f":{tenant}}}:per_{unit}:" in k]
    assert len(keys) <= 1, keys
    return sum(redis.get_int(k) or 0 for k in keys)


def unnamed(r: harness.Result, group: str) -> harness.Result:
    """`r` with the counter's rule names taken out of x-ratelimit-limit,
    after checking each is the group's (the counter names a group's limits
    after it; the generated ratelimit.yaml names none), for the checks
    that hold with envoyproxy/ratelimit."""
    raw = r.headers["x-ratelimit-limit"]
    name = f';name="{group}"'
    items = raw.split(", ")
    assert all(i.endswith(name) for i in items[1:]), raw
    headers = {**r.headers, "x-ratelimit-limit": raw.replace(name, "")}
    return dataclasses.replace(r, headers=headers)


def test_batched_calls_decide_each_tenant_apart_and_redis_holds_exactly_what_was_admitted(stack):
    # The over-limit cache off: every request of the hot tenant asks the
    # counter, so nearly every call carries a refused request beside the
    # others' admitted ones. Without marks the counter would take each call
    # as one request, refuse it whole and count nothing of it, while the
    # other tenants' statuses say OK: admitted, not counted.
    hot, cold = unique("hot"), [unique(f"cold{i}") for i in range(4)]
    quota, hot_quota = 60, 20
    limits = {"x-tenant-id": {
        "default": {"perminute": quota, "perhour": 10_000},
        "small": {"perminute": hot_quota, "perhour": 10_000, "header_value": [hot]}}}
    _, counter, envoys, redis = counter_envoys(stack, limits, local={"enabled": False})
    ensure_window_room(60, MINUTE_ROOM_S)
    ensure_window_room(3600, MINUTE_ROOM_S)

    # Each cold tenant sends exactly its quota, the hot one ten times its
    # own, all interleaved from 32 clients over both Envoys.
    jobs = [t for _ in range(quota) for t in cold]
    jobs += [hot] * (10 * hot_quota)
    random.Random(7).shuffle(jobs)
    order = [(jobs[i], envoys[i % 2].url, i % 2) for i in range(len(jobs))]
    with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(lambda j: (j[0], send(j[1], j[0], target=j[2])), order))
    by_tenant: dict[str, Tally] = {}
    for t, r in results:
        by_tenant.setdefault(t, Tally())[r.status] += 1
    c = fleet_counters(envoys)
    assert c["rls_error"] == 0 and c["failure_mode_allowed"] == 0, c
    # Calls carried several requests (else nothing here would be batched).
    assert c["batch_queued"] > 0, c
    assert by_tenant[hot] == Tally({200: hot_quota, 429: 9 * hot_quota}), by_tenant
    for t in cold:
        assert by_tenant[t] == Tally({200: quota}), (t, by_tenant)
    # Redis holds exactly what was admitted, per tenant and window.
    for t, admitted in [(hot, hot_quota), *((t, quota) for t in cold)]:
        assert held(redis, t, "minute") == admitted, (t, redis.keys("trl:*"))
        assert held(redis, t, "hour") == admitted, t
    # And not one more: every cold tenant is refused now.
    for t in cold:
        r = send(envoys[0].url, t)
        assert r.status == 429, (t, r)
        expect.limited(unnamed(r, "default"), limits["x-tenant-id"]["default"],
                       tightest_window=60)
    m = counter.metrics()
    print(f"marks: {c['rls_descriptors']} descriptors in "
          f"{m.get('trl_counter_calls_total', 0):.0f} calls, {c['batch_queued']} queued")


def test_headers_and_retry_after_come_from_the_counters_answer(stack):
    rule = {"perminute": 5, "perhour": 100}
    limits = {"x-tenant-id": {"default": rule}}
    gen, counter, envoys, _ = counter_envoys(stack, limits, store="memory")
    tenant = unique("tenant")
    ensure_window_room(60, MINUTE_ROOM_S)
    ensure_window_room(3600, MINUTE_ROOM_S)
    results = run_sequential([e.url for e in envoys], 8, tenant=tenant)
    assert [r.status for r in results] == [200] * 5 + [429] * 3, harness.summary(results)
    # As with envoyproxy/ratelimit: the tightest window first, every
    # window listed, remaining counting down, the reset the minute's end.
    remaining = [expect.admitted(unnamed(r, "default"), rule, tightest_window=60).remaining
                 for r in results[:5]]
    assert remaining == [4, 3, 2, 1, 0]
    for r in results[5:]:
        h = expect.limited(unnamed(r, "default"), rule, tightest_window=60)
        assert h.retry_after == h.reset, r.headers
    # The first refusal on each Envoy came from the counter, the rest
    # from the over-limit cache, with the same headers.
    c = fleet_counters(envoys)
    assert c["over_limit"] == 2 and c["cached_over_limit"] == 1, c
    m = counter.metrics()
    assert m[f'trl_counter_refused_total{{domain="{gen.domain}",group="default"}}'] == 2


def _left(t: float, window_s: int = 60) -> int:
    """Whole seconds to the end of the fixed window at `t`, rounded up."""
    return -int(-(window_s - t % window_s) // 1)


def test_a_sliding_refusal_is_kept_for_the_counters_wait_not_to_the_fixed_windows_end(stack):
    limit = 10  # once spent, the estimate admits one more 60 / 10 = 6 s
    # into the next window: after the fixed window's end.
    limits = {"x-tenant-id": {"default": {"perminute": limit, "window": "sliding"}}}
    _, counter, envoys, _ = counter_envoys(stack, limits, envoys=1, store="memory")
    tenant = unique("sliding")
    # Start with 12 to 20 s left in the minute: the run then waits little.
    ensure_window_room(60, 12)
    left = harness.window_left(60)
    if left > 20:
        time.sleep(left - 20)
    url = envoys[0].url
    spent = run_sequential([url], limit, tenant=tenant)
    assert tally(spent) == Tally({200: limit}), harness.summary(spent)
    refused = send(url, tenant)
    assert refused.status == 429, refused
    retry = int(refused.headers["retry-after"])
    # The counter's wait: to the minute's end, then 6 s of the next one.
    assert _left(harness.answered_at(refused)) + 6 <= retry <= _left(refused.started) + 6, \
        (retry, refused.started, refused.latency_s)
    assert int(refused.headers["x-ratelimit-reset"]) == retry
    calls = counter.metrics()["trl_counter_calls_total"]

    # Past the fixed window's end, inside the counter's wait: the filter
    # still refuses from its over-limit cache, without asking the counter.
    end = harness.window_start(60, refused.started) + 60
    time.sleep(max(0.0, end + 1.0 - time.time()))
    cached = send(url, tenant)
    assert cached.status == 429, cached
    cached_retry = int(cached.headers["retry-after"])
    # The same instant, counted down (whole seconds, each side rounded).
    assert abs((refused.started + retry) - (cached.started + cached_retry)) <= 2, \
        (retry, cached_retry, refused.started, cached.started)
    assert counter.metrics()["trl_counter_calls_total"] == calls
    assert envoys[0].filter_counters()["cached_over_limit"] == 1

    # Once the wait is over (6 s into the next minute) the counter admits
    # one more.
    time.sleep(max(0.0, end + 6.5 - time.time()))
    later = send(url, tenant)
    assert later.status == 200, later


@pytest.mark.parametrize("mode", ["lease", "sync"])
def test_lease_and_sync_against_the_counter_keep_their_bounds_and_redis_holds_what_was_granted(
        stack, mode):
    quota = 600
    limits = {"x-tenant-id": {"default": {"perminute": quota}}}
    local = {"enabled": True, "mode": mode}
    # Sync: three Envoys, whose views go stale between pushes, so that the
    # fleet may admit past the quota (within the mode's bound).
    envoys_n, requests = (1, quota + 300) if mode == "lease" else (3, 2 * quota)
    if mode == "sync":
        local["sync"] = {"interval_ms": 100, "max_unsynced": 50}
    gen, counter, envoys, redis = counter_envoys(stack, limits, envoys=envoys_n, local=local)
    tenant = unique(mode)
    ensure_window_room(60, MINUTE_ROOM_S)
    results = run_concurrent([e.url for e in envoys], requests, clients=16, tenant=tenant)
    t = tally(results)
    g = fleet_counters(envoys)
    print(f"{mode}: {dict(t)}, {dict((k, v) for k, v in g.items() if mode in k)}")
    assert set(t) <= {200, 429}, harness.summary(results)
    assert g["failure_mode_allowed"] == 0 and g["rls_error"] == 0, g
    if mode == "sync":
        # Every hit an Envoy admitted is counted: a push carries hits
        # admitted already, which the counter counts whatever the limit
        # (a request that asks is counted only if it fits). Redis holds
        # exactly what the fleet admitted, and the counter's overshoot
        # metric is what was admitted past the quota.
        admitted = t[200]
        bound = 2 * (envoys_n - 1) * 50
        assert admitted <= quota + bound, harness.summary(results)
        past = max(0, admitted - quota)

        def overshoot() -> int:
            return counter.group_total("overshoot_hits", gen.domain)

        harness.wait_until(
            lambda: held(redis, tenant, "minute") == admitted
            and overshoot() == past,
            f"sync: Redis holds the {admitted} admitted, {past} past the quota",
            deadline_s=10)
        # The filter's own view of it: each push answered OVER_LIMIT counts
        # all its hits, of which the overshoot is a part.
        over_hits = g["group.default.sync.over_limit_hits"]
        assert over_hits >= overshoot(), (over_hits, overshoot())
        assert (over_hits > 0) == (overshoot() > 0), (over_hits, overshoot())
        print(f"sync: {admitted} admitted of {quota}, Redis {held(redis, tenant, 'minute')}, "
              f"counter overshoot {overshoot()}, filter sync.over_limit_hits {over_hits}")
    else:
        # Never more than the quota. The counter refuses a batch that would
        # cross the limit whole, counts nothing of it and says what is
        # left: that refusal is not cached, the Envoy spends the tokens it
        # holds, then asks for one hit at a time until the limit is spent.
        # Redis holds exactly the tokens granted, never a refused batch.
        # Short of the quota only by tokens a worker still held when
        # another's single hit was refused (that request does not wait
        # for them): less than one batch (a twentieth of the limit).
        assert quota - quota // 20 < t[200] <= quota, harness.summary(results)
        assert g["group.default.lease.tokens"] == quota, g
        assert held(redis, tenant, "minute") == quota, g
        assert g["group.default.lease.spent"] > quota // 2, g
        # A lease is an ordinary request: counted only when it fits.
        assert counter.group_total("overshoot_hits", gen.domain) == 0

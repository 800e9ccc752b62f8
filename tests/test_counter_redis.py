"""ratelimit-counter on a real Redis Cluster and under Redis faults, behind
Envoy's own rate-limit filter (failure_mode_deny: false in its template)."""

from __future__ import annotations

from collections import Counter as Tally

import harness
from cluster import RedisCluster
from counter import Counter, native_envoy
from harness import ensure_window_room, run_concurrent, run_sequential, tally, unique
from test_counter import LIMITS, MINUTE_ROOM_S


def test_three_envoys_two_counters_a_cluster_admit_exactly_300(stack):
    gen = stack.generate(LIMITS, service="counter")
    cluster = RedisCluster.start(stack)
    url = "redis-cluster://" + cluster.url
    counters = [Counter(stack, {gen.domain: LIMITS}, store=url, name=f"counter-{i}")
                for i in range(2)]
    upstream = stack.upstream()
    envoys = [native_envoy(stack, gen, counters[i % 2].grpc_port, upstream,
                           name=f"envoy-{i}", concurrency=2) for i in range(3)]
    ensure_window_room(60, MINUTE_ROOM_S)
    ensure_window_room(3600, MINUTE_ROOM_S)
    t = unique("tenant")
    r = run_concurrent([e.url for e in envoys], 1000, clients=64, tenant=t)
    assert tally(r) == Tally({200: 300, 429: 700}), harness.summary(r)
    held = {k: cluster.get_int(k) for k in cluster.keys("trl:*") if t in k}
    # The minute's and the hour's counters, each exactly what was admitted,
    # in one slot (the tenant's hash tag).
    assert sorted(held.values()) == [300, 300], held
    assert len({cluster.keyslot(k) for k in held}) == 1, held
    m = [c.metrics() for c in counters]
    key = f'trl_counter_admitted_total{{domain="{gen.domain}",group="default"}}'
    assert sum(x.get(key, 0) for x in m) == 300


def _store_errors(counter: Counter) -> float:
    return counter.metrics().get("trl_counter_store_errors_total", 0)


def test_redis_killed_then_restarted(stack):
    limits = {"x-tenant-id": {"default": {"perminute": 5}}}
    gen = stack.generate(limits, service="counter")
    redis = stack.redis()
    counter = Counter(stack, {gen.domain: limits},
                      store=redis.url, store_timeout_ms=100)
    upstream = stack.upstream()
    envoy = native_envoy(stack, gen, counter.grpc_port, upstream)
    ensure_window_room(60, MINUTE_ROOM_S)
    tenant = unique("tenant")
    assert tally(run_sequential([envoy.url], 7, tenant=tenant)) == Tally({200: 5, 429: 2})

    # Redis killed: the full tenant is still refused, from the counter's
    # over-limit cache (its minute is full until it ends); every call that
    # needs Redis fails (Envoy's filter fails open here), none hangs, and
    # the counter is no longer ready.
    redis.kill()
    before = _store_errors(counter)
    cached = counter.metrics().get("trl_counter_cache_refused_total", 0)
    assert tally(run_sequential([envoy.url], 3, tenant=tenant)) == Tally({429: 3})
    assert counter.metrics().get("trl_counter_cache_refused_total", 0) == cached + 3
    assert _store_errors(counter) == before
    down = run_concurrent([envoy.url], 20, clients=8, tenant=unique("tenant"))
    assert tally(down) == Tally({200: 20}), harness.summary(down)
    assert _store_errors(counter) >= before + 20
    assert counter.readyz() == 503
    assert counter.process.alive()

    # Restarted without its data (and without the script): loaded again on
    # NOSCRIPT, counting from zero.
    redis.start()
    harness.wait_until(counter.ready, "the counter is ready again", process=counter.process)
    ensure_window_room(60, MINUTE_ROOM_S)
    tenant = unique("tenant")
    assert tally(run_sequential([envoy.url], 7, tenant=tenant)) == Tally({200: 5, 429: 2})
    assert [k for k in redis.keys("trl:*") if tenant in k]


def test_a_frozen_redis_fails_calls_within_the_deadline(stack):
    limits = {"x-tenant-id": {"default": {"perminute": 5}}}
    gen = stack.generate(limits, service="counter")
    redis = stack.redis()
    counter = Counter(stack, {gen.domain: limits},
                      store=redis.url, store_timeout_ms=100)
    upstream = stack.upstream()
    envoy = native_envoy(stack, gen, counter.grpc_port, upstream)
    redis.freeze()
    try:
        before = _store_errors(counter)
        # Every call is answered (UNAVAILABLE after the counter's deadline;
        # Envoy's filter then fails open), and each is counted as a store error.
        frozen = run_sequential([envoy.url], 5, tenant=unique("tenant"))
        assert tally(frozen) == Tally({200: 5}), harness.summary(frozen)
        assert _store_errors(counter) >= before + 5
    finally:
        redis.thaw()


def test_a_counter_replica_restarted_keeps_the_count(stack):
    limits = {"x-tenant-id": {"default": {"perminute": 10}}}
    gen = stack.generate(limits, service="counter")
    redis = stack.redis()
    url = redis.url
    counters = [Counter(stack, {gen.domain: limits}, store=url, name=f"counter-{i}")
                for i in range(2)]
    upstream = stack.upstream()
    envoys = [native_envoy(stack, gen, c.grpc_port, upstream, name=f"envoy-{i}")
              for i, c in enumerate(counters)]
    ensure_window_room(60, MINUTE_ROOM_S)
    tenant = unique("tenant")
    assert tally(run_sequential([envoys[0].url], 6, tenant=tenant)) == Tally({200: 6})
    counters[0].stop()
    counters[0].start()  # the same ports: the Envoy in front reconnects

    def reached() -> bool:
        # Envoy fails open while it cannot reach it: ask the counter itself.
        run_sequential([envoys[0].url], 1, tenant=unique("probe"))
        return counters[0].metrics().get("trl_counter_calls_total", 0) >= 1

    harness.wait_until(reached, "envoy-0 reaches the restarted counter")
    # The count lives in Redis: 4 more in this window, over both replicas.
    results = run_sequential([e.url for e in envoys], 8, tenant=tenant)
    assert tally(results) == Tally({200: 4, 429: 4}), harness.summary(results)

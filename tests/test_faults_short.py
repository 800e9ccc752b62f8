"""The faults of `make bench`'s faults scenario (bench/faults.py), in a
short form: each case once, against real Envoys, the selected rate-limit
service (envoyproxy/ratelimit, or the counter with `--service counter`)
and real Redis, asserting the behaviour docs/failures.md and
docs/scaling.md promise for it. Outcomes are counted, never timed.

  - Redis 100 ms slower (Toxiproxy between the service and Redis) than a
    20 ms `timeout_ms`: each request gets `on_failure` (allow, deny, or the
    local share), counted; the breaker opens; once the latency is gone a
    probe closes it.
  - The same latency in lease and sync mode: an Envoy spends the lease it
    holds, or admits up to `max_unsynced` more, then fails open, counted.
  - A Redis Cluster primary killed under load: requests fail open, counted,
    until the service reaches the promoted replica; then exact again.
  - The fleet grown from 2 to 4 Envoys and shrunk back, the service up:
    exactly the limit over the whole window.
  - The same with the service down and `on_failure: "local"`: each Envoy
    holds its share of the limit (`fallback_share`): with the counter, 1/N
    of it, N the fleet's size it last heard (4 Envoys having heard 4 admit
    about the limit together, not twice it); with envoyproxy/ratelimit,
    `1 / fallback.envoys` whatever the fleet's size.
"""

from __future__ import annotations

from collections import Counter

import pytest

import cluster as cl
import harness
from faults import Traffic, answered, answered_by_service, check_accounting, delta, failed_open
from harness import (COUNTING_TIMEOUT_MS, ensure_window_room, run_concurrent, run_sequential,
                     tally, unique, wait_until)

RECOVERY_S = 60.0


def limits(per_hour: int) -> dict:
    return {"x-tenant-id": {"default": {"perhour": per_hour}}}


def fallback_share(service: str, limit: int, configured_envoys: int, heard_envoys: int) -> int:
    """What one Envoy admits of a tenant it never heard of, the service down,
    `on_failure: "local"` (docs/failures.md, "The local fallback"): with the
    counter, 1/N of the limit, N the fleet's size the Envoy last heard from
    it ("The fallback share follows the fleet"); with envoyproxy/ratelimit,
    which answers no size, the configured share, `1 / fallback.envoys`,
    however many Envoys are live."""
    if service == "counter":
        return limit // heard_envoys
    return limit // configured_envoys


def fleet_heard(envoys: list[harness.Envoy]) -> list[int]:
    """The fleet's size each Envoy holds (its gauge; 0: none heard)."""
    return [e.filter_counters().get("fleet_envoys", 0) for e in envoys]


def hear_fleet(envoys: list[harness.Envoy], n: int) -> None:
    """Requests through every Envoy (a new tenant each time: every request
    a call) until each holds `n` as the fleet's size."""
    def heard() -> bool:
        for e in envoys:
            harness.send(e.url, unique("warm"))
        return fleet_heard(envoys) == [n] * len(envoys)

    wait_until(heard, f"{len(envoys)} Envoys hear a fleet of {n}", RECOVERY_S)


def breaker(envoy: harness.Envoy, name: str) -> int:
    return envoy.filter_counters().get(name, 0)


# ------------------------------------------------------------ Redis latency

SLOW_QUOTA = 10
SLOW_TIMEOUT_MS = 20
SLOW_LATENCY_MS = 100
SLOW_REQUESTS = 15  # per Envoy: more than the breaker's 5 failures in a row
POLICIES = {
    "allow": {},
    "deny": {"on_failure": "deny", "status_on_error": 503},
    "local": {"on_failure": "local", "fallback": {"envoys": 1}},
}


def test_redis_slower_than_the_timeout_gives_on_failure_and_opens_the_breaker(stack):
    gen = stack.generate(limits(SLOW_QUOTA), timeout_ms=SLOW_TIMEOUT_MS)
    redis = stack.redis()
    toxi = harness.Toxiproxy(stack)
    link = toxi.proxy("redis", redis.port)
    rls = stack.ratelimit(redis, gen, extra_env={"REDIS_URL": link.address})
    upstream = stack.upstream()
    envoys = {p: stack.envoy(gen.plugin_config(**cfg), rls, upstream, name=f"envoy-{p}")
              for p, cfg in POLICIES.items()}
    fleet = harness.Fleet(gen, redis, rls, upstream, list(envoys.values()))
    ensure_window_room(3600, 120)
    wait_until(lambda: answered_by_service(fleet), "the service answers each Envoy", RECOVERY_S)
    if stack.service == "counter":
        # The three Envoys call for one domain: each hears a fleet of 3.
        hear_fleet(list(envoys.values()), len(envoys))
    (heard,) = fleet_heard([envoys["local"]])
    share = fallback_share(stack.service, SLOW_QUOTA, 1, heard)
    before = {p: e.filter_counters() for p, e in envoys.items()}

    link.latency(SLOW_LATENCY_MS)
    got = {p: run_sequential([e.url], SLOW_REQUESTS, tenant=unique(f"slow-{p}"))
           for p, e in envoys.items()}
    counted = {p: delta(Counter(e.filter_counters()), Counter(before[p]))
               for p, e in envoys.items()}
    link.clear()

    n = SLOW_REQUESTS
    # allow: every request passes, unlimited, counted as failed open.
    assert all(failed_open(r) for r in got["allow"]), harness.summary(got["allow"])
    assert counted["allow"]["failure_mode_allowed"] == n, dict(counted["allow"])
    # deny: every request gets status_on_error.
    assert tally(got["deny"]) == Counter({503: n}), harness.summary(got["deny"])
    assert counted["deny"]["failure_mode_denied"] == n, dict(counted["deny"])
    # local: the Envoy's share (`fallback_share`: with envoyproxy/ratelimit
    # the whole limit, fallback.envoys 1; with the counter a third, the
    # fleet it heard), then 429 with Retry-After.
    statuses = [r.status for r in got["local"]]
    assert statuses == [200] * share + [429] * (n - share), harness.summary(got["local"])
    assert all("retry-after" in r.headers for r in got["local"] if r.status == 429)
    assert counted["local"]["fallback_allowed"] == share, dict(counted["local"])
    assert counted["local"]["fallback_over_limit"] == n - share, dict(counted["local"])
    for p, c in counted.items():
        # Every request undecided: a failed call or none (the breaker open).
        assert c["rls_error"] + c["breaker_skipped"] == n, (p, dict(c))
        assert c["breaker_opened"] >= 1 and c["breaker_skipped"] >= 1, (p, dict(c))

    # The latency gone: a probe closes each breaker, the service decides again.
    wait_until(lambda: answered_by_service(fleet), "the service answers again", RECOVERY_S)
    wait_until(lambda: all(breaker(e, "breaker_closed") >= 1 for e in envoys.values()),
               "every breaker closed", RECOVERY_S)


MODE_QUOTA = 600  # per minute
MODE_TIMEOUT_MS = 50
MODE_LATENCY_MS = 200
MAX_UNSYNCED = 50
MODE_LOCAL = {
    "lease": {"enabled": True, "mode": "lease", "lease": {"max_batch": 50}},
    "sync": {"enabled": True, "mode": "sync",
             "sync": {"interval_ms": 100, "max_unsynced": MAX_UNSYNCED}},
}


def group_counters(fleet: harness.EnvoysView, group: str = "default") -> Counter:
    prefix = f"group.{group}."
    return Counter({k[len(prefix):]: v for k, v in fleet.counters().items()
                    if k.startswith(prefix)})


@pytest.mark.parametrize("mode", ["lease", "sync"])
def test_redis_slower_than_the_timeout_lease_and_sync_spend_what_they_hold_then_fail_open(
        stack, mode):
    gen = stack.generate({"x-tenant-id": {"default": {"perminute": MODE_QUOTA}}},
                         timeout_ms=MODE_TIMEOUT_MS)
    redis = stack.redis()
    link = harness.Toxiproxy(stack).proxy("redis", redis.port)
    rls = stack.ratelimit(redis, gen, extra_env={"REDIS_URL": link.address})
    upstream = stack.upstream()
    cfg = gen.plugin_config(local=MODE_LOCAL[mode])
    envoys = [stack.envoy(cfg, rls, upstream, name=f"envoy-{i + 1}") for i in range(2)]
    fleet = harness.Fleet(gen, redis, rls, upstream, envoys)
    ensure_window_room(60, 40)
    tenant = unique(mode)
    # The service up: leases taken, hits synced (a late call fails open, counted).
    warm = run_concurrent(fleet.urls, 150, clients=8, tenant=tenant)
    assert tally(warm) == Counter({200: 150}), harness.summary(warm)
    before = group_counters(fleet)

    link.latency(MODE_LATENCY_MS)
    slow = run_concurrent(fleet.urls, 300, clients=8, tenant=tenant)
    after = group_counters(fleet)
    link.clear()
    assert tally(slow) == Counter({200: 300}), harness.summary(slow)
    failed_open = after["failed_open"] - before["failed_open"]
    assert failed_open > 0, (dict(before), dict(after))
    if mode == "lease":
        # What is left of the leases, then each request fails open.
        spent = after["lease.spent"] - before["lease.spent"]
        assert spent + failed_open == 300, (dict(before), dict(after))
        assert after["lease.failed"] > before["lease.failed"], dict(after)
    else:
        # Up to max_unsynced more per Envoy locally, then each request fails open.
        local = after["sync.local"] - before["sync.local"]
        assert local + failed_open == 300, (dict(before), dict(after))
        assert local <= len(envoys) * MAX_UNSYNCED, dict(after)


# ------------------------------------------------------------ a primary killed

PRIMARY_QUOTA = 40
PRIMARY_TIMEOUT_MS = 300  # a live service answers in time here; a dead master costs little


def cluster_fleet(stack, gen: harness.Generated) -> tuple:
    """A Redis Cluster (3 primaries, a replica each), one service on it
    (envoyproxy/ratelimit or the counter), an upstream and 2 Envoys; and
    the key of a tenant's hour counter for that service."""
    cluster = cl.RedisCluster.start(stack)
    if stack.service == "counter":
        import counter

        rls = counter.Counter(stack, {gen.domain: gen.limits},
                              store="redis-cluster://" + cluster.url,
                              store_timeout_ms=PRIMARY_TIMEOUT_MS)

        def key(tenant: str) -> str:
            return harness.counter_key(gen.domain, "hour", tenant)
    else:
        (rls,) = cl.services(stack, gen, 1, cl.service_env(cluster=cluster))

        def key(tenant: str) -> str:
            return harness.redis_key(gen.domain, "hour", tenant)
    upstream = stack.upstream()
    cfg = gen.plugin_config()
    envoys = [stack.envoy(cfg, rls, upstream, name=f"envoy-{i + 1}") for i in range(2)]
    return cluster, harness.Fleet(gen, None, rls, upstream, envoys), key


def test_a_killed_primary_fails_open_counted_then_counts_exactly_on_the_replica(stack):
    gen = stack.generate(limits(PRIMARY_QUOTA), timeout_ms=PRIMARY_TIMEOUT_MS)
    cluster, fleet, key = cluster_fleet(stack, gen)
    ensure_window_room(3600, 180)
    tenant = unique("primary")
    master = cluster.master_of(key(tenant))
    (replica,) = cluster.replicas_of(master)

    used = PRIMARY_QUOTA // 2
    first = run_sequential(fleet.urls, used, tenant=tenant)
    assert all(answered(r) and r.status == 200 for r in first), harness.summary(first)
    before = fleet.counters()

    cluster.kill(master)
    traffic = Traffic(lambda: fleet.urls, lambda i: tenant, clients=2, pace_s=0.01)
    try:
        # Promised during the failover: the request passes, counted.
        traffic.wait_for(failed_open, 1, "requests fail open while the primary is down")
        cluster.wait_failover(master, replica)
        mark = len(traffic)
        traffic.wait_for(answered, 5, "the service answers from the promoted replica",
                         since=mark, deadline_s=RECOVERY_S)
    finally:
        results = traffic.stop()
    figures = check_accounting(results, delta(fleet.counters(), before))
    assert figures["failed_open"] >= 1, figures

    # After: a tenant whose counter the promoted replica holds gets exactly its limit.
    for _ in range(1000):
        after = unique("after")
        if cluster.master_of(key(after)) is replica:
            break
    wait_until(lambda: answered_by_service(fleet), "each Envoy answered by the service",
               RECOVERY_S)
    rest = run_sequential(fleet.urls, PRIMARY_QUOTA + 3, tenant=after)
    assert [r.status for r in rest] == [200] * PRIMARY_QUOTA + [429] * 3, harness.summary(rest)
    assert all(answered(r) for r in rest), harness.summary(rest)
    assert cluster.get_int(key(after)) is not None
    # Calls that hang on the dead primary keep a graceful stop waiting.
    fleet.ratelimit.process.stop(deadline_s=2.0)


# ------------------------------------------------------------ the fleet resized

FLEET_QUOTA = 40


def test_the_fleet_grown_from_2_to_4_and_shrunk_back_with_the_service_up_stays_exact(stack):
    fleet = stack.fleet(limits(FLEET_QUOTA), envoys=2, timeout_ms=COUNTING_TIMEOUT_MS)
    ensure_window_room(3600, 120)
    tenant = unique("grow")
    before = fleet.counters()
    first = run_sequential(fleet.urls, 10, tenant=tenant)
    assert tally(first) == Counter({200: 10}), harness.summary(first)

    cfg = fleet.generated.plugin_config(timeout_ms=COUNTING_TIMEOUT_MS)
    grown = [stack.envoy(cfg, fleet.ratelimit, fleet.upstream, name=f"envoy-{n}")
             for n in (3, 4)]
    fleet.envoys += grown
    wide = run_concurrent(fleet.urls, 60, clients=8, tenant=tenant)
    assert {r.target for r in wide if answered(r)} == {0, 1, 2, 3}, harness.summary(wide)
    counted = delta(fleet.counters(), before)

    for e in grown:
        e.stop()
        fleet.envoys.remove(e)
    late = run_sequential(fleet.urls, 6, tenant=tenant)

    every = first + wide + late
    assert tally(every) == Counter({200: FLEET_QUOTA, 429: len(every) - FLEET_QUOTA}), (
        harness.summary(every))
    assert all(answered(r) for r in every), harness.summary(every)
    assert counted["failure_mode_allowed"] == 0, dict(counted)


FALLBACK_QUOTA = 20
FALLBACK_ENVOYS = 2


def test_the_fleet_grown_and_shrunk_with_the_service_down_each_envoy_holds_its_share(stack):
    fleet = stack.fleet(limits(FALLBACK_QUOTA), envoys=FALLBACK_ENVOYS,
                        timeout_ms=COUNTING_TIMEOUT_MS, on_failure="local",
                        fallback={"envoys": FALLBACK_ENVOYS})
    ensure_window_room(3600, 120)
    cfg = fleet.generated.plugin_config(timeout_ms=COUNTING_TIMEOUT_MS, on_failure="local",
                                        fallback={"envoys": FALLBACK_ENVOYS})
    grown = [stack.envoy(cfg, fleet.ratelimit, fleet.upstream, name=f"envoy-{n}")
             for n in (3, 4)]
    fleet.envoys += grown
    wait_until(lambda: answered_by_service(fleet), "every Envoy heard the service", RECOVERY_S)
    if stack.service == "counter":
        # Each Envoy hears the fleet's size from the counter's answers.
        hear_fleet(fleet.envoys, 4)
    else:
        # envoyproxy/ratelimit answers no size: none is ever heard.
        assert fleet_heard(fleet.envoys) == [0] * 4
    heard = fleet_heard(fleet.envoys)
    before = fleet.counters()

    fleet.ratelimit.stop()
    try:
        def flood(prefix: str) -> dict[int, int]:
            """A fresh tenant, its share and 3 more sent to each Envoy: admitted per Envoy."""
            tenant = unique(prefix)
            share = fallback_share(stack.service, FALLBACK_QUOTA, FALLBACK_ENVOYS, 4)
            out = {}
            for i, e in enumerate(fleet.envoys):
                got = run_sequential([e.url], share + 3, tenant=tenant)
                assert set(tally(got)) <= {200, 429}, harness.summary(got)
                out[i] = tally(got)[200]
            return out

        wide = flood("down-4")
        counted = delta(fleet.counters(), before)
        for e in grown:
            e.stop()
            fleet.envoys.remove(e)
        narrow = flood("down-2")
        # The service down, the size an Envoy holds does not change: the
        # two left still hold what they heard (docs/failures.md, the bound:
        # an Envoy stopped within the interval is still counted).
        still = fleet_heard(fleet.envoys)
    finally:
        fleet.ratelimit.start()

    share = fallback_share(stack.service, FALLBACK_QUOTA, FALLBACK_ENVOYS, 4)
    assert wide == {i: share for i in range(4)}, wide
    assert narrow == {i: share for i in range(2)}, narrow
    assert still == heard[:2], (heard, still)
    if stack.service == "counter":
        # The share follows the fleet: 4 Envoys admit the limit, not twice it.
        assert sum(wide.values()) == FALLBACK_QUOTA, wide
    else:
        # The configured share: 4 Envoys with fallback.envoys 2, twice the limit.
        assert sum(wide.values()) == 2 * FALLBACK_QUOTA, wide
    assert counted["failure_mode_allowed"] == 0, dict(counted)
    print(f"\nservice down ({stack.service}), fallback.envoys {FALLBACK_ENVOYS}, limit "
          f"{FALLBACK_QUOTA}, fleet heard {heard}: 4 Envoys admitted {sum(wide.values())}, "
          f"2 Envoys {sum(narrow.values())}")

"""The local fallback's share follows the fleet (real Envoys, ratelimit-counter
on Redis, loopback): every Envoy names itself in its calls, the counter
answers how many Envoys called for the domain within its interval, and each
Envoy's fallback gives a tenant 1/N of its limits, N that size, whatever
`fallback.envoys` says (it only holds until a size is heard).

Two Envoys configured with `fallback.envoys: 2`, then four more: each hears
6 (its `fleet_envoys` gauge); the counter stopped, a tenant flooding all six
is admitted near its quota in total, not three times it. Back to two Envoys
(the counter up again, its interval passed): each hears 2, and with the
counter stopped again each admits half of what is left.

Two counter replicas on one Redis: each answers the Envoys of both.

Per-hour quotas, inside one hour (`ensure_window_room`); nothing here waits
on a clock but that: every wait is on a metric. What is asserted is counted;
the figures are printed (`-s`)."""

from __future__ import annotations

from collections import Counter as Tally

import harness
from counter import Counter
from faults import report
from harness import ensure_window_room, run_concurrent, run_sequential, send, tally, unique, wait_until

QUOTA = 300
LIMITS = {"x-tenant-id": {"default": {"perhour": QUOTA}}}
# The counter's fleet interval: short, so that the Envoys stopped leave the
# count within seconds.
INTERVAL_MS = 2_000
CONFIGURED_ENVOYS = 2
# The fallback's bound (docs/failures.md): in the window where the outage
# begins, the fleet admits at most what it had left by the answers each
# Envoy last heard for the tenant, each Envoy 1/N of its own; with the
# tenant's requests spread round-robin those differ by a few hits.
SLACK = 0.1
RECOVERY_S = 60.0


def fleet_size(e: harness.Envoy) -> int:
    return e.filter_counters().get("fleet_envoys", 0)


def hear(envoys: list[harness.Envoy], n: int, counter: Counter | list[Counter],
         domain: str) -> None:
    """Requests through every Envoy until each holds `n` as the fleet's
    size (its gauge), and the counter (each replica) counts `n` for the
    domain."""
    replicas = counter if isinstance(counter, list) else [counter]

    def heard() -> bool:
        # A new tenant each time: never refused from the filter's cache,
        # every request a call.
        for e in envoys:
            send(e.url, unique("warm"))
        counted = [c.metrics().get(f'trl_counter_fleet_envoys{{domain="{domain}"}}', 0)
                   for c in replicas]
        return counted == [n] * len(replicas) and all(fleet_size(e) == n for e in envoys)

    wait_until(heard, f"{len(envoys)} Envoys hear a fleet of {n}", RECOVERY_S)


def outage(envoys: list[harness.Envoy], counter: Counter) -> dict:
    """A tenant uses a fifth of its quota through the counter, then the
    counter stops and the tenant floods every Envoy with four times its
    quota: what was admitted, in all and per Envoy."""
    tenant = unique("noisy")
    urls = [e.url for e in envoys]
    used = QUOTA // 5
    first = run_sequential(urls, used, tenant=tenant)
    assert tally(first) == Tally({200: used}), harness.summary(first)
    assert all("x-ratelimit-limit" in r.headers for r in first), harness.summary(first)
    counter.stop()
    flood = run_concurrent(urls, 4 * QUOTA, clients=6, tenant=tenant)
    assert set(tally(flood)) <= {200, 429}, harness.summary(flood)
    per_envoy = Tally(r.target for r in flood if r.status == 200)
    return {"used_before": used, "flood_admitted": tally(flood)[200],
            "admitted_in_window": used + tally(flood)[200],
            "per_envoy": [per_envoy.get(i, 0) for i in range(len(envoys))]}


def test_the_fallback_share_follows_the_fleet_as_it_grows_and_shrinks(stack):
    gen = stack.generate(LIMITS, service="counter")
    redis = stack.redis()
    counter = Counter(stack, {gen.domain: LIMITS}, store=redis.url,
                      store_timeout_ms=harness.COUNTING_TIMEOUT_MS,
                      extra_args=["--fleet-interval-ms", str(INTERVAL_MS)])
    cfg = gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS, on_failure="local",
                            fallback={"envoys": CONFIGURED_ENVOYS})
    upstream = stack.upstream()

    def envoy(i: int) -> harness.Envoy:
        return stack.envoy(cfg, counter.grpc_port, upstream, name=f"envoy-{i + 1}")

    ensure_window_room(3600, 300)
    envoys = [envoy(i) for i in range(2)]
    hear(envoys, 2, counter, gen.domain)
    # Four more: each worker of each Envoy names the same Envoy, so the
    # counter counts 6 Envoys, not 12 workers.
    envoys += [envoy(i) for i in range(2, 6)]
    hear(envoys, 6, counter, gen.domain)

    grown = outage(envoys, counter)
    report(f"6 Envoys, fallback.envoys: {CONFIGURED_ENVOYS}, counter stopped", {
        "quota_per_hour": QUOTA, **grown,
        "static_share_would_admit": grown["used_before"]
        + 6 * ((QUOTA - grown["used_before"]) // CONFIGURED_ENVOYS)})
    # Near the quota in total, not 3 times what was left.
    total = grown["admitted_in_window"]
    assert QUOTA * (1 - SLACK) <= total <= QUOTA * (1 + SLACK), grown
    # Each Envoy about a sixth of what was left.
    sixth = (QUOTA - grown["used_before"]) / 6
    assert all(sixth * (1 - SLACK) - 1 <= n <= sixth * (1 + SLACK) + 1
               for n in grown["per_envoy"]), grown

    # Back to two Envoys; the counter up again: once its interval has
    # passed, it counts two, and the two hear it.
    for e in envoys[2:]:
        e.stop()
    envoys = envoys[:2]
    counter.start()
    hear(envoys, 2, counter, gen.domain)

    shrunk = outage(envoys, counter)
    report("back to 2 Envoys, counter stopped again", {"quota_per_hour": QUOTA, **shrunk})
    total = shrunk["admitted_in_window"]
    assert QUOTA * (1 - SLACK) <= total <= QUOTA * (1 + SLACK), shrunk
    half = (QUOTA - shrunk["used_before"]) / 2
    assert all(half * (1 - SLACK) - 1 <= n <= half * (1 + SLACK) + 1
               for n in shrunk["per_envoy"]), shrunk


def test_counter_replicas_on_one_redis_count_each_others_envoys(stack):
    """Two counter replicas sharing Redis, two Envoys calling each: every
    Envoy hears a fleet of 4, not the 2 its replica sees."""
    gen = stack.generate(LIMITS, service="counter")
    redis = stack.redis()
    replicas = [Counter(stack, {gen.domain: LIMITS}, store=redis.url, name=f"counter-{i + 1}",
                        store_timeout_ms=harness.COUNTING_TIMEOUT_MS,
                        extra_args=["--fleet-interval-ms", str(INTERVAL_MS)])
                for i in range(2)]
    cfg = gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS, on_failure="local",
                            fallback={"envoys": 1})
    upstream = stack.upstream()
    envoys = [stack.envoy(cfg, replicas[i // 2].grpc_port, upstream, name=f"envoy-{i + 1}")
              for i in range(4)]
    hear(envoys, 4, replicas, gen.domain)

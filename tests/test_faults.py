"""Faults against the real stack, under traffic: Redis killed and restarted
(with and without the shipped persistence), Redis slowed, the service
restarted, the service frozen and thawed again and again, two Envoys added
mid-window. Each asserts no 5xx, no request lost, every failure counted (the
filter's counters; tests/faults.py check_accounting), and that limiting comes
back by itself, exactly, when the fault ends."""

from __future__ import annotations

from collections import Counter

import harness
from delayproxy import DelayProxy
from faults import (Traffic, answered, check_accounting, delta, failed_open, fresh_tenants, probe,
                    report)
from harness import ensure_window_room, run_concurrent, run_sequential, tally, unique

QUOTA = 20
LIMITS = {"x-tenant-id": {"default": {"perhour": QUOTA}}}
# Long enough that a live service always answers in time on this loaded
# machine, short enough that a fault costs each request little.
TIMEOUT_MS = 300
# A request is answered within the gRPC timeout plus this much (behaviour
# bound, generous for a shared 2-core machine; not a timing benchmark).
MARGIN_S = 2.0
RECOVERY_S = 60.0


class Probes:
    """Requests a test sends outside its Traffic, so the accounting can include them."""

    def __init__(self, fleet: harness.Fleet):
        self.fleet = fleet
        self.sent = 0

    def service_answers(self) -> bool:
        """One request per Envoy, each with the service's verdict (x-ratelimit-* back)."""
        ok = True
        for url in self.fleet.urls:
            self.sent += 1
            ok = probe(url) and ok
        return ok

    def wait_service_answers(self, what: str) -> None:
        harness.wait_until(self.service_answers, what, RECOVERY_S)

    def exact_quota(self) -> list[int]:
        """A fresh tenant gets exactly QUOTA 200s, then 429s, from the service."""
        results = run_sequential(self.fleet.urls, QUOTA + 3, tenant=unique("after"))
        self.sent += len(results)
        statuses = [r.status for r in results]
        assert statuses == [200] * QUOTA + [429] * 3, harness.summary(results)
        assert all(answered(r) for r in results), harness.summary(results)
        return statuses


def outage_figures(results: list[harness.Result]) -> dict:
    """How long requests failed open for, and what each cost (ms)."""
    opened = [r for r in results if failed_open(r)]
    if not opened:
        return {}
    first = min(r.started for r in opened)
    last = max(r.started + r.latency_s for r in opened)
    lat = sorted(r.latency_s * 1000 for r in opened)
    return {"fail_open_span_s": round(last - first, 2),
            "fail_open_ms_min": round(lat[0], 1), "fail_open_ms_max": round(lat[-1], 1)}


def under_traffic_through(traffic: Traffic, probes: Probes, down: str, stop, start,
                          back: str) -> list[harness.Result]:
    """With `traffic` answered by the service: `stop()` until requests fail
    open (`down` says what is down), `start()` again, wait until the probes
    (`back`) and then the traffic are answered by the service again. The
    traffic's results, once it stopped."""
    try:
        traffic.wait_for(answered, 10, "traffic answered by the service")
        stop()
        mark = len(traffic)
        traffic.wait_for(failed_open, 10, f"requests fail open while {down} is down", since=mark)
        start()
        probes.wait_service_answers(back)
        mark = len(traffic)
        traffic.wait_for(answered, 10, "traffic answered again", since=mark)
    finally:
        results = traffic.stop()
    return results


def _redis_outage(stack, persist: bool) -> dict:
    fleet = stack.fleet(LIMITS, envoys=2, timeout_ms=TIMEOUT_MS, redis_persist=persist)
    ensure_window_room(3600, 240)
    probes = Probes(fleet)
    before = fleet.counters()

    # A tenant uses part of its quota before the outage.
    tenant = unique("steady")
    used = QUOTA // 2 + 2
    first = run_sequential(fleet.urls, used, tenant=tenant)
    assert tally(first) == Counter({200: used}), harness.summary(first)
    probes.sent += used

    traffic = Traffic(lambda: fleet.urls, fresh_tenants("outage"), clients=2)
    # Nothing restarts the service or Envoy: limits come back by themselves.
    results = under_traffic_through(traffic, probes, "Redis", fleet.redis.kill, fleet.redis.start,
                                    "the service answers again after Redis restarted")
    if stack.service == "counter":
        # The counter counted the calls Redis failed.
        assert fleet.ratelimit.metrics()["trl_counter_store_errors_total"] >= 1

    rest = run_sequential(fleet.urls, QUOTA + 5, tenant=tenant)
    probes.sent += len(rest)
    admitted_after = tally(rest)[200]
    probes.exact_quota()
    figures = check_accounting(results, delta(fleet.counters(), before), others=probes.sent)
    slow = [r for r in results if r.latency_s > TIMEOUT_MS / 1000 + MARGIN_S]
    assert not slow, harness.summary(slow)
    figures.update(outage_figures(results))
    figures["steady_tenant_admitted_after_restart"] = admitted_after
    figures["steady_tenant_total"] = used + admitted_after
    return figures


def test_redis_killed_and_restarted_with_persistence_keeps_the_counts(stack):
    figures = _redis_outage(stack, persist=True)
    report("redis SIGKILL + restart, appendonly everysec", figures)
    # The counter survived: the tenant gets only what was left of its quota.
    assert figures["steady_tenant_total"] == QUOTA, figures


def test_redis_killed_and_restarted_without_persistence_starts_the_window_again(stack):
    figures = _redis_outage(stack, persist=False)
    report("redis SIGKILL + restart, no persistence", figures)
    # What persistence prevents: the count is gone, a whole quota again.
    assert figures["steady_tenant_admitted_after_restart"] == QUOTA, figures


def test_slow_redis_within_the_timeout_costs_latency_not_accuracy(stack):
    timeout_ms = 1000
    gen = stack.generate(LIMITS, timeout_ms=timeout_ms)
    redis = stack.redis()
    proxy = DelayProxy(redis.port)
    try:
        rls = stack.ratelimit(redis, gen,
                              extra_env={"REDIS_URL": f"{harness.LOOPBACK}:{proxy.port}"})
        upstream = stack.upstream()
        # The breaker off: every late call waits for its timeout.
        cfg = gen.plugin_config(breaker={"enabled": False})
        envoys = [stack.envoy(cfg, rls, upstream, name=f"envoy-{i + 1}") for i in range(2)]
        fleet = harness.Fleet(gen, redis, rls, upstream, envoys)
        ensure_window_room(3600, 180)
        probes = Probes(fleet)
        before = fleet.counters()

        # 50 ms each way: a Redis round trip of 100 ms or more, well inside 1 s.
        proxy.delay_s = 0.05
        chunks = proxy.chunks
        slow = run_concurrent(fleet.urls, QUOTA * 3, clients=4, tenant=unique("slow"))
        assert tally(slow) == Counter({200: QUOTA, 429: QUOTA * 2}), harness.summary(slow)
        assert proxy.chunks > chunks
        for r in slow:
            assert r.latency_s < timeout_ms / 1000 + MARGIN_S, harness.summary(slow)
            if r.status == 200:  # the admitted ones took the slow path, each
                assert r.latency_s >= 2 * proxy.delay_s, harness.summary(slow)

        # Slower than the timeout: requests fail open after timeout_ms, counted.
        proxy.delay_s = 0.6
        late = run_sequential(fleet.urls, 6, tenant=unique("late"))
        for r in late:
            assert failed_open(r), harness.summary(late)
            assert timeout_ms / 1000 - 0.005 <= r.latency_s < timeout_ms / 1000 + MARGIN_S, (
                harness.summary(late))

        proxy.delay_s = 0.0
        probes.wait_service_answers("the service answers in time again")
        probes.exact_quota()
        figures = check_accounting(slow + late, delta(fleet.counters(), before),
                                   others=probes.sent)
        figures.update(outage_figures(late))
        figures["admitted_ms_at_50ms_each_way"] = sorted(
            round(r.latency_s * 1000) for r in slow if r.status == 200)[::5]
        report("redis slowed by a delay proxy", figures)
        assert figures["failed_open"] == len(late), figures
    finally:
        proxy.close()


def test_service_restarted_under_traffic(stack):
    fleet = stack.fleet(LIMITS, envoys=2, timeout_ms=TIMEOUT_MS)
    ensure_window_room(3600, 180)
    probes = Probes(fleet)
    before = fleet.counters()
    traffic = Traffic(lambda: fleet.urls, fresh_tenants("restart"), clients=2)
    results = under_traffic_through(traffic, probes, "the service", fleet.ratelimit.stop,
                                    fleet.ratelimit.start, "Envoys reach the restarted service")
    probes.exact_quota()
    figures = check_accounting(results, delta(fleet.counters(), before), others=probes.sent)
    figures.update(outage_figures(results))
    report("service restarted", figures)
    assert figures["failed_open"] >= 10, figures
    slow = [r for r in results if r.latency_s > TIMEOUT_MS / 1000 + MARGIN_S]
    assert not slow, harness.summary(slow)


def test_service_frozen_and_thawed_repeatedly(stack):
    fleet = stack.fleet(LIMITS, envoys=2, timeout_ms=TIMEOUT_MS)
    ensure_window_room(3600, 180)
    probes = Probes(fleet)
    before = fleet.counters()
    traffic = Traffic(lambda: fleet.urls, fresh_tenants("freeze"), clients=4)
    cycles = 4
    try:
        traffic.wait_for(answered, 10, "traffic answered by the service")
        for cycle in range(cycles):
            fleet.ratelimit.freeze()
            try:
                mark = len(traffic)
                traffic.wait_for(failed_open, 4, f"freeze {cycle + 1}: requests fail open",
                                 since=mark)
            finally:
                fleet.ratelimit.thaw()
            mark = len(traffic)
            traffic.wait_for(answered, 4, f"thaw {cycle + 1}: answered again", since=mark)
    finally:
        results = traffic.stop()
    probes.exact_quota()
    figures = check_accounting(results, delta(fleet.counters(), before), others=probes.sent)
    figures.update(outage_figures(results))
    report(f"service frozen and thawed {cycles} times", figures)
    assert figures["failed_open"] >= 4 * cycles, figures
    slow = [r for r in results if r.latency_s > TIMEOUT_MS / 1000 + MARGIN_S]
    assert not slow, harness.summary(slow)


def test_a_fourth_and_fifth_envoy_added_mid_window_keep_exactly_n(stack):
    quota = 200
    limits = {"x-tenant-id": {"default": {"perhour": quota}}}
    fleet = stack.fleet(limits, envoys=3, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    ensure_window_room(3600, 240)
    before = fleet.counters()
    tenant = unique("five")

    first = run_sequential(fleet.urls, 60, tenant=tenant)
    assert tally(first) == Counter({200: 60}), harness.summary(first)

    # Other tenants keep the fleet busy while the new Envoys start and join.
    urls = list(fleet.urls)
    traffic = Traffic(lambda: urls, fresh_tenants("busy"), clients=2)
    try:
        cfg = fleet.generated.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS)
        for n in (4, 5):
            e = stack.envoy(cfg, fleet.ratelimit, fleet.upstream, name=f"envoy-{n}")
            fleet.envoys.append(e)
            urls.append(e.url)
        mark = len(traffic)
        traffic.wait_for(lambda r: r.target >= 3, 10, "traffic reaches the new Envoys",
                         since=mark)
        rest = run_concurrent(fleet.urls, 1000, clients=20, tenant=tenant)
    finally:
        busy = traffic.stop()

    every = first + rest
    assert tally(every)[200] == quota, harness.summary(every)
    assert set(tally(every)) == {200, 429}, harness.summary(every)
    new_admitted = Counter(r.target for r in rest if r.status == 200)
    assert new_admitted[3] + new_admitted[4] > 0, new_admitted
    again = run_sequential(fleet.urls, 10, tenant=tenant)
    assert tally(again) == Counter({429: 10}), harness.summary(again)

    figures = check_accounting(busy + every + again, delta(fleet.counters(), before))
    assert figures["failed_open"] == 0, figures
    report("two Envoys added mid-window", {**figures, "admitted_per_envoy": dict(
        sorted(Counter(r.target + 1 for r in every if r.status == 200).items()))})

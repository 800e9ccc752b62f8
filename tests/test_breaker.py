"""The breaker and the fallback against the real stack (real Envoy,
envoyproxy/ratelimit, Redis): the breaker opens under a stopped service,
a frozen one and a dead Redis, answers every request at once while open,
probes, and closes by itself when the service answers again, the counts
exact again; `on_failure: "local"` holds a tenant sending ten times its
quota to the fleet's share of it, and the learned share keeps a tenant
pinned to one Envoy at its quota there.

No assertion here is a timing: the latencies are printed (`-s`) as the
figures of the failure page; what is asserted is counted."""

from __future__ import annotations

import json
import statistics
from collections import Counter

import harness
from faults import (Traffic, answered, answered_by_service, check_accounting, delta, failed_open,
                    fresh_tenants, report)
from harness import ensure_window_room, run_concurrent, run_sequential, tally, unique, wait_until

QUOTA = 30
LIMITS = {"x-tenant-id": {"default": {"perhour": QUOTA}}}
TIMEOUT_MS = 300
# The defaults: 5 failed calls in a row open it, one probe a second.
FAILURES = 5
RECOVERY_S = 60.0


def latency_ms(results: list[harness.Result]) -> dict:
    lat = [r.latency_s * 1000 for r in results]
    if not lat:
        return {}
    return {"n": len(lat), "median_ms": round(statistics.median(lat), 2),
            "p99_ms": round(harness.percentile(lat, 99), 2)}


def assert_exact(fleet: harness.Fleet, quota: int) -> None:
    """A fresh tenant gets exactly `quota` 200s, then 429s, from the service."""
    results = run_sequential(fleet.urls, quota + 3, tenant=unique("exact"))
    assert [r.status for r in results] == [200] * quota + [429] * 3, harness.summary(results)
    assert all(answered(r) for r in results), (
        harness.summary(results),
        [(i, r.status, round(r.latency_s * 1000, 1), r.headers)
         for i, r in enumerate(results) if not answered(r)])


def breaker_closed_everywhere(fleet: harness.Fleet) -> bool:
    return all(e.filter_counters().get("breaker_open", 0) == 0 for e in fleet.envoys)


def _outage(stack, fault: str) -> None:
    fleet = stack.fleet(LIMITS, envoys=1, timeout_ms=TIMEOUT_MS)
    ensure_window_room(3600, 120)
    assert_exact(fleet, QUOTA)
    before = fleet.counters()
    n = 40
    stop, restart = {
        "stopped": (fleet.ratelimit.stop, fleet.ratelimit.start),
        "frozen": (fleet.ratelimit.freeze, fleet.ratelimit.thaw),
    }[fault]
    stop()
    try:
        down = run_sequential(fleet.urls, n, tenant=unique(fault))
        opened = delta(fleet.counters(), before)
    finally:
        restart()
    assert tally(down) == Counter({200: n}), harness.summary(down)
    assert all(failed_open(r) for r in down), harness.summary(down)
    # Five calls failed (each waited for its failure), then it opened: the
    # rest were answered without a call, but for the probes.
    assert opened["breaker_opened"] == 1, dict(opened)
    assert opened["breaker_open"] == 1, dict(opened)
    # (A worker that had not read the breaker for 100 ms may still send one.)
    assert opened["rls_error"] >= FAILURES, dict(opened)
    assert opened["breaker_skipped"] == n - opened["rls_error"], dict(opened)
    assert opened["breaker_skipped"] >= n - 2 * FAILURES - opened["breaker_probes"], dict(opened)
    assert opened["failure_mode_allowed"] == n, dict(opened)
    calls = down[:FAILURES]
    skipped = down[FAILURES:]

    wait_until(lambda: answered_by_service(fleet), "a probe closes the breaker", RECOVERY_S)
    after = delta(fleet.counters(), before)
    assert after["breaker_closed"] == 1, dict(after)
    assert after["breaker_open"] == 0, dict(after)
    assert after["breaker_open_ms"] > 0, dict(after)
    assert_exact(fleet, QUOTA)
    report(f"service {fault}, breaker on, {TIMEOUT_MS} ms timeout", {
        "before_open": latency_ms(calls), "while_open": latency_ms(skipped),
        "counters": {k: v for k, v in after.items() if v}})


def test_a_stopped_service_opens_the_breaker_and_a_probe_closes_it(stack):
    _outage(stack, "stopped")


def test_a_frozen_service_opens_the_breaker_and_a_probe_closes_it(stack):
    _outage(stack, "frozen")


def _redis_down(stack, timeout_ms: int, breaker: bool) -> dict:
    """8 clients for a while with Redis up, then while it is down; what each cost."""
    overrides = {} if breaker else {"breaker": {"enabled": False}}
    fleet = stack.fleet(LIMITS, envoys=2, timeout_ms=timeout_ms, **overrides)
    ensure_window_room(3600, 120)
    before = fleet.counters()
    traffic = Traffic(lambda: fleet.urls, fresh_tenants("redis"), clients=8)
    try:
        traffic.wait_for(answered, 200, "traffic answered by the service")
        healthy = len(traffic)
        fleet.redis.kill()
        mark = len(traffic)
        traffic.wait_for(failed_open, 400 if breaker or timeout_ms < 100 else 100,
                         "requests fail open while Redis is down", since=mark)
    finally:
        results = traffic.stop()
    counted = delta(fleet.counters(), before)
    figures = check_accounting(results, counted)
    if stack.service == "counter":
        # The counter counted the calls Redis failed.
        assert fleet.ratelimit.metrics()["trl_counter_store_errors_total"] >= 1
    fleet.redis.start()
    wait_until(lambda: answered_by_service(fleet), "the service answers again", RECOVERY_S)
    if breaker:
        wait_until(lambda: breaker_closed_everywhere(fleet), "the breakers close", RECOVERY_S)
    assert_exact(fleet, QUOTA)
    down = [r for r in results[mark:] if failed_open(r)]
    figures.update({"healthy": latency_ms([r for r in results[:healthy] if answered(r)]),
                    "redis_down": latency_ms(down)})
    return figures


def test_redis_down_requests_are_answered_at_once_while_the_breaker_is_open(stack):
    for timeout_ms in (20, 300):
        figures = _redis_down(stack, timeout_ms, breaker=True)
        report(f"redis down, 8 clients, {timeout_ms} ms timeout, breaker on", figures)
        counters = figures["counters"]
        assert counters.get("breaker_opened", 0) >= 1, figures
        # Most of the outage was answered without a call.
        assert counters.get("breaker_skipped", 0) >= 0.9 * figures["failed_open"], figures


def test_redis_down_without_the_breaker_every_request_waits(stack):
    for timeout_ms in (20, 300):
        figures = _redis_down(stack, timeout_ms, breaker=False)
        report(f"redis down, 8 clients, {timeout_ms} ms timeout, breaker off", figures)
        counters = figures["counters"]
        assert counters.get("breaker_skipped", 0) == 0, figures
        assert counters["rls_error"] == counters["failure_mode_allowed"], figures


def test_local_holds_a_tenant_at_ten_times_its_quota_to_the_fleets_share(stack):
    envoys = 3
    fleet = stack.fleet(LIMITS, envoys=envoys, timeout_ms=harness.COUNTING_TIMEOUT_MS,
                        on_failure="local", fallback={"envoys": envoys})
    ensure_window_room(3600, 180)
    before = fleet.counters()
    tenant = unique("noisy")
    # The outage begins mid-window: a fifth of the quota is used.
    used = QUOTA // 5
    first = run_sequential(fleet.urls, used, tenant=tenant)
    assert all(answered(r) and r.status == 200 for r in first), harness.summary(first)

    fleet.ratelimit.stop()
    try:
        flood = run_concurrent(fleet.urls, 10 * QUOTA, clients=6, tenant=tenant)
        fresh = run_concurrent(fleet.urls, 10 * QUOTA, clients=6, tenant=unique("fresh"))
        counted = delta(fleet.counters(), before)
    finally:
        fleet.ratelimit.start()
    wait_until(lambda: answered_by_service(fleet), "the service answers again", RECOVERY_S)
    wait_until(lambda: breaker_closed_everywhere(fleet), "the breakers close", RECOVERY_S)
    assert_exact(fleet, QUOTA)

    assert set(tally(flood)) <= {200, 429}, harness.summary(flood)
    admitted = used + tally(flood)[200]
    # Each Envoy started from what the fleet had left by its last answer
    # (a third of it each): the window's total stays within the quota + 10 %.
    assert QUOTA * 0.8 <= admitted <= QUOTA * 1.1, (admitted, harness.summary(flood))
    # A tenant never heard of before the outage: a third of the quota per Envoy.
    fresh_admitted = tally(fresh)[200]
    assert QUOTA * 0.8 <= fresh_admitted <= QUOTA * 1.1, (fresh_admitted, harness.summary(fresh))
    refused = [r for r in flood + fresh if r.status == 429]
    assert all("retry-after" in r.headers for r in refused), harness.summary(refused)
    assert counted["fallback_allowed"] == admitted - used + fresh_admitted, dict(counted)
    assert counted["fallback_over_limit"] == len(refused), dict(counted)
    per_envoy = Counter(r.target for r in flood + fresh if r.status == 200)
    report("on_failure local, 3 Envoys, service stopped mid-window", {
        "quota_per_hour": QUOTA, "used_before": used,
        "noisy_admitted_in_window": admitted, "fresh_admitted": fresh_admitted,
        "sent_each": 10 * QUOTA, "admitted_per_envoy": dict(sorted(per_envoy.items())),
        "while_down": latency_ms(flood + fresh),
        "counters": {k: v for k, v in counted.items() if v}})


def test_the_learned_share_keeps_a_pinned_tenants_quota(stack):
    quota = 60
    limits = {"x-tenant-id": {"default": {"perhour": quota}}}
    fleet = stack.fleet(limits, envoys=3, timeout_ms=harness.COUNTING_TIMEOUT_MS,
                        on_failure="local", fallback={"envoys": 3, "share": "learned"})
    ensure_window_room(3600, 180)
    # Every Envoy of the fleet takes traffic (with the counter, each is then
    # counted in the fleet's size: 3)...
    others = run_sequential(fleet.urls, 3, tenant=unique("other"))
    assert all(answered(r) for r in others), harness.summary(others)
    # ... and all of this tenant's traffic lands on the first.
    pinned_to = fleet.urls[:1]
    pinned = unique("pinned")
    used = quota // 2
    first = run_sequential(pinned_to, used, tenant=pinned)
    assert all(answered(r) and r.status == 200 for r in first), harness.summary(first)

    fleet.ratelimit.stop()
    try:
        flood = run_concurrent(pinned_to, 10 * quota, clients=4, tenant=pinned)
        fresh = run_concurrent(pinned_to, 10 * quota, clients=4, tenant=unique("fresh"))
    finally:
        fleet.ratelimit.start()
    wait_until(lambda: answered_by_service(fleet), "the service answers again", RECOVERY_S)

    pinned_total = used + tally(flood)[200]
    fresh_total = tally(fresh)[200]
    report("learned share, tenant pinned to 1 Envoy of 3, service stopped mid-window", {
        "quota_per_hour": quota, "used_before": used, "pinned_admitted_in_window": pinned_total,
        "fresh_admitted (configured share, nothing learned)": fresh_total})
    # It learned that it sends all of the tenant's traffic: the whole quota.
    assert pinned_total == quota, (pinned_total, harness.summary(flood))
    # Nothing learned of a new tenant: the configured third.
    assert fresh_total == quota // 3, (fresh_total, harness.summary(fresh))


def test_the_fallbacks_decisions_are_in_the_access_log_with_their_source(stack):
    quota = 5
    gen = stack.generate({"x-tenant-id": {"default": {"perhour": quota}}})
    rls = stack.ratelimit(stack.redis(), gen)
    log = stack.workdir / "fallback-access.log"
    cfg = gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS, on_failure="local",
                            fallback={"envoys": 1})
    envoy = stack.envoy(cfg, rls, stack.upstream(), access_log_path=log)
    ensure_window_room(3600, 120)
    rls.stop()
    tenant = unique("logged")
    results = run_sequential([envoy.url], quota + 3, tenant=tenant)
    assert [r.status for r in results] == [200] * quota + [429] * 3, harness.summary(results)

    def lines() -> list[dict]:
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    # Envoy flushes its access log every 10 s by default.
    wait_until(lambda: len(lines()) >= quota + 3, "the access-log lines", 40)
    got = Counter((x["status"], x["verdict"], x["source"]) for x in lines()
                  if x["tenant"] == tenant and x["group"] == "default")
    assert got == Counter({(200, "admitted", "fallback"): quota,
                           (429, "refused", "fallback"): 3}), lines()

"""Live configuration changes, the way a control plane makes them: the
filter's configuration served by ECDS from a watched file
(envoy/envoy-ecds.yaml.tmpl, tests/ecds.py). New limits take effect under
traffic with no request failed or lost; a bad update is rejected, logged, and
the last good configuration keeps limiting; a graceful drain under traffic
completes every request in flight."""

from __future__ import annotations

import concurrent.futures
import socket
from collections import Counter

import requests

import harness
from ecds import EcdsEnvoy
from faults import Traffic, answered, check_accounting, delta, fresh_tenants
from harness import ensure_window_room, run_sequential, tally, unique, wait_until

V1 = {"x-tenant-id": {"default": {"perhour": 5}}}
V2 = {"x-tenant-id": {"default": {"perhour": 8}}}


def quota_of(envoy: harness.Envoy, n: int) -> None:
    """A fresh tenant gets exactly n 200s, then 429s, each with the service's verdict."""
    results = run_sequential([envoy.url], n + 2, tenant=unique("quota"))
    assert [r.status for r in results] == [200] * n + [429] * 2, harness.summary(results)
    assert all(answered(r) for r in results), harness.summary(results)


def _setup(stack, envoy_args: tuple[str, ...] = (), timeout_ms: int = harness.COUNTING_TIMEOUT_MS):
    v1 = stack.generate(V1, timeout_ms=timeout_ms)
    v2 = stack.generate(V2, timeout_ms=timeout_ms)
    redis = stack.redis()
    # The service knows both domains from the start: a control plane ships
    # the service's rules before the filter configuration that uses them.
    rls = stack.ratelimit(redis, v1, v2)
    upstream = stack.upstream()
    envoy = EcdsEnvoy(stack, v1.plugin_config(), rls, upstream, extra_args=envoy_args)
    return v1, v2, rls, envoy


def test_new_limits_take_effect_under_traffic_with_nothing_failed(stack):
    v1, v2, rls, envoy = _setup(stack)
    ensure_window_room(3600, 120)
    applied = envoy.ecds_stats().get("update_success", 0)
    assert applied >= 1, envoy.ecds_stats()
    quota_of(envoy, 5)
    before = Counter(envoy.filter_counters())

    traffic = Traffic(lambda: [envoy.url], fresh_tenants("live"), clients=2)
    try:
        traffic.wait_for(answered, 20, "traffic answered under v1")
        envoy.push(v2.plugin_config())
        envoy.wait_stat("update_success", applied + 1, "ECDS applies v2")
        mark = len(traffic)
        traffic.wait_for(answered, 20, "traffic answered under v2", since=mark)
    finally:
        results = traffic.stop()
    stats = envoy.ecds_stats()
    assert stats.get("config_fail", 0) == 0 and stats.get("update_rejected", 0) == 0, stats

    tenant = unique("v2")
    after = run_sequential([envoy.url], 10, tenant=tenant)
    assert [r.status for r in after] == [200] * 8 + [429] * 2, harness.summary(after)
    # Counted in the new domain's rules, by the service and in Redis.
    assert rls.redis.get_int(harness.redis_key(v2.domain, "hour", tenant)) == 9
    assert rls.redis.get_int(harness.redis_key(v1.domain, "hour", tenant)) is None

    figures = check_accounting(results, delta(Counter(envoy.filter_counters()), before),
                               others=len(after))
    assert figures["failed_open"] == 0, figures
    assert figures["statuses"] == {200: len(results)}, figures
    print(f"\nECDS update under traffic: {figures}")


def test_a_bad_update_is_rejected_and_the_last_good_config_keeps_limiting(stack):
    v1, v2, rls, envoy = _setup(stack)
    ensure_window_room(3600, 120)
    quota_of(envoy, 5)
    before = Counter(envoy.filter_counters())
    bad_limit = v2.plugin_config()
    bad_limit["limits"]["x-tenant-id"]["default"]["perhour"] = 0
    bad_updates = [bad_limit, "{not json", {**v2.plugin_config(), "nonsense": 1}]

    traffic = Traffic(lambda: [envoy.url], fresh_tenants("bad"), clients=2)
    try:
        traffic.wait_for(answered, 20, "traffic answered under v1")
        for n, bad in enumerate(bad_updates, start=1):
            envoy.push(bad)
            envoy.wait_stat("update_rejected", n, f"ECDS rejects bad update {n}")
            assert envoy.process.alive()
        mark = len(traffic)
        traffic.wait_for(answered, 20, "traffic answered after the rejections", since=mark)
    finally:
        results = traffic.stop()

    # The last good configuration (v1, quota 5) still limits.
    quota_of(envoy, 5)
    log = envoy.process.log_text()
    assert "invalid configuration: limits.x-tenant-id.default.perhour" in log, envoy.process.tail()
    assert "nonsense" in log, envoy.process.tail()
    figures = check_accounting(results, delta(Counter(envoy.filter_counters()), before),
                               others=7)
    assert figures["failed_open"] == 0, figures
    print(f"\nECDS bad updates under traffic: {figures}, {envoy.ecds_stats()}")
    print("\n".join(line[:300] for line in log.splitlines()
                    if "invalid configuration" in line or "rejected" in line))

    # And a good update after the bad ones is applied.
    stats = envoy.ecds_stats()
    assert stats.get("update_success", 0) == 1 and stats.get("config_fail", 0) == 3, stats
    envoy.push(v2.plugin_config())
    envoy.wait_stat("update_success", 2, "ECDS applies v2 after the rejections")
    quota_of(envoy, 8)


def _connect_refused(port: int) -> bool:
    try:
        with socket.create_connection((harness.LOOPBACK, port), timeout=1):
            return False
    except OSError:
        return True


def test_a_graceful_drain_completes_every_request_in_flight(stack):
    in_flight = 16
    # The service frozen holds each request inside the filter, waiting for
    # its answer: requests that are certainly in flight when the drain starts.
    v1, v2, rls, envoy = _setup(stack, envoy_args=("--drain-time-s", "2"), timeout_ms=10_000)
    ensure_window_room(3600, 120)
    quota_of(envoy, 5)

    def active() -> int:
        return envoy.stats(r"^http\.ingress\.downstream_rq_active$").get(
            "http.ingress.downstream_rq_active", -1)

    base = unique("drain")
    with concurrent.futures.ThreadPoolExecutor(max_workers=in_flight) as pool:
        rls.freeze()
        try:
            futures = [pool.submit(harness.send, envoy.url, f"{base}-{i}", None, 30.0)
                       for i in range(in_flight)]
            wait_until(lambda: active() == in_flight, f"{in_flight} requests in flight")
            r = requests.post(f"{envoy.admin_url}/drain_listeners?graceful", timeout=5)
            assert r.status_code == 200, r.text
            wait_until(lambda: envoy.stats("listener_manager").get(
                "listener_manager.total_listeners_draining", 0) >= 1
                or _connect_refused(envoy.listen_port), "the listener drains")
        finally:
            rls.thaw()
        results = [f.result() for f in futures]

    assert tally(results) == Counter({200: in_flight}), harness.summary(results)
    assert all(answered(r) for r in results), harness.summary(results)
    # HTTP/1.1 clients are told to go away as their requests complete.
    closes = sum(1 for r in results if r.headers.get("connection") == "close")
    # After the drain time the listener is gone: new connections are refused.
    wait_until(lambda: _connect_refused(envoy.listen_port), "the listener stops after draining")
    assert envoy.process.alive()
    c = envoy.filter_counters()
    assert c.get("failure_mode_allowed", 0) == 0 and c.get("rls_error", 0) == 0, c
    print(f"\ngraceful drain: {in_flight} in flight, all 200 with the service's verdict, "
          f"{closes} told connection: close")

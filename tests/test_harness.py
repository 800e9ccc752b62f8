"""The harness itself: every process it starts is gone after close(), and its
parsers read what the real components print."""

from __future__ import annotations

import os

import harness
from harness import (parse_prometheus, parse_ratelimit_headers, prometheus_series, redis_key,
                     window_start)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_stack_starts_and_stops_every_process(tmp_path):
    stack = harness.Stack(tmp_path)
    try:
        fleet = stack.fleet({"x-tenant-id": {"default": {"perhour": 10}}}, envoys=2)
        assert fleet.redis.command("PING") == "PONG"
        assert f"{fleet.domain}.generic_key_per_hour.tenant" in fleet.ratelimit.rlconfig()
        assert all(e.is_ready() for e in [fleet.upstream, *fleet.envoys])
        fleet.ratelimit.freeze()
        fleet.ratelimit.thaw()
        pids = [p.pid for p in stack.processes]
        assert len(pids) == 5
    finally:
        stack.close()
    assert all(_gone(pid) for pid in pids)
    for p in stack.processes:
        assert p.log_path.exists() and p.log_text()


def test_close_stops_a_frozen_process(tmp_path):
    stack = harness.Stack(tmp_path)
    redis = stack.redis()
    redis.process.freeze()
    stack.close()
    assert _gone(redis.process.pid)


def test_window_arithmetic_matches_the_service():
    t = 1670320800 + 1234.5  # 6 Dec 2022 10:20:34.5 UTC
    assert window_start(3600, t) == 1670320800
    assert window_start(60, t) == 1670322000
    assert redis_key("internal-api", "hour", "tenant-a", t) == (
        "internal-api_generic_key_per_hour_tenant_tenant-a_1670320800")


def test_parse_ratelimit_headers():
    h = parse_ratelimit_headers({
        "x-ratelimit-limit": "5, 5;w=1, 20;w=60, 30;w=3600",
        "x-ratelimit-remaining": "0", "x-ratelimit-reset": "1", "retry-after": "1"})
    assert (h.limit, h.remaining, h.reset, h.retry_after) == (5, 0, 1, 1)
    assert h.windows == [(5, 1), (20, 60), (30, 3600)]
    assert h.tightest_window == 1
    assert h.names == [None, None, None]
    named = parse_ratelimit_headers({
        "x-ratelimit-limit": '5, 5;w=1;name="gold", 30;w=3600;name="gold/export"',
        "x-ratelimit-remaining": "4", "x-ratelimit-reset": "1"})
    assert named.windows == [(5, 1), (30, 3600)]
    assert named.names == ["gold", "gold/export"]


def test_parse_prometheus():
    text = ('# HELP x\n'
            'ratelimit_service_rate_limit_within_limit{key2="tenant",domain="d",'
            'key1="generic_key_per_hour"} 100\n'
            'ratelimit_service_config_load_success 1\n')
    assert parse_prometheus(text) == {
        'ratelimit_service_rate_limit_within_limit{domain="d",key1="generic_key_per_hour",'
        'key2="tenant"}': 100.0,
        "ratelimit_service_config_load_success": 1.0,
    }


def test_prometheus_series_keys_each_sample_by_the_name_the_text_gives_it():
    text = ('# TYPE envoy_cluster_upstream_rq_total counter\n'
            'envoy_cluster_upstream_rq_total{cluster="a"} 3\n'
            '# TYPE tenant_ratelimit_group_admitted counter\n'
            'tenant_ratelimit_group_admitted{group="gold"} 4\n'
            '# TYPE lat histogram\n'
            'lat_bucket{le="0.5"} 1\nlat_bucket{le="+Inf"} 2\nlat_sum 3\nlat_count 2\n')
    assert prometheus_series(text) == {
        ("envoy_cluster_upstream_rq_total", (("cluster", "a"),)): 3.0,
        ("tenant_ratelimit_group_admitted", (("group", "gold"),)): 4.0,
        ("lat_bucket", (("le", "0.5"),)): 1.0, ("lat_bucket", (("le", "+Inf"),)): 2.0,
        ("lat_sum", ()): 3.0, ("lat_count", ()): 2.0,
    }
    assert list(prometheus_series(text, "tenant_", types=("counter",))) == [
        ("tenant_ratelimit_group_admitted", (("group", "gold"),))]

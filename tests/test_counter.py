"""ratelimit-counter behind Envoy's own rate-limit filter (one request per
call, no marks): exactness in memory and in Redis, what Redis holds, a bad
team file, sliding and calendar windows on a clock the test moves."""

from __future__ import annotations

import time
from collections import Counter as Tally
from datetime import datetime, timezone

import pytest

import harness
from counter import Counter, native_envoy
from grpc_rls import call, request_bytes
from harness import ensure_window_room, run_concurrent, run_sequential, tally, unique

LIMITS = {"x-tenant-id": {"default": {"perminute": 300, "perhour": 100000}}}
# A run must land in one minute window (and one hour).
MINUTE_ROOM_S = 25


def _admitted(results) -> int:
    return sum(1 for r in results if r.status == 200)


def _trl_keys(redis) -> dict[str, int]:
    return {k: redis.get_int(k) for k in redis.keys("trl:*")}


def test_memory_store_admits_exactly_the_limit(stack):
    gen = stack.generate(LIMITS, service="counter")
    counter = Counter(stack, {gen.domain: LIMITS}, store="memory")
    upstream = stack.upstream()
    envoy = native_envoy(stack, gen, counter.grpc_port, upstream)
    ensure_window_room(60, MINUTE_ROOM_S)
    ensure_window_room(3600, MINUTE_ROOM_S)
    tenant = unique("tenant")
    results = run_concurrent([envoy.url], 1000, clients=64, tenant=tenant)
    assert tally(results) == Tally({200: 300, 429: 700}), harness.summary(results)
    m = counter.metrics()
    key = f'{{domain="{gen.domain}",group="default"}}'
    assert m[f"trl_counter_admitted_total{key}"] == 300
    assert m[f"trl_counter_refused_total{key}"] == 700


def test_two_counters_on_one_redis_hold_exactly_what_was_admitted(stack):
    gen = stack.generate(LIMITS, service="counter")
    redis = stack.redis()
    url = redis.url
    counters = [Counter(stack, {gen.domain: LIMITS}, store=url, name=f"counter-{i}")
                for i in range(2)]
    upstream = stack.upstream()
    envoys = [native_envoy(stack, gen, c.grpc_port, upstream, name=f"envoy-{i}")
              for i, c in enumerate(counters)]
    ensure_window_room(60, MINUTE_ROOM_S)
    ensure_window_room(3600, MINUTE_ROOM_S)
    tenant = unique("tenant")
    results = run_concurrent([e.url for e in envoys], 1000, clients=64, tenant=tenant)
    assert tally(results) == Tally({200: 300, 429: 700}), harness.summary(results)
    held = {k: v for k, v in _trl_keys(redis).items() if tenant in k}
    # One minute counter and one hour counter, each exactly what was admitted.
    assert sorted(held.values()) == [300, 300], held
    assert len([k for k in held if ":per_minute:" in k]) == 1, held


def test_a_bad_team_file_keeps_the_last_good_one(stack):
    limits = {"x-tenant-id": {"default": {"perminute": 3}}}
    gen = stack.generate(limits, service="counter")
    counter = Counter(stack, {gen.domain: limits}, store="memory")
    upstream = stack.upstream()
    envoy = native_envoy(stack, gen, counter.grpc_port, upstream)
    counter.write_team(gen.domain, '{"x-tenant-id": {"default": {"perminute": -1}}}')
    harness.wait_until(
        lambda: counter.metrics().get(
            f'trl_counter_reloads_total{{domain="{gen.domain}",result="failed"}}', 0) >= 1,
        "the counter reports the failed reload", process=counter.process)
    assert "must be a positive integer" in counter.process.log_text()
    ensure_window_room(60, MINUTE_ROOM_S)
    results = run_sequential([envoy.url], 6, tenant=unique("tenant"))
    assert tally(results) == Tally({200: 3, 429: 3}), harness.summary(results)
    assert counter.readyz() == 200


def _ms(dt: datetime) -> int:
    return int(dt.replace(tzinfo=timezone.utc).timestamp() * 1000)


def _at(counter: Counter, instant_ms: int) -> None:
    """Moves the counter's clock so that it reads `instant_ms` now."""
    counter.set_clock(instant_ms - int(time.time() * 1000))


def test_calendar_months_and_weeks_turn_on_the_calendar(stack):
    limits = {"x-tenant-id": {"default": {"permonth": 2, "perweek": 100}}}
    gen = stack.generate(limits, service="counter")
    counter = Counter(stack, {gen.domain: limits}, store="memory")
    upstream = stack.upstream()
    envoy = native_envoy(stack, gen, counter.grpc_port, upstream)
    for before, after in [
        (datetime(2027, 1, 31, 23, 59, 30), datetime(2027, 2, 1, 0, 0, 30)),
        (datetime(2027, 2, 28, 23, 59, 30), datetime(2027, 3, 1, 0, 0, 30)),
        (datetime(2028, 2, 29, 23, 59, 30), datetime(2028, 3, 1, 0, 0, 30)),
        (datetime(2026, 12, 31, 23, 59, 30), datetime(2027, 1, 1, 0, 0, 30)),
    ]:
        tenant = unique("tenant")
        _at(counter, _ms(before))
        assert tally(run_sequential([envoy.url], 3, tenant=tenant)) == Tally({200: 2, 429: 1})
        _at(counter, _ms(after))
        assert tally(run_sequential([envoy.url], 3, tenant=tenant)) == Tally({200: 2, 429: 1}), after
    # 28 February 2028 is not the month's end: a leap year has a 29th.
    tenant = unique("tenant")
    _at(counter, _ms(datetime(2028, 2, 28, 23, 59, 30)))
    assert tally(run_sequential([envoy.url], 2, tenant=tenant)) == Tally({200: 2})
    _at(counter, _ms(datetime(2028, 2, 29, 0, 0, 30)))
    assert tally(run_sequential([envoy.url], 1, tenant=tenant)) == Tally({429: 1})
    # A week: Sunday 6 December 2026 to Monday 7 December.
    weekly = {"x-tenant-id": {"default": {"perweek": 2}}}
    counter.write_team(gen.domain, weekly)
    harness.wait_until(
        lambda: counter.metrics().get(
            f'trl_counter_reloads_total{{domain="{gen.domain}",result="ok"}}', 0) >= 2,
        "the counter loads the weekly file", process=counter.process)
    tenant = unique("tenant")
    _at(counter, _ms(datetime(2026, 12, 6, 23, 59, 30)))
    assert tally(run_sequential([envoy.url], 3, tenant=tenant)) == Tally({200: 2, 429: 1})
    _at(counter, _ms(datetime(2026, 12, 7, 0, 0, 30)))
    assert tally(run_sequential([envoy.url], 3, tenant=tenant)) == Tally({200: 2, 429: 1})


def test_a_sliding_window_stops_the_boundary_burst(stack):
    limit = 20
    limits = {"x-tenant-id": {"default": {"perminute": limit, "window": "sliding"}}}
    fixed = {"x-tenant-id": {"default": {"perminute": limit}}}
    gen = stack.generate(limits, service="counter")
    counter = Counter(stack, {gen.domain: limits}, store="memory")
    upstream = stack.upstream()
    envoy = native_envoy(stack, gen, counter.grpc_port, upstream)
    minute = 60_000
    base = (int(time.time() * 1000) // minute + 10) * minute  # a minute boundary, later
    tenant = unique("tenant")
    _at(counter, base - 2_000)  # the last seconds of a minute
    assert _admitted(run_sequential([envoy.url], limit + 5, tenant=tenant)) == limit
    _at(counter, base + 100)  # the burst at the next minute's start
    assert _admitted(run_sequential([envoy.url], limit, tenant=tenant)) <= 1
    # A quarter into the minute: at most L x 0.25 (plus one).
    _at(counter, base + minute // 4)
    got = _admitted(run_sequential([envoy.url], limit, tenant=tenant))
    assert got <= limit // 4 + 1, got
    # A fixed window admits the whole limit again at once.
    counter.write_team(gen.domain, fixed)
    harness.wait_until(
        lambda: counter.metrics().get(
            f'trl_counter_reloads_total{{domain="{gen.domain}",result="ok"}}', 0) >= 2,
        "the counter loads the fixed file", process=counter.process)
    tenant = unique("tenant")
    _at(counter, base + 10 * minute - 2_000)
    assert _admitted(run_sequential([envoy.url], limit, tenant=tenant)) == limit
    _at(counter, base + 10 * minute + 100)
    assert _admitted(run_sequential([envoy.url], limit, tenant=tenant)) == limit


def _steady_sender(counter: Counter, domain: str, tenant: str, start_ms: int, end_ms: int,
                   step_ms: int) -> list[int]:
    """One request every `step_ms` of the counter's clock from `start_ms` to
    `end_ms`, each straight to the counter (one request per call, as Envoy's
    own filter sends): the instants of the admitted ones."""
    desc = [("generic_key", "per_minute"), ("tenant", tenant)]
    message = request_bytes(domain, [desc])
    admitted = []
    for t in range(start_ms, end_ms, step_ms):
        _at(counter, t)
        status, r, text = call(counter.grpc_port, message)
        assert status == 0, (t, status, text)
        if r["overall_code"] == 1:
            admitted.append(t)
    return admitted


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_sliding_window_admits_the_limit_in_any_minute_to_a_steady_sender(stack, store):
    """A tenant sending at twice its limit, steadily, gets its limit (within
    1%) in every minute-long interval, wherever the interval starts: at a
    window's start, a quarter, half, three quarters into it."""
    limit = 600
    limits = {"x-tenant-id": {"default": {"perminute": limit, "window": "sliding"}}}
    url = "memory"
    if store == "redis":
        redis = stack.redis()
        url = redis.url
    counter = Counter(stack, {"d": limits}, store=url, store_timeout_ms=1000)
    minute = 60_000
    base = (int(time.time() * 1000) // minute + 10) * minute  # a minute boundary, later
    tenant = unique("tenant")
    # Twice the limit: 1200 a minute, one every 50 ms, for 4 minutes; the
    # first minute warms the window up.
    admitted = _steady_sender(counter, "d", tenant, base, base + 4 * minute, 50)
    got = {}
    for offset_s in range(0, 121, 15):
        start = base + minute + offset_s * 1000
        got[offset_s] = sum(1 for t in admitted if start <= t < start + minute)
    print(f"admitted per minute from 60 s + offset (offset s: count): {got}")
    for offset_s, n in got.items():
        assert abs(n - limit) <= limit // 100, (offset_s, n, got)

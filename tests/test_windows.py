"""Windows of any length, a sliding minute beside a calendar month, six
windows per group, with ratelimit-counter: `per5minutes` (fixed and
sliding), `per30seconds` and `per90days` counted exactly across two Envoys
(memory store and Redis); the 5-minute window's boundary and a month's end
on the counter's clock, which the test sets (`Counter.set_clock`); custom
windows refused with envoyproxy/ratelimit, naming the field.

The local layer is off in the counting tests: every request asks the
counter, whose clock the test moves, so no verdict depends on Envoy's own
clock or on a wall-clock boundary."""

from __future__ import annotations

import json
import time
from collections import Counter as Tally
from datetime import datetime, timezone

import pytest

import harness
from counter import Counter
from harness import free_port, run_sequential, send, tally, unique

FIVE_MIN_MS = 300_000


def _ms(dt: datetime) -> int:
    return int(dt.replace(tzinfo=timezone.utc).timestamp() * 1000)


def _at(counter: Counter, instant_ms: int) -> None:
    """Moves the counter's clock so that it reads `instant_ms` now."""
    counter.set_clock(instant_ms - int(time.time() * 1000))


def _fleet(stack, limits: dict, store: str = "memory", envoys: int = 2, **plugin):
    """`envoys` Envoys on one counter (in memory or on its own Redis),
    the local layer off."""
    gen = stack.generate(limits, service="counter")
    redis = stack.redis() if store == "redis" else None
    counter = Counter(stack, {gen.domain: limits}, store=redis.url if redis else "memory")
    cfg = gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS, local={"enabled": False},
                            **plugin)
    assert cfg["rate_limit_service"].get("service") == "counter"
    upstream = stack.upstream()
    members = [stack.envoy(cfg, counter.grpc_port, upstream, name=f"envoy-{i + 1}")
               for i in range(envoys)]
    return gen, counter, members, redis


CUSTOM = {"x-tenant-id": {
    "default": {"per5minutes": 7},
    "sliding": {"per5minutes": 7, "window": "sliding", "header_value": ["s"]},
    "half-minute": {"per30seconds": 5, "header_value": ["h"]},
    "quarter": {"per90days": 9, "perday": 100, "header_value": ["q"]},
}}


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_custom_windows_admit_exactly_their_limit_across_two_envoys(stack, store):
    limits = json.loads(json.dumps(CUSTOM))
    groups = limits["x-tenant-id"]
    tenants = {"default": unique("t"), "sliding": unique("s"), "half-minute": unique("h"),
               "quarter": unique("q")}
    for name in ("sliding", "half-minute", "quarter"):
        groups[name]["header_value"] = [tenants[name]]
    _, counter, envoys, redis = _fleet(stack, limits, store)
    # One second into a window of every length (a multiple of 90 days is
    # one of 30 s and of 5 minutes): the run stays in it.
    quarter_ms = 90 * 86_400_000
    start = (_ms(datetime(2031, 1, 1)) // quarter_ms + 1) * quarter_ms
    _at(counter, start + 1_000)
    urls = [e.url for e in envoys]
    for name, limit in [("default", 7), ("sliding", 7), ("half-minute", 5), ("quarter", 9)]:
        results = run_sequential(urls, limit + 4, tenant=tenants[name])
        assert tally(results) == Tally({200: limit, 429: 4}), (name, harness.summary(results))
        admitted = [r for r in results if r.status == 200]
        # An admitted response's reset is the window's real one, never 0.
        assert all(int(r.headers["x-ratelimit-reset"]) > 0 for r in admitted), admitted[0].headers
    if redis is not None:
        for name, window, limit in [("default", "per_5_minutes", 7),
                                    ("half-minute", "per_30_seconds", 5),
                                    ("quarter", "per_90_days", 9)]:
            keys = [k for k in redis.keys("trl:*") if f":{tenants[name]}}}:{window}:" in k]
            assert len(keys) == 1, (name, redis.keys("trl:*"))
            assert keys[0].endswith(f":{start}"), keys
            assert redis.get_int(keys[0]) == limit, keys


def test_the_five_minute_window_turns_on_its_boundary(stack):
    limits = {"x-tenant-id": {
        "default": {"per5minutes": 3},
        "sliding": {"per5minutes": 3, "window": "sliding", "header_value": ["s"]}}}
    fixed, sliding = unique("f"), unique("s")
    limits["x-tenant-id"]["sliding"]["header_value"] = [sliding]
    _, counter, envoys, _ = _fleet(stack, limits)
    urls = [e.url for e in envoys]
    end = (_ms(datetime(2031, 3, 1, 12, 7)) // FIVE_MIN_MS + 1) * FIVE_MIN_MS
    _at(counter, end - 10_000)
    for tenant in (fixed, sliding):
        assert tally(run_sequential(urls, 4, tenant=tenant)) == Tally({200: 3, 429: 1})
    last = send(urls[0], fixed)
    assert last.status == 429 and 1 <= int(last.headers["retry-after"]) <= 10, last.headers
    # A second into the next window: the fixed one starts again at 0; the
    # sliding one still weighs the previous window's 3.
    _at(counter, end + 1_000)
    assert tally(run_sequential(urls, 4, tenant=fixed)) == Tally({200: 3, 429: 1})
    assert tally(run_sequential(urls, 2, tenant=sliding)) == Tally({429: 2})
    # Half-way: the previous window weighs ceil(3 x 1/2) = 2, room for one.
    _at(counter, end + 150_000)
    assert tally(run_sequential(urls, 2, tenant=sliding)) == Tally({200: 1, 429: 1})


def test_a_sliding_minute_beside_a_calendar_month(stack):
    limits = {"x-tenant-id": {"default": {"perminute": 2, "permonth": 3, "window": "sliding"}}}
    tenant = unique("m")
    _, counter, envoys, _ = _fleet(stack, limits)
    url = envoys[0].url
    noon = _ms(datetime(2026, 12, 5, 12, 0))
    _at(counter, noon + 500)
    assert tally(run_sequential([url], 3, tenant=tenant)) == Tally({200: 2, 429: 1})
    # Five seconds into the next minute the previous one's 2 still weigh
    # (a fixed minute would admit): the minute slides, its wait is short.
    _at(counter, noon + 65_000)
    r = send(url, tenant)
    assert r.status == 429 and int(r.headers["retry-after"]) <= 60, r.headers
    _at(counter, noon + 600_000)
    assert send(url, tenant).status == 200
    # The month's 4th request: refused until 1 January, not 37 days.
    at = noon + 1_200_000
    _at(counter, at)
    r = send(url, tenant)
    assert r.status == 429, r
    until_january = (_ms(datetime(2027, 1, 1)) - at) / 1000
    assert abs(int(r.headers["retry-after"]) - until_january) <= 5, r.headers
    # On the 1st the month is new.
    _at(counter, _ms(datetime(2027, 1, 1, 0, 0, 30)))
    assert tally(run_sequential([url], 3, tenant=tenant)) == Tally({200: 2, 429: 1})


SIX = {"persecond": 100, "perminute": 50, "per5minutes": 40, "perhour": 30, "perday": 20,
       "permonth": 10}


def test_a_group_of_six_windows_is_generated_loaded_and_counted(stack):
    limits = {"x-tenant-id": {"default": dict(SIX)}}
    tenant = unique("six")
    _, counter, envoys, _ = _fleet(stack, limits)
    _at(counter, _ms(datetime(2031, 5, 10, 10, 0, 1)))
    results = run_sequential([e.url for e in envoys], 13, tenant=tenant)
    assert tally(results) == Tally({200: 10, 429: 3}), harness.summary(results)
    admitted = [r for r in results if r.status == 200]
    for r in admitted:
        # Every window counted (the month binds), its reset never 0.
        assert int(r.headers["x-ratelimit-reset"]) > 0, r.headers
    # The windows the protocol names carry their length; the custom one
    # and the month are left out of the `;w=` entries (docs/headers.md).
    entries = admitted[0].headers["x-ratelimit-limit"].split(", ")
    windows = [e.split(";")[1] for e in entries[1:]]
    assert windows == ["w=1", "w=60", "w=3600", "w=86400"], entries


def test_a_group_over_the_limit_is_refused_alike_by_validate_generate_and_render(stack):
    seven = {"x-tenant-id": {"default": {**SIX, "peryear": 100}}}
    path = stack.workdir / "seven.json"
    path.write_text(json.dumps(seven, indent=2))
    why = "limits more than 6 windows: a group or route limits at most 6"
    validate = harness.run_cli("validate", path, "--service", "counter", check=False)
    generate = harness.run_cli("generate", path, "--domain", "d", "--service", "counter",
                               "--out", stack.workdir / "seven-out", check=False)
    render = harness.run_cli("render", path, "--target", "envoy", "--domain", "d", "--service",
                             "counter", "--out", stack.workdir / "seven-render", check=False)
    lines = []
    for proc in (validate, generate, render):
        assert proc.returncode != 0, proc
        line = [s for s in proc.stderr.splitlines() if why in s]
        assert len(line) == 1, proc.stderr
        lines.append(line[0][line[0].index("seven.json"):])
    assert lines[0] == lines[1] == lines[2], lines
    assert lines[0].startswith("seven.json:3:"), lines


def test_custom_windows_are_refused_with_envoyproxy_ratelimit(stack):
    limits = {"x-tenant-id": {"default": {"perminute": 10, "per5minutes": 30}}}
    path = stack.workdir / "custom.json"
    path.write_text(json.dumps(limits, indent=2))
    proc = harness.run_cli("validate", path, "--service", "envoy-ratelimit", check=False)
    assert proc.returncode != 0
    assert "x-tenant-id.default.per5minutes: a window of this length needs" in proc.stderr, \
        proc.stderr
    assert "protocol has no such unit" in proc.stderr, proc.stderr
    # Envoy refuses the plugin configuration naming the field.
    cfg = stack.generate(limits, service="counter").plugin_config()
    cfg["rate_limit_service"]["service"] = "envoy-ratelimit"
    envoy = stack.envoy(cfg, free_port(), free_port(), wait=False)
    outcome = envoy.outcome(deadline_s=30)
    assert outcome.startswith("exited "), outcome
    lines = [s for s in envoy.process.log_text().splitlines() if "invalid configuration" in s]
    assert any("limits.x-tenant-id.default.per5minutes" in s and "no such unit" in s
               for s in lines), lines

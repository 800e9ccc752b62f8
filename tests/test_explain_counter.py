"""`ratelimit-config explain` for ratelimit-counter: the counter's windows
(a calendar month's real end, a sliding window named as such, with the
previous window it reads) and the Redis keys a real counter counts under,
found in Redis after requests sent to it on a clock the test sets."""

from __future__ import annotations

import ast
import time
from datetime import datetime, timezone

import harness
from counter import Counter
from grpc_rls import call, request_bytes
from harness import run_cli

LIMITS = {"x-tenant-id": {
    "default": {"perminute": 10, "window": "sliding"},
    "gold": {"perhour": 100, "permonth": 1000, "header_value": ["acme"]}}}


def _ms(dt: datetime) -> int:
    return int(dt.replace(tzinfo=timezone.utc).timestamp() * 1000)


def _lines(stdout: str, label: str) -> list[str]:
    """The values of the lines `  <label>: value`."""
    return [line.split(":", 1)[1].strip() for line in stdout.splitlines()
            if line.strip().startswith(f"{label}:")]


def _descriptors(stdout: str) -> list[list[tuple[str, str]]]:
    """The descriptors `explain` prints, as the filter sends them."""
    out = []
    for text in _lines(stdout, "descriptor"):
        out.append([(k, v) for k, v in ast.literal_eval(text)])
    return out


def test_explain_prints_the_keys_a_real_counter_counts_under(stack):
    gen = stack.generate(LIMITS, service="counter")
    redis = stack.redis()
    counter = Counter(stack, {gen.domain: LIMITS}, store=redis.url)
    # Half a minute from each minute's ends, on the counter's clock: the
    # time a call takes cannot move it into another window.
    before = _ms(datetime(2026, 12, 5, 11, 29, 30))
    now = _ms(datetime(2026, 12, 5, 11, 30, 30))
    shown = {t: run_cli("explain", "--plugin-config", gen.plugin_config_path,
                        "--tenant", t, "--at", now // 1000).stdout
             for t in ["tenant-a", "acme"]}
    sliding, gold = shown["tenant-a"], shown["acme"]
    for text in shown.values():
        # The service is read from the plugin configuration.
        assert ("service: counter (the plugin configuration's rate_limit_service.service): "
                "ratelimit-counter's rules and keys\n") in text, text
        assert f"{gen.domain}_generic_key" not in text, text
    # The month ends on the 1st of the next, not 31 days after the epoch's multiple.
    assert "permonth: 1000 per month (calendar month, UTC)\n" in gold, gold
    assert ("  window:     2026-12-01T00:00:00Z to 2027-01-01T00:00:00Z "
            "(the calendar's, UTC: a month starts on the 1st)\n") in gold, gold
    # The sliding minute says so, and names the previous window it reads.
    assert "perminute: 10 per minute, sliding\n" in sliding, sliding
    assert ("  sliding:    estimate = this window's count + the previous window's "
            "(2026-12-05T11:29:00Z to 2026-12-05T11:30:00Z) × 50.0% (the part of this window "
            "still ahead), rounded up; a request is admitted while the estimate plus its hits "
            "is at most 10\n") in sliding, sliding
    (previous,) = _lines(sliding, "previous")

    # One request of tenant-a in the previous minute, then one of each
    # tenant now, with the descriptors explain printed, straight to the
    # counter's gRPC.
    def send(at_ms: int, descriptors) -> None:
        counter.set_clock(at_ms - int(time.time() * 1000))
        for d in descriptors:
            status, response, text = call(counter.grpc_port, request_bytes(gen.domain, [d]))
            assert status == 0 and response["overall_code"] == 1, (status, response, text)

    send(before, _descriptors(sliding))
    send(now, _descriptors(sliding) + [_descriptors(gold)[0]] + [_descriptors(gold)[1]])
    keys = _lines(sliding, "redis key") + _lines(gold, "redis key") + [previous]
    assert len(keys) == 4, (sliding, gold)
    assert sorted(redis.keys(f"trl:{{{len(gen.domain)}:{gen.domain}:*")) == sorted(keys), keys
    assert all(redis.get_int(k) == 1 for k in keys), {k: redis.get_int(k) for k in keys}


def test_the_service_flag_wins_over_the_plugin_configuration(tmp_path):
    fixed = {"x-tenant-id": {"default": {"perminute": 10}}}
    gen = harness.generate(fixed, tmp_path / "gen", "api")
    at = _ms(datetime(2026, 12, 5, 11, 30, 30)) // 1000
    envoy = run_cli("explain", "--plugin-config", gen.plugin_config_path, "--tenant", "a",
                    "--at", at).stdout
    assert "service:" not in envoy and "  redis key:  api_generic_key_per_minute_tenant_a_" in envoy
    counted = run_cli("explain", "--plugin-config", gen.plugin_config_path, "--tenant", "a",
                      "--at", at, "--service", "counter").stdout
    assert ("service: counter (--service; the plugin configuration's "
            "rate_limit_service.service is envoy-ratelimit)") in counted, counted
    assert "  redis key:  trl:{3:api:a}:per_minute:1796470200000\n" in counted, counted
    # A team file is read for the service named: a calendar month needs the counter.
    team = tmp_path / "monthly.json"
    team.write_text('{"x-tenant-id": {"default": {"permonth": 5}}}')
    refused = run_cli("explain", team, "--domain", "api", "--tenant", "a", check=False)
    assert refused.returncode == 1 and "permonth" in refused.stderr, refused
    monthly = run_cli("explain", team, "--domain", "api", "--tenant", "a", "--at", at,
                      "--service", "counter").stdout
    assert "2026-12-01T00:00:00Z to 2027-01-01T00:00:00Z" in monthly, monthly
    # The counter has no CACHE_KEY_PREFIX.
    prefixed = run_cli("explain", team, "--domain", "api", "--tenant", "a",
                       "--service", "counter", "--key-prefix", "p:", check=False)
    assert prefixed.returncode == 2 and "--key-prefix" in prefixed.stderr, prefixed

"""A bad plugin configuration is refused: the filter's on_configure logs a line
naming the field and returns false, and Envoy then refuses to start (it exits
non-zero during startup; it never serves half-configured)."""

from __future__ import annotations

import json
import subprocess

import pytest

import harness
from harness import free_port

GOOD_LIMITS = {"x-tenant-id": {"default": {"persecond": 5, "perminute": 20, "perhour": 30}}}


def _unknown_key(cfg):
    cfg["bogus"] = 1


def _negative_limit(cfg):
    cfg["limits"]["x-tenant-id"]["default"]["perhour"] = -5


def _no_limits(cfg):
    del cfg["limits"]


def _empty_limits(cfg):
    cfg["limits"] = {}


def _bad_missing_tenant(cfg):
    cfg["missing_tenant"] = "sometimes"


def _local_unknown_group(cfg):
    cfg["local"] = {"groups": {"gold": {"tokens_per_second": 10}}}


def _max_tenant_length_too_big(cfg):
    cfg["max_tenant_length"] = 5000


def _deny_with_a_success_status(cfg):
    cfg["on_failure"] = "deny"
    cfg["status_on_error"] = 200


def _local_without_envoys(cfg):
    cfg["on_failure"] = "local"


def _breaker_probe_too_fast(cfg):
    cfg["breaker"] = {"probe_interval_ms": 1}


def _bad_response_cost_header(cfg):
    cfg["response_cost_header"] = "X Cost"


def _bad_route(cfg):
    cfg["limits"]["x-tenant-id"]["default"]["routes"] = {"reports*": {"perminute": 5}}


# (mutation of a generated plugin-config.json, strings the Envoy log must contain)
BAD_CONFIGS = {
    "unknown-key": (_unknown_key, ["invalid configuration", '"bogus"']),
    "negative-limit": (_negative_limit,
                       ["invalid configuration", "limits.x-tenant-id.default.perhour", "-5"]),
    "no-limits": (_no_limits, ["invalid configuration", "limits"]),
    "empty-limits": (_empty_limits, ["invalid configuration", "limits"]),
    "bad-missing-tenant": (_bad_missing_tenant, ["invalid configuration", "missing_tenant"]),
    "local-unknown-group": (_local_unknown_group,
                            ["invalid configuration", "local.groups.gold: no such group"]),
    "max-tenant-length-too-big": (_max_tenant_length_too_big,
                                  ["invalid configuration",
                                   "max_tenant_length: must be at most 4096 (bytes), got 5000"]),
    "deny-with-a-success-status": (_deny_with_a_success_status,
                                   ["invalid configuration", "status_on_error: 200"]),
    "local-without-envoys": (_local_without_envoys,
                             ["invalid configuration", "fallback.envoys"]),
    "breaker-probe-too-fast": (_breaker_probe_too_fast,
                               ["invalid configuration", "breaker.probe_interval_ms"]),
    "bad-response-cost-header": (_bad_response_cost_header,
                                 ["invalid configuration", "response_cost_header"]),
    "bad-route": (_bad_route, ["invalid configuration",
                               "limits.x-tenant-id.default.routes.reports*", "wildcard"]),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_envoy_refuses_a_bad_plugin_configuration(stack, case):
    mutate, expected_in_log = BAD_CONFIGS[case]
    cfg = stack.generate(GOOD_LIMITS).plugin_config()
    mutate(cfg)

    # Nothing needs to listen on the ratelimit and upstream ports: the
    # configuration is refused before any request.
    envoy = stack.envoy(cfg, free_port(), free_port(), wait=False)
    outcome = envoy.outcome(deadline_s=30)
    log = envoy.process.log_text()
    assert outcome.startswith("exited "), f"{outcome}\n{envoy.process.tail()}"
    assert envoy.process.returncode != 0
    config_lines = [line for line in log.splitlines() if "invalid configuration" in line]
    assert config_lines, envoy.process.tail()
    for s in expected_in_log:
        assert any(s in line for line in config_lines), (s, config_lines)
    assert "Unable to create Wasm plugin" in log, envoy.process.tail()


@pytest.mark.parametrize("case", ["negative-limit", "unknown-key"])
def test_envoy_validate_mode_refuses_a_bad_plugin_configuration(stack, case):
    """`envoy --mode validate` runs on_configure too, so `make validate` catches these."""
    mutate, expected_in_log = BAD_CONFIGS[case]
    cfg = stack.generate(GOOD_LIMITS).plugin_config()
    mutate(cfg)
    path = stack.workdir / "bad.yaml"
    path.write_text(harness.render_envoy_config(
        cfg, listen_port=10000, admin_port=10001, rls_port=10002, upstream_port=10003))
    proc = subprocess.run(harness.envoy_argv(path, 1, ["--mode", "validate"]),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert all(s in out for s in expected_in_log), out[-3000:]


# ------------------------------------------------------------------ raw text
# What a dict cannot hold: a key given twice, a byte order mark, a huge value.
# The plugin configuration is written as text, so the test knows the place
# of each key and checks that the log names it.

def _place(text: str, needle: str, nth: int) -> str:
    """line:column (1-based, in characters) of the nth occurrence of needle."""
    at = -1
    for _ in range(nth):
        at = text.index(needle, at + 1)
    line_start = text.rfind("\n", 0, at) + 1
    return f"{text.count(chr(10), 0, at) + 1}:{at - line_start + 1}"


def _duplicate_domain(cfg: dict) -> tuple[str, str]:
    text = json.dumps(cfg, indent=2)
    # A second "domain", as a hand edit would leave it: JSON keeps the last.
    text = text.replace('\n  "limits":', '\n  "domain": "other-domain",\n  "limits":', 1)
    first, second = _place(text, '"domain"', 1), _place(text, '"domain"', 2)
    return text, f'domain: duplicate key "domain" at {second} (first at {first})'


def _duplicate_in_limits(cfg: dict) -> tuple[str, str]:
    text = json.dumps(cfg, indent=2)
    # The default group pasted twice inside limits, the second one looser.
    text = text.replace('"default": {', '"default": {"perhour": 1000},\n      "default": {', 1)
    first, second = _place(text, '"default"', 1), _place(text, '"default"', 2)
    return text, (f'limits.x-tenant-id.default: duplicate key "default" at {second} '
                  f'(first at {first})')


def _bom(cfg: dict) -> tuple[str, str]:
    return "\ufeff" + json.dumps(cfg), "starts with a UTF-8 byte order mark (BOM)"


def _huge_value(cfg: dict) -> tuple[str, str]:
    cfg["missing_tenant"] = "x" * (1 << 20)
    shown = "x" * 64
    return json.dumps(cfg), ('missing_tenant: must be one of "allow", "deny", '
                             f'got string "{shown}"… (1048576 bytes)')


RAW_CONFIGS = {
    "duplicate-key": _duplicate_domain,
    "duplicate-key-in-limits": _duplicate_in_limits,
    "bom": _bom,
    "huge-value": _huge_value,
}


@pytest.mark.parametrize("case", sorted(RAW_CONFIGS))
def test_envoy_refuses_what_only_the_text_shows(stack, case):
    cfg = stack.generate(GOOD_LIMITS).plugin_config()
    text, expected = RAW_CONFIGS[case](cfg)
    envoy = stack.envoy(text, free_port(), free_port(), wait=False)
    outcome = envoy.outcome(deadline_s=30)
    log = envoy.process.log_text()
    assert outcome.startswith("exited "), f"{outcome}\n{envoy.process.tail()}"
    assert envoy.process.returncode != 0
    assert "Unable to create Wasm plugin" in log, envoy.process.tail()
    config_lines = [line for line in log.splitlines() if "invalid configuration" in line]
    assert [line for line in config_lines if expected in line], (expected, config_lines)
    # Only that: the rest of the configuration is good.
    assert len(config_lines) == 1, config_lines
    # Envoy may log the configuration elsewhere; the filter's own line stays short.
    assert all(len(line) < 600 for line in config_lines), [len(x) for x in config_lines]

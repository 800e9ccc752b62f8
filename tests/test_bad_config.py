"""A bad plugin configuration is refused: the filter's on_configure logs a line
naming the field and returns false, and Envoy then refuses to start (it exits
non-zero during startup; it never serves half-configured)."""

from __future__ import annotations

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

"""ratelimit-config: what it generates is what the filter and the service run on,
and a bad team JSON is refused before anything is written."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter

import pytest

import harness
from harness import REPO, run_cli, run_sequential, tally, unique

FIXTURES = REPO / "ratelimit-config" / "tests" / "fixtures"

LIMITS = {"x-tenant-id": {"default": {"perhour": 3}}}


def test_generate_flags_land_in_the_plugin_config(tmp_path):
    gen = harness.generate(LIMITS, tmp_path, "flags-domain", cluster="rls-cluster",
                           timeout_ms=250)
    cfg = gen.plugin_config()
    assert cfg["domain"] == "flags-domain"
    assert cfg["limits"] == LIMITS
    assert cfg["rate_limit_service"] == {"cluster": "rls-cluster", "timeout_ms": 250,
                                         "batch": {"max_descriptors": 100, "max_in_flight": 2}}
    assert re.search(r"^domain: \"?flags-domain\"?$", gen.ratelimit_yaml.read_text(), re.M)


def test_the_filter_calls_the_cluster_the_config_names(stack):
    # The bootstrap names the cluster after the plugin config, so if the
    # filter called any other cluster, nothing would be limited.
    gen = stack.generate(LIMITS, cluster="rls-cluster", timeout_ms=harness.COUNTING_TIMEOUT_MS)
    fleet = stack.fleet(gen, envoys=1)
    assert "rls-cluster" in fleet.envoys[0].config_path.read_text()
    harness.ensure_window_room(3600, 60)
    results = run_sequential(fleet.urls, 5, tenant=unique("tenant"))
    assert tally(results) == Counter({200: 3, 429: 2}), harness.summary(results)
    assert fleet.counters()["rls_error"] == 0


@pytest.mark.parametrize("limits, field", [
    ({"x-tenant-id": {"default": {"perhour": -5}}}, "perhour"),
    ({"x-tenant-id": {"default": {"perweek": 5}}}, "perweek"),
    ({"x-tenant-id": {"default": {"perhour": "ten"}}}, "perhour"),
    ({}, ""),
])
def test_cli_refuses_a_bad_team_json(tmp_path, limits, field):
    path = tmp_path / "limits.json"
    path.write_text(json.dumps(limits))
    out_dir = tmp_path / "out"
    proc = run_cli("generate", path, "--domain", "internal-api", "--out", out_dir, check=False)
    assert proc.returncode != 0, proc
    assert field in proc.stderr, proc.stderr
    for name in ("plugin-config.json", "ratelimit.yaml", "envoy-rate-limits.yaml"):
        assert not (out_dir / name).exists(), name


@pytest.mark.parametrize("kind", ["bad", "warn"])
def test_the_binary_prints_each_fixtures_expected_output(kind):
    """The cargo tests check the library against ratelimit-config/tests/fixtures;
    this checks the installed binary: stderr exactly the .expected file, and
    exit status 1 for errors, 0 for warnings alone."""
    cases = sorted((FIXTURES / kind).glob("*.json"))
    assert len(cases) >= (30 if kind == "bad" else 2)
    for case in cases:
        proc = subprocess.run([str(harness.CLI), "validate", case.name], cwd=case.parent,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
        assert proc.stderr == case.with_suffix(".expected").read_text(), case.name
        assert proc.returncode == (1 if kind == "bad" else 0), case.name
    # Several files at once: every problem of every file, one status.
    proc = run_cli("validate", *cases, check=False)
    assert proc.returncode == (1 if kind == "bad" else 0)
    assert len(proc.stderr.splitlines()) >= len(cases)


def test_help_teaches_the_format():
    out = run_cli("--help").stdout
    for s in ['"header_value"', "persecond, perminute, perhour, perday", "<file>:<line>:<col>",
              "validate", "generate", "explain", "check", "schema"]:
        assert s in out, s
    assert "--domain" in run_cli("explain", "--help").stdout

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
                                         "batch": {"max_descriptors": 100, "max_in_flight": 1}}
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


def _check(plugin, service):
    return subprocess.run([str(harness.CLI), "check", "--plugin-config", str(plugin),
                           "--service-config", str(service)],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("target, plugin", [
    ("istio", "wasmplugin.yaml"),
    ("envoy-gateway", "envoyextensionpolicy.yaml"),
    ("envoy", "envoy.yaml"),
    ("envoy", "http-filter.yaml"),
])
def test_check_reads_what_is_deployed(tmp_path, target, plugin):
    """check takes the deployed objects as they are: the plugin configuration
    inside a WasmPlugin, an EnvoyExtensionPolicy or an Envoy bootstrap, the
    rules inside a ConfigMap; a mismatch is named at its line in that file."""
    rules = (REPO / "deploy" / target / "ratelimit.yaml").read_text()
    cm = tmp_path / "configmap.yaml"
    body = "".join("    " + line + "\n" for line in rules.splitlines())
    cm.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ratelimit-config\n"
                  "data:\n  ratelimit.yaml: |\n" + body)
    deployed = REPO / "deploy" / target / plugin
    ok = _check(deployed, cm)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: 7 descriptors of 2 groups"), ok.stdout

    # One limit edited in the rules: named at its line in the ConfigMap.
    lines = cm.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if "requests_per_unit: 700" in line)
    lines[n] = lines[n].replace("700", "701")
    cm.write_text("\n".join(lines) + "\n")
    bad = _check(deployed, cm)
    assert bad.returncode == 1
    assert bad.stderr.startswith(f"{cm}:{n + 1}:"), bad.stderr
    assert "allows 701 per minute, but the group sets perminute 700" in bad.stderr

    # A domain typo in the deployed object says so.
    typo = tmp_path / plugin
    typo.write_text(deployed.read_text().replace('internal-api', 'internal-apj'))
    bad = _check(typo, cm)
    assert bad.returncode == 1
    assert 'is not the filter\'s domain "internal-apj"' in bad.stderr, bad.stderr
    assert "of 0 descriptors" not in bad.stderr


def test_check_names_a_bad_setting_at_its_line_in_a_wasmplugin(tmp_path):
    wp = REPO / "deploy" / "istio" / "wasmplugin.yaml"
    lines = wp.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if "max_tenant_length:" in line)
    lines[n] = "    max_tenant_length: -1"
    bad_wp = tmp_path / "wasmplugin.yaml"
    bad_wp.write_text("\n".join(lines) + "\n")
    out = _check(bad_wp, REPO / "deploy" / "istio" / "ratelimit.yaml")
    assert out.returncode == 1
    assert out.stderr.startswith(f"{bad_wp}:{n + 1}:24: max_tenant_length: must be a positive integer"), out.stderr
    other = _check(REPO / "deploy" / "istio" / "networkpolicy.yaml",
                   REPO / "deploy" / "istio" / "ratelimit.yaml")
    assert "no plugin configuration here: found NetworkPolicy" in other.stderr, other.stderr


@pytest.mark.parametrize("text, says", [
    ('// ours\n{"x-tenant-id": {"default": {"perhour": 1}}}', "JSON has no comments"),
    ("{'x-tenant-id': {'default': {'perhour': 1}}}", "double quotes"),
    ("x-tenant-id:\n  default: {perhour: 1}\n", "looks like YAML"),
    ('{"x-tenant-id": {"default": {"perhour": 99999999999999999999999}}}',
     "got 99999999999999999999999"),
    ('{"domain": "d", "limits": {"x-tenant-id": {"default": {"perhour": 1}}},'
     ' "rate_limit_service": {"cluster": "c"}}', "this is a plugin configuration"),
])
def test_validate_names_the_cause(text, says):
    out = subprocess.run([str(harness.CLI), "validate", "-"], input=text,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert says in out.stderr, out.stderr


def test_explain_says_a_too_long_tenant_is_refused(tmp_path):
    gen = harness.generate(LIMITS, tmp_path, "d")
    out = subprocess.run([str(harness.CLI), "explain", "--plugin-config",
                          str(tmp_path / "plugin-config.json"), "--tenant", "t" * 200],
                         capture_output=True, text=True, timeout=30)
    assert gen and out.returncode == 0
    assert "the filter answers 431" in out.stdout, out.stdout

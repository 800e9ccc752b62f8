"""deploy/prometheus/alerts.yml: valid for promtool, its unit tests
(alerts.test.yml) pass, and every metric it reads is one a real Envoy running
the filter shows in /stats/prometheus."""

from __future__ import annotations

import re
import subprocess
from collections import Counter

import yaml

import harness
from harness import ensure_window_room, run_sequential, tally, unique, wait_until

PROMTOOL = harness.tool("TRL_PROMTOOL", ".deps/prometheus/usr/bin/promtool")
RULES_DIR = harness.REPO / "deploy" / "prometheus"
RULES = RULES_DIR / "alerts.yml"
RULE_TESTS = RULES_DIR / "alerts.test.yml"
# The per-group rule reads the group counters with a `group` label, which
# depends on the stats tags of the Envoy configuration (README "Metrics").
GROUP_LABELLED = "tenant_ratelimit_group_failed_open"
FLUSH_DEADLINE_S = 30.0


def promtool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(PROMTOOL), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_promtool_accepts_the_rules():
    r = promtool("check", "rules", RULES)
    assert r.returncode == 0, r.stdout + r.stderr
    # Every rule was read: 1 recording rule, 12 alerts.
    assert "SUCCESS: 13 rules found" in r.stdout, r.stdout


def test_the_alerts_fire_on_their_unit_test_series():
    r = promtool("test", "rules", RULE_TESTS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout, r.stdout


def test_every_alert_has_a_unit_test_that_fires_it():
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"]
              for r in g["rules"] if "alert" in r}
    fired = {case["alertname"] for t in yaml.safe_load(RULE_TESTS.read_text())["tests"]
             for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert len(alerts) == 12, alerts
    assert alerts <= fired, f"alerts no unit test fires: {sorted(alerts - fired)}"


def test_promtool_rejects_a_broken_rule(tmp_path):
    # The check above can fail: a rule with a syntax error does not pass.
    broken = tmp_path / "broken.yml"
    broken.write_text(RULES.read_text().replace("> 0.01", "> > 0.01", 1))
    r = promtool("check", "rules", broken)
    assert r.returncode != 0, r.stdout


def metric_names(text: str) -> set[str]:
    """The metric names the rules' expressions read (not recording rules' names)."""
    doc = yaml.safe_load(text)
    names = set()
    for group in doc["groups"]:
        for rule in group["rules"]:
            names.update(re.findall(r"(?<![:\w])tenant_ratelimit_[a-z_]+\b", rule["expr"]))
    return names


def test_every_metric_the_rules_read_is_in_a_real_scrape(stack):
    fleet = stack.fleet({"x-tenant-id": {"default": {"perhour": 2}}}, envoys=1,
                        timeout_ms=harness.COUNTING_TIMEOUT_MS)
    envoy = fleet.envoys[0]
    ensure_window_room(3600, 60)
    results = run_sequential(fleet.urls, 4, tenant=unique("tenant"))
    assert tally(results) == Counter({200: 2, 429: 2}), harness.summary(results)

    # Histograms appear once Envoy has merged the workers' values.
    count = ("tenant_ratelimit_rls_latency_ms_count", ())
    wait_until(lambda: envoy.prometheus("tenant_ratelimit_rls_latency_ms").get(count, 0) >= 1,
               "the latency histogram in /stats/prometheus", FLUSH_DEADLINE_S)
    seen = {name for name, _ in envoy.prometheus()}
    wanted = metric_names(RULES.read_text())
    assert "tenant_ratelimit_rls_latency_ms_bucket" in wanted, wanted
    assert GROUP_LABELLED in wanted, wanted
    # Every name the rules read is in the scrape, the per-group counter with
    # its group label (the project's bootstrap has the stats tags).
    missing = sorted(n for n in wanted if n not in seen)
    assert not missing, f"not in Envoy's scrape: {missing}\nseen: {sorted(seen)}"

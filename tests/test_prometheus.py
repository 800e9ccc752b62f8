"""A real Prometheus (Debian's package, `make deps-prometheus`) scraping a real
Envoy running the filter and the real rate-limit service, with the rules of
deploy/prometheus/alerts.yml: every query of the Grafana dashboard in
deploy/grafana/ returns series, and when the service is killed under traffic
the alerts for it fire.

The rules run with their `for:` durations cut to 0s (and Prometheus scrapes
and evaluates every second), so that the test waits seconds, not the minutes
the shipped rules wait; `promtool test rules` (tests/test_alerts.py) checks
the durations themselves."""

from __future__ import annotations

import json
import re
from collections import Counter

import requests
import yaml

import harness
from harness import LOOPBACK, ensure_window_room, run_sequential, tally, unique, wait_until

PROMETHEUS = harness.tool("TRL_PROMETHEUS", ".deps/prometheus/usr/bin/prometheus")
RULES = harness.REPO / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = harness.REPO / "deploy" / "grafana" / "tenant-ratelimit.json"
SERIES_DEADLINE_S = 60.0
ALERT_DEADLINE_S = 60.0


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


class Prometheus:
    def __init__(self, stack, scrape: dict[str, str], envoy_metrics_path: str):
        self.port = harness.free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        d = stack.workdir / "prometheus"
        d.mkdir(parents=True, exist_ok=True)
        rules = d / "alerts.yml"
        rules.write_text(re.sub(r"^(\s+)for: \S+$", r"\1for: 0s", RULES.read_text(), flags=re.M))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                       "scrape_timeout": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {"job_name": "envoy", "metrics_path": envoy_metrics_path,
                 "static_configs": [{"targets": [scrape["envoy"]]}]},
                {"job_name": "ratelimit", "static_configs": [{"targets": [scrape["ratelimit"]]}]},
            ],
        }
        (d / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.process = stack.spawn("prometheus", [
            str(PROMETHEUS), f"--config.file={d / 'prometheus.yml'}",
            f"--storage.tsdb.path={d / 'data'}", f"--web.listen-address={LOOPBACK}:{self.port}",
            "--log.level=warn"])
        wait_until(lambda: harness.http_ok(f"{self.url}/-/ready"), "prometheus /-/ready",
                   process=self.process)

    def api(self, path: str, **params) -> dict:
        r = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=5)
        r.raise_for_status()
        return r.json()["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def firing(self) -> set[str]:
        return {a["labels"]["alertname"] for a in self.api("alerts")["alerts"]
                if a["state"] == "firing"}

    def targets_up(self) -> dict[str, str]:
        return {t["labels"]["job"]: t["health"] for t in self.api("targets")["activeTargets"]}


def test_the_dashboard_has_series_and_the_alerts_fire_when_the_service_dies(stack):
    limits = {"x-tenant-id": {"default": {"perminute": 3},
                              "gold": {"perminute": 100, "header_value": ["gold-1"]}}}
    fleet = stack.fleet(limits, envoys=1, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    envoy, rls = fleet.envoys[0], fleet.ratelimit
    prom = Prometheus(stack, {"envoy": envoy.admin_url.split("//", 1)[1],
                              "ratelimit": f"{LOOPBACK}:{rls.metrics_port}"},
                      "/stats/prometheus")
    ensure_window_room(60, 20)
    tenant = unique("tenant")
    results = run_sequential(fleet.urls, 5, tenant=tenant)
    assert tally(results) == Counter({200: 3, 429: 2}), harness.summary(results)
    results = run_sequential(fleet.urls, 3, tenant="gold-1")
    assert tally(results) == Counter({200: 3}), harness.summary(results)
    wait_until(lambda: prom.targets_up() == {"envoy": "up", "ratelimit": "up"},
               "both targets up in prometheus", SERIES_DEADLINE_S)
    # Every panel's query returns series (rates need two scrapes).
    queries = dashboard_queries()
    assert len(queries) >= 10
    empty: list[str] = []

    def all_have_series() -> bool:
        empty[:] = [f"{title}: {expr}" for title, expr in queries if not prom.query(expr)]
        return not empty

    try:
        wait_until(all_have_series, "every dashboard query has series", SERIES_DEADLINE_S)
    except harness.HarnessError:
        raise AssertionError(f"dashboard queries without series: {empty}")
    # Nothing fires on a healthy stack.
    assert prom.firing() == set(), prom.api("alerts")
    # The service dies under traffic: requests fail open, the breaker opens,
    # the scrape of the service fails; the alerts say so.
    rls.process.kill()
    wanted = {"TenantRatelimitServiceDown", "TenantRatelimitFailingOpen",
              "TenantRatelimitBreakerOpen"}

    def fired() -> bool:
        r = harness.send(fleet.urls[0], tenant=unique("tenant"))
        assert r.status == 200, r  # fail open (on_failure allow)
        return wanted <= prom.firing()

    try:
        wait_until(fired, "the service's alerts firing", ALERT_DEADLINE_S)
    except harness.HarnessError:
        raise AssertionError(f"firing: {prom.firing()}, wanted {wanted}")

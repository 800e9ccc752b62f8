"""`make bench`'s harness, run tiny (`bench/bench.py --smoke`: one 1-second
run per scenario and configuration) so that it cannot rot. No figure is
asserted: only that every scenario ran against every configuration, that each
configuration did what it is there for, and that the report was written."""
import json
import subprocess
import sys

from harness import REPO

SCENARIOS = {"allowed", "hot", "local_shed", "mixed"}
CONFIGS = {"baseline", "native", "filter"}


def test_bench_smoke_runs_every_scenario_against_every_configuration(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench.py"), "--smoke", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = tmp_path / "latest"
    results = json.loads((out / "results.json").read_text())
    runs = {(r["scenario"], r["config"]): r for r in results["runs"]}
    assert set(runs) == {(s, c) for s in SCENARIOS for c in CONFIGS}
    for key, run in runs.items():
        assert run["requests"] > 0, key
        assert sum(run["statuses"].values()) == run["requests"], key

    for scenario in SCENARIOS:
        # No rate-limit filter: every request reaches the upstream, no call is made.
        baseline = runs[(scenario, "baseline")]
        assert set(baseline["statuses"]) == {"200"}, scenario
        assert baseline["rls_calls"] == 0, scenario
    for config in ("native", "filter"):
        # The allowed path asks the service about every request and admits it.
        allowed = runs[("allowed", config)]
        assert set(allowed["statuses"]) == {"200"}, config
        assert allowed["rls_calls"] >= allowed["requests"], config
        # A tenant over its quota, and one bursting past its bucket, are refused.
        for scenario in ("hot", "local_shed"):
            assert runs[(scenario, config)]["statuses"].get("429", 0) > 0, (scenario, config)
    # The filter remembers the hot tenant's refusal; Envoy's own filter asks again.
    hot_filter, hot_native = runs[("hot", "filter")], runs[("hot", "native")]
    assert hot_filter["rls_calls"] < hot_filter["requests"] // 2
    assert hot_native["rls_calls"] >= hot_native["statuses"].get("429", 0)

    table = (out / "table.md").read_text()
    assert "| Scenario | Configuration | req/s | p50 ms | p99 ms |" in table
    for scenario in SCENARIOS:
        assert f"| {scenario} | this filter |" in table
    assert (out / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Envoy native" in proc.stdout

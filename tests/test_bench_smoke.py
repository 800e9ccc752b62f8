"""`make bench`'s harness, run tiny (`bench/bench.py --smoke`: one 1-second
run per scenario and configuration) so that it cannot rot. No throughput or
latency figure is asserted: only that every scenario ran against every
configuration, that each configuration did what it is there for, that the
calls, fail-opens and admitted-per-window figures are there and count what
they say, and that the report was written."""
import json
import subprocess
import sys

from harness import REPO

sys.path.insert(0, str(REPO / "bench"))
import report  # noqa: E402

SCENARIOS = {"allowed", "hot", "local_shed", "mixed", "pinned"}
CONFIGS = {"baseline", "native", "filter", "filter_lease", "filter_sync"}
LIMITING = CONFIGS - {"baseline"}
# Until lease and sync land every configuration of this filter runs as
# "exact"; what is asserted of them below holds in every mode.
EXACT = {"native", "filter"}
OUTAGE_CONFIGS = {"native", "filter", "filter_local"}
# The wasm machinery alone (limits nothing, calls nothing): not in the
# pinned and outage scenarios. The floor of a wasm refusal, and this filter
# with the refusal log (its cost): where nearly every request is refused.
NOOP_SCENARIOS = SCENARIOS - {"pinned"}
REPLY_SCENARIOS = {"local_shed", "hot"}
LOGGED_SCENARIOS = {"local_shed", "hot"}
CPU_COMPONENTS = {"envoy", "service", "redis", "upstream", "wrk"}
# The same Envoys against ratelimit-counter: every one on the allowed path,
# two in the hot scenario.
COUNTER_ALLOWED = {"native_counter", "filter_exact_counter", "filter_exact_counter_memory",
                   "filter_lease_counter", "filter_sync_counter"}
COUNTER_HOT = {"native_counter", "filter_exact_counter"}


def test_bench_smoke_runs_every_scenario_against_every_configuration(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench.py"), "--smoke", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = tmp_path / "latest"
    results = json.loads((out / "results.json").read_text())
    runs = {(r["scenario"], r["config"]): r for r in results["runs"]}
    # The pinned scenario is about a quota: no baseline fleet. The outage
    # scenario compares Envoy's filters with this filter's two fallbacks.
    assert set(runs) == ({(s, c) for s in SCENARIOS for c in CONFIGS} - {("pinned", "baseline")}
                         | {("outage", c) for c in OUTAGE_CONFIGS}
                         | {(s, "wasm_noop") for s in NOOP_SCENARIOS}
                         | {(s, "wasm_reply") for s in REPLY_SCENARIOS}
                         | {(s, "filter_logged") for s in LOGGED_SCENARIOS}
                         | {("allowed", c) for c in COUNTER_ALLOWED}
                         | {("hot", c) for c in COUNTER_HOT})
    for key, run in runs.items():
        # With the service frozen, every call waits its whole 1 s timeout
        # (this filter's too, until its breaker opens): a 1-second run may
        # end before an answer.
        assert run["requests"] > 0 or key[0] == "outage", key
        assert sum(run["statuses"].values()) == run["requests"], key
        # Every run has its CPU profile and Redis's commands.
        assert set(run["cpu_s"]) == CPU_COMPONENTS, key
        assert all(v >= 0 for v in run["cpu_s"].values()), (key, run["cpu_s"])
        assert isinstance(run["redis_commands"], dict), key
    for scenario in SCENARIOS - {"outage"}:
        # Envoy worked and wrk sent: their CPU time is counted.
        cpu = runs[(scenario, "filter")]["cpu_s"]
        assert cpu["envoy"] > 0 and cpu["wrk"] > 0, (scenario, cpu)
    for scenario in NOOP_SCENARIOS:
        noop = runs[(scenario, "wasm_noop")]
        assert set(noop["statuses"]) == {"200"}, scenario
        assert noop["rls_calls"] == 0, scenario
    for scenario in REPLY_SCENARIOS:
        reply = runs[(scenario, "wasm_reply")]
        assert set(reply["statuses"]) == {"429"}, scenario
        assert reply["rls_calls"] == 0, scenario

    for scenario in SCENARIOS - {"pinned"}:
        # No rate-limit filter: every request reaches the upstream, no call is made.
        baseline = runs[(scenario, "baseline")]
        assert set(baseline["statuses"]) == {"200"}, scenario
        assert baseline["rls_calls"] == 0, scenario
    for config in EXACT:
        # The allowed path asks the service about every request and admits it,
        # and each Envoy's own count of its calls is the service's count: the
        # native filter's calls and this filter's are counted the same way.
        allowed = runs[("allowed", config)]
        assert set(allowed["statuses"]) == {"200"}, config
        assert allowed["rls_calls"] >= allowed["requests"], config
        assert allowed["rls_calls"] == allowed["service_calls"], config
        # Each call carried a descriptor at least, and the service counted them in Redis.
        assert allowed["redis_commands"].get("incrby", 0) > 0, config
    allowed = runs[("allowed", "filter")]
    assert allowed["rls_descriptors"] >= allowed["rls_calls"] > 0, allowed
    for config in COUNTER_ALLOWED:
        # The counter answered every call these Envoys made (its own count of
        # them is theirs), none failed open, every request was admitted; on
        # Redis it counted with its script (EVALSHA: the INCRBY Redis counts
        # are the script's, not sent); the memory store sent Redis nothing.
        allowed = runs[("allowed", config)]
        assert allowed["service"] == "counter", config
        assert set(allowed["statuses"]) == {"200"}, (config, allowed["statuses"])
        if config in ("filter_lease_counter", "filter_sync_counter"):
            # A lease refill or a sync push of an Envoy that ran before may
            # reach the shared counter during the run.
            assert allowed["service_calls"] >= allowed["rls_calls"] > 0, config
        else:
            assert allowed["rls_calls"] == allowed["service_calls"] > 0, config
        assert allowed["failed_open"] == 0 and allowed["rls_errors"] == 0, config
        commands, sent = allowed["redis_commands"], allowed["redis_commands_sent"]
        assert "incrby" not in sent, (config, sent)
        if config.endswith("_memory"):
            assert not {"evalsha", "incrby"} & set(commands), (config, commands)
        else:
            assert sent.get("evalsha", 0) > 0, (config, sent)
            assert commands.get("incrby", 0) > 0, (config, commands)
    for config in ("native_counter", "filter_exact_counter"):
        # Exact mode asks the counter about every request, as against
        # envoyproxy/ratelimit.
        allowed = runs[("allowed", config)]
        assert allowed["rls_calls"] >= allowed["requests"], config
    assert runs[("allowed", "filter")]["service"] == "ratelimit"
    for config in LIMITING:
        # Both filters' calls get the 1 s timeout: none fails open.
        assert runs[("allowed", config)]["failed_open"] == 0, config
        # A tenant over its quota, and one bursting past its bucket, are refused.
        for scenario in ("hot", "local_shed"):
            assert runs[(scenario, config)]["statuses"].get("429", 0) > 0, (scenario, config)
    for config in COUNTER_HOT:
        # The counter refuses the hot tenant too, and admits no more than its
        # limit per minute window (up to the requests in flight at a
        # window's edge, which the upstream may see in the next second).
        hot = runs[("hot", config)]
        assert hot["statuses"].get("429", 0) > 0, config
        assert hot["failed_open"] == 0, config
        w = report.quota_windows(results, "hot", config)["minute"]
        assert all(a <= w["limit"] + results["settings"]["connections"]
                   for a in w["admitted"]), (config, w)
    # The filter remembers the hot tenant's refusal; Envoy's own filter asks again.
    hot_filter, hot_native = runs[("hot", "filter")], runs[("hot", "native")]
    assert hot_filter["rls_calls"] < hot_filter["requests"] // 2
    assert hot_native["rls_calls"] >= hot_native["statuses"].get("429", 0)

    # The pinned tenant, alone on one Envoy of three, gets its whole quota in
    # every minute window it asked for more: exactly (up to the requests in
    # flight at a window's edge) in exact mode, and in no mode a third of it.
    quota = results["settings"]["pinned_quota_per_minute"]
    in_flight = results["settings"]["connections"]
    for config in LIMITING:
        w = report.quota_windows(results, "pinned", config)["minute"]
        assert w["limit"] == quota
        assert w["admitted"], config
        assert min(w["admitted"]) > quota / results["settings"]["pinned_fleet"], (config, w)
        if config in EXACT:
            assert all(abs(a - quota) <= in_flight for a in w["admitted"]), (config, w)
        # The tenant spread over the other two Envoys was sent and counted too.
        spread = results["quota"]["pinned"]["spread"][config]
        assert spread in results["windows"]["pinned"][config], config

    table = (out / "table.md").read_text()
    assert ("| Scenario | Configuration | req/s | p50 ms | p99 ms | Status mix "
            "| Service calls / request | Failed open | Admitted per window") in table
    for scenario in SCENARIOS:
        for label in ("this filter", "this filter, lease", "this filter, sync"):
            assert f"| {scenario} | {label} |" in table, (scenario, label)
    # The quota scenarios' rows carry admitted-per-window figures against the limit.
    assert " of 50/min (n=" in table
    assert "| Configuration | pinned tenant: max / mean / min of quota |" in table
    assert ("| Scenario | Configuration | req/s | vs native (worst) | vs wasm_noop "
            "| vs wasm_reply |") in table
    assert "| local_shed | wasm, 429 at once |" in table
    # The counter's rows, and the counter against envoyproxy/ratelimit.
    for label in ("Envoy native + counter", "this filter + counter",
                  "this filter + counter, memory store"):
        assert f"| allowed | {label} |" in table, label
    assert ("| allowed | this filter + counter | this filter | ") in table
    assert ("| allowed | Envoy native + counter | Envoy native | ") in table
    assert ("| allowed | this filter + counter, memory store | this filter + counter | ") in table
    # Like with like: no Envoy under test logs its refusals but the one
    # that measures the log; its cost per refusal has a table, and the
    # targets theirs.
    stack = out / "stack"
    for config in ("filter", "filter_lease", "filter_sync", "wasm_noop", "wasm_reply",
                   "filter_exact_counter"):
        assert "access_log:" not in (stack / f"{config}.yaml").read_text(), config
    assert "tenant_ratelimit_verdict" in (stack / "filter_logged.yaml").read_text()
    for scenario in LOGGED_SCENARIOS:
        assert runs[(scenario, "filter_logged")]["statuses"].get("429", 0) > 0, scenario
    assert "| Scenario | with the log: Envoy µs / refusal | without | the log |" in table
    assert "| local_shed | this filter | req/s vs Envoy native |" in table
    assert "| hot | this filter | req/s vs wasm, 429 at once |" in table
    assert "| allowed | this filter, lease | Envoy CPU above wasm_noop / native's" in table
    assert (out / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Envoy native" in proc.stdout

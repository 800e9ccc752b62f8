"""`make bench-hostcalls`' harness, run tiny (`bench/hostcalls.py --smoke`:
one 1-second run per scenario, two probe kinds) so that the hostcall-count
build and the probe cannot rot. No cost is asserted: only that every
scenario ran, and that the counters count what Envoy itself counts (its
local replies, its calls through the rate-limit cluster)."""
import json
import subprocess
import sys

from harness import REPO

SCENARIOS = {"allowed_exact", "allowed_lease", "allowed_sync", "shed_bucket", "shed_cache",
             "service_refusal"}


def test_hostcalls_smoke_counts_what_envoy_counts(tmp_path):
    build = subprocess.run(["make", "-C", str(REPO), "--no-print-directory", "bench-hostcall-wasm"],
                           capture_output=True, text=True, timeout=1200, stdin=subprocess.DEVNULL)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "hostcalls.py"), "--smoke", "--out", str(tmp_path),
         "--kinds", "get_request_header,increment_metric"],
        capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out, = tmp_path.glob("hostcalls-*")
    results = json.loads((out / "results.json").read_text())
    scenarios = results["count"]["scenarios"]
    assert set(scenarios) == SCENARIOS
    for name, s in scenarios.items():
        assert s["requests"] > 0, name
        calls = s["calls"]
        # Every request reads its tenant once.
        assert calls.get("get_property", 0) == s["requests"], (name, calls)
        # Every 429 is one local reply, and every call Envoy made through the
        # rate-limit cluster is one grpc_call.
        assert calls.get("send_local_response", 0) == s["envoy_4xx"], (name, calls)
        assert calls.get("grpc_call", 0) == s["envoy_rls_calls"], (name, calls)
    # Refused from the local layer: no call; admitted in exact mode: a call's share.
    assert scenarios["shed_cache"]["envoy_4xx"] == scenarios["shed_cache"]["requests"]
    assert scenarios["allowed_exact"]["calls"].get("grpc_call", 0) > 0
    assert scenarios["allowed_exact"]["envoy_4xx"] == 0
    cost = results["cost"]["per_kind"]
    assert set(cost) == {"get_request_header", "increment_metric"}
    assert all(len(v["us_per_call_rounds"]) == 1 for v in cost.values())
    assert (out / "table.md").read_text().count("|") > 0

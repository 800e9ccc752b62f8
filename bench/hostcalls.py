#!/usr/bin/env python3
"""`make bench-hostcalls`: where the Envoy time of this filter goes, by host
call. Two measurements, each on its own stack started here on loopback (one
Redis, one envoyproxy/ratelimit, one upstream Envoy answering 200 itself),
driven by wrk (bench/tenants.lua):

count   The filter built with its `hostcall-count` feature (every host call
        counted by kind in a proxy-wasm counter `hostcall.<kind>`: Envoy's
        /stats `wasmcustom.hostcall.<kind>`; never the shipped .wasm), in
        real Envoys against the real service, one scenario at a time:

          allowed_exact    1,000 tenants under their limits, mode exact
          allowed_lease    the same, local.mode "lease"
          allowed_sync     the same, local.mode "sync"
          shed_bucket      one tenant far over 100/s: its token bucket refuses
          shed_cache       one tenant over 20/min: the over-limit cache refuses
          service_refusal  the same with local.enabled false: the service
                           refuses every request

        For each: host calls per request by kind (the counters' deltas over
        the requests Envoy answered, downstream_rq_total), and the filter's
        own counters (what it decided), after a warm-up that is not counted.

cost    bench/hostcall-probe: a filter that makes one kind of call N times per
        request (its plugin configuration), in one Envoy per kind at N = k and
        one at N = 0, and one Envoy with no filter. The configurations take
        turns, each kind's run right after a run at N = 0, each run a fixed
        time; per run, Envoy's CPU time (utime + stime of its process,
        /proc/<pid>/stat) over the requests it answered. A kind's cost per
        call is (CPU per request at N = k - at N = 0 just before) / k,
        median over the rounds.

The results go to OUT/hostcalls-<time>/results.json and table.md. The
machine may be shared: CPU per request is less sensitive to other load than
throughput, yet compare only figures of one run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import bench  # noqa: E402
import harness as h  # noqa: E402

LIMITS_FILE = REPO / "bench" / "limits.json"
COUNT_WASM = REPO / "target" / "hostcall-count" / "wasm32-wasip1" / "release" / "tenant_ratelimit.wasm"
PROBE_WASM = REPO / "target" / "hostcall-probe" / "wasm32-wasip1" / "release" / "hostcall_probe.wasm"
HOSTCALL = re.compile(r"hostcall\.([a-z_]+)$")
REQUESTS = "http.ingress.downstream_rq_total"
# Envoy's own counts, next to the filter's: its local replies (429) and the
# calls through the rate-limit cluster.
REFUSED = "http.ingress.downstream_rq_4xx"
RLS_CALLS = "cluster.ratelimit.upstream_rq_total"

# name: (configuration, wrk mode args, what it shows)
COUNT_SCENARIOS = {
    "allowed_exact": ("exact", ("uniform", "a-", "1000"), "1,000 tenants under their limits"),
    "allowed_lease": ("lease", ("uniform", "l-", "1000"), "1,000 tenants, local.mode lease"),
    "allowed_sync": ("sync", ("uniform", "s-", "1000"), "1,000 tenants, local.mode sync"),
    "shed_bucket": ("exact", ("single", "burst-probe"), "one tenant far over 100/s"),
    "shed_cache": ("exact", ("single", "hot-probe-cache"), "one tenant over 20/min"),
    "service_refusal": ("no_local", ("single", "hot-probe-service"),
                        "one tenant over 20/min, local.enabled false"),
}
HOT_TENANTS = ["hot-probe-cache", "hot-probe-service"]

# Probe kinds and their default k (calls per request at N = k).
PROBE_KINDS = {
    "get_request_header": 200,
    "get_request_header_absent": 200,
    "get_response_header": 200,
    "add_response_header": 50,
    "get_property": 200,
    "get_tenant_property": 200,
    "get_shared_data": 200,
    "set_shared_data": 200,
    "cas_update": 200,
    "increment_metric": 200,
    "record_metric": 200,
    "get_current_time": 200,
    "get_log_level": 200,
    "log_disabled": 200,
    "set_property": 50,
    "refusal_properties": 4,
    "set_effective_context": 200,
    "grpc_call": 2,
}


def limits() -> dict:
    (header, groups), = json.loads(LIMITS_FILE.read_text()).items()
    groups["hot"]["header_value"] = [*groups["hot"]["header_value"], *HOT_TENANTS]
    return {header: groups}


def snapshot(envoy: h.Envoy) -> dict[str, int]:
    return envoy.stats(r"hostcall\.|tenant_ratelimit\.|downstream_rq_(total|4xx)$"
                       r"|^cluster\.ratelimit\.upstream_rq_total$")


def settled(envoy: h.Envoy, deadline_s: float = 3.0) -> dict[str, int]:
    """snapshot() once the requests answered stop moving (a request still in
    flight when wrk stops belongs to the run)."""
    end = time.monotonic() + deadline_s
    before = snapshot(envoy)
    while time.monotonic() < end:
        time.sleep(0.25)
        now = snapshot(envoy)
        if now.get(REQUESTS) == before.get(REQUESTS):
            return now
        before = now
    return before


def load(envoy: h.Envoy, mode: tuple[str, ...], header: str, args, duration_s: int) -> dict:
    return bench.wrk_finish(bench.wrk_start(envoy.url, mode, header, args.threads,
                                            args.connections, duration_s), duration_s)


def count(args, out: Path) -> dict:
    wasm = args.count_wasm.resolve()
    lim = limits()
    header = next(iter(lim))
    results: dict = {"wasm": str(wasm), "scenarios": {}}
    with h.Stack(out / "count-stack") as stack:
        gen = stack.generate(lim, domain="hostcalls", timeout_ms=bench.TIMEOUT_MS)
        cfg = gen.plugin_config()
        redis = stack.redis()
        rls = stack.ratelimit(redis, gen, log_level="warn",
                              extra_env={"LOCAL_CACHE_SIZE_IN_BYTES": str(bench.RLS_CACHE_BYTES)})
        upstream = stack.upstream()
        configs = {
            "exact": cfg,
            "lease": dict(cfg, local=dict(cfg["local"], mode="lease")),
            "sync": dict(cfg, local=dict(cfg["local"], mode="sync")),
            "no_local": dict(cfg, local=dict(cfg["local"], enabled=False)),
        }
        wanted = [s for s in COUNT_SCENARIOS if s in args.scenarios]
        envoys: dict[str, h.Envoy] = {}
        for name in {COUNT_SCENARIOS[s][0] for s in wanted}:
            listen, admin = h.free_port(), h.free_port()
            text = h.render_envoy_config(configs[name], listen_port=listen, admin_port=admin,
                                         rls_port=rls.grpc_port,
                                         upstream_port=upstream.listen_port,
                                         wasm_path=wasm, node_id=f"count-{name}",
                                         access_log_path="/dev/null")
            envoys[name] = h.Envoy(stack, f"count-{name}", text, listen, admin,
                                   concurrency=args.envoy_concurrency)
        for scenario in wanted:
            cfg_name, mode, title = COUNT_SCENARIOS[scenario]
            envoy = envoys[cfg_name]
            if args.warmup:
                load(envoy, mode, header, args, args.warmup)
            before = settled(envoy)
            run = load(envoy, mode, header, args, args.duration)
            after = settled(envoy)
            d = bench.delta(after, before)
            n = d.get(REQUESTS, 0)
            calls = {m.group(1): v for k, v in d.items() if (m := HOSTCALL.search(k))}
            filt = {k.partition("tenant_ratelimit.")[2]: v for k, v in d.items()
                    if "tenant_ratelimit." in k and not k.startswith("wasm.")}
            per = {k: v / n for k, v in sorted(calls.items())} if n else {}
            results["scenarios"][scenario] = {
                "title": title, "config": cfg_name, "requests": n,
                "envoy_4xx": d.get(REFUSED, 0), "envoy_rls_calls": d.get(RLS_CALLS, 0),
                "statuses": run["statuses"], "calls": calls, "per_request": per,
                "host_calls_per_request": sum(v for k, v in per.items()
                                              if k != "memory_allocate"),
                "filter_counters": filt,
            }
            print(f"  count {scenario:<16} {n:>7} requests  statuses {run['statuses']}  "
                  f"host calls/request {results['scenarios'][scenario]['host_calls_per_request']:.2f}: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in per.items()), flush=True)
    return results


def cost(args, out: Path) -> dict:
    probe = args.probe_wasm.resolve()
    lim = limits()
    header = next(iter(lim))
    kinds = {k: PROBE_KINDS[k] if args.k is None else (args.k if k != "grpc_call" else 2)
             for k in args.kinds}
    rounds: list[dict[str, dict]] = []
    with h.Stack(out / "cost-stack") as stack:
        gen = stack.generate(lim, domain="hostcalls", timeout_ms=bench.TIMEOUT_MS)
        redis = stack.redis()
        rls = stack.ratelimit(redis, gen, log_level="warn")
        upstream = stack.upstream()
        envoys: dict[str, h.Envoy] = {}

        def start(name: str, text: str, listen: int, admin: int) -> None:
            envoys[name] = h.Envoy(stack, name, text, listen, admin,
                                   concurrency=args.envoy_concurrency)

        listen, admin = h.free_port(), h.free_port()
        start("no_filter", bench.baseline_config(gen, listen_port=listen, admin_port=admin,
                                                 rls_port=rls.grpc_port,
                                                 upstream_port=upstream.listen_port),
              listen, admin)
        for name, (kind, n) in {"none": ("none", 0),
                                **{k: (k, v) for k, v in kinds.items()}}.items():
            listen, admin = h.free_port(), h.free_port()
            text = h.render_envoy_config({"kind": kind, "n": n}, listen_port=listen,
                                         admin_port=admin, rls_port=rls.grpc_port,
                                         upstream_port=upstream.listen_port, wasm_path=probe,
                                         node_id=f"probe-{name}")
            start(name, text, listen, admin)
        mode = ("single", "probe-tenant")
        if args.warmup:
            for e in envoys.values():
                load(e, mode, header, args, args.warmup)
        # Each kind's run right after a run at N = 0, which it is paired with.
        order = ["no_filter", *(x for kind in kinds for x in ("none", kind))]
        for r in range(1, args.reps + 1):
            this: dict[str, dict] = {}
            for i, name in enumerate(order):
                e = envoys[name]
                n0 = e.stats(re.escape(REQUESTS) + "$").get(REQUESTS, 0)
                c0 = bench.cpu_seconds(e.process.pid)
                run = load(e, mode, header, args, args.duration)
                n1 = settled(e).get(REQUESTS, 0)
                c1 = bench.cpu_seconds(e.process.pid)
                n = n1 - n0
                one = {"requests": n, "cpu_s": c1 - c0, "statuses": run["statuses"],
                       "us_per_request": 1e6 * (c1 - c0) / n if n else None}
                key = f"none/{order[i + 1]}" if name == "none" else name
                this[key] = one
                print(f"  cost round {r} {key:<30} {n:>7} requests  "
                      f"{one['us_per_request'] or 0:7.1f} µs/request  "
                      f"statuses {run['statuses']}", flush=True)
            rounds.append(this)
    per_kind = {}
    for kind, k in kinds.items():
        slopes = [(rd[kind]["us_per_request"] - rd[f"none/{kind}"]["us_per_request"]) / k
                  for rd in rounds
                  if rd[kind]["us_per_request"] is not None
                  and rd[f"none/{kind}"]["us_per_request"] is not None]
        per_kind[kind] = {"k": k, "us_per_call": statistics.median(slopes) if slopes else None,
                          "us_per_call_rounds": slopes}

    def med(name: str) -> float | None:
        v = [rd[name]["us_per_request"] for rd in rounds if rd[name]["us_per_request"]]
        return statistics.median(v) if v else None

    zero = [rd[n]["us_per_request"] for rd in rounds for n in rd
            if n.startswith("none/") and rd[n]["us_per_request"]]
    per_request = {name: med(name) for name in rounds[0]} if rounds else {}
    per_request["none"] = statistics.median(zero) if zero else None
    return {"probe": str(probe), "rounds": rounds, "per_kind": per_kind,
            "us_per_request": per_request}


# The probe kind whose cost stands for each counted kind ("" when none does).
COST_OF = {
    "get_request_header": "get_request_header",
    "get_response_header": "get_response_header",
    "get_response_trailer": "get_response_header",
    "add_response_header": "add_response_header",
    "add_request_header": "add_response_header",
    "get_property": "get_tenant_property",
    "get_shared_data": "get_shared_data",
    "set_shared_data": "set_shared_data",
    "increment_metric": "increment_metric",
    "record_metric": "record_metric",
    "get_current_time": "get_current_time",
    "get_log_level": "get_log_level",
    "log": "log_disabled",
    "set_property": "set_property",
    "set_effective_context": "set_effective_context",
    "grpc_call": "grpc_call",
}


def markdown(results: dict) -> str:
    lines: list[str] = []
    c = results.get("cost")
    per_kind = c["per_kind"] if c else {}
    if c:
        lines += ["## Cost per call (Envoy CPU, µs)", "",
                  f"Envoy with no filter: {c['us_per_request'].get('no_filter') or 0:.1f} µs per "
                  f"request; the probe at N = 0: {c['us_per_request'].get('none') or 0:.1f} µs.", "",
                  "| kind | k | µs per call (median) | per round |", "|---|---:|---:|---|"]
        for kind, v in per_kind.items():
            us = "-" if v["us_per_call"] is None else f"{v['us_per_call']:.3f}"
            lines.append(f"| `{kind}` | {v['k']} | {us} | "
                         + ", ".join(f"{s:.3f}" for s in v["us_per_call_rounds"]) + " |")
        lines.append("")
    cnt = results.get("count")
    if cnt:
        scen = cnt["scenarios"]
        kinds = sorted({k for s in scen.values() for k in s["per_request"]})
        lines += ["## Host calls per request", "",
                  "| kind | " + " | ".join(scen) + " |",
                  "|---|" + "---:|" * len(scen)]
        for kind in kinds:
            lines.append(f"| `{kind}` | " + " | ".join(
                f"{s['per_request'].get(kind, 0):.3f}" for s in scen.values()) + " |")
        lines.append("| **all host calls** | " + " | ".join(
            f"{s['host_calls_per_request']:.2f}" for s in scen.values()) + " |")
        lines.append("| requests | " + " | ".join(str(s["requests"]) for s in scen.values())
                     + " |")
        lines.append("")
        if per_kind:
            lines += ["## Breakdown: calls per request × µs per call", "",
                      "| kind | " + " | ".join(scen) + " |",
                      "|---|" + "---:|" * len(scen)]
            totals = dict.fromkeys(scen, 0.0)
            for kind in kinds:
                probe_kind = COST_OF.get(kind, "")
                us = per_kind.get(probe_kind, {}).get("us_per_call")
                if us is None:
                    continue
                row = []
                for name, s in scen.items():
                    v = s["per_request"].get(kind, 0) * us
                    totals[name] += v
                    row.append(f"{v:.2f}")
                lines.append(f"| `{kind}` | " + " | ".join(row) + " |")
            lines.append("| **sum (µs per request)** | " + " | ".join(
                f"{v:.1f}" for v in totals.values()) + " |")
            lines.append("")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", choices=("count", "cost", "both", "report"), default="both",
                    help="report: the tables of earlier runs' results.json (--results), "
                         "e.g. a count run's and a cost run's together")
    ap.add_argument("--results", type=Path, nargs="*", default=[],
                    help="report: results.json files; the last one with each part wins")
    ap.add_argument("--count-wasm", type=Path, default=COUNT_WASM)
    ap.add_argument("--probe-wasm", type=Path, default=PROBE_WASM)
    ap.add_argument("--scenarios", default=",".join(COUNT_SCENARIOS),
                    help="count: comma-separated subset of " + ", ".join(COUNT_SCENARIOS))
    ap.add_argument("--kinds", default=",".join(PROBE_KINDS),
                    help="cost: comma-separated subset of " + ", ".join(PROBE_KINDS))
    ap.add_argument("--k", type=int, help="cost: N of every kind but grpc_call (default per kind)")
    ap.add_argument("--duration", type=int, default=5, help="seconds per run (5)")
    ap.add_argument("--reps", type=int, default=3, help="cost: rounds (3)")
    ap.add_argument("--warmup", type=int, default=2, help="seconds of unrecorded load first (2)")
    ap.add_argument("--connections", type=int, default=16, help="wrk connections (16)")
    ap.add_argument("--threads", type=int, default=1, help="wrk threads (1)")
    ap.add_argument("--envoy-concurrency", type=int, default=2, help="Envoy workers (2)")
    ap.add_argument("--out", type=Path, default=REPO / "bench-results")
    ap.add_argument("--smoke", action="store_true",
                    help="1-second runs, one round, 2 connections: checks it works, measures nothing")
    args = ap.parse_args()
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    args.kinds = [k for k in args.kinds.split(",") if k]
    bad = [s for s in args.scenarios if s not in COUNT_SCENARIOS] + [
        k for k in args.kinds if k not in PROBE_KINDS]
    if bad:
        ap.error(f"unknown scenario(s) or kind(s): {bad}")
    if args.what == "report":
        merged: dict = {}
        for path in args.results:
            r = json.loads(path.read_text())
            merged.update({k: r[k] for k in ("count", "cost") if k in r})
        print(markdown(merged), end="")
        return 0
    if args.smoke:
        args.duration, args.reps, args.warmup, args.connections = 1, 1, 1, 2
    for what, path in (("count", args.count_wasm), ("cost", args.probe_wasm)):
        if args.what in (what, "both") and not path.is_file():
            print(f"{path} not found: `make bench-hostcalls` builds it", file=sys.stderr)
            return 1
    missing = h.missing_binaries()
    if missing:
        print("missing: " + ", ".join(missing) + " (run `make deps build`)", file=sys.stderr)
        return 1
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out / f"hostcalls-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"started_utc": dt.datetime.now(dt.timezone.utc).isoformat(),
                     "machine": bench.machine(),
                     "settings": {k: v for k, v in vars(args).items()
                                  if k not in ("out", "count_wasm", "probe_wasm")}}
    started = time.time()
    if args.what in ("cost", "both"):
        print("cost per call (bench/hostcall-probe)", flush=True)
        results["cost"] = cost(args, out)
    if args.what in ("count", "both"):
        print("host calls per request (the hostcall-count build)", flush=True)
        results["count"] = count(args, out)
    results["wall_s"] = round(time.time() - started, 1)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (out / "table.md").write_text(table)
    print()
    print(table)
    print(f"results: {out}/results.json, table.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

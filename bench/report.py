#!/usr/bin/env python3
"""The Markdown table and the PNG chart of a `make bench` results.json.

    python bench/report.py bench-results/latest/results.json [--chart out.png]

Per scenario and configuration: the median over repetitions of throughput,
p50 and p99 (each repetition's own percentiles, from wrk), the status mix
summed over repetitions, the rate-limit calls per request (each Envoy's own
rate-limit cluster's upstream_rq_total over the requests it answered), the
calls that failed open, and in the quota scenarios the admitted requests per
window of the tracked tenants against their limit (see quota_windows).

Then, per scenario and configuration, what a request costs: throughput
against Envoy native, `wasm_noop` (the ceiling of any wasm filter) and, in
the local-shed and hot scenarios, `wasm_reply` (the floor of a wasm refusal), paired
per repetition; p99 against native; rate-limit calls per request;
descriptors per call; Redis INCRBY and all Redis commands per request; and
the CPU time per request of each process (see cost_rows).

Then the wasm boundary's targets this run can speak to (targets_markdown:
throughput against native, wasm_reply and wasm_noop, and the Envoy CPU this
filter adds above wasm_noop against what Envoy's own filters add above no
filter), and the refusal log's own cost per refusal (refusal_log_markdown:
`filter_logged` against `filter`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

BATCH_PREFIX = "filter_batch_"  # bench.py --exact-batch


class _Labels(dict):
    """The configurations' labels; bench.py --exact-batch's by their setting."""

    def __missing__(self, cfg: str) -> str:
        if cfg.startswith(BATCH_PREFIX):
            setting = cfg[len(BATCH_PREFIX):]
            return ("this filter, one request per call" if setting == "off"
                    else f"this filter, max_in_flight {setting}")
        raise KeyError(cfg)


CONFIG_LABELS = _Labels({"baseline": "no filter", "native": "Envoy native", "filter": "this filter",
                 "filter_lease": "this filter, lease", "filter_sync": "this filter, sync",
                 "filter_local": "this filter, on_failure local",
                 "wasm_noop": "wasm, no-op", "wasm_reply": "wasm, 429 at once",
                 "filter_no_local": "this filter, no local layer",
                 "filter_alt": "this filter, --alt-wasm build",
                 "native_counter": "Envoy native + counter",
                 "filter_exact_counter": "this filter + counter",
                 "filter_exact_counter_memory": "this filter + counter, memory store",
                 "filter_lease_counter": "this filter, lease + counter",
                 "filter_sync_counter": "this filter, sync + counter",
                 "filter_logged": "this filter + refusal log"})
# The counter's configurations against what they are compared with: the
# same Envoy and calls against envoyproxy/ratelimit, and the memory store
# against the Redis store.
COUNTER_PAIRS = (
    ("filter_exact_counter", "filter"),
    ("native_counter", "native"),
    ("filter_lease_counter", "filter_lease"),
    ("filter_sync_counter", "filter_sync"),
    ("filter_exact_counter_memory", "filter_exact_counter"),
)
# The targets for the counter, on the allowed path: service CPU per
# request at most a fifth, Redis CPU per request at most half, Redis
# commands per admitted request at most 0.3, throughput at least 1.5x with
# this filter, the memory store at least 3x the Redis store.
COUNTER_TARGETS = {"service_cpu": 0.2, "redis_cpu": 0.5, "redis_commands": 0.3,
                   "filter_rps": 1.5, "memory_rps": 3.0}
# The configurations that limit nothing: no admitted-per-window figures.
NON_LIMITING = ("baseline", "wasm_noop", "wasm_reply")
# The components of a run's cpu_s, in the table's order.
CPU_COMPONENTS = ("envoy", "service", "redis", "upstream", "wrk")
CPU_LABELS = {"envoy": "Envoy", "service": "service", "redis": "Redis",
              "upstream": "upstream", "wrk": "wrk"}


def summarise(results: dict) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for run in results["runs"]:
        s = out.setdefault(run["scenario"], {}).setdefault(run["config"], {
            "rps": [], "p50": [], "p99": [], "statuses": {}, "requests": 0, "rls_calls": 0,
            "socket_errors": 0, "failed_open": 0, "rls_errors": 0,
            "served": 0, "service_calls": 0, "service_hits": 0, "rls_descriptors": 0,
            "redis": {}, "redis_sent": {}, "cpu_s": {}, "admitted": 0,
        })
        s["rps"].append(run["rps"])
        s.setdefault("cpr", []).append(run["rls_calls_per_request"])
        s["p50"].append(run["latency_ms"]["p50"])
        s["p99"].append(run["latency_ms"]["p99"])
        for code, count in run["statuses"].items():
            s["statuses"][code] = s["statuses"].get(code, 0) + count
        # Requests admitted (2xx), the pinned scenario's background load too.
        s["admitted"] += sum(n for code, n in (
            *run["statuses"].items(), *run.get("background", {}).get("statuses", {}).items())
            if str(code).startswith("2"))
        s["requests"] += run["requests"]
        s["rls_calls"] += run["rls_calls"]
        e = run["errors"]
        s["socket_errors"] += e["connect"] + e["read"] + e["write"] + e["timeout"]
        s["failed_open"] += run.get("failed_open", 0)
        s["rls_errors"] += run.get("rls_errors", 0)
        s["served"] += run.get("requests_served", run["requests"])
        s["service_calls"] += run.get("service_calls", 0)
        s["service_hits"] += run.get("service_hits", 0)
        s["rls_descriptors"] += run.get("rls_descriptors", 0)
        for k, v in run.get("redis_commands", {}).items():
            s["redis"][k] = s["redis"].get(k, 0) + v
        # Results from before the counter: every command was sent.
        for k, v in run.get("redis_commands_sent", run.get("redis_commands", {})).items():
            s["redis_sent"][k] = s["redis_sent"].get(k, 0) + v
        for k, v in run.get("cpu_s", {}).items():
            s["cpu_s"][k] = s["cpu_s"].get(k, 0.0) + v
    for per_cfg in out.values():
        for s in per_cfg.values():
            s["rps_median"] = statistics.median(s["rps"])
            s["p50_median"] = statistics.median(s["p50"])
            s["p99_median"] = statistics.median(s["p99"])
            s["calls_per_request"] = s["rls_calls"] / s["requests"] if s["requests"] else 0.0
    return out


def status_mix(s: dict) -> str:
    total = sum(s["statuses"].values()) or 1
    parts = [f"{code}: {100 * n / total:.1f}%" for code, n in sorted(s["statuses"].items())]
    if s["socket_errors"]:
        parts.append(f"socket errors: {s['socket_errors']}")
    return ", ".join(parts) or "none"


UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
UNIT_SHORT = {"second": "s", "minute": "min", "hour": "h", "day": "day"}
# A per-second window counts only if a run covered all of it, this long after
# the run started (wrk connecting) at the earliest.
START_MARGIN_S = 0.1


def tenant_limit(limits: dict, tenant: str, unit: str) -> int | None:
    """The tenant's group limit per `unit` (its named group, else "default")."""
    (_, groups), = limits.items()
    group = next((g for n, g in groups.items()
                  if n != "default" and tenant in g.get("header_value", [])),
                 groups.get("default", {}))
    return group.get(f"per{unit}")


def quota_windows(results: dict, scenario: str, cfg: str, tenants: list[str] | None = None,
                  in_flight: int | None = None) -> dict[str, dict]:
    """Admitted requests per window of the scenario's quota units, for the
    tracked tenants (or `tenants`) of one configuration: unit -> {"limit",
    "admitted": [per window]}.

    A window counts when the tenant asked for more than its limit in it: more
    than limit + `in_flight` requests sent (by the client's clock; at most
    that many can be sent in one window and decided in the next, as wrk keeps
    that many connections busy). A per-second window also has to lie inside
    one run (a window cut by a run's end would show the token bucket's
    refill, not the limit). Admitted requests are counted by the second the
    upstream saw them (its access log, a few ms after the decision): the
    figures can be off by about `in_flight` at a window edge that falls while
    the tenant is still being admitted."""
    q = results.get("quota", {}).get(scenario)
    per_tenant = results.get("windows", {}).get(scenario, {}).get(cfg)
    if not q or per_tenant is None:
        return {}
    if in_flight is None:
        in_flight = results["settings"]["connections"]
    spans = results.get("intervals", {}).get(scenario, {}).get(cfg, [])
    tenants = q["tracked"].get(cfg, []) if tenants is None else tenants
    out: dict[str, dict] = {}
    for unit in q["units"]:
        size = UNIT_SECONDS[unit]
        limit = None
        admitted: list[int] = []
        for tenant in tenants:
            lim = tenant_limit(results["limits"], tenant, unit)
            counts = per_tenant.get(tenant)
            if lim is None or counts is None:
                continue
            limit = lim
            sent: dict[int, int] = {}
            got: dict[int, int] = {}
            for kind, into in (("sent", sent), ("admitted", got)):
                for sec, n in counts.get(kind, {}).items():
                    w = int(sec) // size * size
                    into[w] = into.get(w, 0) + n
            for w, n in sorted(sent.items()):
                if n <= lim + in_flight:
                    continue
                if size == 1 and not any(t0 + START_MARGIN_S <= w and w + 1 <= t1
                                         for t0, t1 in spans):
                    continue
                admitted.append(got.get(w, 0))
        if limit is not None:
            out[unit] = {"limit": limit, "admitted": admitted}
    return out


def window_summary(w: dict[str, dict]) -> str:
    """e.g. "100 / 99.8 of 100/s (n=27)": max / mean of admitted per window."""
    parts = []
    for unit, d in w.items():
        a = d["admitted"]
        per = f"{d['limit']:,}/{UNIT_SHORT[unit]}"
        if not a:
            parts.append(f"no saturated window of {per}")
        else:
            parts.append(f"{max(a):,} / {statistics.mean(a):,.1f} of {per} (n={len(a)})")
    return "; ".join(parts) or ""


def failed(s: dict) -> bool:
    """A row whose run had calls fail (open), 5xx answers or socket errors."""
    fivexx = sum(n for code, n in s["statuses"].items() if str(code).startswith("5"))
    return bool(s["failed_open"] or s["rls_errors"] or fivexx or s["socket_errors"])


def paired_ratios(results: dict, scenario: str, a: str = "filter",
                  b: str = "native") -> tuple[float, float, float, float] | None:
    """Median and range of `a`/`b` throughput and p99 over repetitions, each
    repetition's runs taken together: they ran one after the other, so a
    machine that is slower for a while slows both."""
    by_rep: dict[int, dict[str, dict]] = {}
    for run in results["runs"]:
        if run["scenario"] == scenario and run["config"] in (a, b):
            by_rep.setdefault(run["rep"], {})[run["config"]] = run
    pairs = [(r[a], r[b]) for r in by_rep.values() if a in r and b in r]
    pairs = [(x, y) for x, y in pairs if y["rps"] and y["latency_ms"]["p99"]]
    if not pairs:
        return None
    rps = [x["rps"] / y["rps"] for x, y in pairs]
    p99 = [x["latency_ms"]["p99"] / y["latency_ms"]["p99"] for x, y in pairs]
    return statistics.median(rps), min(rps), statistics.median(p99), max(p99)


def markdown(results: dict) -> str:
    m, st = results["machine"], results["settings"]
    lines = [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}; "
        f"Envoy {m['envoy']}; {m['wrk']}.",
        f"Load: wrk, {st['connections']} connections, {st['wrk_threads']} threads, "
        f"{st['duration_s']} s per run, {st['reps']} runs per configuration interleaved "
        f"(A B C A B C ...); every Envoy under test runs {st['envoy_concurrency']} workers; "
        f"everything shares the same cores. Medians over runs.",
        "",
        "| Scenario | Configuration | req/s | p50 ms | p99 ms | Status mix "
        "| Service calls / request | Failed open | Admitted per window: max / mean of limit |",
        "|---|---|---:|---:|---:|---|---:|---:|---|",
    ]
    summary = summarise(results)
    any_failed = False
    for name, per_cfg in summary.items():
        for cfg in results.get("configs", CONFIG_LABELS):
            s = per_cfg.get(cfg)
            if s is None:
                continue
            mark = ""
            if failed(s):
                mark, any_failed = " ⚠", True
            # Each failed call counts as an error and, failing open, as a
            # fail-open; errors are shown when they are not all fail-opens.
            fails = f"{s['failed_open']:,}" + (
                f" ({s['rls_errors']:,} errors)" if s["rls_errors"] != s["failed_open"] else "")
            lines.append(
                f"| {name} | {CONFIG_LABELS[cfg]}{mark} | {s['rps_median']:,.0f} "
                f"| {s['p50_median']:.2f} | {s['p99_median']:.2f} | {status_mix(s)} "
                f"| {s['calls_per_request']:.4f} | {fails} "
                f"| {window_summary(quota_windows(results, name, cfg))} |")
    if any_failed:
        lines += ["", "⚠: rate-limit calls failed (open) or errored, or requests got a 5xx "
                  "or a socket error, in this row's runs: its figures are not those of a "
                  "healthy limiter."]
    if summary:
        lines += ["", *cost_markdown(results, summary)]
    counter = counter_markdown(results, summary)
    if counter:
        lines += ["", *counter]
    targets = targets_markdown(results, summary)
    if targets:
        lines += ["", *targets]
    log_cost = refusal_log_markdown(summary)
    if log_cost:
        lines += ["", *log_cost]
    batching = batch_markdown(results, summary)
    if batching:
        lines += ["", *batching]
    if "pinned" in summary:
        lines += ["", *pinned_markdown(results, summary["pinned"])]
    if "service_side" in results:
        lines += ["", *service_side_markdown(results["service_side"])]
    return "\n".join(lines) + "\n"


def descriptors_per_call(cfg: str, s: dict) -> tuple[float, str] | None:
    """(descriptors per call, how it was counted): this filter's own counter
    (tenant_ratelimit.rls_descriptors over its rate-limit cluster's calls);
    for Envoy's native filter, which has no such counter, the service's
    total_hits over its calls (the native filter sends every descriptor
    with a hits_addend of 1, so its hits are its descriptors that matched a
    rule)."""
    if s["rls_descriptors"] and s["rls_calls"]:
        return s["rls_descriptors"] / s["rls_calls"], ""
    if cfg == "native" and s["service_calls"] and s["service_hits"]:
        return s["service_hits"] / s["service_calls"], "†"
    return None


def ratio_cell(results: dict, scenario: str, cfg: str, ref: str, worst: bool = False) -> str:
    if cfg == ref:
        return "1.00x"
    r = paired_ratios(results, scenario, a=cfg, b=ref)
    if r is None:
        return ""
    return f"{r[0]:.2f}x" + (f" ({r[1]:.2f}x)" if worst and r[1] != r[0] else "")


def cost_markdown(results: dict, summary: dict[str, dict[str, dict]]) -> list[str]:
    """Ratios (paired per repetition: the runs of a repetition ran one after
    the other) and the cost of a request, per scenario and configuration."""
    configs = results.get("configs", list(CONFIG_LABELS))
    has_noop = any("wasm_noop" in per for per in summary.values())
    has_reply = any("wasm_reply" in per for per in summary.values())
    head = ["Scenario", "Configuration", "req/s", "vs native (worst)"]
    if has_noop:
        head.append("vs wasm_noop")
    if has_reply:
        head.append("vs wasm_reply")
    head += ["p99 vs native (worst)", "calls / request", "descriptors / call",
             "Redis INCRBY / request", "Redis EVALSHA / request",
             "Redis commands / request", "Redis commands sent / admitted request"]
    head += [f"CPU µs / request: {CPU_LABELS[c]}" if c == CPU_COMPONENTS[0]
             else CPU_LABELS[c] for c in CPU_COMPONENTS]
    lines = [
        "Ratios are medians over repetitions of each repetition's ratio (in brackets the "
        "worst); CPU is each process's user + system time over the runs (the pinned "
        "scenario: its whole fleet of Envoys) over the requests they served; Redis "
        "commands are INFO commandstats over the runs, every Envoy's calls, the "
        "commands the counter's script runs inside Redis (MGET, SET, INCRBY) "
        "included; commands sent leave those out (the counter sends EVALSHA; "
        "envoyproxy/ratelimit INCRBY and EXPIRE).",
        "",
        "| " + " | ".join(head) + " |",
        "|---|---|" + "---:|" * (len(head) - 2),
    ]
    dagger = False
    for name, per_cfg in summary.items():
        for cfg in configs:
            s = per_cfg.get(cfg)
            if s is None:
                continue
            served = s["served"]
            row = [name, CONFIG_LABELS[cfg], f"{s['rps_median']:,.0f}",
                   ratio_cell(results, name, cfg, "native", worst=True)]
            if has_noop:
                row.append(ratio_cell(results, name, cfg, "wasm_noop"))
            if has_reply:
                row.append(ratio_cell(results, name, cfg, "wasm_reply"))
            r = paired_ratios(results, name, a=cfg)
            row.append("1.00x" if cfg == "native" else "" if r is None else
                       f"{r[2]:.2f}x" + (f" ({r[3]:.2f}x)" if r[3] != r[2] else ""))
            row.append(f"{s['calls_per_request']:.4f}")
            d = descriptors_per_call(cfg, s)
            dagger = dagger or bool(d and d[1])
            row.append(f"{d[0]:.2f}{d[1]}" if d else "")
            redis = s["redis"]
            row.append(f"{redis.get('incrby', 0) / served:.3f}" if served else "")
            row.append(f"{redis.get('evalsha', 0) / served:.3f}" if served else "")
            row.append(f"{sum(redis.values()) / served:.3f}" if served else "")
            row.append(f"{sum(s['redis_sent'].values()) / s['admitted']:.3f}"
                       if s["admitted"] else "")
            cpu = s["cpu_s"]
            row += [f"{1e6 * cpu[c] / served:,.1f}" if served and c in cpu else ""
                    for c in CPU_COMPONENTS]
            lines.append("| " + " | ".join(row) + " |")
    if dagger:
        lines += ["", "†: Envoy's native filter counts no descriptors: the service's "
                  "total_hits per call (the native filter sends each descriptor with a "
                  "hits_addend of 1)."]
    return lines


# The wasm boundary's targets (one run, like with like): (scenario,
# configuration, against, at least / at most, ratio). Throughput ratios are
# paired per repetition (ratio_cell).
THROUGHPUT_TARGETS = (
    ("local_shed", "filter", "native", "≥", 1.0),
    ("local_shed", "filter_lease", "native", "≥", 1.0),
    ("local_shed", "filter_sync", "native", "≥", 1.0),
    ("local_shed", "filter", "wasm_reply", "≥", 0.85),
    ("local_shed", "filter_lease", "wasm_reply", "≥", 0.85),
    ("local_shed", "filter_sync", "wasm_reply", "≥", 0.85),
    ("allowed", "filter_lease", "wasm_noop", "≥", 0.85),
    ("allowed", "filter_sync", "wasm_noop", "≥", 0.85),
    ("allowed", "filter_lease_counter", "wasm_noop", "≥", 0.85),
    ("allowed", "filter_sync_counter", "wasm_noop", "≥", 0.85),
    ("allowed", "filter_exact_counter", "wasm_noop", "≥", 0.6),
    ("hot", "filter", "wasm_reply", "≥", 0.9),
    ("hot", "filter_exact_counter", "wasm_reply", "≥", 0.9),
)
# What this filter adds to Envoy's CPU per request above wasm_noop, over
# what Envoy's own filters add above no filter (allowed path): at most.
CPU_TARGETS = (("filter_lease", 0.15), ("filter_sync", 0.15),
               ("filter_lease_counter", 0.15), ("filter_sync_counter", 0.15),
               ("filter", 0.6), ("filter_exact_counter", 0.6))


def added_cpu(per_cfg: dict[str, dict], cfg: str) -> tuple[float, float] | None:
    """(µs of Envoy CPU per request `cfg` adds above wasm_noop, µs Envoy's
    native filters add above no filter: native_counter for a configuration
    against the counter, when it ran), both in one scenario."""
    ref = "native_counter" if cfg.endswith("_counter") and "native_counter" in per_cfg \
        else "native"
    x = {c: per_request(per_cfg[c], "envoy") if c in per_cfg else None
         for c in (cfg, "wasm_noop", ref, "baseline")}
    if any(v is None for v in x.values()):
        return None
    return x[cfg] - x["wasm_noop"], x[ref] - x["baseline"]


def targets_markdown(results: dict, summary: dict[str, dict[str, dict]]) -> list[str]:
    """Each target of the wasm boundary this run can say something about:
    the figure, the target, met or short. p99 has no target within a run
    (it is "no worse than before": compare the p99 column of two runs)."""
    rows = []
    for scenario, cfg, ref, op, target in THROUGHPUT_TARGETS:
        per_cfg = summary.get(scenario, {})
        if cfg not in per_cfg or ref not in per_cfg:
            continue
        r = paired_ratios(results, scenario, a=cfg, b=ref)
        if r is None:
            continue
        met = r[0] >= target
        rows.append(f"| {scenario} | {CONFIG_LABELS[cfg]} | req/s vs {CONFIG_LABELS[ref]} "
                    f"| {r[0]:.2f}x ({r[1]:.2f}x) | {op} {target:g}x "
                    f"| {'met' if met else 'short'} |")
    per_cfg = summary.get("allowed", {})
    for cfg, target in CPU_TARGETS:
        if cfg not in per_cfg:
            continue
        added = added_cpu(per_cfg, cfg)
        if added is None:
            continue
        figure = f"{added[0]:,.1f} / {added[1]:,.1f} µs"
        if added[1] > 0:
            ratio = added[0] / added[1]
            figure += f" = {ratio:.2f}"
            verdict = "met" if ratio <= target else "short"
        else:  # native added nothing measurable: no ratio
            verdict = "n/a"
        rows.append(f"| allowed | {CONFIG_LABELS[cfg]} | Envoy CPU above wasm_noop / native's "
                    f"above no filter | {figure} | ≤ {target:g} | {verdict} |")
    if not rows:
        return []
    return [
        "Targets (one run, like with like: no configuration logs its refusals). "
        "Throughput: medians over repetitions of each repetition's ratio (in brackets "
        "the worst). CPU: Envoy's user + system µs per request over the runs.",
        "",
        "| Scenario | Configuration | Figure | Value | Target | |",
        "|---|---|---|---:|---|---|",
        *rows,
    ]


def refusal_log_markdown(summary: dict[str, dict[str, dict]]) -> list[str]:
    """The refusal access log's own cost: Envoy CPU per refusal of
    `filter_logged` (envoy/envoy.yaml.tmpl's log, as shipped, to /dev/null)
    less that of `filter` (no log), in each scenario both ran in."""
    rows = []
    for scenario, per_cfg in summary.items():
        a, b = per_cfg.get("filter_logged"), per_cfg.get("filter")
        if a is None or b is None:
            continue
        refused = [sum(n for code, n in x["statuses"].items() if str(code) == "429")
                   for x in (a, b)]
        if not all(refused):
            continue
        per_refusal = [1e6 * x["cpu_s"].get("envoy", 0.0) / n for x, n in zip((a, b), refused)]
        rows.append(f"| {scenario} | {per_refusal[0]:,.1f} | {per_refusal[1]:,.1f} "
                    f"| {per_refusal[0] - per_refusal[1]:,.1f} "
                    f"| {100 * refused[0] / max(a['requests'], 1):.1f}% |")
    if not rows:
        return []
    return [
        "The refusal log's cost: this filter (mode exact) with and without "
        "envoy/envoy.yaml.tmpl's access log of refusals (a JSON line per refusal behind a "
        "CEL filter evaluated on every request; written to /dev/null), Envoy CPU µs over "
        "the refusals (429) of the runs.",
        "",
        "| Scenario | with the log: Envoy µs / refusal | without | the log | refused |",
        "|---|---:|---:|---:|---:|",
        *rows,
    ]


def batch_markdown(results: dict, summary: dict[str, dict[str, dict]]) -> list[str]:
    """bench.py --exact-batch: mode exact once per batching setting (and
    `filter`, the default setting), allowed path. Per setting: requests per
    call, Envoy CPU µs per request, p50 and p99 (against native, paired);
    then the least-squares line of Envoy CPU per request against calls per
    request over the settings: its slope is what one call costs Envoy (the
    gRPC stream, its frames, the answer's crossing into the VM), its
    intercept what an exact-mode request costs without its call."""
    per_cfg = summary.get("allowed", {})
    cfgs = [c for c in results.get("configs", []) if c.startswith(BATCH_PREFIX)]
    if not cfgs:
        return []
    if "filter" in per_cfg:
        cfgs.insert(0, "filter")
    rows, points = [], []
    for cfg in cfgs:
        s = per_cfg.get(cfg)
        if s is None:
            continue
        cpr = s["calls_per_request"]
        cpu = per_request(s, "envoy")
        if cpu is not None and cpr > 0:
            points.append((cpr, cpu))
        r = paired_ratios(results, "allowed", a=cfg, b="native")
        p99 = "" if r is None else f"{r[2]:.2f}x"
        rows.append(f"| {CONFIG_LABELS[cfg]}{' ⚠' if failed(s) else ''} "
                    f"| {1 / cpr if cpr else 0:,.2f} | {s['rps_median']:,.0f} "
                    f"| {'' if cpu is None else f'{cpu:,.1f}'} | {s['p50_median']:.2f} "
                    f"| {s['p99_median']:.2f} | {p99} |")
    lines = [
        "Exact mode's batching (allowed path, `bench.py --exact-batch`): requests per call "
        "(the Envoy's own rate-limit calls), throughput, Envoy CPU µs per request, "
        "p50 and p99 (ms; p99 against native, paired).",
        "",
        "| Configuration | requests / call | req/s | Envoy CPU µs / request | p50 ms "
        "| p99 ms | p99 vs native |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]
    if len(points) >= 2:
        n = len(points)
        mx = sum(x for x, _ in points) / n
        my = sum(y for _, y in points) / n
        sxx = sum((x - mx) ** 2 for x, _ in points)
        if sxx > 0:
            slope = sum((x - mx) * (y - my) for x, y in points) / sxx
            lines += ["", f"Envoy CPU per request ≈ {my - slope * mx:,.1f} µs + "
                      f"{slope:,.1f} µs × calls per request (least squares over {n} "
                      f"settings): one call costs Envoy about {slope:,.1f} µs."]
    return lines


def per_request(s: dict, component: str) -> float | None:
    """CPU µs of one component per request served, over a row's runs."""
    cpu = s["cpu_s"].get(component)
    return 1e6 * cpu / s["served"] if s["served"] and cpu is not None else None


def counter_markdown(results: dict, summary: dict[str, dict[str, dict]]) -> list[str]:
    """The counter against envoyproxy/ratelimit (COUNTER_PAIRS), per
    scenario both ran in: throughput and p99 paired per repetition, the
    service's and Redis's CPU per request served, Redis commands per
    admitted request; the ratio and, on the allowed path, the target."""
    rows = []
    for name, per_cfg in summary.items():
        for cfg, ref in COUNTER_PAIRS:
            a, b = per_cfg.get(cfg), per_cfg.get(ref)
            if a is None or b is None:
                continue
            memory = cfg.endswith("_memory")

            def vs(x: float | None, y: float | None, target: float | None,
                   higher: bool = False) -> str:
                if x is None or y is None:
                    return ""
                cell = f"{x:,.1f} / {y:,.1f}"
                if y:
                    cell += f" = {x / y:.2f}x"
                    if target is not None and name == "allowed":
                        met = x / y >= target if higher else x / y <= target
                        cell += f" ({'≥' if higher else '≤'} {target:g}x: "
                        cell += ("met" if met else "short") + ")"
                return cell

            r = paired_ratios(results, name, a=cfg, b=ref)
            rps_target = COUNTER_TARGETS["memory_rps" if memory else "filter_rps"]
            if r is None:
                rps = p99 = ""
            else:
                rps = f"{r[0]:.2f}x ({r[1]:.2f}x)"
                if name == "allowed" and (memory or cfg == "filter_exact_counter"):
                    rps += f" (≥ {rps_target:g}x: {'met' if r[0] >= rps_target else 'short'})"
                p99 = f"{r[2]:.2f}x ({r[3]:.2f}x)"
                if name == "allowed" and cfg == "filter_exact_counter":
                    p99 += f" (≤ 1x: {'met' if r[2] <= 1.0 else 'short'})"
            commands = [sum(x["redis_sent"].values()) / x["admitted"] if x["admitted"]
                        else None for x in (a, b)]
            cmd_cell = "" if commands[0] is None else f"{commands[0]:.3f}"
            if commands[1] is not None:
                cmd_cell += f" / {commands[1]:.3f}"
            if (name == "allowed" and not memory and commands[0] is not None):
                target = COUNTER_TARGETS["redis_commands"]
                cmd_cell += f" (≤ {target:g}: {'met' if commands[0] <= target else 'short'})"
            rows.append(
                f"| {name} | {CONFIG_LABELS[cfg]} | {CONFIG_LABELS[ref]} | {rps} | {p99} "
                f"| {vs(per_request(a, 'service'), per_request(b, 'service'), None if memory else COUNTER_TARGETS['service_cpu'])} "
                f"| {vs(per_request(a, 'redis'), per_request(b, 'redis'), None if memory else COUNTER_TARGETS['redis_cpu'])} "
                f"| {cmd_cell} "
                f"| {vs(per_request(a, 'envoy'), per_request(b, 'envoy'), None)} |")
    if not rows:
        return []
    return [
        "The counter (ratelimit-counter) against envoyproxy/ratelimit: the same Envoy "
        "making the same calls, one service or the other, the same Redis; and its memory "
        "store against its Redis store. Throughput and p99: medians over repetitions of "
        "each repetition's ratio (in brackets the worst). CPU: µs per request served, "
        "this configuration / the other = ratio. Targets (allowed path): service CPU at "
        f"most {COUNTER_TARGETS['service_cpu']:g}x, Redis CPU at most "
        f"{COUNTER_TARGETS['redis_cpu']:g}x, Redis commands sent per admitted request "
        "(the counter: EVALSHA; not the commands its script runs inside Redis) at most "
        f"{COUNTER_TARGETS['redis_commands']:g}, this filter + counter at least "
        f"{COUNTER_TARGETS['filter_rps']:g}x the throughput with p99 no worse, the memory "
        f"store at least {COUNTER_TARGETS['memory_rps']:g}x the Redis store.",
        "",
        "| Scenario | Configuration | against | req/s ratio (worst) | p99 ratio (worst) "
        "| service CPU µs / request | Redis CPU µs / request "
        "| Redis commands sent / admitted request | Envoy CPU µs / request |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]


def pinned_markdown(results: dict, per_cfg: dict[str, dict]) -> list[str]:
    """The pinned scenario: the pinned tenant (all its traffic on one Envoy)
    against the tenant spread over the fleet's other Envoys, same quota."""
    st = results["settings"]
    fleet = st.get("pinned_fleet", 3)
    bg = st.get("pinned_background_connections", 2)
    q = results.get("quota", {}).get("pinned", {})
    lines = [
        f"Pinned tenant: a fleet of {fleet} Envoys per configuration; the pinned tenant's "
        f"{st['connections']} connections all go to the first Envoy, another tenant with "
        f"the same quota ({st.get('pinned_quota_per_minute', 0):,} per minute) sends on "
        f"{bg} connections to each of the other {fleet - 1}. Admitted per minute window in "
        "which the tenant asked for more than its quota; a quota that collapsed to a share "
        f"of the fleet would show about 1/{fleet} of it.",
        "",
        "| Configuration | pinned tenant: max / mean / min of quota | windows "
        "| spread tenant: max / mean / min | windows | calls / request (pinned Envoy) |",
        "|---|---:|---:|---:|---:|---:|",
    ]

    def cells(w: dict) -> tuple[str, str]:
        d = w.get("minute")
        if not d or not d["admitted"]:
            return "no saturated window", "0"
        a = d["admitted"]
        return (f"{max(a):,} / {statistics.mean(a):,.1f} / {min(a):,} of {d['limit']:,}",
                str(len(a)))

    for cfg in results.get("configs", ()):
        s = per_cfg.get(cfg)
        if s is None:
            continue
        pinned = cells(quota_windows(results, "pinned", cfg))
        spread_tenant = q.get("spread", {}).get(cfg)
        spread = cells(quota_windows(results, "pinned", cfg, [spread_tenant] if spread_tenant
                                     else [], in_flight=bg * (fleet - 1)))
        lines.append(f"| {CONFIG_LABELS[cfg]}{' ⚠' if failed(s) else ''} | {pinned[0]} "
                     f"| {pinned[1]} | {spread[0]} | {spread[1]} "
                     f"| {s['calls_per_request']:.4f} |")
    return lines


def service_side_markdown(ss: dict) -> list[str]:
    """The service-side scenario (bench/service_side.py): medians per
    configuration, each configuration's throughput against the first (one
    envoyproxy/ratelimit on one Redis) per repetition (median, worst), and
    a counter's requests per second per service core against
    envoyproxy/ratelimit's on the same topology ("against"), per repetition."""
    by_cfg: dict[str, list[dict]] = {}
    for run in ss["runs"]:
        by_cfg.setdefault(run["config"], []).append(run)
    pinned = ss.get("pinned_service_cpu")
    against = ss.get("against", {})
    lines = [
        f"Service side: {ss['title']}; the service scaled out"
        + (f" (every replica pinned to CPU {pinned}, GOMAXPROCS=1, TOKIO_WORKER_THREADS=1)"
           if pinned is not None else "")
        + ". CPU per call is the CPU time the replicas (or the Redis servers) used "
        "during the run over the calls they answered; requests per service core, the "
        "requests over the replicas' CPU seconds. Redis commands: INCRBY and EXPIRE "
        "(envoyproxy/ratelimit), EVALSHA (the counter).",
        "",
        "| Configuration | req/s | p99 ms | service calls/s | Envoy CPU µs/request "
        "| service CPU µs/call | Redis CPU µs/call | Redis commands / call "
        "| req/s per service core | counter vs envoyproxy/ratelimit per service core "
        "| req/s vs first |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    first = ss["configs"][0]
    by_rep = {cfg: {r["rep"]: r for r in runs} for cfg, runs in by_cfg.items()}

    def med(runs: list[dict], key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in runs)

    def paired(cfg: str, ref: str, key: str) -> str:
        ratios = [r[key] / by_rep[ref][rep][key] for rep, r in by_rep.get(cfg, {}).items()
                  if rep in by_rep.get(ref, {}) and by_rep[ref][rep].get(key)]
        return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}x)" if ratios else ""

    any_failed = False
    for cfg in ss["configs"]:
        runs = by_cfg.get(cfg, [])
        if not runs:
            continue
        failed_calls = sum(r.get("rls_errors", 0) + r.get("failed_open", 0) for r in runs)
        mark = " ⚠" if failed_calls else ""
        any_failed = any_failed or bool(failed_calls)
        ref = against.get(cfg)
        per_core = (f"{paired(cfg, ref, 'requests_per_service_core_s')} vs "
                    f"{ss['labels'][ref]}" if ref else "")
        lines.append(
            f"| {ss['labels'][cfg]}{mark} | {med(runs, 'rps'):,.0f} "
            f"| {statistics.median(r['latency_ms']['p99'] for r in runs):.2f} "
            f"| {med(runs, 'rls_calls_per_s'):,.0f} "
            f"| {med(runs, 'envoy_cpu_us_per_request'):.0f} "
            f"| {med(runs, 'service_cpu_us_per_call'):.0f} "
            f"| {med(runs, 'redis_cpu_us_per_call'):.0f} "
            f"| {med(runs, 'redis_data_commands_per_call'):.2f} "
            f"| {med(runs, 'requests_per_service_core_s'):,.0f} | {per_core} "
            f"| {paired(cfg, first, 'rps') if cfg != first else '1.00x'} |")
    if any_failed:
        lines += ["", "⚠: calls to the service failed in this row's runs (the filter let "
                  "the requests through, on_failure allow): its figures are not those of a "
                  "service that answered."]
    tls = tls_markdown(ss, by_cfg, by_rep)
    if tls:
        lines += ["", *tls]
    return lines


# The TLS table's figures per request: what it shows, the run's key, and
# which way is worse for a ratio (lower req/s, more CPU).
TLS_FIGURES = (("req/s", "rps", min), ("service CPU µs/request", "service_cpu_us_per_request", max),
               ("Redis CPU µs/request", "redis_cpu_us_per_request", max),
               ("Envoy CPU µs/request", "envoy_cpu_us_per_request", max))


def tls_markdown(ss: dict, by_cfg: dict[str, list[dict]],
                 by_rep: dict[str, dict[int, dict]]) -> list[str]:
    """The TLS cost (service_side.TLS_AGAINST): each configuration with TLS
    against the same one in plaintext, per request, medians over
    repetitions, and their ratio TLS/plaintext paired per repetition
    (median, worst)."""
    pairs = [(c, ref) for c, ref in ss.get("tls_against", {}).items()
             if by_cfg.get(c) and by_cfg.get(ref)]
    if not pairs:
        return []
    lines = [
        "TLS cost on the allowed path: " + (ss.get("tls") or "TLS") + ", against the same "
        "path in plaintext, same run. CPU per request: over every request, those the "
        "filter's local layer answered without a call included (calls / request says how "
        "many called); medians; TLS/plaintext paired per repetition: median (worst).",
        "",
        "| Configuration | against | calls / request | " + " | ".join(
            f"{label} | ratio" for label, _, _ in TLS_FIGURES) + " |",
        "|---|---|---:|" + "---:|---:|" * len(TLS_FIGURES),
    ]
    for cfg, ref in pairs:
        calls = [r["rls_calls"] / r["requests"] for r in by_cfg[cfg] if r["requests"]]
        cells = [f"{statistics.median(calls):.2f}" if calls else ""]
        for _, key, worst in TLS_FIGURES:
            value = statistics.median(r.get(key, 0.0) for r in by_cfg[cfg])
            ratios = [r[key] / by_rep[ref][rep][key] for rep, r in by_rep[cfg].items()
                      if rep in by_rep[ref] and by_rep[ref][rep].get(key)]
            cells.append(f"{value:,.0f}" if key == "rps" else f"{value:.1f}")
            cells.append(f"{statistics.median(ratios):.2f}x ({worst(ratios):.2f}x)"
                         if ratios else "")
        lines.append(f"| {ss['labels'][cfg]} | {ss['labels'][ref]} | " + " | ".join(cells) + " |")
    return lines


def chart(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarise(results)
    # The outage's 1 s waits would flatten every other bar: the table has it.
    scenarios = [s for s in summary if s != "outage"]
    if not scenarios:  # a service-side-only run: nothing to draw
        return
    configs = [c for c in results.get("configs", CONFIG_LABELS)
               if any(c in summary[s] for s in scenarios)]
    colors = {"baseline": "#9e9e9e", "native": "#1f77b4", "filter": "#ff7f0e",
              "filter_lease": "#8c564b", "filter_sync": "#e377c2",
              "wasm_noop": "#2ca02c", "wasm_reply": "#bcbd22", "filter_no_local": "#d62728",
              "filter_alt": "#9467bd", "filter_local": "#17becf",
              "native_counter": "#aec7e8", "filter_exact_counter": "#ffbb78",
              "filter_exact_counter_memory": "#98df8a", "filter_lease_counter": "#c49c94",
              "filter_sync_counter": "#f7b6d2", "filter_logged": "#7f7f7f"}
    # Admitted per window over the limit, the scenario's first quota unit (hot:
    # per minute): the bar is the mean, the whiskers the lowest and the highest.
    for sc in scenarios:
        for cfg, s in summary[sc].items():
            if cfg in NON_LIMITING:  # admits everything or nothing: not a quota
                continue
            ratios = [a / d["limit"]
                      for d in list(quota_windows(results, sc, cfg).values())[:1]
                      for a in d["admitted"]]
            if ratios:
                s["quota_ratio"] = ratios
                s["quota_ratio_mean"] = statistics.mean(ratios)
    fig, axes2 = plt.subplots(2, 2, figsize=(14, 9))
    axes = axes2.flatten()
    for ax, key, runs_key, label in (
        (axes[0], "rps_median", "rps", "requests per second (higher is better)"),
        (axes[1], "p99_median", "p99", "p99 latency, ms (lower is better)"),
        (axes[2], "calls_per_request", "cpr",
         "rate-limit service calls per request (whiskers: min-max)"),
        (axes[3], "quota_ratio_mean", "quota_ratio",
         "admitted per saturated window / limit (hot: per minute; whiskers: min-max)"),
    ):
        # A panel's bars: the configurations with a figure in it (the quota
        # panel: not those that limit nothing).
        shown = [c for c in configs if any(key in summary[sc].get(c, {}) for sc in scenarios)]
        width = 0.8 / max(len(shown), 1)
        for i, cfg in enumerate(shown):
            xs, ys, lo, hi = [], [], [], []
            for j, sc in enumerate(scenarios):
                s = summary[sc].get(cfg)
                if s is None or key not in s:
                    continue
                xs.append(j + (i - (len(shown) - 1) / 2) * width)
                ys.append(s[key])
                lo.append(s[key] - min(s[runs_key]))
                hi.append(max(s[runs_key]) - s[key])
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=CONFIG_LABELS[cfg],
                   color=colors.get(cfg, "#333333"))
        ax.set_xticks(range(len(scenarios)))
        ax.set_xlim(-0.5, len(scenarios) - 0.5)
        ax.set_xticklabels(scenarios)
        ax.set_title(label)
        ax.grid(axis="y", alpha=0.3)
    axes[3].axhline(1.0, color="black", linewidth=0.8)
    axes[0].legend()
    m, st = results["machine"], results["settings"]
    fig.suptitle(
        f"tenant-ratelimit vs Envoy's native rate-limit filters (bars: median of "
        f"{st['reps']} runs, whiskers: min-max)\n{m['cpu']}, {m['cores']} cores; Envoy "
        f"{m['envoy']}; wrk {st['connections']} connections; {results['started_utc'][:10]}",
        fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    ap.add_argument("--chart", type=Path, help="also draw the chart here")
    args = ap.parse_args()
    results = json.loads(args.results.read_text())
    print(markdown(results), end="")
    if args.chart:
        chart(results, args.chart)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A flood of distinct tenants through one Envoy, sent by wrk with
bench/flood.lua, and what it did to Envoy's heap. Used by
tests/test_flood.py (10^5 tenants) and `bench/bench.py --flood N` (10^6).

The bound is the README's ("The local layer", "Memory: a fixed number of
slots"): at most BYTES_PER_SLOT_BOUND bytes of Envoy heap per slot, all of
it allocated at start-up, however many tenants come.
"""

from __future__ import annotations

import json
import signal
import subprocess

import requests

import harness

FLOOD_SCRIPT = harness.REPO / "bench" / "flood.lua"
BYTES_PER_SLOT_BOUND = 320
LIMITS = {"x-tenant-id": {"default": {"perhour": 1000}}}


def allocated(envoy: harness.Envoy) -> int:
    return int(requests.get(f"{envoy.admin_url}/memory", timeout=2).json()["allocated"])


def wrk_flood(envoy: harness.Envoy, n: int, prefix: str, threads: int = 2,
              connections: int = 16, max_s: int = 1800) -> dict:
    """wrk, each request a new tenant, until `envoy` has admitted or refused
    n + `connections` more of them (so wrk has read at least n answers); the
    TRL-WRK totals."""

    def decided() -> int:
        c = envoy.filter_counters()
        return sum(c.get(k, 0) for k in ("allowed", "over_limit", "cached_over_limit",
                                         "local_over_limit", "failure_mode_allowed",
                                         "failure_mode_denied"))

    target = decided() + n + connections
    argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{max_s}s", "--timeout", "10s",
            "-s", str(FLOOD_SCRIPT), envoy.url, "--", harness.TENANT_HEADER, prefix,
            str(threads)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL)
    try:
        harness.wait_until(lambda: decided() >= target or p.poll() is not None,
                           f"wrk sends {n} requests", deadline_s=max_s)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)  # wrk's own way to end a run early: it prints
        out, err = p.communicate(timeout=60)
    # Requests wrk left in flight when it stopped are still decided by the
    # filter after wrk has gone: wait until Envoy has none, so that the
    # counters read next include them all (and the next run's none of them).
    harness.wait_until(lambda: envoy.stats(r"^http\.ingress\.downstream_rq_active$")
                       .get("http.ingress.downstream_rq_active", 1) == 0,
                       "Envoy finishes the requests wrk left in flight", deadline_s=30)
    line = next((ln for ln in out.splitlines() if ln.startswith("TRL-WRK ")), None)
    if p.returncode != 0 or line is None:
        raise harness.HarnessError(f"wrk failed ({p.returncode}): {' '.join(argv)}\n"
                                   f"{out}\n{err}")
    result = json.loads(line[len("TRL-WRK "):])
    result["statuses"] = {int(k): v for k, v in result["statuses"].items()}
    result["argv"] = argv
    return result


def run_flood(stack: harness.Stack, n: int, slots: int = 65_536, threads: int = 2,
              connections: int = 16, timeout_ms: int = harness.COUNTING_TIMEOUT_MS,
              max_s: int = 1800) -> dict:
    """Start Redis, the service, an upstream and one Envoy with `slots` slots,
    flood it with n distinct tenants; return the figures (nothing asserted)."""
    gen = stack.generate(LIMITS, timeout_ms=timeout_ms)
    redis = stack.redis()
    rls = stack.ratelimit(redis, gen)
    upstream = stack.upstream()
    # The slots' own memory: this Envoy against one with the layer off.
    off = stack.envoy(gen.plugin_config(local={"enabled": False}), rls, upstream,
                      name="envoy-local-off")
    on = stack.envoy(gen.plugin_config(local={"slots": slots}), rls, upstream,
                     name="envoy-flood")
    slots_bytes = allocated(on) - allocated(off)
    off.stop()

    warm = wrk_flood(on, 2_000, harness.unique("warm") + "-", threads, connections)
    counters_before = on.filter_counters()
    before = allocated(on)
    run = wrk_flood(on, n, harness.unique("flood") + "-", threads, connections, max_s)
    after = allocated(on)
    counters = {k: v - counters_before.get(k, 0) for k, v in on.filter_counters().items()}
    answered = sum(run["statuses"].values())
    return {
        "tenants": n,
        "slots": slots,
        "slots_bytes": slots_bytes,
        "heap_before": before,
        "heap_after": after,
        "heap_growth": after - before,
        "bound_bytes": slots * BYTES_PER_SLOT_BOUND,
        "answered": answered,
        "statuses": run["statuses"],
        "wrk_errors": run["errors"],
        "seconds": run["duration_us"] / 1e6,
        "rps": answered / max(run["duration_us"] / 1e6, 1e-9),
        "counters": counters,
        "warm_statuses": warm["statuses"],
        "connections": connections,
    }

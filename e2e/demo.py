#!/usr/bin/env python3
"""The seed's test, live on loopback: "Exactly 100, not 101".

Starts Redis, the envoyproxy/ratelimit service, an upstream and two Envoys with
the tenant-ratelimit filter sharing that service (tests/harness/ does the
starting, readiness polling and stopping), generates the configs from
e2e/limits.json with ratelimit-config, then sends 1,000 sequential requests for
one tenant (quota 100/hour), alternating between the two Envoys, and prints a
k6-like summary per status. A second run follows in the same hour window.
Everything it started is stopped on exit, on Ctrl-C and on SIGTERM.

    make demo          (builds first)
    make demo DEMO_ARGS=--hold   (then keeps the stack up until Ctrl-C)
    .deps/venv/bin/python e2e/demo.py [--requests 1000] [--tenant tenant-a] [--hold]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import harness  # noqa: E402

LIMITS = REPO / "e2e" / "limits.json"
DOMAIN = "internal-api"


class Stopped(Exception):
    pass


def _on_sigterm(signum, frame):
    raise Stopped(f"signal {signum}")


def run(label: str, fleet: harness.Fleet, n: int, tenant: str) -> list[harness.Result]:
    print(f"\n{label}")
    t0 = time.perf_counter()
    results = harness.run_sequential(fleet.urls, n, tenant=tenant)
    elapsed = time.perf_counter() - t0
    counts = harness.tally(results)
    if 200 not in counts:
        print(f"  status 200 {'.' * 12} count=0")
    print(harness.summary(results))
    per_envoy = Counter(r.target for r in results if r.status == 200)
    spread = ", ".join(f"{e.name} {per_envoy.get(i, 0)}" for i, e in enumerate(fleet.envoys))
    print(f"  admitted per Envoy: {spread}   ({n} requests in {elapsed:.2f}s)")
    return results


def hold(fleet: harness.Fleet) -> None:
    """Keep the stack up for requests of your own, until Ctrl-C or SIGTERM."""
    envoy = fleet.envoys[0]
    print("\nholding the stack for your own requests; Ctrl-C stops everything. Try:")
    print(f"  for i in $(seq 101); do curl -s -o /dev/null -w '%{{http_code}} ' "
          f"-H 'x-tenant-id: tenant-z' {envoy.url}; done; echo")
    print(f"  curl -si -H 'x-tenant-id: tenant-z' {envoy.url}")
    print(f"  curl -s {envoy.admin_url}/stats/prometheus | grep '^tenant_ratelimit'")
    try:
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, Stopped):
        print("\nstopping everything")


# Where a refusal came from, by the filter's counter.
REFUSAL_SOURCES = (("service", "over_limit"), ("cache", "cached_over_limit"),
                   ("bucket", "local_over_limit"))


def print_summary(fleet) -> None:
    """What each Envoy did: admitted, refused by source, failed open."""
    print(f"\n  {'envoy':<10} {'admitted':>8} {'refused':>8}   "
          + "  ".join(f"{name:>7}" for name, _ in REFUSAL_SOURCES) + f"  {'failed open':>11}")
    for e in fleet.envoys:
        c = e.filter_counters()
        by_source = [int(c.get(counter, 0)) for _, counter in REFUSAL_SOURCES]
        print(f"  {e.name:<10} {int(c.get('allowed', 0)):>8} {sum(by_source):>8}   "
              + "  ".join(f"{n:>7}" for n in by_source)
              + f"  {int(c.get('failure_mode_allowed', 0)):>11}")


def main() -> int:
    ap = argparse.ArgumentParser(description="Exactly 100, not 101: two Envoys, one quota.")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--tenant", default="tenant-a")
    ap.add_argument("--counters", action="store_true",
                    help="also print every filter counter of both Envoys")
    ap.add_argument("--hold", action="store_true",
                    help="after the runs, keep the stack up for your own requests until Ctrl-C")
    ap.add_argument("--workdir", type=Path,
                    default=REPO / ".run" / time.strftime("demo-%Y%m%d-%H%M%S"))
    args = ap.parse_args()

    missing = harness.missing_binaries()
    if missing:
        print("missing (run `make deps build`):\n  " + "\n  ".join(missing), file=sys.stderr)
        return 2

    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGHUP, _on_sigterm)
    limits = json.loads(LIMITS.read_text())
    stack = harness.Stack(args.workdir)
    ok = False
    try:
        gen = stack.generate(limits, DOMAIN)
        quota = gen.limits["x-tenant-id"]["default"]["perhour"]
        # Redis as shipped: append-only file, fsync every second (a restart
        # keeps the counts; docs/failures.md).
        fleet = stack.fleet(gen, envoys=2, redis_persist=True)
        print(f"tenant-ratelimit demo: quota {quota}/hour for {args.tenant} "
              f"(default rule of {LIMITS.relative_to(REPO)}), domain {DOMAIN}")
        print(f"  redis      127.0.0.1:{fleet.redis.port}")
        print(f"  ratelimit  grpc 127.0.0.1:{fleet.ratelimit.grpc_port}, "
              f"http {fleet.ratelimit.http_url}")
        print(f"  upstream   {fleet.upstream.url}")
        for e in fleet.envoys:
            print(f"  {e.name:<10} {e.url}  (admin {e.admin_url})")
        print(f"  logs       {stack.workdir / 'logs'}")

        # Both runs must share one hour window (a run across the top of the
        # hour rightly gets a fresh quota): make sure enough of it is left.
        waited = harness.ensure_window_room(3600, 120)
        if waited:
            print(f"  (waited {waited:.0f}s for the next hour window)")

        run1 = run("run 1", fleet, args.requests, args.tenant)
        run2 = run("run 2 (same hour)", fleet, args.requests, args.tenant)

        counters = fleet.counters()
        within = fleet.ratelimit.rule_counter("within_limit", DOMAIN, "hour")
        key = harness.redis_key(DOMAIN, "hour", args.tenant)
        print_summary(fleet)
        if args.counters:
            print("\nfilter counters (both Envoys): "
                  + ", ".join(f"{k}={v}" for k, v in sorted(counters.items())))
        print(f"\nratelimit service: within_limit={within} for {DOMAIN}.generic_key_per_hour")
        print(f"redis key {key} = {fleet.redis.get_int(key)} (the calls the service got, "
              f"refused ones included; cached refusals never reach it)")

        expected1 = Counter({200: min(quota, args.requests), 429: max(0, args.requests - quota)})
        ok = harness.tally(run1) == expected1 and harness.tally(run2) == Counter({429: args.requests})
        if ok:
            print(f"\nOK: exactly {quota} admitted across two Envoys, none in the second run")
        else:
            print(f"\nUNEXPECTED: see the counts above and the logs in {stack.workdir}")
            failed_open = counters.get("failure_mode_allowed", 0)
            if failed_open:
                timeout = gen.plugin_config()["rate_limit_service"]["timeout_ms"]
                print(f"  {failed_open} requests failed open: the service did not answer "
                      f"within timeout_ms={timeout} (a loaded machine?), and every such "
                      f"request is an admitted one.")
        if args.hold:
            hold(fleet)
    except (KeyboardInterrupt, Stopped) as e:
        print(f"\ninterrupted ({str(e) or 'Ctrl-C'}): stopping everything", file=sys.stderr)
        return 130
    except harness.HarnessError as e:
        print(f"\n{e}\n\n{stack.log_tails(30)}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stack.close()
        print(f"stopped {len(stack.processes)} processes")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""`make bench`'s faults scenario: the test the design asks for. Skewed
traffic with a pinned tenant, through this filter in each of its modes
(exact, lease, sync) and with the local fallback, and, one at a time,
the faults a fleet meets:

  latency-5, latency-20, latency-100
      the service's Redis slowed by 5, 20 or 100 ms a round trip
      (Toxiproxy between the service and Redis, a latency toxic on
      Redis's replies), then back to normal
  primary-killed
      a Redis Cluster (3 primaries, a replica each): the primary holding
      the pinned tenant's counter killed (SIGKILL) under load, its replica
      promoted
  fleet-up
      the fleet grown from 2 Envoys to 4 under load and shrunk back to 2,
      the service up
  fleet-down
      the same with the service stopped: 2 Envoys, the service stopped,
      grown to 4, shrunk to 2, the service started again
  regions
      one of two regions cut off from the rebalancer, then traffic moved
      from one region to the other: a row of the table, not run yet

Each case is a list of phases (CASES: the case table; a new case is a new
entry, a changed promise a changed text). A phase's `before` action runs
before its load starts (a shrink, latency on or off, the service stopped),
its `during` action while the load runs (Envoys started, a primary
killed and the failover awaited). Every (case, configuration) runs on a
stack of its own (Redis or the cluster, the service, a counting upstream,
the Envoys), with tenants of its own, and each phase's load is wrk with
bench/tenants.lua: the pinned tenant on the first Envoy only (`single`),
and on every Envoy 100 tenants Zipf-distributed (s = 1.0), the busiest far
over its limit.

Reported per case, configuration, phase and tracked tenant (the pinned one,
and the busiest of the skewed ones), over the phase's whole seconds (the
limits are per second: each second is a window): admitted per window
against the limit (admitted counted where they arrive, at the upstream;
sent counted by wrk), overshoot (admitted beyond the limit) and undershoot
(below min(sent, limit)), wrk's p99, the requests failed open (the filter's
failure_mode_allowed over the fleet), the local fallback's decisions; and
beside each row the behaviour docs/failures.md, docs/modes.md and
docs/scaling.md promise for it, with a check of the figures against it.

Used by bench/bench.py (--faults on|off|only); the results go under
"faults" in results.json, and markdown() gives their table.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import cluster as cl  # noqa: E402
import harness as h  # noqa: E402

# This filter's configurations: local.mode, and on_failure "local".
CONFIGS = ("exact", "lease", "sync", "local")
CONFIG_TITLES = {"exact": "exact", "lease": "lease", "sync": "sync",
                 "local": "exact, on_failure local"}
# The product's call timeout (`rate_limit_service.timeout_ms`'s default).
TIMEOUT_MS = 20
PIN_LIMIT = 50  # per second, the pinned tenant's group
SKEW_LIMIT = 20  # per second, every skewed tenant (the default group)
SKEW_TENANTS = 100
SKEW_EXPONENT = "1.0"
PIN_CONNECTIONS = 2
SKEW_CONNECTIONS = 2  # per Envoy
PHASE_S = 10
# The counter's deadline for its store (the bench's, bench/counters.py).
COUNTER_STORE_TIMEOUT_MS = 500


@dataclass(frozen=True)
class Phase:
    name: str
    # "ok": the service decides in time; "failing": it cannot (too slow,
    # its Redis primary dead, itself down): what the promise is about.
    state: str = "ok"
    # Actions (run_action): "latency:MS", "clear", "kill_primary",
    # "grow:N", "shrink:N", "service_down", "service_up".
    before: tuple[str, ...] = ()
    during: tuple[str, ...] = ()


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    phases: tuple[Phase, ...]
    # What the docs promise while the fault lasts, per configuration ("*":
    # any other); the phases without a fault promise each mode's own bound.
    promised: dict[str, str] = field(default_factory=dict)
    # "single": one Redis behind Toxiproxy; "cluster": a Redis Cluster.
    redis: str = "single"
    envoys: int = 2  # at the start; also the local fallback's fallback.envoys
    # The rate-limit service: None for --faults-service.
    service: str | None = None
    # Not run yet, and why.
    pending: str = ""


def latency_case(ms: int) -> Case:
    slow = "ok" if ms < TIMEOUT_MS // 2 else "failing"
    return Case(
        f"latency-{ms}", f"Redis {ms} ms slower (Toxiproxy), call timeout {TIMEOUT_MS} ms",
        (Phase("before"),
         Phase(f"+{ms} ms", slow, before=(f"latency:{ms}",)),
         Phase("after", before=("clear",))),
        promised=({"*": "within timeout_ms: slower answers, the mode's own bound "
                        "(docs/failures.md, the delay-proxy row)"} if slow == "ok" else {
            "exact": "past timeout_ms: each call fails, the request fails open, counted "
                     "(failure_mode_allowed); the breaker opens after 5 and answers at once",
            "lease": "spends the lease it holds, then fails open, counted (docs/modes.md)",
            "sync": "admits up to max_unsynced more locally, then fails open, counted",
            "local": "each Envoy its share of every limit (1 / fallback.envoys), refusals "
                     "429; never fails open",
        }))


CASES = (
    latency_case(5),
    latency_case(20),
    latency_case(100),
    Case("primary-killed", "A Redis Cluster primary killed (SIGKILL), its replica promoted",
         (Phase("before"),
          Phase("killed", "failing", during=("kill_primary",)),
          Phase("after")),
         promised={
             "*": "fails open, counted, until the service reaches the promoted replica "
                  "(6-10 s with envoyproxy/ratelimit, docs/scaling.md), then exact again; "
                  "the window may admit again what the replica had not received",
             "local": "each Envoy its share until the service reaches the promoted "
                      "replica, then exact again",
         }, redis="cluster"),
    Case("fleet-up", "The fleet grown from 2 Envoys to 4 and shrunk back, the service up",
         (Phase("2 Envoys"),
          Phase("growing to 4", during=("grow:4",)),
          Phase("4 Envoys"),
          Phase("2 Envoys again", before=("shrink:2",))),
         promised={
             "exact": "exactly the limit per window whatever the fleet's size",
             "local": "exactly the limit per window whatever the fleet's size",
             "lease": "never over the limit; its undershoot bound grows with the Envoys "
                      "serving the tenant: (B - 1) + E x 1.5 x B",
             "sync": "over by at most 2 x (E - 1) x max_unsynced per window, E the Envoys "
                     "serving the tenant",
         }),
    Case("fleet-down", "The fleet grown from 2 Envoys to 4 and shrunk back, the service down",
         (Phase("2 Envoys"),
          Phase("2, service down", "failing", before=("service_down",)),
          Phase("growing to 4, down", "failing", during=("grow:4",)),
          Phase("4 Envoys, down", "failing"),
          Phase("2 Envoys, down", "failing", before=("shrink:2",)),
          Phase("after", before=("service_up",))),
         promised={
             "*": "every request fails open, counted (at once once the breaker is open)",
             # The configured share (docs/failures.md, "Which share"): it does
             # not follow the fleet, so 4 Envoys admit twice the limit.
             "local": "each Envoy 1 / fallback.envoys (2) of each limit: 2 Envoys the "
                      "limit, 4 Envoys twice it; an Envoy started during the outage its "
                      "whole share",
         }),
    Case("regions", "One of two regions cut off from the rebalancer; traffic moved between "
         "regions", (), pending="needs regional allocations and their rebalancer"),
)
CASE_NAMES = tuple(c.name for c in CASES)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--faults", choices=("on", "off", "only"),
                    help="the faults scenario (bench/faults.py: Redis latency, a Redis "
                         "Cluster primary killed, the fleet resized with the service up "
                         "and down, for exact, lease, sync and the local fallback): on "
                         "(default), off (default with --smoke), only")
    ap.add_argument("--faults-cases", default=",".join(CASE_NAMES),
                    help="faults scenario: comma-separated subset of " + ", ".join(CASE_NAMES))
    ap.add_argument("--faults-configs", default=",".join(CONFIGS),
                    help="faults scenario: comma-separated subset of " + ", ".join(CONFIGS))
    ap.add_argument("--faults-phase-s", type=int, default=PHASE_S, metavar="S",
                    help=f"faults scenario: seconds of load per phase ({PHASE_S})")
    ap.add_argument("--faults-service", choices=h.SERVICES, default="envoy-ratelimit",
                    help="faults scenario: the rate-limit service (envoy-ratelimit)")


def settle(args: argparse.Namespace) -> bool:
    """Fills in --faults's default; True when only the faults scenario runs
    (then neither the service-side scenario nor the flood does)."""
    if args.faults is None:
        args.faults = "off" if args.smoke else "on"
    unknown = (set(args.faults_cases.split(",")) - set(CASE_NAMES)) | (
        set(args.faults_configs.split(",")) - set(CONFIGS))
    if args.faults != "off" and unknown:
        raise SystemExit(f"--faults-cases/--faults-configs: unknown {sorted(unknown)}")
    if args.faults == "only":
        args.service_side, args.flood = "off", 0
        return True
    return False


# ------------------------------------------------------------------ one run

class Run:
    """One case for one configuration: its stack, its fleet, its actions."""

    def __init__(self, stack: h.Stack, case: Case, cfg: str, args, bench, tag: str):
        self.stack, self.case, self.cfg, self.args, self.bench = stack, case, cfg, args, bench
        self.pin = f"pin-{tag}"
        self.skew_prefix = f"z-{tag}-"
        self.hot = f"{self.skew_prefix}0000"
        self.tracked = [self.pin, self.hot]
        self.limits = {h.TENANT_HEADER: {
            "default": {"persecond": SKEW_LIMIT},
            "pinned": {"persecond": PIN_LIMIT, "header_value": [self.pin]}}}
        self.limit_of = {self.pin: PIN_LIMIT, self.hot: SKEW_LIMIT}
        self.gen = stack.generate(self.limits, domain=f"faults-{tag}", timeout_ms=TIMEOUT_MS)
        self.link = None
        self.cluster = None
        if case.redis == "cluster":
            self.cluster = cl.RedisCluster.start(stack)
            if stack.service == "counter":
                import counter

                self.rls = counter.Counter(stack, {self.gen.domain: self.gen.limits},
                                           store="redis-cluster://" + self.cluster.url,
                                           store_timeout_ms=COUNTER_STORE_TIMEOUT_MS)
            else:
                (self.rls,) = cl.services(stack, self.gen, 1, cl.service_env(cluster=self.cluster),
                                          log_level="warn")
        else:
            redis = stack.redis()
            toxi = h.Toxiproxy(stack)
            self.link = toxi.proxy("redis", redis.port)
            self.rls = stack.ratelimit(redis, self.gen, extra_env={"REDIS_URL": self.link.address},
                                       **({} if stack.service == "counter" else
                                          {"log_level": "warn"}))
        self.upstream_log = stack.workdir / "upstream-admitted.log"
        self.upstream = bench.counting_upstream(stack, h.TENANT_HEADER, self.tracked,
                                                self.upstream_log)
        plugin = self.gen.plugin_config()
        if cfg in ("lease", "sync"):
            plugin["local"] = dict(plugin["local"], mode=cfg)
        elif cfg == "local":
            plugin.update(on_failure="local", fallback={"envoys": case.envoys})
        self.plugin = plugin
        self.fleet: list[h.Envoy] = []
        self.started = 0
        self.grow(case.envoys)

    def grow(self, n: int) -> None:
        while len(self.fleet) < n:
            self.started += 1
            self.fleet.append(self.stack.envoy(self.plugin, self.rls, self.upstream,
                                               name=f"envoy-{self.started}",
                                               concurrency=self.args.envoy_concurrency))

    def shrink(self, n: int) -> None:
        while len(self.fleet) > n:
            self.fleet.pop().stop()

    def kill_primary(self) -> None:
        """The primary holding the pinned tenant's per-second counter of the
        next second, killed; returns once its replica is promoted."""
        t = time.time() + 1
        key = (h.counter_key(self.gen.domain, "second", self.pin, t)
               if self.stack.service == "counter"
               else h.redis_key(self.gen.domain, "second", self.pin, t))
        master = self.cluster.master_of(key)
        (replica,) = self.cluster.replicas_of(master)
        self.cluster.kill(master)
        self.cluster.wait_failover(master, replica)

    def action(self, spec: str) -> None:
        name, _, arg = spec.partition(":")
        if name == "latency":
            self.link.latency(int(arg))
        elif name == "clear":
            self.link.clear()
        elif name == "kill_primary":
            self.kill_primary()
        elif name == "grow":
            self.grow(int(arg))
        elif name == "shrink":
            self.shrink(int(arg))
        elif name == "service_down":
            self.rls.stop()
        elif name == "service_up":
            self.rls.start()
        else:
            raise h.HarnessError(f"unknown action {spec!r}")

    def counters(self) -> dict[str, dict[str, int]]:
        return {e.process.name: e.filter_counters() for e in self.fleet}

    def phase(self, phase: Phase) -> dict:
        for a in phase.before:
            self.action(a)
        secs = self.args.faults_phase_s
        b = self.bench
        c0 = self.counters()
        t0 = time.time()
        wrks = [("pinned", b.wrk_start(self.fleet[0].url, ("single", self.pin), h.TENANT_HEADER,
                                       1, PIN_CONNECTIONS, secs, [self.pin]))]
        wrks += [("skewed", b.wrk_start(e.url, ("zipf", self.skew_prefix, str(SKEW_TENANTS),
                                                SKEW_EXPONENT), h.TENANT_HEADER, 1,
                                        SKEW_CONNECTIONS, secs, [self.hot]))
                 for e in self.fleet]
        for a in phase.during:
            self.action(a)
        done = [(role, b.wrk_finish(w, secs)) for role, w in wrks]
        t1 = time.time()
        c1 = self.counters()
        counted: dict[str, int] = {}
        for name, after in c1.items():
            before = c0.get(name, {})
            for k, v in after.items():
                if v - before.get(k, 0):
                    counted[k] = counted.get(k, 0) + v - before.get(k, 0)
        sent: dict[str, dict[str, int]] = {}
        statuses: dict[str, int] = {}
        errors = 0
        for _, r in done:
            for tenant, kinds in r.get("windows", {}).items():
                per = sent.setdefault(tenant, {})
                for sec, n in kinds.get("sent", {}).items():
                    per[sec] = per.get(sec, 0) + n
            for code, n in r["statuses"].items():
                statuses[code] = statuses.get(code, 0) + n
            errors += sum(r["errors"].values())
        p99 = {role: max((r["latency_us"]["p99"] / 1000 for rr, r in done if rr == role),
                         default=0.0) for role in ("pinned", "skewed")}
        return {"phase": phase.name, "state": phase.state, "envoys": len(self.fleet),
                "start": t0, "end": t1, "statuses": statuses, "wrk_errors": errors,
                "requests": sum(r["requests"] for _, r in done), "p99_ms": p99,
                "counters": counted, "sent": sent}


def windows_of(phase: dict, tenant: str, admitted: dict[str, dict[str, int]],
               limit: int) -> list[dict]:
    """The whole seconds of a phase (each a window of the per-second limit):
    sent, admitted, overshoot and undershoot."""
    out = []
    for sec in range(math.ceil(phase["start"]), math.floor(phase["end"])):
        s = phase["sent"].get(tenant, {}).get(str(sec), 0)
        a = admitted.get(tenant, {}).get(str(sec), 0)
        out.append({"second": sec, "sent": s, "admitted": a,
                    "over": max(0, a - limit), "under": max(0, min(s, limit) - a)})
    return out


def max_unsynced(limit: int) -> int:
    """local.sync.max_unsynced's default for a group: 1,000, at most half its limit."""
    return min(1000, limit // 2)


# After a fault, the windows of the first seconds are the outage's last:
# each Envoy's breaker lets a probe through once a second, and the window in
# which the service answers again admits what its count still allows, on top
# of what the fallback admitted (docs/failures.md, "What the fallback does
# not do").
RECOVERY_S = 2


def check(case: Case, phase_def: Phase, cfg: str, phase: dict, tenant: str, limit: int,
          windows: list[dict], after_fault: bool = False) -> tuple[str, str]:
    """(the promise for this row, whether the figures keep it: "yes", "NO" or "-")."""
    c = phase["counters"]
    # What the service did not decide: failed open, or (on_failure local) the
    # fallback's admissions, a late call's too.
    opened = c.get("failure_mode_allowed", 0) + c.get("fallback_allowed", 0)
    over = sum(w["over"] for w in windows)
    # The Envoys serving the tenant: the pinned one is on the first only.
    serving = 1 if tenant.startswith("pin-") else phase["envoys"]
    bound = 2 * (serving - 1) * max_unsynced(limit) if cfg == "sync" else 0
    if not windows:
        return "", "-"
    if phase_def.state == "ok":
        text = {"exact": "exactly the limit; beyond it only what failed open, counted",
                "local": "exactly the limit; beyond it only what a failed call's fallback "
                         "admitted, counted",
                "lease": "at most the limit (undershoot only); beyond it only what failed "
                         "open, counted",
                "sync": f"over by at most 2 x (E - 1) x max_unsynced = {bound} a window, "
                        "and what failed open"}[cfg]
        faulty = [a for a in (*phase_def.before, *phase_def.during)
                  if a not in ("clear", "service_up")]
        if faulty:
            text = case.promised.get(cfg, case.promised.get("*", text))
        if after_fault:
            text += (f"; the first {RECOVERY_S} s end the outage: up to the limit again on "
                     "top, and what failed open")
            recovering = windows[:RECOVERY_S]
            windows = windows[RECOVERY_S:]
            if sum(w["over"] for w in recovering) > limit * len(recovering) + opened:
                return text, "NO"
            over = sum(w["over"] for w in windows)
        ok = over <= opened + bound * len(windows)
        return text, "yes" if ok else "NO"
    text = case.promised.get(cfg, case.promised.get("*", ""))
    if cfg == "local":
        cap = serving * math.ceil(limit / case.envoys)
        if c.get("allowed"):
            # The service still answered some Envoys (a breaker closed, a
            # tenant whose counter lives elsewhere): it admits up to the limit
            # beside the shares, unaware of them.
            cap += limit
        ok = not c.get("failure_mode_allowed") and all(w["admitted"] <= cap for w in windows)
        return text, "yes" if ok else "NO"
    if phase["statuses"].get("200", 0) and not opened:
        return text, "NO"  # a fault the promise says fails open, and nothing did
    ok = over <= opened + bound * len(windows)
    return text, "yes" if ok else "NO"


def run(args, out: Path, bench) -> dict:
    """Every chosen case for every chosen configuration; `bench` is
    bench/bench.py (its wrk, counting upstream and access-log reader)."""
    chosen = [c for c in CASES if c.name in args.faults_cases.split(",")]
    cfgs = [c for c in CONFIGS if c in args.faults_configs.split(",")]
    print(f"Faults: {', '.join(c.name for c in chosen)} x {', '.join(cfgs)}, "
          f"{args.faults_phase_s} s a phase", flush=True)
    results: dict = {"settings": {
        "timeout_ms": TIMEOUT_MS, "phase_s": args.faults_phase_s,
        "limits_per_second": {"pinned": PIN_LIMIT, "skewed": SKEW_LIMIT},
        "skewed_tenants": SKEW_TENANTS, "zipf_exponent": float(SKEW_EXPONENT),
        "connections": {"pinned": PIN_CONNECTIONS, "skewed_per_envoy": SKEW_CONNECTIONS},
        "default_service": args.faults_service}, "cases": []}
    for case in chosen:
        entry: dict = {"name": case.name, "title": case.title, "redis": case.redis,
                       "promised": case.promised, "pending": case.pending, "runs": []}
        results["cases"].append(entry)
        if case.pending:
            print(f"  {case.name}: not run ({case.pending})", flush=True)
            continue
        service = case.service or args.faults_service
        entry["service"] = service
        for cfg in cfgs:
            tag = f"{case.name}-{cfg}-{int(time.time()) % 100000}"
            with h.Stack(out / "faults" / f"{case.name}-{cfg}", service=service) as stack:
                r = Run(stack, case, cfg, args, bench, tag)
                phases = [r.phase(p) for p in case.phases]
                r.rls.process.stop(deadline_s=2.0)  # calls stuck on a dead primary
                admitted = bench.admitted_per_second(r.upstream_log)
            rows = []
            for i, (p_def, p) in enumerate(zip(case.phases, phases)):
                after_fault = i > 0 and case.phases[i - 1].state == "failing"
                for tenant in r.tracked:
                    limit = r.limit_of[tenant]
                    wins = windows_of(p, tenant, admitted, limit)
                    promise, kept = check(case, p_def, cfg, p, tenant, limit, wins, after_fault)
                    rows.append({"phase": p["phase"], "tenant": "pinned" if tenant == r.pin
                                 else "skewed (busiest)", "limit": limit, "windows": wins,
                                 "promised": promise, "as_promised": kept})
                    w = wins or [{"admitted": 0, "over": 0, "under": 0}]
                    print(f"  {case.name:<15} {cfg:<6} {p['phase']:<20} {rows[-1]['tenant']:<17}"
                          f" admitted/s {sum(x['admitted'] for x in w) / len(w):6.1f} of {limit}"
                          f" (max {max(x['admitted'] for x in w)}) over "
                          f"{sum(x['over'] for x in w)} under {sum(x['under'] for x in w)}"
                          f"  p99 {p['p99_ms']['pinned' if tenant == r.pin else 'skewed']:.1f} ms"
                          f"  failed open {p['counters'].get('failure_mode_allowed', 0)}"
                          f"  {kept}", flush=True)
            entry["runs"].append({"config": cfg, "phases": phases, "rows": rows})
    return results


# ------------------------------------------------------------------ table

def markdown(faults: dict | None) -> str:
    """The faults scenario's table: per case, configuration, phase and
    tracked tenant."""
    if not faults:
        return ""
    s = faults["settings"]
    lines = ["", "## Faults", "",
             f"Per-second limits: pinned tenant {s['limits_per_second']['pinned']}/s (on the "
             f"first Envoy only), {s['skewed_tenants']} skewed tenants "
             f"{s['limits_per_second']['skewed']}/s each (Zipf s={s['zipf_exponent']}, over "
             f"every Envoy; the busiest is shown); call timeout {s['timeout_ms']} ms; "
             f"{s['phase_s']} s a phase. Admitted per window: mean (max) over the phase's "
             "whole seconds; over / under: summed over them; failed open: the fleet's "
             "failure_mode_allowed in the phase; fallback: admitted / refused by the local "
             "fallback.", ""]
    for case in faults["cases"]:
        lines += [f"### {case['title']}", ""]
        if case["pending"]:
            lines += [f"Not run: {case['pending']}.", ""]
            continue
        lines += [f"Service: {case.get('service')}, Redis: {case['redis']}.", "",
                  "| config | phase | tenant | admitted / window (max) | limit | over | under "
                  "| p99 ms | failed open | fallback | promised | as promised |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
        for run in case["runs"]:
            by_phase = {p["phase"]: p for p in run["phases"]}
            for row in run["rows"]:
                p = by_phase[row["phase"]]
                w = row["windows"] or [{"admitted": 0, "over": 0, "under": 0}]
                mean = sum(x["admitted"] for x in w) / len(w)
                c = p["counters"]
                role = "pinned" if row["tenant"] == "pinned" else "skewed"
                lines.append(
                    f"| {CONFIG_TITLES[run['config']]} | {row['phase']} ({p['envoys']} Envoys) "
                    f"| {row['tenant']} | {mean:.1f} ({max(x['admitted'] for x in w)}) "
                    f"| {row['limit']} | {sum(x['over'] for x in w)} "
                    f"| {sum(x['under'] for x in w)} | {p['p99_ms'][role]:.1f} "
                    f"| {c.get('failure_mode_allowed', 0)} "
                    f"| {c.get('fallback_allowed', 0)} / {c.get('fallback_over_limit', 0)} "
                    f"| {row['promised']} | {row['as_promised']} |")
        lines.append("")
    return "\n".join(lines) + "\n"

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
      with the counter as the service: 2 Envoys grown to 4 (each hears
      the fleet's size, 4), the service stopped, shrunk to 2, the service
      started again: the local fallback's share follows the fleet
  fleet-down-static
      with envoyproxy/ratelimit (no size answered): 2 Envoys, the service
      stopped, grown to 4, shrunk to 2, the service started again: the
      configured share, 1 / fallback.envoys
  regions
      a global limit over two regions (each a Redis, a counter and an
      Envoy, one rebalancer; docs/scaling.md, "Several regions"): the
      tenant's traffic at 90/10, moved to 10/90, then region b cut off
      from the rebalancer (its Redis behind a proxy that holds) while the
      traffic moves to 50/50, then b reachable again; the counter, exact
      mode only (RegionsRun)

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
import threading
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
    # The regions case: the tenant's requests to region a's Envoy and to
    # b's in each round.
    split: tuple[int, int] = (0, 0)


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
    # The configurations it runs for (of those chosen).
    configs: tuple[str, ...] = CONFIGS
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
    # With the counter, the fallback's share follows the fleet: each Envoy
    # 1/N of each limit, N the fleet's size it last heard (docs/failures.md,
    # "The fallback share follows the fleet"); the fleet grown while the
    # service answers, so that every Envoy heard 4 before the outage.
    Case("fleet-down", "The fleet grown from 2 Envoys to 4, then the service down and the "
         "fleet shrunk back (the counter: the share follows the fleet)",
         (Phase("2 Envoys"),
          Phase("growing to 4", during=("grow:4",)),
          Phase("4 Envoys, down", "failing", before=("hear:4", "service_down")),
          Phase("2 Envoys, down", "failing", before=("shrink:2",)),
          Phase("after", before=("service_up",))),
         promised={
             "*": "every request fails open, counted (at once once the breaker is open)",
             "local": "each Envoy 1 / N of each limit, N the fleet's size it last heard "
                      "(4): 4 Envoys the limit; shrunk to 2 during the outage, each still "
                      "1/4 (undershoot: an Envoy stopped within the interval still counts)",
         }, service="counter"),
    # envoyproxy/ratelimit answers no size: the configured share.
    Case("fleet-down-static", "The fleet grown from 2 Envoys to 4 and shrunk back, the "
         "service down (envoyproxy/ratelimit: the configured share)",
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
         }, service="envoy-ratelimit"),
    Case("regions", "A global limit over two regions: traffic moved from one region to the "
         "other, one region cut off from the rebalancer, then reachable again",
         (Phase("90/10", split=(9, 1)),
          Phase("moved to 10/90", split=(1, 9)),
          Phase("b cut off, 50/50", "failing", before=("cut",), split=(5, 5)),
          Phase("b reachable, 50/50", before=("mend",), split=(5, 5))),
         promised={
             "exact": "the regions together at most the limit in every window (no "
                      "overshoot, by construction); a moved demand's allocation within "
                      "ceil(3 x demand-ms / period) + 2 periods; undershoot at most the "
                      "moved demand's hits over those periods",
             "cut": "the cut-off region keeps its last allocation, the other keeps its "
                    "own (not given b's): each region within what it held, the total "
                    "within the limit; allocations unchanged",
             "mend": "rebalancing resumes with the next period: the allocations follow "
                     "the 50/50 demand within the same bound",
         }, service="counter", redis="regions", configs=("exact",)),
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

    def heard(self) -> list[int]:
        """The fleet's size each Envoy holds (its gauge; 0: none heard)."""
        return [e.filter_counters().get("fleet_envoys", 0) for e in self.fleet]

    def hear(self, n: int) -> None:
        """Requests through every Envoy (a new tenant each: a call each)
        until each holds `n` as the fleet's size (the counter's answers)."""
        def heard() -> bool:
            for e in self.fleet:
                h.send(e.url, h.unique("warm"))
            return self.heard() == [n] * len(self.fleet)

        h.wait_until(heard, f"{len(self.fleet)} Envoys hear a fleet of {n}", 60)

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
        elif name == "hear":
            self.hear(int(arg))
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
        heard = self.heard()
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
                "fleet_heard": heard,
                "start": t0, "end": t1, "statuses": statuses, "wrk_errors": errors,
                "requests": sum(r["requests"] for _, r in done), "p99_ms": p99,
                "counters": counted, "sent": sent}


# ------------------------------------------------------------------ regions

# The regions case: one tenant's global limit, per second (each second a
# window), the rebalancer's period and demand average (docs/scaling.md,
# "Several regions"), and the traffic: rounds of 10 requests split between
# the regions, one round every REGIONS_PACE_S (about 60 to 100 requests a
# second on this machine: over the limit, so that every window can fill).
REGIONS_LIMIT = 40
REGIONS_PERIOD_MS = 200
REGIONS_DEMAND_MS = 1_000
REGIONS_PACE_S = 0.05
# "a moved demand's allocation reaches (within a tenth) its new share
# within ceil(3 x demand-ms / period) + 2 periods"
REGIONS_FOLLOW_PERIODS = math.ceil(3 * REGIONS_DEMAND_MS / REGIONS_PERIOD_MS) + 2


class RegionsRun:
    """The regions case: two regions on loopback (harness/regions.py), one
    tenant, the phases' splits; per phase and window (second) what each
    region's Redis counted, read as the windows go (exact, the counter's
    own windows)."""

    def __init__(self, stack: h.Stack, case: Case, args, tag: str):
        from harness.regions import Regions

        self.case, self.args = case, args
        self.r = Regions(stack, REGIONS_LIMIT, "persecond", period_ms=REGIONS_PERIOD_MS,
                         demand_ms=REGIONS_DEMAND_MS, tenant=f"glob-{tag}")
        self.counts: dict[str, dict[int, int]] = {"a": {}, "b": {}}

    def close(self) -> None:
        self.r.close()

    def read_counts(self, sec: int) -> None:
        """Each region's count of the windows `sec` - 1 and `sec` (they only
        grow; the last read stands)."""
        for name, region in (("a", self.r.a), ("b", self.r.b)):
            for s in (sec - 1, sec):
                got = self.r.admitted(region, s * 1000)
                if got:
                    self.counts[name][s] = max(got, self.counts[name].get(s, 0))

    def phase(self, p: Phase) -> dict:
        r = self.r
        # The region whose allocation is to follow its share of this
        # phase's demand (held below 90% of it): the periods until it is
        # within a tenth of it are counted, from before the phase's actions
        # (b reachable again: from the moment it is); none while b is cut off.
        gainer, target = None, 0.0
        if p.state == "ok":
            for name, region in (("a", r.a), ("b", r.b)):
                want = 0.9 * REGIONS_LIMIT * p.split[0 if name == "a" else 1] / sum(p.split)
                if r.held(region) < want:
                    gainer, target = name, want
        p0 = r.periods()
        cut_at = None
        for a in p.before:
            if a == "cut":
                r.cut()
                cut_at = {"a": r.held(r.a), "b": r.held(r.b)}
            elif a == "mend":
                r.mend()
            else:
                raise h.HarnessError(f"unknown action {a!r}")
        secs = self.args.faults_phase_s
        sent: dict[str, dict[int, int]] = {"a": {}, "b": {}}
        statuses: dict[str, dict[int, int]] = {"a": {}, "b": {}}
        lock = threading.Lock()

        def record(region: str, t: float, status: int) -> None:
            with lock:
                sec = int(t)
                sent[region][sec] = sent[region].get(sec, 0) + 1
                statuses[region][status] = statuses[region].get(status, 0) + 1

        t0 = time.time()
        followed: list[int] = []
        # Long enough for the allocation to follow (twice the bound's time).
        follow_s = 2 * REGIONS_FOLLOW_PERIODS * REGIONS_PERIOD_MS / 1000

        def until() -> bool:
            now = time.time()
            self.read_counts(int(now))
            if gainer and not followed and r.held(getattr(r, gainer)) >= target:
                followed.append(r.periods() - p0)
            if now - t0 < secs:
                return False
            return not gainer or bool(followed) or now - t0 >= max(secs, follow_s)

        r.drive(p.split, until, p.name, deadline_s=max(secs, follow_s) + 5,
                pace_s=REGIONS_PACE_S, fail=False, record=record)
        t1 = time.time()
        # The last window's final counts.
        time.sleep(0.2)
        self.read_counts(int(t1))
        self.read_counts(int(t1) + 1)
        held = {"a": r.held(r.a), "b": r.held(r.b)}
        return {"phase": p.name, "state": p.state, "split": list(p.split), "start": t0,
                "end": t1, "sent": sent, "statuses": statuses, "held_at_cut": cut_at,
                "held": held, "periods": r.periods() - p0, "gainer": gainer,
                "follow_target": round(target, 1),
                "followed_in_periods": followed[0] if followed else None,
                "unreachable": {n: r.unreachable(n) for n in ("a", "b")}}

    def windows(self, phase: dict) -> list[dict]:
        """The phase's whole seconds: sent, admitted (each region's count),
        overshoot and undershoot of the total against the limit."""
        out = []
        for sec in range(math.ceil(phase["start"]), math.floor(phase["end"])):
            s = sum(phase["sent"][n].get(sec, 0) for n in ("a", "b"))
            a, b = self.counts["a"].get(sec, 0), self.counts["b"].get(sec, 0)
            out.append({"second": sec, "sent": s, "admitted_a": a, "admitted_b": b,
                        "admitted": a + b, "over": max(0, a + b - REGIONS_LIMIT),
                        "under": max(0, min(s, REGIONS_LIMIT) - a - b)})
        return out

    def check(self, p: Phase, phase: dict, wins: list[dict]) -> tuple[str, str]:
        """(the promise for this phase, whether its figures keep it)."""
        ok = all(w["over"] == 0 for w in wins)
        text = self.case.promised["exact"]
        if "cut" in p.before:
            text = self.case.promised["cut"]
            cut = phase["held_at_cut"]
            ok = ok and phase["held"] == cut and all(
                w["admitted_a"] <= cut["a"] and w["admitted_b"] <= cut["b"] for w in wins)
            ok = ok and phase["unreachable"]["b"] == 1
        elif "mend" in p.before:
            text = self.case.promised["mend"]
            ok = ok and phase["unreachable"]["b"] == 0
        if phase["gainer"]:
            n = phase["followed_in_periods"]
            ok = ok and n is not None and n <= REGIONS_FOLLOW_PERIODS
            # The undershoot: at most the moved demand's hits (the gaining
            # region's, per period) over the periods the bound allows.
            g = phase["gainer"]
            per_period = (sum(phase["sent"][g].values()) / max(phase["end"] - phase["start"], 1)
                          * REGIONS_PERIOD_MS / 1000)
            ok = ok and sum(w["under"] for w in wins) <= per_period * REGIONS_FOLLOW_PERIODS
        return text, "yes" if ok else "NO"

    def rows(self, phases: list[dict]) -> list[dict]:
        out = []
        for p_def, p in zip(self.case.phases, phases):
            wins = self.windows(p)
            promise, kept = self.check(p_def, p, wins)
            out.append({"phase": p["phase"], "tenant": "global", "limit": REGIONS_LIMIT,
                        "windows": wins, "promised": promise, "as_promised": kept})
            w = wins or [{"admitted": 0, "over": 0, "under": 0}]
            print(f"  {self.case.name:<15} {'exact':<6} {p['phase']:<20} "
                  f"admitted/s {sum(x['admitted'] for x in w) / len(w):6.1f} of "
                  f"{REGIONS_LIMIT} (max {max(x['admitted'] for x in w)}) over "
                  f"{sum(x['over'] for x in w)} under {sum(x['under'] for x in w)}"
                  f"  held a {p['held']['a']} b {p['held']['b']}"
                  f"  followed in {p['followed_in_periods']} periods"
                  f" (bound {REGIONS_FOLLOW_PERIODS})  {kept}", flush=True)
        return out


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
        # Each Envoy 1 / N: N the fleet's size it heard (the counter), or
        # fallback.envoys (none heard; envoyproxy/ratelimit answers none).
        sizes = [n or case.envoys for n in phase.get("fleet_heard", [])] or [case.envoys]
        shares = sorted((math.ceil(limit / n) for n in sizes), reverse=True)
        cap = sum(shares[:serving])
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
    print(f"Faults: {', '.join(c.name for c in chosen)} x {', '.join(cfgs)} (regions: "
          f"exact only), {args.faults_phase_s} s a phase", flush=True)
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
        for cfg in [c for c in cfgs if c in case.configs]:
            tag = f"{case.name}-{cfg}-{int(time.time()) % 100000}"
            if case.redis == "regions":
                with h.Stack(out / "faults" / f"{case.name}-{cfg}", service=service) as stack:
                    rr = RegionsRun(stack, case, args, tag)
                    try:
                        phases = [rr.phase(p) for p in case.phases]
                    finally:
                        rr.close()
                entry["settings"] = {"limit_per_second": REGIONS_LIMIT,
                                     "period_ms": REGIONS_PERIOD_MS,
                                     "demand_ms": REGIONS_DEMAND_MS,
                                     "follow_bound_periods": REGIONS_FOLLOW_PERIODS}
                entry["runs"].append({"config": cfg, "phases": phases,
                                      "rows": rr.rows(phases)})
                continue
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
        if case["redis"] == "regions":
            lines += regions_markdown(case)
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


def regions_markdown(case: dict) -> list[str]:
    """The regions case's table: per phase, the two regions' total per
    window against the limit, the allocations, the periods a moved
    allocation took."""
    st = case.get("settings", {})
    lines = [f"Service: the counter, a Redis per region; one tenant, "
             f"{st.get('limit_per_second')} per second global; rebalancer --period-ms "
             f"{st.get('period_ms')} --demand-ms {st.get('demand_ms')} (bound: "
             f"{st.get('follow_bound_periods')} periods). Admitted: what each region's Redis "
             "counted in the window.", "",
             "| phase | split a/b | admitted / window, a + b (max) | limit | over | under "
             "| held a / b at the end | periods to follow | promised | as promised |",
             "|---|---|---:|---:|---:|---:|---|---:|---|---|"]
    for run in case["runs"]:
        by_phase = {p["phase"]: p for p in run["phases"]}
        for row in run["rows"]:
            p = by_phase[row["phase"]]
            w = row["windows"] or [{"admitted": 0, "admitted_a": 0, "admitted_b": 0,
                                    "over": 0, "under": 0}]
            n = len(w)
            lines.append(
                f"| {row['phase']} | {p['split'][0]}/{p['split'][1]} "
                f"| {sum(x['admitted'] for x in w) / n:.1f} = "
                f"{sum(x['admitted_a'] for x in w) / n:.1f} + "
                f"{sum(x['admitted_b'] for x in w) / n:.1f} "
                f"({max(x['admitted'] for x in w)}) | {row['limit']} "
                f"| {sum(x['over'] for x in w)} | {sum(x['under'] for x in w)} "
                f"| {p['held']['a']} / {p['held']['b']} "
                f"| {p['followed_in_periods'] if p['gainer'] else ''} "
                f"| {row['promised']} | {row['as_promised']} |")
    lines.append("")
    return lines

"""Scaled out: 3 Envoys, 2 rate-limit service replicas, a 3-master Redis
Cluster with a replica per master, and a per-second Redis (tests/cluster.py).

- "Exactly N" holds for tenants whose counters live on different masters.
- Per-second counters go to the per-second Redis, the others to the cluster.
- A master crashes mid-window and its replica takes over: no 5xx, every
  admission the service did not decide is counted as a failure, limiting
  resumes, and what was admitted beyond the quota is measured.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import requests

import cluster as cl
import expect
import harness
from harness import ensure_window_room, run_sequential, send, tally, unique

QUOTA = 100
RULE = {"perhour": QUOTA}
LIMITS = {"x-tenant-id": {"default": RULE}}
HOUR_ROOM_S = 180
# If set, the failover tests append what they measured (one JSON line each)
# to this file; the README quotes them.
FIGURES = Path(os.environ.get("TRL_CLUSTER_FIGURES", "")) if os.environ.get(
    "TRL_CLUSTER_FIGURES") else None


def test_exactly_100_per_tenant_across_3_envoys_2_services_and_3_masters(stack):
    fleet = cl.scaled_fleet(stack, LIMITS, envoys=3, services_n=2,
                            timeout_ms=harness.COUNTING_TIMEOUT_MS)
    ensure_window_room(3600, HOUR_ROOM_S)
    tenants = cl.tenants_on_distinct_masters(fleet.cluster, fleet.domain, "hour", "spread")
    keys = {t: harness.redis_key(fleet.domain, "hour", t) for t in tenants}
    homes = {t: fleet.cluster.master_of(keys[t]) for t in tenants}
    assert len({n.port for n in homes.values()}) == 3, "the tenants share a master"

    # 400 requests per tenant, the tenants interleaved, over the 3 Envoys, 30 at a time.
    plan = [(tenants[i % 3], i % len(fleet.urls)) for i in range(1200)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=30) as pool:
        futures = [pool.submit(send, fleet.urls[e], t, None, 10.0, e) for t, e in plan]
        results = [f.result() for f in futures]
    by_tenant: dict[str, list[harness.Result]] = {t: [] for t in tenants}
    for (t, _), r in zip(plan, results):
        by_tenant[t].append(r)

    for t in tenants:
        rs = by_tenant[t]
        assert tally(rs) == Counter({200: QUOTA, 429: 400 - QUOTA}), (t, harness.summary(rs))
        # Every remaining value 99 … 0 was handed out once: one counter, shared.
        assert sorted(harness.parse_ratelimit_headers(r.headers).remaining
                      for r in rs if r.status == 200) == list(range(QUOTA))
        for r in rs:
            if r.status == 200:
                expect.admitted(r, RULE, tightest_window=3600)
            else:
                expect.limited(r, RULE, tightest_window=3600)

    # Each counter lives on its own master, and only there.
    calls = sum(fleet.service_calls())
    counted = 0
    for t in tenants:
        home = homes[t]
        value = int(home.command("GET", keys[t]))
        assert value >= QUOTA + 1, (t, value)  # the 101st call was counted too
        counted += value
        for other in fleet.cluster.masters():
            if other is not home:
                assert keys[t] not in other.command("KEYS", f"{fleet.domain}_*")
    # One INCRBY per descriptor sent (a batched call carries one per request
    # in it, each with its own hits_addend of 1): the cluster counted every
    # descriptor once, and no call carried more than the Envoys sent.
    c = fleet.counters()
    assert counted == c["rls_descriptors"], (counted, c["rls_descriptors"], calls)
    assert calls <= counted, (calls, counted)
    # Both service replicas took calls, and none failed.
    assert all(n > 0 for n in fleet.service_calls()), fleet.service_calls()
    assert c["allowed"] == 3 * QUOTA, c
    assert c["failure_mode_allowed"] == 0 and c["rls_error"] == 0, c


PS_RULE = {"persecond": 5, "perminute": 20}
PS_LIMITS = {"x-tenant-id": {"default": PS_RULE}}
BURST = 12


def test_per_second_counted_in_the_per_second_redis_and_minute_in_the_cluster(stack):
    fleet = cl.scaled_fleet(stack, PS_LIMITS, envoys=3, services_n=2, persecond=True,
                            timeout_ms=harness.COUNTING_TIMEOUT_MS)
    assert fleet.persecond is not None
    ensure_window_room(60, 10)  # up to 5 one-second bursts, in one minute window
    minute = harness.window_start(60)

    tenants = []

    def burst() -> list[harness.Result]:
        tenants.append(unique("split"))  # fresh counters for every attempt
        return run_sequential(fleet.urls, BURST, tenant=tenants[-1])

    # A burst that straddles a second boundary is redone with a new tenant.
    results = harness.in_one_second(burst, what=f"burst of {BURST}")
    tenant, t0 = tenants[-1], results[0].started
    assert harness.window_start(60) == minute, "the run left its minute window"

    statuses = [r.status for r in results]
    assert statuses == [200] * 5 + [429] * (BURST - 5), statuses
    for r in results[5:]:
        h = expect.limited(r, PS_RULE, tightest_window=1)
        assert h.limit == 5

    calls = sum(fleet.service_calls())
    minute_key = harness.redis_key(fleet.domain, "minute", tenant, t0)
    # The minute counter is in the cluster, and only there; the per-second
    # Redis holds no minute counter, the cluster no per-second one. (A
    # per-second key expires a second after its last call, so the counts
    # below come from the commands each side ran.)
    assert fleet.cluster.keys(f"{fleet.domain}_*{tenant}*") == [minute_key]
    assert not [k for k in fleet.persecond.keys(f"{fleet.domain}_*") if "_per_second_" not in k]
    assert not [k for k in fleet.cluster.keys(f"{fleet.domain}_*") if "_per_second_" in k]
    per_minute = fleet.cluster.get_int(minute_key)
    assert per_minute is not None and per_minute >= 6  # 5 admitted, then the refusal
    # Every call counted its per-second descriptor in the per-second Redis
    # and its minute descriptor in the cluster: one INCRBY each, per call.
    assert cl.commandstats(fleet.persecond).get("incrby") == calls
    assert fleet.cluster.commandstats().get("incrby") == calls


FAILOVER_QUOTA = 200
FAILOVER_LIMITS = {"x-tenant-id": {"default": {"perhour": FAILOVER_QUOTA}}}
PACE_PER_S = 50  # requests per second, kept up through the failover
LOAD_DEADLINE_S = 120.0
MAX_IN_FLIGHT = 100  # a request stuck until the 1 s timeout does not slow the pace


class PacedLoad:
    """One tenant's requests at a fixed pace, round robin over the Envoys,
    from a thread pool (open loop: a slow answer does not delay the next
    request), until stopped or LOAD_DEADLINE_S: bounded in count and time."""

    def __init__(self, urls: list[str], tenant: str, rate: float):
        self.urls, self.tenant, self.rate = urls, tenant, rate
        self.results: list[harness.Result] = []
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _one(self, i: int) -> None:
        r = send(self.urls[i % len(self.urls)], self.tenant, target=i % len(self.urls))
        with self._lock:
            self.results.append(r)

    def _run(self) -> None:
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT) as pool:
            for i in range(int(LOAD_DEADLINE_S * self.rate)):
                delay = t0 + i / self.rate - time.monotonic()
                if delay > 0 and self.stop.wait(delay):  # pacing, not a readiness wait
                    break
                if self.stop.is_set():
                    break
                pool.submit(self._one, i)

    def snapshot(self) -> list[harness.Result]:
        with self._lock:
            return list(self.results)

    def admitted(self) -> int:
        return sum(1 for r in self.snapshot() if r.status == 200)


def refused_tail(results: list[harness.Result], since: float) -> list[harness.Result]:
    """The requests sent after `since` from which on (in sending order) every one was refused."""
    tail: list[harness.Result] = []
    for r in sorted(results, key=lambda r: r.started):
        if r.started <= since or r.status != 429:
            tail = []
        else:
            tail.append(r)
    return tail


LAG = 50  # increments the lagging replica misses


@pytest.mark.parametrize("replica_lags", [False, True], ids=["replica-in-sync", "replica-lags"])
def test_a_master_crashes_mid_window_and_its_replica_takes_over(stack, replica_lags):
    """replica-lags: the replica is cut off (frozen, its link closed) while
    the master counts about LAG more admissions, as a replica behind by
    asynchronous replication; the master then crashes and the replica,
    thawed, is promoted without them."""
    fleet = cl.scaled_fleet(stack, FAILOVER_LIMITS, envoys=3, services_n=2,
                            timeout_ms=harness.COUNTING_TIMEOUT_MS)
    ensure_window_room(3600, HOUR_ROOM_S)
    tenant = unique("failover")
    key = harness.redis_key(fleet.domain, "hour", tenant)
    master = fleet.cluster.master_of(key)
    (replica,) = fleet.cluster.replicas_of(master)
    crash_at = FAILOVER_QUOTA // 2

    load = PacedLoad(fleet.urls, tenant, PACE_PER_S)
    load.thread.start()
    try:
        if replica_lags:
            harness.wait_until(lambda: load.admitted() >= crash_at - LAG,
                               "the replica's share admitted", 30)
            # Cut the replica off: frozen, it cannot reconnect, and what the
            # master counts from now on reaches no replica.
            replica.process.freeze()
            master.command("CLIENT", "KILL", "TYPE", "replica")
            at_cut = int(master.command("GET", key))
        # Half the quota admitted, then the master holding the counter crashes.
        harness.wait_until(lambda: load.admitted() >= crash_at, "half the quota admitted", 30)
        missed = int(master.command("GET", key)) - at_cut if replica_lags else 0
        killed_at = time.time()
        fleet.cluster.kill(master)
        if replica_lags:
            replica.process.thaw()
        promoted_at = fleet.cluster.wait_failover(master, replica)
        # Limiting resumes: from some request on, sent after the promotion,
        # every request is refused, for at least a second of traffic (each
        # service replica finds the new master on its own; each Envoy then
        # remembers the refusal).
        # Two seconds of them are awaited, one asserted below: a request
        # still in flight when the wait ends may yet fail open (after the
        # 1 s timeout) and cut the run short.
        harness.wait_until(
            lambda: len(refused_tail(load.snapshot(), promoted_at)) >= 2 * PACE_PER_S,
            "two seconds of refusals after the promotion", LOAD_DEADLINE_S - 20)
    finally:
        load.stop.set()
        load.thread.join(timeout=30)

    results = load.snapshot()  # every request answered: the pool has drained
    statuses = tally(results)
    # No 5xx, no request left without an answer: failures fail open.
    assert set(statuses) <= {200, 429}, harness.summary(results)
    tail = refused_tail(results, promoted_at)
    assert len(tail) >= PACE_PER_S, harness.summary(results)
    resumed_at = tail[0].started

    c = fleet.counters()
    admitted = statuses[200]
    # Every admission is either the service's OK or a failure let through and counted.
    assert c["allowed"] + c["failure_mode_allowed"] == admitted, (c, statuses)
    # Each failed call, or none once the breaker opened.
    assert c["failure_mode_allowed"] == c["rls_error"] + c["breaker_skipped"], c
    assert c["rls_error"] > 0, c
    # The counter now lives on the promoted replica, and reached the quota there.
    assert fleet.cluster.master_of(key) is replica
    final = fleet.cluster.get_int(key)
    assert final is not None and final >= FAILOVER_QUOTA, final
    # What the replica missed: calls the service answered minus what the
    # counter holds (each call is one INCRBY; a failed call may or may not
    # have reached the old master).
    answered = c["allowed"] + c["over_limit"]
    figures = {
        "quota": FAILOVER_QUOTA,
        "pace_per_s": PACE_PER_S,
        "requests": len(results),
        "admitted": admitted,
        "admitted_beyond_quota": admitted - FAILOVER_QUOTA,
        "failed_open": c["failure_mode_allowed"],
        "service_admitted_beyond_quota": c["allowed"] - FAILOVER_QUOTA,
        "answered_calls": answered,
        "final_counter": final,
        "increments_lost": answered - final,
        "promotion_s": round(promoted_at - killed_at, 2),
        "limiting_resumed_s": round(resumed_at - killed_at, 2),
        "last_admitted_s": round(max(r.started for r in results if r.status == 200)
                                 - killed_at, 2),
        "filter_counters": dict(c),
        # Calls the service replicas still hold, waiting forever for a
        # connection to the dead master (radix v4 waits on a pool that was
        # closed under it, with no deadline; see the README).
        "service_calls_stuck": [stuck_calls(s) for s in fleet.services],
    }
    print(f"failover figures ({'replica lags' if replica_lags else 'replica in sync'}): "
          + json.dumps(figures))
    if FIGURES is not None:
        with FIGURES.open("a") as f:
            f.write(json.dumps(dict(figures, replica_lags=replica_lags)) + "\n")
    # The service admitted beyond the quota exactly what the replica missed.
    assert c["allowed"] - FAILOVER_QUOTA == answered - final, figures
    if replica_lags:
        # It missed at least the increments counted while it was frozen.
        assert answered - final >= missed > 0, (missed, figures)
    # Those stuck calls keep a graceful stop (SIGTERM) waiting: stop the
    # replicas with a short deadline (then SIGKILL) rather than 10 s each.
    for s in fleet.services:
        s.process.stop(deadline_s=2.0)


def stuck_calls(service: harness.RateLimitService) -> int:
    """ShouldRateLimit calls waiting in radix's pool.useSharedConn (the
    service's Go goroutine profile, from its debug port)."""
    text = requests.get(f"{service.debug_url}/debug/pprof/goroutine?debug=1", timeout=5).text
    total = 0
    for block in text.split("\n\n"):
        head = block.split(" @ ", 1)[0].strip()
        if "useSharedConn" in block and "ShouldRateLimit" in block and head.isdigit():
            total += int(head)
    return total


def test_bench_service_side_smoke(tmp_path):
    """`make bench`'s service-side scenario, run tiny (one 1-second run per
    configuration) so that it cannot rot: every configuration took calls and
    admitted everything; no figure is asserted."""
    proc = subprocess.run(
        [sys.executable, str(harness.REPO / "bench" / "bench.py"), "--smoke",
         "--service-side", "only", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads((tmp_path / "latest" / "results.json").read_text())
    runs = {r["config"]: r for r in results["service_side"]["runs"]}
    services = {"svc1_single", "svc2_single", "svc1_cluster", "svc2_cluster"}
    counters = {"cnt1_single", "cnt2_single", "cnt1_cluster", "cnt2_cluster", "cnt1_memory"}
    # The same single-Redis topologies over TLS (gRPC and Redis, mutual).
    over_tls = {"svc1_single_tls", "cnt1_single_tls"}
    assert set(runs) == services | counters | over_tls
    for cfg, run in runs.items():
        assert run["requests"] > 0 and set(run["statuses"]) == {"200"}, (cfg, run)
    for cfg in services:
        run = runs[cfg]
        assert run["rls_calls"] >= run["requests"], (cfg, run)
        # bench/limits.json's default group has 3 units: INCRBY + EXPIRE each.
        assert run["redis_commands"].get("incrby", 0) == 3 * run["rls_calls"], (cfg, run)
    for cfg in over_tls:
        run = runs[cfg]
        assert run["rls_errors"] == 0 and run["rls_calls"] >= run["requests"], (cfg, run)
    for cfg in ("cnt1_single", "cnt2_single"):
        # The counter: one script call (EVALSHA) per call on one Redis, and
        # one more for a call that found the script not yet loaded (NOSCRIPT).
        run = runs[cfg]
        assert run["rls_errors"] == 0 and run["rls_calls"] >= run["requests"], (cfg, run)
        cmds = run["redis_commands"]
        assert (run["rls_calls"] <= cmds.get("evalsha", 0)
                <= run["rls_calls"] + cmds.get("script|load", 0)), (cfg, run)
    # The memory store sends Redis nothing.
    assert not runs["cnt1_memory"]["redis_commands"].get("evalsha"), runs["cnt1_memory"]
    table = (tmp_path / "latest" / "table.md").read_text()
    assert "| 2 services, Redis Cluster |" in table
    assert "| 1 counter, one Redis | " in table

"""A group's mode changed live, by ECDS, under traffic: the quota holds in
every window, through each ordered pair of (exact, lease, sync).

One Envoy (2 workers) per pair, its filter configuration served by ECDS
(tests/ecds.py); one ratelimit service and one Redis for all; one tenant
per pair, sending about 12 requests per second from 2 clients against a
quota of 60 per minute. The six pairs run at once, so the whole run takes
one to two minutes:

1. traffic starts in mode A, with at least 30 s left in the minute;
2. after 20 answers (a third of the quota), the configuration with mode B is
   pushed, and the test waits until Envoy has applied it;
3. traffic goes on into the next minute until 1.5 quotas were sent there,
   so that window runs in mode B alone, from its start.

Admissions are counted per clock-aligned window by when each request was
sent and answered: a 200 counts in a window only if both fall inside it,
so the few requests under way at a boundary are left out of both windows
(the decision, by the filter or the service, is made in between), and an
admission is never counted in a window it may not belong to.

The bound of a window, for one Envoy (README "Choosing a mode"):
- exact and lease: the quota (lease may admit fewer, never more);
- sync alone: the quota too (2 x (E - 1) x max_unsynced is 0 for E = 1: the
  one Envoy's view plus its own pending hits is the whole count, whatever
  its workers; tests/test_modes.py shows a pinned tenant getting exactly
  the quota);
- a window in which the group changed to or from sync: the quota plus
  `max_unsynced`. Entering sync, the view has not yet seen the hits of the
  other mode: until the first push or asking request is answered at most
  `max_unsynced` hits are admitted against it, and then the view holds
  them all. Leaving sync, up to `max_unsynced` admitted hits may not have
  been pushed yet, and the new mode's service does not count them. This is
  the bound of one more Envoy with a stale view, once.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

import pytest

import harness
from ecds import EcdsEnvoy
from faults import Traffic, delta
from harness import Result, ensure_window_room, unique, window_start

QUOTA = 60
LIMITS = {"x-tenant-id": {"default": {"perminute": QUOTA}}}
MAX_UNSYNCED = 5
MAX_BATCH = 10
SYNC_INTERVAL_MS = 100
MODES = ("exact", "lease", "sync")
PAIRS = [(a, b) for a in MODES for b in MODES if a != b]
CLIENTS = 2
PACE_S = 0.15
# Answers in mode A before the switch: well under the quota, so the tenant
# is not yet refused (nor in the over-limit cache) when its mode changes.
BEFORE_SWITCH = 20
# Answers after the switch before the counters are read again: requests
# that started under the old configuration are done by then.
AFTER_SWITCH = 10
# Requests sent in the next window, all in mode B: more than the quota.
NEXT_WINDOW = QUOTA * 3 // 2
# Room in the first window for mode A, the switch and some traffic in mode B.
SWITCH_ROOM_S = 30
UNIT_S = 60


def plugin_local(mode: str) -> dict:
    return {"enabled": True, "mode": mode, "lease": {"max_batch": MAX_BATCH},
            "sync": {"interval_ms": SYNC_INTERVAL_MS, "max_unsynced": MAX_UNSYNCED}}


@dataclasses.dataclass
class PairRun:
    before: str
    after: str
    envoy: EcdsEnvoy
    tenant: str
    traffic: Traffic
    results: list[Result] = dataclasses.field(default_factory=list)
    pushed_at: float = 0.0
    applied_at: float = 0.0
    # The filter's counters: before the switch, once the switch is done, at the end.
    at_switch: Counter = dataclasses.field(default_factory=Counter)
    switched: Counter = dataclasses.field(default_factory=Counter)
    end: Counter = dataclasses.field(default_factory=Counter)
    ecds: dict = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.before}->{self.after}"


def admitted_in(results: list[Result], w: int) -> int:
    """200s surely decided in the window starting at `w` (sent and answered in it)."""
    return sum(1 for r in results if r.status == 200
               and w <= r.started and r.started + r.latency_s < w + UNIT_S)


def modes_in(run: PairRun, w: int) -> set[str]:
    """The modes the group may have been in during the window starting at `w`."""
    modes = set()
    if w <= window_start(UNIT_S, run.applied_at):
        modes.add(run.before)
    if w + UNIT_S > run.pushed_at:
        modes.add(run.after)
    return modes


def bound(modes: set[str]) -> int:
    return QUOTA + MAX_UNSYNCED if "sync" in modes and len(modes) > 1 else QUOTA


def group(c: Counter, name: str) -> int:
    return c.get(f"group.default.{name}", 0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every pair's run, all at once on one stack (the stack lives as long as the module)."""
    stack = harness.Stack(tmp_path_factory.mktemp("mode-switch"))
    try:
        yield stack, _run_pairs(stack)
    finally:
        stack.close()


def _run_pairs(stack: harness.Stack) -> dict[tuple[str, str], PairRun]:
    gen = stack.generate(LIMITS)
    rls = stack.ratelimit(stack.redis(), gen)
    upstream = stack.upstream()

    def config(mode: str) -> dict:
        return gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS, local=plugin_local(mode))

    envoys = {(a, b): EcdsEnvoy(stack, config(a), rls, upstream, name=f"envoy-{a}-{b}")
              for a, b in PAIRS}
    for e in envoys.values():
        e.wait_stat("update_success", 1, f"{e.name} applies its first configuration")

    ensure_window_room(UNIT_S, SWITCH_ROOM_S)
    runs: dict[tuple[str, str], PairRun] = {}
    try:
        for (a, b), e in envoys.items():
            tenant = unique(f"{a}-{b}")
            traffic = Traffic(lambda e=e: [e.url], lambda i, t=tenant: t, clients=CLIENTS,
                              pace_s=PACE_S)
            runs[(a, b)] = PairRun(a, b, e, tenant, traffic)
        for run in runs.values():
            run.traffic.wait_for(lambda r: True, BEFORE_SWITCH, f"{run.name}: answers in mode A")
        for run in runs.values():
            run.at_switch = Counter(run.envoy.filter_counters())
            run.pushed_at = time.time()
            run.envoy.push(config(run.after))
        for run in runs.values():
            run.envoy.wait_stat("update_success", 2, f"{run.name}: Envoy applies mode B")
            run.applied_at = time.time()
            run.traffic.wait_for(lambda r, t=run.applied_at: r.started > t, AFTER_SWITCH,
                                 f"{run.name}: answers after the switch")
            run.switched = Counter(run.envoy.filter_counters())
        next_window = window_start(UNIT_S, min(r.pushed_at for r in runs.values())) + UNIT_S
        for run in runs.values():
            run.traffic.wait_for(lambda r: r.started >= next_window, NEXT_WINDOW,
                                 f"{run.name}: {NEXT_WINDOW} requests in the next window",
                                 deadline_s=UNIT_S + SWITCH_ROOM_S + 60)
    finally:
        for run in runs.values():
            run.results = run.traffic.stop()
    for run in runs.values():
        run.end = Counter(run.envoy.filter_counters())
        run.ecds = run.envoy.ecds_stats()
    return runs


def describe(run: PairRun) -> str:
    lines = [f"{run.name}: statuses {dict(harness.tally(run.results))}, switch pushed at "
             f"{run.pushed_at:.1f}, applied at {run.applied_at:.1f}"]
    for w in sorted({window_start(UNIT_S, r.started) for r in run.results}):
        modes = modes_in(run, w)
        lines.append(f"  window {time.strftime('%H:%M:%S', time.gmtime(w))}: "
                     f"{admitted_in(run.results, w)} admitted, bound {bound(modes)} "
                     f"(modes {sorted(modes)})")
    changed = {k: v for k, v in delta(run.end, run.at_switch).items() if v}
    lines.append(f"  counters during and after the switch: {dict(sorted(changed.items()))}")
    return "\n".join(lines)


@pytest.mark.parametrize("before,after", PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_the_quota_holds_in_every_window_across_a_live_mode_change(runs, request, before, after):
    stack, by_pair = runs
    request.node._trl_stack = stack
    run = by_pair[(before, after)]
    report = describe(run)
    print(f"\n{report}")

    # Every request answered, with a 200 or a 429: a 5xx or a lost request fails.
    assert all(r.status in (200, 429) for r in run.results), report
    # The service answered every call: no 200 is a fail-open.
    assert run.end.get("failure_mode_allowed", 0) == 0, report
    assert run.end.get("rls_error", 0) == 0, report
    assert run.ecds.get("update_success", 0) >= 2, run.ecds
    assert run.ecds.get("config_fail", 0) == 0 and run.ecds.get("update_rejected", 0) == 0, run.ecds

    # Each mode really ran: A before the switch, B after it.
    _ran(before, run.at_switch, report)
    _ran(after, delta(run.end, run.switched), report)

    windows = sorted({window_start(UNIT_S, r.started) for r in run.results})
    assert len(windows) == 2, report
    for w in windows:
        admitted, limit = admitted_in(run.results, w), bound(modes_in(run, w))
        assert admitted <= limit, (
            f"{run.name}: {admitted} admitted in the window starting "
            f"{time.strftime('%H:%M:%S', time.gmtime(w))}, over its bound {limit}\n{report}")
    # The next window, all in mode B, still gives the tenant its quota
    # (lease's undershoot, here at most (10 - 1) + 1.5 x 10, included).
    assert admitted_in(run.results, windows[-1]) >= QUOTA // 2, report


def _ran(mode: str, counted: Counter, report: str) -> None:
    if mode == "lease":
        assert group(counted, "lease.taken") > 0 and group(counted, "lease.spent") > 0, report
    elif mode == "sync":
        assert group(counted, "sync.local") > 0, report
    else:
        assert counted.get("allowed", 0) > 0, report
        assert group(counted, "lease.spent") == 0 and group(counted, "sync.local") == 0, report

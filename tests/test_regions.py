"""Global limits across regions (`"regions": "global"`): two regions on
loopback, each a Redis, a ratelimit-counter (`--region NAME --regions 2`)
and a filter Envoy, and one `ratelimit-counter rebalance` over both Redis.

Each region admits against its allocation, counted exactly in its own
Redis; the rebalancer moves the allocations toward the regions' shares of
the demand. The counters and the rebalancer share one test clock (moved to
the start of a fresh minute window for each phase), so that every phase
stays in one window. Figures are printed (`-s`): the total admitted per
window against the limit, the undershoot, the periods an allocation took
to follow its demand."""

from __future__ import annotations

import concurrent.futures
import math
import os
import time
from collections import Counter as Tally

import requests

import harness
from counter import Counter
from delayproxy import DelayProxy
from harness import LOOPBACK, free_port, send, unique, wait_until

LIMIT = 600
PERIOD_MS = 200
DEMAND_MS = 1_000
# docs/scaling.md, "Several regions": a region whose demand moved reaches
# (within a tenth) its new share in at most ceil(3 × demand_ms / period) + 2
# periods.
FOLLOW_PERIODS = math.ceil(3 * DEMAND_MS / PERIOD_MS) + 2
# A phase's traffic: rounds of 10 requests split between the regions, one
# round every PACE_S (about 100 requests a second).
PACE_S = 0.1


class Region:
    def __init__(self, stack, name: str, gen, limits: dict, cfg: dict, upstream):
        self.name = name
        self.redis = stack.redis()
        self.counter = Counter(stack, {gen.domain: limits}, store=self.redis.url,
                               name=f"counter-{name}",
                               extra_args=["--region", name, "--regions", "2"])
        self.envoy = stack.envoy(cfg, self.counter, upstream, name=f"envoy-{name}")


class Regions:
    """Two regions `a` and `b`, the rebalancer reaching b's Redis through
    a proxy (`cut`, `mend`)."""

    def __init__(self, stack):
        self.stack = stack
        self.tenant = unique("t")
        self.limits = {"x-tenant-id": {"default": {"perminute": LIMIT, "regions": "global"}}}
        gen = stack.generate(self.limits, service="counter")
        self.domain = gen.domain
        cfg = gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS, local={"enabled": False})
        upstream = stack.upstream()
        self.a = Region(stack, "a", gen, self.limits, cfg, upstream)
        self.b = Region(stack, "b", gen, self.limits, cfg, upstream)
        self.proxy = DelayProxy(target_port=self.b.redis.port)
        self.http_port = free_port()
        argv = [str(harness.COUNTER_BIN), "rebalance",
                "--region", f"a=redis://{LOOPBACK}:{self.a.redis.port}",
                "--region", f"b=redis://{LOOPBACK}:{self.proxy.port}",
                "--period-ms", str(PERIOD_MS), "--demand-ms", str(DEMAND_MS),
                "--store-timeout-ms", "150", "--clock-margin-ms", "1000",
                "--http-addr", f"{LOOPBACK}:{self.http_port}",
                "--limits", str(self.a.counter.dir)]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "TRL_COUNTER_TEST_CLOCK_FILE": str(self.a.counter.clock_file)}
        self.rebalancer = stack.spawn("rebalancer", argv, env=env)
        wait_until(lambda: requests.get(f"{self.url}/healthz", timeout=1).ok,
                   "rebalancer /healthz", process=self.rebalancer)
        self.start_ms = 0
        self.fresh_window()

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}"

    def close(self) -> None:
        self.proxy.close()

    # -- the clock and the keys
    def fresh_window(self) -> int:
        """Moves every clock to 1.5 s after the start of a minute window no
        phase used yet; returns the window's start (ms)."""
        real_ms = int(time.time() * 1000)
        start = max(self.start_ms + 60_000, (real_ms // 60_000 + 1) * 60_000)
        for r in (self.a, self.b):
            r.counter.set_clock(start + 1_500 - real_ms)
        self.start_ms = start
        return start

    def tag(self) -> str:
        return f"{{{len(self.domain)}:{self.domain}:{self.tenant}}}"

    def admitted(self, region: Region, start: int | None = None) -> int:
        """What `region`'s Redis counted in the window from `start`."""
        key = f"trl:{self.tag()}:per_minute:{start or self.start_ms}"
        return region.redis.get_int(key) or 0

    def total(self, start: int | None = None) -> int:
        return self.admitted(self.a, start) + self.admitted(self.b, start)

    def alloc(self, region: Region) -> int | None:
        """The allocation the rebalancer wrote in `region` (None: the floor)."""
        got = region.redis.command("HGET", f"trl:{self.tag()}:per_minute:regions", "alloc")
        return None if got is None else int(got)

    def held(self, region: Region) -> int:
        got = self.alloc(region)
        return LIMIT // 2 if got is None else got

    def metrics(self) -> dict[str, float]:
        return harness.parse_prometheus(requests.get(f"{self.url}/metrics", timeout=2).text)

    def periods(self) -> int:
        return int(self.metrics().get("trl_rebalance_periods_total", 0))

    # -- traffic
    def fill(self, split: tuple[int, int], what: str, deadline_s: float = 25) -> dict[str, Tally]:
        """Floods at `split` (no pause) until two rounds in a row are
        refused whole, in both regions; the statuses per region."""
        seen = {"a": Tally(), "b": Tally()}
        refused = [0]

        def full(round_seen: dict[str, Tally]) -> bool:
            for k in seen:
                seen[k].update(round_seen[k])
            whole = all(set(t) == {429} for t in round_seen.values())
            refused[0] = refused[0] + 1 if whole else 0
            return refused[0] >= 2

        self.drive(split, None, what, deadline_s, pace_s=None, each_round=full)
        return seen

    def drive(self, split: tuple[int, int], until, what: str, deadline_s: float = 20,
              pace_s: float | None = PACE_S, each_round=None) -> dict[str, Tally]:
        """Rounds of split[0] requests to a's Envoy and split[1] to b's
        until `until()` (or `each_round(that round's statuses)`) is true;
        the statuses per region. Fails past the deadline."""
        seen = {"a": Tally(), "b": Tally()}
        jobs = [self.a.envoy.url] * split[0] + [self.b.envoy.url] * split[1]
        end = time.monotonic() + deadline_s
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            while True:
                results = list(pool.map(lambda u: (u, send(u, self.tenant)), jobs))
                this_round = {"a": Tally(), "b": Tally()}
                for u, r in results:
                    this_round["a" if u == self.a.envoy.url else "b"][r.status] += 1
                for k in seen:
                    seen[k].update(this_round[k])
                if each_round(this_round) if each_round else until():
                    return seen
                assert time.monotonic() < end, f"{what}: not after {deadline_s} s: {seen}"
                if pace_s:
                    time.sleep(pace_s)


def test_regions_admit_at_most_the_limit_together_and_follow_the_demand(stack):
    r = Regions(stack)
    try:
        w1 = r.start_ms
        # 90/10: a's allocation follows its demand.
        first = r.drive((9, 1), lambda: r.held(r.a) >= 0.8 * LIMIT, "a's allocation at 80%")
        assert r.held(r.a) + r.held(r.b) <= LIMIT
        # Moved to 10/90 in the same window: b's allocation follows,
        # never taking what a admitted.
        p0 = r.periods()
        moved = r.drive((1, 9), lambda: r.held(r.b) >= 0.9 * (LIMIT - r.admitted(r.a)),
                        "b's allocation following its demand")
        periods = r.periods() - p0
        assert r.held(r.a) >= r.admitted(r.a) and r.held(r.b) >= r.admitted(r.b)
        assert r.held(r.a) + r.held(r.b) <= LIMIT
        assert periods <= FOLLOW_PERIODS, (periods, FOLLOW_PERIODS)
        total_w1 = r.total(w1)
        assert total_w1 <= LIMIT
        # The undershoot: refusals while the tenant's window was under its
        # limit (it never reached it here), at most the moved demand over
        # the periods the allocation took to follow (b's requests per period).
        refused_w1 = sum(t[429] for t in (first["a"], first["b"], moved["a"], moved["b"]))
        b_per_period = sum(moved["b"].values()) / max(periods, 1)
        assert refused_w1 <= b_per_period * FOLLOW_PERIODS, (refused_w1, b_per_period)

        # A fresh window flooded at 10/90: together never past the limit.
        w2 = r.fresh_window()
        flood = r.fill((2, 18), "the window flooded")
        total_w2 = r.total(w2)
        assert total_w2 <= LIMIT, total_w2
        admitted_w2 = flood["a"][200] + flood["b"][200]
        assert admitted_w2 == total_w2, (flood, total_w2)
        print(f"\nregions: limit {LIMIT}/min; window 1 (90/10 then 10/90, paced): admitted "
              f"{total_w1}, refused {refused_w1} (the undershoot: the window was never full); "
              f"b's allocation followed its demand in {periods} periods of {PERIOD_MS} ms "
              f"(bound {FOLLOW_PERIODS}); window 2 (10/90, flooded): admitted {total_w2} "
              f"= a {r.admitted(r.a, w2)} + b {r.admitted(r.b, w2)}, undershoot "
              f"{LIMIT - total_w2}")
    finally:
        r.close()


def test_a_region_cut_off_keeps_its_allocation_and_the_total_stays_within_the_limit(stack):
    r = Regions(stack)
    try:
        # 70/30: the allocations move (a above its floor).
        r.drive((7, 3), lambda: r.alloc(r.a) is not None and r.alloc(r.a) >= 0.6 * LIMIT,
                "a's allocation at 60%")
        # b's Redis cut off from the rebalancer (its counter still reaches it).
        r.proxy.hold()
        wait_until(lambda: r.metrics().get('trl_region_unreachable{region="b"}') == 1,
                   "the rebalancer sees b unreachable", deadline_s=10)
        last_a, last_b = r.held(r.a), r.held(r.b)
        assert last_a + last_b <= LIMIT
        # A fresh window, the demand moved to b, flooded: each region
        # admits within its last allocation; nothing moves.
        w2 = r.fresh_window()
        seen = r.fill((2, 18), "both regions full")
        assert r.admitted(r.a, w2) <= last_a and r.admitted(r.b, w2) <= last_b, seen
        assert r.total(w2) <= LIMIT
        assert (r.held(r.a), r.held(r.b)) == (last_a, last_b)
        print(f"\nregions cut off: b unreachable; window admitted a {r.admitted(r.a, w2)} "
              f"(held {last_a}) + b {r.admitted(r.b, w2)} (held {last_b}) = {r.total(w2)} "
              f"of {LIMIT}")
        # Reachable again: rebalancing resumes, b's allocation follows its demand.
        r.proxy.release()
        wait_until(lambda: r.metrics().get('trl_region_unreachable{region="b"}') == 0,
                   "the rebalancer reaches b again", deadline_s=10)
        w3 = r.fresh_window()
        r.drive((1, 9), lambda: r.held(r.b) >= 0.6 * LIMIT, "b's allocation after the cut")
        assert r.total(w3) <= LIMIT
        assert r.held(r.a) + r.held(r.b) <= LIMIT
    finally:
        r.close()

"""Two regions on loopback for global limits (`"regions": "global"`): each
a Redis, a ratelimit-counter (`--region NAME --regions 2`) and a filter
Envoy, and one `ratelimit-counter rebalance` over both Redis, reaching b's
through a proxy (`cut`, `mend`). Used by tests/test_regions.py and the
faults scenario's regions case (bench/faults.py).

Not imported by `harness` itself (it needs tests/counter.py and
tests/delayproxy.py): `from harness.regions import Regions`."""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections import Counter as Tally

import requests

from counter import Counter
from delayproxy import DelayProxy

from . import base
from .metrics import parse_prometheus
from .load import send
from .processes import free_port, wait_until
from .base import unique

# The unit a limit key names, by the team file's limit field.
UNITS = {"persecond": "per_second", "perminute": "per_minute", "perhour": "per_hour"}


class Region:
    def __init__(self, stack, name: str, gen, limits: dict, cfg: dict, upstream):
        self.name = name
        self.redis = stack.redis()
        self.counter = Counter(stack, {gen.domain: limits}, store=self.redis.url,
                               name=f"counter-{name}",
                               extra_args=["--region", name, "--regions", "2"])
        self.envoy = stack.envoy(cfg, self.counter, upstream, name=f"envoy-{name}")


class Regions:
    """Two regions `a` and `b` of one tenant's global limit (`limit` per
    `unit`, a team-file field), the rebalancer reaching b's Redis through
    a proxy (`cut`, `mend`). `upstream`: the Envoys' (a fresh one if None)."""

    def __init__(self, stack, limit: int, unit: str = "perminute", period_ms: int = 200,
                 demand_ms: int = 1_000, upstream=None, tenant: str | None = None):
        self.stack = stack
        self.limit, self.unit = limit, unit
        self.period_ms, self.demand_ms = period_ms, demand_ms
        self.tenant = tenant or unique("t")
        self.limits = {"x-tenant-id": {"default": {unit: limit, "regions": "global"}}}
        gen = stack.generate(self.limits, service="counter")
        self.domain = gen.domain
        cfg = gen.plugin_config(timeout_ms=base.COUNTING_TIMEOUT_MS, local={"enabled": False})
        upstream = upstream or stack.upstream()
        self.a = Region(stack, "a", gen, self.limits, cfg, upstream)
        self.b = Region(stack, "b", gen, self.limits, cfg, upstream)
        self.proxy = DelayProxy(target_port=self.b.redis.port)
        self.http_port = free_port()
        argv = [str(base.COUNTER_BIN), "rebalance",
                "--region", f"a=redis://{base.LOOPBACK}:{self.a.redis.port}",
                "--region", f"b=redis://{base.LOOPBACK}:{self.proxy.port}",
                "--period-ms", str(period_ms), "--demand-ms", str(demand_ms),
                "--store-timeout-ms", "150", "--clock-margin-ms", "1000",
                "--http-addr", f"{base.LOOPBACK}:{self.http_port}",
                "--limits", str(self.a.counter.dir)]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "TRL_COUNTER_TEST_CLOCK_FILE": str(self.a.counter.clock_file)}
        self.rebalancer = stack.spawn("rebalancer", argv, env=env)
        wait_until(lambda: requests.get(f"{self.url}/healthz", timeout=1).ok,
                   "rebalancer /healthz", process=self.rebalancer)
        self.start_ms = 0

    @property
    def url(self) -> str:
        return f"http://{base.LOOPBACK}:{self.http_port}"

    def close(self) -> None:
        self.proxy.close()

    # -- the clock and the keys
    def fresh_window(self) -> int:
        """Moves every clock to 1.5 s after the start of a minute window no
        phase used yet; returns the window's start (ms). Per-minute limits."""
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
        key = f"trl:{self.tag()}:{UNITS[self.unit]}:{start or self.start_ms}"
        return region.redis.get_int(key) or 0

    def total(self, start: int | None = None) -> int:
        return self.admitted(self.a, start) + self.admitted(self.b, start)

    def alloc(self, region: Region) -> int | None:
        """The allocation the rebalancer wrote in `region` (None: the floor)."""
        got = region.redis.command("HGET", f"trl:{self.tag()}:{UNITS[self.unit]}:regions",
                                   "alloc")
        return None if got is None else int(got)

    def held(self, region: Region) -> int:
        got = self.alloc(region)
        return self.limit // 2 if got is None else got

    def metrics(self) -> dict[str, float]:
        return parse_prometheus(requests.get(f"{self.url}/metrics", timeout=2).text)

    def periods(self) -> int:
        return int(self.metrics().get("trl_rebalance_periods_total", 0))

    def unreachable(self, region: str) -> float | None:
        return self.metrics().get(f'trl_region_unreachable{{region="{region}"}}')

    def cut(self) -> None:
        """b's Redis cut off from the rebalancer (its counter still reaches
        it); returns once the rebalancer says so."""
        self.proxy.hold()
        wait_until(lambda: self.unreachable("b") == 1, "the rebalancer sees b unreachable",
                   deadline_s=10)

    def mend(self) -> None:
        self.proxy.release()
        wait_until(lambda: self.unreachable("b") == 0, "the rebalancer reaches b again",
                   deadline_s=10)

    # -- traffic
    def fill(self, split: tuple[int, int], what: str, deadline_s: float = 25) -> dict[str, Tally]:
        """Floods at `split` (no pause) until two rounds in a row are
        refused whole, in both regions; the statuses per region."""
        refused = [0]

        def full(round_seen: dict[str, Tally]) -> bool:
            whole = all(set(t) == {429} for t in round_seen.values())
            refused[0] = refused[0] + 1 if whole else 0
            return refused[0] >= 2

        return self.drive(split, None, what, deadline_s, pace_s=None, each_round=full)

    def drive(self, split: tuple[int, int], until, what: str, deadline_s: float = 20,
              pace_s: float | None = 0.1, each_round=None, fail: bool = True,
              record=None) -> dict[str, Tally]:
        """Rounds of split[0] requests to a's Envoy and split[1] to b's
        until `until()` (or `each_round(that round's statuses)`) is true;
        the statuses per region. Past the deadline: fails (`fail`), or
        returns. `record(region, time sent, status)`: each request's."""
        seen = {"a": Tally(), "b": Tally()}
        jobs = [self.a.envoy.url] * split[0] + [self.b.envoy.url] * split[1]
        end = time.monotonic() + deadline_s

        def one(u: str):
            t = time.time()
            return u, t, send(u, self.tenant)

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            while True:
                results = list(pool.map(one, jobs))
                this_round = {"a": Tally(), "b": Tally()}
                for u, t, r in results:
                    region = "a" if u == self.a.envoy.url else "b"
                    this_round[region][r.status] += 1
                    if record:
                        record(region, t, r.status)
                for k in seen:
                    seen[k].update(this_round[k])
                if each_round(this_round) if each_round else until():
                    return seen
                if time.monotonic() >= end:
                    assert not fail, f"{what}: not after {deadline_s} s: {seen}"
                    return seen
                if pace_s:
                    time.sleep(pace_s)

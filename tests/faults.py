"""Helpers for the fault tests: traffic that keeps flowing while a test breaks
something, and the accounting every fault test asserts afterwards.

    traffic = Traffic(lambda: fleet.urls, tenant_of=fresh_tenants("t"), clients=2)
    ... break something, poll traffic.wait_for(...) ...
    results = traffic.stop()
    check_accounting(results, before, fleet.counters())

`check_accounting` is what "no 5xx, no request lost, every failure counted"
means here: every request got an HTTP answer (no connection error, no
client timeout), every answer is a 200 or a 429, and the filter's counters
account for each request exactly once, with each fail-open 200 (no
`x-ratelimit-limit`: the service never answered) counted in
`failure_mode_allowed` and in `rls_error` (a failed call) or
`breaker_skipped` (no call: the breaker was open).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from typing import Callable

import harness
from harness import HarnessError, Result

# One of these per request with a tenant: the filter's decision counters.
DECISIONS = ("allowed", "over_limit", "cached_over_limit", "local_over_limit",
             "failure_mode_allowed", "failure_mode_denied", "fallback_allowed",
             "fallback_over_limit")
# The service could not decide these: each either made a failed call
# (`rls_error`) or none, the breaker being open (`breaker_skipped`).
UNDECIDED = ("failure_mode_allowed", "failure_mode_denied", "fallback_allowed",
             "fallback_over_limit")


def fresh_tenants(prefix: str) -> Callable[[int], str]:
    """A new tenant for every request: each one is asked about (no cache, no bucket)."""
    base = harness.unique(prefix)
    return lambda i: f"{base}-{i}"


def failed_open(r: Result) -> bool:
    """A 200 the service did not answer: it carries no x-ratelimit-* headers."""
    return r.status == 200 and "x-ratelimit-limit" not in r.headers


def answered(r: Result) -> bool:
    """A response that carries the service's verdict."""
    return r.status in (200, 429) and "x-ratelimit-limit" in r.headers


def probe(url: str) -> bool:
    """One request for a fresh tenant: did the service's verdict come back
    (x-ratelimit-* headers)?"""
    return "x-ratelimit-limit" in harness.send(url, harness.unique("probe")).headers


def answered_by_service(fleet: harness.EnvoysView) -> bool:
    """One probe per Envoy, each answered by the service (stops at the first that is not)."""
    return all(probe(url) for url in fleet.urls)


def report(name: str, figures: dict) -> None:
    """A fault test's figures, printed (`-s`): what the docs quote, never asserted as timings."""
    print(f"\n{name}: {figures}")


class Traffic:
    """`clients` threads sending GETs back to back until `stop()`.

    Request i goes to `urls()[i % len(urls())]` (the list may grow while it
    runs) with tenant `tenant_of(i)`. `pace_s` spaces each client's requests
    (load shaping, not a wait for anything).
    """

    def __init__(self, urls: Callable[[], list[str]], tenant_of: Callable[[int], str],
                 clients: int = 2, pace_s: float = 0.0, timeout_s: float = 10.0):
        self._urls = urls
        self._tenant_of = tenant_of
        self._pace_s = pace_s
        self._timeout_s = timeout_s
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.results: list[Result] = []
        self._threads = [threading.Thread(target=self._run, daemon=True, name=f"traffic-{k}")
                         for k in range(clients)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            i = next(self._counter)
            urls = self._urls()
            target = i % len(urls)
            r = harness.send(urls[target], self._tenant_of(i), timeout=self._timeout_s,
                             target=target)
            with self._lock:
                self.results.append(r)
            if self._pace_s:
                self._stop.wait(self._pace_s)

    def snapshot(self) -> list[Result]:
        with self._lock:
            return list(self.results)

    def count(self, predicate: Callable[[Result], bool], since: int = 0) -> int:
        return sum(1 for r in self.snapshot()[since:] if predicate(r))

    def wait_for(self, predicate: Callable[[Result], bool], n: int, what: str,
                 since: int = 0, deadline_s: float = 60.0) -> None:
        """Poll until at least `n` results from index `since` on satisfy `predicate`."""
        harness.wait_until(lambda: self.count(predicate, since) >= n, what, deadline_s)

    def __len__(self) -> int:
        with self._lock:
            return len(self.results)

    def stop(self) -> list[Result]:
        self._stop.set()
        for t in self._threads:
            t.join(self._timeout_s + 5)
            if t.is_alive():
                raise HarnessError(f"{t.name} did not finish")
        return self.snapshot()


def delta(after: Counter, before: Counter) -> Counter:
    return Counter({k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)})


def check_accounting(results: list[Result], counted: Counter, others: int = 0) -> dict:
    """No 5xx, nothing lost, every decision counted once and every fail-open counted.

    `counted`: the fleet's filter counters over the run (after - before).
    `others`: requests sent through the same Envoys in that time outside
    `results` (probes), which the counters also include.
    Returns the figures, for the test's printout.
    """
    statuses = harness.tally(results)
    lost = [r for r in results if r.status == 0]
    assert not lost, f"{len(lost)} requests got no HTTP answer, e.g. {lost[0].error}"
    assert set(statuses) <= {200, 429}, f"statuses {dict(statuses)}: {harness.summary(results)}"
    opened = sum(1 for r in results if failed_open(r))
    decisions = sum(counted.get(k, 0) for k in DECISIONS)
    assert decisions == len(results) + others, (
        f"{len(results) + others} requests, but the counters add up to {decisions}: "
        f"{dict(counted)}")
    # Probes can fail open too: every fail-open of `results` is counted, and
    # nothing else fails open beyond the probes.
    assert opened <= counted["failure_mode_allowed"] <= opened + others, (opened, dict(counted))
    undecided = sum(counted.get(k, 0) for k in UNDECIDED)
    assert counted["rls_error"] + counted["breaker_skipped"] == undecided, dict(counted)
    assert counted["local_error"] == 0, dict(counted)
    return {"requests": len(results), "statuses": dict(statuses), "failed_open": opened,
            "counters": {k: v for k, v in counted.items() if v}}


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0

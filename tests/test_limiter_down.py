"""When the ratelimit service is down or hangs, requests pass (fail open) and
the failure counters rise; with failure_mode_deny they get status_on_error.
A hung service costs each request at most the configured gRPC timeout (the
breaker off: every request calls; tests/test_breaker.py has it on)."""

from __future__ import annotations

from collections import Counter

import harness
from faults import answered_by_service, delta
from harness import ensure_window_room, run_sequential, tally, unique, wait_until

LIMITS = {"x-tenant-id": {"default": {"perhour": 5}}}
# Long enough that the service, when up, always answers in time on a loaded
# machine (so "limiting works" is deterministic), short enough to measure.
TIMEOUT_MS = 200
NO_BREAKER = {"enabled": False}
LATENCY_BOUND_S = 2.0
# Envoy arms timers from its event loop's cached clock, read when the loop
# iteration began, so a 200 ms gRPC timeout was seen to complete a request
# 0.14 ms short of 200 ms measured by the client. Allow that much, no more.
TIMER_SLACK_S = 0.005
MIN_LATENCY_S = TIMEOUT_MS / 1000 - TIMER_SLACK_S


def assert_limiting_works(fleet: harness.Fleet) -> None:
    results = run_sequential(fleet.urls, 7, tenant=unique("tenant"))
    assert [r.status for r in results] == [200] * 5 + [429] * 2, harness.summary(results)


def run_while_frozen(fleet: harness.Fleet, n: int) -> list[harness.Result]:
    """n sequential requests while the service is SIGSTOPped (connections open, nobody answers)."""
    fleet.ratelimit.freeze()
    try:
        return run_sequential(fleet.urls, n, tenant=unique("tenant"))
    finally:
        fleet.ratelimit.thaw()


def test_stopped_service_fails_open_and_counts_it(stack):
    fleet = stack.fleet(LIMITS, envoys=2, timeout_ms=TIMEOUT_MS)
    ensure_window_room(3600, 90)
    assert_limiting_works(fleet)

    fleet.ratelimit.stop()
    before = fleet.counters()
    results = run_sequential(fleet.urls, 20, tenant=unique("tenant"))
    assert tally(results) == Counter({200: 20}), harness.summary(results)
    after = fleet.counters()
    d = delta(after, before)
    assert d["failure_mode_allowed"] == 20, after
    # Each made a failed call, or none once the breaker opened.
    calls = d["rls_error"]
    assert calls + d["breaker_skipped"] == 20, after
    assert d["breaker_opened"] >= 1, after
    assert d["allowed"] == 0, after
    assert d["failure_mode_denied"] == 0, after

    # Back up on the same port: Envoy reconnects and limiting resumes.
    fleet.ratelimit.start()
    wait_until(lambda: answered_by_service(fleet), "Envoys reach the restarted service")
    assert_limiting_works(fleet)


def test_frozen_service_costs_each_request_at_most_the_timeout(stack):
    fleet = stack.fleet(LIMITS, envoys=1, timeout_ms=TIMEOUT_MS, breaker=NO_BREAKER)
    ensure_window_room(3600, 90)
    assert_limiting_works(fleet)

    before = fleet.counters()
    results = run_while_frozen(fleet, 5)
    assert tally(results) == Counter({200: 5}), harness.summary(results)
    for r in results:
        assert MIN_LATENCY_S <= r.latency_s < LATENCY_BOUND_S, harness.summary(results)
    after = fleet.counters()
    d = delta(after, before)
    assert d["failure_mode_allowed"] == 5, after
    assert d["rls_error"] == 5, after

    wait_until(lambda: answered_by_service(fleet), "the thawed service answers again")
    assert_limiting_works(fleet)


def test_failure_mode_deny_replies_status_on_error(stack):
    fleet = stack.fleet(LIMITS, envoys=1, timeout_ms=TIMEOUT_MS,
                        failure_mode_deny=True, on_failure="deny", status_on_error=503,
                        breaker=NO_BREAKER)
    ensure_window_room(3600, 90)
    assert_limiting_works(fleet)

    # Hung service: the timeout, then status_on_error.
    before = fleet.counters()
    hung = run_while_frozen(fleet, 3)
    assert tally(hung) == Counter({503: 3}), harness.summary(hung)
    for r in hung:
        assert MIN_LATENCY_S <= r.latency_s < LATENCY_BOUND_S, harness.summary(hung)

    # Stopped service: refused connection, status_on_error.
    fleet.ratelimit.stop()
    down = run_sequential(fleet.urls, 10, tenant=unique("tenant"))
    assert tally(down) == Counter({503: 10}), harness.summary(down)

    after = fleet.counters()
    d = delta(after, before)
    assert d["failure_mode_denied"] == 13, after
    assert d["failure_mode_allowed"] == 0, after
    assert d["rls_error"] == 13, after

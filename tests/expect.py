"""Assertions shared by the tests: what every 429 and every admitted response must carry."""

from __future__ import annotations

import harness
from harness import RateLimitHeaders, Result, parse_ratelimit_headers

UNIT_WINDOW = {"persecond": 1, "perminute": 60, "perhour": 3600, "perday": 86400}


def windows_of(rule: dict) -> set[tuple[int, int]]:
    """The (limit, window seconds) pairs a team-JSON rule should produce in x-ratelimit-limit."""
    return {(v, UNIT_WINDOW[k]) for k, v in rule.items() if k in UNIT_WINDOW}


def describe(r: Result) -> str:
    return f"status {r.status} to envoy #{r.target} at {r.started:.3f}, headers {r.headers}"


def limited(r: Result, rule: dict, tightest_window: int | None = None) -> RateLimitHeaders:
    """A 429 from the filter, consistent with the service's OVER_LIMIT answer.

    retry-after is an integer >= 1 and at most the window; x-ratelimit-remaining
    is 0; the first number of x-ratelimit-limit is the limit of one of the
    rule's units, and each `<limit>;w=<secs>` is one of them.
    """
    assert r.status == 429, describe(r)
    assert r.headers.get("x-envoy-ratelimited") == "true", describe(r)
    h = _parse(r)
    expected = windows_of(rule)
    assert set(h.windows) <= expected and h.windows, (
        f"x-ratelimit-limit windows {h.windows} are not those of {rule}: {describe(r)}")
    assert set(h.windows) == expected, (
        f"x-ratelimit-limit should list every unit of {rule}: {describe(r)}")
    assert h.remaining == 0, describe(r)
    assert h.retry_after is not None, f"429 without retry-after: {describe(r)}"
    window = _tightest(h, r, tightest_window)
    assert 1 <= h.retry_after <= window, describe(r)
    assert h.reset <= window, describe(r)
    if tightest_window is not None:
        _reset_is_the_window_end(h, r, tightest_window)
    return h


def admitted(r: Result, rule: dict, tightest_window: int | None = None) -> RateLimitHeaders:
    """A 200 that went upstream, with the x-ratelimit-* headers and no retry-after."""
    assert r.status == 200, describe(r)
    assert "retry-after" not in r.headers, describe(r)
    assert "x-envoy-ratelimited" not in r.headers, describe(r)
    h = _parse(r)
    assert set(h.windows) == windows_of(rule), describe(r)
    window = _tightest(h, r, tightest_window)
    assert h.reset <= window, describe(r)
    assert h.remaining < h.limit, describe(r)
    if tightest_window is not None:
        _reset_is_the_window_end(h, r, tightest_window)
    return h


def _reset_is_the_window_end(h: RateLimitHeaders, r: Result, window: int) -> None:
    """The service answers durationUntilReset = window - now % window, from
    its clock in whole seconds, and windows are clock aligned; the over-limit
    cache reports ceil(window end - now), which is the same number. So reset
    is the time left in the window at one of the whole seconds between
    sending the request and reading its response: exactly, no tolerance."""
    first = window - int(r.started) % window
    last = window - int(r.started + r.latency_s) % window
    if last <= first:
        ok = last <= h.reset <= first
    else:  # the window ended while the request was under way
        ok = h.reset <= first or h.reset >= last
    assert ok, (
        f"x-ratelimit-reset {h.reset}, but {last}..{first}s were left in the {window}s "
        f"window while the request was under way: {describe(r)}")


def _parse(r: Result) -> RateLimitHeaders:
    try:
        h = parse_ratelimit_headers(r.headers)
    except ValueError as e:
        raise AssertionError(f"{e}: {describe(r)}") from None
    if harness.SERVICE == "counter":
        # The counter names each limit after its group (docs/counter.md).
        assert all(h.names), f"a window without the counter's name: {describe(r)}"
    else:
        # The generated ratelimit.yaml names no rule.
        assert not any(h.names), f"a named window: {describe(r)}"
    return h


def _tightest(h: RateLimitHeaders, r: Result, tightest_window: int | None) -> int:
    """The window of the descriptor the header names first (its limit is the first number)."""
    candidates = [w for (lim, w) in h.windows if lim == h.limit]
    assert candidates, f"first number {h.limit} is the limit of no listed window: {describe(r)}"
    if tightest_window is not None:
        assert tightest_window in candidates, (
            f"expected the w={tightest_window} window to be the tightest: {describe(r)}")
        return tightest_window
    return max(candidates)

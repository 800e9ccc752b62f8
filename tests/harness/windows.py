"""Clock-aligned windows: where one starts, waiting for room in one, and the
keys the services build for a window."""

from __future__ import annotations

import time
from typing import Callable

from .base import HarnessError
from .load import Result


UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def window_start(unit_s: int, t: float | None = None) -> int:
    """The ratelimit service's window start: floor(now / unit) * unit."""
    t = time.time() if t is None else t
    return int(t // unit_s) * unit_s


def window_left(unit_s: int, t: float | None = None) -> float:
    t = time.time() if t is None else t
    return unit_s - (t % unit_s)


def ensure_window_room(unit_s: int, need_s: float) -> float:
    """Wait out the current window if less than `need_s` of it remains.

    Returns how long it waited. Not a readiness check: windows are clock
    aligned, so this is the only way to keep a run inside one window.
    """
    if need_s >= unit_s:
        raise HarnessError(f"a {unit_s}s window can never have {need_s}s left")
    left = window_left(unit_s)
    if left >= need_s:
        return 0.0
    time.sleep(left + 0.02)
    return left + 0.02


def wait_next_second(margin_s: float = 0.01) -> None:
    """Sleep into the first hundredth of the next wall-clock second."""
    time.sleep(window_left(1) + margin_s)


def answered_at(r: "Result") -> float:
    """time.time() when the response had come back."""
    return r.started + r.latency_s


def seconds_crossed(first: "Result", last: "Result") -> int:
    """Whole-second boundaries between `first` being sent and `last` being answered.

    A server reads its clock somewhere inside each request's span, not when
    the client sent it, so whole-second readings (a reset, Retry-After, a
    Date) of two requests sent one after the other differ by 0 up to this
    many seconds: two requests sent in the same second can be told apart by
    one when the second one's answer came in the next.
    """
    return int(answered_at(last)) - int(first.started)


def in_one_second(burst: Callable[[], list["Result"]], attempts: int = 5,
                  what: str = "burst") -> list["Result"]:
    """`burst()` run from the start of a wall-clock second until one run was
    sent and answered inside that one second (a run that straddles a second
    boundary meets two per-second windows); its results. `burst` should use
    a fresh tenant each time: a failed attempt has counted."""
    for _ in range(attempts):
        wait_next_second()
        results = burst()
        if results and int(min(r.started for r in results)) == int(max(map(answered_at, results))):
            return results
    raise HarnessError(f"no {what} fit in one wall-clock second in {attempts} tries")


def redis_key(domain: str, unit: str, tenant: str, t: float | None = None,
              descriptor_key: str = "tenant") -> str:
    """The key envoyproxy/ratelimit builds for one of our descriptors."""
    secs = UNIT_SECONDS[unit]
    return f"{domain}_generic_key_per_{unit}_{descriptor_key}_{tenant}_{window_start(secs, t)}"


def counter_key(domain: str, unit: str, tenant: str, t: float | None = None) -> str:
    """The key ratelimit-counter builds for a tenant's fixed window (docs/counter.md)."""
    secs = UNIT_SECONDS[unit]
    return f"trl:{{{len(domain)}:{domain}:{tenant}}}:per_{unit}:{window_start(secs, t) * 1000}"

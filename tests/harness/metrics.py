"""Counters as Envoy and the services show them: `name: value` stats and
Prometheus text expositions."""

from __future__ import annotations

import re
import time
from typing import Iterable

import requests

from .base import HarnessError


def parse_stats(text: str) -> dict[str, int]:
    """`name: value` lines (Envoy admin /stats, ratelimit debug /stats) → {name: int}.

    Histograms and other non-integer values are left out.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if not sep:
            continue
        value = value.strip()
        if re.fullmatch(r"-?\d+", value):
            out[name.strip()] = int(value)
    return out


Labels = tuple[tuple[str, str], ...]
_TYPED_TOTAL_COUNTER = re.compile(r"^# TYPE (\S+_total) counter\s*$", re.M)


def prometheus_series(text: str, prefix: str = "",
                      types: Iterable[str] | None = None) -> dict[tuple[str, Labels], float]:
    """A Prometheus text exposition, read by prometheus-client's parser (the
    real one: a malformed exposition raises), as {(name, sorted label
    pairs): value}, for the families whose name starts with `prefix` and
    whose type is one of `types` (all if None).

    Every sample is keyed by the name the exposition wrote: the parser
    renames a counter's samples to the OpenMetrics `<family>_total` (and
    drops `_total` from a family named so), and that is undone here.
    """
    from prometheus_client.parser import text_string_to_metric_families

    counters_named_total = set(_TYPED_TOTAL_COUNTER.findall(text))
    wanted = None if types is None else set(types)
    out: dict[tuple[str, Labels], float] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(prefix) or (wanted is not None and family.type not in wanted):
            continue
        for sample in family.samples:
            name = sample.name
            if family.type == "counter":
                if name != family.name + "_total":
                    raise HarnessError(f"counter {family.name}: sample {name} {sample.labels}")
                if name not in counters_named_total:
                    name = family.name
            out[(name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text format → {`name{k="v",...}` (labels sorted): value}."""
    out: dict[str, float] = {}
    for (name, labels), value in prometheus_series(text).items():
        if labels:
            name += "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"
        out[name] = value
    return out


# The filter's count of its VMs' flushes (docs/operating.md#metrics): each
# VM keeps its counts and hands them to Envoy on its tick.
STATS_FLUSHES = "tenant_ratelimit.stats_flushes"
# How long to wait for them, at most (a tick is 250 ms at the longest).
FLUSH_DEADLINE_S = 10.0


def _flushes(admin_url: str) -> int | None:
    """The filter's flushes in this Envoy so far; None without the filter."""
    text = requests.get(f"{admin_url}/stats", params={"filter": r"tenant_ratelimit\.stats_flushes$"},
                        timeout=2).text
    found = [v for k, v in parse_stats(text).items() if k.endswith(STATS_FLUSHES)]
    return sum(found) if found else None


def _vms(admin_url: str) -> int:
    """The VMs of a plugin in this Envoy: one per worker and the main thread's."""
    try:
        info = requests.get(f"{admin_url}/server_info", timeout=2).json()
        return int(info["command_line_options"]["concurrency"]) + 1
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return 3


def wait_flushed(admin_url: str, deadline_s: float = FLUSH_DEADLINE_S) -> None:
    """Returns once every VM of the filter in this Envoy has flushed its counts
    at least once since the call, as far as Envoy's count of flushes tells
    (twice as many flushes as VMs: the VMs tick at the same period); at
    once for an Envoy without the filter. What was counted before the call
    is then in Envoy's stats (a count is at most one tick stale)."""
    first = _flushes(admin_url)
    if first is None:
        return
    wanted = first + 2 * _vms(admin_url)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        now = _flushes(admin_url)
        if now is None or now >= wanted:
            return
        time.sleep(0.02)


def scrape_prometheus(admin_url: str, prefix: str = "",
                      types: Iterable[str] | None = None) -> dict[tuple[str, Labels], float]:
    """An Envoy admin's /stats/prometheus, as prometheus_series reads it,
    once the filter's counts made so far are in it (wait_flushed)."""
    wait_flushed(admin_url)
    text = requests.get(f"{admin_url}/stats/prometheus", timeout=5).text
    return prometheus_series(text, prefix, types)

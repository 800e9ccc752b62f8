"""`over_limit` counts the rate-limit service's refusals and nothing else
(filter/src/counters.rs, README "Metrics"): a refusal the filter decides
itself, from the over-limit cache, the token bucket or a sync-mode view at
the limit, is counted in its own place. An alert on `over_limit` (the
service says no) must not fire for a sync group refusing locally.

One Envoy, a sync group and an exact group; each refusal's source is what
the per-group counters (`group.<g>.refused.<source>`) and the access log
(`"source"`) say it is."""

from __future__ import annotations

import json
from collections import Counter

import harness
from harness import ensure_window_room, run_sequential, tally, unique

SYNC_QUOTA = 5
EXACT_QUOTA = 3
SOURCES = ("service", "cache", "bucket", "sync")
# Envoy writes the access-log file every 10 s by default
# (--file-flush-interval-msec): wait for the lines, with room to spare.
LOG_DEADLINE_S = 40


def test_over_limit_counts_only_the_services_refusals_with_a_sync_group(stack):
    exact_tenant = unique("tenant-exact")
    limits = {"x-tenant-id": {
        "default": {"perminute": SYNC_QUOTA},
        "exact": {"perminute": EXACT_QUOTA, "header_value": [exact_tenant]},
    }}
    gen = stack.generate(limits, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    rls = stack.ratelimit(stack.redis(), gen)
    log = stack.workdir / "access.log"
    local = {"enabled": True, "mode": "sync", "groups": {"exact": {"mode": "exact"}}}
    envoy = stack.envoy(gen.plugin_config(local=local), rls, stack.upstream(),
                        access_log_path=log)
    ensure_window_room(60, 30)

    synced = run_sequential([envoy.url], 40, tenant=unique("tenant-sync"))
    assert tally(synced) == Counter({200: SYNC_QUOTA, 429: 40 - SYNC_QUOTA}), (
        harness.summary(synced))
    exact = run_sequential([envoy.url], EXACT_QUOTA + 3, tenant=exact_tenant)
    assert [r.status for r in exact] == [200] * EXACT_QUOTA + [429] * 3, harness.summary(exact)
    refusals = 40 - SYNC_QUOTA + 3

    c = envoy.filter_counters()
    refused = Counter()
    for group in ("default", "exact"):
        for source in SOURCES:
            refused[source] += c.get(f"group.{group}.refused.{source}", 0)
    # Every 429 has one source, and the sync group's are its view's.
    assert sum(refused.values()) == refusals, _nonzero(c)
    assert c.get("group.default.refused.sync", 0) > 0, _nonzero(c)
    # The exact group's first refusal came from the service, its others
    # from the over-limit cache.
    assert c.get("group.exact.refused.service", 0) == 1, _nonzero(c)

    lines = _log_lines(log, refusals)
    by_source = Counter(line["source"] for line in lines if line["status"] == 429)
    assert sum(by_source.values()) == refusals, lines
    assert by_source["service"] == refused["service"], (by_source, _nonzero(c))

    print(f"\nrefusals by source: counters {dict(refused)}, access log {dict(by_source)}; "
          f"over_limit {c.get('over_limit', 0)}, cached_over_limit "
          f"{c.get('cached_over_limit', 0)}, local_over_limit {c.get('local_over_limit', 0)}")
    assert c.get("over_limit", 0) == refused["service"], (
        f"over_limit is {c.get('over_limit', 0)}, but the service refused "
        f"{refused['service']} requests (refusals by source: {dict(refused)}): "
        f"{_nonzero(c)}")


def _log_lines(path, n: int) -> list[dict]:
    def enough() -> bool:
        return path.exists() and len(path.read_text().splitlines()) >= n
    harness.wait_until(enough, f"{n} access-log lines in {path}", LOG_DEADLINE_S)
    return [json.loads(line) for line in path.read_text().splitlines()]


def _nonzero(counters: dict) -> dict:
    return {k: v for k, v in sorted(counters.items()) if v}

"""Who was limited (issue 11 item 5): the access log of a real Envoy, with the
project's bootstrap (envoy/envoy.yaml.tmpl), has tenant, group, verdict and
source for every refused and every shadow-refused request, one JSON object a
line however hostile the tenant value, and no line for an admitted request.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter

import harness
from harness import ensure_window_room, run_sequential, tally, unique

DAY_ROOM_S = 120
# Envoy writes an access-log file every 10 s by default
# (--file-flush-interval-msec): wait for the lines, with room to spare.
LOG_DEADLINE_S = 40


def read_lines(path, n: int) -> list[dict]:
    def enough() -> bool:
        return path.exists() and len(path.read_text().splitlines()) >= n
    harness.wait_until(enough, f"{n} access-log lines in {path}", LOG_DEADLINE_S)
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_refusal_is_in_the_access_log_with_tenant_group_verdict_and_source(stack):
    gold = unique("tenant-gold")
    limits = {"x-tenant-id": {
        "default": {"perday": 3},
        "gold": {"perday": 2, "header_value": [gold], "shadow": True},
    }}
    gen = stack.generate(limits)
    rls = stack.ratelimit(stack.redis(), gen)
    log = stack.workdir / "access.log"
    envoy = stack.envoy(gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS), rls,
                        stack.upstream(), access_log_path=log)
    ensure_window_room(86400, DAY_ROOM_S)

    # A quote, a backslash, braces and a tab: none may break the line.
    hostile = f'ten"ant\\{{x}}\ty-{uuid.uuid4().hex[:8]}'
    refused = run_sequential([envoy.url], 8, tenant=hostile)
    assert tally(refused) == Counter({200: 3, 429: 5}), harness.summary(refused)
    shadowed = run_sequential([envoy.url], 5, tenant=gold)
    assert tally(shadowed) == Counter({200: 5}), harness.summary(shadowed)
    too_long = run_sequential([envoy.url], 1, tenant="x" * 200)
    assert tally(too_long) == Counter({431: 1})

    lines = read_lines(log, 5 + 3 + 1)
    # Only refusals: no line for the 3 + 2 admitted requests.
    assert len(lines) == 9, lines
    by_status = Counter(line["status"] for line in lines)
    assert by_status == Counter({429: 5, 200: 3, 431: 1}), lines

    for_429 = [line for line in lines if line["status"] == 429]
    assert all(line["tenant"] == hostile and line["group"] == "default"
               and line["verdict"] == "refused" for line in for_429), for_429
    # The service refused once; the over-limit cache did the rest.
    assert Counter(line["source"] for line in for_429) == Counter({"service": 1, "cache": 4})

    shadow = [line for line in lines if line["status"] == 200]
    assert all(line["tenant"] == gold and line["group"] == "gold"
               and line["verdict"] == "shadow_refused" for line in shadow), shadow
    assert Counter(line["source"] for line in shadow) == Counter({"service": 1, "cache": 2})

    # A value over max_tenant_length is not logged: only why it was refused.
    [long_line] = [line for line in lines if line["status"] == 431]
    assert long_line["source"] == "tenant_too_long" and long_line["verdict"] == "refused"
    assert long_line["tenant"] is None and long_line["group"] is None

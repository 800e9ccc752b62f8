"""A 429 from the over-limit cache repeats the service's 429, rule names
included (README "Rate-limit headers": `;name="<rule name>"` in
X-RateLimit-Limit when the service's rule has a `name`, and "a cached 429
repeats the names of the service's 429"), in every mode: exact, lease and
sync groups all remember the service's refusals in the same cache.

The service's YAML names both rules of the group (the counter names both
after the group: `pytest --service counter`). One Envoy in exact mode
spends the tenant's per-minute quota first (as the rest of a fleet would);
then an Envoy whose group is in the mode under test is refused by the
service once, and from its over-limit cache after that. In sync mode,
`max_unsynced` 1 makes the second request ask the service, and
`interval_ms` 60 s keeps the first request's hit unpushed meanwhile (a
push would make the view refuse locally, with no X-RateLimit-* at all).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import harness
from harness import ensure_window_room, run_sequential, unique

QUOTA = 3
LIMITS = {"x-tenant-id": {"default": {"perminute": QUOTA, "perhour": 100}}}
RULE_NAMES = {"minute": "per-minute quota", "hour": "per-hour quota"}
EXPECTED_LIMIT = (f'{QUOTA}, {QUOTA};w=60;name="{RULE_NAMES["minute"]}", '
                  f'100;w=3600;name="{RULE_NAMES["hour"]}"')
# The counter names a group's limits after the group.
COUNTER_LIMIT = f'{QUOTA}, {QUOTA};w=60;name="default", 100;w=3600;name="default"'
# Starting the stack and the requests take a few seconds; in sync mode the
# first push comes interval_ms after the Envoy starts.
MINUTE_ROOM_S = 25
SYNC = {"interval_ms": 60_000, "max_unsynced": 1}
_RULE = re.compile(r"rate_limit: \{ unit: (\w+), requests_per_unit: (\d+) \}")


def named_rules(gen: harness.Generated, path: Path) -> Path:
    """The generated service YAML with a `name` on every rule."""
    text, n = _RULE.subn(
        lambda m: (f'rate_limit: {{ unit: {m.group(1)}, requests_per_unit: {m.group(2)}, '
                   f'name: "{RULE_NAMES[m.group(1)]}" }}'),
        gen.ratelimit_yaml.read_text())
    assert n == 2, text
    path.write_text(text)
    return path


@pytest.mark.parametrize("mode", ["exact", "lease", "sync"])
def test_a_cached_429_carries_the_rule_names_of_the_services_429(stack, mode):
    ensure_window_room(60, MINUTE_ROOM_S)
    gen = stack.generate(LIMITS, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    if stack.service == "counter":
        rls = stack.ratelimit(stack.redis(), gen)
        expected = COUNTER_LIMIT
    else:
        rls = stack.ratelimit(stack.redis(), named_rules(gen, stack.workdir / "named.yaml"))
        expected = EXPECTED_LIMIT
    upstream = stack.upstream()
    spender = stack.envoy(gen.plugin_config(), rls, upstream, name="envoy-spender")
    local = {"enabled": True, "mode": mode, "sync": SYNC}
    subject = stack.envoy(gen.plugin_config(local=local), rls, upstream, name=f"envoy-{mode}")
    tenant = unique("tenant")

    spent = run_sequential([spender.url], QUOTA, tenant=tenant)
    assert [r.status for r in spent] == [200] * QUOTA, harness.summary(spent)
    assert spent[0].headers.get("x-ratelimit-limit") == expected, spent[0].headers

    results = run_sequential([subject.url], 5, tenant=tenant)
    statuses = [r.status for r in results]
    # Sync mode admits the first request locally: its view has not seen
    # the spender's hits yet.
    first_429 = 1 if mode == "sync" else 0
    assert statuses == [200] * first_429 + [429] * (5 - first_429), harness.summary(results)
    c = subject.filter_counters()
    refused = {s: c.get(f"group.default.refused.{s}", 0) for s in ("service", "cache", "sync")}
    # The first 429 is the service's, every later one the cache's.
    assert refused == {"service": 1, "cache": 4 - first_429, "sync": 0}, refused

    limits = [r.headers.get("x-ratelimit-limit") for r in results[first_429:]]
    print(f"\n{mode}: X-RateLimit-Limit of the service's 429 then the cache's: {limits}")
    assert limits[0] == expected, results[first_429].headers
    for r in results[first_429 + 1:]:
        assert r.headers.get("x-ratelimit-limit") == limits[0], (
            f"{mode}: the cached 429 says {r.headers.get('x-ratelimit-limit')!r}, "
            f"the service's said {limits[0]!r}")

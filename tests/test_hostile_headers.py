"""A hostile tenant header never crashes the VM and never slips past the limit:
bytes that are not UTF-8, a huge value, the header repeated, a blank value.
A value longer than max_tenant_length (default 128 bytes) is refused with 431,
counted, and never reaches the service, so it never becomes a Redis key."""

from __future__ import annotations

import http.client
from collections import Counter
from urllib.parse import urlsplit

import harness
from harness import ensure_window_room, tally, unique

LIMIT = 3
LIMITS = {"x-tenant-id": {"default": {"perhour": LIMIT}}}
MAX_TENANT_LENGTH = 128  # the default, which generate writes


def raw_get(url: str, tenant_values: list[bytes]) -> tuple[int, dict[str, str]]:
    """GET with the tenant header sent once per value, bytes as they are."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.putrequest("GET", "/")
        for v in tenant_values:
            conn.putheader(harness.TENANT_HEADER, v)
        conn.endheaders()
        r = conn.getresponse()
        r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}
    finally:
        conn.close()


def statuses(url: str, values: list[bytes], n: int) -> list[int]:
    return [raw_get(url, values)[0] for _ in range(n)]


def assert_vm_alive(fleet: harness.Fleet) -> None:
    """The filter still answers: a fresh tenant is admitted with its headers."""
    status, headers = raw_get(fleet.urls[0], [unique("tenant").encode()])
    assert status == 200 and headers.get("x-ratelimit-limit") == f"{LIMIT}, {LIMIT};w=3600", headers


def test_hostile_tenant_values_are_limited_and_never_crash_the_vm(stack):
    fleet = stack.fleet(LIMITS, envoys=1, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    assert fleet.generated.plugin_config()["max_tenant_length"] == MAX_TENANT_LENGTH
    ensure_window_room(3600, 60)
    url = fleet.urls[0]

    # Not UTF-8: limited as its lossy UTF-8 form, a tenant of its own.
    evil = b"\xff\xfe-" + unique("evil").encode()
    assert statuses(url, [evil], LIMIT + 2) == [200] * LIMIT + [429] * 2
    lossy = evil.decode("utf-8", errors="replace")
    assert fleet.redis.keys(f"{fleet.domain}_*") == [harness.redis_key(fleet.domain, "hour", lossy)]
    assert_vm_alive(fleet)

    # 16 KiB of tenant (Envoy's own header limit is 60 KiB): refused with
    # 431 every time, counted, never asked about, so no Redis key for it.
    keys_before = set(fleet.redis.keys(f"{fleet.domain}_*"))
    huge = unique("huge").encode() + b"x" * 16_384
    for _ in range(LIMIT + 1):
        status, headers = raw_get(url, [huge])
        assert status == 431, (status, headers)
    # One byte over the cap, and not UTF-8 (its lossy form would be longer
    # still): the same.
    over = b"\xff" * (MAX_TENANT_LENGTH + 1)
    assert statuses(url, [over], 2) == [431, 431]
    assert set(fleet.redis.keys(f"{fleet.domain}_*")) == keys_before
    assert_vm_alive(fleet)

    # Exactly the cap: limited as before, with its own counter.
    at_cap = unique("cap").encode()
    at_cap += b"c" * (MAX_TENANT_LENGTH - len(at_cap))
    assert len(at_cap) == MAX_TENANT_LENGTH
    assert statuses(url, [at_cap], LIMIT + 1) == [200] * LIMIT + [429]
    assert fleet.redis.get_int(harness.redis_key(fleet.domain, "hour", at_cap.decode())) == LIMIT + 1
    assert_vm_alive(fleet)

    # The header twice: whatever value Envoy hands the filter, it is limited.
    twice = [unique("one").encode(), unique("two").encode()]
    assert statuses(url, twice, LIMIT + 1) == [200] * LIMIT + [429]
    assert_vm_alive(fleet)

    # A blank value is no tenant: the missing_tenant policy (allow) applies.
    blank = statuses(url, [b"   "], LIMIT + 2)
    assert Counter(blank) == Counter({200: LIMIT + 2})
    assert_vm_alive(fleet)

    c = fleet.counters()
    assert c["rls_error"] == 0 and c["failure_mode_allowed"] == 0, c
    assert c["missing_tenant"] == LIMIT + 2, c
    assert c["tenant_too_long"] == LIMIT + 1 + 2, c
    assert tally([harness.send(url, unique("after"))]) == Counter({200: 1})

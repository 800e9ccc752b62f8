"""A hostile tenant header never crashes the VM and never slips past the limit:
bytes that are not UTF-8, a huge value, the header repeated, a blank value,
on raw HTTP/1.1 and on HTTP/2.

- A value longer than max_tenant_length (default 128 bytes) is refused with
  431, counted, and never reaches the service, so it never becomes a Redis key.
- Bytes that are not UTF-8, and `%`, reach the service written `%XX`: every
  raw value is a tenant of its own (`vic\\xfftim`, `vic\\xfetim`, the valid
  `vic\\u{FFFD}tim` and `vic%FFtim` are four counters).
- The header sent more than once is refused with 400 (`tenant_repeated`),
  whatever its values, and never asked about: an empty first value followed
  by a victim's is no longer a missing tenant let through.
- An empty (or blank: Envoy strips it) value is a tenant, the empty one.
"""

from __future__ import annotations

from collections import Counter

import h2c
import harness
from harness import ensure_window_room, raw_get, tally, unique

LIMIT = 3
LIMITS = {"x-tenant-id": {"default": {"perhour": LIMIT}}}
MAX_TENANT_LENGTH = 128  # the default, which generate writes


def statuses(url: str, values: list[bytes], n: int) -> list[int]:
    return [raw_get(url, values).status for _ in range(n)]


def assert_vm_alive(fleet: harness.Fleet) -> None:
    """The filter still answers: a fresh tenant is admitted with its headers."""
    r = raw_get(fleet.urls[0], [unique("tenant").encode()])
    status, headers = r.status, r.headers
    assert status == 200 and headers.get("x-ratelimit-limit") == f"{LIMIT}, {LIMIT};w=3600", headers


def test_hostile_tenant_values_are_limited_and_never_crash_the_vm(stack):
    fleet = stack.fleet(LIMITS, envoys=1, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    assert fleet.generated.plugin_config()["max_tenant_length"] == MAX_TENANT_LENGTH
    ensure_window_room(3600, 60)
    url = fleet.urls[0]

    # Not UTF-8: limited as its escaped form, a tenant of its own.
    evil = b"\xff\xfe-" + unique("evil").encode()
    assert statuses(url, [evil], LIMIT + 2) == [200] * LIMIT + [429] * 2
    escaped = "%FF%FE-" + evil[3:].decode()
    assert fleet.redis.keys(f"{fleet.domain}_*") == [harness.redis_key(fleet.domain, "hour", escaped)]
    assert_vm_alive(fleet)

    # 16 KiB of tenant (Envoy's own header limit is 60 KiB): refused with
    # 431 every time, counted, never asked about, so no Redis key for it.
    keys_before = set(fleet.redis.keys(f"{fleet.domain}_*"))
    huge = unique("huge").encode() + b"x" * 16_384
    for _ in range(LIMIT + 1):
        r = raw_get(url, [huge])
        status, headers = r.status, r.headers
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

    # The header twice: refused, whatever the values, and never asked
    # about (no Redis key for either).
    keys_before = set(fleet.redis.keys(f"{fleet.domain}_*"))
    twice = [unique("one").encode(), unique("two").encode()]
    assert statuses(url, twice, LIMIT + 1) == [400] * (LIMIT + 1)
    # An empty value first, then a victim's: once a missing tenant, let
    # through under missing_tenant: allow.
    victim = unique("victim").encode()
    assert statuses(url, [b"", victim], 8) == [400] * 8
    assert set(fleet.redis.keys(f"{fleet.domain}_*")) == keys_before
    assert statuses(url, [victim], LIMIT + 1) == [200] * LIMIT + [429]
    assert_vm_alive(fleet)

    # A blank value (Envoy strips it to empty) is the empty tenant, limited
    # like any other; everyone who sends it shares its counter.
    blank = statuses(url, [b"   "], LIMIT + 2)
    assert blank == [200] * LIMIT + [429] * 2
    # (The fifth is refused from the over-limit cache, without a call.)
    assert fleet.redis.get_int(harness.redis_key(fleet.domain, "hour", "")) == LIMIT + 1
    assert_vm_alive(fleet)

    c = fleet.counters()
    assert c["rls_error"] == 0 and c["failure_mode_allowed"] == 0, c
    assert c["missing_tenant"] == 0, c
    assert c["tenant_too_long"] == LIMIT + 1 + 2, c
    assert c["tenant_repeated"] == LIMIT + 1 + 8, c
    assert tally([harness.send(url, unique("after"))]) == Counter({200: 1})


def test_distinct_raw_values_never_share_a_counter(stack):
    """Once, `vic\\xfftim`, `vic\\xfetim` and `vic\\u{FFFD}tim` were one
    tenant (the lossy UTF-8 form): now each, and `vic%FFtim`, has the
    whole quota."""
    fleet = stack.fleet(LIMITS, envoys=1, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    ensure_window_room(3600, 60)
    url = fleet.urls[0]
    tag = unique("v").encode()
    raw = [tag + b"vic\xfftim", tag + b"vic\xfetim", tag + "vic\ufffdtim".encode(), tag + b"vic%FFtim"]
    for value in raw:
        assert statuses(url, [value], LIMIT + 1) == [200] * LIMIT + [429], value
    sent = [tag.decode() + v for v in ("vic%FFtim", "vic%FEtim", "vic\ufffdtim", "vic%25FFtim")]
    for v in sent:
        assert fleet.redis.get_int(harness.redis_key(fleet.domain, "hour", v)) == LIMIT + 1, v


def test_http2_header_shapes_are_each_decided_as_on_http1(stack):
    """The same decisions over HTTP/2 (h2c): Envoy hands the filter a
    repeated header as several values, an empty value as empty, and bytes
    that are not UTF-8 as they are."""
    fleet = stack.fleet(LIMITS, envoys=1, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    ensure_window_room(3600, 60)
    url = fleet.urls[0]
    name = harness.TENANT_HEADER.encode()

    def h2_statuses(values: list[bytes], n: int) -> list[int]:
        return [h2c.get(url, [(name, v) for v in values])[0] for _ in range(n)]

    victim = unique("victim").encode()
    assert h2_statuses([b"", victim], 5) == [400] * 5
    assert h2_statuses([victim, unique("other").encode()], 2) == [400] * 2
    assert fleet.redis.keys(f"{fleet.domain}_*") == []
    assert h2_statuses([victim], LIMIT + 1) == [200] * LIMIT + [429]
    assert h2_statuses([b""], LIMIT + 1) == [200] * LIMIT + [429]
    assert fleet.redis.get_int(harness.redis_key(fleet.domain, "hour", "")) == LIMIT + 1
    evil = unique("evil").encode() + b"\xff"
    assert h2_statuses([evil], LIMIT + 1) == [200] * LIMIT + [429]
    escaped = evil[:-1].decode() + "%FF"
    assert fleet.redis.get_int(harness.redis_key(fleet.domain, "hour", escaped)) == LIMIT + 1
    status, headers = h2c.get(url, [(name, unique("fresh").encode())])
    assert status == 200 and headers.get("x-ratelimit-limit") == f"{LIMIT}, {LIMIT};w=3600", headers
    c = fleet.counters()
    assert c["tenant_repeated"] == 7 and c["missing_tenant"] == 0, c
    assert c["rls_error"] == 0 and c["failure_mode_allowed"] == 0, c

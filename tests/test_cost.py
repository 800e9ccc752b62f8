"""Request cost (`cost_header`, `max_cost`) on the real stack: a request
carrying the header costs that many hits in the shared counter, so "exactly N"
holds in units of cost across two Envoys; a bad cost, or the header sent
twice, is a 400, never a cheap request."""

from __future__ import annotations

import socket
from collections import Counter
from urllib.parse import urlsplit

import h2c
import harness
from harness import ensure_window_room, run_concurrent, run_sequential, tally, unique

COST_HEADER = "x-request-cost"
RULE = {"perhour": 100}
LIMITS = {"x-tenant-id": {"default": RULE}}
MAX_COST = 50
COST = {"cost_header": COST_HEADER, "max_cost": MAX_COST}
# Everything a test sends lands in one hour window (see test_exactly_100.py).
HOUR_ROOM_S = 180


def cost_fleet(stack) -> harness.Fleet:
    return stack.fleet(LIMITS, envoys=2, timeout_ms=harness.COUNTING_TIMEOUT_MS, **COST)


def test_quota_100_at_cost_10_admits_exactly_10_across_two_envoys(stack):
    fleet = cost_fleet(stack)
    ensure_window_room(3600, HOUR_ROOM_S)
    tenant = unique("tenant")

    results = run_sequential(fleet.urls, 30, tenant=tenant, headers={COST_HEADER: "10"})
    assert tally(results) == Counter({200: 10, 429: 20}), harness.summary(results)
    assert [r.status for r in results[:10]] == [200] * 10
    assert Counter(r.target for r in results if r.status == 200) == Counter({0: 5, 1: 5})
    # Remaining counts down in units of cost.
    remaining = [harness.parse_ratelimit_headers(r.headers).remaining for r in results[:10]]
    assert remaining == list(range(90, -1, -10))

    # The window is spent for every cost: a request of cost 1 is refused too.
    again = run_sequential(fleet.urls, 4, tenant=tenant)
    assert tally(again) == Counter({429: 4}), harness.summary(again)

    # Redis counted the hits: 10 × 10 admitted, plus the refused calls'.
    c = fleet.counters()
    assert c["allowed"] == 10, c
    key = harness.redis_key(fleet.domain, "hour", tenant)
    assert fleet.redis.get_int(key) == 10 * (10 + c["over_limit"]), (c, fleet.redis.get_int(key))

    # Concurrently, a fresh tenant: still exactly 10.
    other = unique("tenant")
    burst = run_concurrent(fleet.urls, 60, clients=20, tenant=other,
                           headers={COST_HEADER: "10"})
    assert tally(burst) == Counter({200: 10, 429: 50}), harness.summary(burst)


def test_costs_mix_in_one_quota(stack):
    fleet = cost_fleet(stack)
    ensure_window_room(3600, HOUR_ROOM_S)
    tenant = unique("tenant")
    # 50 + 40 + 10 × 1 = 100: all admitted; then even cost 1 is refused.
    first = [harness.send(fleet.urls[0], tenant, {COST_HEADER: "50"}),
             harness.send(fleet.urls[1], tenant, {COST_HEADER: "40"})]
    first += run_sequential(fleet.urls, 10, tenant=tenant)
    assert tally(first) == Counter({200: 12}), harness.summary(first)
    last = harness.send(fleet.urls[0], tenant)
    assert last.status == 429


def test_bad_costs_are_400_and_never_reach_the_service(stack):
    fleet = cost_fleet(stack)
    ensure_window_room(3600, HOUR_ROOM_S)
    tenant = unique("tenant")
    bad = ["0", "-1", "abc", str(MAX_COST + 1), "1.5", "99999999999999999999", "+5"]
    for value in bad:
        r = harness.send(fleet.urls[0], tenant, {COST_HEADER: value})
        assert r.status == 400, (value, r)
    c = fleet.counters()
    assert c["cost_invalid"] == len(bad), c
    assert c["allowed"] == 0 and c["over_limit"] == 0 and c["rls_error"] == 0, c
    assert fleet.redis.keys(f"{fleet.domain}_*") == []

    # The largest valid cost is accepted and counted in full.
    r = harness.send(fleet.urls[1], tenant, {COST_HEADER: str(MAX_COST)})
    assert r.status == 200
    assert harness.parse_ratelimit_headers(r.headers).remaining == 100 - MAX_COST


def raw_status(url: str, headers: list[tuple[str, str]]) -> int:
    """One HTTP/1.1 GET written byte for byte (a header line per pair, a
    name repeated as given); its status."""
    u = urlsplit(url)
    request = b"GET / HTTP/1.1\r\nHost: x\r\n"
    for name, value in headers:
        request += f"{name}: {value}\r\n".encode()
    request += b"Connection: close\r\n\r\n"
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1])


def test_a_cost_header_sent_twice_is_400_whatever_its_order(stack):
    """The first value is never taken: `1, 1000` must not cost 1 (and
    `1000, 1` is refused the same way), on HTTP/1.1 and on HTTP/2;
    nothing is counted against the tenant."""
    fleet = cost_fleet(stack)
    ensure_window_room(3600, HOUR_ROOM_S)
    tenant = unique("tenant")
    url = fleet.urls[0]
    pairs = [("1", "1000"), ("1000", "1"), ("1", str(MAX_COST)), ("1", "1")]
    for first, second in pairs:
        headers = [(harness.TENANT_HEADER, tenant), (COST_HEADER, first), (COST_HEADER, second)]
        assert raw_status(url, headers) == 400, (first, second)
        status, _ = h2c.get(url, [(n.encode(), v.encode()) for n, v in headers])
        assert status == 400, (first, second)
    c = fleet.counters()
    assert c["cost_invalid"] == 2 * len(pairs), c
    assert c["allowed"] == 0 and c["over_limit"] == 0 and c["rls_error"] == 0, c
    assert fleet.redis.keys(f"{fleet.domain}_*") == []

    # Sent once, the same tenant's cost counts in full.
    assert raw_status(url, [(harness.TENANT_HEADER, tenant), (COST_HEADER, "1")]) == 200
    r = harness.send(url, tenant, {COST_HEADER: str(MAX_COST - 1)})
    assert r.status == 200
    assert harness.parse_ratelimit_headers(r.headers).remaining == 100 - MAX_COST

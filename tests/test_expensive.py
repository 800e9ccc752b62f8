"""Expensive operations on the real stack: a route's own limit per tenant
(`routes` in the team file, matched on Envoy's route name), and a cost the
upstream reports in a response header or trailer (`response_cost_header`),
charged after the response.

The filter Envoy's route table (envoy/envoy.yaml.tmpl) names `/reports…`
`reports` and everything else `all`; the shared upstream answers a request
carrying `x-test-cost: N` with the response header `x-cost: N`.
"""

from __future__ import annotations

import http.server
import socketserver
import threading
from collections import Counter

import counter
import harness
from harness import ensure_window_room, run_sequential, tally, unique


def refusals_counted(fleet, c: Counter) -> int:
    """What the service's refusals added to a tenant's count: each refusal
    envoyproxy/ratelimit answered; nothing with the counter, which decides
    a request as a whole and counts only what it admits."""
    return 0 if isinstance(fleet.ratelimit, counter.Counter) else c["over_limit"]


def minute_count(fleet, tenant: str) -> int | None:
    """The tenant's minute count in Redis, under either service's key."""
    key = (harness.counter_key if isinstance(fleet.ratelimit, counter.Counter)
           else harness.redis_key)(fleet.domain, "minute", tenant)
    return fleet.redis.get_int(key)

# --------------------------------------------------------------- route limits

ROUTE_LIMITS = {"x-tenant-id": {
    "default": {"perminute": 600, "routes": {"reports": {"perminute": 5}}},
    "gold": {"perminute": 6000, "header_value": ["gold-tenant"],
             "routes": {"reports": {"perminute": 7}}},
}}
# Everything a test sends lands in one minute window.
MINUTE_ROOM_S = 30


def reports(url: str) -> str:
    return url + "reports/export"


def test_a_route_has_its_own_limit_per_tenant_next_to_the_tenants(stack):
    fleet = stack.fleet(ROUTE_LIMITS, envoys=2, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    report_urls = [reports(u) for u in fleet.urls]
    other_urls = [u + "search" for u in fleet.urls]
    ensure_window_room(60, MINUTE_ROOM_S)
    tenant = unique("tenant")

    # Exactly 5 on `reports`, across both Envoys, while the tenant's other
    # routes keep being admitted (interleaved).
    on_route, elsewhere = [], []
    for i in range(12):
        on_route.append(harness.send(report_urls[i % 2], tenant, target=i % 2))
        elsewhere.append(harness.send(other_urls[i % 2], tenant, target=i % 2))
    assert tally(on_route) == Counter({200: 5, 429: 7}), harness.summary(on_route)
    assert [r.status for r in on_route[:5]] == [200] * 5
    assert tally(elsewhere) == Counter({200: 12}), harness.summary(elsewhere)

    # The headers describe the tightest window of either: the route's 5 on
    # `reports` (both windows listed), the tenant's 600 elsewhere.
    for n, r in enumerate(on_route[:5]):
        h = harness.parse_ratelimit_headers(r.headers)
        assert h.limit == 5 and sorted(h.windows) == [(5, 60), (600, 60)], r.headers
        assert h.remaining == 4 - n, r.headers
    refused = harness.parse_ratelimit_headers(on_route[5].headers)
    assert refused.limit == 5 and refused.remaining == 0 and refused.retry_after is not None
    last = harness.parse_ratelimit_headers(elsewhere[-1].headers)
    assert last.windows == [(600, 60)], elsewhere[-1].headers
    # Every admitted request on either route spent the tenant's counter: 12
    # elsewhere, 5 on the route; with envoyproxy/ratelimit also each refusal
    # it answered (later ones come from each Envoy's over-limit cache).
    c = fleet.counters()
    assert last.remaining == 600 - 17 - refusals_counted(fleet, c), (c, elsewhere[-1].headers)

    # A second tenant has its own 5; a gold tenant its group's 7.
    other = run_sequential(report_urls, 8, tenant=unique("tenant"))
    assert tally(other) == Counter({200: 5, 429: 3}), harness.summary(other)
    gold = run_sequential(report_urls, 10, tenant="gold-tenant")
    assert tally(gold) == Counter({200: 7, 429: 3}), harness.summary(gold)

    # Redis holds one counter per tenant and route, beside the tenant's.
    if isinstance(fleet.ratelimit, counter.Counter):
        keys = fleet.redis.keys(f"trl:*{tenant}*")
    else:
        keys = fleet.redis.keys(f"{fleet.domain}_*{tenant}*")
    route_keys = [k for k in keys if "reports" in k]
    assert len(route_keys) == 1 and len(keys) == 2, keys


# ------------------------------------------------------ cost after the response

COST_LIMITS = {"x-tenant-id": {"default": {"perminute": 100}}}
RESPONSE_COST = {"response_cost_header": "x-cost", "max_cost": 1000}


def charges(fleet) -> int:
    return fleet.counters()["group.default.response_cost.charges"]


def wait_charged(fleet, n: int) -> None:
    """Until the fleet's roots have had n response costs answered by the service."""
    harness.wait_until(lambda: charges(fleet) >= n, f"{n} response costs charged", 10.0)


def run_charged(fleet, urls: list[str], n: int, tenant: str, headers: dict | None = None):
    """n sequential requests; after each admitted one, wait until its cost landed."""
    results = []
    for i in range(n):
        r = harness.send(urls[i % len(urls)], tenant, headers, target=i % len(urls))
        results.append(r)
        if r.status == 200:
            wait_charged(fleet, sum(x.status == 200 for x in results))
    return results


def test_a_cost_in_the_response_header_is_charged_after_the_response(stack):
    fleet = stack.fleet(COST_LIMITS, envoys=2, timeout_ms=harness.COUNTING_TIMEOUT_MS,
                        **RESPONSE_COST)
    ensure_window_room(60, MINUTE_ROOM_S)
    tenant = unique("tenant")

    results = run_charged(fleet, fleet.urls, 15, tenant, {"x-test-cost": "10"})
    assert tally(results) == Counter({200: 10, 429: 5}), harness.summary(results)
    assert [r.status for r in results[:10]] == [200] * 10
    # The response reaches the client unchanged, cost header included.
    assert all(r.headers.get("x-cost") == "10" for r in results[:10])

    c = fleet.counters()
    assert c["group.default.response_cost.charges"] == 10, c
    assert c["group.default.response_cost.hits"] == 10 * 9, c
    assert c["group.default.response_cost.failed"] == 0, c
    # Redis: 10 × 10 admitted (each response's 9 counted whatever the
    # limit), plus with envoyproxy/ratelimit 1 for each call it refused.
    held = minute_count(fleet, tenant)
    assert held == 100 + refusals_counted(fleet, c), (c, held)


def test_a_response_cost_past_the_limit_is_counted_whole(stack):
    """The response was served: its cost counts even where it crosses the
    limit, and the tenant's next request is refused."""
    fleet = stack.fleet(COST_LIMITS, envoys=2, timeout_ms=harness.COUNTING_TIMEOUT_MS,
                        **RESPONSE_COST)
    ensure_window_room(60, MINUTE_ROOM_S)
    tenant = unique("tenant")
    # 1 + 59, then 1 + 59 more: 120 of 100, the second charge past the limit.
    results = run_charged(fleet, fleet.urls, 2, tenant, {"x-test-cost": "60"})
    assert tally(results) == Counter({200: 2}), harness.summary(results)
    c = fleet.counters()
    assert c["group.default.response_cost.hits"] == 2 * 59, c
    assert minute_count(fleet, tenant) == 120, minute_count(fleet, tenant)
    last = harness.send(fleet.urls[0], tenant)
    assert last.status == 429, last


class _TrailerHandler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1, chunked, with the request's x-test-cost as the trailer x-cost."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 (http.server's name)
        cost = self.headers.get("x-test-cost", "")
        self.send_response(200)
        self.send_header("transfer-encoding", "chunked")
        self.send_header("trailer", "x-cost")
        self.end_headers()
        self.wfile.write(b"3\r\nok\n\r\n0\r\n")
        self.wfile.write(f"x-cost: {cost}\r\n\r\n".encode())
        self.wfile.flush()

    def log_message(self, *args):
        pass


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def test_a_cost_in_the_response_trailer_is_charged_after_the_response(stack):
    gen = stack.generate(COST_LIMITS, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    redis = stack.redis()
    rls = stack.ratelimit(redis, gen)
    server = _Server((harness.LOOPBACK, 0), _TrailerHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        cfg = gen.plugin_config(**RESPONSE_COST)
        envoys = [stack.envoy(cfg, rls, server.server_address[1], name=f"envoy-{i + 1}")
                  for i in range(2)]
        fleet = harness.Fleet(gen, redis, rls, None, envoys)
        ensure_window_room(60, MINUTE_ROOM_S)
        tenant = unique("tenant")

        results = run_charged(fleet, fleet.urls, 15, tenant, {"x-test-cost": "10"})
        assert tally(results) == Counter({200: 10, 429: 5}), harness.summary(results)
        assert [r.status for r in results[:10]] == [200] * 10
        c = fleet.counters()
        assert c["group.default.response_cost.hits"] == 10 * 9, c
    finally:
        server.shutdown()
        server.server_close()


def test_one_client_sending_at_once_is_admitted_at_most_one_request_past_its_quota(stack):
    """One client, one keep-alive connection, each request sent as soon as
    the last response arrived (no waiting for its cost to land): each
    response's cost is charged as the response passes, so at most the
    request that meets the quota's last units goes past it."""
    fleet = stack.fleet(COST_LIMITS, envoys=1, timeout_ms=harness.COUNTING_TIMEOUT_MS,
                        **RESPONSE_COST)
    ensure_window_room(60, MINUTE_ROOM_S)
    tenant = unique("tenant")

    results = run_sequential(fleet.urls, 15, tenant, {"x-test-cost": "10"})
    t = tally(results)
    assert set(t) <= {200, 429}, harness.summary(results)
    assert [r.status for r in results[:10]] == [200] * 10, harness.summary(results)
    assert t[200] <= 11, harness.summary(results)
    # Every admitted response's cost was charged, none failed.
    wait_charged(fleet, t[200])
    c = fleet.counters()
    assert c["group.default.response_cost.failed"] == 0, c


def test_concurrent_clients_stay_within_the_stated_bound(stack):
    """Each client sends its next request once its last admitted one is
    charged, so at most one request per client is uncharged: with C clients,
    cost 10 and a quota of 100, the admitted cost is at most 100 + 9 × C."""
    fleet = stack.fleet(COST_LIMITS, envoys=2, timeout_ms=harness.COUNTING_TIMEOUT_MS,
                        **RESPONSE_COST)
    ensure_window_room(60, MINUTE_ROOM_S)
    tenant = unique("tenant")
    clients = 5
    admitted = []
    lock = threading.Lock()

    def client(k: int) -> list:
        out = []
        for i in range(8):
            r = harness.send(fleet.urls[(k + i) % 2], tenant, {"x-test-cost": "10"})
            out.append(r)
            if r.status == 200:
                with lock:
                    admitted.append(r)
                    n = len(admitted)
                wait_charged(fleet, n)
        return out

    threads_out: list[list] = [[] for _ in range(clients)]

    def run(k: int) -> None:
        threads_out[k] = client(k)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results = [r for out in threads_out for r in out]
    n = tally(results)[200]
    assert 10 <= n and 10 * n <= 100 + 9 * clients, harness.summary(results)
    assert set(tally(results)) <= {200, 429}, harness.summary(results)


def test_bad_response_costs_are_counted_and_charge_nothing_more(stack):
    fleet = stack.fleet(COST_LIMITS, envoys=2, timeout_ms=harness.COUNTING_TIMEOUT_MS,
                        **RESPONSE_COST)
    ensure_window_room(60, MINUTE_ROOM_S)
    tenant = unique("tenant")
    bad = ["0", "-1", "abc", "99999999999999999999", "1001"]
    for i, value in enumerate(bad):
        r = harness.send(fleet.urls[i % 2], tenant, {"x-test-cost": value})
        # The response reaches the client unchanged.
        assert r.status == 200 and r.headers.get("x-cost") == value, (value, r)
    harness.wait_until(lambda: fleet.counters()["response_cost_invalid"] >= len(bad),
                       "bad response costs counted", 10.0)
    c = fleet.counters()
    assert c["response_cost_invalid"] == len(bad), c
    assert c["group.default.response_cost.charges"] == 0, c
    assert c["group.default.response_cost.hits"] == 0, c
    # Only the requests' own hits were counted.
    assert minute_count(fleet, tenant) == len(bad), minute_count(fleet, tenant)

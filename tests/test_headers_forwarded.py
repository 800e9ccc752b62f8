"""The service's own headers (`response_headers_to_add`) reach the client as
they do through Envoy's own rate-limit filter.

envoyproxy/ratelimit with LIMIT_RESPONSE_HEADERS_ENABLED=true adds
RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset (of the descriptor
closest to its limit) to every answer. One service serves two Envoys: one
with this filter, one with envoy.filters.http.ratelimit and the generated
rate_limits. Two tenants of the default group send the same sequence, one
to each Envoy: the i-th responses must carry the same service headers.
The filter's local layer is off here, so that every answer is the
service's (a refusal from the over-limit cache carries the filter's own
headers, not the service's: the service was not asked).
"""

from __future__ import annotations

from collections import Counter

import pytest

import harness
from harness import ensure_window_room, send, tally, unique

LIMITS = {"x-tenant-id": {"default": {"perminute": 3, "perhour": 50}}}
SERVICE_HEADERS = ("ratelimit-limit", "ratelimit-remaining", "ratelimit-reset")


def test_the_services_headers_reach_the_client_as_with_envoys_filter(stack):
    if stack.service == "counter":
        pytest.skip("envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED: the counter "
                    "adds no headers of its own (response_headers_to_add) to its answers")
    gen = stack.generate(LIMITS)
    redis = stack.redis()
    rls = stack.ratelimit(redis, gen, response_headers=True)
    upstream = stack.upstream()
    ours = stack.envoy(gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS,
                                         local={"enabled": False}), rls, upstream)
    listen, admin = harness.free_port(), harness.free_port()
    text = harness.render_native_envoy_config(
        harness.native_rate_limits(gen).read_text(), gen.domain, listen_port=listen,
        admin_port=admin, rls_port=rls.grpc_port, upstream_port=upstream.listen_port)
    native = harness.Envoy(stack, "envoy-native", text, listen, admin)

    ensure_window_room(60, 15)
    a, b = unique("tenant-a"), unique("tenant-b")
    pairs = [(send(ours.url, a), send(native.url, b)) for _ in range(5)]
    assert tally(o for o, _ in pairs) == Counter({200: 3, 429: 2}), pairs
    assert tally(n for _, n in pairs) == Counter({200: 3, 429: 2}), pairs

    for i, (o, n) in enumerate(pairs):
        assert o.status == n.status, (i, o, n)
        for name in SERVICE_HEADERS:
            assert name in n.headers, (i, name, n.headers)
            assert name in o.headers, (i, name, o.headers)
        # The minute is the window closest to its limit: limit 3, counting down.
        assert o.headers["ratelimit-limit"] == n.headers["ratelimit-limit"] == "3"
        assert o.headers["ratelimit-remaining"] == n.headers["ratelimit-remaining"]
        # The service counts the reset down in whole seconds from its clock,
        # read somewhere between sending o and n's answer.
        crossed = harness.seconds_crossed(o, n)
        assert 0 <= int(o.headers["ratelimit-reset"]) - int(n.headers["ratelimit-reset"]) \
            <= crossed, (i, crossed, o, n)
        if o.status == 429:
            # The filter's own headers are there too, and one Retry-After
            # (two would read as "a, b" here, not a number).
            assert int(o.headers["retry-after"]) >= 1, o.headers
            assert o.headers["x-ratelimit-remaining"] == "0", o.headers
    assert [o.headers["ratelimit-remaining"] for o, _ in pairs] == ["2", "1", "0", "0", "0"]
    c = ours.filter_counters()
    assert (c.get("allowed"), c.get("over_limit")) == (3, 2), c

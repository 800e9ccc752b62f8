"""ratelimit-counter's memory store at its bound (--memory-max-keys): a call
that would add a key past it fails (the filter fails open, as for any store
failure), counted; the keys it holds keep counting exactly."""

from __future__ import annotations

from collections import Counter as Tally

import harness
from counter import Counter, native_envoy
from harness import ensure_window_room, run_sequential, tally, unique

LIMITS = {"x-tenant-id": {"default": {"perhour": 5}}}


def test_a_full_memory_store_refuses_new_keys_counted_and_counts_the_rest(stack):
    gen = stack.generate(LIMITS, service="counter")
    counter = Counter(stack, {gen.domain: LIMITS}, store="memory",
                      extra_args=["--memory-max-keys", "3"])
    envoy = native_envoy(stack, gen, counter.grpc_port, stack.upstream())
    ensure_window_room(3600, 60)
    tenants = [unique("tenant") for _ in range(4)]
    for t in tenants[:3]:
        assert tally(run_sequential([envoy.url], 1, tenant=t)) == Tally({200: 1})
    m = counter.metrics()
    assert m["trl_counter_memory_keys"] == 3
    assert m["trl_counter_memory_max_keys"] == 3
    assert m["trl_counter_memory_full_total"] == 0

    # A fourth tenant needs a fourth key: the call fails, counted; the
    # filter (failure_mode_deny: false) lets the request through.
    assert tally(run_sequential([envoy.url], 2, tenant=tenants[3])) == Tally({200: 2})
    m = counter.metrics()
    assert m["trl_counter_memory_full_total"] == 2
    assert m["trl_counter_store_errors_total"] == 2
    assert m["trl_counter_memory_keys"] == 3

    # The tenants it holds still count exactly.
    r = run_sequential([envoy.url], 6, tenant=tenants[0])
    assert tally(r) == Tally({200: 4, 429: 2}), harness.summary(r)

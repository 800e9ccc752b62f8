"""Several instances of the filter in one Envoy, sharing one shared-data map
(`vm_id` "" and `root_id` "", as Istio leaves them, or one `vm_id` named
alike): each limits only its own. Two listeners with their own instance,
and two instances in one filter chain.

- Listener `a`: domain A, tenant `acme` limited to 3 per minute; listener
  `b`: domain B, 100 per minute. After A admitted 3 of acme's requests and
  refused 7, B admits all 10 of acme's next requests. (Before instances were
  kept apart, B refused all 10 from A's cached refusal.)
- Listener `a-again`: an instance with A's very configuration shares A's
  state, as documented: acme's refusal cached by `a` refuses there without a
  call (domain A's counter does not move).
- Listener `chain`: domain C (100 per minute), then domain D (3 per minute)
  in the same chain. D refuses 7 of 10; C still asks the service for every
  one of them (its counter reaches 10), instead of refusing from D's cached
  refusal.
"""

from __future__ import annotations

from collections import Counter

import pytest

import harness
import listeners
from harness import ensure_window_room, redis_key, tally

SMALL = {"x-tenant-id": {"default": {"perminute": 3}}}
LARGE = {"x-tenant-id": {"default": {"perminute": 100}}}
N = 10
TENANT = "acme"


def statuses(url: str, n: int) -> Counter:
    return tally(harness.send(url, TENANT) for _ in range(n))


@pytest.mark.parametrize("vm_id", ["", "tenant_ratelimit"], ids=["vm_id-empty", "vm_id-shared"])
def test_each_instance_limits_only_its_own(stack, vm_id):
    gen = {name: stack.generate(limits, domain=harness.unique(name))
           for name, limits in (("a", SMALL), ("b", LARGE), ("c", LARGE), ("d", SMALL))}
    redis = stack.redis()
    rls = stack.ratelimit(redis, *gen.values())
    upstream = stack.upstream()

    def instance(name: str) -> dict:
        cfg = gen[name].plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS)
        return listeners.wasm_filter(cfg, vm_id=vm_id)

    envoy = listeners.start(stack, rls, upstream, {
        "a": [instance("a")],
        "b": [instance("b")],
        "a-again": [instance("a")],
        "chain": [instance("c"), instance("d")],
    })
    ensure_window_room(60, 30)
    urls = envoy.urls

    at_a = statuses(urls["a"], N)
    at_b = statuses(urls["b"], N)
    at_a_again = statuses(urls["a-again"], 2)
    in_chain = statuses(urls["chain"], N)
    counted = {name: redis.get_int(redis_key(g.domain, "minute", TENANT)) or 0
               for name, g in gen.items()}
    print(f"vm_id={vm_id!r}: a {dict(at_a)}, b {dict(at_b)}, a-again {dict(at_a_again)}, "
          f"chain {dict(in_chain)}; counted by the service {counted}")

    assert at_a == Counter({200: 3, 429: 7})
    assert at_b == Counter({200: N}), "B refused from A's state"
    # A's cached refusal, shared by the instance with A's configuration:
    # no call (the service counted 3 admitted and the refused fourth).
    assert at_a_again == Counter({429: 2})
    assert counted["a"] == 4 and counted["b"] == N
    # D refuses 7; C asked the service about every request.
    assert in_chain == Counter({200: 3, 429: 7})
    assert counted["c"] == N and counted["d"] == 4, counted
    c = envoy.filter_counters()
    assert c["rls_error"] == 0 and c["failure_mode_allowed"] == 0, c

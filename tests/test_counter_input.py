"""ratelimit-counter's answers to what clients send, bad input included,
through a raw gRPC client (tests/grpc_rls.py): drop-in answers where
envoyproxy/ratelimit has them, marks, and nothing counted wrongly."""

from __future__ import annotations

import pytest

from counter import Counter
from grpc_rls import call, request_bytes
from harness import ensure_window_room, unique

OK, OVER = 1, 2
LIMITS = {"x-tenant-id": {"default": {"perminute": 3},
                          "gold": {"header_value": ["g"], "perhour": 5}}}


def minute(tenant: str, hits: int | None = None):
    d = [("generic_key", "per_minute"), ("tenant", tenant)]
    return d if hits is None else (d, hits)


def counter_on(stack, store: str):
    """A counter serving LIMITS from `store` (memory, or a Redis of its
    own, returned too), with room left in the current minute."""
    redis = stack.redis() if store == "redis" else None
    counter = Counter(stack, {"d": LIMITS},
                      store=redis.url if redis else "memory")
    ensure_window_room(60, 15)
    return redis, counter


def test_drop_in_answers_and_bad_input(stack):
    counter = Counter(stack, {"d": LIMITS}, store="memory")
    port = counter.grpc_port
    ensure_window_room(60, 15)
    t = unique("tenant")
    # An unknown domain, and a descriptor no rule matches (gold has no
    # per-minute limit): OK, no limit.
    for domain, desc in [("nope", minute(t)), ("d", minute("g"))]:
        status, r, _ = call(port, request_bytes(domain, [desc]))
        assert status == 0 and r["overall_code"] == OK
        assert r["statuses"] == [{"code": OK, "limit": None, "remaining": 0}]
    # hits_addend 2^32 - 1: refused, and nothing counted.
    status, r, _ = call(port, request_bytes("d", [minute(t)], hits_addend=2**32 - 1))
    assert status == 0 and r["overall_code"] == OVER
    status, r, _ = call(port, request_bytes("d", [minute(t)]))
    assert r["statuses"][0] == {"code": OK, "limit": 3, "remaining": 2}
    # A descriptor's own hits_addend 0 checks without counting.
    status, r, _ = call(port, request_bytes("d", [minute(t, 0)]))
    assert r["statuses"][0]["remaining"] == 2
    # An oversized call: INVALID_ARGUMENT, nothing counted.
    status, r, message = call(port, request_bytes("d", [minute(t)] * 5000))
    assert status == 3 and "5000 descriptors" in message, (status, message)
    # A malformed message: an error status, the counter still answers.
    status, r, _ = call(port, b"\x12\xff\xff\xff\xff\x0f garbage")
    assert status not in (0, -1), status
    status, r, _ = call(port, request_bytes("d", [minute(t)]))
    assert r["statuses"][0]["remaining"] == 1
    assert counter.process.alive()
    m = counter.metrics()
    assert m["trl_counter_bad_calls_total"] == 1


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_marks_split_a_call_into_requests_decided_apart(stack, store):
    redis, counter = counter_on(stack, store)
    t = unique("tenant")
    mark = [("trl.request", "")]
    # Three requests of the same tenant in one call: 3 + 1 hits would pass
    # the limit of 3, so the second (1 hit) is admitted, the third (1) not.
    call_ = [mark, minute(t, 2), mark, minute(t, 1), mark, minute(t, 1)]
    status, r, _ = call(counter.grpc_port, request_bytes("d", call_))
    assert status == 0
    codes = [s["code"] for s in r["statuses"]]
    assert codes == [OK, OK, OK, OK, OK, OVER], r
    assert r["overall_code"] == OVER
    assert r["statuses"][3]["remaining"] == 0
    if redis is not None:
        # Redis holds what was admitted, 2 + 1, with its window's expiry.
        keys = [k for k in redis.keys("trl:*") if t in k]
        assert len(keys) == 1 and redis.get_int(keys[0]) == 3, keys
        assert 0 < redis.ttl(keys[0]) <= 60
        # The minute is full: a check of 0 hits is refused, by the counter's
        # over-limit cache, and nothing is added.
        status, r, _ = call(counter.grpc_port, request_bytes("d", [minute(t, 0)]))
        assert status == 0 and [s["code"] for s in r["statuses"]] == [OVER], r
        assert counter.metrics().get("trl_counter_cache_refused_total", 0) == 1
        assert redis.get_int(keys[0]) == 3


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_push_is_counted_whole_past_the_limit_and_its_overshoot_shown(stack, store):
    redis, counter = counter_on(stack, store)
    t = unique("tenant")
    mark, push = [("trl.request", "")], [("trl.request", "push")]
    # 2 admitted, then a request of 2 refused whole (over the 3), a push of
    # 2 counted whole whatever the limit: 4 of 3, 1 past it.
    call_ = [mark, minute(t, 2), mark, minute(t, 2), push, minute(t, 2)]
    status, r, _ = call(counter.grpc_port, request_bytes("d", call_))
    assert status == 0
    assert [s["code"] for s in r["statuses"]] == [OK, OK, OK, OVER, OK, OVER], r
    assert r["statuses"][5]["remaining"] == 0
    # Alone in its call, onto a full window (which the Redis store's
    # over-limit cache remembers now): counted too, every hit past it.
    status, r, _ = call(counter.grpc_port, request_bytes("d", [push, minute(t, 3)]))
    assert status == 0 and [s["code"] for s in r["statuses"]] == [OK, OVER], r
    # An ordinary request is still refused, nothing added.
    status, r, _ = call(counter.grpc_port, request_bytes("d", [minute(t)]))
    assert [s["code"] for s in r["statuses"]] == [OVER], r
    if redis is not None:
        keys = [k for k in redis.keys("trl:*") if t in k]
        assert len(keys) == 1 and redis.get_int(keys[0]) == 2 + 2 + 3, keys
    assert counter.group_total("overshoot_hits", "d") == 1 + 3
    assert counter.group_total("admitted", "d") == 3


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_the_largest_call_is_decided_as_small_ones_are(stack, store):
    """2,048 requests in one call (the most descriptors a call may carry),
    4 of each of 512 tenants whose limit is 3: each tenant's first three
    admitted, the fourth refused, whatever the call's size."""
    redis, counter = counter_on(stack, store)
    tenants = [unique("tenant") for _ in range(512)]
    mark = [("trl.request", "")]
    descriptors = []
    for _ in range(4):
        for t in tenants:
            descriptors += [mark, minute(t, 1)]
    assert len(descriptors) == 4096
    status, r, _ = call(counter.grpc_port, request_bytes("d", descriptors))
    assert status == 0, status
    codes = [s["code"] for s in r["statuses"][1::2]]
    assert codes == [OK] * (3 * 512) + [OVER] * 512
    if redis is not None:
        ours = set(tenants)
        held = {k: redis.get_int(k) for k in redis.keys("trl:*")
                if any(part in ours for part in k.replace("{", ":").replace("}", ":").split(":"))}
        assert sorted(set(held.values())) == [3] and len(held) == 512, len(held)

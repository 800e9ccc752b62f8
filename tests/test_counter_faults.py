"""ratelimit-counter under store faults, on a real Redis: a key that holds
something else than a count fails its request alone, a call the counter
answered as failed is counted nowhere (Redis frozen past the deadline, then
thawed), and the over-limit cache follows a Redis that lost its counts
(FLUSHALL). Calls go straight to the counter (tests/grpc_rls.py)."""

from __future__ import annotations

from counter import Counter
from grpc_rls import call, request_bytes
from harness import ensure_window_room, unique, wait_until

OK, OVER, UNKNOWN = 1, 2, 0
UNAVAILABLE = 14
MARK = [("trl.request", "")]


def hour(tenant: str) -> list[tuple[str, str]]:
    return [("generic_key", "per_hour"), ("tenant", tenant)]


def _hour_key(redis, tenant: str) -> str:
    (key,) = [k for k in redis.keys("trl:*") if tenant in k]
    return key


def test_a_key_that_holds_no_count_fails_its_request_alone(stack):
    team = {"x-tenant-id": {"default": {"perhour": 1000}}}
    redis = stack.redis()
    counter = Counter(stack, {"d": team}, store=redis.url, store_timeout_ms=1000)
    ensure_window_room(3600, 30)
    poisoned, other = unique("pv"), unique("other")
    assert call(counter.grpc_port, request_bytes("d", [hour(poisoned)]))[1]["overall_code"] == OK
    key = _hour_key(redis, poisoned)
    # What a push of 2^64-1 once left there: a float.
    redis.command("SET", key, "1.8446744073709552e+19")
    batched = request_bytes("d", [MARK, hour(poisoned), MARK, hour(other)])
    for n in (1, 2):
        status, answer, message = call(counter.grpc_port, batched)
        assert status == 0, (status, message)
        codes = [s["code"] for s in answer["statuses"]]
        assert codes == [OK, UNKNOWN, OK, OK], answer
        assert answer["overall_code"] == OK
        assert answer["statuses"][3]["remaining"] == 1000 - n
        # The other tenant charged once per call; the poisoned key untouched.
        assert redis.get_int(_hour_key(redis, other)) == n
        assert redis.command("GET", key) == "1.8446744073709552e+19"
    assert counter.metrics().get("trl_counter_store_bad_values_total") == 2
    # A call of the poisoned tenant alone fails whole, nothing written.
    status, _, message = call(counter.grpc_port, request_bytes("d", [hour(poisoned)]))
    assert status == UNAVAILABLE and "something else than a count" in message, (status, message)
    assert redis.command("GET", key) == "1.8446744073709552e+19"
    # A hash there: the same.
    redis.command("DEL", key)
    redis.command("HSET", key, "f", "1")
    status, answer, _ = call(counter.grpc_port, batched)
    assert status == 0 and [s["code"] for s in answer["statuses"]] == [OK, UNKNOWN, OK, OK], answer
    assert redis.get_int(_hour_key(redis, other)) == 3
    assert redis.command("TYPE", key) == "hash"


def test_a_call_answered_failed_is_counted_nowhere(stack):
    team = {"x-tenant-id": {"default": {"perhour": 1000}}}
    redis = stack.redis()
    counter = Counter(stack, {"d": team}, store=redis.url, store_timeout_ms=100)
    ensure_window_room(3600, 60)
    tenant = unique("frozen")
    message = request_bytes("d", [hour(tenant)])
    assert call(counter.grpc_port, message)[1]["overall_code"] == OK
    key = _hour_key(redis, tenant)
    redis.freeze()
    try:
        # 20 calls, each failed after the store's deadline (100 ms): Redis
        # frozen for longer than it, then thawed.
        statuses = [call(counter.grpc_port, message)[0] for _ in range(20)]
    finally:
        redis.thaw()
    assert statuses == [UNAVAILABLE] * 20, statuses
    admitted = 1

    def answers() -> bool:
        nonlocal admitted
        status, answer, _ = call(counter.grpc_port, message)
        if status == 0 and answer["overall_code"] == OK:
            admitted += 1
            return True
        return False

    # Once a call is answered again, Redis has run every call queued
    # before it (one connection, in order): the failed ones did nothing.
    wait_until(answers, "the counter answers again", process=counter.process)
    assert redis.get_int(key) == admitted, (redis.get_int(key), admitted)


def test_the_over_limit_cache_follows_a_flushall(stack):
    team = {"x-tenant-id": {"default": {"perhour": 5}}}
    redis = stack.redis()
    counter = Counter(stack, {"d": team}, store=redis.url, store_timeout_ms=1000)
    ensure_window_room(3600, 60)
    tenant = unique("full")
    message = request_bytes("d", [hour(tenant)])
    codes = [call(counter.grpc_port, message)[1]["overall_code"] for _ in range(6)]
    assert codes == [OK] * 5 + [OVER]
    cached = counter.metrics().get("trl_counter_cache_refused_total", 0)
    assert call(counter.grpc_port, message)[1]["overall_code"] == OVER
    assert counter.metrics().get("trl_counter_cache_refused_total", 0) == cached + 1
    # Redis loses every count: within the cache's bound on an entry's age
    # (1 s), the tenant is admitted again, counted from zero.
    redis.command("FLUSHALL")
    wait_until(lambda: call(counter.grpc_port, message)[1]["overall_code"] == OK,
               "the full tenant is admitted again after FLUSHALL", process=counter.process)
    assert redis.get_int(_hour_key(redis, tenant)) == 1

"""ratelimit-counter on Redis as managed services run it: TLS with a CA the
counter is given, mutual TLS, ACL users (REDIS_AUTH=user:password), and no
secret in anything it prints or serves."""

from __future__ import annotations

import subprocess
from collections import Counter as Tally

import requests

import harness
from counter import COUNTER_BIN, Counter, native_envoy
from harness import (COUNTING_TIMEOUT_MS, ensure_window_room, run_concurrent,
                     run_sequential, tally, unique, wait_until)
from redis_extra import TlsRedis, make_certs

LIMITS = {"x-tenant-id": {"default": {"perhour": 100}}}
PASSWORD = "s3cret-Pa55word-never-shown"
HOUR_ROOM_S = 120


def _counter(stack, gen, store, *args, env=None, wait_ready=True):
    return Counter(stack, {gen.domain: LIMITS}, store=store, extra_args=[str(a) for a in args],
                   env=env, store_timeout_ms=COUNTING_TIMEOUT_MS, wait_ready=wait_ready)


def _everything_it_shows(counter: Counter) -> str:
    """Its output, /readyz and /metrics."""
    pages = [counter.readyz_page().text] + [
        requests.get(f"{counter.http_url}{p}", timeout=3).text for p in ("/metrics", "/healthz")]
    return "\n".join([counter.process.log_text(), *pages])


def test_tls_redis_with_an_acl_user_counts_exactly_through_two_envoys(stack):
    certs = make_certs(stack.workdir / "tls")
    redis = TlsRedis(stack, certs, users={"rl": PASSWORD})
    gen = stack.generate(LIMITS, service="counter")
    counter = _counter(stack, gen, redis.url(),
                       "--redis-ca", certs.ca, env={"REDIS_AUTH": f"rl:{PASSWORD}"})
    upstream = stack.upstream()
    envoys = [native_envoy(stack, gen, counter.grpc_port, upstream, name=f"envoy-{i}")
              for i in range(2)]
    ensure_window_room(3600, HOUR_ROOM_S)
    tenant = unique("tenant")
    r = run_concurrent([e.url for e in envoys], 150, clients=16, tenant=tenant)
    assert tally(r) == Tally({200: 100, 429: 50}), harness.summary(r)
    assert list(redis.held(tenant).values()) == [100]
    assert PASSWORD not in _everything_it_shows(counter)


def test_mutual_tls_to_redis_needs_the_client_certificate(stack):
    certs = make_certs(stack.workdir / "tls")
    redis = TlsRedis(stack, certs, auth_clients="yes")
    gen = stack.generate(LIMITS, service="counter")
    store = redis.url()

    # Without a client certificate: not ready, and it says what is missing.
    without = _counter(stack, gen, store, "--redis-ca", certs.ca, wait_ready=False)
    wait_until(lambda: "not ready until it answers" in without.process.log_text(),
               "the counter's reason", process=without.process)
    assert without.readyz() == 503
    without.stop()

    counter = _counter(stack, gen, store, "--redis-ca", certs.ca,
                       "--redis-cert", certs.client_cert, "--redis-key", certs.client_key)
    envoy = native_envoy(stack, gen, counter.grpc_port, stack.upstream())
    ensure_window_room(3600, HOUR_ROOM_S)
    tenant = unique("tenant")
    r = run_sequential([envoy.url], 103, tenant=tenant)
    assert tally(r) == Tally({200: 100, 429: 3}), harness.summary(r)
    assert list(redis.held(tenant).values()) == [100]


def test_a_wrong_ca_is_refused_saying_so(stack):
    certs = make_certs(stack.workdir / "tls")
    redis = TlsRedis(stack, certs)
    gen = stack.generate(LIMITS, service="counter")
    counter = _counter(stack, gen, redis.url(),
                       "--redis-ca", certs.other_ca, wait_ready=False)
    wait_until(lambda: "not ready until it answers" in counter.process.log_text(),
               "the counter's reason", process=counter.process)
    log = counter.process.log_text()
    assert "the Redis server's certificate is not signed by a CA this counter trusts" in log, log
    assert counter.readyz() == 503
    assert counter.process.alive()


def test_a_wrong_password_says_why_without_printing_it(stack):
    certs = make_certs(stack.workdir / "tls")
    redis = TlsRedis(stack, certs, users={"rl": PASSWORD})
    gen = stack.generate(LIMITS, service="counter")
    wrong = "Wr0ng-pa55word-never-shown"
    # In the URL (shown redacted) and in REDIS_AUTH, both wrong.
    for store, env in [(redis.url("rl", wrong), None),
                       (redis.url(), {"REDIS_AUTH": f"rl:{wrong}"})]:
        counter = _counter(stack, gen, store, "--redis-ca", certs.ca, env=env,
                           wait_ready=False)
        wait_until(lambda: "not ready until it answers" in counter.process.log_text(),
                   "the counter's reason", process=counter.process)
        log = counter.process.log_text()
        assert "Password authentication failed" in log, log
        shown = _everything_it_shows(counter)
        assert wrong not in shown.replace(" ".join(counter.argv), "")
        if env is None:
            assert redis.url("rl", "***") in log, log
        counter.stop()


def test_a_store_it_cannot_read_exits_listing_the_forms(stack):
    limits = stack.workdir / "limits"
    limits.mkdir()
    (limits / "d.json").write_text('{"x-tenant-id": {"default": {"perhour": 1}}}')
    for store, why in [("redis:/127.0.0.1:6379", "not memory and not a URL"),
                       ("redis://u:hunter2@127.0.0.1", "is not HOST:PORT"),
                       ("valkey://127.0.0.1:6379", "unknown scheme")]:
        p = subprocess.run([str(COUNTER_BIN), "--limits", str(limits), "--store", store],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode != 0
        for form in ("memory", "rediss://", "rediss-cluster://", "redis-sentinel://"):
            assert form in p.stderr, p.stderr
        assert why in p.stderr, p.stderr
        assert "hunter2" not in p.stderr

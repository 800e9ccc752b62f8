"""ratelimit-counter on Redis Sentinel: the master found by its name, a
failover followed without a restart, and exact counts after it."""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally

import harness
from counter import Counter, native_envoy
from harness import (COUNTING_TIMEOUT_MS, ensure_window_room, run_concurrent, send, tally,
                     unique, wait_until)
from redis_extra import SentinelGroup

LIMITS = {"x-tenant-id": {"default": {"perhour": 50}}}
HOUR_ROOM_S = 180
PACE_S = 0.05


def test_sentinel_counts_exactly_and_follows_a_failover_without_a_restart(stack):
    group = SentinelGroup(stack)
    gen = stack.generate(LIMITS, service="counter")
    counter = Counter(stack, {gen.domain: LIMITS}, store=group.url,
                      store_timeout_ms=COUNTING_TIMEOUT_MS)
    envoy = native_envoy(stack, gen, counter.grpc_port, stack.upstream())
    ensure_window_room(3600, HOUR_ROOM_S)

    before = unique("tenant")
    r = run_concurrent([envoy.url], 60, clients=8, tenant=before)
    assert tally(r) == Tally({200: 50, 429: 10}), harness.summary(r)
    assert list(group.master.held(before).values()) == [50]
    # Replicated before the master goes (WAIT: what asynchronous
    # replication may not yet have done when a master dies).
    assert group.master.command("WAIT", 1, 5000) == 1
    assert list(group.replica.held(before).values()) == [50]

    # Paced calls while the master is killed, each of a tenant of its own
    # (so that each one admitted writes a key of its own).
    paced = unique("tenant")
    statuses: list[int] = []
    stop = threading.Event()

    def pace():
        while not stop.is_set():
            statuses.append(send(envoy.url, tenant=f"{paced}-{len(statuses)}").status)
            time.sleep(PACE_S)

    t = threading.Thread(target=pace)
    t.start()
    try:
        wait_until(lambda: len(statuses) >= 10, "paced calls before the kill")
        old_master = group.master.port
        group.master.process.kill()
        wait_until(lambda: group.master_port() == group.replica.port,
                   "the sentinel promotes the replica", deadline_s=60)
        promoted = set(group.replica.held(paced))
        # The counter finds the new master by itself (no restart): paced
        # calls are counted there.
        wait_until(lambda: set(group.replica.held(paced)) - promoted,
                   "a paced call counted on the new master", process=counter.process)
    finally:
        stop.set()
        t.join()
    assert group.master_port() != old_master
    assert counter.process.alive()
    # Every paced call answered (the filter fails open while no master
    # answers); none lost.
    assert set(statuses) <= {200, 429}, Tally(statuses)

    # What was admitted before the failover, and replicated, still counts.
    r = run_concurrent([envoy.url], 5, clients=2, tenant=before)
    assert tally(r) == Tally({429: 5}), harness.summary(r)
    # After it: exact.
    after = unique("tenant")
    r = run_concurrent([envoy.url], 60, clients=8, tenant=after)
    assert tally(r) == Tally({200: 50, 429: 10}), harness.summary(r)
    assert list(group.replica.held(after).values()) == [50]
    wait_until(counter.ready, "the counter ready on the new master", process=counter.process)

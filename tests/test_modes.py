"""Lease and sync modes against a real fleet: 3 Envoys with 2 workers each,
one ratelimit service, one Redis, 16 concurrent clients.

Every run stays inside one clock-aligned window of the quota's unit
(`ensure_window_room`), as tests/test_exactly_100.py does: a run straddling
a window boundary would rightly get a quota in each window.

The bounds asserted are the README's ("Choosing a mode")."""

from __future__ import annotations

import concurrent.futures
from collections import Counter

import counter
import harness
from harness import ensure_window_room, run_concurrent, tally, unique, wait_until

QUOTA = 1500
LIMITS = {"x-tenant-id": {"default": {"perminute": QUOTA}}}
MAX_BATCH = 50
ENVOYS = 3
CLIENTS = 16
# Requests per run: enough to use the quota up and be refused after it.
REQUESTS = QUOTA + 600
# A run of REQUESTS takes a few seconds here; keep all of it in one minute.
MINUTE_ROOM_S = 40
CALLS = 'ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}'


def lease_local(max_batch: int = MAX_BATCH, **groups) -> dict:
    local = {"enabled": True, "mode": "lease", "lease": {"max_batch": max_batch}}
    if groups:
        local["groups"] = {g: {"mode": m} for g, m in groups.items()}
    return local


def lease_fleet(stack, limits=LIMITS, local=None, envoys=ENVOYS, timeout_ms=harness.COUNTING_TIMEOUT_MS):
    return stack.fleet(limits, envoys=envoys, timeout_ms=timeout_ms,
                       local=local or lease_local())


def group_counters(fleet, group: str = "default") -> Counter:
    prefix = f"group.{group}."
    return Counter({k[len(prefix):]: v for k, v in fleet.counters().items() if k.startswith(prefix)})


def service_calls(fleet) -> int:
    if isinstance(fleet.ratelimit, counter.Counter):
        return int(fleet.ratelimit.metrics().get("trl_counter_calls_total", 0))
    return int(fleet.ratelimit.settled_metrics().get(CALLS, 0))


def minute_key(fleet, tenant: str, t: float) -> str:
    """The service's Redis key for the tenant's minute window at `t`."""
    if isinstance(fleet.ratelimit, counter.Counter):
        return harness.counter_key(fleet.domain, "minute", tenant, t=t)
    return harness.redis_key(fleet.domain, "minute", tenant, t=t)


def lease_undershoot_bound(envoys: int, max_batch: int = MAX_BATCH) -> int:
    """README: one batch crossing the limit loses at most max_batch - 1 tokens
    fleet-wide; each Envoy holds at most 1.5 x max_batch unspent."""
    return (max_batch - 1) + envoys * (3 * max_batch // 2)


def test_lease_admits_at_most_the_quota_with_few_calls(stack):
    fleet = lease_fleet(stack)
    tenant = unique("lease")
    ensure_window_room(60, MINUTE_ROOM_S)
    calls_before = service_calls(fleet)

    results = run_concurrent(fleet.urls, REQUESTS, clients=CLIENTS, tenant=tenant)
    t = tally(results)
    assert set(t) <= {200, 429}, harness.summary(results)
    admitted = t[200]
    assert admitted <= QUOTA, harness.summary(results)
    # Every Envoy kept sending until it was refused, so no lease was left
    # unspent but the last ones: the undershoot stays within the bound.
    assert admitted >= QUOTA - lease_undershoot_bound(ENVOYS), harness.summary(results)
    assert window_of(results) == 1

    g = group_counters(fleet)
    assert g["admitted"] == admitted, g
    assert g["lease.taken"] >= 1 and g["lease.spent"] > 0, g
    # The service counted every granted batch; its counter never admits past
    # the quota, and every token spent came from it.
    assert g["lease.tokens"] <= QUOTA, g
    # Redis holds every batch asked for, granted or refused (the service
    # counts a refused batch too: STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT is
    # off), while the run was inside this window; the counter, the batches
    # granted only (a refused request adds nothing).
    key = minute_key(fleet, tenant, results[0].started)
    refused_tokens = 0 if stack.service == "counter" else g["lease.refused_tokens"]
    assert fleet.redis.get_int(key) == g["lease.tokens"] + refused_tokens, g
    calls = service_calls(fleet) - calls_before
    print(f"lease: {admitted} of {QUOTA} admitted, {REQUESTS} requests, {calls} service calls "
          f"({calls / REQUESTS:.3f} per request), counters {dict(g)}")
    # One call per request in exact mode; far fewer with leases.
    assert calls < REQUESTS / 4, (calls, dict(g))


def window_of(results) -> int:
    """How many minute windows the run's requests were sent or answered in
    (the service reads its clock somewhere in between)."""
    return len({harness.window_start(60, t) for r in results
                for t in (r.started, harness.answered_at(r))})


def test_lease_gives_a_tenant_pinned_to_one_envoy_its_whole_quota(stack):
    fleet = lease_fleet(stack)
    tenant = unique("pinned")
    ensure_window_room(60, MINUTE_ROOM_S)

    results = run_concurrent(fleet.urls[:1], REQUESTS, clients=CLIENTS, tenant=tenant)
    t = tally(results)
    assert set(t) <= {200, 429}, harness.summary(results)
    # One Envoy spends every token it holds before it is refused: all that
    # is lost is what one batch crossing the limit costs.
    print(f"pinned lease: {t[200]} of {QUOTA} admitted through one Envoy of {ENVOYS}")
    assert QUOTA - (MAX_BATCH - 1) <= t[200] <= QUOTA, harness.summary(results)
    assert window_of(results) == 1


def warm_then_outage(fleet: harness.Fleet) -> tuple[Counter, Counter]:
    """300 requests of one tenant with the service up (the rate is known,
    leases are held or hits synced), then 600 with it stopped, all admitted:
    the group's counters before and after the outage."""
    tenant = unique("outage")
    ensure_window_room(60, MINUTE_ROOM_S)
    warm = run_concurrent(fleet.urls, 300, clients=CLIENTS, tenant=tenant)
    assert tally(warm) == Counter({200: 300}), harness.summary(warm)
    before = group_counters(fleet)

    fleet.ratelimit.stop()
    results = run_concurrent(fleet.urls, 600, clients=CLIENTS, tenant=tenant)
    assert tally(results) == Counter({200: 600}), harness.summary(results)
    return before, group_counters(fleet)


def test_lease_during_a_service_outage_spends_what_is_left_then_fails_open(stack):
    fleet = lease_fleet(stack)
    before, after = warm_then_outage(fleet)
    spent = after["lease.spent"] - before["lease.spent"]
    failed_open = after["failed_open"] - before["failed_open"]
    # Every request was admitted either with a token left or failing open.
    assert spent + failed_open == 600, (dict(before), dict(after))
    assert failed_open > 0 and after["lease.failed"] > before["lease.failed"], dict(after)
    print(f"outage: {spent} admitted from leases left, {failed_open} failed open, "
          f"{after['lease.failed'] - before['lease.failed']} lease calls failed")

    fleet.ratelimit.start()
    probe = unique("probe")
    wait_until(lambda: harness.send(fleet.urls[0], probe).status == 200
               and group_counters(fleet)["lease.taken"] > after["lease.taken"],
               "the Envoys take leases from the restarted service")


# ------------------------------------------------------------------ sync

SYNC_INTERVAL_MS = 100
MAX_UNSYNCED = 50


def sync_local(**groups) -> dict:
    local = {"enabled": True, "mode": "sync",
             "sync": {"interval_ms": SYNC_INTERVAL_MS, "max_unsynced": MAX_UNSYNCED}}
    if groups:
        local["groups"] = {g: {"mode": m} for g, m in groups.items()}
    return local


def sync_overshoot_bound(envoys: int, max_unsynced: int = MAX_UNSYNCED) -> int:
    """README: while one Envoy fills the limit, each other one may hold
    max_unsynced hits the service has not seen, for a stale view and for a
    push under way."""
    return 2 * (envoys - 1) * max_unsynced


def test_sync_admits_at_most_the_quota_plus_the_bound_with_few_calls(stack):
    fleet = stack.fleet(LIMITS, envoys=ENVOYS, timeout_ms=harness.COUNTING_TIMEOUT_MS,
                        local=sync_local())
    tenant = unique("sync")
    ensure_window_room(60, MINUTE_ROOM_S)
    calls_before = service_calls(fleet)

    results = run_concurrent(fleet.urls, REQUESTS, clients=CLIENTS, tenant=tenant)
    t = tally(results)
    assert set(t) <= {200, 429}, harness.summary(results)
    admitted = t[200]
    assert admitted <= QUOTA + sync_overshoot_bound(ENVOYS), harness.summary(results)
    assert window_of(results) == 1
    g = group_counters(fleet)
    calls = service_calls(fleet) - calls_before
    # Every admitted hit reached the service: pushed, or asked for.
    key = minute_key(fleet, tenant, results[0].started)
    if isinstance(fleet.ratelimit, counter.Counter):
        # The counter counts a push whole whatever the limit, and a request
        # that asks only if it fits: Redis holds exactly what was admitted,
        # and its overshoot metric what was admitted past the quota.
        overshoot = f'trl_counter_overshoot_hits_total{{domain="{fleet.domain}",group="default"}}'
        wait_until(lambda: (fleet.redis.get_int(key) or 0) == admitted
                   and fleet.ratelimit.metrics().get(overshoot, 0) == max(0, admitted - QUOTA),
                   "every admitted hit is counted in Redis, the overshoot in the metric")
    else:
        wait_until(lambda: (fleet.redis.get_int(key) or 0) >= admitted,
                   "every admitted hit is counted in Redis")
    print(f"sync: {admitted} of {QUOTA} admitted (overshoot {admitted - QUOTA}, bound "
          f"{sync_overshoot_bound(ENVOYS)}), {REQUESTS} requests, {calls} service calls "
          f"({calls / REQUESTS:.3f} per request), Redis {fleet.redis.get_int(key)}, "
          f"counters {dict(g)}")
    assert g["sync.local"] > 0 and g["sync.pushes"] > 0, g
    assert calls < REQUESTS / 4, (calls, dict(g))


def test_sync_gives_a_tenant_pinned_to_one_envoy_its_whole_quota(stack):
    fleet = stack.fleet(LIMITS, envoys=ENVOYS, timeout_ms=harness.COUNTING_TIMEOUT_MS,
                        local=sync_local())
    tenant = unique("pinned")
    ensure_window_room(60, MINUTE_ROOM_S)

    results = run_concurrent(fleet.urls[:1], REQUESTS, clients=CLIENTS, tenant=tenant)
    t = tally(results)
    assert set(t) <= {200, 429}, harness.summary(results)
    print(f"pinned sync: {t[200]} of {QUOTA} admitted through one Envoy of {ENVOYS}")
    # Alone, an Envoy's view plus its own pending hits is the whole count.
    assert t[200] == QUOTA, harness.summary(results)
    assert window_of(results) == 1


def test_sync_during_a_service_outage_admits_up_to_max_unsynced_then_fails_open(stack):
    fleet = stack.fleet(LIMITS, envoys=ENVOYS, timeout_ms=harness.COUNTING_TIMEOUT_MS,
                        local=sync_local())
    before, after = warm_then_outage(fleet)
    local = after["sync.local"] - before["sync.local"]
    failed_open = after["failed_open"] - before["failed_open"]
    assert local + failed_open == 600, (dict(before), dict(after))
    # Each Envoy admits at most max_unsynced hits the service has not seen.
    assert local <= ENVOYS * MAX_UNSYNCED, dict(after)
    assert failed_open > 0, dict(after)
    wait_until(lambda: group_counters(fleet)["sync.failed"] > before["sync.failed"],
               "a failed push is counted")
    print(f"sync outage: {local} admitted locally, {failed_open} failed open")


# ------------------------------------------------------------------ mixed

MIXED_QUOTA = 600
MIXED_LIMITS = {"x-tenant-id": {
    "default": {"perminute": MIXED_QUOTA},
    "synced": {"perminute": MIXED_QUOTA, "header_value": ["tenant-sync"]},
    "exact": {"perminute": MIXED_QUOTA, "header_value": ["tenant-exact"]},
}}


def test_one_group_per_mode_in_the_same_envoys_at_once(stack):
    local = {"enabled": True, "mode": "lease", "lease": {"max_batch": MAX_BATCH},
             "sync": {"interval_ms": SYNC_INTERVAL_MS, "max_unsynced": MAX_UNSYNCED},
             "groups": {"synced": {"mode": "sync"}, "exact": {"mode": "exact"}}}
    fleet = stack.fleet(MIXED_LIMITS, envoys=ENVOYS, timeout_ms=harness.COUNTING_TIMEOUT_MS,
                        local=local)
    lease_tenant = unique("lease")
    tenants = [lease_tenant, "tenant-sync", "tenant-exact"]
    ensure_window_room(60, MINUTE_ROOM_S)
    n = MIXED_QUOTA + 300
    with concurrent.futures.ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        futures = [(tenants[i % 3], pool.submit(harness.send, fleet.urls[i // 3 % ENVOYS],
                                                 tenants[i % 3], None, 10.0, i // 3 % ENVOYS))
                   for i in range(3 * n)]
        by_tenant = {t: Counter() for t in tenants}
        windows = set()  # minute windows the requests were sent or answered in
        for tenant, f in futures:
            r = f.result()
            by_tenant[tenant][r.status] += 1
            windows.add(harness.window_start(60, r.started))
            windows.add(harness.window_start(60, harness.answered_at(r)))
    assert len(windows) == 1
    for t, c in by_tenant.items():
        assert set(c) <= {200, 429}, (t, c)
    lease, synced, exact = (by_tenant[t][200] for t in tenants)
    print(f"mixed: lease {lease}, sync {synced}, exact {exact} of {MIXED_QUOTA} each")
    assert exact == MIXED_QUOTA, by_tenant
    assert MIXED_QUOTA - lease_undershoot_bound(ENVOYS) <= lease <= MIXED_QUOTA, by_tenant
    assert synced <= MIXED_QUOTA + sync_overshoot_bound(ENVOYS), by_tenant
    leased, syncs = group_counters(fleet, "default"), group_counters(fleet, "synced")
    exacts = group_counters(fleet, "exact")
    assert leased["lease.spent"] > 0 and leased["sync.local"] == 0, leased
    assert syncs["sync.local"] > 0 and syncs["lease.spent"] == 0, syncs
    assert exacts["admitted"] == MIXED_QUOTA and exacts["lease.spent"] == exacts["sync.local"] == 0

"""An upgrade and a rollback of the .wasm under traffic, the way a control
plane rolls it: the previous version's module (built from git history by
`make previous-build`, PREVIOUS_COMMIT) replaced through ECDS by this one,
then put back, while a client keeps sending requests.

What docs/upgrading.md says, checked here: every window's count lives in
Redis, so a tenant's minute quota holds exactly across both swaps; nothing
fails, traps or is lost; and the shared-data slots (over-limit cache, sync
views and unpushed hits, leases) are kept when both modules read the same
slot layout, or taken as empty when they do not. Which of the two holds for
these two builds is read from each one's source (the slot layout version in
filter/src/local/slot.rs), and the test asserts that case.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from pathlib import Path

import pytest

import harness
from ecds import EcdsEnvoy
from faults import Traffic, delta, failed_open, fresh_tenants
from harness import ensure_window_room, run_sequential, unique, wait_until, window_start

PREVIOUS_WASM = Path(os.environ.get("TRL_PREVIOUS_WASM", ""))
PREVIOUS_SRC = Path(os.environ.get("TRL_PREVIOUS_SRC", ""))
PREVIOUS_COMMIT = os.environ.get("TRL_PREVIOUS_COMMIT", "?")

# Per-minute quotas, one group per piece of state the table speaks of.
CAPPED_QUOTA = 4      # exact mode: over its quota before the first swap (over-limit cache)
EXACT_QUOTA = 30      # exact mode: its quota used up across both swaps
SYNC_QUOTA = 30       # sync mode: views and unpushed hits
LEASE_QUOTA = 30      # lease mode: lease tokens
LEASE_MAX_BATCH = 5
SYNC_MAX_UNSYNCED = 10
# Every request of the run lands in one minute window (windows are clock
# aligned); the run takes about 10 s here.
MINUTE_ROOM_S = 45
# Requests per tenant and phase (old, new, old again) before the last one
# uses what is left of each quota.
PER_PHASE = 8
VM_CREATED = "wasm.envoy.wasm.runtime.v8.created"
# What Envoy logs when a wasm VM traps or the module panics.
TRAP_MARKERS = ("Uncaught", "RuntimeError", "panicked", "wasm trap", "unreachable",
                "Function: proxy_on", "Plugin configured to fail closed")
LAYOUT_VERSION = re.compile(r"^const VERSION: u8 = (\d+);", re.M)


def slot_layout_version(src: Path) -> int:
    """The slot layout version a module built from `src` writes and reads."""
    path = src / "filter" / "src" / "local" / "slot.rs"
    m = LAYOUT_VERSION.search(path.read_text()) if path.exists() else None
    assert m, f"no `const VERSION: u8 = N;` (the slot layout version) in {path}"
    return int(m.group(1))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def limits(capped: str, sync: str, lease: str) -> dict:
    return {"x-tenant-id": {
        "default": {"perminute": EXACT_QUOTA},
        "capped": {"perminute": CAPPED_QUOTA, "header_value": [capped]},
        "synced": {"perminute": SYNC_QUOTA, "header_value": [sync]},
        "leased": {"perminute": LEASE_QUOTA, "header_value": [lease]},
    }}


LOCAL = {"enabled": True,
         "lease": {"max_batch": LEASE_MAX_BATCH},
         "sync": {"interval_ms": 100, "max_unsynced": SYNC_MAX_UNSYNCED},
         "groups": {"synced": {"mode": "sync"}, "leased": {"mode": "lease"}}}


def group(counters: Counter, name: str) -> Counter:
    prefix = f"group.{name}."
    return Counter({k[len(prefix):]: v for k, v in counters.items() if k.startswith(prefix)})


@pytest.fixture
def previous_wasm() -> Path:
    if not PREVIOUS_WASM.is_file():
        pytest.fail(f"no previous module at {PREVIOUS_WASM!s}: run `make previous-build` "
                    "(make integration does)")
    return PREVIOUS_WASM


def test_upgrade_and_rollback_under_traffic_hold_every_quota(stack, previous_wasm):
    new_wasm = harness.WASM
    assert sha256(previous_wasm) != sha256(new_wasm), (
        f"the module of {PREVIOUS_COMMIT} is this one, byte for byte: Envoy would keep its VMs "
        "and nothing would be replaced (set PREVIOUS_COMMIT to an earlier release)")
    old_layout, new_layout = slot_layout_version(PREVIOUS_SRC), slot_layout_version(harness.REPO)
    kept = old_layout == new_layout

    capped, synced, leased, exact = (unique(p) for p in ("capped", "synced", "leased", "exact"))
    gen = stack.generate(limits(capped, synced, leased), timeout_ms=harness.COUNTING_TIMEOUT_MS)
    config = gen.plugin_config(local=LOCAL)
    rls = stack.ratelimit(stack.redis(), gen)
    envoy = EcdsEnvoy(stack, config, rls, stack.upstream(), wasm_path=previous_wasm)
    ecds = envoy.ecds_stats()
    assert ecds.get("update_success", 0) == 1 and ecds.get("config_fail", 0) == 0, ecds

    ensure_window_room(60, MINUTE_ROOM_S)
    window = window_start(60)
    before = Counter(envoy.filter_counters())
    mine: dict[str, list] = {t: [] for t in (capped, synced, leased, exact)}

    def phase() -> None:
        """PER_PHASE requests for each tenant, one after another (the capped
        tenant is over its quota after the first phase)."""
        for tenant, results in mine.items():
            results.extend(run_sequential([envoy.url], PER_PHASE, tenant=tenant))

    def swap(wasm: Path, what: str) -> None:
        applied = envoy.ecds_stats().get("update_success", 0)
        created = envoy.stats(VM_CREATED).get(VM_CREATED, 0)
        envoy.push(config, wasm_path=wasm)
        envoy.wait_stat("update_success", applied + 1, f"ECDS applies {what}")
        # A module with other bytes gets VMs of its own (the main thread's
        # and each worker's); they serve the next requests.
        wait_until(lambda: envoy.stats(VM_CREATED).get(VM_CREATED, 0) > created,
                   f"Envoy creates the VMs of {what}", process=envoy.process)
        mark = len(traffic)
        traffic.wait_for(lambda r: r.status != 0, 20, f"traffic answered after {what}",
                         since=mark)

    traffic = Traffic(lambda: [envoy.url], fresh_tenants("steady"), clients=1)
    try:
        traffic.wait_for(lambda r: r.status != 0, 20, "traffic answered by the previous module")
        phase()
        swap(new_wasm, f"this module ({new_layout=})")
        phase()
        swap(previous_wasm, f"the module of {PREVIOUS_COMMIT} ({old_layout=})")
        phase()
        # Then each tenant uses what is left of its quota, and is refused.
        for tenant, results in mine.items():
            results.extend(run_sequential([envoy.url], EXACT_QUOTA - 3 * PER_PHASE + 2,
                                          tenant=tenant))
    finally:
        steady = traffic.stop()
    assert window_start(60) == window, "the run outlasted its minute window"
    counted = delta(Counter(envoy.filter_counters()), before)
    print(f"\nprevious {PREVIOUS_COMMIT} {sha256(previous_wasm)[:12]} layout {old_layout}, "
          f"this {sha256(new_wasm)[:12]} layout {new_layout}: slots "
          f"{'kept' if kept else 'taken as empty'}")

    # Nothing failed, trapped or was lost; every request was counted once,
    # in its group, as admitted or refused (with the refusal's source).
    statuses = {t: [r.status for r in results] for t, results in mine.items()}
    assert not [r for r in steady if r.status != 200], harness.summary(steady)
    assert not [r for r in steady if failed_open(r)], harness.summary(steady)
    sent = Counter({"default": len(steady) + len(statuses[exact]), "capped": len(statuses[capped]),
                    "synced": len(statuses[synced]), "leased": len(statuses[leased])})
    for name, n in sent.items():
        g = group(counted, name)
        decided = g["admitted"] + sum(v for k, v in g.items() if k.startswith("refused."))
        assert decided == n, (name, n, dict(+g))
    assert sum(counted[k] for k in ("failure_mode_allowed", "failure_mode_denied", "rls_error",
                                    "local_error", "missing_tenant")) == 0, dict(+counted)
    ecds = envoy.ecds_stats()
    assert ecds.get("update_success", 0) == 3 and ecds.get("config_fail", 0) == 0 \
        and ecds.get("update_rejected", 0) == 0, ecds
    assert envoy.process.alive()
    log = envoy.process.log_text()
    trapped = [line for line in log.splitlines() if any(m in line for m in TRAP_MARKERS)]
    assert not trapped, "\n".join(trapped[:10])
    print(f"steady client: {len(steady)} requests, statuses {dict(harness.tally(steady))}")

    def key(tenant: str) -> int:
        return rls.redis.get_int(harness.redis_key(gen.domain, "minute", tenant, t=window)) or 0

    for tenant, s in statuses.items():
        assert set(s) <= {200, 429}, (tenant, harness.summary(mine[tenant]))
        # Every 200 comes first: once refused, a tenant stays refused in its window.
        assert s == sorted(s), (tenant, s)

    # Exact mode: the service's count in Redis is the quota, to the request.
    e = statuses[exact]
    assert e.count(200) == EXACT_QUOTA, harness.summary(mine[exact])
    assert key(exact) == EXACT_QUOTA + group(counted, "default")["refused.service"]

    # The over-limit cache: kept, the tenant refused before the first swap
    # is refused from it after both, with no call; taken as empty, the first
    # request after each swap asks the service again (refused there).
    c = group(counted, "capped")
    assert statuses[capped].count(200) == CAPPED_QUOTA, harness.summary(mine[capped])
    service_refusals = 1 if kept else 3
    assert c["refused.service"] == service_refusals, dict(c)
    assert c["refused.cache"] == len(statuses[capped]) - CAPPED_QUOTA - service_refusals, dict(c)
    assert key(capped) == CAPPED_QUOTA + service_refusals

    # Sync mode, one Envoy: its view plus its unpushed hits are the whole
    # count, so it admits exactly the quota when both are kept; dropped,
    # the hits not yet pushed were admitted but never counted (one push's
    # worth at most per swap).
    s = statuses[synced]
    if kept:
        assert s.count(200) == SYNC_QUOTA, harness.summary(mine[synced])
    else:
        assert SYNC_QUOTA <= s.count(200) <= SYNC_QUOTA + 2 * SYNC_MAX_UNSYNCED, s
    # Every hit it admitted reaches the service (pushed within an interval).
    wait_until(lambda: key(synced) >= SYNC_QUOTA, "the sync group's hits are pushed")

    # Lease mode: never more than the quota (the service counted every token
    # handed out); kept, what is lost is what the last lease crossing the
    # limit costs; dropped, up to one lease more per swap.
    g = group(counted, "leased")
    admitted = statuses[leased].count(200)
    lost = (LEASE_MAX_BATCH - 1) + (0 if kept else 2 * (3 * LEASE_MAX_BATCH // 2))
    assert LEASE_QUOTA - lost <= admitted <= LEASE_QUOTA, (admitted, dict(g))
    assert key(leased) == g["lease.tokens"] + g["lease.refused_tokens"], dict(g)

    print("per tenant (200s of the quota): "
          f"exact {e.count(200)}/{EXACT_QUOTA}, capped {statuses[capped].count(200)}/"
          f"{CAPPED_QUOTA} (service refusals {c['refused.service']}, cache "
          f"{c['refused.cache']}), sync {s.count(200)}/{SYNC_QUOTA}, lease {admitted}/"
          f"{LEASE_QUOTA} ({dict(g)})")

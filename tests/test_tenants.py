"""Tenants are independent; a named group's tenants get the group's limits, each
with its own counter; every other tenant falls through to the default rule,
also with its own counter."""

from __future__ import annotations

from collections import Counter

import expect
import harness
from harness import ensure_window_room, send, unique

DEFAULT = {"perhour": 5}
GROUP = {"perhour": 10}
SENT = 15  # per tenant: past every limit


def test_groups_and_default_rule_each_tenant_its_own_counter(stack):
    tenant_a, tenant_d = unique("tenant-a"), unique("tenant-d")  # default rule
    tenant_b, tenant_c = unique("tenant-b"), unique("tenant-c")  # group_1
    limits = {"x-tenant-id": {
        "default": DEFAULT,
        "group_1": {**GROUP, "header_value": [tenant_b, tenant_c]},
    }}
    fleet = stack.fleet(limits, envoys=2, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    ensure_window_room(3600, 120)

    rule_of = {tenant_a: DEFAULT, tenant_d: DEFAULT, tenant_b: GROUP, tenant_c: GROUP}
    results: dict[str, list[harness.Result]] = {t: [] for t in rule_of}
    # Interleaved: a, b, c, d, a, b, … each over both Envoys.
    for i in range(SENT):
        for j, tenant in enumerate(rule_of):
            url_index = (i + j) % len(fleet.urls)
            results[tenant].append(send(fleet.urls[url_index], tenant, target=url_index))

    for tenant, rule in rule_of.items():
        statuses = [r.status for r in results[tenant]]
        limit = rule["perhour"]
        assert statuses == [200] * limit + [429] * (SENT - limit), (tenant, Counter(statuses))
        for r in results[tenant][:limit]:
            expect.admitted(r, rule, tightest_window=3600)
        for r in results[tenant][limit:]:
            assert expect.limited(r, rule, tightest_window=3600).limit == limit

    # One Redis key per tenant, `<domain>_generic_key_per_hour_tenant_<value>_<window start>`,
    # whichever rule matched; no other key in this domain.
    expected_keys = sorted(harness.redis_key(fleet.domain, "hour", t) for t in rule_of)
    assert fleet.redis.keys(f"{fleet.domain}_*") == expected_keys
    for tenant, rule in rule_of.items():
        count = fleet.redis.get_int(harness.redis_key(fleet.domain, "hour", tenant))
        # Admitted ones plus at least the first rejected one; at most all sent.
        assert rule["perhour"] < count <= SENT, (tenant, count)


def test_a_tenant_over_its_limit_does_not_affect_another(stack):
    fleet = stack.fleet({"x-tenant-id": {"default": {"perhour": 3}}}, envoys=2,
                        timeout_ms=harness.COUNTING_TIMEOUT_MS)
    ensure_window_room(3600, 60)
    noisy, quiet = unique("noisy"), unique("quiet")

    noisy_results = harness.run_sequential(fleet.urls, 50, tenant=noisy)
    assert harness.tally(noisy_results) == Counter({200: 3, 429: 47})
    quiet_results = harness.run_sequential(fleet.urls, 3, tenant=quiet)
    assert harness.tally(quiet_results) == Counter({200: 3})

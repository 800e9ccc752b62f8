"""The tenant from a verified credential: Envoy's own jwt_authn, with a local
JWKS, in front of the filter; tokens signed here (ES256, PyJWT).

Two listeners of one Envoy, each with its own instance of the filter:

- `header`: jwt_authn requires a token and copies its `tenant` claim to the
  tenant header (`claim_to_headers`); the filter reads the header. Envoy
  1.40's jwt_authn removes the client's own copies of that header first, so
  a request whose client-sent header names a victim is limited as its
  token's tenant.
- `metadata`: jwt_authn puts the verified payload in the request's dynamic
  metadata (`payload_in_metadata`) and lets requests without a token
  through (`allow_missing`); the filter reads the claim through the property
  path `tenant_source` names (`missing_tenant: deny`). No header is read: a
  victim's header, even sent twice, changes nothing.

A request without a token, or with a token signed by another key, never
reaches the limiter as the tenant it claims: no counter of that tenant
exists in Redis afterwards.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric import ec

import h2c
import harness
import listeners
from harness import ensure_window_room, redis_key, unique
from tokens import CLAIM_PATH, jwt_authn, token

LIMIT = 3
LIMITS = {"x-tenant-id": {"default": {"perminute": LIMIT}}}


def status(url: str, bearer: str | None, tenant_header: str | None) -> int:
    headers = {}
    if bearer is not None:
        headers["authorization"] = f"Bearer {bearer}"
    return harness.send(url, tenant_header, headers).status


def test_the_tenant_is_the_verified_claim_never_the_clients_header(stack):
    key = ec.generate_private_key(ec.SECP256R1())
    forger = ec.generate_private_key(ec.SECP256R1())
    gen_h = stack.generate(LIMITS, domain=unique("by-header"))
    gen_m = stack.generate(LIMITS, domain=unique("by-metadata"))
    redis = stack.redis()
    rls = stack.ratelimit(redis, gen_h, gen_m)
    upstream = stack.upstream()
    by_header = gen_h.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS)
    by_metadata = gen_m.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS,
                                      missing_tenant="deny",
                                      tenant_source={"property": CLAIM_PATH})
    envoy = listeners.start(stack, rls, upstream, {
        "header": [jwt_authn(key, to_header=True, allow_missing=False),
                   listeners.wasm_filter(by_header)],
        "metadata": [jwt_authn(key, to_header=False, allow_missing=True),
                     listeners.wasm_filter(by_metadata)],
    })
    ensure_window_room(60, 30)
    urls = envoy.urls
    acme, victim = unique("acme"), unique("victim")

    def counted(gen: harness.Generated, tenant: str) -> int | None:
        return redis.get_int(redis_key(gen.domain, "minute", tenant))

    # The claim's tenant is limited, whatever the client's header says.
    good = token(key, acme)
    at_header = [status(urls["header"], good, victim) for _ in range(LIMIT + 1)]
    # No token, or one signed by another key: refused by jwt_authn (401)
    # before the filter; never the claimed tenant's quota.
    unsigned = [status(urls["header"], None, victim) for _ in range(2)]
    forged = [status(urls["header"], token(forger, victim), victim) for _ in range(2)]

    acme2 = unique("acme")
    good2 = token(key, acme2)
    at_metadata = [status(urls["metadata"], good2, victim) for _ in range(LIMIT + 1)]
    # The header is not read at all: sent twice (a 400 where it is read),
    # the claim still decides.
    name = harness.TENANT_HEADER.encode()
    twice, _ = h2c.get(urls["metadata"], [(b"authorization", f"Bearer {good2}".encode()),
                                          (name, victim.encode()), (name, b"other")])
    # Without a token there is no claim: a missing tenant (deny), whatever
    # header comes with it.
    no_token = [status(urls["metadata"], None, victim) for _ in range(2)]
    forged_m = [status(urls["metadata"], token(forger, victim), victim) for _ in range(2)]

    figures = {
        "header: token acme + header victim": at_header,
        "header: no token": unsigned, "header: forged token": forged,
        "metadata: token acme2 + header victim": at_metadata,
        "metadata: token acme2 + header twice": twice,
        "metadata: no token": no_token, "metadata: forged token": forged_m,
        "counted": {"acme": counted(gen_h, acme), "victim (header)": counted(gen_h, victim),
                    "acme2": counted(gen_m, acme2), "victim (metadata)": counted(gen_m, victim)},
    }
    print(figures)

    assert at_header == [200] * LIMIT + [429]
    assert unsigned == [401, 401] and forged == [401, 401]
    assert counted(gen_h, acme) == LIMIT + 1
    assert counted(gen_h, victim) is None
    assert at_metadata == [200] * LIMIT + [429]
    assert twice == 429, "the claim's tenant is still over its limit"
    assert no_token == [429, 429] and forged_m == [401, 401]
    assert counted(gen_m, acme2) == LIMIT + 1
    assert counted(gen_m, victim) is None
    assert redis.keys(f"*{victim}*") == []
    c = envoy.filter_counters()
    assert c["missing_tenant"] == 2 and c["tenant_repeated"] == 0, c
    assert c["rls_error"] == 0 and c["failure_mode_allowed"] == 0, c

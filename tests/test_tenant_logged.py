"""The tenant the filter limited is the tenant it logs.

With `tenant_source` set to a verified claim (Envoy's jwt_authn puts the
token's payload in the dynamic metadata), every request here also sends a
tenant header naming someone else, a victim. The access log (the project's
bootstrap's, tests/harness/envoy.py bootstrap_access_log) and the filter's own log
lines must name the claim's tenant, never the header's, for every kind of
refusal (the service, the over-limit cache, the bucket), for every decision
taken while the service is down (`on_failure` "allow", "deny", "local"),
and in the warning about a descriptor the service has no rule for. And in
header mode a refusal logs the tenant as every refusal logs it: escaped
(`%` written `%25`), the value the service counts.

One Envoy, one listener per configuration, each with its own VM, and a
request path per case, so that each access-log line says which case it
belongs to. All the traffic runs once (the module's fixture); each case is
its own test.
"""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

import harness
import listeners
from harness import ensure_window_room, unique
from tokens import CLAIM_PATH, jwt_authn, token

PER_MINUTE = 3
EXACT = {"x-tenant-id": {"default": {"perminute": PER_MINUTE}}}
ROOMY = {"x-tenant-id": {"default": {"perhour": 1000}}}
FALLBACK_QUOTA = 5
FALLBACK = {"x-tenant-id": {"default": {"perhour": FALLBACK_QUOTA}}}
# Envoy writes an access-log file every 10 s by default: wait with room to spare.
LOG_DEADLINE_S = 40
BUCKET_DEADLINE_S = 20
MINUTE_ROOM_S = 30
HOUR_ROOM_S = 120


class Case:
    """One case: the listener it goes to, its claim's tenant, the header's
    (victim's) tenant, and what it got back."""

    def __init__(self, listener: str, header_mode: bool = False):
        self.listener = listener
        self.path = f"/{listener}"
        if header_mode:
            # A '%', which the service sees (and every refusal logs) as %25.
            self.claim = None
            self.victim = unique("50%off")
            self.logged = self.victim.replace("%", "%25")
        else:
            self.claim = unique(f"claim-{listener}")
            self.victim = unique(f"victim-{listener}")
            self.logged = self.claim
        self.statuses: list[int] = []
        self.results: list[harness.Result] = []


def _send(envoy: listeners.MultiEnvoy, key, case: Case) -> harness.Result:
    headers = {"authorization": f"Bearer {token(key, case.claim)}"} if case.claim else {}
    r = harness.send(envoy.urls[case.listener].rstrip("/") + case.path, case.victim, headers)
    case.results.append(r)
    case.statuses.append(r.status)
    return r


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """Run every case once; the cases, the access-log lines and the Envoy log."""
    stack = harness.Stack(tmp_path_factory.mktemp("tenant-logged"))
    try:
        yield _run(stack)
    finally:
        stack.close()


def _run(stack: harness.Stack) -> dict:
    key = ec.generate_private_key(ec.SECP256R1())
    exact, roomy, fallback = stack.generate(EXACT), stack.generate(ROOMY), stack.generate(FALLBACK)
    rls = stack.ratelimit(stack.redis(), exact, roomy, fallback)
    upstream = stack.upstream()
    by_claim = {"tenant_source": {"property": CLAIM_PATH}, "missing_tenant": "deny",
                "timeout_ms": harness.COUNTING_TIMEOUT_MS}
    no_rule_domain = unique("not-the-services-domain")
    configs = {
        "service": exact.plugin_config(**by_claim),
        "bucket": roomy.plugin_config(
            **by_claim, local={"groups": {"default": {"tokens_per_second": 1, "burst": 1}}}),
        "norule": exact.plugin_config(**{**by_claim, "domain": no_rule_domain}),
        "allow": fallback.plugin_config(**by_claim, on_failure="allow"),
        "deny": fallback.plugin_config(**by_claim, on_failure="deny"),
        "local": fallback.plugin_config(**by_claim, on_failure="local",
                                        fallback={"envoys": 1}),
    }
    chains = {name: [jwt_authn(key, to_header=False, allow_missing=False),
                     listeners.wasm_filter(cfg, vm_id=name)]
              for name, cfg in configs.items()}
    chains["header"] = [listeners.wasm_filter(
        exact.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS), vm_id="header")]
    access_log = stack.workdir / "access.log"
    envoy = listeners.start(stack, rls, upstream, chains, access_log_path=str(access_log))
    cases = {name: Case(name, header_mode=(name == "header")) for name in chains}

    # The fallback's quota is per hour, the service's refusals per minute:
    # the run stays inside one window of each.
    ensure_window_room(3600, HOUR_ROOM_S)
    ensure_window_room(60, MINUTE_ROOM_S)
    # The service is up: its refusal, then the over-limit cache's.
    for _ in range(PER_MINUTE + 2):
        _send(envoy, key, cases["service"])
        _send(envoy, key, cases["header"])
    # One token a second: requests one after another meet an empty bucket,
    # however slow the machine (sent until one is refused, to a deadline).
    harness.wait_until(
        lambda: _send(envoy, key, cases["bucket"]).status == 429, "a refusal by the bucket",
        BUCKET_DEADLINE_S)
    # The service knows no rule of this domain: admitted, and warned about.
    for _ in range(2):
        _send(envoy, key, cases["norule"])

    # The service is down: each on_failure decides.
    rls.stop()
    for _ in range(2):
        _send(envoy, key, cases["allow"])
        _send(envoy, key, cases["deny"])
    for _ in range(FALLBACK_QUOTA + 2):
        _send(envoy, key, cases["local"])

    def lines() -> list[dict]:
        return [json.loads(x) for x in access_log.read_text().splitlines()] \
            if access_log.exists() else []

    # Lines are written in order: once the last case's are in, all are.
    local_sent = len(cases["local"].statuses)
    harness.wait_until(lambda: sum(1 for x in lines() if x["path"] == "/local") >= local_sent,
                       "the access-log lines of every case", LOG_DEADLINE_S)
    return {"cases": cases, "lines": lines(), "envoy_log": envoy.envoy.process.log_text(),
            "no_rule_domain": no_rule_domain, "stack": stack}


def lines_of(logged: dict, case: Case) -> list[dict]:
    return [x for x in logged["lines"] if x["path"] == case.path]


def describe(logged: dict, case: Case) -> str:
    return (f"{case.listener}: claim {case.claim}, header {case.victim}, statuses "
            f"{case.statuses}\naccess log: {lines_of(logged, case)}")


@pytest.fixture
def run(logged, request):
    request.node._trl_stack = logged["stack"]  # the process logs on a failure
    return logged


def test_a_refusal_by_the_service_logs_the_claims_tenant(run):
    case = run["cases"]["service"]
    assert case.statuses == [200] * PER_MINUTE + [429, 429], describe(run, case)
    [line] = [x for x in lines_of(run, case) if x["source"] == "service"]
    assert (line["status"], line["verdict"]) == (429, "refused"), describe(run, case)
    assert line["tenant"] == case.claim, describe(run, case)


def test_a_refusal_by_the_over_limit_cache_logs_the_claims_tenant(run):
    case = run["cases"]["service"]
    [line] = [x for x in lines_of(run, case) if x["source"] == "cache"]
    assert (line["status"], line["verdict"]) == (429, "refused"), describe(run, case)
    assert line["tenant"] == case.claim, describe(run, case)


def test_a_refusal_by_the_bucket_logs_the_claims_tenant(run):
    case = run["cases"]["bucket"]
    assert case.statuses[-1] == 429 and "x-ratelimit-limit" not in case.results[-1].headers, \
        describe(run, case)
    bucket = [x for x in lines_of(run, case) if x["source"] == "bucket"]
    assert bucket and all(x["tenant"] == case.claim for x in bucket), describe(run, case)


def test_failing_open_with_the_service_down_never_logs_the_headers_tenant(run):
    """on_failure "allow": let through; the access log has no line for a
    request the filter let through unlimited (docs/operating.md), and no
    line may name the header's tenant."""
    case = run["cases"]["allow"]
    assert case.statuses == [200, 200], describe(run, case)
    assert all(x["tenant"] == case.claim for x in lines_of(run, case)), describe(run, case)


def test_a_refusal_by_on_failure_deny_logs_the_claims_tenant(run):
    case = run["cases"]["deny"]
    assert case.statuses == [500, 500], describe(run, case)  # status_on_error
    got = lines_of(run, case)
    assert [x["source"] for x in got] == ["limiter_error"] * 2, describe(run, case)
    assert all(x["tenant"] == case.claim for x in got), describe(run, case)


def test_the_fallbacks_admissions_and_refusals_log_the_claims_tenant(run):
    case = run["cases"]["local"]
    assert case.statuses == [200] * FALLBACK_QUOTA + [429, 429], describe(run, case)
    got = lines_of(run, case)
    assert sorted((x["verdict"], x["source"]) for x in got) == \
        [("admitted", "fallback")] * FALLBACK_QUOTA + [("refused", "fallback")] * 2, \
        describe(run, case)
    assert all(x["tenant"] == case.claim for x in got), describe(run, case)


def test_the_missing_rule_warning_names_the_claims_tenant(run):
    case = run["cases"]["norule"]
    assert case.statuses == [200, 200], describe(run, case)
    warnings = [line for line in run["envoy_log"].splitlines()
                if f'no rule for domain "{run["no_rule_domain"]}"' in line]
    assert warnings, run["envoy_log"][-4000:]
    wrong = [w.split("descriptor ", 1)[-1][:120] for w in warnings
             if f"tenant={case.claim}]" not in w]
    assert not wrong, (describe(run, case), wrong)


def test_in_header_mode_a_refusal_by_the_service_logs_the_escaped_tenant(run):
    """The header's value as the service counts it and the cache's refusal
    logs it: a '%' written %25."""
    case = run["cases"]["header"]
    assert case.statuses == [200] * PER_MINUTE + [429, 429], describe(run, case)
    got = lines_of(run, case)
    assert sorted(x["source"] for x in got) == ["cache", "service"], describe(run, case)
    assert all(x["tenant"] == case.logged for x in got), describe(run, case)


def test_no_log_line_names_a_header_the_filter_did_not_read(run):
    """Neither the access log nor the filter's log lines anywhere name the
    tenant header a request sent where the tenant is the claim's."""
    victims = [c.victim for c in run["cases"].values() if c.claim is not None]
    access = "\n".join(json.dumps(x) for x in run["lines"])
    named = {v: (v in access, v in run["envoy_log"]) for v in victims}
    assert not any(a or e for a, e in named.values()), \
        {v: ae for v, ae in named.items() if any(ae)}

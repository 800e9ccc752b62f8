"""What `render --target envoy --service counter` writes for a VM, run as
written: the counter from the systemd unit's ExecStart and its environment
file, Envoy from envoy.yaml, mutual TLS between them with certificates the
test makes. Exactly N pass; an Envoy without the client certificate is
refused by the counter (the filter fails open and counts it)."""

from __future__ import annotations

import shlex
from collections import Counter as Tally

import requests
import yaml

import harness
from harness import COUNTING_TIMEOUT_MS, ensure_window_room, run_sequential, tally, unique
from redis_extra import make_certs

LIMIT = 5
LIMITS = {"x-tenant-id": {"default": {"perhour": LIMIT}}}


def _exec_start(unit: str) -> list[str]:
    (line,) = [l for l in unit.splitlines() if l.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def _environment(env_file: str) -> dict[str, str]:
    pairs = [l.split("=", 1) for l in env_file.splitlines() if l and not l.startswith("#")]
    return {k: v for k, v in pairs}


def _swap(argv: list[str], flag: str, value: str) -> None:
    argv[argv.index(flag) + 1] = value


def _envoy(stack, name: str, bootstrap: dict) -> harness.Envoy:
    listen, admin = harness.free_port(), harness.free_port()
    bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin
    bootstrap["static_resources"]["listeners"][0]["address"]["socket_address"] = {
        "address": harness.LOOPBACK, "port_value": listen}
    return harness.Envoy(stack, name, yaml.safe_dump(bootstrap), listen, admin)


def test_the_rendered_vm_counter_and_envoy_count_exactly_over_mutual_tls(stack, tmp_path):
    certs = make_certs(stack.workdir / "tls")
    domain = unique("internal-api")
    upstream = stack.upstream()
    grpc_port = harness.free_port()
    files = harness.render_target(
        LIMITS, "envoy", tmp_path / "vm", "--service", "counter", "--domain", domain,
        "--set", f"service.port={grpc_port}", "--set", f"envoy.app_port={upstream.listen_port}",
        "--set", f"envoy.wasm_path={harness.WASM}", "--set", "redis.url=memory",
        "--set", f"service.tls.cert={certs.server_cert}", "--set", f"service.tls.key={certs.server_key}",
        "--set", f"service.tls.client_ca={certs.ca}", "--set", f"service.tls.ca={certs.ca}",
        "--set", f"service.tls.client_cert={certs.client_cert}",
        "--set", f"service.tls.client_key={certs.client_key}",
        "--plugin", f"rate_limit_service.timeout_ms={COUNTING_TIMEOUT_MS}")
    argv = _exec_start(files["ratelimit-counter.service"])
    assert argv[argv.index("--grpc-addr") + 1] == f"127.0.0.1:{grpc_port}"
    assert argv[argv.index("--tls-client-ca") + 1] == str(certs.ca)
    # The unit as written, but for where this machine keeps the binary and
    # the team file, and an HTTP port of the test's own.
    limits_dir = stack.workdir / "vm-limits"
    limits_dir.mkdir()
    (limits_dir / f"{domain}.json").write_text(files[f"{domain}.json"])
    argv[0] = str(harness.COUNTER_BIN)
    _swap(argv, "--limits", str(limits_dir))
    http_port = harness.free_port()
    _swap(argv, "--http-addr", f"127.0.0.1:{http_port}")
    env = _environment(files["ratelimit-counter.env"])
    assert env == {"TRL_COUNTER_STORE": "memory"}
    counter = stack.spawn("counter-vm", argv, env=env)
    harness.wait_until(lambda: harness.http_ok(f"http://127.0.0.1:{http_port}/readyz"),
                       "the counter's /readyz", process=counter)

    bootstrap = yaml.safe_load(files["envoy.yaml"])
    envoy = _envoy(stack, "envoy-vm", bootstrap)
    ensure_window_room(3600, 60)
    tenant = unique("tenant")
    r = run_sequential([envoy.url], LIMIT + 3, tenant=tenant)
    assert tally(r) == Tally({200: LIMIT, 429: 3}), harness.summary(r)
    counted = envoy.filter_counters()
    assert counted.get("failure_mode_allowed", 0) == 0 and counted.get("rls_error", 0) == 0, counted

    # The same Envoy without its client certificate: the counter refuses the
    # handshake, so the filter fails open (every request passes) and says so.
    (cluster,) = [c for c in bootstrap["static_resources"]["clusters"]
                  if c["name"] == "tenant_ratelimit"]
    del cluster["transport_socket"]["typed_config"]["common_tls_context"]["tls_certificates"]
    anonymous = _envoy(stack, "envoy-no-cert", bootstrap)
    r = run_sequential([anonymous.url], 3, tenant=tenant)
    assert tally(r) == Tally({200: 3}), harness.summary(r)
    assert anonymous.filter_counters().get("failure_mode_allowed", 0) == 3
    assert requests.get(f"http://127.0.0.1:{http_port}/readyz", timeout=3).status_code == 200

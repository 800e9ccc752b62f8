"""Per-route limits on the bootstrap `render --target envoy` writes: its
routes carry names, so a team file's `routes` limit applies where named and
nowhere else, through a real Envoy, the real service (either: `pytest
--service`) and Redis; each team-file route's `route.<name>.requests`
counter shows whether it applies."""

from __future__ import annotations

import json
from collections import Counter

import requests
import yaml

import harness
from harness import ensure_window_room, run_sequential, tally, unique


def test_a_route_limit_applies_on_the_route_render_names_and_is_counted_there(stack, tmp_path):
    # `archive`: a team-file route no Envoy route carries.
    routes = {"export": {"perhour": 2}, "archive": {"perhour": 5}}
    limits = {"x-tenant-id": {"default": {"perhour": 100, "routes": routes}}}
    domain = unique("internal-api")
    gen = stack.generate(limits, domain)
    redis = stack.redis()
    rls = stack.ratelimit(redis, gen)
    upstream = stack.upstream()
    admin = harness.free_port()
    files = harness.render_target(
        limits, "envoy", tmp_path / "envoy", "--domain", domain,
        "--set", f"service.port={rls.grpc_port}", "--set", f"envoy.wasm_path={harness.WASM}",
        "--set", f"envoy.app_port={upstream.listen_port}", "--set", f"envoy.admin_port={admin}",
        "--set", "envoy.routes.export=/export",
        "--plugin", f"rate_limit_service.timeout_ms={harness.COUNTING_TIMEOUT_MS}",
        "--service", stack.service)
    boot = yaml.safe_load(files["envoy.yaml"])
    routes = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    assert [r["name"] for r in routes] == ["export", "app"]
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]
    wasm = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.wasm")
    plugin = json.loads(wasm["typed_config"]["config"]["configuration"]["value"])
    assert plugin["rate_limit_service"].get("service", "envoy-ratelimit") == stack.service
    # On loopback only, on a free port.
    listen = harness.free_port()
    boot["static_resources"]["listeners"][0]["address"]["socket_address"] = {
        "address": harness.LOOPBACK, "port_value": listen}
    config = tmp_path / "envoy-local.yaml"
    config.write_text(yaml.safe_dump(boot))
    proc = stack.spawn("envoy-routes", harness.envoy_argv(config, 2))
    harness.wait_until(lambda: harness.http_ok(f"http://127.0.0.1:{admin}/ready"),
                       "envoy /ready", process=proc)
    ensure_window_room(3600, 60)
    tenant = unique("tenant")
    base = f"http://127.0.0.1:{listen}"
    on_route = run_sequential([f"{base}/export/report"], 4, tenant=tenant)
    assert tally(on_route) == Counter({200: 2, 429: 2}), harness.summary(on_route)
    # Elsewhere only the group's own limit applies.
    elsewhere = run_sequential([f"{base}/orders"], 4, tenant=tenant)
    assert tally(elsewhere) == Counter({200: 4}), harness.summary(elsewhere)
    # Every request on the limited route counts there, refused or not; the
    # others nowhere; a route no Envoy route carries stays at 0 under
    # traffic: its limit never applies.
    harness.wait_flushed(f"http://127.0.0.1:{admin}")
    stats = harness.parse_stats(requests.get(
        f"http://127.0.0.1:{admin}/stats", params={"filter": r"tenant_ratelimit\.route\."},
        timeout=2).text)
    assert stats == {
        "wasmcustom.tenant_ratelimit.route.export.requests": 4,
        "wasmcustom.tenant_ratelimit.route.archive.requests": 0,
    }, stats
    if stack.service == "counter":
        # The route's window holds its 2 admitted, the 2 refused added nothing;
        # the group's hour all 6 admitted.
        key = harness.counter_key(domain, "hour", tenant)
        assert redis.get_int(f"{key}:r:export") == 2, redis.keys("trl:*")
        assert redis.get_int(key) == 6, redis.keys("trl:*")

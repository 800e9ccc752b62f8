"""The filter deployed through a real control plane: Envoy Gateway v1.9.1 in
standalone mode (tests/gateway.py), fed a Gateway and an HTTPRoute
(tests/envoy-gateway/gateway.yaml) and what `ratelimit-config render --target
envoy-gateway` writes (the EnvoyProxy that adds the rate-limit cluster, the
EnvoyExtensionPolicy). Envoy Gateway pulls the OCI image `make oci` builds
from a loopback registry itself, serves the module to the Envoy it starts,
and the test sends traffic through that Envoy: real ratelimit, real Redis.

Then the filter cannot run (a tag the registry does not have, the digest
written with a `sha256:` prefix, a plugin configuration the filter refuses),
under both settings of the policy's failOpen."""

from __future__ import annotations

import time
from collections import Counter

import pytest

import expect
import gateway
import harness
import ship
from harness import ensure_window_room, run_sequential, tally, unique

GOLD_RULE = {"perhour": 5}
REQUESTS = 12
NAMESPACE = "my-api"
IMAGE_TAG = "tenant-ratelimit:0.1.0"


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> dict:
    """The compat variant (what `make oci-push IMAGE=...` pushes as IMAGE) in a loopback registry."""
    images = ship.build_images(tmp_path_factory.mktemp("oci"))
    registry = ship.Registry(tmp_path_factory.mktemp("registry"))
    try:
        ref = registry.push(images["compat"]["layout"], IMAGE_TAG)
        yield {
            "ref": ref,
            "missing_ref": f"{registry.address}/tenant-ratelimit:no-such-tag",
            # What Envoy Gateway checks an image against: its manifest digest, hex only.
            "sha256": images["compat"]["digest"].split(":", 1)[1],
        }
    finally:
        registry.close()


class Deployment:
    """What a test deployed: the control plane, and the URL of its proxy's listener."""

    def __init__(self, stack: harness.Stack, image_ref: str, sha256: str | None,
                 fail_open: bool, limits: dict, config_overrides: dict | None = None):
        self.gen = stack.generate(limits)
        self.rls = stack.ratelimit(stack.redis(), self.gen)
        upstream = stack.upstream()

        docs = gateway.fixture("gateway.yaml")
        gw, route = harness.find(docs, "Gateway"), harness.find(docs, "HTTPRoute")
        self.listen_port = harness.free_port()
        gw["spec"]["listeners"][0]["port"] = self.listen_port
        # No Kubernetes Service here: the route's upstream is a Backend on loopback.
        route["spec"]["rules"][0]["backendRefs"] = [
            {"group": "gateway.envoyproxy.io", "kind": "Backend", "name": "upstream"}]
        # The EnvoyProxy and the EnvoyExtensionPolicy as `ratelimit-config
        # render --target envoy-gateway` writes them for this test's team
        # file, image, digest and fail strategy.
        rendered = gateway.render(self.gen.out_dir / "limits.json", self.gen.out_dir / "envoy-gateway",
                                  image=image_ref,
                                  sha256=sha256 if sha256 and ":" not in sha256 else None,
                                  fail_strategy="open" if fail_open else "closed")
        policy = harness.find(rendered, "EnvoyExtensionPolicy")
        wasm = policy["spec"]["wasm"][0]
        assert wasm["failOpen"] is fail_open
        assert wasm["code"]["image"]["url"] == image_ref
        if sha256 is not None and ":" in sha256:
            # A digest as registries print it: render takes only hex; the
            # test writes it by hand, as a user pasting it would.
            wasm["code"]["image"]["sha256"] = sha256
        cluster = self.cluster = wasm["config"]["rate_limit_service"]["cluster"]
        admin_port = harness.free_port()
        proxy = gateway.proxy_bootstrap_for_tests(
            harness.find(rendered, "EnvoyProxy"), cluster=cluster,
            admin_port=admin_port, rls_port=self.rls.grpc_port, version=gateway.envoy_version())
        # The rendered plugin configuration with this test's domain and
        # timeout (the service here loads the rules of stack.generate); its
        # cluster stays the one the rendered EnvoyProxy adds.
        config = self.gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS,
                                        **(config_overrides or {}))
        assert config["limits"] == wasm["config"]["limits"]
        config["rate_limit_service"]["cluster"] = cluster
        wasm["config"] = config

        started = time.monotonic()
        self.eg = gateway.EnvoyGateway(
            stack, [*docs, proxy, policy, gateway.backend("upstream", NAMESPACE,
                                                          upstream.listen_port)],
            admin_port=admin_port)
        self.eg.wait_listener(self.listen_port)
        self.startup_s = time.monotonic() - started
        self.url = f"http://{harness.LOOPBACK}:{self.listen_port}/"

    def close(self) -> None:
        self.eg.close()


@pytest.fixture
def deploy(stack):
    made: list[Deployment] = []

    def make(**kw) -> Deployment:
        d = Deployment(stack, **kw)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


def limits_with_gold(tenant: str) -> dict:
    return {"x-tenant-id": {"default": {"perhour": 100},
                            "gold": {**GOLD_RULE, "header_value": [tenant]}}}


def group_counters(eg: gateway.EnvoyGateway) -> dict[tuple[str, tuple], float]:
    """The filter's per-group counters as the proxy's /stats/prometheus shows them."""
    return harness.prometheus_series(eg.prometheus(), "tenant_ratelimit_group_",
                                     types=("counter",))


def wasm_filters(eg: gateway.EnvoyGateway) -> list[dict]:
    """Every Wasm HTTP filter of the proxy's listeners, from its config dump."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("@type", "").endswith("envoy.extensions.filters.http.wasm.v3.Wasm"):
                found.append(node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for c in eg.config_dump()["configs"]:
        if c["@type"].endswith("ListenersConfigDump"):
            walk(c)
    return found


def static_clusters(eg: gateway.EnvoyGateway) -> set[str]:
    dump = next(c for c in eg.config_dump()["configs"] if c["@type"].endswith("ClustersConfigDump"))
    return {c["cluster"]["name"] for c in dump.get("static_clusters", [])}


def test_envoy_gateway_pulls_the_image_and_its_proxy_admits_exactly_the_quota(deploy, image):
    gold = unique("tenant-gold")
    d = deploy(image_ref=image["ref"], sha256=image["sha256"], fail_open=False,
               limits=limits_with_gold(gold))
    print(f"\nEnvoy Gateway start to a warm listener: {d.startup_s:.1f} s")

    # Envoy Gateway fetched the image (its cache holds the module) and handed
    # the module to Envoy over its own server, pinned by the module's sha256.
    module = harness.WASM.read_bytes()
    assert [p.read_bytes() == module for p in d.eg.wasm_cache()] == [True]
    (filt,) = wasm_filters(d.eg)
    remote = filt["config"]["vm_config"]["code"]["remote"]
    assert remote["sha256"] == ship.sha256_hex(module)
    assert remote["http_uri"]["cluster"] == "wasm_cluster"
    assert filt["config"]["root_id"] == "tenant_ratelimit"
    # The rate-limit cluster is the EnvoyProxy bootstrap's: static, out of xDS's reach.
    assert d.cluster in static_clusters(d.eg)

    ensure_window_room(3600, 120)
    results = run_sequential([d.url], REQUESTS, tenant=gold)
    assert tally(results) == Counter({200: 5, 429: REQUESTS - 5}), harness.summary(results)
    for r in results[:5]:
        expect.admitted(r, GOLD_RULE)
    for r in results[5:]:
        expect.limited(r, GOLD_RULE)
    # The fleet-wide counter decided: the service admitted each of the five.
    assert d.rls.rule_counter("within_limit", d.gen.domain, "hour", key2=f"tenant_{gold}") == 5

    # Per-group counters, labelled by the bootstrap's stats_tags.
    counters = group_counters(d.eg)
    assert counters[("tenant_ratelimit_group_admitted", (("group", "gold"),))] == 5
    assert counters[("tenant_ratelimit_group_admitted", (("group", "default"),))] == 0
    refused = {labels: v for (name, labels), v in counters.items()
               if name == "tenant_ratelimit_group_refused" and ("group", "gold") in labels}
    assert sum(refused.values()) == REQUESTS - 5, refused
    assert {dict(labels)["source"] for labels in refused} == {"service", "cache", "bucket", "sync", "fallback"}


def test_image_missing_and_fail_closed_the_route_answers_500(deploy, image):
    d = deploy(image_ref=image["missing_ref"], sha256=None, fail_open=False,
               limits=limits_with_gold(unique("tenant-gold")))
    results = run_sequential([d.url], REQUESTS, tenant=unique("tenant-gold"))
    assert tally(results) == Counter({500: REQUESTS}), harness.summary(results)
    assert wasm_filters(d.eg) == []
    assert "MANIFEST_UNKNOWN" in d.eg.log_text()


def test_digest_with_a_sha256_prefix_is_refused_and_fail_closed_answers_500(deploy, image):
    """`sha256:<hex>`, as `make oci` prints a digest, is not what Envoy Gateway compares."""
    d = deploy(image_ref=image["ref"], sha256="sha256:" + image["sha256"], fail_open=False,
               limits=limits_with_gold(unique("tenant-gold")))
    results = run_sequential([d.url], REQUESTS, tenant=unique("tenant-gold"))
    assert tally(results) == Counter({500: REQUESTS}), harness.summary(results)
    assert wasm_filters(d.eg) == []
    assert "which does not match" in d.eg.log_text()


def test_image_missing_and_fail_open_the_route_serves_without_the_filter(deploy, image):
    gold = unique("tenant-gold")
    d = deploy(image_ref=image["missing_ref"], sha256=None, fail_open=True,
               limits=limits_with_gold(gold))
    results = run_sequential([d.url], REQUESTS, tenant=gold)
    # Twelve requests for a quota of five: nothing limits them, and nothing says so.
    assert tally(results) == Counter({200: REQUESTS}), harness.summary(results)
    assert not any(k.startswith("x-ratelimit") for r in results for k in r.headers)
    assert wasm_filters(d.eg) == []
    assert group_counters(d.eg) == {}
    assert "MANIFEST_UNKNOWN" in d.eg.log_text()


@pytest.mark.parametrize("fail_open, status", [(False, 503), (True, 200)],
                         ids=["fail-closed", "fail-open"])
def test_a_configuration_the_filter_refuses(deploy, image, fail_open, status):
    """The module loads but refuses its configuration (on_configure false):
    Envoy's own failure policy, which Envoy Gateway sets from failOpen."""
    gold = unique("tenant-gold")
    d = deploy(image_ref=image["ref"], sha256=image["sha256"], fail_open=fail_open,
               limits=limits_with_gold(gold), config_overrides={"no_such_key": 1})
    results = run_sequential([d.url], REQUESTS, tenant=gold)
    assert tally(results) == Counter({status: REQUESTS}), harness.summary(results)
    assert not any(k.startswith("x-ratelimit") for r in results for k in r.headers)
    assert 'invalid configuration: no_such_key: unknown key "no_such_key"' in d.eg.log_text()

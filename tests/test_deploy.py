"""deploy/: what `ratelimit-config render` writes for the example, built by the
pinned kustomize from the repository as it is (nothing else is needed) and
validated against the real schemas, read at test time from the pinned Go
modules' own files (Kubernetes' OpenAPI v3 from k8s.io/kubernetes, Istio's
CRDs from istio.io/istio, Envoy Gateway's and the Gateway API's from
github.com/envoyproxy/gateway, the Prometheus Operator's from its module). Nothing here has run in a Kubernetes
cluster; what can be run locally is: the rendered Envoy bootstrap (envoy
--mode validate), the plain-Envoy pieces and Istio's bootstrap override on a
real Envoy with real traffic, and the sidecar's probe and preStop drain
commands against a real Envoy."""

from __future__ import annotations

import copy
import json
import subprocess
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
import yaml
import requests
from prometheus_client.parser import text_string_to_metric_families

import harness
import ship
from harness import ensure_window_room, find, run_sequential, tally, unique

DEPLOY = harness.REPO / "deploy"
VARIANTS = ("istio", "envoy-gateway", "envoy")
ISTIO_CLUSTER = "outbound|8081||ratelimit.my-api.svc.cluster.local"
EG_PROXY = {"app.kubernetes.io/component": "proxy", "app.kubernetes.io/managed-by": "envoy-gateway"}


# ------------------------------------------------------------------ rendering

def build(directory: Path) -> list[dict]:
    text = ship.run([ship.KUSTOMIZE, "build", directory]).stdout
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    """Each target of deploy/, as committed, through kustomize."""
    return {variant: build(DEPLOY / variant) for variant in VARIANTS}


def render_example(tmp_path: Path, target: str, *args: str) -> Path:
    """The example rendered again with more settings, into tmp_path/target."""
    out = tmp_path / target
    harness.run_cli("render", harness.REPO / "e2e" / "limits.json", "--deployment",
                    DEPLOY / "deployment.yaml", "--target", target, "--out", out, *args)
    return out


# ------------------------------------------------------------------ schemas

def strict(schema, partial: bool = False):
    """Refuse unknown fields, as `kubectl apply --validate=strict` does:
    additionalProperties false wherever properties are listed and nothing
    says unknown fields are kept. `partial`: nothing required (a patch)."""
    if isinstance(schema, dict):
        schema = {k: strict(v, partial) for k, v in schema.items() if not (partial and k == "required")}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(s, partial) for s in schema]
    return schema


class Schemas:
    def __init__(self):
        self.schemas: dict[tuple[str, str], dict] = {}
        k8s = ship.module_dir(ship.K8S_MODULE) / "api" / "openapi-spec" / "v3"
        for f in ("api__v1_openapi.json", "apis__apps__v1_openapi.json",
                  "apis__networking.k8s.io__v1_openapi.json"):
            components = json.loads((k8s / f).read_text())["components"]
            for name, s in components["schemas"].items():
                for gvk in s.get("x-kubernetes-group-version-kind", []):
                    api = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
                    self.schemas[(api, gvk["kind"])] = {
                        "$ref": f"#/components/schemas/{name}", "components": components}
        istio = ship.module_dir(ship.ISTIO_MODULE) / "manifests" / "charts" / "base" / "files" / "crd-all.gen.yaml"
        charts = ship.module_dir(ship.EG_MODULE) / "charts"
        eg = charts / "gateway-helm" / "charts" / "crds" / "crds" / "generated"
        crd_files = [istio, eg / "gateway.envoyproxy.io_envoyextensionpolicies.yaml",
                     eg / "gateway.envoyproxy.io_envoyproxies.yaml",
                     charts / "gateway-helm" / "charts" / "crds" / "crds" / "gatewayapi-crds.yaml"]
        operator = ship.module_dir(ship.PROM_OPERATOR_MODULE) / "example" / "prometheus-operator-crd"
        crd_files += [operator / "monitoring.coreos.com_servicemonitors.yaml",
                      operator / "monitoring.coreos.com_podmonitors.yaml"]
        for path in crd_files:
            for crd in yaml.safe_load_all(path.read_text()):
                if not crd or crd.get("kind") != "CustomResourceDefinition":
                    continue
                group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
                for version in crd["spec"]["versions"]:
                    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
                    # The API server adds these to every CRD's schema.
                    props = schema.setdefault("properties", {})
                    props.setdefault("apiVersion", {"type": "string"})
                    props.setdefault("kind", {"type": "string"})
                    props.setdefault("metadata", {"type": "object"})
                    self.schemas[(f"{group}/{version['name']}", kind)] = schema
        self.validators: dict[tuple, jsonschema.protocols.Validator] = {}

    def errors(self, doc: dict, partial: bool = False) -> list[str]:
        key = (doc["apiVersion"], doc["kind"])
        if key not in self.schemas:
            return [f"no schema for {doc['apiVersion']} {doc['kind']}"]
        if (key, partial) not in self.validators:
            self.validators[(key, partial)] = jsonschema.Draft7Validator(
                strict(self.schemas[key], partial))
        v = self.validators[(key, partial)]
        return [f"{doc['kind']} {doc['metadata']['name']}: {'.'.join(map(str, e.absolute_path))}: "
                f"{e.message}" for e in v.iter_errors(doc)]


@pytest.fixture(scope="module")
def schemas() -> Schemas:
    return Schemas()


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rendered_manifest_matches_the_real_schema(variant, rendered, schemas):
    docs = rendered[variant]
    assert docs
    problems = [e for d in docs for e in schemas.errors(d)]
    assert problems == []


@pytest.mark.parametrize("variant, patch", [("istio", "workload-patch.yaml"),
                                            ("envoy-gateway", "gateway-patch.yaml")])
def test_the_patches_for_the_users_own_objects_name_real_fields(variant, patch, schemas):
    """The patch of the user's Deployment (Istio's bootstrap override
    annotation) and Gateway (its EnvoyProxy): every field is one of the
    kind's schema, required ones aside (a patch carries only what it sets)."""
    (doc,) = [d for d in yaml.safe_load_all((DEPLOY / variant / patch).read_text()) if d]
    assert schemas.errors(doc, partial=True) == []
    broken = copy.deepcopy(doc)
    broken["spec"]["template" if variant == "istio" else "infrastructure"]["metadta"] = {}
    assert schemas.errors(broken, partial=True) != []


def test_the_schema_check_catches_an_unknown_field_and_a_bad_value(rendered, schemas):
    dep = copy.deepcopy(find(rendered["envoy"], "Deployment", "my-api"))
    dep["spec"]["template"]["spec"]["containers"][1]["readinesProbe"] = {}
    assert any("readinesProbe" in e for e in schemas.errors(dep))
    wp = copy.deepcopy(find(rendered["istio"], "WasmPlugin"))
    wp["spec"]["phase"] = "AUTHORIZATION"
    assert any("spec.phase" in e for e in schemas.errors(wp))
    eep = copy.deepcopy(find(rendered["envoy-gateway"], "EnvoyExtensionPolicy"))
    eep["spec"]["wasm"][0]["code"]["type"] = "OCI"
    assert any("code.type" in e for e in schemas.errors(eep))
    ep = copy.deepcopy(find(rendered["envoy-gateway"], "EnvoyProxy"))
    ep["spec"]["bootstrap"]["type"] = "Patch"
    assert any("bootstrap.type" in e for e in schemas.errors(ep))
    np = copy.deepcopy(find(rendered["istio"], "NetworkPolicy", "ratelimit-from-proxies"))
    np["spec"]["ingress"][0]["form"] = np["spec"]["ingress"][0].pop("from")
    assert any("form" in e for e in schemas.errors(np))


# ------------------------------------------------------------------ content

def generated(tmp_path: Path, cluster: str) -> tuple[dict, str]:
    harness.run_cli("generate", harness.REPO / "e2e" / "limits.json", "--domain", "internal-api",
                    "--cluster", cluster, "--out", tmp_path)
    return (json.loads((tmp_path / "plugin-config.json").read_text()),
            (tmp_path / "ratelimit.yaml").read_text())


def bootstrap_of(docs: list[dict]) -> dict:
    return yaml.safe_load(find(docs, "ConfigMap", "envoy-config")["data"]["envoy.yaml"])


def wasm_config(bootstrap: dict) -> dict:
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    (wasm,) = [f for f in hcm["typed_config"]["http_filters"] if f["name"] == "envoy.filters.http.wasm"]
    return wasm["typed_config"]["config"]


def test_render_and_generate_agree_on_the_plugin_configuration_and_the_rules(rendered, tmp_path):
    istio_config, rules = generated(tmp_path / "i", ISTIO_CLUSTER)
    wp = find(rendered["istio"], "WasmPlugin")
    assert wp["spec"]["pluginConfig"] == istio_config
    assert wp["spec"]["url"] == "oci://registry.example.com/tenant-ratelimit:0.1.0"
    static_config, _ = generated(tmp_path / "e", "tenant_ratelimit")
    eep = find(rendered["envoy-gateway"], "EnvoyExtensionPolicy")
    assert eep["spec"]["wasm"][0]["config"] == static_config
    assert json.loads(wasm_config(bootstrap_of(rendered["envoy"]))["configuration"]["value"]) == static_config
    assert eep["spec"]["wasm"][0]["rootID"] == wp["spec"]["pluginName"] == "tenant_ratelimit"
    # Every target's service serves the same generated rules.
    for variant in VARIANTS:
        assert find(rendered[variant], "ConfigMap", "ratelimit-config")["data"]["ratelimit.yaml"] == rules


def test_the_fail_strategy_is_written_out(rendered, tmp_path):
    """deployment.yaml says open; closed is one flag away, for both control planes."""
    assert find(rendered["istio"], "WasmPlugin")["spec"]["failStrategy"] == "FAIL_OPEN"
    assert find(rendered["envoy-gateway"], "EnvoyExtensionPolicy")["spec"]["wasm"][0]["failOpen"] is True
    istio = build(render_example(tmp_path, "istio", "--fail-strategy", "closed"))
    assert find(istio, "WasmPlugin")["spec"]["failStrategy"] == "FAIL_CLOSE"
    eg = build(render_example(tmp_path, "envoy-gateway", "--fail-strategy", "closed"))
    assert find(eg, "EnvoyExtensionPolicy")["spec"]["wasm"][0]["failOpen"] is False


def test_the_istio_cluster_follows_the_namespace_service_and_cluster_domain(tmp_path, schemas):
    docs = build(render_example(tmp_path, "istio", "--namespace", "payments", "--set",
                                "service.port=9000", "--set", "cluster_domain=corp.example"))
    config = find(docs, "WasmPlugin")["spec"]["pluginConfig"]
    assert config["rate_limit_service"]["cluster"] == \
        "outbound|9000||ratelimit.payments.svc.corp.example"
    service = find(docs, "Service", "ratelimit")
    assert service["metadata"]["namespace"] == "payments"
    assert service["spec"]["ports"][0]["port"] == 9000
    assert {d["metadata"].get("namespace") for d in docs} == {"payments"}
    assert [e for d in docs for e in schemas.errors(d)] == []


def pods(docs: list[dict]) -> list[dict]:
    """The pod templates' labels and container ports of the workloads."""
    return [{"labels": d["spec"]["template"]["metadata"]["labels"],
             "ports": {p["containerPort"] for c in d["spec"]["template"]["spec"]["containers"]
                       for p in c.get("ports", [])}}
            for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def selected(policy: dict, docs: list[dict]) -> list[dict]:
    want = policy["spec"]["podSelector"]["matchLabels"]
    return [p for p in pods(docs) if want.items() <= p["labels"].items()]


@pytest.mark.parametrize("variant", VARIANTS)
def test_only_the_proxies_reach_the_service_and_only_the_service_reaches_redis(variant, rendered):
    docs = rendered[variant]
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}
    service_pods = {"app.kubernetes.io/name": "ratelimit"}
    if variant == "envoy":
        # The service runs in the app's pod, on 127.0.0.1: the pod takes
        # connections on Envoy's listener only.
        policy = policies["my-api-envoy-only"]
        (pod,) = selected(policy, docs)
        assert policy["spec"]["ingress"] == [{"from": [], "ports": [{"protocol": "TCP", "port": 8000}]}]
        assert 8090 in pod["ports"]  # the service's HTTP port (/json spends quota): not reachable
        service_pods = {"app": "my-api"}
    else:
        policy = policies["ratelimit-from-proxies"]
        (pod,) = selected(policy, docs)
        # Under Istio the service's pods get a sidecar: the mesh's mutual
        # TLS covers the hop (peerauthentication.yaml).
        inject = {"sidecar.istio.io/inject": "true"} if variant == "istio" else {}
        assert pod["labels"] == service_pods | inject
        ((rule,),) = [policy["spec"]["ingress"]]
        assert rule["ports"] == [{"protocol": "TCP", "port": 8081}]
        (peer,) = rule["from"]
        if variant == "istio":
            # The pods the WasmPlugin runs in, in this namespace.
            assert peer == {"podSelector": find(docs, "WasmPlugin")["spec"]["selector"]}
        else:
            # This Gateway's proxies, in Envoy Gateway's namespace.
            assert peer["namespaceSelector"] == {
                "matchLabels": {"kubernetes.io/metadata.name": "envoy-gateway-system"}}
            assert peer["podSelector"]["matchLabels"] == {
                **EG_PROXY, "gateway.envoyproxy.io/owning-gateway-name": "my-gateway",
                "gateway.envoyproxy.io/owning-gateway-namespace": "my-api"}
    redis_policy = policies[next(n for n in policies if n.startswith("ratelimit-redis-from-"))]
    (redis_pod,) = selected(redis_policy, docs)
    assert 6379 in redis_pod["ports"]
    assert redis_policy["spec"]["ingress"] == [{
        "from": [{"podSelector": {"matchLabels": service_pods}}],
        "ports": [{"protocol": "TCP", "port": 6379}]}]
    assert all(p["spec"]["policyTypes"] == ["Ingress"] for p in policies.values())


def container(pod: dict, name: str) -> dict:
    return next(c for c in pod["containers"] if c["name"] == name)


def test_the_redis_password_comes_from_a_secret_when_one_is_given(tmp_path, schemas):
    docs = build(render_example(tmp_path, "istio", "--set", "redis.auth_secret.name=ratelimit-redis"))
    assert [e for d in docs for e in schemas.errors(d)] == []
    secret = {"secretKeyRef": {"name": "ratelimit-redis", "key": "password"}}
    service = container(find(docs, "Deployment", "ratelimit")["spec"]["template"]["spec"], "ratelimit")
    assert {"name": "REDIS_AUTH", "valueFrom": secret} in service["env"]
    redis = container(find(docs, "StatefulSet", "ratelimit-redis")["spec"]["template"]["spec"], "redis")
    assert redis["env"] == [{"name": "REDIS_PASSWORD", "valueFrom": secret}]
    assert redis["args"][-2:] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert "REDISCLI_AUTH" in " ".join(redis["readinessProbe"]["exec"]["command"])
    # Without one, nothing mentions a password.
    plain = build(DEPLOY / "istio")
    assert "REDIS_AUTH" not in json.dumps(plain) and "requirepass" not in json.dumps(plain)


def test_a_redis_of_your_own_is_not_rendered(tmp_path):
    docs = build(render_example(tmp_path, "envoy-gateway", "--set", "redis.url=redis.example.com:6379"))
    assert not [d for d in docs if d["kind"] == "StatefulSet"]
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "NetworkPolicy"] == ["ratelimit-from-proxies"]
    service = container(find(docs, "Deployment", "ratelimit")["spec"]["template"]["spec"], "ratelimit")
    assert {"name": "REDIS_URL", "value": "redis.example.com:6379"} in service["env"]


def sidecar_pod(rendered) -> dict:
    return find(rendered["envoy"], "Deployment", "my-api")["spec"]["template"]["spec"]


def test_the_sidecar_pod_probes_the_services_healthcheck_and_drains_envoy_within_its_grace(rendered):
    pod = sidecar_pod(rendered)
    assert {c["name"] for c in pod["containers"]} == {"app", "envoy", "ratelimit"}
    rl = container(pod, "ratelimit")
    assert rl["readinessProbe"]["httpGet"]["path"] == "/healthcheck"
    assert {"name": "GRPC_HOST", "value": "127.0.0.1"} in rl["env"]
    envoy = container(pod, "envoy")
    pre_stop = " ".join(envoy["lifecycle"]["preStop"]["exec"]["command"])
    assert "POST /drain_listeners?graceful" in pre_stop
    drain_s = int(envoy["args"][envoy["args"].index("--drain-time-s") + 1])
    assert f"sleep {drain_s}" in pre_stop
    # The grace period covers the drain, with time left for Envoy to exit.
    assert pod["terminationGracePeriodSeconds"] >= drain_s + 10
    app_sleep = container(pod, "app")["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert drain_s <= app_sleep < pod["terminationGracePeriodSeconds"]


def test_the_sidecar_loads_the_filter_from_the_oci_image_and_envoy_accepts_its_bootstrap(rendered, tmp_path):
    pod = sidecar_pod(rendered)
    volume = next(v for v in pod["volumes"] if v["name"] == "filter")
    assert volume["image"]["reference"] == "registry.example.com/tenant-ratelimit:0.1.0"
    mount = next(m for m in container(pod, "envoy")["volumeMounts"] if m["name"] == "filter")
    bootstrap = bootstrap_of(rendered["envoy"])
    wasm_path = wasm_config(bootstrap)["vm_config"]["code"]["local"]["filename"]
    # The compat image's one file, plugin.wasm, where the bootstrap reads it.
    assert wasm_path == mount["mountPath"] + "/plugin.wasm"
    assert bootstrap["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 9901}
    wasm_config(bootstrap)["vm_config"]["code"]["local"]["filename"] = str(harness.WASM)
    bootstrap["admin"]["address"]["socket_address"]["port_value"] = harness.free_port()
    bootstrap["static_resources"]["listeners"][0]["address"]["socket_address"] = {
        "address": harness.LOOPBACK, "port_value": harness.free_port()}
    local = tmp_path / "envoy.yaml"
    local.write_text(yaml.safe_dump(bootstrap))
    proc = subprocess.run([str(harness.ENVOY_BIN), "--mode", "validate", "-c", str(local),
                           "--disable-hot-restart"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_the_sidecar_probe_and_prestop_commands_work_against_a_real_envoy(rendered, stack):
    """The exec commands of the manifest, run with bash against Envoy's admin
    (its port in place of 9901, the drain's sleep cut to 0)."""
    pod = sidecar_pod(rendered)
    envoy_c = container(pod, "envoy")
    gen = stack.generate({"x-tenant-id": {"default": {"perhour": 5}}})
    rls = stack.ratelimit(stack.redis(), gen)
    upstream = stack.upstream()
    listen, admin = harness.free_port(), harness.free_port()
    config = stack.workdir / "envoy-sidecar.yaml"
    config.write_text(harness.render_envoy_config(
        gen.plugin_config(), listen_port=listen, admin_port=admin, rls_port=rls.grpc_port,
        upstream_port=upstream.listen_port))
    args = envoy_c["args"]
    drain_args = args[args.index("--drain-time-s"):args.index("--drain-time-s") + 4]
    assert drain_args[2] == "--drain-strategy"
    proc = stack.spawn("envoy-sidecar", harness.envoy_argv(config, 2, extra=drain_args))
    harness.wait_until(lambda: harness.http_ok(f"http://127.0.0.1:{admin}/ready"),
                       "envoy /ready", process=proc)
    url = f"http://127.0.0.1:{listen}/"
    port = str(admin)

    def run(command: list[str]) -> subprocess.CompletedProcess:
        assert command[:2] == ["bash", "-c"]
        script = command[2].replace("/127.0.0.1/9901", f"/127.0.0.1/{port}")
        script = script.replace(f"sleep {envoy_c['args'][envoy_c['args'].index('--drain-time-s') + 1]}",
                                "sleep 0")
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)

    assert run(envoy_c["readinessProbe"]["exec"]["command"]).returncode == 0
    before = harness.send(url, tenant=harness.unique("tenant-a"))
    assert before.status == 200 and before.headers.get("connection") != "close", before
    drained = run(envoy_c["lifecycle"]["preStop"]["exec"]["command"])
    assert drained.returncode == 0, drained.stderr
    # Envoy is draining: it now closes each connection after answering.
    r = harness.send(url, tenant=harness.unique("tenant-a"))
    assert r.status == 200 and r.headers.get("connection") == "close", r


# ------------------------------------------------------------------ on a real Envoy

def listener_bootstrap(listen: int, admin: int, upstream_port: int, http_filter: dict,
                       stats_config: dict | None = None) -> dict:
    """A bootstrap of one loopback listener with `http_filter` before the
    router, in front of the upstream: what a user's own bootstrap has."""
    boot = {
        "admin": {"address": {"socket_address": {"address": harness.LOOPBACK, "port_value": admin}}},
        "static_resources": {
            "listeners": [{
                "name": "ingress",
                "address": {"socket_address": {"address": harness.LOOPBACK, "port_value": listen}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network."
                                 "http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "ingress",
                        "route_config": {"virtual_hosts": [{
                            "name": "all", "domains": ["*"],
                            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "upstream"}}]}]},
                        "http_filters": [http_filter, {
                            "name": "envoy.filters.http.router",
                            "typed_config": {"@type": "type.googleapis.com/"
                                                      "envoy.extensions.filters.http.router.v3.Router"}}],
                    }}]}],
            }],
            "clusters": [{
                "name": "upstream", "type": "STATIC", "connect_timeout": "1s",
                "load_assignment": {"cluster_name": "upstream", "endpoints": [{"lb_endpoints": [{
                    "endpoint": {"address": {"socket_address": {
                        "address": harness.LOOPBACK, "port_value": upstream_port}}}}]}]}}],
        },
    }
    if stats_config is not None:
        boot["stats_config"] = stats_config
    return boot


def group_series(admin_url: str) -> dict[tuple, float]:
    return harness.scrape_prometheus(admin_url, "tenant_ratelimit_group_", types=("counter",))


def test_the_plain_envoy_pieces_limit_on_a_real_stack(stack, tmp_path):
    """render --target envoy for a stack on loopback: http-filter.yaml in a
    bootstrap of one's own, bootstrap-fragment.yaml merged in with
    --config-yaml; the quota holds and the group counters carry labels."""
    gold = unique("tenant-gold")
    limits = {"x-tenant-id": {"default": {"perhour": 100}, "gold": {"perhour": 3, "header_value": [gold]}}}
    domain = unique("internal-api")
    gen = stack.generate(limits, domain)
    rls = stack.ratelimit(stack.redis(), gen)
    upstream = stack.upstream()
    files = harness.render_target(
        limits, "envoy", tmp_path / "envoy", "--domain", domain,
        "--set", f"service.port={rls.grpc_port}", "--set", f"envoy.wasm_path={harness.WASM}",
        "--plugin", f"rate_limit_service.timeout_ms={harness.COUNTING_TIMEOUT_MS}")
    assert "sidecar.yaml" not in files  # no namespace: no Kubernetes objects
    # The service's rules render wrote are the ones the service runs.
    assert files["ratelimit.yaml"].split("\n", 1)[1] == gen.ratelimit_yaml.read_text().split("\n", 1)[1]
    http_filter = yaml.safe_load(files["http-filter.yaml"])
    listen, admin = harness.free_port(), harness.free_port()
    config = tmp_path / "own.yaml"
    config.write_text(yaml.safe_dump(listener_bootstrap(listen, admin, upstream.listen_port, http_filter)))
    proc = stack.spawn("envoy-plain", harness.envoy_argv(
        config, 2, extra=["--config-yaml", files["bootstrap-fragment.yaml"]]))
    harness.wait_until(lambda: harness.http_ok(f"http://127.0.0.1:{admin}/ready"),
                       "envoy /ready", process=proc)
    ensure_window_room(3600, 60)
    results = run_sequential([f"http://127.0.0.1:{listen}/"], 6, tenant=gold)
    assert tally(results) == Counter({200: 3, 429: 3}), harness.summary(results)
    series = group_series(f"http://127.0.0.1:{admin}")
    assert series[("tenant_ratelimit_group_admitted", (("group", "gold"),))] == 3
    assert series[("tenant_ratelimit_group_refused", (("group", "gold"), ("source", "service")))] == 1


def test_istios_bootstrap_override_gives_a_sidecar_the_group_labels(stack, tmp_path):
    """stats-bootstrap.yaml's custom_bootstrap.json, merged the way istio-agent
    merges a bootstrap override (envoy --config-yaml), onto a bootstrap with
    what Istio's own sets: no default tags, a stats matcher that keeps only
    some prefixes (`wasm` among them)."""
    (configmap,) = [d for d in yaml.safe_load_all((DEPLOY / "istio" / "stats-bootstrap.yaml").read_text()) if d]
    override = configmap["data"]["custom_bootstrap.json"]
    (patch,) = [d for d in yaml.safe_load_all((DEPLOY / "istio" / "workload-patch.yaml").read_text()) if d]
    annotations = patch["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"sidecar.istio.io/bootstrapOverride": configmap["metadata"]["name"]}
    gold = unique("tenant-gold")
    gen = stack.generate({"x-tenant-id": {"default": {"perhour": 100},
                                          "gold": {"perhour": 2, "header_value": [gold]}}})
    rls = stack.ratelimit(stack.redis(), gen)
    upstream = stack.upstream()
    cfg = gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS)
    http_filter = {"name": "envoy.filters.http.wasm", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "config": {"name": "tenant_ratelimit", "root_id": "tenant_ratelimit",
                   "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                     "value": json.dumps(cfg)},
                   "vm_config": {"runtime": "envoy.wasm.runtime.v8",
                                 "code": {"local": {"filename": str(harness.WASM)}}}}}}
    istio_like = {"use_all_default_tags": False,
                  "stats_tags": [{"tag_name": "cluster_name", "regex": "^cluster(\\.(.+);)"}],
                  "stats_matcher": {"inclusion_list": {"patterns": [
                      {"prefix": p} for p in ("reporter=", "cluster_manager", "listener_manager",
                                              "server", "cluster.xds-grpc", "wasm", "component", "istio")]}}}
    listen, admin = harness.free_port(), harness.free_port()
    boot = listener_bootstrap(listen, admin, upstream.listen_port, http_filter, istio_like)
    boot["static_resources"]["clusters"].append(
        ratelimit_cluster(cfg["rate_limit_service"]["cluster"], rls.grpc_port))
    config = tmp_path / "istio-like.yaml"
    config.write_text(yaml.safe_dump(boot))
    proc = stack.spawn("envoy-istio-like", harness.envoy_argv(config, 2, extra=["--config-yaml", override]))
    harness.wait_until(lambda: harness.http_ok(f"http://127.0.0.1:{admin}/ready"),
                       "envoy /ready", process=proc)
    ensure_window_room(3600, 60)
    assert tally(run_sequential([f"http://127.0.0.1:{listen}/"], 3, tenant=gold)) == Counter({200: 2, 429: 1})
    series = group_series(f"http://127.0.0.1:{admin}")
    assert series[("tenant_ratelimit_group_admitted", (("group", "gold"),))] == 2
    assert series[("tenant_ratelimit_group_refused", (("group", "gold"), ("source", "service")))] == 1


def ratelimit_cluster(name: str, port: int) -> dict:
    return {"name": name, "type": "STATIC", "connect_timeout": "1s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}}},
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{
                "endpoint": {"address": {"socket_address": {
                    "address": harness.LOOPBACK, "port_value": port}}}}]}]}}


# ------------------------------------------------------------------ monitoring

MONITORING = ("--set", "monitoring.prometheus_operator=true")
# The proxies' metrics ports as each platform declares them, in its own sources.
PLATFORM_PORTS = {
    "istio": ("http-envoy-prom", 15090),
    "envoy-gateway": ("metrics", 19001),
}


def monitored(tmp_path: Path, target: str, *args: str) -> list[dict]:
    return build(render_example(tmp_path, target, *MONITORING, *args))


def platform_declares(variant: str, name: str, port: int) -> bool:
    """Istio's injection template and Envoy Gateway's proxy Deployment name
    the port so (read from the pinned modules)."""
    if variant == "istio":
        path = (ship.module_dir(ship.ISTIO_MODULE) / "manifests" / "charts" / "istio-control"
                / "istio-discovery" / "files" / "injection-template.yaml")
        text = path.read_text()
        return f"containerPort: {port}" in text and f"name: {name}" in text
    path = (ship.module_dir(ship.EG_MODULE) / "internal" / "infrastructure" / "kubernetes"
            / "proxy" / "testdata" / "deployments" / "default.yaml")
    doc = yaml.safe_load(path.read_text())
    envoy_c = next(c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "envoy")
    return {"name": name, "containerPort": port, "protocol": "TCP"} in envoy_c["ports"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_monitors_match_the_operators_schema_and_scrape_named_ports(variant, tmp_path, schemas):
    """monitoring.prometheus_operator: monitors.yaml (a PodMonitor for the
    proxies, a ServiceMonitor for the service, or one PodMonitor for the
    sidecar pod) passes the Prometheus Operator's CRDs, and every port it
    scrapes is a named port of the pods or Service it selects, as jobs
    `envoy` and `ratelimit` (the alerts' and the dashboard's)."""
    docs = monitored(tmp_path, variant)
    assert [e for d in docs for e in schemas.errors(d)] == []
    monitors = [d for d in docs if d["apiVersion"] == "monitoring.coreos.com/v1"]
    jobs = {}
    for m in monitors:
        for e in m["spec"].get("endpoints", []) + m["spec"].get("podMetricsEndpoints", []):
            (relabel,) = e["relabelings"]
            jobs[relabel["replacement"]] = (m, e)
    assert set(jobs) == {"envoy", "ratelimit"}, monitors

    m, e = jobs["envoy"]
    assert m["kind"] == "PodMonitor" and e["path"] == "/stats/prometheus"
    broken = copy.deepcopy(m)
    broken["spec"]["podMetricEndpoints"] = broken["spec"].pop("podMetricsEndpoints")
    assert any("podMetricEndpoints" in err for err in schemas.errors(broken))
    want = m["spec"]["selector"]["matchLabels"]
    if variant == "envoy":
        (pod,) = [d for d in docs if d["kind"] == "Deployment"
                  and want.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        ports = {p["name"]: p["containerPort"]
                 for c in pod["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        assert ports[e["port"]] == 9902
        svc_m, svc_e = jobs["ratelimit"]
        assert svc_m is m and ports[svc_e["port"]] == 9090
        service_c = container(pod["spec"]["template"]["spec"], "ratelimit")
    else:
        name, port = PLATFORM_PORTS[variant]
        assert e["port"] == name and platform_declares(variant, name, port)
        if variant == "istio":
            assert want == find(docs, "WasmPlugin")["spec"]["selector"]["matchLabels"]
        else:
            assert m["spec"]["namespaceSelector"] == {"matchNames": ["envoy-gateway-system"]}
            assert want == {**EG_PROXY, "gateway.envoyproxy.io/owning-gateway-name": "my-gateway",
                            "gateway.envoyproxy.io/owning-gateway-namespace": "my-api"}
        svc_m, svc_e = jobs["ratelimit"]
        assert svc_m["kind"] == "ServiceMonitor"
        service = find(docs, "Service", "ratelimit")
        assert svc_m["spec"]["selector"]["matchLabels"] == service["metadata"]["labels"]
        (sp,) = [p for p in service["spec"]["ports"] if p["name"] == svc_e["port"]]
        deployment = find(docs, "Deployment", "ratelimit")
        service_c = container(deployment["spec"]["template"]["spec"], "ratelimit")
        assert {"name": sp["targetPort"], "containerPort": 9090} in service_c["ports"]
    env = {v["name"]: v.get("value") for v in service_c["env"]}
    assert env["USE_PROMETHEUS"] == "true" and env["PROMETHEUS_ADDR"] == ":9090"


@pytest.mark.parametrize("variant", VARIANTS)
def test_prometheus_reaches_the_metrics_ports_and_nothing_more(variant, tmp_path, rendered):
    """The NetworkPolicies admit Prometheus's namespace to the metrics ports
    only; without the setting, nothing of it is written."""
    docs = monitored(tmp_path, variant, "--set", "monitoring.prometheus_namespace=observability")
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"
                and any("namespaceSelector" in peer and "podSelector" not in peer
                        for rule in d["spec"]["ingress"] for peer in rule["from"])]
    (policy,) = policies
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "observability"}}}]
    ports = {p["port"] for p in rule["ports"]}
    assert ports == ({9902, 9090} if variant == "envoy" else {9090})
    (pod,) = selected(policy, docs)
    assert ports <= pod["ports"]
    plain = rendered[variant]
    assert not [d for d in plain if d["apiVersion"].startswith("monitoring.coreos.com")]
    assert "monitors.yaml" not in {p.name for p in (DEPLOY / variant).iterdir()}


def test_plain_envoys_stats_listener_serves_prometheus_and_nothing_else(stack, tmp_path):
    """--target envoy with the setting: envoy.yaml's listener on
    monitoring.envoy_metrics_port serves /stats/prometheus from the admin
    (which stays on 127.0.0.1), and no other admin path."""
    limits = {"x-tenant-id": {"default": {"perhour": 5}}}
    gen = stack.generate(limits)
    rls = stack.ratelimit(stack.redis(), gen)
    upstream = stack.upstream()
    listen, admin, metrics = harness.free_port(), harness.free_port(), harness.free_port()
    files = harness.render_target(
        limits, "envoy", tmp_path / "envoy", "--domain", gen.domain, *MONITORING,
        "--set", f"monitoring.envoy_metrics_port={metrics}", "--set", f"envoy.listen_port={listen}",
        "--set", f"envoy.admin_port={admin}", "--set", f"envoy.app_port={upstream.listen_port}",
        "--set", f"service.port={rls.grpc_port}", "--set", f"envoy.wasm_path={harness.WASM}")
    boot = yaml.safe_load(files["envoy.yaml"])
    for listener in boot["static_resources"]["listeners"]:
        # Loopback here (the rendered file listens on every address).
        assert listener["address"]["socket_address"]["address"] == "0.0.0.0"
        listener["address"]["socket_address"]["address"] = harness.LOOPBACK
    assert boot["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": admin}
    config = tmp_path / "envoy-metrics.yaml"
    config.write_text(yaml.safe_dump(boot))
    proc = stack.spawn("envoy-metrics", harness.envoy_argv(config, 1))
    harness.wait_until(lambda: harness.http_ok(f"http://127.0.0.1:{admin}/ready"),
                       "envoy /ready", process=proc)
    r = harness.send(f"http://127.0.0.1:{listen}/", tenant=unique("tenant"))
    assert r.status == 200 and "x-ratelimit-limit" in r.headers, r
    base = f"http://127.0.0.1:{metrics}"
    scrape = requests.get(f"{base}/stats/prometheus", timeout=5)
    assert scrape.status_code == 200, scrape.text[:500]
    names = {f.name for f in text_string_to_metric_families(scrape.text)}
    assert "tenant_ratelimit_allowed" in names, sorted(names)[:20]
    for path in ("/stats", "/config_dump", "/clusters", "/stats/prometheus/x"):
        assert requests.get(base + path, timeout=5).status_code == 404, path
    assert requests.post(f"{base}/quitquitquit", timeout=5).status_code == 404
    assert proc.alive()


# ------------------------------------------------------------------ ratelimit-counter

COUNTER = ("--service", "counter")


def counter_pod(docs: list[dict], variant: str) -> dict:
    name = "my-api" if variant == "envoy" else "ratelimit"
    return find(docs, "Deployment", name)["spec"]["template"]["spec"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_counter_is_rendered_to_the_real_schema_with_its_team_file_and_check_accepts_it(
        variant, tmp_path, schemas):
    """render --service counter: ratelimit-counter instead of
    envoyproxy/ratelimit, its team file (<domain>.json) in the ConfigMap it
    mounts, probes on /readyz and /healthz of a named port, the filter told
    it calls the counter; kustomize builds it, every object passes the real
    schema, and `check` accepts the pair."""
    out = render_example(tmp_path, variant, *COUNTER)
    docs = build(out)
    assert [e for d in docs for e in schemas.errors(d)] == []
    assert "ratelimit.yaml" not in {p.name for p in out.iterdir()}
    pod = counter_pod(docs, variant)
    c = container(pod, "counter")
    assert c["image"].startswith("tenant-ratelimit-counter:") and c["command"] == ["/bin/ratelimit-counter"]
    args = dict(zip(c["args"][::2], c["args"][1::2]))
    assert args["--store"] == "redis://ratelimit-redis:6379"
    assert args["--descriptor-key"] == "tenant"
    host = "127.0.0.1" if variant == "envoy" else "0.0.0.0"
    assert args["--grpc-addr"] == f"{host}:8081"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert c[probe]["httpGet"]["path"] == path
        assert args["--http-addr"] == f"0.0.0.0:{ports[c[probe]['httpGet']['port']]}"
    # The mounted ConfigMap holds the team file under the domain's name.
    (mount,) = c["volumeMounts"]
    assert mount["mountPath"] == args["--limits"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    configmap = next(d for d in docs if d["kind"] == "ConfigMap"
                     and d["metadata"]["name"] == volume["configMap"]["name"])
    assert list(configmap["data"]) == ["internal-api.json"]
    assert json.loads(configmap["data"]["internal-api.json"]) == \
        json.loads((harness.REPO / "e2e" / "limits.json").read_text())
    plugin_file = {"istio": "wasmplugin.yaml", "envoy-gateway": "envoyextensionpolicy.yaml",
                   "envoy": "envoy.yaml"}[variant]
    if variant == "istio":
        config = find(docs, "WasmPlugin")["spec"]["pluginConfig"]
    elif variant == "envoy-gateway":
        config = find(docs, "EnvoyExtensionPolicy")["spec"]["wasm"][0]["config"]
    else:
        config = json.loads(wasm_config(bootstrap_of(docs))["configuration"]["value"])
    assert config["rate_limit_service"]["service"] == "counter"
    proc = harness.run_cli("check", "--plugin-config", out / plugin_file,
                           "--service-config", out / "internal-api.json")
    assert proc.stdout.startswith("ok: "), proc.stdout + proc.stderr
    # envoyproxy/ratelimit's YAML is not the counter's configuration.
    plain = render_example(tmp_path / "plain", variant)
    wrong = harness.run_cli("check", "--plugin-config", plain / plugin_file,
                            "--service-config", out / "internal-api.json", check=False)
    assert wrong.returncode == 1 and "envoyproxy/ratelimit" in wrong.stderr, wrong.stderr


@pytest.mark.parametrize("variant", VARIANTS)
def test_only_the_proxies_reach_the_counter_and_only_the_counter_reaches_redis(variant, tmp_path):
    docs = build(render_example(tmp_path, variant, *COUNTER))
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}
    if variant == "envoy":
        (pod,) = selected(policies["my-api-envoy-only"], docs)
        assert policies["my-api-envoy-only"]["spec"]["ingress"] == [
            {"from": [], "ports": [{"protocol": "TCP", "port": 8000}]}]
        service_pods = {"app": "my-api"}
    else:
        policy = policies["ratelimit-from-proxies"]
        (pod,) = selected(policy, docs)
        service_pods = {"app.kubernetes.io/name": "ratelimit"}
        inject = {"sidecar.istio.io/inject": "true"} if variant == "istio" else {}
        assert pod["labels"] == service_pods | inject
        assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8081}]
    redis_policy = policies[next(n for n in policies if n.startswith("ratelimit-redis-from-"))]
    assert redis_policy["spec"]["ingress"][0]["from"] == [{"podSelector": {"matchLabels": service_pods}}]


@pytest.mark.parametrize("variant", ("istio", "envoy"))
def test_the_counters_metrics_are_scraped_from_its_http_port(variant, tmp_path, schemas):
    docs = monitored(tmp_path, variant, *COUNTER)
    assert [e for d in docs for e in schemas.errors(d)] == []
    c = container(counter_pod(docs, variant), "counter")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    monitors = [d for d in docs if d["apiVersion"] == "monitoring.coreos.com/v1"]
    ((m, e),) = [(m, e) for m in monitors
                 for e in m["spec"].get("endpoints", []) + m["spec"].get("podMetricsEndpoints", [])
                 if e["relabelings"][0]["replacement"] == "ratelimit"]
    assert e["path"] == "/metrics"
    if m["kind"] == "ServiceMonitor":
        (sp,) = [p for p in find(docs, "Service", "ratelimit")["spec"]["ports"] if p["name"] == e["port"]]
        assert ports[sp["targetPort"]] == 9090
    else:
        assert ports[e["port"]] == 9090
    assert args_of(c)["--http-addr"] == "0.0.0.0:9090"
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith(
        "-metrics-from-prometheus")]
    assert 9090 in {p["port"] for p in policy["spec"]["ingress"][0]["ports"]}


def args_of(c: dict) -> dict[str, str]:
    return dict(zip(c["args"][::2], c["args"][1::2]))


def test_the_counter_with_its_own_memory_is_one_replica_without_redis(tmp_path, schemas):
    docs = build(render_example(tmp_path, "istio", *COUNTER, "--set", "redis.url=memory"))
    assert [e for d in docs for e in schemas.errors(d)] == []
    assert not [d for d in docs if d["kind"] == "StatefulSet"]
    deployment = find(docs, "Deployment", "ratelimit")
    assert deployment["spec"]["replicas"] == 1
    assert args_of(container(deployment["spec"]["template"]["spec"], "counter"))["--store"] == "memory"


def test_the_counters_redis_password_comes_from_the_secret(tmp_path):
    docs = build(render_example(tmp_path, "envoy-gateway", *COUNTER,
                                "--set", "redis.auth_secret.name=ratelimit-redis"))
    c = container(counter_pod(docs, "envoy-gateway"), "counter")
    assert c["env"] == [{"name": "REDIS_AUTH", "valueFrom": {
        "secretKeyRef": {"name": "ratelimit-redis", "key": "password"}}}]


def test_the_plain_envoy_pieces_limit_with_the_counter_on_a_real_stack(stack, tmp_path):
    """render --target envoy --service counter on loopback: the counter runs
    the team file render wrote (<domain>.json, in a directory as the
    ConfigMap mounts it), Envoy the filter and fragment; a sliding window,
    which only the counter counts, holds."""
    from counter import Counter as CounterService
    gold = unique("tenant-gold")
    limits = {"x-tenant-id": {"default": {"perhour": 100},
                              "gold": {"perhour": 3, "window": "sliding", "header_value": [gold]}}}
    domain = unique("internal-api")
    limits_dir = tmp_path / "limits"
    limits_dir.mkdir()
    upstream = stack.upstream()
    grpc_port = harness.free_port()
    files = harness.render_target(
        limits, "envoy", tmp_path / "envoy", "--domain", domain, *COUNTER,
        "--set", f"service.port={grpc_port}", "--set", f"envoy.wasm_path={harness.WASM}",
        "--plugin", f"rate_limit_service.timeout_ms={harness.COUNTING_TIMEOUT_MS}")
    assert "ratelimit.yaml" not in files
    (limits_dir / f"{domain}.json").write_text(files[f"{domain}.json"])
    counter = CounterService(stack, {}, limits_dir=limits_dir)
    http_filter = yaml.safe_load(files["http-filter.yaml"])
    listen, admin = harness.free_port(), harness.free_port()
    config = tmp_path / "own.yaml"
    config.write_text(yaml.safe_dump(listener_bootstrap(listen, admin, upstream.listen_port, http_filter)))
    fragment = files["bootstrap-fragment.yaml"].replace(f"port_value: {grpc_port}",
                                                        f"port_value: {counter.grpc_port}")
    proc = stack.spawn("envoy-plain-counter", harness.envoy_argv(config, 2, extra=["--config-yaml", fragment]))
    harness.wait_until(lambda: harness.http_ok(f"http://127.0.0.1:{admin}/ready"),
                       "envoy /ready", process=proc)
    results = run_sequential([f"http://127.0.0.1:{listen}/"], 6, tenant=gold)
    assert tally(results) == Counter({200: 3, 429: 3}), harness.summary(results)


# ------------------------------------------------------------------ TLS to the service and to Redis

KUBE_TLS = ("--set", "service.tls.server_secret=ratelimit-server-tls",
            "--set", "service.tls.client_secret=ratelimit-client-tls",
            "--set", "redis.url=rediss://redis.example.com:6380",
            "--set", "redis.tls.secret=ratelimit-redis-tls", "--set", "redis.tls.mutual=true")
# Where render mounts the Secrets (tls.crt, tls.key, ca.crt in each).
MOUNTS = {"/etc/ratelimit-tls/client": "client", "/etc/ratelimit-tls/server": "server"}


def render_refused(tmp_path: Path, target: str, *args: str) -> str:
    """render's error output for settings it must refuse."""
    proc = harness.run_cli("render", harness.REPO / "e2e" / "limits.json", "--deployment",
                           DEPLOY / "deployment.yaml", "--target", target, "--out", tmp_path / target,
                           *args, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return proc.stderr


def _local_certs(text: str, certs) -> str:
    """The Secrets' mounted files replaced by the test's own, so that a real
    Envoy can load what render wrote."""
    files = {"client/ca.crt": certs.ca, "client/tls.crt": certs.client_cert,
             "client/tls.key": certs.client_key}
    for name, path in files.items():
        text = text.replace(f"/etc/ratelimit-tls/{name}", str(path))
    return text


def _validate(bootstrap: dict, tmp_path: Path, name: str) -> None:
    bootstrap["admin"] = {"address": {"socket_address": {
        "address": harness.LOOPBACK, "port_value": harness.free_port()}}}
    for listener in bootstrap.get("static_resources", {}).get("listeners", []):
        listener["address"]["socket_address"] = {"address": harness.LOOPBACK,
                                                 "port_value": harness.free_port()}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(bootstrap))
    proc = subprocess.run([str(harness.ENVOY_BIN), "--mode", "validate", "-c", str(path),
                           "--disable-hot-restart"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("service", ("envoy-ratelimit", "counter"))
@pytest.mark.parametrize("variant", VARIANTS)
def test_tls_renders_for_every_target_and_both_services_and_check_reads_it_back(
        variant, service, tmp_path, schemas):
    """service.tls and redis.tls: the manifests pass their schemas, Envoy
    accepts the rate-limit cluster's transport_socket (its files replaced by
    certificates made here), and check finds both sides agreeing. Istio
    takes none of ours: the mesh's mutual TLS, required on the service's
    pods by a PeerAuthentication, covers the hop."""
    from redis_extra import make_certs
    args = ("--service", service) + (() if variant == "istio" else KUBE_TLS)
    out = render_example(tmp_path, variant, *args)
    docs = build(out)
    assert [e for d in docs for e in schemas.errors(d)] == []
    if variant == "istio":
        pa = find(docs, "PeerAuthentication", "ratelimit")
        assert pa["spec"] == {"selector": {"matchLabels": {"app.kubernetes.io/name": "ratelimit"}},
                              "mtls": {"mode": "STRICT"}}
        pod = find(docs, "Deployment", "ratelimit")["spec"]["template"]["metadata"]
        assert pod["labels"]["sidecar.istio.io/inject"] == "true"
        assert "transport_socket" not in json.dumps(docs)
        refused = render_refused(tmp_path / "tls", variant, *KUBE_TLS)
        assert "service.tls: under Istio the mesh's mutual TLS covers the hop" in refused
        return
    certs = make_certs(tmp_path / "certs")
    eg = variant == "envoy-gateway"
    if eg:
        proxy = find(docs, "EnvoyProxy")
        fragment = yaml.safe_load(_local_certs(proxy["spec"]["bootstrap"]["value"], certs))
        mounts = proxy["spec"]["provider"]["kubernetes"]["envoyDeployment"]
        assert mounts["pod"]["volumes"][0]["secret"]["secretName"] == "ratelimit-client-tls"
        assert mounts["container"]["volumeMounts"][0]["mountPath"] == "/etc/ratelimit-tls/client"
        # Its cluster's DNS name resolves only in the cluster: validate the
        # TLS of it against an address.
        (cluster,) = fragment["static_resources"]["clusters"]
        endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        endpoint["address"]["socket_address"]["address"] = harness.LOOPBACK
        cluster["type"] = "STATIC"
        cluster.pop("dns_lookup_family")
        _validate(fragment, tmp_path, "eg-fragment")
        service_pods = find(docs, "Deployment", "ratelimit")
    else:
        bootstrap = yaml.safe_load(_local_certs(
            find(docs, "ConfigMap", "envoy-config")["data"]["envoy.yaml"], certs))
        wasm_config(bootstrap)["vm_config"]["code"]["local"]["filename"] = str(harness.WASM)
        _validate(bootstrap, tmp_path, "sidecar-envoy")
        service_pods = find(docs, "Deployment", "my-api")
        envoy = container(service_pods["spec"]["template"]["spec"], "envoy")
        assert {"name": "ratelimit-client-tls", "mountPath": "/etc/ratelimit-tls/client",
                "readOnly": True} in envoy["volumeMounts"]
    volumes = {v["name"]: v.get("secret", {}).get("secretName")
               for v in service_pods["spec"]["template"]["spec"]["volumes"]}
    assert volumes["service-tls"] == "ratelimit-server-tls"
    assert volumes["redis-tls"] == "ratelimit-redis-tls"
    text = json.dumps(service_pods)
    if service == "counter":
        for flag in ("--tls-cert", "--tls-key", "--tls-client-ca", "--redis-ca", "--redis-cert",
                     "rediss://redis.example.com:6380"):
            assert flag in text
    else:
        for env in ("GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT", "GRPC_CLIENT_TLS_CACERT",
                    "REDIS_TLS_CACERT", "REDIS_TLS_CLIENT_CERT"):
            assert f'"name": "{env}"' in text
    rules = out / ("internal-api.json" if service == "counter" else "ratelimit.yaml")
    plugin = out / ("envoyextensionpolicy.yaml" if eg else "envoy.yaml")
    sides = ["envoyproxy.yaml", "ratelimit-service.yaml"] if eg else ["envoy.yaml", "sidecar.yaml"]
    deployed = [a for s in sides for a in ("--deployed", out / s)]
    proc = harness.run_cli("check", "--plugin-config", plugin, "--service-config", rules, *deployed)
    assert "agree on TLS (mutual TLS)" in proc.stdout
    # The same service against an Envoy rendered without TLS: named.
    plain = render_example(tmp_path / "plain", variant, "--service", service)
    proc = harness.run_cli("check", "--plugin-config", plugin, "--service-config", rules,
                           "--deployed", plain / sides[0], "--deployed", out / sides[1], check=False)
    assert proc.returncode == 1
    assert "has no transport_socket, but" in proc.stderr and "serves gRPC over TLS only" in proc.stderr


def test_a_tls_url_without_its_settings_is_refused_naming_what_is_missing(tmp_path):
    for service, url in (("counter", "rediss://redis.example.com:6380"),
                         ("envoy-ratelimit", "rediss://redis.example.com:6380")):
        refused = render_refused(tmp_path / service, "envoy-gateway", "--service", service,
                                 "--set", f"redis.url={url}")
        assert f'--set redis.url: redis.url: "{url}" is Redis over TLS, and redis.tls is not set' in refused
    refused = render_refused(tmp_path / "memory", "istio", "--service", "counter",
                             "--set", "redis.url=memory", "--set", "service.replicas=3")
    assert ("service.replicas: 3 replicas of a counter with the memory store (redis.url: memory) "
            "would each count alone") in refused

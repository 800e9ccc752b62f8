"""deploy/: the Kubernetes manifests, rendered by the pinned kustomize and
validated against the real schemas, read at test time from the pinned Go
modules' own files (Kubernetes' OpenAPI v3 from k8s.io/kubernetes, Istio's
CRDs from istio.io/istio, Envoy Gateway's from github.com/envoyproxy/gateway).
Nothing here has run in a Kubernetes cluster; what can be run locally is:
the sidecar's Envoy bootstrap (envoy --mode validate), and its readiness
probe and preStop drain commands against a real Envoy."""

from __future__ import annotations

import base64
import copy
import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

import harness
import ship

DEPLOY = harness.REPO / "deploy"
VARIANTS = ("sidecar", "istio", "envoy-gateway")
ISTIO_CLUSTER = "outbound|8081||ratelimit.my-api.svc.cluster.local"


# ------------------------------------------------------------------ rendering

@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    """deploy/ copied, its generated/ files written by deploy/render.py, each variant built."""
    root = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY, root, ignore=shutil.ignore_patterns("generated", "__pycache__"))
    ship.run([harness.REPO / ".deps" / "venv" / "bin" / "python", DEPLOY / "render.py",
              "--root", root])
    out = {}
    for variant in VARIANTS:
        text = ship.run([ship.KUSTOMIZE, "build", root / variant]).stdout
        out[variant] = [d for d in yaml.safe_load_all(text) if d]
    return out


def find(docs: list[dict], kind: str, name: str | None = None) -> dict:
    hits = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name
                                                      or d["metadata"]["name"].startswith(name + "-"))]
    assert len(hits) == 1, f"{kind} {name}: {len(hits)} found"
    return hits[0]


# ------------------------------------------------------------------ schemas

def strict(schema):
    """Refuse unknown fields, as `kubectl apply --validate=strict` does:
    additionalProperties false wherever properties are listed and nothing
    says unknown fields are kept."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    return schema


class Schemas:
    def __init__(self):
        self.validators: dict[tuple[str, str], jsonschema.protocols.Validator] = {}
        k8s = ship.module_dir(ship.K8S_MODULE) / "api" / "openapi-spec" / "v3"
        for f in ("api__v1_openapi.json", "apis__apps__v1_openapi.json"):
            components = json.loads((k8s / f).read_text())["components"]
            components = strict(components)
            for name, s in components["schemas"].items():
                for gvk in s.get("x-kubernetes-group-version-kind", []):
                    api = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
                    self.validators[(api, gvk["kind"])] = jsonschema.Draft7Validator(
                        {"$ref": f"#/components/schemas/{name}", "components": components})
        istio = ship.module_dir(ship.ISTIO_MODULE) / "manifests" / "charts" / "base" / "files" / "crd-all.gen.yaml"
        eg = (ship.module_dir(ship.EG_MODULE) / "charts" / "gateway-helm" / "charts" / "crds" / "crds"
              / "generated" / "gateway.envoyproxy.io_envoyextensionpolicies.yaml")
        for path in (istio, eg):
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
                    schema = strict(schema)
                    self.validators[(f"{group}/{version['name']}", kind)] = \
                        jsonschema.Draft7Validator(schema)

    def errors(self, doc: dict) -> list[str]:
        v = self.validators.get((doc["apiVersion"], doc["kind"]))
        if v is None:
            return [f"no schema for {doc['apiVersion']} {doc['kind']}"]
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


def test_the_schema_check_catches_an_unknown_field_and_a_bad_value(rendered, schemas):
    dep = copy.deepcopy(find(rendered["sidecar"], "Deployment", "my-api"))
    dep["spec"]["template"]["spec"]["containers"][1]["readinesProbe"] = {}
    assert any("readinesProbe" in e for e in schemas.errors(dep))
    wp = copy.deepcopy(find(rendered["istio"], "WasmPlugin"))
    wp["spec"]["phase"] = "AUTHORIZATION"
    assert any("spec.phase" in e for e in schemas.errors(wp))
    eep = copy.deepcopy(find(rendered["envoy-gateway"], "EnvoyExtensionPolicy"))
    eep["spec"]["wasm"][0]["code"]["type"] = "OCI"
    assert any("code.type" in e for e in schemas.errors(eep))


# ------------------------------------------------------------------ content

def generated_plugin_config(tmp_path: Path, cluster: str) -> dict:
    harness.run_cli("generate", harness.REPO / "e2e" / "limits.json", "--domain", "internal-api",
                    "--cluster", cluster, "--out", tmp_path)
    return json.loads((tmp_path / "plugin-config.json").read_text())


def test_the_istio_and_envoy_gateway_plugin_configs_are_what_ratelimit_config_generates(
        rendered, tmp_path):
    wp = find(rendered["istio"], "WasmPlugin")
    assert wp["spec"]["pluginConfig"] == generated_plugin_config(tmp_path / "i", ISTIO_CLUSTER)
    assert wp["spec"]["url"].startswith("oci://")
    eep = find(rendered["envoy-gateway"], "EnvoyExtensionPolicy")
    assert eep["spec"]["wasm"][0]["config"] == generated_plugin_config(tmp_path / "e", "ratelimit")
    assert eep["spec"]["wasm"][0]["rootID"] == wp["spec"]["pluginName"] == "tenant_ratelimit"
    # Both proxies call the shared service of deploy/ratelimit, which serves the generated rules.
    for variant in ("istio", "envoy-gateway"):
        cm = find(rendered[variant], "ConfigMap", "ratelimit-config")
        assert cm["data"]["ratelimit.yaml"] == (tmp_path / "i" / "ratelimit.yaml").read_text()


def sidecar_pod(rendered) -> dict:
    return find(rendered["sidecar"], "Deployment", "my-api")["spec"]["template"]["spec"]


def container(pod: dict, name: str) -> dict:
    return next(c for c in pod["containers"] if c["name"] == name)


def test_the_sidecar_pod_probes_the_services_healthcheck_and_drains_envoy_within_its_grace(rendered):
    pod = sidecar_pod(rendered)
    assert {c["name"] for c in pod["containers"]} == {"app", "envoy", "ratelimit"}
    rl = container(pod, "ratelimit")
    assert rl["readinessProbe"]["httpGet"]["path"] == "/healthcheck"
    envoy = container(pod, "envoy")
    pre_stop = " ".join(envoy["lifecycle"]["preStop"]["exec"]["command"])
    assert "POST /drain_listeners?graceful" in pre_stop
    drain_s = int(envoy["args"][envoy["args"].index("--drain-time-s") + 1])
    assert f"sleep {drain_s}" in pre_stop
    # The grace period covers the drain, with time left for Envoy to exit.
    assert pod["terminationGracePeriodSeconds"] >= drain_s + 10
    app_sleep = container(pod, "app")["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert drain_s <= app_sleep < pod["terminationGracePeriodSeconds"]


def test_the_sidecar_configmaps_hold_the_built_wasm_and_a_bootstrap_envoy_accepts(rendered, tmp_path):
    docs = rendered["sidecar"]
    wasm_cm = find(docs, "ConfigMap", "tenant-ratelimit-wasm")
    assert base64.b64decode(wasm_cm["binaryData"]["tenant_ratelimit.wasm"]) == harness.WASM.read_bytes()
    bootstrap = find(docs, "ConfigMap", "envoy-config")["data"]["envoy.yaml"]
    assert "address: 127.0.0.1, port_value: 9901" in bootstrap  # admin on loopback only
    local = tmp_path / "envoy.yaml"
    local.write_text(bootstrap.replace("/etc/envoy-wasm/tenant_ratelimit.wasm", str(harness.WASM))
                     .replace("port_value: 8000", f"port_value: {harness.free_port()}")
                     .replace("port_value: 9901", f"port_value: {harness.free_port()}"))
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

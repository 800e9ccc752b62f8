"""The WasmPlugin checked by Istio's own code at the pinned version
(tools/istio-validate: istio.io/istio/pkg/config/validation, as istiod's
webhook and `istioctl validate` run it, and the CRD's schema and CEL rules
from the module's crd-all.gen.yaml, as the API server runs them).

istiod itself does not run here: its file config source (fs://) stores a
WasmPlugin, but only its Kubernetes config path turns WasmPlugins into the
extensions it serves to proxies."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

import harness
import ship

ISTIO_VALIDATE = harness.tool("TRL_ISTIO_VALIDATE", ".deps/gobin/istio-validate")
SHIPPED = harness.REPO / "deploy" / "istio" / "wasmplugin.yaml"
HEX = "0123456789abcdef" * 4


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    """The WasmPlugin `ratelimit-config render` writes for the example with a
    pinned digest and the other fail strategy than deploy/'s."""
    out = tmp_path_factory.mktemp("istio")
    harness.run_cli("render", harness.REPO / "e2e" / "limits.json",
                    "--deployment", harness.REPO / "deploy" / "deployment.yaml",
                    "--target", "istio", "--sha256", HEX, "--fail-strategy", "closed",
                    "--out", out)
    return out / "wasmplugin.yaml"


@pytest.fixture(scope="module")
def crds() -> Path:
    return ship.module_dir(ship.ISTIO_MODULE) / "manifests" / "charts" / "base" / "files" / "crd-all.gen.yaml"


def validate(crds: Path, *files: Path) -> tuple[int, list[dict]]:
    proc = ship.run([ISTIO_VALIDATE, "-crd", crds, *files], check=False)
    if proc.returncode not in (0, 1):
        raise harness.HarnessError(f"istio-validate exited {proc.returncode}: {proc.stderr}")
    # Istio may log a line to stdout while it initialises, before the tool runs.
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()
                             if line.startswith("{")]


@pytest.fixture
def plugin(rendered):
    return lambda: yaml.safe_load(rendered.read_text())


def errors_of(crds: Path, tmp_path: Path, doc: dict) -> list[str]:
    path = tmp_path / "wasmplugin.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, results = validate(crds, path)
    (result,) = results
    assert result["kind"] == "WasmPlugin"
    assert code == (1 if result["errors"] else 0)
    return result["errors"]


@pytest.mark.parametrize("which", ["rendered", "deploy"])
def test_the_wasmplugin_passes_istios_validation(crds, rendered, which):
    path = rendered if which == "rendered" else SHIPPED
    doc = yaml.safe_load(path.read_text())
    assert doc["spec"]["failStrategy"] == ("FAIL_CLOSE" if which == "rendered" else "FAIL_OPEN")
    assert doc["spec"].get("sha256") == (HEX if which == "rendered" else None)
    code, results = validate(crds, path)
    assert [(r["kind"], r["errors"]) for r in results] == [("WasmPlugin", [])]
    assert code == 0


@pytest.mark.parametrize("strategy", ["FAIL_CLOSE", "FAIL_OPEN"])
def test_both_fail_strategies_are_valid(crds, plugin, tmp_path, strategy):
    doc = plugin()
    doc["spec"]["failStrategy"] = strategy
    assert errors_of(crds, tmp_path, doc) == []


@pytest.mark.parametrize("mode", ["SERVER", "CLIENT", "CLIENT_AND_SERVER"])
def test_every_istio_mode_and_a_priority_render_is_valid(crds, tmp_path, mode):
    """`--set istio.mode=…` (the WasmPlugin's match), `istio.name` and
    `istio.priority`, as render writes them, pass Istio's validation."""
    harness.run_cli("render", harness.REPO / "e2e" / "limits.json",
                    "--deployment", harness.REPO / "deploy" / "deployment.yaml",
                    "--target", "istio", "--sha256", HEX, "--set", f"istio.mode={mode}",
                    "--set", "istio.name=tenant-ratelimit-b", "--set", "istio.priority=10",
                    "--out", tmp_path / "out")
    path = tmp_path / "out" / "wasmplugin.yaml"
    doc = yaml.safe_load(path.read_text())
    assert doc["spec"]["match"] == [{"mode": mode}]
    assert (doc["metadata"]["name"], doc["spec"]["priority"]) == ("tenant-ratelimit-b", 10)
    code, results = validate(crds, path)
    assert [(r["kind"], r["errors"]) for r in results] == [("WasmPlugin", [])]
    assert code == 0


@pytest.mark.parametrize("value, message", [
    # The digest as `make oci` and registries print it: refused.
    ("sha256:" + HEX, "sha256 field must be 64 characters long"),
    (HEX[:63], "sha256 field must be 64 characters long"),
    (HEX.upper(), "sha256 field must match [a-f0-9]{64} pattern"),
])
def test_sha256_must_be_64_lowercase_hex_characters(crds, plugin, tmp_path, value, message):
    doc = plugin()
    doc["spec"]["sha256"] = value
    errors = errors_of(crds, tmp_path, doc)
    assert message in errors
    # The CRD's pattern says the same to the API server.
    assert any(e.startswith("schema: ") and "spec.sha256" in e for e in errors), errors


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update(phase="AUTHORIZATION"), "spec: "),
    (lambda s: s.update(failStrategy="FAIL_DENY"), "spec: "),
    (lambda s: s.update(pluginConfg={}), "unknown field"),
    (lambda s: s.update(url="ftp://registry.example.com/tenant-ratelimit:0.1.0"),
     "url contains unsupported scheme: ftp"),
    (lambda s: s.update(targetRefs=[{"kind": "Gateway", "group": "gateway.networking.k8s.io",
                                     "name": "gw"}]),
     "only one of targetRefs or workloadSelector can be set"),
])
def test_istio_refuses_a_broken_wasmplugin(crds, plugin, tmp_path, change, message):
    doc = copy.deepcopy(plugin())
    change(doc["spec"])
    errors = errors_of(crds, tmp_path, doc)
    assert any(message in e for e in errors), errors

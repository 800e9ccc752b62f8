"""The OCI images `make oci` builds, through a registry and back, the way
Istio and Envoy Gateway fetch them, and into Envoy the way they hand a module
over (vm_config.code.remote with http_uri and sha256)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections import Counter
from pathlib import Path

import pytest
import harness
import ship
from harness import ensure_window_room, run_sequential, tally, unique

WASM_CONFIG = "application/vnd.module.wasm.config.v1+json"
WASM_CONTENT = "application/vnd.module.wasm.content.layer.v1+wasm"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def blob(layout: Path, digest: str) -> bytes:
    algo, hexd = digest.split(":")
    return (layout / "blobs" / algo / hexd).read_bytes()


def manifest(layout: Path) -> tuple[str, dict]:
    index = json.loads((layout / "index.json").read_text())
    assert len(index["manifests"]) == 1, index
    digest = index["manifests"][0]["digest"]
    return digest, json.loads(blob(layout, digest))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, dict]:
    return ship.build_images(tmp_path_factory.mktemp("oci"))


def test_two_builds_give_byte_identical_images_with_the_same_digests(images, tmp_path):
    again = ship.build_images(tmp_path / "again")
    assert {v: i["digest"] for v, i in again.items()} == {v: i["digest"] for v, i in images.items()}
    for variant in ("compat", "oci"):
        a, b = Path(images[variant]["layout"]), Path(again[variant]["layout"])
        files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
        assert files_a == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
        for rel in files_a:
            assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_compat_variant_is_one_tar_gzip_layer_holding_plugin_wasm(images):
    layout = Path(images["compat"]["layout"])
    digest, m = manifest(layout)
    assert digest == images["compat"]["digest"]
    assert m["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert m["annotations"] == {"module.wasm.image/variant": "compat",
                                "org.opencontainers.image.version": ship.project_version()}
    assert [layer["mediaType"] for layer in m["layers"]] == [OCI_LAYER]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(layout, m["layers"][0]["digest"])))) as tf:
        assert tf.getnames() == ["plugin.wasm"]
        member = tf.extractfile("plugin.wasm")
        assert member is not None and member.read() == harness.WASM.read_bytes()


def test_oci_variant_has_the_wasm_config_and_the_module_as_its_own_layer(images):
    layout = Path(images["oci"]["layout"])
    _, m = manifest(layout)
    assert m["config"]["mediaType"] == WASM_CONFIG
    assert json.loads(blob(layout, m["config"]["digest"]))["type"] == "envoy_proxy"
    # Istio's and Envoy Gateway's fetchers want exactly two layers here.
    assert sorted(layer["mediaType"] for layer in m["layers"]) == [WASM_CONFIG, WASM_CONTENT]
    content = next(layer for layer in m["layers"] if layer["mediaType"] == WASM_CONTENT)
    assert blob(layout, content["digest"]) == harness.WASM.read_bytes()


# ------------------------------------------------------------------ registry

@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """`crane registry serve` on a loopback port, both variants pushed to it."""
    reg = ship.Registry(tmp_path_factory.mktemp("registry"))
    try:
        yield reg.address
    finally:
        reg.close()


@pytest.fixture(scope="module")
def pushed(registry, images) -> dict[str, str]:
    refs = {}
    for variant, tag in (("compat", "0.1.0"), ("oci", "0.1.0-oci")):
        ref = f"{registry}/tenant-ratelimit:{tag}"
        ship.run([ship.CRANE, "push", images[variant]["layout"], ref])
        # The registry holds the very manifest that was built.
        assert ship.run([ship.CRANE, "digest", ref]).stdout.strip() == images[variant]["digest"]
        refs[variant] = ref
    return refs


@pytest.mark.parametrize("variant", ["compat", "oci"])
def test_the_image_in_the_registry_carries_the_projects_version(variant, pushed, images):
    """What `make oci` stamps, as a registry client reads it back: the
    manifest's org.opencontainers.image.version is the workspace's version
    (the CLI's --version, the CHANGELOG's section)."""
    version = ship.project_version()
    assert images[variant]["version"] == version
    m = json.loads(ship.run([ship.CRANE, "manifest", pushed[variant]]).stdout)
    assert m["annotations"]["org.opencontainers.image.version"] == version, m
    cli = ship.run([harness.CLI, "--version"])
    assert cli.stdout.split() == ["ratelimit-config", version]


def fetch(ref: str, registry: str, out: Path, checksum: str | None = None,
          check: bool = True):
    argv = [ship.WASM_FETCH, "-cache", out.parent / f"{out.name}.cache", "-out", out,
            "-insecure", registry, "-timeout", "30s"]
    if checksum is not None:
        argv += ["-checksum", checksum]
    return ship.run([*argv, f"oci://{ref}"], check=check)


@pytest.mark.parametrize("variant", ["compat", "oci"])
def test_istios_wasm_fetcher_pulls_the_built_module_back(variant, registry, pushed, images,
                                                         tmp_path):
    out = tmp_path / "plugin.wasm"
    proc = fetch(pushed[variant], registry, out)
    assert out.read_bytes() == harness.WASM.read_bytes()
    assert json.loads(proc.stdout.splitlines()[-1])["sha256"] == ship.sha256_hex(harness.WASM.read_bytes())

    # For an oci:// URL the checksum Istio checks (WasmPlugin.spec.sha256) is
    # the image manifest's digest, not the module's sha256.
    manifest_hex = images[variant]["digest"].split(":")[1]
    fetch(pushed[variant], registry, tmp_path / "by-digest.wasm", checksum=manifest_hex)
    wrong = fetch(pushed[variant], registry, tmp_path / "by-module-sha.wasm",
                  checksum=ship.sha256_hex(harness.WASM.read_bytes()), check=False)
    assert wrong.returncode == 1
    assert "which does not match" in wrong.stderr, wrong.stderr


# ------------------------------------------------------------------ envoy

RULE = {"perhour": 5}


def remote_code_config(text: str, *, http_port: int, path: str, sha256: str) -> str:
    """The filter Envoy's bootstrap with the module fetched over HTTP, as
    Envoy Gateway hands it over: code.remote.http_uri + sha256."""
    local = f"local: {{ filename: {harness.WASM} }}"
    assert text.count(local) == 1, "envoy.yaml.tmpl changed: update this test"
    text = text.replace(local, (
        "remote: { http_uri: { uri: 'http://127.0.0.1:%d/%s', cluster: wasm_http, timeout: 10s },"
        " sha256: '%s' }" % (http_port, path, sha256)))
    clusters = "\n  clusters:\n"
    assert text.count(clusters) == 1
    return text.replace(clusters, clusters + (
        "  - name: wasm_http\n"
        "    type: STATIC\n"
        "    connect_timeout: 1s\n"
        "    load_assignment:\n"
        "      cluster_name: wasm_http\n"
        "      endpoints:\n"
        "      - lb_endpoints:\n"
        f"        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {http_port} }} }} }}\n"
    ))


@pytest.fixture
def pulled(registry, pushed, tmp_path) -> Path:
    """The module as the fetcher returned it, from the wasm OCI variant."""
    serve = tmp_path / "serve"
    serve.mkdir()
    fetch(pushed["oci"], registry, serve / "tenant_ratelimit.wasm")
    return serve / "tenant_ratelimit.wasm"


def remote_envoy(stack, gen, rls, upstream, server, module: Path, sha256: str,
                 name: str, wait: bool = True) -> harness.Envoy:
    return stack.envoy(
        gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS), rls, upstream, name=name,
        wait=wait, edit=lambda text: remote_code_config(text, http_port=server.port,
                                                        path=module.name, sha256=sha256))


def test_envoy_runs_the_pulled_module_from_http_uri_with_sha256_and_it_limits(stack, pulled):
    server = ship.FileServer(pulled.parent)
    try:
        gen = stack.generate({"x-tenant-id": {"default": RULE}})
        rls = stack.ratelimit(stack.redis(), gen)
        upstream = stack.upstream()
        sha = ship.sha256_hex(pulled.read_bytes())
        envoy = remote_envoy(stack, gen, rls, upstream, server, pulled, sha, "envoy-remote")
        assert f"/{pulled.name}" in ship.QuietHandler.requests_seen

        tenant = unique("tenant-a")
        ensure_window_room(3600, 60)
        results = run_sequential([envoy.url], 12, tenant=tenant)
        assert tally(results) == Counter({200: 5, 429: 7}), harness.summary(results)
        assert [r.status for r in results[:5]] == [200] * 5
        assert envoy.filter_counters()["allowed"] == 5
    finally:
        server.close()


def test_envoy_refuses_a_module_whose_sha256_does_not_match(stack, pulled):
    """The module is fetched but never run: the plugin fails closed, every request 503."""
    server = ship.FileServer(pulled.parent)
    try:
        gen = stack.generate({"x-tenant-id": {"default": RULE}})
        rls = stack.ratelimit(stack.redis(), gen)
        upstream = stack.upstream()
        envoy = remote_envoy(stack, gen, rls, upstream, server, pulled, "0" * 64,
                             "envoy-bad-sha")
        harness.wait_until(lambda: "Plugin tenant_ratelimit failed to load"
                           in envoy.process.log_text(), "the plugin's load failure",
                           deadline_s=20)
        results = run_sequential([envoy.url], 3, tenant=unique("tenant-a"))
        assert tally(results) == Counter({503: 3}), harness.summary(results)
    finally:
        server.close()

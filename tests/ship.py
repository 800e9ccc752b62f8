"""Helpers of the shipping tests (test_oci.py, test_compose.py, test_deploy.py):
the pinned Go tools `make deps-ship` installs, and the source directories of
the pinned Go modules the schemas are read from."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import subprocess
import threading
from pathlib import Path

import harness

REPO = harness.REPO
GOBIN = REPO / ".deps" / "gobin"

CRANE = harness.tool("TRL_CRANE", ".deps/gobin/crane")
KUSTOMIZE = harness.tool("TRL_KUSTOMIZE", ".deps/gobin/kustomize")
OCI_WASM = harness.tool("TRL_OCI_WASM", ".deps/gobin/oci-wasm")
WASM_FETCH = harness.tool("TRL_WASM_FETCH", ".deps/gobin/wasm-fetch")

# The same pins as the Makefile's (it exports them; these are for a bare pytest run).
ISTIO_MODULE = os.environ.get("TRL_ISTIO_MODULE", "istio.io/istio@v0.0.0-20260827124520-eed52ebb66ad")
EG_MODULE = os.environ.get("TRL_EG_MODULE", "github.com/envoyproxy/gateway@v1.9.1")
K8S_MODULE = os.environ.get("TRL_K8S_MODULE", "k8s.io/kubernetes@v1.36.3")
PROM_OPERATOR_MODULE = os.environ.get(
    "TRL_PROM_OPERATOR_MODULE", "github.com/prometheus-operator/prometheus-operator@v0.85.0")


def run(argv: list, timeout: float = 120, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise harness.HarnessError(
            f"{' '.join(map(str, argv))} exited {proc.returncode}\n"
            f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
    return proc


def module_dir(module_at_version: str) -> Path:
    """Where the Go module cache holds a pinned module's files (downloads it if needed)."""
    out = run(["go", "mod", "download", "-json", module_at_version], timeout=600)
    info = json.loads(out.stdout)
    if info.get("Error"):
        raise harness.HarnessError(f"go mod download {module_at_version}: {info['Error']}")
    return Path(info["Dir"])


def project_version() -> str:
    """The project's version: the workspace's in Cargo.toml (the Makefile's VERSION)."""
    text = (harness.REPO / "Cargo.toml").read_text()
    section = text.split("[workspace.package]", 1)[1].split("\n[", 1)[0]
    found = re.search(r'^version = "([^"]+)"$', section, re.M)
    if not found:
        raise harness.HarnessError("Cargo.toml: no version in [workspace.package]")
    return found.group(1)


def build_images(out: Path) -> dict[str, dict]:
    """Both OCI variants of the built module (`oci-wasm`, as `make oci`: with
    the project's version), in OCI image layouts under `out`:
    {variant: {"digest": "sha256:...", "layout": ..., "version": ...}}."""
    proc = run([OCI_WASM, "-wasm", harness.WASM, "-out", out, "-version", project_version()])
    return {v["variant"]: v for v in map(json.loads, proc.stdout.splitlines())}


class Registry:
    """`crane registry serve` on a loopback port (an OCI registry over plain HTTP)."""

    def __init__(self, workdir: Path):
        port = harness.free_port()
        self.address = f"{harness.LOOPBACK}:{port}"
        self.process = harness.Process("registry", [CRANE, "registry", "serve", "--address",
                                                    self.address], workdir / "registry.log")
        try:
            harness.wait_until(lambda: harness.http_ok(f"http://{self.address}/v2/"),
                               "registry /v2/", process=self.process)
        except BaseException:
            self.process.stop()
            raise

    def push(self, layout: str | Path, ref: str) -> str:
        """Push an image layout as `ref` (e.g. "tenant-ratelimit:0.1.0"); the full reference."""
        full = f"{self.address}/{ref}"
        run([CRANE, "push", layout, full])
        return full

    def close(self) -> None:
        self.process.stop()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FileServer:
    """A loopback HTTP server handing out one directory (Envoy's `remote` code source)."""

    def __init__(self, directory: Path):
        handler = lambda *a, **kw: QuietHandler(*a, directory=str(directory), **kw)  # noqa: E731
        self.server = http.server.ThreadingHTTPServer((harness.LOOPBACK, 0), handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    requests_seen: list[str] = []

    def log_message(self, fmt, *args):  # keep pytest's output clean
        QuietHandler.requests_seen.append(self.path)

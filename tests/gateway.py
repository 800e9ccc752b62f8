"""Envoy Gateway in its standalone mode, for the tests: no Kubernetes, nothing
downloaded.

Envoy Gateway reads its resources from a directory (the File resource
provider) and runs each Gateway's Envoy as its own child process (the Host
infrastructure provider, through func-e). func-e runs
`<dataHome>/envoy-versions/<version>/bin/envoy` when it is there, and
downloads that version otherwise: the version is the one the EnvoyProxy
resource's host provider names (`spec.provider.host.envoyVersion`), and this
harness puts the project's Envoy there under its own version. Every
directory Envoy Gateway writes to (its certificates, func-e's data, state and
runtime directories, the Wasm module cache under $HOME/.eg) is inside the
test's work directory.

    proxy = proxy_bootstrap_for_tests(envoyproxy, admin_port=a, rls_port=r, version=envoy_version())
    eg = EnvoyGateway(stack, [*docs, proxy], admin_port=a)   # the resources, as dicts
    eg.wait_listener(gateway_listener_port)   # Envoy binds it once warm
    eg.admin_url                              # the proxy's admin, on port a
    eg.close()                                # stops it, releases the machine lock

Envoy Gateway v1.9.1 binds some ports whatever its configuration says: its
xDS server 0.0.0.0:18000, its Wasm module server :18002 and the file
provider's health probe :8081. One Envoy Gateway runs at a time on a
machine: the constructor waits for a lock file, then checks those ports.
"""

from __future__ import annotations

import base64
import copy
import fcntl
import os
import re
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import requests
import yaml

import harness
import ship

EG_BIN = harness.tool("TRL_ENVOY_GATEWAY", ".deps/gobin/envoy-gateway")
FIXTURES = Path(__file__).resolve().parent / "envoy-gateway"
CONTROLLER_NAME = "gateway.envoyproxy.io/gatewayclass-controller"
# ENVOY_GATEWAY_NAMESPACE, unset: where Envoy Gateway looks for its own Secret.
CONTROLLER_NAMESPACE = "envoy-gateway-system"
FIXED_PORTS = {
    18000: "Envoy Gateway's xDS server",
    18002: "Envoy Gateway's Wasm module server",
    8081: "the file provider's health probe",
}
LOCK_PATH = Path(tempfile.gettempdir()) / "tenant-ratelimit-envoy-gateway.lock"
LOCK_DEADLINE_S = 900.0
# Envoy Gateway translates, then starts Envoy through func-e, then Envoy
# fetches the module from Envoy Gateway: slower than a plain Envoy start.
PROXY_DEADLINE_S = 120.0


def envoy_version() -> str:
    """The version of the project's Envoy, e.g. "1.40.0" (what func-e looks up)."""
    out = subprocess.run([str(harness.ENVOY_BIN), "--version"], capture_output=True, text=True,
                         timeout=60).stdout
    m = re.search(r"/(\d+\.\d+\.\d+)/", out)
    if not m:
        raise harness.HarnessError(f"no version in `envoy --version`: {out!r}")
    return m.group(1)


def fixture(name: str) -> list[dict]:
    """The documents of tests/envoy-gateway/<name>, as dicts."""
    return [d for d in yaml.safe_load_all((FIXTURES / name).read_text()) if d]


def render(limits: Path, out: Path, *, image: str, sha256: str | None,
           fail_strategy: str) -> list[dict]:
    """The documents `ratelimit-config render --target envoy-gateway` writes
    for the team file `limits` with deploy/deployment.yaml and these flags."""
    args = ["render", limits, "--deployment", harness.REPO / "deploy" / "deployment.yaml",
            "--target", "envoy-gateway", "--image", image, "--fail-strategy", fail_strategy,
            "--out", out]
    if sha256:
        args += ["--sha256", sha256]
    harness.run_cli(*args)
    return [d for name in ("envoyproxy.yaml", "envoyextensionpolicy.yaml")
            for d in yaml.safe_load_all((out / name).read_text()) if d]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def tcp_accepts(port: int) -> bool:
    try:
        with socket.create_connection((harness.LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


class _MachineLock:
    """An exclusive flock on LOCK_PATH, waited for with a deadline."""

    def __init__(self, deadline_s: float = LOCK_DEADLINE_S):
        self.file = open(LOCK_PATH, "a+")
        end = time.monotonic() + deadline_s
        while True:
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > end:
                    self.file.close()
                    raise harness.HarnessError(
                        f"another Envoy Gateway held {LOCK_PATH} for {deadline_s:.0f}s")
                time.sleep(0.5)

    def release(self) -> None:
        if not self.file.closed:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()


class EnvoyGateway:
    """`envoy-gateway server` with the File and Host providers, fed `docs`.

    The resources go to one file of the watched directory before the start,
    with what standalone mode needs besides (envoy_client_secret, and
    standalone_patches for each Gateway).
    `admin_port` is the proxy's admin port: the caller sets it in the
    EnvoyProxy's bootstrap (proxy_bootstrap_for_tests does).
    """

    def __init__(self, stack: harness.Stack, docs: list[dict], admin_port: int,
                 log_level: str = "info"):
        self.stack = stack
        self.admin_port = admin_port
        self.root = stack.workdir / "envoy-gateway"
        self.config_home = self.root / "config"
        self.data_home = self.root / "data"
        self.state_home = self.root / "state"
        self.runtime_dir = self.root / "runtime"
        self.home = self.root / "home"
        self.resources_dir = self.root / "resources"
        for d in (self.config_home, self.data_home, self.state_home, self.runtime_dir,
                  self.home, self.resources_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.eg_admin_port = harness.free_port()
        self._lock = _MachineLock()
        self.process: harness.Process | None = None
        try:
            busy = [f"{p} ({what})" for p, what in FIXED_PORTS.items() if not port_is_free(p)]
            if busy:
                raise harness.HarnessError(
                    "Envoy Gateway binds fixed ports, and these are in use: " + ", ".join(busy))
            self.version = envoy_version()
            self._install_envoy()
            self._certgen()
            self.config_path = self.root / "envoy-gateway.yaml"
            self.config_path.write_text(yaml.safe_dump(self.config(log_level), sort_keys=False))
            gateways = [d for d in docs if d["kind"] == "Gateway"]
            self.write_resources("resources.yaml", [
                *docs, self.envoy_client_secret(), *map(self.standalone_patches, gateways)])
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                # The Wasm module cache is $HOME/.eg/wasm.
                "HOME": str(self.home),
            }
            self.process = stack.spawn(
                "envoy-gateway", [EG_BIN, "server", "--config-path", self.config_path], env=env)
            harness.wait_until(lambda: harness.http_ok("http://127.0.0.1:8081/readyz"),
                               "envoy-gateway file provider /readyz", process=self.process)
        except BaseException:
            self.close()
            raise

    # -- setup
    def _install_envoy(self) -> None:
        """The project's Envoy where func-e looks for this version."""
        target = self.data_home / "envoy-versions" / self.version / "bin" / "envoy"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(Path(harness.ENVOY_BIN).resolve())

    def _certgen(self) -> None:
        ship.run([EG_BIN, "certgen", "--local", "--config-home", self.config_home])

    def config(self, log_level: str) -> dict:
        """The EnvoyGateway configuration (`server --config-path`)."""
        return {
            "apiVersion": "gateway.envoyproxy.io/v1alpha1",
            "kind": "EnvoyGateway",
            "gateway": {"controllerName": CONTROLLER_NAME},
            "provider": {
                "type": "Custom",
                "custom": {
                    "resource": {"type": "File", "file": {"paths": [str(self.resources_dir)]}},
                    "infrastructure": {
                        "type": "Host",
                        "host": {
                            "configHome": str(self.config_home),
                            "dataHome": str(self.data_home),
                            "stateHome": str(self.state_home),
                            "runtimeDir": str(self.runtime_dir),
                        },
                    },
                },
            },
            "admin": {"address": {"host": harness.LOOPBACK, "port": self.eg_admin_port}},
            "telemetry": {"metrics": {"prometheus": {"disable": True}}},
            "logging": {"level": {"default": log_level}},
            "extensionApis": {"enableBackend": True, "enableEnvoyPatchPolicy": True},
        }

    def envoy_client_secret(self) -> dict:
        """The Secret `envoy` Envoy Gateway gives its proxies as their client
        certificate towards its own servers (the Wasm module server among
        them). In Kubernetes `certgen` creates it; in standalone mode it is
        read from the resources like any other."""
        certs = self.config_home / "certs" / "envoy"
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": "envoy", "namespace": CONTROLLER_NAMESPACE},
            "data": {k: base64.b64encode((certs / k).read_bytes()).decode()
                     for k in ("tls.crt", "tls.key", "ca.crt")},
        }

    def standalone_patches(self, gateway: dict) -> dict:
        """What Envoy Gateway's Wasm support lacks in standalone mode, as an
        EnvoyPatchPolicy on the Gateway: its `wasm_cluster` points at the
        Kubernetes Service name envoy-gateway.<namespace>.svc.cluster.local
        and trusts the CA file /certs/ca.crt of its container; here the
        server is on this host and the CA is certgen's. And the Gateway's
        listener, which Envoy Gateway binds to 0.0.0.0, on loopback only."""
        ns, name = gateway["metadata"]["namespace"], gateway["metadata"]["name"]
        cluster = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
        listener = "type.googleapis.com/envoy.config.listener.v3.Listener"
        endpoint = "/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address"
        patches = [
            {"type": cluster, "name": "wasm_cluster",
             "operation": {"op": "replace", "path": f"{endpoint}/address",
                           "value": harness.LOOPBACK}},
            {"type": cluster, "name": "wasm_cluster",
             "operation": {"op": "replace",
                           "path": "/transport_socket/typed_config/common_tls_context/"
                                   "validation_context/trusted_ca/filename",
                           "value": str(self.config_home / "certs" / "envoy" / "ca.crt")}},
        ]
        for listener_spec in gateway["spec"]["listeners"]:
            patches.append(
                {"type": listener, "name": f"{ns}/{name}/{listener_spec['name']}",
                 "operation": {"op": "replace", "path": "/address/socket_address/address",
                               "value": harness.LOOPBACK}})
        return {
            "apiVersion": "gateway.envoyproxy.io/v1alpha1",
            "kind": "EnvoyPatchPolicy",
            "metadata": {"name": "standalone", "namespace": ns},
            "spec": {
                "targetRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                              "name": name},
                "type": "JSONPatch",
                "jsonPatches": patches,
            },
        }

    def write_resources(self, name: str, docs: list[dict]) -> Path:
        """Write (or replace, atomically) one file of the watched directory."""
        path = self.resources_dir / name
        tmp = self.resources_dir / f".{name}.tmp"
        tmp.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        tmp.replace(path)
        return path

    # -- the proxy
    @property
    def admin_url(self) -> str:
        return f"http://{harness.LOOPBACK}:{self.admin_port}"

    def wait_listener(self, port: int, deadline_s: float = PROXY_DEADLINE_S) -> float:
        """Until the proxy accepts on `port` (Envoy binds a listener once it
        is warm: its routes, and any Wasm module it fetches, are in place).
        Returns the seconds it took."""
        t0 = time.monotonic()
        harness.wait_until(lambda: tcp_accepts(port), f"the Gateway's listener on {port}",
                           deadline_s, process=self.process)
        return time.monotonic() - t0

    def config_dump(self) -> dict:
        return requests.get(f"{self.admin_url}/config_dump", timeout=5).json()

    def stats(self, filter_regex: str | None = None) -> dict[str, int]:
        harness.wait_flushed(self.admin_url)
        params = {"filter": filter_regex} if filter_regex else None
        return harness.parse_stats(
            requests.get(f"{self.admin_url}/stats", params=params, timeout=5).text)

    def prometheus(self) -> str:
        harness.wait_flushed(self.admin_url)
        return requests.get(f"{self.admin_url}/stats/prometheus", timeout=5).text

    def log_text(self) -> str:
        return self.process.log_text() if self.process is not None else ""

    def wasm_cache(self) -> list[Path]:
        """The modules Envoy Gateway fetched and keeps ($HOME/.eg/wasm)."""
        return sorted(p for p in (self.home / ".eg" / "wasm").rglob("*") if p.is_file())

    def close(self) -> None:
        try:
            if self.process is not None:
                self.process.stop()
        finally:
            self._lock.release()


def proxy_bootstrap_for_tests(envoyproxy: dict, *, cluster: str, admin_port: int,
                              rls_port: int, version: str) -> dict:
    """The rendered EnvoyProxy as this host runs it:
    the rate-limit cluster on the loopback service, the admin on a port the
    harness chose (Envoy Gateway's host mode gives it port 0), and the host
    provider naming the project's Envoy version."""
    ep = copy.deepcopy(envoyproxy)
    boot = yaml.safe_load(ep["spec"]["bootstrap"]["value"])
    (rls,) = [c for c in boot["static_resources"]["clusters"] if c["name"] == cluster]
    rls["type"] = "STATIC"
    addr = (rls["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            ["address"]["socket_address"])
    addr["address"], addr["port_value"] = harness.LOOPBACK, rls_port
    boot["admin"] = {"address": {"socket_address": {"address": harness.LOOPBACK,
                                                    "port_value": admin_port}}}
    ep["spec"]["bootstrap"]["value"] = yaml.safe_dump(boot, sort_keys=False)
    ep["spec"]["provider"] = {"type": "Host", "host": {"envoyVersion": version}}
    return ep


def backend(name: str, namespace: str, port: int) -> dict:
    """A Backend on loopback: the upstream of an HTTPRoute without Kubernetes Services."""
    return {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "Backend",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"endpoints": [{"ip": {"address": harness.LOOPBACK, "port": port}}]},
    }


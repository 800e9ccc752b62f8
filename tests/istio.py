"""Istio for real (tests/test_istio_e2e.py): a Kubernetes API server without a
cluster, istiod against it, and Envoys started by Istio's agent as VM-style
mesh workloads.

- etcd (go.etcd.io/etcd/server/v3 embed, tools/etcd) and kube-apiserver
  (k8s.io/kubernetes, tools/kube-apiserver) on loopback: a service-account key
  pair, an admin token (--token-auth-file), no controllers, kubelet or nodes;
- the Istio CRDs of the pinned istio.io/istio module, the namespaces;
- istiod (`pilot-discovery discovery`, tools/istio) out of cluster with a
  kubeconfig, its own CA;
- a workload: a ServiceAccount, a WorkloadGroup and a WorkloadEntry, a token
  from the API server's TokenRequest, the root certificate istiod publishes
  in the namespace, and `pilot-agent proxy sidecar` starting this project's
  Envoy (interception mode NONE: no iptables; a Sidecar resource per workload
  names the loopback ports its inbound and outbound listeners bind).

Every port comes from harness.PortAllocator; every process is started through
the test's harness.Stack and stopped by PID in Stack.close().
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import requests
import urllib3
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

import harness
import ship
from harness import LOOPBACK, HarnessError, free_port, wait_until

ETCD = harness.tool("TRL_ETCD", ".deps/istio/etcd")
KUBE_APISERVER = harness.tool("TRL_KUBE_APISERVER", ".deps/istio/kube-apiserver")
PILOT_DISCOVERY = harness.tool("TRL_PILOT_DISCOVERY", ".deps/istio/pilot-discovery")
PILOT_AGENT = harness.tool("TRL_PILOT_AGENT", ".deps/istio/pilot-agent")

ISTIO_NAMESPACE = "istio-system"
TRUST_DOMAIN = "cluster.local"
CLUSTER_ID = "Kubernetes"
# The name in istiod's serving certificate (its own CA signs it for this host).
ISTIOD_SAN = f"istiod.{ISTIO_NAMESPACE}.svc"
# istiod's, the API server's and the agent's starts on this shared 2-core machine.
CONTROL_PLANE_DEADLINE_S = 120.0

# The API server's certificate is self-signed (--cert-dir); the client is on loopback.
urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)


def missing_binaries() -> list[str]:
    return [str(p) for p in (ETCD, KUBE_APISERVER, PILOT_DISCOVERY, PILOT_AGENT)
            if not (p.exists() and os.access(p, os.X_OK))]


def _plural(kind: str) -> str:
    k = kind.lower()
    if k.endswith("y") and k[-2:-1] not in ("a", "e", "o", "u"):  # policies, gateways
        return k[:-1] + "ies"
    if k.endswith("s"):
        return k + "es"
    return k + "s"


_CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}


class Kube:
    """The API server's REST API, as `kubectl apply --server-side` uses it."""

    def __init__(self, url: str, token: str):
        self.url = url
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        # Per request: a session's verify=False loses to REQUESTS_CA_BUNDLE.
        self.session.verify = False

    def path(self, api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if kind not in _CLUSTER_SCOPED:
            if not namespace:
                raise HarnessError(f"{kind} {name}: no namespace")
            base += f"/namespaces/{namespace}"
        base += f"/{_plural(kind)}"
        return base + (f"/{name}" if name else "")

    def request(self, method: str, path: str, ok=(200, 201), **kw) -> dict:
        r = self.session.request(method, self.url + path, timeout=30, verify=False, **kw)
        if r.status_code not in ok:
            raise HarnessError(f"{method} {path}: {r.status_code} {r.text[:2000]}")
        return r.json() if r.content else {}

    def apply(self, doc: dict) -> dict:
        """Server-side apply of one object (create or update)."""
        meta = doc["metadata"]
        path = self.path(doc["apiVersion"], doc["kind"], meta.get("namespace"), meta["name"])
        return self.request("PATCH", path, params={"fieldManager": "tests", "force": "true"},
                            data=json.dumps(doc),
                            headers={"Content-Type": "application/apply-patch+yaml"})

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict | None:
        r = self.session.get(self.url + self.path(api_version, kind, namespace, name), timeout=30,
                             verify=False)
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise HarnessError(f"GET {kind} {namespace}/{name}: {r.status_code} {r.text[:500]}")
        return r.json()

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> None:
        self.request("DELETE", self.path(api_version, kind, namespace, name), ok=(200, 202, 404))

    def token(self, namespace: str, service_account: str, audience: str) -> str:
        """A bound service-account token from TokenRequest, as the kubelet projects one."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": [audience], "expirationSeconds": 3600}}
        out = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/"
                           f"{service_account}/token", json=body)
        return out["status"]["token"]


def _write_key_pair(directory: Path) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv, pub = directory / "sa.key", directory / "sa.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


def istio_crds() -> list[dict]:
    path = ship.module_dir(ship.ISTIO_MODULE) / "manifests/charts/base/files/crd-all.gen.yaml"
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


class ControlPlane:
    """etcd, kube-apiserver and istiod, for one test module."""

    def __init__(self, stack: harness.Stack, mesh: dict | None = None,
                 istiod_env: dict[str, str] | None = None):
        self.stack = stack
        self.dir = stack.workdir / "istio"
        self.dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        self._etcd()
        self._apiserver()
        self.kube = Kube(self.api_url, self.admin_token)
        self._crds()
        for ns in (ISTIO_NAMESPACE,):
            self.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        self._istiod(mesh or {}, istiod_env or {})
        self.startup_s = time.monotonic() - started

    # -- etcd
    def _etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://{LOOPBACK}:{client}"
        self.etcd = self.stack.spawn("etcd", [ETCD, "-data-dir", self.dir / "etcd",
                                              "-listen-client", self.etcd_url,
                                              "-listen-peer", f"http://{LOOPBACK}:{peer}"])
        wait_until(lambda: harness.http_ok(f"{self.etcd_url}/health"), "etcd /health",
                   CONTROL_PLANE_DEADLINE_S, process=self.etcd)

    # -- kube-apiserver
    def _apiserver(self) -> None:
        d = self.dir / "apiserver"
        d.mkdir(exist_ok=True)
        priv, pub = _write_key_pair(d)
        self.admin_token = harness.unique("admin")
        tokens = d / "tokens.csv"
        tokens.write_text(f'{self.admin_token},admin,admin,"system:masters"\n')
        port = free_port()
        self.api_url = f"https://{LOOPBACK}:{port}"
        self.apiserver = self.stack.spawn("kube-apiserver", [
            KUBE_APISERVER,
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={LOOPBACK}", f"--secure-port={port}",
            # A loopback address for its endpoint reconciler is refused; no reconciler.
            f"--advertise-address={LOOPBACK}", "--endpoint-reconciler-type=none",
            f"--cert-dir={d / 'certs'}",
            f"--token-auth-file={tokens}",
            "--authorization-mode=RBAC",
            f"--service-account-key-file={pub}",
            f"--service-account-signing-key-file={priv}",
            f"--service-account-issuer=https://kubernetes.default.svc.{TRUST_DOMAIN}",
            "--service-cluster-ip-range=10.96.0.0/16",
            # No controller-manager: nothing would create the pods' service accounts' tokens.
            "--disable-admission-plugins=ServiceAccount",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
        ])

        def ready() -> bool:
            r = requests.get(f"{self.api_url}/readyz", verify=False, timeout=2,
                             headers={"Authorization": f"Bearer {self.admin_token}"})
            return r.status_code == 200

        wait_until(ready, "kube-apiserver /readyz", CONTROL_PLANE_DEADLINE_S, process=self.apiserver)
        self.kubeconfig = d / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.api_url,
                                                      "insecure-skip-tls-verify": True}}],
            "users": [{"name": "admin", "user": {"token": self.admin_token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
        }))

    def _crds(self) -> None:
        crds = istio_crds()
        for crd in crds:
            self.kube.apply(crd)

        def established() -> bool:
            for crd in crds:
                got = self.kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", None,
                                    crd["metadata"]["name"])
                conds = {c["type"]: c["status"] for c in (got or {}).get("status", {}).get("conditions", [])}
                if conds.get("Established") != "True":
                    return False
            return True

        wait_until(established, "Istio CRDs established", CONTROL_PLANE_DEADLINE_S)

    # -- istiod
    def _istiod(self, mesh: dict, extra_env: dict[str, str]) -> None:
        d = self.dir / "istiod"
        d.mkdir(exist_ok=True)
        self.http_port, self.grpc_port, self.xds_port = free_port(), free_port(), free_port()
        self.monitoring_port, self.webhook_port, ctrlz = free_port(), free_port(), free_port()
        self.discovery_address = f"{LOOPBACK}:{self.xds_port}"
        mesh = {"trustDomain": TRUST_DOMAIN,
                "defaultConfig": {"discoveryAddress": self.discovery_address},
                **mesh}
        (d / "mesh.yaml").write_text(yaml.safe_dump(mesh))
        env = {**os.environ, "POD_NAMESPACE": ISTIO_NAMESPACE, "POD_NAME": "istiod-test",
               "REVISION": "default", "CLUSTER_ID": CLUSTER_ID, **extra_env}
        self.istiod = self.stack.spawn("istiod", [
            PILOT_DISCOVERY, "discovery",
            "--kubeconfig", self.kubeconfig,
            "--meshConfig", d / "mesh.yaml",
            "--networksConfig", d / "no-mesh-networks.yaml",
            f"--httpAddr={LOOPBACK}:{self.http_port}",
            f"--httpsAddr={LOOPBACK}:{self.webhook_port}",
            f"--grpcAddr={LOOPBACK}:{self.grpc_port}",
            f"--secureGRPCAddr={LOOPBACK}:{self.xds_port}",
            f"--monitoringAddr={LOOPBACK}:{self.monitoring_port}",
            f"--ctrlz_port={ctrlz}", f"--ctrlz_address={LOOPBACK}",
            "--profile=false",
            "--log_output_level=default:info",
        ], env=env)
        wait_until(lambda: harness.http_ok(f"http://{LOOPBACK}:{self.http_port}/ready"),
                   "istiod /ready", CONTROL_PLANE_DEADLINE_S, process=self.istiod)

    def root_cert(self, namespace: str) -> str:
        """The mesh's root certificate, as istiod publishes it in each namespace."""
        found: dict = {}

        def published() -> bool:
            cm = self.kube.get("v1", "ConfigMap", namespace, "istio-ca-root-cert")
            if cm and cm.get("data", {}).get("root-cert.pem"):
                found["pem"] = cm["data"]["root-cert.pem"]
                return True
            return False

        wait_until(published, f"istio-ca-root-cert in {namespace}", CONTROL_PLANE_DEADLINE_S,
                   process=self.istiod)
        return found["pem"]

    def configz(self) -> list:
        return requests.get(f"http://{LOOPBACK}:{self.http_port}/debug/configz", timeout=10).json()

    def debug(self, what: str, **params) -> str:
        return requests.get(f"http://{LOOPBACK}:{self.http_port}/debug/{what}", params=params,
                            timeout=10).text


class Workload(harness.EnvoyPorts):
    """One mesh workload outside a cluster, the way a VM joins: its
    WorkloadEntry, a TokenRequest token and the namespace's root certificate
    in the agent's working directory, and `pilot-agent proxy sidecar`
    starting .deps/bin/envoy with the bootstrap it writes.

    Its Sidecar resource binds the inbound listener on `listen_port` (the
    app behind it: `app_port`) and one outbound HTTP proxy listener, both on
    127.0.0.1: with interception mode NONE nothing else binds a port of a
    Service (all ports here are the harness's).

    With `gateway=True` it is an ingress gateway instead (`pilot-agent proxy
    router`, no Sidecar resource): its listener on `listen_port` is the one
    of a Gateway resource the test applies (`gateway_server` gives it)."""

    def __init__(self, cp: ControlPlane, name: str, namespace: str, labels: dict,
                 service_account: str, app_port: int, address: str,
                 insecure_registries: list[str] = (), wait: bool = True,
                 gateway: bool = False):
        self.cp = cp
        self.name = name
        self.namespace = namespace
        self.labels = {**labels, "instance": name}
        self.dir = cp.stack.workdir / "workloads" / name
        self.listen_port, self.egress_port = free_port(), free_port()
        self.admin_port, self.status_port, self.prom_port = free_port(), free_port(), free_port()
        self.agent_port = free_port()
        self.address = address
        self.gateway = gateway
        kube = cp.kube
        kube.apply({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"address": address, "labels": self.labels,
                             "serviceAccount": service_account,
                             "ports": {"http": self.listen_port}}})
        if not gateway:
            kube.apply({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
                        "metadata": {"name": name, "namespace": namespace},
                        "spec": {
                            "workloadSelector": {"labels": {"instance": name}},
                            "ingress": [{"port": {"number": self.listen_port, "protocol": "HTTP",
                                                  "name": "http"},
                                         "bind": LOOPBACK, "captureMode": "NONE",
                                         "defaultEndpoint": f"{LOOPBACK}:{app_port}"}],
                            "egress": [{"port": {"number": self.egress_port, "protocol": "HTTP_PROXY",
                                                 "name": "egress"},
                                        "bind": LOOPBACK, "captureMode": "NONE",
                                        "hosts": ["./*"]}],
                        }})
        token = kube.token(namespace, service_account, "istio-ca")
        (self.dir / "var/run/secrets/tokens").mkdir(parents=True, exist_ok=True)
        (self.dir / "var/run/secrets/tokens/istio-token").write_text(token)
        (self.dir / "var/run/secrets/istio").mkdir(parents=True, exist_ok=True)
        (self.dir / "var/run/secrets/istio/root-cert.pem").write_text(cp.root_cert(namespace))
        (self.dir / "etc/istio/proxy").mkdir(parents=True, exist_ok=True)
        # Envoy's bootstrap template, where Istio's proxy image has it, from
        # the pinned module (read at test time, never committed).
        (self.dir / "var/lib/istio/envoy").mkdir(parents=True, exist_ok=True)
        (self.dir / "var/lib/istio/envoy/envoy_bootstrap_tmpl.json").write_text(
            (ship.module_dir(ship.ISTIO_MODULE) / "tools/packaging/common/envoy_bootstrap.json").read_text())
        proxy_config = {
            "discoveryAddress": cp.discovery_address,
            "binaryPath": str(harness.ENVOY_BIN),
            "configPath": str(self.dir / "etc/istio/proxy"),
            "proxyAdminPort": self.admin_port,
            # The agent's status server (it must have one; it listens on
            # every address: not configurable in pilot-agent).
            "statusPort": self.agent_port,
            "concurrency": 2,
            "interceptionMode": "NONE",
            "drainDuration": "1s",
            "terminationDrainDuration": "1s",
            "proxyMetadata": {"METRICS_LOCALHOST_ACCESS_ONLY": "true"},
        }
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.dir),
            "PROXY_CONFIG": json.dumps(proxy_config),
            "INSTANCE_IP": address,
            "POD_NAME": name,
            "POD_NAMESPACE": namespace,
            "SERVICE_ACCOUNT": service_account,
            "ISTIO_META_CLUSTER_ID": CLUSTER_ID,
            "ISTIO_META_WORKLOAD_NAME": name,
            "ISTIO_METAJSON_LABELS": json.dumps(self.labels),
            "ISTIO_META_INTERCEPTION_MODE": "NONE",
            "TRUST_DOMAIN": TRUST_DOMAIN,
            "CA_ADDR": cp.discovery_address,
            "ISTIOD_SAN": ISTIOD_SAN,
            "ENVOY_STATUS_PORT": str(self.status_port),
            "ENVOY_PROMETHEUS_PORT": str(self.prom_port),
            "WASM_INSECURE_REGISTRIES": ",".join(insecure_registries),
        }
        (self.dir / "var/lib/istio/data").mkdir(parents=True, exist_ok=True)
        # The agent keeps the Wasm modules it pulls in /var/lib/istio/data (a
        # fixed path, constants.IstioDataDir): in a mount namespace of its
        # own, the workload's var/lib is there instead, so nothing is written
        # outside the test's directory and the two workloads do not share it.
        self.process = cp.stack.spawn(f"agent-{name}", [
            "unshare", "--mount", "--propagation", "private",
            "sh", "-c", 'mount --bind "$0" /var/lib && exec "$@"', self.dir / "var/lib",
            PILOT_AGENT, "proxy", "router" if gateway else "sidecar",
            "--domain", f"{namespace}.svc.{TRUST_DOMAIN}",
            "--proxyLogLevel", "info",
            "--log_output_level", "default:info",
        ], env=env, cwd=self.dir)
        if wait:
            self.wait_listening()

    def listeners(self) -> list[str]:
        r = requests.get(f"{self.admin_url}/listeners", params={"format": "json"}, timeout=2)
        return [ls.get("name", "") for ls in r.json().get("listener_statuses", [])]

    def wait_listening(self, deadline_s: float = CONTROL_PLANE_DEADLINE_S) -> None:
        """Envoy is ready and has the inbound listener of the workload's Sidecar."""
        def ok() -> bool:
            return (harness.http_ok(f"{self.admin_url}/ready", timeout=1)
                    and any(str(self.listen_port) in n for n in self.listeners()))
        wait_until(ok, f"{self.name}: Envoy ready with its inbound listener", deadline_s,
                   process=self.process)

    def config_dump(self, resource: str | None = None) -> dict:
        params = {"resource": resource} if resource else {}
        return requests.get(f"{self.admin_url}/config_dump", params=params, timeout=10).json()

    def stats(self, filter_regex: str | None = None) -> dict[str, int]:
        harness.wait_flushed(self.admin_url)
        params = {"filter": filter_regex} if filter_regex else None
        return harness.parse_stats(requests.get(f"{self.admin_url}/stats", params=params,
                                                timeout=5).text)

    def stop(self) -> None:
        self.process.stop()


def kustomize_build(directory: Path) -> list[dict]:
    out = subprocess.run([str(ship.KUSTOMIZE), "build", str(directory)], capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise HarnessError(f"kustomize build {directory}: {out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]

"""The filter through a real Istio control plane (tests/istio.py): etcd and
kube-apiserver on loopback, the Istio CRDs, istiod out of cluster, and two
mesh workloads, each an Envoy (this project's, .deps/bin/envoy) started by
Istio's own agent, VM-style (WorkloadEntry, TokenRequest token).

What `ratelimit-config render --target istio` writes is applied to the API
server as `kustomize build | kubectl apply --server-side` would: the
WasmPlugin (its image in a loopback OCI registry, pinned with the digest
`make oci` prints), the rate-limit Service and the rest. istiod turns the
WasmPlugin into the extension configuration it serves; the agent pulls the
image, checks the digest and hands Envoy the module; requests then go
through the workloads' inbound listeners to a real ratelimit service and
Redis.

The rate-limit service runs on loopback; the rendered Service `ratelimit`
selects it through a WorkloadEntry with the Service's labels (no pods here).
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import pytest
import requests

import expect
import harness
import istio
import ship
from harness import ensure_window_room, run_sequential, tally, unique, wait_until

NAMESPACE = "my-api"
SERVICE_ACCOUNT = "my-api"
WORKLOAD_LABELS = {"app": "my-api"}
IMAGE_TAG = "tenant-ratelimit:0.1.0"
PLUGIN = "tenant-ratelimit"
# How long istiod, the agent's pull and Envoy's ECDS take to apply a change
# on this shared machine (a deadline, never a wait).
APPLY_DEADLINE_S = 90.0



# ------------------------------------------------------------------ the mesh

class Mesh:
    """The module's control plane, registry, upstream and two workloads."""

    def __init__(self, stack: harness.Stack):
        self.stack = stack
        self._limiter: harness.RateLimitService | None = None
        started = time.monotonic()
        images = ship.build_images(stack.workdir / "oci")
        self.registry = ship.Registry(stack.workdir / "registry")
        self.image = self.registry.push(images["compat"]["layout"], IMAGE_TAG)
        # What `make oci` prints for the compat variant, hex only (render's --sha256).
        self.sha256 = images["compat"]["digest"].split(":", 1)[1]
        self.missing_image = f"{self.registry.address}/tenant-ratelimit:no-such-tag"
        self.cp = istio.ControlPlane(stack, mesh=MESH_CONFIG, istiod_env=ISTIOD_ENV)
        kube = self.kube = self.cp.kube
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        kube.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}})
        kube.apply({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadGroup",
                    "metadata": {"name": "my-api", "namespace": NAMESPACE},
                    "spec": {"metadata": {"labels": WORKLOAD_LABELS},
                             "template": {"serviceAccount": SERVICE_ACCOUNT}}})
        # The workloads' own Service (two workloads behind one Service).
        kube.apply({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "my-api", "namespace": NAMESPACE,
                                 "labels": WORKLOAD_LABELS},
                    "spec": {"selector": WORKLOAD_LABELS,
                             "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
        # Everything the render writes, once, so the rate-limit Service (and
        # its outbound cluster) exists before the proxies start.
        self.apply_rendered(self.render("setup", {"x-tenant-id": {"default": {"perhour": 100}}}),
                            with_plugin=False)
        self.upstream = stack.upstream()
        self.workloads = [
            istio.Workload(self.cp, f"w{i}", NAMESPACE, WORKLOAD_LABELS, SERVICE_ACCOUNT,
                           app_port=self.upstream.listen_port, address=f"127.0.0.{i + 1}",
                           insecure_registries=[self.registry.address])
            for i in (1, 2)]
        self.startup_s = time.monotonic() - started

    # -- render and apply
    def render(self, name: str, limits: dict, *args: str) -> dict:
        """`ratelimit-config render --target istio` of a team file, with the
        image and digest of the registry (unless `args` say otherwise).

        The rate-limit call's timeout is raised from the 20 ms default for this
        loaded machine, through render's own --plugin, as a user would."""
        out = self.stack.workdir / "render" / name
        domain = unique("istio")
        base = ["--deployment", harness.REPO / "deploy" / "deployment.yaml",
                "--namespace", NAMESPACE, "--domain", domain,
                "--plugin", f"rate_limit_service.timeout_ms={harness.COUNTING_TIMEOUT_MS}"]
        if "--image" not in args:
            base += ["--image", self.image]
        if "--sha256" not in args and "--no-sha256" not in args:
            base += ["--sha256", self.sha256]
        args = tuple(a for a in args if a != "--no-sha256")
        harness.render_target(limits, "istio", out, *map(str, base), *args)
        docs = istio.kustomize_build(out)
        return {"dir": out, "domain": domain, "docs": docs, "limits": limits,
                "plugin": next(d for d in docs if d["kind"] == "WasmPlugin")}

    def apply_rendered(self, rendered: dict, with_plugin: bool = True) -> None:
        for doc in rendered["docs"]:
            if doc["kind"] == "WasmPlugin" and not with_plugin:
                continue
            self.kube.apply(doc)

    def apply_plugin(self, plugin: dict, name: str | None = None) -> dict:
        doc = copy.deepcopy(plugin)
        if name:
            doc["metadata"]["name"] = name
        self.kube.apply(doc)
        return doc

    def delete_plugin(self, name: str = PLUGIN) -> None:
        self.kube.delete("extensions.istio.io/v1alpha1", "WasmPlugin", NAMESPACE, name)
        for w in self.workloads:
            wait_until(lambda w=w: ecds(w, name) is None, f"{w.name}: {name} gone",
                       APPLY_DEADLINE_S, process=w.process)

    def limiter(self, *rendered: dict) -> harness.RateLimitService:
        """A ratelimit service and Redis with the rules of these renders,
        behind the rendered Service `ratelimit` (its WorkloadEntry), and
        wait until every workload's Envoy has that endpoint."""
        if self._limiter is not None:  # the previous test's
            self._limiter.stop()
            self._limiter.redis.stop()
        rls = self._limiter = self.stack.ratelimit(
            self.stack.redis(), *[r["dir"] / "ratelimit.yaml" for r in rendered])
        self.kube.apply({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
                         "metadata": {"name": "ratelimit", "namespace": NAMESPACE},
                         "spec": {"address": harness.LOOPBACK,
                                  "labels": {"app.kubernetes.io/name": "ratelimit"},
                                  "ports": {"grpc": rls.grpc_port}}})
        cluster = rendered[0]["plugin"]["spec"]["pluginConfig"]["rate_limit_service"]["cluster"]
        for w in self.workloads:
            wait_until(lambda w=w: f"{harness.LOOPBACK}:{rls.grpc_port}" in endpoints(w, cluster),
                       f"{w.name}: {cluster} has the service's endpoint", APPLY_DEADLINE_S,
                       process=w.process)
        return rls

    def close(self) -> None:
        self.registry.close()


# Upstream Envoy has none of the istio-proxy extensions (metadata exchange,
# Istio's stats filter, its ALPN override filter, which Envoy accepts as
# optional but then cannot show in /config_dump): istiod is told not to send
# them. Nothing the filter relies on is among them.
MESH_CONFIG = {"defaultProviders": {"metrics": []}, "enablePrometheusMerge": False}
ISTIOD_ENV = {"PILOT_ENABLE_METADATA_EXCHANGE": "false", "PILOT_ENABLE_ALPN_FILTER": "false"}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory, request):
    # A failure, not a skip: a run that tests nothing must not look green.
    if istio.missing_binaries():
        pytest.fail("run `make deps-istio`: missing " + ", ".join(istio.missing_binaries()))
    stack = harness.Stack(tmp_path_factory.mktemp("istio"))
    m = None
    try:
        m = Mesh(stack)
        yield m
    except BaseException:
        print(stack.log_tails(25))
        raise
    finally:
        if m is not None:
            m.close()
        stack.close()


# ------------------------------------------------------------------ Envoy's view

def is_plugin(filter_name: str, name: str = PLUGIN) -> bool:
    """Whether an Envoy filter (or extension configuration) name is the WasmPlugin
    `name`'s: istiod names it extensions.istio.io/trafficextension/<ns>.<name>~istio-translated-wasmplugin."""
    return (filter_name == f"{NAMESPACE}.{name}"
            or filter_name.endswith(f"/{NAMESPACE}.{name}~istio-translated-wasmplugin"))


def filter_index(names: list[str], name: str = PLUGIN) -> int:
    found = [i for i, n in enumerate(names) if is_plugin(n, name)]
    assert len(found) == 1, (name, names)
    return found[0]


def ecds(w: istio.Workload, name: str = PLUGIN) -> dict | None:
    """The extension configuration Envoy applied for the WasmPlugin `name`, or None."""
    for section in w.config_dump().get("configs", []):
        if not section.get("@type", "").endswith("EcdsConfigDump"):
            continue
        for f in section.get("ecds_filters", []):
            cfg = f.get("ecds_filter", {})
            if is_plugin(cfg.get("name", ""), name):
                return {"config": cfg.get("typed_config", {}),
                        "version": f.get("version_info")}
    return None


def wasm_config(w: istio.Workload, name: str = PLUGIN) -> dict | None:
    """The Wasm filter's PluginConfig Envoy runs for `name` (None if absent or not Wasm)."""
    e = ecds(w, name)
    if e is None or not e["config"].get("@type", "").endswith("wasm.v3.Wasm"):
        return None
    return e["config"]["config"]


def plugin_json(w: istio.Workload, name: str = PLUGIN) -> dict | None:
    cfg = wasm_config(w, name)
    if cfg is None:
        return None
    return json.loads(cfg["configuration"]["value"])


def endpoints(w: istio.Workload, cluster: str) -> str:
    text = requests.get(f"{w.admin_url}/clusters", timeout=5).text
    return "\n".join(line for line in text.splitlines() if line.startswith(cluster + "::"))


def inbound_http_filters(w: istio.Workload) -> list[str]:
    """The names of the HTTP filters of the workload's inbound listener, in order."""
    dump = w.config_dump("dynamic_listeners")
    for ls in dump.get("configs", []):  # with resource=: one DynamicListener each
        listener = ls.get("active_state", {}).get("listener", {})
        if str(w.listen_port) not in listener.get("name", ""):
            continue
        for chain in listener.get("filter_chains", []):
            for nf in chain.get("filters", []):
                hcm = nf.get("typed_config", {})
                if "http_filters" in hcm:
                    return [f["name"] for f in hcm["http_filters"]]
    raise AssertionError(f"{w.name}: no HTTP filters on its inbound listener")


def wait_plugin(mesh: Mesh, domain: str, name: str = PLUGIN) -> None:
    """Every workload's Envoy runs the WasmPlugin `name` with the rendered domain."""
    for w in mesh.workloads:
        wait_until(lambda w=w: (plugin_json(w, name) or {}).get("domain") == domain,
                   f"{w.name}: {name} with domain {domain}", APPLY_DEADLINE_S, process=w.process)


def envoy_pid(w: istio.Workload) -> int:
    """The PID of the Envoy the agent started (its one child that runs the Envoy binary)."""
    found = []
    for task in (Path("/proc") / str(w.process.pid) / "task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
            except OSError:
                continue
            if Path(exe).name == "envoy":
                found.append(int(pid))
    assert len(found) == 1, f"{w.name}: Envoy children {found}"
    return found[0]


def urls(mesh: Mesh) -> list[str]:
    return [w.url for w in mesh.workloads]


# ------------------------------------------------------------------ tests

def test_exactly_the_quota_across_two_workloads_with_the_headers_of_plain_envoy(mesh):
    rule = {"perhour": 5}
    r = mesh.render("quota", {"x-tenant-id": {"default": rule}})
    mesh.limiter(r)
    mesh.apply_rendered(r)
    try:
        wait_plugin(mesh, r["domain"])
        for w in mesh.workloads:
            cfg = wasm_config(w)
            # What the WasmPlugin said, as istiod gave it to Envoy.
            assert cfg["root_id"] == r["plugin"]["spec"]["pluginName"], cfg
            assert cfg["vm_config"].get("vm_id", "") == "", cfg
            assert cfg["vm_config"]["runtime"] == "envoy.wasm.runtime.v8", cfg
            assert cfg["failure_policy"] == "FAIL_OPEN", cfg
            assert plugin_json(w) == r["plugin"]["spec"]["pluginConfig"]
            # The agent pulled the image and gave Envoy a local file.
            assert "local" in cfg["vm_config"]["code"], cfg["vm_config"]["code"]
        ensure_window_room(3600, 120)
        results = run_sequential(urls(mesh), 12, tenant=unique("quota"))
        assert tally(results) == {200: 5, 429: 7}, harness.summary(results)
        assert [x.status for x in results] == [200] * 5 + [429] * 7
        for x in results[:5]:
            expect.admitted(x, rule)
        for x in results[5:]:
            expect.limited(x, rule)
        assert {x.target for x in results[:5]} == {0, 1}
    finally:
        mesh.delete_plugin()


def quota_of(mesh: Mesh, n: int, **headers) -> list[harness.Result]:
    """A fresh tenant, over both workloads: exactly n 200s, then 429s."""
    results = run_sequential(urls(mesh), n + 3, tenant=unique("quota"), headers=headers or None)
    assert [x.status for x in results] == [200] * n + [429] * 3, harness.summary(results)
    return results


def test_a_live_edit_reaches_the_proxies_and_a_bad_one_keeps_the_last_good(mesh):
    v1 = mesh.render("live-v1", {"x-tenant-id": {"default": {"perhour": 5}}})
    v2 = mesh.render("live-v2", {"x-tenant-id": {"default": {"perhour": 8}}})
    # The service knows both domains from the start, as a control plane
    # ships the service's rules before the filter configuration using them.
    mesh.limiter(v1, v2)
    mesh.apply_rendered(v1)
    try:
        wait_plugin(mesh, v1["domain"])
        pids = [envoy_pid(w) for w in mesh.workloads]
        ensure_window_room(3600, 240)
        quota_of(mesh, 5)
        # The edit: the same WasmPlugin, the pluginConfig render writes for v2.
        mesh.apply_plugin(v2["plugin"])
        wait_plugin(mesh, v2["domain"])
        quota_of(mesh, 8)
        # A hand edit the filter refuses (a limit that is not a number).
        bad = copy.deepcopy(v2["plugin"])
        bad["spec"]["pluginConfig"]["limits"]["x-tenant-id"]["default"]["perhour"] = "many"
        logged = [w.process.log_text().count("invalid configuration") for w in mesh.workloads]
        mesh.apply_plugin(bad)
        for w, before in zip(mesh.workloads, logged):
            wait_until(lambda w=w, before=before:
                       w.process.log_text().count("invalid configuration") > before,
                       f"{w.name}: Envoy refuses the bad configuration", APPLY_DEADLINE_S,
                       process=w.process)
        for w in mesh.workloads:
            assert plugin_json(w)["domain"] == v2["domain"]
            assert "perhour" in w.process.log_text().split("invalid configuration")[-1][:400]
        quota_of(mesh, 8)
        assert [envoy_pid(w) for w in mesh.workloads] == pids, "an Envoy was restarted"
    finally:
        mesh.delete_plugin()


def test_two_wasmplugins_of_the_filter_on_one_workload_stay_apart(mesh):
    a = mesh.render("apart-a", {"x-tenant-id": {"default": {"perhour": 3}}})
    # A second WasmPlugin in the same namespace needs another name; B runs
    # first (a higher priority): both from render's settings.
    b = mesh.render("apart-b", {"x-tenant-id": {"default": {"perhour": 100}}},
                    "--set", "istio.name=tenant-ratelimit-b", "--set", "istio.priority=10")
    assert b["plugin"]["metadata"]["name"] == "tenant-ratelimit-b"
    assert b["plugin"]["spec"]["priority"] == 10
    rls = mesh.limiter(a, b)
    mesh.apply_rendered(a)
    mesh.apply_plugin(b["plugin"])
    try:
        wait_plugin(mesh, a["domain"])
        wait_plugin(mesh, b["domain"], "tenant-ratelimit-b")
        for w in mesh.workloads:
            names = inbound_http_filters(w)
            assert filter_index(names, "tenant-ratelimit-b") < filter_index(names), names
            # Both with Istio's vm_id: empty.
            assert wasm_config(w)["vm_config"].get("vm_id", "") == ""
            assert wasm_config(w, "tenant-ratelimit-b")["vm_config"].get("vm_id", "") == ""
        ensure_window_room(3600, 120)
        tenant = unique("apart")
        results = run_sequential(urls(mesh), 10, tenant=tenant)
        # A refuses past 3; B, before it, asked its service about every request:
        # none of A's refusals (cached in the shared data) refused one of B's.
        assert [x.status for x in results] == [200] * 3 + [429] * 7, harness.summary(results)
        b_keys = rls.redis.keys(f"{b['domain']}_*")
        assert len(b_keys) == 1, b_keys
        assert rls.redis.get_int(b_keys[0]) == 10
    finally:
        mesh.delete_plugin("tenant-ratelimit-b")
        mesh.delete_plugin()


@pytest.mark.parametrize("strategy", ["open", "closed"])
@pytest.mark.parametrize("broken", ["image-missing", "wrong-sha256"])
def test_fail_strategy_as_the_table_says(mesh, broken, strategy):
    args = ["--fail-strategy", strategy]
    if broken == "image-missing":
        # A tag the registry does not have, so no digest to pin: with the
        # digest of a module the agent already holds, it would not pull at
        # all (IfNotPresent) and the filter would run.
        args += ["--image", mesh.missing_image, "--no-sha256"]
    else:
        args += ["--sha256", "0" * 64]
    r = mesh.render(f"fail-{broken}-{strategy}", {"x-tenant-id": {"default": {"perhour": 2}}}, *args)
    assert r["plugin"]["spec"]["failStrategy"] == {"open": "FAIL_OPEN", "closed": "FAIL_CLOSE"}[strategy]
    mesh.limiter(r)
    mesh.apply_rendered(r)
    try:
        # The agent cannot hand Envoy the module: Envoy gets Istio's stand-in filter.
        for w in mesh.workloads:
            wait_until(lambda w=w: (ecds(w) or {}).get("config", {}).get("@type", "").endswith("rbac.v3.RBAC"),
                       f"{w.name}: Istio's fallback filter in place of the WasmPlugin",
                       APPLY_DEADLINE_S, process=w.process)
        results = run_sequential(urls(mesh), 6, tenant=unique("fail"))
        if strategy == "open":
            # The filter is left out: every request passes, unlimited, and nothing says so.
            assert tally(results) == {200: 6}, harness.summary(results)
            assert not any(k.startswith("x-ratelimit") or k.startswith("ratelimit")
                           for x in results for k in x.headers), results[0].headers
        else:
            assert tally(results) == {403: 6}, harness.summary(results)
    finally:
        mesh.delete_plugin()


AUTHZ_DENY = {
    "apiVersion": "security.istio.io/v1",
    "kind": "AuthorizationPolicy",
    "metadata": {"name": "deny-marked", "namespace": NAMESPACE},
    "spec": {"selector": {"matchLabels": WORKLOAD_LABELS}, "action": "DENY",
             "rules": [{"when": [{"key": "request.headers[x-deny]", "values": ["yes"]}]}]},
}


@pytest.mark.parametrize("phase", ["STATS", "AUTHZ"])
def test_phase_in_the_proxy_is_where_the_docs_say(mesh, phase):
    args = [] if phase == "STATS" else ["--set", f"istio.phase={phase}"]
    r = mesh.render(f"phase-{phase}", {"x-tenant-id": {"default": {"perhour": 3}}}, *args)
    assert r["plugin"]["spec"]["phase"] == phase
    assert "priority" not in r["plugin"]["spec"]
    mesh.limiter(r)
    mesh.kube.apply(AUTHZ_DENY)
    mesh.apply_rendered(r)
    rbac = "envoy.filters.http.rbac"
    try:
        wait_plugin(mesh, r["domain"])
        for w in mesh.workloads:
            wait_until(lambda w=w: rbac in inbound_http_filters(w), f"{w.name}: the RBAC filter",
                       APPLY_DEADLINE_S, process=w.process)
            names = inbound_http_filters(w)
            wasm = filter_index(names)
            if phase == "STATS":
                assert names.index(rbac) < wasm, names
            else:
                assert wasm < names.index(rbac), names
        ensure_window_room(3600, 120)
        tenant = unique("phase")
        denied = run_sequential(urls(mesh), 4, tenant=tenant, headers={"x-deny": "yes"})
        after = run_sequential(urls(mesh), 4, tenant=tenant)
        if phase == "STATS":
            # Refused by the AuthorizationPolicy before the filter: no quota spent.
            assert tally(denied) == {403: 4}, harness.summary(denied)
            assert [x.status for x in after] == [200] * 3 + [429], harness.summary(after)
        else:
            # The filter runs first: the refused requests spent the tenant's quota.
            assert [x.status for x in denied] == [403] * 3 + [429], harness.summary(denied)
            assert tally(after) == {429: 4}, harness.summary(after)
    finally:
        mesh.kube.delete("security.istio.io/v1", "AuthorizationPolicy", NAMESPACE, "deny-marked")
        mesh.delete_plugin()


# ------------------------------------------------------------------ where it runs

def listeners_with_plugin(w: istio.Workload, name: str = PLUGIN) -> list[str]:
    """The names of the workload's listeners whose HTTP filters hold the WasmPlugin `name`."""
    found = []
    for ls in w.config_dump("dynamic_listeners").get("configs", []):
        listener = ls.get("active_state", {}).get("listener", {})
        chains = listener.get("filter_chains", []) + (
            [listener["default_filter_chain"]] if "default_filter_chain" in listener else [])
        for chain in chains:
            for nf in chain.get("filters", []):
                if any(is_plugin(f.get("name", ""), name)
                       for f in nf.get("typed_config", {}).get("http_filters", [])):
                    found.append(listener.get("name", ""))
    return sorted(set(found))


def inbound_route_names(w: istio.Workload) -> list[str]:
    """The names of the routes of the workload's inbound listener (Istio
    writes its route configuration into the listener, not through RDS)."""
    names = []
    for ls in w.config_dump("dynamic_listeners").get("configs", []):
        listener = ls.get("active_state", {}).get("listener", {})
        if str(w.listen_port) not in listener.get("name", ""):
            continue
        for chain in listener.get("filter_chains", []):
            for nf in chain.get("filters", []):
                rc = nf.get("typed_config", {}).get("route_config")
                for vh in (rc or {}).get("virtual_hosts", []):
                    names += [r.get("name", "") for r in vh.get("routes", [])]
    assert names, f"{w.name}: no routes on its inbound listener"
    return sorted(set(names))


def outbound_route_names(w: istio.Workload, domain: str) -> list[str]:
    """The names of the routes of the virtual host serving `domain` in the
    workload's route configurations (RDS: its outbound listeners')."""
    names = []
    for rc in w.config_dump("dynamic_route_configs").get("configs", []):
        for vh in rc.get("route_config", {}).get("virtual_hosts", []):
            if any(d.split(":")[0] == domain for d in vh.get("domains", [])):
                names += [r.get("name", "") for r in vh.get("routes", [])]
    return names


VIA = "via-w2"  # a Service whose one endpoint is the second workload's inbound listener
VIA_HOST = f"{VIA}.{NAMESPACE}.svc.{istio.TRUST_DOMAIN}"


def via_second_workload(mesh: Mesh) -> str:
    """A Service `via-w2` (port 80) whose endpoint is w2's inbound listener, so
    that a call out of w1 (through its outbound listener, plain HTTP: the
    endpoint is not marked as a mesh workload's) goes into w2 as a call between
    two services of the mesh does; waits until w1's Envoy has that endpoint.
    Its outbound cluster."""
    w2 = mesh.workloads[1]
    mesh.kube.apply({"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": VIA, "namespace": NAMESPACE},
                     "spec": {"selector": {"app": VIA},
                              "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
    mesh.kube.apply({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
                     "metadata": {"name": VIA, "namespace": NAMESPACE},
                     "spec": {"address": harness.LOOPBACK, "labels": {"app": VIA},
                              "ports": {"http": w2.listen_port}}})
    cluster = f"outbound|80||{VIA_HOST}"
    w1 = mesh.workloads[0]
    wait_until(lambda: f"{harness.LOOPBACK}:{w2.listen_port}" in endpoints(w1, cluster),
               f"{w1.name}: {cluster} has w2's inbound listener", APPLY_DEADLINE_S,
               process=w1.process)
    return cluster


def call_out(w: istio.Workload, n: int, tenant: str, path: str = "/") -> list[int]:
    """n calls out of workload `w`, one after another, through its outbound
    HTTP proxy listener to the Service via-w2 (the app's own outgoing calls,
    carrying the tenant header they were given): the statuses."""
    s = requests.Session()
    s.trust_env = False
    proxies = {"http": f"http://{harness.LOOPBACK}:{w.egress_port}"}
    return [s.get(f"http://{VIA_HOST}{path}", headers={"x-tenant-id": tenant}, proxies=proxies,
                  timeout=10).status_code for _ in range(n)]


@pytest.mark.parametrize("plugin_match", ["rendered", "none"])
def test_the_filter_runs_on_the_sidecars_inbound_only(mesh, plugin_match):
    """What render writes runs on the inbound listener only (match mode SERVER).
    Without a match (Istio's default: inbound and outbound), it runs on the
    workload's outbound listener too: a call out of w1 into w2 is counted by
    both, and the tenant gets half its quota."""
    r = mesh.render(f"match-{plugin_match}", {"x-tenant-id": {"default": {"perhour": 4}}})
    assert r["plugin"]["spec"]["match"] == [{"mode": "SERVER"}]
    plugin = copy.deepcopy(r["plugin"])
    if plugin_match == "none":
        del plugin["spec"]["match"]
    mesh.limiter(r)
    mesh.apply_rendered(r, with_plugin=False)
    mesh.apply_plugin(plugin)
    via_second_workload(mesh)
    try:
        wait_plugin(mesh, r["domain"])
        w1, w2 = mesh.workloads
        for w in mesh.workloads:
            on = listeners_with_plugin(w)
            inbound = [n for n in on if str(w.listen_port) in n]
            outbound = [n for n in on if str(w.egress_port) in n]
            print(f"{plugin_match}: {w.name}: the filter is on {on} "
                  f"(inbound port {w.listen_port}, outbound {w.egress_port})")
            assert len(inbound) == 1, on
            if plugin_match == "rendered":
                assert on == inbound, on
            else:
                assert len(outbound) == 1 and set(on) == set(inbound + outbound), on
        ensure_window_room(3600, 120)
        # The app in w1 calls w2 with the tenant's header: w2's inbound counts
        # each call; without the match w1's outbound counts it first.
        statuses = call_out(w1, 6, unique("out"))
        print(f"{plugin_match}: 6 calls out of w1 into w2 at 4 per hour: {statuses}")
        if plugin_match == "rendered":
            assert statuses == [200] * 4 + [429] * 2
        else:
            assert statuses == [200] * 2 + [429] * 4
        # Requests into the workloads are limited either way.
        quota_of(mesh, 4)
    finally:
        mesh.delete_plugin()


def test_a_sidecars_inbound_route_is_named_default_whatever_the_virtualservice_says(mesh):
    """A VirtualService names the routes of the callers' outbound listeners
    (`http[].name`); the sidecar's inbound listener, where the WasmPlugin runs,
    has one route named "default". A team-file route "export" never applies
    there; one named "default" applies to every request."""
    limits = {"x-tenant-id": {"default": {"perhour": 100,
                                          "routes": {"export": {"perhour": 2},
                                                     "default": {"perhour": 3}}}}}
    r = mesh.render("routes", limits)
    mesh.limiter(r)
    mesh.apply_rendered(r)
    via_second_workload(mesh)
    vs = {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
          "metadata": {"name": VIA, "namespace": NAMESPACE},
          "spec": {"hosts": [VIA_HOST],
                   "http": [{"name": "export", "match": [{"uri": {"prefix": "/export"}}],
                             "route": [{"destination": {"host": VIA_HOST}}]},
                            {"name": "rest", "route": [{"destination": {"host": VIA_HOST}}]}]}}
    mesh.kube.apply(vs)
    try:
        wait_plugin(mesh, r["domain"])
        w1, w2 = mesh.workloads
        wait_until(lambda: "export" in outbound_route_names(w1, VIA_HOST),
                   f"{w1.name}: the VirtualService's routes on its outbound", APPLY_DEADLINE_S,
                   process=w1.process)
        print(f"w1's outbound routes for {VIA_HOST}: {outbound_route_names(w1, VIA_HOST)}")
        for w in mesh.workloads:
            print(f"{w.name}'s inbound routes: {inbound_route_names(w)}")
            assert inbound_route_names(w) == ["default"]
        assert outbound_route_names(w1, VIA_HOST) == ["export", "rest"]
        ensure_window_room(3600, 120)
        # Into w2 on /export, directly and through w1's outbound route "export":
        # the limit of route "default" (3) applies, never "export"'s (2).
        direct = run_sequential([w2.url + "export/report"], 4, tenant=unique("route"))
        assert [x.status for x in direct] == [200] * 3 + [429], harness.summary(direct)
        assert direct[0].headers.get("x-ratelimit-limit", "").startswith("3"), direct[0].headers
        statuses = call_out(w1, 4, unique("route"), "/export/report")
        print(f"4 calls of /export into w2 through w1's route 'export': {statuses}")
        assert statuses == [200] * 3 + [429]
    finally:
        mesh.kube.delete("networking.istio.io/v1", "VirtualService", NAMESPACE, VIA)
        mesh.delete_plugin()


def route_names(w: istio.Workload) -> list[str]:
    """The names of every route of the workload's route configurations (RDS)."""
    return sorted({r.get("name", "")
                   for rc in w.config_dump("dynamic_route_configs").get("configs", [])
                   for vh in rc.get("route_config", {}).get("virtual_hosts", [])
                   for r in vh.get("routes", [])})


def test_on_an_ingress_gateway_the_routes_carry_the_virtualservices_names(mesh):
    """An ingress gateway (`pilot-agent proxy router`, a Gateway resource on
    its port) with the filter rendered for it (`istio.mode=CLIENT`, the
    gateway's labels): the filter is on the gateway's listener, and a
    team-file route limit on the VirtualService's `http[].name` applies."""
    gw = istio.Workload(mesh.cp, "gw", NAMESPACE, {"istio": "ingressgateway"}, SERVICE_ACCOUNT,
                        app_port=mesh.upstream.listen_port, address="127.0.0.4",
                        insecure_registries=[mesh.registry.address], wait=False, gateway=True)
    gateway = {"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
               "metadata": {"name": "gw", "namespace": NAMESPACE},
               "spec": {"selector": {"istio": "ingressgateway"},
                        "servers": [{"port": {"number": gw.listen_port, "name": "http",
                                              "protocol": "HTTP"},
                                     "bind": harness.LOOPBACK, "hosts": ["*"]}]}}
    route = [{"destination": {"host": VIA_HOST, "port": {"number": 80}}}]
    vs = {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
          "metadata": {"name": "gw", "namespace": NAMESPACE},
          "spec": {"hosts": ["*"], "gateways": ["gw"],
                   "http": [{"name": "export", "match": [{"uri": {"prefix": "/export"}}],
                             "route": route},
                            {"name": "rest", "route": route}]}}
    limits = {"x-tenant-id": {"default": {"perhour": 100, "routes": {"export": {"perhour": 2}}}}}
    r = mesh.render("gateway", limits, "--set", "workload.name=gw",
                    "--set", "workload.labels={istio: ingressgateway}",
                    "--set", "istio.mode=CLIENT")
    assert r["plugin"]["spec"]["match"] == [{"mode": "CLIENT"}]
    mesh.kube.apply(gateway)
    mesh.kube.apply(vs)
    via_second_workload(mesh)
    try:
        gw.wait_listening()
        mesh.limiter(r)
        mesh.apply_rendered(r)
        wait_until(lambda: (plugin_json(gw) or {}).get("domain") == r["domain"],
                   "gw: the WasmPlugin", APPLY_DEADLINE_S, process=gw.process)
        cluster = r["plugin"]["spec"]["pluginConfig"]["rate_limit_service"]["cluster"]
        wait_until(lambda: harness.LOOPBACK in endpoints(gw, cluster),
                   f"gw: {cluster} has the service's endpoint", APPLY_DEADLINE_S,
                   process=gw.process)
        on = listeners_with_plugin(gw)
        print(f"gateway: the filter is on {on}; its routes: {route_names(gw)}")
        assert len(on) == 1 and str(gw.listen_port) in on[0], on
        assert {"export", "rest"} <= set(route_names(gw)), route_names(gw)
        ensure_window_room(3600, 120)
        tenant = unique("gw")
        export = run_sequential([gw.url + "export/report"], 3, tenant=tenant)
        other = run_sequential([gw.url + "search"], 3, tenant=tenant)
        assert [x.status for x in export] == [200, 200, 429], harness.summary(export)
        assert [x.status for x in other] == [200] * 3, harness.summary(other)
    finally:
        mesh.kube.delete("networking.istio.io/v1", "VirtualService", NAMESPACE, "gw")
        mesh.kube.delete("networking.istio.io/v1", "Gateway", NAMESPACE, "gw")
        mesh.kube.delete("extensions.istio.io/v1alpha1", "WasmPlugin", NAMESPACE, PLUGIN)
        gw.stop()

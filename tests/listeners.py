"""One Envoy with several listeners, each with its own chain of HTTP filters:
several instances of the filter in one Envoy (as two Istio WasmPlugins, or
two listeners, give), and Envoy's own filters in front of it (jwt_authn).

    envoy = start(stack, rls, upstream, {
        "a": [wasm_filter(cfg_a)],
        "chain": [wasm_filter(cfg_c), wasm_filter(cfg_d)],
    })
    harness.send(envoy.urls["a"], "acme")

Every wasm filter is an instance with its own plugin configuration; by
default with `vm_id: ""` and `root_id: ""`, as Istio leaves them, so all of
them share one shared-data map. The bootstrap is JSON (which Envoy reads as
YAML), built here rather than from a template: the listeners and chains are
the test's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import harness


def wasm_filter(plugin_config: dict, vm_id: str = "", root_id: str = "",
                name: str = "tenant_ratelimit") -> dict:
    """An instance of the filter with this plugin configuration."""
    return {
        "name": "envoy.filters.http.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": name,
                "root_id": root_id,
                "vm_config": {
                    "vm_id": vm_id,
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": str(harness.WASM)}},
                },
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": json.dumps(plugin_config, separators=(",", ":")),
                },
            },
        },
    }


ROUTER = {
    "name": "envoy.filters.http.router",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
}


def _listener(name: str, port: int, filters: list[dict], access_log: list[dict]) -> dict:
    return {
        "name": name,
        "address": {"socket_address": {"address": harness.LOOPBACK, "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network."
                         "http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": name,
                # HTTP/1.1, and HTTP/2 with prior knowledge (h2c).
                "codec_type": "AUTO",
                "route_config": {"name": name, "virtual_hosts": [{
                    "name": "all", "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "upstream"}}],
                }]},
                "http_filters": [*filters, ROUTER],
                **({"access_log": access_log} if access_log else {}),
            },
        }]}],
    }


def _cluster(name: str, port: int, http2: bool) -> dict:
    c = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": harness.LOOPBACK, "port_value": port}}}}]}]},
    }
    if http2:
        c["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }}
    return c


@dataclass
class MultiEnvoy:
    envoy: harness.Envoy
    ports: dict[str, int]

    @property
    def urls(self) -> dict[str, str]:
        return {name: f"http://{harness.LOOPBACK}:{p}/" for name, p in self.ports.items()}

    def filter_counters(self) -> dict[str, int]:
        """Every instance's counters, added up (they share the stats' names)."""
        return self.envoy.filter_counters()


def start(stack: harness.Stack, rls: harness.RateLimitService, upstream: harness.Envoy,
          chains: dict[str, list[dict]], name: str = "envoy", concurrency: int = 2,
          rls_cluster: str = "ratelimit", access_log_path: str | None = None) -> MultiEnvoy:
    """One Envoy, a listener per entry of `chains` (its HTTP filters, the
    router added last), the rate-limit service as `rls_cluster`;
    `access_log_path`: every listener logs there what the project's
    bootstrap logs (harness.bootstrap_access_log)."""
    access_log = harness.bootstrap_access_log(access_log_path) if access_log_path else []
    ports = {listener: harness.free_port() for listener in chains}
    admin = harness.free_port()
    config = {
        "node": {"id": name, "cluster": "tenant-ratelimit"},
        "admin": {"address": {"socket_address": {"address": harness.LOOPBACK, "port_value": admin}}},
        "static_resources": {
            "listeners": [_listener(n, ports[n], f, access_log) for n, f in chains.items()],
            "clusters": [_cluster(rls_cluster, rls.grpc_port, http2=True),
                         _cluster("upstream", upstream.listen_port, http2=False)],
        },
    }
    envoy = harness.Envoy(stack, name, json.dumps(config, indent=1), next(iter(ports.values())),
                          admin, concurrency=concurrency)
    return MultiEnvoy(envoy, ports)

"""An Envoy whose tenant-ratelimit filter is served by ECDS from a watched
file (envoy/envoy-ecds.yaml.tmpl), and the updates a control plane would send.

    e = EcdsEnvoy(stack, plugin_config, rls, upstream)
    e.push(new_plugin_config)          # write + rename: Envoy picks it up
    e.wait_applied(1)                  # config_reload moved by one
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import harness
from harness import LOOPBACK, WASM, Envoy, RateLimitService, free_port, render, wait_until

ECDS_TEMPLATE = harness.REPO / "envoy" / "envoy-ecds.yaml.tmpl"
FILTER_NAME = "tenant_ratelimit"
STAT = f"extension_config_discovery.http_filter.{FILTER_NAME}"


def wasm_typed_config(plugin_config: dict | str, wasm_path: Path | str = WASM) -> dict:
    """The filter's Wasm message, as in envoy.yaml.tmpl. A str is sent as is
    (so a test can send something that is not JSON)."""
    value = plugin_config if isinstance(plugin_config, str) else json.dumps(
        plugin_config, separators=(",", ":"))
    return {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "config": {
            "name": FILTER_NAME,
            "root_id": FILTER_NAME,
            "vm_config": {
                "vm_id": FILTER_NAME,
                "runtime": "envoy.wasm.runtime.v8",
                "code": {"local": {"filename": str(wasm_path)}},
            },
            "configuration": {
                "@type": "type.googleapis.com/google.protobuf.StringValue",
                "value": value,
            },
        },
    }


def ecds_resource(plugin_config: dict | str, version: str,
                  wasm_path: Path | str = WASM) -> str:
    """The file ECDS reads: a DiscoveryResponse with one TypedExtensionConfig
    (JSON, which is also YAML)."""
    return json.dumps({
        "version_info": version,
        "resources": [{
            "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
            "name": FILTER_NAME,
            "typed_config": wasm_typed_config(plugin_config, wasm_path),
        }],
    }, indent=2)


def write_atomically(path: Path, text: str) -> None:
    """Write beside `path`, then rename over it: what Envoy's watch reacts to."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def render_ecds_config(*, ecds_path: Path, listen_port: int, admin_port: int, rls_port: int,
                       upstream_port: int, rls_cluster: str = "ratelimit",
                       bind_address: str = LOOPBACK, node_id: str = "envoy-ecds",
                       cluster_type: str = "STATIC") -> str:
    return render(ECDS_TEMPLATE, node_id=node_id, bind_address=bind_address,
                  listen_port=listen_port, admin_port=admin_port, ecds_path=ecds_path,
                  ecds_dir=ecds_path.parent, rls_cluster=rls_cluster, rls_address=LOOPBACK,
                  rls_port=rls_port, upstream_address=LOOPBACK, upstream_port=upstream_port,
                  cluster_type=cluster_type)


class EcdsEnvoy(Envoy):
    def __init__(self, stack: harness.Stack, plugin_config: dict,
                 rls: RateLimitService, upstream: Envoy, name: str = "envoy-ecds",
                 extra_args: tuple[str, ...] = (), wasm_path: Path | str = WASM):
        self.ecds_dir = stack.workdir / f"{name}-ecds"
        self.ecds_dir.mkdir(parents=True, exist_ok=True)
        self.ecds_path = self.ecds_dir / "tenant_ratelimit.yaml"
        self.version = 1
        write_atomically(self.ecds_path,
                         ecds_resource(plugin_config, str(self.version), wasm_path))
        listen, admin = free_port(), free_port()
        cluster = plugin_config.get("rate_limit_service", {}).get("cluster", "ratelimit")
        text = render_ecds_config(ecds_path=self.ecds_path, listen_port=listen,
                                  admin_port=admin, rls_port=rls.grpc_port,
                                  upstream_port=upstream.listen_port, rls_cluster=cluster,
                                  node_id=name)
        super().__init__(stack, name, text, listen, admin, extra_args=extra_args)

    def push(self, plugin_config: dict | str, wasm_path: Path | str = WASM) -> str:
        """Send a new version of the filter's configuration (and module);
        returns its version."""
        self.version += 1
        write_atomically(self.ecds_path,
                         ecds_resource(plugin_config, str(self.version), wasm_path))
        return str(self.version)

    def filter_counters(self) -> dict[str, int]:
        """The filter's counters, without ECDS's own stats of the filter's name."""
        out: dict[str, int] = {}
        for name, value in self.stats("tenant_ratelimit").items():
            if name.startswith(("wasm.", "extension_config_discovery.")) or name.endswith(
                    harness.STATS_FLUSHES):
                continue
            _, sep, suffix = name.partition("tenant_ratelimit.")
            if sep:
                out[suffix] = out.get(suffix, 0) + value
        return out

    def ecds_stats(self) -> dict[str, int]:
        return {k[len(STAT) + 1:]: v for k, v in self.stats(STAT).items()
                if k.startswith(STAT + ".")}

    def wait_stat(self, name: str, at_least: int, what: str, deadline_s: float = 30.0) -> None:
        wait_until(lambda: self.ecds_stats().get(name, 0) >= at_least, what, deadline_s,
                   process=self.process)

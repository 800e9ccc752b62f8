#!/usr/bin/env python3
"""Render the configs e2e/docker-compose.yml mounts, from the same templates
and the same generator the local demo and the tests use.

    python e2e/compose_config.py [--out .run/compose]

writes OUT/envoy-1.yaml, OUT/envoy-2.yaml, OUT/upstream.yaml,
OUT/ratelimit/config/ratelimit.yaml (from e2e/limits.json, domain internal-api)
and OUT/counter/internal-api.json (the team file ratelimit-counter serves).
`--service counter`: the Envoys' filter calls ratelimit-counter
(e2e/docker-compose.counter.yml) instead of envoyproxy/ratelimit.
Inside the compose network the clusters name hosts (`ratelimit`, `upstream`),
so they are STRICT_DNS, and listeners bind 0.0.0.0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import harness  # noqa: E402

LIMITS = REPO / "e2e" / "limits.json"
DOMAIN = "internal-api"
# Ports inside the containers (docker-compose.yml publishes them).
LISTEN_PORT, ADMIN_PORT, RLS_GRPC_PORT, UPSTREAM_PORT = 10000, 9901, 8081, 10000
CONTAINER_WASM = "/etc/envoy/tenant_ratelimit.wasm"
ENVOYS = ("envoy-1", "envoy-2")


SERVICES = ("envoy-ratelimit", "counter")


def render_compose_configs(out: Path, wasm_path: str | Path = CONTAINER_WASM,
                           timeout_ms: int | None = None,
                           service: str = "envoy-ratelimit") -> list[Path]:
    """Write every compose config into `out`; return the Envoy bootstraps written.

    `timeout_ms`: the filter's gRPC timeout, when not the generated default.
    `service`: the rate-limit service the Envoys' filter calls.
    """
    if service not in SERVICES:
        raise ValueError(f"service {service!r}: one of {SERVICES}")
    out.mkdir(parents=True, exist_ok=True)
    gen = harness.generate(json.loads(LIMITS.read_text()), out / "generated", DOMAIN)
    config_dir = out / "ratelimit" / "config"
    config_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(gen.ratelimit_yaml, config_dir / "ratelimit.yaml")
    counter_dir = out / "counter"
    counter_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(LIMITS, counter_dir / f"{DOMAIN}.json")
    plugin_config = gen.plugin_config(timeout_ms=timeout_ms)
    if service == "counter":
        # What `generate --service counter` writes: the filter marks where
        # each request of a batched call begins.
        plugin_config["rate_limit_service"]["service"] = "counter"

    written = []
    for name in ENVOYS:
        path = out / f"{name}.yaml"
        path.write_text(harness.render_envoy_config(
            plugin_config, listen_port=LISTEN_PORT, admin_port=ADMIN_PORT,
            rls_port=RLS_GRPC_PORT, upstream_port=UPSTREAM_PORT, wasm_path=wasm_path,
            bind_address="0.0.0.0", rls_address="ratelimit", upstream_address="upstream",
            cluster_type="STRICT_DNS", node_id=name))
        written.append(path)
    path = out / "upstream.yaml"
    path.write_text(harness.render_upstream_config(
        listen_port=UPSTREAM_PORT, admin_port=ADMIN_PORT, bind_address="0.0.0.0"))
    written.append(path)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / ".run" / "compose")
    ap.add_argument("--service", choices=SERVICES, default="envoy-ratelimit",
                    help="the rate-limit service the Envoys call (counter: e2e/docker-compose.counter.yml)")
    args = ap.parse_args()
    for p in render_compose_configs(args.out, service=args.service):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())

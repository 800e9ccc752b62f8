#!/usr/bin/env python3
"""Write the files deploy/*/kustomization.yaml take from generated/: the
rate-limit service rules and the sidecar Envoy's bootstrap, generated from a
team file by ratelimit-config (as everywhere in this project), and the built
.wasm for the sidecar's ConfigMap.

    python deploy/render.py [--limits e2e/limits.json] [--domain internal-api] [--root deploy]

then `kustomize build deploy/sidecar` (or deploy/istio, deploy/envoy-gateway).
`make deploy-render` does both, into .run/deploy/.
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

# Inside the sidecar pod: the app, the rate-limit service's gRPC, Envoy.
APP_PORT, RLS_GRPC_PORT, LISTEN_PORT, ADMIN_PORT = 8080, 8081, 8000, 9901
POD_WASM = "/etc/envoy-wasm/tenant_ratelimit.wasm"


def render(root: Path, limits: Path, domain: str) -> list[Path]:
    gen = harness.generate(json.loads(limits.read_text()), root / "generated" / "gen", domain)
    written = []
    for variant in ("ratelimit", "sidecar"):
        out = root / variant / "generated"
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(gen.ratelimit_yaml, out / "ratelimit.yaml")
        written.append(out / "ratelimit.yaml")
    sidecar = root / "sidecar" / "generated"
    text = harness.render_envoy_config(
        gen.plugin_config(), listen_port=LISTEN_PORT, admin_port=ADMIN_PORT,
        rls_port=RLS_GRPC_PORT, upstream_port=APP_PORT, wasm_path=POD_WASM,
        bind_address="0.0.0.0", node_id="my-api")
    # The listener on every address of the pod; admin (which can stop Envoy) on loopback only.
    admin = f"socket_address: {{ address: 0.0.0.0, port_value: {ADMIN_PORT} }}"
    if text.count(admin) != 1:
        raise SystemExit("envoy/envoy.yaml.tmpl changed its admin block: update deploy/render.py")
    text = text.replace(admin, f"socket_address: {{ address: 127.0.0.1, port_value: {ADMIN_PORT} }}")
    (sidecar / "envoy.yaml").write_text(text)
    shutil.copyfile(harness.WASM, sidecar / "tenant_ratelimit.wasm")
    written += [sidecar / "envoy.yaml", sidecar / "tenant_ratelimit.wasm"]
    shutil.rmtree(root / "generated", ignore_errors=True)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limits", type=Path, default=REPO / "e2e" / "limits.json")
    ap.add_argument("--domain", default="internal-api")
    ap.add_argument("--root", type=Path, default=REPO / "deploy")
    args = ap.parse_args()
    for p in render(args.root, args.limits, args.domain):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())

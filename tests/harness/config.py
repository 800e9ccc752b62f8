"""`ratelimit-config` run by the tests: generate, render, and the files and
documents they write."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .base import CLI, HarnessError


@dataclass
class Generated:
    """What `ratelimit-config generate` wrote for one team JSON."""

    limits: dict
    domain: str
    out_dir: Path
    ratelimit_yaml: Path
    plugin_config_path: Path

    def plugin_config(self, **overrides) -> dict:
        """A fresh copy of plugin-config.json, with top-level keys replaced.

        `timeout_ms=` is a shortcut for rate_limit_service.timeout_ms.
        """
        cfg = json.loads(self.plugin_config_path.read_text())
        timeout_ms = overrides.pop("timeout_ms", None)
        if timeout_ms is not None:
            cfg["rate_limit_service"]["timeout_ms"] = timeout_ms
        cfg.update(overrides)
        return cfg


def run_cli(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    if check and proc.returncode != 0:
        raise HarnessError(
            f"ratelimit-config {' '.join(map(str, args))} exited {proc.returncode}\n"
            f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
    return proc


def generate(limits: dict, out_dir: Path, domain: str, cluster: str | None = None,
             timeout_ms: int | None = None, service: str | None = None) -> Generated:
    """Write the team JSON, run `ratelimit-config generate` (`--service` if
    given), return the generated files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    limits_path = out_dir / "limits.json"
    limits_path.write_text(json.dumps(limits, indent=2))
    args: list[str | Path] = ["generate", limits_path, "--domain", domain, "--out", out_dir]
    if cluster is not None:
        args += ["--cluster", cluster]
    if timeout_ms is not None:
        args += ["--timeout-ms", str(timeout_ms)]
    if service is not None:
        args += ["--service", service]
    run_cli(*args)
    gen = Generated(limits, domain, out_dir, out_dir / "ratelimit.yaml",
                    out_dir / "plugin-config.json")
    for p in (gen.ratelimit_yaml, gen.plugin_config_path):
        if not p.exists():
            raise HarnessError(f"ratelimit-config generate did not write {p}")
    return gen


def render_target(limits: dict, target: str, out_dir: Path, *args: str | Path) -> dict[str, str]:
    """`ratelimit-config render` of a team JSON for one target into `out_dir`
    (the team file beside it), with `args` (--deployment, --set, ...);
    {file name: text} of what it wrote."""
    out_dir.mkdir(parents=True, exist_ok=True)
    limits_path = out_dir.parent / f"{out_dir.name}-limits.json"
    limits_path.write_text(json.dumps(limits, indent=2))
    run_cli("render", limits_path, "--target", target, "--out", out_dir, *args)
    return {p.name: p.read_text() for p in sorted(out_dir.iterdir()) if p.name != OUT_MANIFEST}


# What generate and render record of the files they wrote in an output folder.
OUT_MANIFEST = ".ratelimit-config-written"


def find(docs: list[dict], kind: str, name: str | None = None) -> dict:
    """The one Kubernetes document of `kind` (named `name`, if given: a
    generated ConfigMap's name has a hash suffix) among `docs`."""
    def named(d: dict) -> bool:
        n = d["metadata"]["name"]
        return name is None or n == name or (kind == "ConfigMap" and n.rsplit("-", 1)[0] == name)
    hits = [d for d in docs if d["kind"] == kind and named(d)]
    if len(hits) != 1:
        raise AssertionError(f"{kind} {name}: {len(hits)} found")
    return hits[0]

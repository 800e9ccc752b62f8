"""Envoy: the project's bootstrap templates rendered, and one Envoy process;
also the bootstrap of Envoy's own rate-limit filter."""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import requests

from .base import ENVOY_BIN, ENVOY_TEMPLATE, LOOPBACK, REPO, STARTUP_DEADLINE_S, UPSTREAM_TEMPLATE, WASM, HarnessError, StartupError
from .config import Generated
from .metrics import STATS_FLUSHES, Labels, parse_stats, scrape_prometheus, wait_flushed
from .processes import http_ok, wait_until

if TYPE_CHECKING:
    from .stack import Stack


def render(template: Path, **values) -> str:
    """string.Template substitution; a placeholder left without a value is an error."""
    return string.Template(template.read_text()).substitute(
        {k: str(v) for k, v in values.items()})


def render_envoy_config(plugin_config: dict | str, *, listen_port: int, admin_port: int,
                        rls_port: int, upstream_port: int, wasm_path: Path | str = WASM,
                        bind_address: str = LOOPBACK, rls_address: str = LOOPBACK,
                        upstream_address: str = LOOPBACK, cluster_type: str = "STATIC",
                        node_id: str = "envoy", access_log_path: Path | str = "/dev/stdout",
                        rls_cluster: str | None = None) -> str:
    """envoy/envoy.yaml.tmpl for this plugin configuration: a dict, or the
    text itself (what a dict cannot hold: a key twice, a BOM). Envoy's
    cluster for the service is `rls_cluster`, by default the one the
    configuration names (`rate_limit_service.cluster`, else "ratelimit")."""
    if isinstance(plugin_config, str):
        text = plugin_config
        named = None
    else:
        text = json.dumps(plugin_config, separators=(",", ":"))
        named = plugin_config.get("rate_limit_service", {}).get("cluster")
    cluster = rls_cluster or named or "ratelimit"
    return render(
        ENVOY_TEMPLATE,
        node_id=node_id,
        bind_address=bind_address,
        listen_port=listen_port,
        admin_port=admin_port,
        wasm_path=wasm_path,
        # A JSON string literal is also a valid YAML double-quoted scalar.
        plugin_config=json.dumps(text),
        rls_cluster=cluster,
        rls_address=rls_address,
        rls_port=rls_port,
        upstream_address=upstream_address,
        upstream_port=upstream_port,
        cluster_type=cluster_type,
        access_log_path=access_log_path,
    )


def bootstrap_access_log(path: Path | str) -> list[dict]:
    """The HTTP connection manager's `access_log` of the project's bootstrap
    (envoy/envoy.yaml.tmpl), writing to `path`: for bootstraps a test builds
    itself (tests/listeners.py), so that they log what the product logs."""
    import yaml  # only the tests that build their own bootstrap need it

    text = render_envoy_config({}, listen_port=1, admin_port=2, rls_port=3, upstream_port=4,
                               access_log_path=path)
    doc = yaml.safe_load(text)
    for listener in doc["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                log = f.get("typed_config", {}).get("access_log")
                if log is not None:
                    return log
    raise HarnessError(f"{ENVOY_TEMPLATE}: no access_log in its connection manager")


def render_upstream_config(*, listen_port: int, admin_port: int,
                           bind_address: str = LOOPBACK, node_id: str = "upstream") -> str:
    return render(UPSTREAM_TEMPLATE, node_id=node_id, bind_address=bind_address,
                  listen_port=listen_port, admin_port=admin_port)


def envoy_argv(config_path: Path, concurrency: int, extra: Iterable[str] = ()) -> list[str]:
    # --disable-hot-restart: no shared-memory region, so any number of Envoys
    # (and `--mode validate` runs) coexist without choosing base ids.
    return [str(ENVOY_BIN), "-c", str(config_path), "--concurrency", str(concurrency),
            "--disable-hot-restart", "--log-level", "info", *extra]


class EnvoyPorts:
    """An Envoy's addresses on loopback: its listener's and its admin's."""

    listen_port: int
    admin_port: int

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.listen_port}/"

    @property
    def admin_url(self) -> str:
        return f"http://{LOOPBACK}:{self.admin_port}"


class Envoy(EnvoyPorts):
    """One Envoy process; `ready` means admin /ready answered 200."""

    def __init__(self, stack: "Stack", name: str, config_text: str, listen_port: int,
                 admin_port: int, concurrency: int = 2, wait: bool = True,
                 extra_args: Iterable[str] = ()):
        self.name = name
        self.listen_port = listen_port
        self.admin_port = admin_port
        self.config_path = stack.workdir / f"{name}.yaml"
        self.config_path.write_text(config_text)
        self.process = stack.spawn(name, envoy_argv(self.config_path, concurrency, extra_args))
        if wait:
            self.wait_ready()

    def is_ready(self) -> bool:
        return http_ok(f"{self.admin_url}/ready", timeout=0.5)

    def wait_ready(self, deadline_s: float = STARTUP_DEADLINE_S) -> None:
        wait_until(self.is_ready, f"{self.name} admin /ready", deadline_s, process=self.process)

    def outcome(self, deadline_s: float = STARTUP_DEADLINE_S) -> str:
        """How a start ended: "ready", "exited <code>", or "not ready after <n>s"."""
        try:
            self.wait_ready(deadline_s)
            return "ready"
        except StartupError as e:
            if e.exit_code is not None:
                return f"exited {e.exit_code}"
            return f"not ready after {deadline_s:.0f}s"

    def stats(self, filter_regex: str | None = None) -> dict[str, int]:
        """/stats, once the filter's counts made so far are in it (wait_flushed)."""
        wait_flushed(self.admin_url)
        params = {"filter": filter_regex} if filter_regex else None
        return parse_stats(requests.get(f"{self.admin_url}/stats", params=params, timeout=2).text)

    def prometheus(self, prefix: str = "",
                   types: Iterable[str] | None = None) -> dict[tuple[str, Labels], float]:
        """/stats/prometheus, as prometheus_series reads it."""
        return scrape_prometheus(self.admin_url, prefix, types)

    def filter_counters(self) -> dict[str, int]:
        """The filter's counters keyed by what follows `tenant_ratelimit.`.

        Envoy shows proxy-wasm metrics with a prefix of its own (e.g.
        `wasmcustom.tenant_ratelimit.allowed`); match on the suffix.
        """
        out: dict[str, int] = {}
        for name, value in self.stats("tenant_ratelimit").items():
            # `wasm.tenant_ratelimit.vm_reload*` are Envoy's own stats of the VM;
            # the flushes count ticks, not requests.
            if name.startswith("wasm.") or name.endswith(STATS_FLUSHES):
                continue
            _, sep, suffix = name.partition("tenant_ratelimit.")
            if sep:
                out[suffix] = out.get(suffix, 0) + value
        return out

    def stop(self) -> None:
        self.process.stop()



# ------------------------------------------------------------------ Envoy's own rate-limit filter

NATIVE_TEMPLATE = REPO / "envoy" / "native-ratelimit.yaml.tmpl"
_RATE_LIMITS_MARKER = re.compile(r"^( *)# RATE_LIMITS:.*$", re.M)
_DOMAIN_LINE = re.compile(r"^( *)domain: internal-api  # DOMAIN$", re.M)


def native_rate_limits(gen: Generated) -> Path:
    """The rate_limits block `ratelimit-config generate` wrote for Envoy's own filter."""
    return gen.out_dir / "envoy-rate-limits.yaml"


def render_native_envoy_config(rate_limits_yaml: str, domain: str, *, listen_port: int,
                               admin_port: int, rls_port: int, upstream_port: int,
                               rls_cluster: str = "ratelimit",
                               node_id: str = "envoy-native") -> str:
    """envoy/native-ratelimit.yaml.tmpl with `rate_limits_yaml` (the text of a
    generated envoy-rate-limits.yaml) pasted under the virtual host, as a
    user pastes it, and the filter's domain set."""
    text = render(NATIVE_TEMPLATE, node_id=node_id, bind_address=LOOPBACK,
                  listen_port=listen_port, admin_port=admin_port, rls_cluster=rls_cluster,
                  rls_address=LOOPBACK, rls_port=rls_port, upstream_address=LOOPBACK,
                  upstream_port=upstream_port, cluster_type="STATIC")
    marker = _RATE_LIMITS_MARKER.search(text)
    domain_line = _DOMAIN_LINE.search(text)
    if not marker or not domain_line:
        raise HarnessError(f"{NATIVE_TEMPLATE}: rate_limits marker or domain line missing")
    indent = marker.group(1)
    block = "\n".join(indent + line for line in rate_limits_yaml.splitlines()
                      if line.strip() and not line.lstrip().startswith("#"))
    text = text[:marker.start()] + block + text[marker.end():]
    # A JSON string literal is also a valid YAML double-quoted scalar.
    return _DOMAIN_LINE.sub(lambda m: f"{m.group(1)}domain: {json.dumps(domain)}", text, count=1)

"""ratelimit-counter for the integration tests: started from the test process
on ports the harness picks, with its team files in the stack's work dir.

    counter = Counter(stack, {"d": limits}, store="memory")
    counter.grpc_port  # what Envoy's rate-limit cluster points at
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import requests

import harness
from harness import LOOPBACK, HarnessError, free_port, wait_until

COUNTER_BIN = harness.COUNTER_BIN


class Counter(harness.Supervised):
    """One ratelimit-counter process. `teams`: {domain: team JSON}, written
    as <dir>/<domain>.json (the directory a mounted ConfigMap gives).
    `store`: memory, redis://..., redis-cluster://host:port,...
    `clock_offset_ms`: the counter's clock, moved (a file the test rewrites
    with `set_clock`). `wait_ready=False`: started, not waited for (a test
    of a counter that is not ready)."""

    def __init__(self, stack: harness.Stack, teams: dict[str, dict], store: str = "memory",
                 name: str = "counter", limits_dir: Path | None = None,
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                 store_timeout_ms: int = 200, reload_interval_ms: int = 100,
                 wait_ready: bool = True):
        self.stack = stack
        self.name = name
        self.dir = limits_dir or stack.workdir / f"{name}-limits"
        self.dir.mkdir(parents=True, exist_ok=True)
        for domain, limits in teams.items():
            self.write_team(domain, limits)
        self.clock_file = stack.workdir / f"{name}-clock"
        if not self.clock_file.exists():
            self.clock_file.write_text("0")
        self.store = store
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.argv = [str(COUNTER_BIN), "--limits", str(self.dir), "--store", store,
                     "--grpc-addr", f"{LOOPBACK}:{self.grpc_port}",
                     "--http-addr", f"{LOOPBACK}:{self.http_port}",
                     "--store-timeout-ms", str(store_timeout_ms),
                     "--reload-interval-ms", str(reload_interval_ms), *(extra_args or [])]
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "TRL_COUNTER_TEST_CLOCK_FILE": str(self.clock_file), **(env or {})}
        self.domains = list(teams)
        self.process: harness.Process | None = None
        self.start(wait_ready)

    def write_team(self, domain: str, limits: dict | str) -> None:
        """Writes (or replaces, as a ConfigMap update does) a domain's team file."""
        text = limits if isinstance(limits, str) else json.dumps(limits)
        tmp = self.dir / f".{domain}.json.tmp"
        tmp.write_text(text)
        tmp.replace(self.dir / f"{domain}.json")

    def set_clock(self, offset_ms: int) -> None:
        """Moves the counter's clock to real time + offset_ms (read on every call)."""
        tmp = self.clock_file.with_suffix(".tmp")
        tmp.write_text(str(int(offset_ms)))
        tmp.replace(self.clock_file)

    def start(self, wait_ready: bool = True) -> None:
        if not COUNTER_BIN.exists():
            raise HarnessError(f"{COUNTER_BIN} is missing: run `make build`")
        if self.process is not None and self.process.alive():
            raise HarnessError("counter already running")
        self.process = self.stack.spawn(self.name, self.argv, env=self.env)
        if wait_ready:
            wait_until(self.ready, f"{self.name} /readyz", process=self.process)

    @property
    def http_url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}"

    def ready(self) -> bool:
        try:
            return requests.get(f"{self.http_url}/readyz", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def answering(self) -> bool:
        """Its HTTP port answers (whatever /readyz says)."""
        try:
            requests.get(f"{self.http_url}/healthz", timeout=1)
            return True
        except requests.RequestException:
            return False

    def readyz_page(self) -> requests.Response:
        """/readyz, once the HTTP port listens (it binds after the store's
        first attempt, whose failure it logs first)."""
        wait_until(self.answering, f"{self.name} listens", process=self.process)
        return requests.get(f"{self.http_url}/readyz", timeout=3)

    def readyz(self) -> int:
        return self.readyz_page().status_code

    def metrics(self) -> dict[str, float]:
        return harness.parse_prometheus(
            requests.get(f"{self.http_url}/metrics", timeout=2).text)

    def group_total(self, name: str, domain: str, group: str = "default") -> int:
        """e.g. group_total("admitted", domain): trl_counter_admitted_total of a group."""
        key = f'trl_counter_{name}_total{{domain="{domain}",group="{group}"}}'
        return int(self.metrics().get(key, 0))


def native_envoy(stack: harness.Stack, gen: harness.Generated, rls_port: int,
                 upstream: harness.Envoy, name: str = "envoy-native",
                 concurrency: int = 2) -> harness.Envoy:
    """Envoy's own rate-limit filter with the rate_limits `generate` wrote."""
    listen, admin = free_port(), free_port()
    text = harness.render_native_envoy_config(
        harness.native_rate_limits(gen).read_text(), gen.domain, listen_port=listen,
        admin_port=admin, rls_port=rls_port, upstream_port=upstream.listen_port,
        node_id=name)
    return harness.Envoy(stack, name, text, listen, admin, concurrency=concurrency)

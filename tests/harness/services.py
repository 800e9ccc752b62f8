"""envoyproxy/ratelimit (service_cmd) as the tests start it, and its debug
/rlconfig dump. (ratelimit-counter: tests/counter.py.)"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import requests

from .base import LOOPBACK, RATELIMIT_BIN, STATS_FLUSH_S, HarnessError
from .metrics import parse_prometheus, parse_stats
from .processes import Process, Supervised, free_port, http_ok, wait_until
from .redis import Redis

if TYPE_CHECKING:
    from .stack import Stack


# The service's Redis settings the project ships. REDIS_TIMEOUT is the only
# Redis timeout envoyproxy/ratelimit has, and it bounds only the dial (its
# default is 10 s): a call waits for a pooled connection with no deadline
# (README "Known issues"), so a dead Redis costs each call the filter's
# timeout_ms whatever this is. 1 s keeps a reconnect to a blackholed
# address from tying up the pool for 10 s.
RATELIMIT_REDIS_ENV = {"REDIS_TIMEOUT": "1s"}


class RateLimitService(Supervised):
    """envoyproxy/ratelimit (service_cmd), counting in `redis`.

    Its config directory holds the ratelimit.yaml files ratelimit-config
    generated: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml.
    """

    def __init__(self, stack: "Stack", redis: Redis | None, config_files: Iterable[Path],
                 log_level: str | None = None, extra_env: dict[str, str] | None = None):
        self.stack = stack
        self.extra_env = dict(extra_env or {})
        self.redis = redis
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.debug_port = free_port()
        self.metrics_port = free_port()
        self.runtime_root = stack.workdir / "ratelimit-runtime"
        config_dir = self.runtime_root / "ratelimit" / "config"
        config_dir.mkdir(parents=True, exist_ok=True)
        self.domains: list[str] = []
        for i, f in enumerate(config_files):
            text = Path(f).read_text()
            m = re.search(r"^domain:\s*['\"]?([^'\"\s]+)", text, re.M)
            if not m:
                raise HarnessError(f"{f}: no domain in the ratelimit config")
            self.domains.append(m.group(1))
            shutil.copy(f, config_dir / f"{i:02d}-{Path(f).name}")
        self.log_level = log_level or os.environ.get("TRL_RATELIMIT_LOG_LEVEL", "info")
        self.process: Process | None = None
        self.start()

    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOST": LOOPBACK,
            "PORT": str(self.http_port),
            "GRPC_HOST": LOOPBACK,
            "GRPC_PORT": str(self.grpc_port),
            "DEBUG_HOST": LOOPBACK,
            "DEBUG_PORT": str(self.debug_port),
            "REDIS_SOCKET_TYPE": "tcp",
            # Without `redis`, extra_env gives REDIS_URL (e.g. a Redis Cluster: tests/cluster.py).
            **({"REDIS_URL": self.redis.address} if self.redis is not None else {}),
            **RATELIMIT_REDIS_ENV,
            # The debug port's /stats shows only Go expvars; the service's own
            # counters (within_limit, over_limit, ...) reach an HTTP endpoint
            # only through the Prometheus sink, flushed every STATS_FLUSH_INTERVAL.
            "USE_STATSD": "false",
            "USE_PROMETHEUS": "true",
            "PROMETHEUS_ADDR": f"{LOOPBACK}:{self.metrics_port}",
            "STATS_FLUSH_INTERVAL": f"{int(STATS_FLUSH_S * 1000)}ms",
            "RUNTIME_ROOT": str(self.runtime_root),
            "RUNTIME_SUBDIRECTORY": "ratelimit",
            "RUNTIME_WATCH_ROOT": "false",
            "LOG_LEVEL": self.log_level,
            "LOG_FORMAT": "text",
            **self.extra_env,
        }

    def start(self) -> None:
        """Start (or restart, on the same ports) and wait for /healthcheck and the config."""
        if self.process is not None and self.process.alive():
            raise HarnessError("ratelimit service already running")
        self.process = self.stack.spawn("ratelimit", [RATELIMIT_BIN], env=self.env())
        wait_until(lambda: http_ok(f"{self.http_url}/healthcheck"),
                   "ratelimit /healthcheck", process=self.process)
        wait_until(self._config_loaded, "ratelimit /rlconfig lists every domain",
                   process=self.process)

    def _config_loaded(self) -> bool:
        text = requests.get(f"{self.debug_url}/rlconfig", timeout=1).text
        return all(f"{d}." in text for d in self.domains)

    @property
    def http_url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}"

    @property
    def debug_url(self) -> str:
        return f"http://{LOOPBACK}:{self.debug_port}"

    def rlconfig(self) -> str:
        return requests.get(f"{self.debug_url}/rlconfig", timeout=2).text

    def debug_stats(self) -> dict[str, int]:
        """The debug port's /stats: Go expvars (memstats, ...), no rate-limit counters."""
        return parse_stats(requests.get(f"{self.debug_url}/stats", timeout=2).text)

    def metrics(self) -> dict[str, float]:
        """The service's counters as its Prometheus sink shows them right now.

        Keys are `name{label="value",...}` with labels sorted, e.g.
        `ratelimit_service_rate_limit_within_limit{domain="d",key1="generic_key_per_hour",key2="tenant"}`.
        """
        text = requests.get(f"http://{LOOPBACK}:{self.metrics_port}/metrics", timeout=2).text
        return parse_prometheus(text)

    def settled_metrics(self, deadline_s: float = 10.0) -> dict[str, float]:
        """metrics() once two reads more than a flush interval apart agree on
        every rate-limit counter (`ratelimit_service_*`; the Go runtime
        gauges change on every flush)."""

        def counters(m: dict[str, float]) -> dict[str, float]:
            return {k: v for k, v in m.items() if k.startswith("ratelimit_service_")}

        end = time.monotonic() + deadline_s
        previous = self.metrics()
        while True:
            time.sleep(STATS_FLUSH_S * 2.5)
            current = self.metrics()
            if counters(current) == counters(previous):
                return current
            if time.monotonic() > end:
                raise HarnessError(f"ratelimit counters still moving after {deadline_s}s")
            previous = current

    def rule_counter(self, name: str, domain: str, unit: str, key2: str = "tenant",
                     metrics: dict[str, float] | None = None) -> int:
        """e.g. rule_counter("within_limit", domain, "hour"): admissions by the per-hour rule."""
        m = self.settled_metrics() if metrics is None else metrics
        key = (f'ratelimit_service_rate_limit_{name}{{domain="{domain}",'
               f'key1="generic_key_per_{unit}",key2="{key2}"}}')
        return int(m.get(key, 0))




_RLCONFIG_LINE = re.compile(r"^(.+?): unit=(\w+) requests_per_unit=(\d+),")


def rlconfig_rules(text: str, domain: str) -> dict[str, tuple[str, int]]:
    """The rules of `domain` in the service's debug /rlconfig dump:
    {"<domain>.generic_key_per_hour.tenant_tenant-b": ("HOUR", 100), ...}
    (an unlimited rule shows as ("UNKNOWN", 0))."""
    out: dict[str, tuple[str, int]] = {}
    for line in text.splitlines():
        m = _RLCONFIG_LINE.match(line.strip())
        if m and m.group(1).startswith(f"{domain}."):
            out[m.group(1)] = (m.group(2), int(m.group(3)))
    return out

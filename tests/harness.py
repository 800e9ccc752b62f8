"""Integration harness: real Redis, real envoyproxy/ratelimit (or the
project's own ratelimit-counter), real Envoy.

Every process is started here with subprocess.Popen in its own session (so a
shell exiting never signals it), logged to a file in a per-test directory,
probed for readiness by polling its health endpoint against a deadline, and
stopped here by PID (process group) when the test ends.

Used by tests/conftest.py (pytest fixtures) and e2e/demo.py.

    stack = Stack(workdir)
    fleet = stack.fleet(limits, domain="internal-api", envoys=2)
    results = run_sequential(fleet.urls, 1000, tenant="tenant-a")
    tally(results)            # Counter({200: 100, 429: 900})
    stack.close()

The rate-limit service a Stack starts is envoyproxy/ratelimit, or with
`pytest --service counter` (TRL_SERVICE=counter) ratelimit-counter on the
same Redis: `Stack.generate` then writes the filter's configuration for it
(`generate --service counter`) and `Stack.ratelimit` starts it
(tests/counter.py) from the team files themselves.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import requests

if TYPE_CHECKING:
    import counter  # tests/counter.py, which imports this module

REPO = Path(__file__).resolve().parent.parent


def _tool(env: str, default: str) -> Path:
    return Path(os.environ.get(env) or REPO / default)


ENVOY_BIN = _tool("TRL_ENVOY", ".deps/bin/envoy")
RATELIMIT_BIN = _tool("TRL_RATELIMIT", ".deps/bin/ratelimit")
REDIS_BIN = _tool("TRL_REDIS", ".deps/bin/redis-server")
WASM = _tool("TRL_WASM", "target/wasm32-wasip1/release/tenant_ratelimit.wasm")
CLI = _tool("TRL_CLI", "target/release/ratelimit-config")
COUNTER_BIN = _tool("TRL_COUNTER", "target/counter/ratelimit-counter")
ENVOY_TEMPLATE = REPO / "envoy" / "envoy.yaml.tmpl"
UPSTREAM_TEMPLATE = REPO / "envoy" / "upstream.yaml.tmpl"

LOOPBACK = "127.0.0.1"
STARTUP_DEADLINE_S = 30.0
STOP_DEADLINE_S = 10.0
STATS_FLUSH_S = 0.2  # the ratelimit service's STATS_FLUSH_INTERVAL
POLL_INTERVAL_S = 0.05

TENANT_HEADER = "x-tenant-id"
# gRPC timeout for tests that count admissions exactly. The product default
# (20 ms) is right for production, but on a loaded 2-core machine a call can
# take longer, and the filter then rightly fails open: one more 200, counted
# in failure_mode_allowed. Tests of fail-open itself set their own timeout.
COUNTING_TIMEOUT_MS = 1000

# The rate-limit service a Stack starts (tests/conftest.py sets it from
# `pytest --service`): "envoy-ratelimit" (envoyproxy/ratelimit) or "counter".
SERVICES = ("envoy-ratelimit", "counter")
SERVICE = os.environ.get("TRL_SERVICE") or "envoy-ratelimit"


class HarnessError(RuntimeError):
    pass


class StartupError(HarnessError):
    """A process exited, or never became ready, while starting."""

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        self.exit_code = exit_code


def missing_binaries() -> list[str]:
    """Binaries the integration tests need that are not there (run `make deps build`)."""
    return [
        str(p)
        for p in (ENVOY_BIN, RATELIMIT_BIN, REDIS_BIN, WASM, CLI,
                  *([COUNTER_BIN] if SERVICE == "counter" else []))
        if not (p.exists() and os.access(p, os.R_OK))
    ]


def unique(prefix: str) -> str:
    """A tenant value (or domain) no other test and no earlier run has used."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# ------------------------------------------------------------------ ports

class PortAllocator:
    """Free loopback ports: bind to port 0 and read it back.

    Ports already handed out in this process are never handed out twice, so
    two components of one stack cannot collide between allocation and bind.
    """

    _lock = threading.Lock()
    _given: set[int] = set()

    @classmethod
    def take(cls) -> int:
        with cls._lock:
            for _ in range(100):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((LOOPBACK, 0))
                    port = s.getsockname()[1]
                if port not in cls._given:
                    cls._given.add(port)
                    return port
        raise HarnessError("no free port")


free_port = PortAllocator.take


# ------------------------------------------------------------------ polling

def wait_until(
    probe: Callable[[], bool],
    what: str,
    deadline_s: float = STARTUP_DEADLINE_S,
    process: "Process | None" = None,
) -> None:
    """Poll `probe` until it returns true; fail if `process` exits or time runs out."""
    end = time.monotonic() + deadline_s
    last_error: Exception | None = None
    while True:
        if process is not None and not process.alive():
            raise StartupError(
                f"{what}: {process.name} exited with code {process.returncode} "
                f"before it was ready\n{process.tail()}",
                exit_code=process.returncode,
            )
        try:
            if probe():
                return
        except Exception as e:  # connection refused while it starts, etc.
            last_error = e
        if time.monotonic() > end:
            detail = f" (last error: {last_error})" if last_error else ""
            tail = f"\n{process.tail()}" if process is not None else ""
            raise StartupError(f"{what}: not ready after {deadline_s:.0f}s{detail}{tail}")
        time.sleep(POLL_INTERVAL_S)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    return requests.get(url, timeout=timeout).status_code == 200


# ------------------------------------------------------------------ processes

class Process:
    """One child process in its own session, logging to `log_path`."""

    def __init__(self, name: str, argv: list[str], log_path: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self._log.write(f"### {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,  # own process group; no controlling terminal
        )
        self.pid = self.popen.pid
        self.frozen = False

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def _signal_group(self, sig: int) -> None:
        # Only while the child has not been reaped: its PID (= its process
        # group id, start_new_session) cannot have been reused before that.
        if self.popen.poll() is None:
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> int | None:
        """SIGKILL, as a crash: no shutdown work (a Redis master then hands
        nothing more to its replicas). Waits until it is reaped."""
        self._signal_group(signal.SIGKILL)
        try:
            self.popen.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            pass
        return self.popen.returncode

    def freeze(self) -> None:
        """SIGSTOP: the process keeps its sockets (connects still succeed) but never answers."""
        self._signal_group(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        self._signal_group(signal.SIGCONT)
        self.frozen = False

    def stop(self, deadline_s: float = STOP_DEADLINE_S) -> int | None:
        if self.popen.poll() is None:
            self._signal_group(signal.SIGCONT)  # a stopped process would not act on SIGTERM
            self._signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout=deadline_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.popen.wait(timeout=deadline_s)
        self.frozen = False
        if not self._log.closed:
            self._log.close()
        return self.popen.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 40) -> str:
        text = self.log_text().splitlines()[-lines:]
        state = "running" if self.alive() else f"exited {self.returncode}"
        head = f"----- {self.name} (pid {self.pid}, {state}) {self.log_path} -----"
        return "\n".join([head, *text])


# ------------------------------------------------------------------ redis

class RespError(HarnessError):
    pass


# What the project ships for Redis (e2e/demo.py, and what README "Failure
# behaviour" tells deployments to set): an append-only file written on every
# command and fsynced once a second, so a restarted Redis (or a killed one:
# the file is written before the reply goes out, only fsync waits) comes back
# with its counters, and a crashed host loses at most the last second.
# No RDB snapshots: the AOF is the record.
REDIS_PERSISTENCE_ARGS = ["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
REDIS_NO_PERSISTENCE_ARGS = ["--appendonly", "no", "--save", ""]


class Redis:
    """redis-server on a loopback port, and a minimal RESP client for it.

    `persist=True` runs it with the shipped persistence settings
    (REDIS_PERSISTENCE_ARGS), its files in its own directory under the
    stack's workdir; `kill()`/`stop()` and `start()` restart it on the same
    port and directory, as a supervisor would. `password`: it requires one
    (requirepass), and the client here sends it.
    """

    def __init__(self, stack: "Stack", persist: bool = False, password: str | None = None):
        self.stack = stack
        self.port = free_port()
        self.persist = persist
        self.password = password
        self.dir = stack.workdir / f"redis-{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.process: Process | None = None
        self.start()

    def start(self) -> None:
        """Start (or restart, on the same port and directory) and wait for PING."""
        if self.process is not None and self.process.alive():
            raise HarnessError("redis already running")
        persistence = REDIS_PERSISTENCE_ARGS if self.persist else REDIS_NO_PERSISTENCE_ARGS
        self.process = self.stack.spawn(
            "redis",
            [REDIS_BIN, "--bind", LOOPBACK, "--port", self.port, "--dir", self.dir,
             *persistence, "--daemonize", "no", "--loglevel", "notice",
             *(["--requirepass", self.password] if self.password else [])],
        )
        wait_until(lambda: self.command("PING") == "PONG", "redis PING", process=self.process)

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a crash would: no shutdown, no final save."""
        if self.process is not None:
            self.process._signal_group(signal.SIGKILL)
            self.process.stop()

    def stop(self) -> None:
        """SIGTERM: Redis's own shutdown (which flushes the AOF when persisting)."""
        if self.process is not None:
            self.process.stop()

    def freeze(self) -> None:
        if self.process is not None:
            self.process.freeze()

    def thaw(self) -> None:
        if self.process is not None:
            self.process.thaw()

    def command(self, *args: str | int, timeout: float = 2.0):
        commands = [("AUTH", self.password)] if getattr(self, "password", None) else []
        commands.append(args)
        payload = []
        for c in commands:
            payload.append(f"*{len(c)}\r\n".encode())
            for a in c:
                b = str(a).encode()
                payload.append(b"$%d\r\n%s\r\n" % (len(b), b))
        with socket.create_connection((LOOPBACK, self.port), timeout=timeout) as s:
            s.sendall(b"".join(payload))
            f = s.makefile("rb")
            if len(commands) == 2:
                _read_resp(f)
            return _read_resp(f)

    def keys(self, pattern: str = "*") -> list[str]:
        return sorted(self.command("KEYS", pattern))

    def get_int(self, key: str) -> int | None:
        value = self.command("GET", key)
        return None if value is None else int(value)

    def ttl(self, key: str) -> int:
        return int(self.command("TTL", key))


def _read_resp(f):
    line = f.readline()
    if not line:
        raise RespError("connection closed")
    kind, rest = line[:1], line[1:].rstrip(b"\r\n")
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RespError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)[:n]
        return data.decode(errors="replace")
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_resp(f) for _ in range(n)]
    raise RespError(f"unexpected RESP reply {line!r}")


# ------------------------------------------------------------------ ratelimit service

# The service's Redis settings the project ships. REDIS_TIMEOUT is the only
# Redis timeout envoyproxy/ratelimit has, and it bounds only the dial (its
# default is 10 s): a call waits for a pooled connection with no deadline
# (README "Known issues"), so a dead Redis costs each call the filter's
# timeout_ms whatever this is. 1 s keeps a reconnect to a blackholed
# address from tying up the pool for 10 s.
RATELIMIT_REDIS_ENV = {"REDIS_TIMEOUT": "1s"}


class RateLimitService:
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
            **({"REDIS_URL": f"{LOOPBACK}:{self.redis.port}"} if self.redis is not None else {}),
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

    def freeze(self) -> None:
        assert self.process is not None
        self.process.freeze()

    def thaw(self) -> None:
        assert self.process is not None
        self.process.thaw()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def parse_stats(text: str) -> dict[str, int]:
    """`name: value` lines (Envoy admin /stats, ratelimit debug /stats) → {name: int}.

    Histograms and other non-integer values are left out.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if not sep:
            continue
        value = value.strip()
        if re.fullmatch(r"-?\d+", value):
            out[name.strip()] = int(value)
    return out


Labels = tuple[tuple[str, str], ...]
_TYPED_TOTAL_COUNTER = re.compile(r"^# TYPE (\S+_total) counter\s*$", re.M)


def prometheus_series(text: str, prefix: str = "",
                      types: Iterable[str] | None = None) -> dict[tuple[str, Labels], float]:
    """A Prometheus text exposition, read by prometheus-client's parser (the
    real one: a malformed exposition raises), as {(name, sorted label
    pairs): value}, for the families whose name starts with `prefix` and
    whose type is one of `types` (all if None).

    Every sample is keyed by the name the exposition wrote: the parser
    renames a counter's samples to the OpenMetrics `<family>_total` (and
    drops `_total` from a family named so), and that is undone here.
    """
    from prometheus_client.parser import text_string_to_metric_families

    counters_named_total = set(_TYPED_TOTAL_COUNTER.findall(text))
    wanted = None if types is None else set(types)
    out: dict[tuple[str, Labels], float] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(prefix) or (wanted is not None and family.type not in wanted):
            continue
        for sample in family.samples:
            name = sample.name
            if family.type == "counter":
                if name != family.name + "_total":
                    raise HarnessError(f"counter {family.name}: sample {name} {sample.labels}")
                if name not in counters_named_total:
                    name = family.name
            out[(name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text format → {`name{k="v",...}` (labels sorted): value}."""
    out: dict[str, float] = {}
    for (name, labels), value in prometheus_series(text).items():
        if labels:
            name += "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"
        out[name] = value
    return out


def scrape_prometheus(admin_url: str, prefix: str = "",
                      types: Iterable[str] | None = None) -> dict[tuple[str, Labels], float]:
    """An Envoy admin's /stats/prometheus, as prometheus_series reads it."""
    text = requests.get(f"{admin_url}/stats/prometheus", timeout=5).text
    return prometheus_series(text, prefix, types)


# ------------------------------------------------------------------ config generation

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


# ------------------------------------------------------------------ envoy

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


class Envoy:
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

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.listen_port}/"

    @property
    def admin_url(self) -> str:
        return f"http://{LOOPBACK}:{self.admin_port}"

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
            # `wasm.tenant_ratelimit.vm_reload*` are Envoy's own stats of the VM.
            if name.startswith("wasm."):
                continue
            _, sep, suffix = name.partition("tenant_ratelimit.")
            if sep:
                out[suffix] = out.get(suffix, 0) + value
        return out

    def stop(self) -> None:
        self.process.stop()


# ------------------------------------------------------------------ stack

class EnvoysView:
    """What every fleet of filter Envoys offers (a fleet sets `generated` and `envoys`)."""

    generated: Generated
    envoys: list[Envoy]

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.envoys]

    @property
    def domain(self) -> str:
        return self.generated.domain

    def counters(self) -> Counter:
        """The filter counters summed over every Envoy of the fleet."""
        total: Counter = Counter()
        for e in self.envoys:
            total.update(e.filter_counters())
        return total


@dataclass
class Fleet(EnvoysView):
    """Redis + ratelimit + upstream + N filter Envoys for one generated config."""

    generated: Generated
    redis: Redis
    ratelimit: "RateLimitService | counter.Counter"
    upstream: Envoy
    envoys: list[Envoy]



class Stack:
    """Owns every process a test (or the demo) starts, and stops them all in `close()`."""

    def __init__(self, workdir: Path, service: str | None = None):
        self.workdir = Path(workdir)
        self.service = service or SERVICE
        if self.service not in SERVICES:
            raise HarnessError(f"service {self.service!r}: not one of {SERVICES}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.processes: list[Process] = []
        self._names: Counter = Counter()

    # -- lifecycle
    def spawn(self, name: str, argv: list, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> Process:
        self._names[name] += 1
        label = name if self._names[name] == 1 else f"{name}-{self._names[name]}"
        log = self.workdir / "logs" / f"{label}.log"
        p = Process(label, argv, log, env=env, cwd=cwd or self.workdir)
        self.processes.append(p)
        return p

    def close(self) -> None:
        errors = []
        for p in reversed(self.processes):
            try:
                p.stop()
            except Exception as e:  # keep stopping the others
                errors.append(f"{p.name}: {e}")
        if errors:
            raise HarnessError("stopping processes: " + "; ".join(errors))

    def __enter__(self) -> "Stack":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def log_tails(self, lines: int = 40) -> str:
        return "\n\n".join(p.tail(lines) for p in self.processes)

    # -- components
    def redis(self, persist: bool = False, password: str | None = None) -> Redis:
        return Redis(self, persist=persist, password=password)

    def ratelimit(self, redis: Redis, *generated: Generated | Path,
                  log_level: str | None = None,
                  extra_env: dict[str, str] | None = None,
                  response_headers: bool = False) -> "RateLimitService | counter.Counter":
        """`extra_env`: more service settings, e.g. LOCAL_CACHE_SIZE_IN_BYTES.
        `response_headers`: the service adds RateLimit-Limit, -Remaining and
        -Reset to its answers (`response_headers_to_add`).

        With the counter (`self.service`): ratelimit-counter, counting in
        `redis` (or at extra_env's REDIS_URL, the one setting of
        envoyproxy/ratelimit's it has: its store), for the generated team
        files; it has none of the other settings."""
        if self.service == "counter":
            return self._counter(redis, generated, log_level, extra_env, response_headers)
        if response_headers:
            extra_env = {**(extra_env or {}), "LIMIT_RESPONSE_HEADERS_ENABLED": "true"}
        files = [g.ratelimit_yaml if isinstance(g, Generated) else Path(g) for g in generated]
        return RateLimitService(self, redis, files, log_level=log_level, extra_env=extra_env)

    def _counter(self, redis: Redis | None, generated, log_level, extra_env,
                 response_headers) -> "counter.Counter":
        import counter  # tests/counter.py imports this module

        env = dict(extra_env or {})
        address = env.pop("REDIS_URL", None)
        if address is None and redis is not None:
            address = f"{LOOPBACK}:{redis.port}"
        if env or log_level or response_headers or address is None:
            raise HarnessError("the counter takes a Redis and the generated team files only: "
                               f"{env}, log_level={log_level}, response_headers={response_headers}")
        if not all(isinstance(g, Generated) for g in generated):
            raise HarnessError("the counter reads team files: pass what Stack.generate wrote")
        # Redis's deadline no shorter than the filter's in the counting tests
        # (envoyproxy/ratelimit has none): on this loaded machine the
        # product's 100 ms could fail a call the filter would still wait for.
        return counter.Counter(self, {g.domain: g.limits for g in generated},
                               store=f"redis://{address}",
                               store_timeout_ms=COUNTING_TIMEOUT_MS)

    def upstream(self) -> Envoy:
        listen, admin = free_port(), free_port()
        text = render_upstream_config(listen_port=listen, admin_port=admin)
        return Envoy(self, "upstream", text, listen, admin, concurrency=1)

    def envoy(self, plugin_config: dict | str, rls: "RateLimitService | counter.Counter | int",
              upstream: Envoy | int, name: str = "envoy", wait: bool = True,
              concurrency: int = 2, access_log_path: Path | str = "/dev/stdout",
              rls_cluster: str | None = None,
              edit: Callable[[str], str] | None = None) -> Envoy:
        """A filter Envoy (render_envoy_config): `plugin_config` a dict or
        its raw text; `rls_cluster` the name Envoy gives the service's
        cluster, if not the one the configuration names; `edit` changes the
        rendered bootstrap before Envoy reads it (more endpoints, remote code)."""
        listen, admin = free_port(), free_port()
        rls_port = rls if isinstance(rls, int) else rls.grpc_port
        up_port = upstream.listen_port if isinstance(upstream, Envoy) else upstream
        text = render_envoy_config(plugin_config, listen_port=listen, admin_port=admin,
                                   rls_port=rls_port, upstream_port=up_port, node_id=name,
                                   access_log_path=access_log_path, rls_cluster=rls_cluster)
        if edit is not None:
            text = edit(text)
        return Envoy(self, name, text, listen, admin, concurrency=concurrency, wait=wait)

    def generate(self, limits: dict, domain: str | None = None, **kw) -> Generated:
        """`ratelimit-config generate`, for the stack's service."""
        domain = domain or unique("internal-api")
        if self.service == "counter":
            kw.setdefault("service", "counter")
        return generate(limits, self.workdir / "generated" / domain, domain, **kw)

    def fleet(self, limits: dict | Generated, envoys: int = 2, domain: str | None = None,
              timeout_ms: int | None = None, redis_persist: bool = False,
              **plugin_overrides) -> Fleet:
        """The whole stack for one team JSON (generated here, `--timeout-ms` if given).

        `redis_persist=True`: Redis with the shipped persistence settings."""
        if isinstance(limits, Generated):
            gen = limits
            if timeout_ms is not None:
                plugin_overrides["timeout_ms"] = timeout_ms
        else:
            gen = self.generate(limits, domain, timeout_ms=timeout_ms)
        redis = self.redis(persist=redis_persist)
        rls = self.ratelimit(redis, gen)
        upstream = self.upstream()
        cfg = gen.plugin_config(**plugin_overrides)
        members = [self.envoy(cfg, rls, upstream, name=f"envoy-{i + 1}") for i in range(envoys)]
        return Fleet(gen, redis, rls, upstream, members)


# ------------------------------------------------------------------ traffic

@dataclass
class Result:
    status: int  # 0: no HTTP response at all (connection error, client timeout)
    latency_s: float
    headers: dict[str, str] = field(default_factory=dict)
    target: int = 0  # index of the URL the request went to
    started: float = 0.0  # time.time() when it was sent
    error: str = ""


_local = threading.local()


def _session() -> requests.Session:
    s = getattr(_local, "session", None)
    if s is None:
        s = requests.Session()
        _local.session = s
    return s


def send(url: str, tenant: str | None = None, headers: dict | None = None,
         timeout: float = 10.0, target: int = 0) -> Result:
    """One GET; never raises for transport errors (status 0 then)."""
    h = dict(headers or {})
    if tenant is not None:
        h[TENANT_HEADER] = tenant
    started = time.time()
    t0 = time.perf_counter()
    try:
        r = _session().get(url, headers=h, timeout=timeout)
        r.content  # read the body: the latency covers the whole response
        return Result(r.status_code, time.perf_counter() - t0,
                      {k.lower(): v for k, v in r.headers.items()}, target, started)
    except requests.RequestException as e:
        _local.session = None
        return Result(0, time.perf_counter() - t0, {}, target, started, repr(e))


def run_sequential(urls: list[str], n: int, tenant: str | None = None,
                   headers: dict | None = None) -> list[Result]:
    """n requests one after another, round-robin over `urls` (one client)."""
    return [send(urls[i % len(urls)], tenant, headers, target=i % len(urls)) for i in range(n)]


def run_concurrent(urls: list[str], n: int, clients: int, tenant: str | None = None,
                   headers: dict | None = None) -> list[Result]:
    """n requests from `clients` threads at once, round-robin over `urls`."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=clients) as pool:
        futures = [pool.submit(send, urls[i % len(urls)], tenant, headers, 10.0, i % len(urls))
                   for i in range(n)]
        return [f.result() for f in futures]


def tally(results: Iterable[Result]) -> Counter:
    return Counter(r.status for r in results)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def summary(results: list[Result]) -> str:
    """k6-like lines, one per status: `status 200 ............ count=100   avg=3.15ms  p99=8.21ms`."""
    by_status: dict[int, list[float]] = {}
    for r in results:
        by_status.setdefault(r.status, []).append(r.latency_s * 1000)
    lines = []
    for status in sorted(by_status):
        lat = by_status[status]
        label = f"status {status}" if status else "no response"
        lines.append(f"  {label} {'.' * 12} count={len(lat):<5} "
                     f"avg={sum(lat) / len(lat):.2f}ms  p99={percentile(lat, 99):.2f}ms")
    return "\n".join(lines)


# ------------------------------------------------------------------ windows

UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def window_start(unit_s: int, t: float | None = None) -> int:
    """The ratelimit service's window start: floor(now / unit) * unit."""
    t = time.time() if t is None else t
    return int(t // unit_s) * unit_s


def window_left(unit_s: int, t: float | None = None) -> float:
    t = time.time() if t is None else t
    return unit_s - (t % unit_s)


def ensure_window_room(unit_s: int, need_s: float) -> float:
    """Wait out the current window if less than `need_s` of it remains.

    Returns how long it waited. Not a readiness check: windows are clock
    aligned, so this is the only way to keep a run inside one window.
    """
    if need_s >= unit_s:
        raise HarnessError(f"a {unit_s}s window can never have {need_s}s left")
    left = window_left(unit_s)
    if left >= need_s:
        return 0.0
    time.sleep(left + 0.02)
    return left + 0.02


def wait_next_second(margin_s: float = 0.01) -> None:
    """Sleep into the first hundredth of the next wall-clock second."""
    time.sleep(window_left(1) + margin_s)


def answered_at(r: "Result") -> float:
    """time.time() when the response had come back."""
    return r.started + r.latency_s


def seconds_crossed(first: "Result", last: "Result") -> int:
    """Whole-second boundaries between `first` being sent and `last` being answered.

    A server reads its clock somewhere inside each request's span, not when
    the client sent it, so whole-second readings (a reset, Retry-After, a
    Date) of two requests sent one after the other differ by 0 up to this
    many seconds: two requests sent in the same second can be told apart by
    one when the second one's answer came in the next.
    """
    return int(answered_at(last)) - int(first.started)


def in_one_second(burst: Callable[[], list["Result"]], attempts: int = 5,
                  what: str = "burst") -> list["Result"]:
    """`burst()` run from the start of a wall-clock second until one run was
    sent and answered inside that one second (a run that straddles a second
    boundary meets two per-second windows); its results. `burst` should use
    a fresh tenant each time: a failed attempt has counted."""
    for _ in range(attempts):
        wait_next_second()
        results = burst()
        if results and int(min(r.started for r in results)) == int(max(map(answered_at, results))):
            return results
    raise HarnessError(f"no {what} fit in one wall-clock second in {attempts} tries")


def redis_key(domain: str, unit: str, tenant: str, t: float | None = None,
              descriptor_key: str = "tenant") -> str:
    """The key envoyproxy/ratelimit builds for one of our descriptors."""
    secs = UNIT_SECONDS[unit]
    return f"{domain}_generic_key_per_{unit}_{descriptor_key}_{tenant}_{window_start(secs, t)}"


def counter_key(domain: str, unit: str, tenant: str, t: float | None = None) -> str:
    """The key ratelimit-counter builds for a tenant's fixed window (docs/counter.md)."""
    secs = UNIT_SECONDS[unit]
    return f"trl:{{{len(domain)}:{domain}:{tenant}}}:per_{unit}:{window_start(secs, t) * 1000}"


# ------------------------------------------------------------------ x-ratelimit-* headers

@dataclass
class RateLimitHeaders:
    limit: int  # the limit of the tightest descriptor
    windows: list[tuple[int, int]]  # (limit, window seconds), one per descriptor
    remaining: int
    reset: int
    retry_after: int | None
    # Each window's `name="..."` (the service's name for the rule), or None.
    names: list[str | None] = field(default_factory=list)

    @property
    def tightest_window(self) -> int | None:
        """The window of the descriptor the first number belongs to, when unambiguous."""
        matching = [w for (lim, w) in self.windows if lim == self.limit]
        return matching[0] if len(matching) == 1 else None


_QUOTA = re.compile(r'^\s*(\d+)\s*;\s*w\s*=\s*(\d+)\s*(?:;\s*name\s*=\s*"([^"]*)"\s*)?$')


def parse_ratelimit_headers(headers: dict[str, str]) -> RateLimitHeaders:
    """Parse DRAFT_VERSION_03 headers; raise ValueError with the header text if malformed."""
    raw = headers.get("x-ratelimit-limit")
    if raw is None:
        raise ValueError(f"no x-ratelimit-limit in {headers}")
    parts = [p.strip() for p in raw.split(",")]
    if not parts or not parts[0].isdigit():
        raise ValueError(f"x-ratelimit-limit {raw!r}: first item is not the limit")
    windows, names = [], []
    for p in parts[1:]:
        m = _QUOTA.match(p)
        if not m:
            raise ValueError(
                f'x-ratelimit-limit {raw!r}: {p!r} is not <limit>;w=<secs>[;name="<name>"]')
        windows.append((int(m.group(1)), int(m.group(2))))
        names.append(m.group(3))
    if not windows:
        raise ValueError(f"x-ratelimit-limit {raw!r}: no <limit>;w=<secs> item")

    def integer(name: str) -> int:
        v = headers.get(name)
        if v is None or not re.fullmatch(r"\d+", v.strip()):
            raise ValueError(f"{name} {v!r} is not a non-negative integer")
        return int(v)

    retry = headers.get("retry-after")
    return RateLimitHeaders(
        limit=int(parts[0]),
        windows=windows,
        remaining=integer("x-ratelimit-remaining"),
        reset=integer("x-ratelimit-reset"),
        retry_after=integer("retry-after") if retry is not None else None,
        names=names,
    )


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

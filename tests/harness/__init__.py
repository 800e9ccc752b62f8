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

The modules, by subject (every public name is also importable from
`harness` itself):

    base       binaries, templates, loopback, deadlines, the service, errors
    processes  free ports, polling for readiness, one child process
    redis      redis-server and a RESP client
    services   envoyproxy/ratelimit and its /rlconfig
    metrics    Envoy and service stats, Prometheus expositions
    config     ratelimit-config generate and render, their files
    envoy      Envoy bootstraps rendered, one Envoy process
    stack      Stack, Fleet: every process of a test
    load       requests sent and counted
    windows    clock-aligned windows and the keys counted in them
    headers    x-ratelimit-* response headers parsed
    toxiproxy  Toxiproxy: a TCP proxy that adds latency or cuts a link
    regions    two regions of a global limit and their rebalancer (imported
               as `harness.regions`, not from `harness`: it needs
               tests/counter.py)
"""

from __future__ import annotations

from .base import (CLI, COUNTER_BIN, COUNTING_TIMEOUT_MS, ENVOY_BIN, ENVOY_TEMPLATE, LOOPBACK,
                   POLL_INTERVAL_S, RATELIMIT_BIN, REDIS_BIN, REPO, SERVICE, SERVICES,
                   STARTUP_DEADLINE_S, STATS_FLUSH_S, STOP_DEADLINE_S, TENANT_HEADER,
                   UPSTREAM_TEMPLATE, WASM, HarnessError, StartupError, missing_binaries,
                   selected_service, tool, unique)
from .config import OUT_MANIFEST, Generated, find, generate, render_target, run_cli
from .envoy import (NATIVE_TEMPLATE, Envoy, EnvoyPorts, bootstrap_access_log, envoy_argv, native_rate_limits,
                    render, render_envoy_config, render_native_envoy_config,
                    render_upstream_config)
from .headers import RateLimitHeaders, parse_ratelimit_headers
from .load import (RawResponse, Result, percentile, raw_get, run_concurrent, run_sequential,
                   send, summary, tally)
from .metrics import STATS_FLUSHES, Labels, parse_prometheus, parse_stats, prometheus_series, scrape_prometheus, wait_flushed
from .processes import PortAllocator, Process, Supervised, free_port, http_ok, wait_until
from .redis import REDIS_NO_PERSISTENCE_ARGS, REDIS_PERSISTENCE_ARGS, Redis, RespError, read_resp, resp_command
from .services import RATELIMIT_REDIS_ENV, RateLimitService, rlconfig_rules
from .stack import EnvoysView, Fleet, Stack
from .toxiproxy import TOXIPROXY_BIN, ToxiProxy, Toxiproxy
from .windows import (UNIT_SECONDS, answered_at, counter_key, ensure_window_room, in_one_second,
                      redis_key, seconds_crossed, wait_next_second, window_left, window_start)

# The name tool() had while the harness was one file.
_tool = tool

__all__ = [
    "CLI", "COUNTER_BIN", "COUNTING_TIMEOUT_MS", "ENVOY_BIN", "ENVOY_TEMPLATE", "LOOPBACK",
    "NATIVE_TEMPLATE", "OUT_MANIFEST", "POLL_INTERVAL_S", "RATELIMIT_BIN", "RATELIMIT_REDIS_ENV",
    "REDIS_BIN", "REDIS_NO_PERSISTENCE_ARGS", "REDIS_PERSISTENCE_ARGS", "REPO", "SERVICE",
    "SERVICES", "STARTUP_DEADLINE_S", "STATS_FLUSH_S", "STATS_FLUSHES", "STOP_DEADLINE_S", "TENANT_HEADER",
    "UNIT_SECONDS", "UPSTREAM_TEMPLATE", "WASM",
    "Envoy", "EnvoyPorts", "EnvoysView", "Fleet", "Generated", "HarnessError", "Labels", "PortAllocator",
    "Process", "RateLimitHeaders", "RawResponse", "RateLimitService", "Redis", "RespError", "Result", "Stack",
    "StartupError", "Supervised",
    "answered_at", "bootstrap_access_log", "counter_key", "ensure_window_room", "envoy_argv",
    "find", "free_port", "generate", "http_ok", "in_one_second", "missing_binaries", "native_rate_limits",
    "parse_prometheus", "parse_ratelimit_headers", "parse_stats", "percentile",
    "prometheus_series", "read_resp", "redis_key", "render", "render_envoy_config", "resp_command",
    "render_native_envoy_config", "render_target", "render_upstream_config", "raw_get", "rlconfig_rules",
    "run_cli", "run_concurrent", "run_sequential", "scrape_prometheus", "seconds_crossed",
    "wait_flushed",
    "selected_service", "send", "summary", "tally", "tool", "unique", "wait_next_second",
    "wait_until", "window_left", "window_start",
    "TOXIPROXY_BIN", "ToxiProxy", "Toxiproxy",
]

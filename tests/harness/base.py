"""What every part of the harness shares: where the binaries and templates
are, the loopback address, deadlines, the rate-limit service chosen, errors."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def tool(env: str, default: str) -> Path:
    """A binary's path: `$env` if set, else `default` under the repository."""
    return Path(os.environ.get(env) or REPO / default)


ENVOY_BIN = tool("TRL_ENVOY", ".deps/bin/envoy")
RATELIMIT_BIN = tool("TRL_RATELIMIT", ".deps/bin/ratelimit")
REDIS_BIN = tool("TRL_REDIS", ".deps/bin/redis-server")
WASM = tool("TRL_WASM", "target/wasm32-wasip1/release/tenant_ratelimit.wasm")
CLI = tool("TRL_CLI", "target/release/ratelimit-config")
COUNTER_BIN = tool("TRL_COUNTER", "target/counter/ratelimit-counter")
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


def selected_service() -> str:
    """`harness.SERVICE`, read when asked: tests/conftest.py sets it on the
    package (`harness.SERVICE = ...`) after this module was loaded."""
    return getattr(sys.modules[__package__], "SERVICE", SERVICE)


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
                  *([COUNTER_BIN] if selected_service() == "counter" else []))
        if not (p.exists() and os.access(p, os.R_OK))
    ]


def unique(prefix: str) -> str:
    """A tenant value (or domain) no other test and no earlier run has used."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"

"""The rate-limit services `make bench` measures, behind one interface:
envoyproxy/ratelimit and ratelimit-counter (`make build`:
target/counter/ratelimit-counter), each with its calls, its process (CPU
time, /proc/<pid>/stat) and a way to freeze it (the outage scenario).

The counter is started as the integration tests start it (tests/counter.py:
on loopback, reading the bench's team file from a directory, one
`<domain>.json`), without the tests' movable clock (a file read on every
call, a cost the product does not have), with the product's reload
interval.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import counter as tc  # noqa: E402
import harness as h  # noqa: E402

RLS_CALLS = 'ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}'
COUNTER_CALLS = "trl_counter_calls_total"
COUNTER_BIN = tc.COUNTER_BIN
# The counter's deadline for one call's store work: under the filters' 1 s
# call timeout, so that a slow Redis is answered UNAVAILABLE, not a timeout.
COUNTER_STORE_TIMEOUT_MS = 500
# The counter's default: how often the team files are checked for changes.
COUNTER_RELOAD_MS = 1000
# The Redis commands that count: envoyproxy/ratelimit's INCRBY and EXPIRE
# (pipelined per descriptor), the counter's one script call per slot.
DATA_COMMANDS = ("incrby", "expire", "evalsha", "eval")
# The commands the counter's script runs inside Redis (counter/src/store.rs).
# INFO commandstats counts them as it counts those a client sends: what the
# counter sends is the rest (EVALSHA, a SCRIPT LOAD, PING).
COUNTER_SCRIPT_COMMANDS = ("get", "mget", "set", "incrby", "pexpire")


class BenchCounter(tc.Counter):
    """tests/counter.py's Counter without the tests' clock file."""

    def start(self, wait_ready: bool = True) -> None:
        self.env.pop("TRL_COUNTER_TEST_CLOCK_FILE", None)
        super().start(wait_ready)


def start_counter(stack: h.Stack, domain: str, limits: dict, store: str, name: str,
                  env: dict[str, str] | None = None,
                  extra_args: list[str] | None = None) -> BenchCounter:
    """A counter serving `domain` from the team JSON `limits`; `store`:
    memory, redis://..., rediss://..., redis-cluster://...; `extra_args`:
    more flags (TLS)."""
    return BenchCounter(stack, {domain: limits}, store=store, name=name, env=env,
                        extra_args=extra_args,
                        store_timeout_ms=COUNTER_STORE_TIMEOUT_MS,
                        reload_interval_ms=COUNTER_RELOAD_MS)


def redis_store(redis: h.Redis) -> str:
    return redis.url


def generate_for_counter(stack: h.Stack, limits: dict, domain: str,
                         timeout_ms: int) -> h.Generated:
    """`ratelimit-config generate --service counter` of the same team JSON:
    the plugin configuration the filter needs to call the counter
    (rate_limit_service.service "counter"); its envoy-rate-limits.yaml is
    what Envoy's own filter sends the counter."""
    out = stack.workdir / "generated" / f"{domain}-counter"
    out.mkdir(parents=True, exist_ok=True)
    team = out / "limits.json"
    team.write_text(json.dumps(limits, indent=2))
    h.run_cli("generate", team, "--domain", domain, "--out", out, "--service", "counter",
              "--timeout-ms", str(timeout_ms))
    gen = h.Generated(limits, domain, out, out / "ratelimit.yaml", out / "plugin-config.json")
    service = gen.plugin_config().get("rate_limit_service", {}).get("service")
    if service != "counter":
        raise h.HarnessError(f"generate --service counter wrote service {service!r}")
    return gen


class Service:
    """One rate-limit service as the bench reads it: `kind` "ratelimit"
    (envoyproxy/ratelimit) or "counter"."""

    def __init__(self, kind: str, handle: h.RateLimitService | BenchCounter):
        self.kind = kind
        self.handle = handle

    @property
    def pid(self) -> int:
        return self.handle.process.pid

    @property
    def grpc_port(self) -> int:
        return self.handle.grpc_port

    def metrics(self) -> dict[str, float]:
        """Its metrics, once they count every call answered (the service's
        sink flushes every STATS_FLUSH_S; the counter's are read live)."""
        if self.kind == "counter":
            return self.handle.metrics()
        return self.handle.settled_metrics()

    def calls(self, metrics: dict[str, float]) -> float:
        """ShouldRateLimit calls in `metrics` (its own counter)."""
        return metrics.get(COUNTER_CALLS if self.kind == "counter" else RLS_CALLS, 0)

    def freeze(self) -> None:
        self.handle.process.freeze()

    def thaw(self) -> None:
        self.handle.process.thaw()


def sent_commands(commands: dict[str, int], kind: str) -> dict[str, int]:
    """The commands of `commands` (INFO commandstats deltas over a run of
    one service, `kind`) that the service sent, without those the counter's
    script ran inside Redis."""
    if kind != "counter":
        return dict(commands)
    return {k: v for k, v in commands.items() if k not in COUNTER_SCRIPT_COMMANDS}


def data_commands(commands: dict[str, int], kind: str) -> int:
    """The commands that count (DATA_COMMANDS) the service `kind` sent, of
    `commands` (INFO commandstats deltas)."""
    return sum(v for k, v in sent_commands(commands, kind).items() if k in DATA_COMMANDS)

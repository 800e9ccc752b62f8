#!/usr/bin/env python3
"""`make bench`: this filter measured side by side with Envoy's own
rate-limit filters, on one stack, in one run.

One Redis, one envoyproxy/ratelimit (its over-limit cache
LOCAL_CACHE_SIZE_IN_BYTES on), one upstream Envoy answering 200 itself, and
five Envoys under test, all started here on loopback and all running for
the whole benchmark:

  baseline      no rate-limit filter at all
  wasm_noop     this filter loaded, configured for a header no request
                carries: the cost of Envoy's wasm machinery alone, the
                ceiling of any wasm filter (not in the pinned and outage
                scenarios by default: it limits nothing and calls nothing)
  native        envoy.filters.http.local_ratelimit (a token bucket per tenant
                at its group's per-second limit) + envoy.filters.http.ratelimit
                with the rate_limits block ratelimit-config generates
  filter        this filter, with the plugin configuration ratelimit-config
                generates (local layer on, its defaults: mode "exact")
  filter_lease  the same with local.mode "lease"
  filter_sync   the same with local.mode "sync"
  filter_local  the same with on_failure "local" (fallback.envoys 1): only
                the outage scenario runs it
  wasm_reply    bench/wasm-reply: a minimal proxy-wasm module answering every
                request 429 from on_request_headers, the floor of any wasm
                refusal; the local_shed and hot scenarios only, unless
                --configs names it
  filter_logged this filter (mode "exact") with the refusal access log of
                envoy/envoy.yaml.tmpl, as shipped (to /dev/null): the log's
                cost per refusal is its difference to `filter`; the
                local_shed and hot scenarios only, unless --configs names it

--exact-batch off,1,4,16 adds, in the allowed scenario only, this filter
in mode "exact" once per batching setting: `filter_batch_off`
(rate_limit_service.batch false: one request per call) and
`filter_batch_<n>` (batch.max_in_flight n: fewer calls under way, more
requests per call). report.py fits Envoy's CPU per request against calls
per request over them: what one call costs Envoy, and what more requests
per call cost in latency (p50, p99 against native).

Like with like: no configuration under test logs its refusals. The
template's refusal access log (a JSON line per refusal behind a CEL filter
evaluated on every request) is taken out of every Envoy rendered from it
(`without_refusal_log`), as Envoy's native filters log nothing; the log's
own cost is the `filter_logged` row.

and the same against ratelimit-counter (target/counter/ratelimit-counter,
`make build`), which reads the bench's team file itself, on the same Redis
(or its memory store); by default in the allowed scenario (and the first
two in the hot one) only, unless --configs names them:

  native_counter               native, the counter as the service (Envoy's
                               rate_limits block is the same: `generate
                               --service counter` writes the same)
  filter_exact_counter         filter, with the plugin configuration
                               `generate --service counter` writes
                               (rate_limit_service.service "counter")
  filter_exact_counter_memory  the same, the counter's memory store
  filter_lease_counter         filter_lease against the counter
  filter_sync_counter          filter_sync against the counter

The outage scenario freezes the service (SIGSTOP) for each of its runs:
Envoy's native filters wait for their timeout on every request; this
filter's breaker opens after a few failed calls and answers at once, with
on_failure "allow" (filter) or each tenant's share (filter_local).

All use the same team file (bench/limits.json, plus the bench's own tenants:
see quota_limits), the same domain, the same rate-limit service
(envoyproxy/ratelimit; the counter for the configurations above that name
it), the same rate-limit call timeout (1 s) and the same upstream. For
every scenario the configurations run in turn, A B C A B C ..., each run a
fixed number of connections for a fixed time, driven by wrk
(bench/tenants.lua picks the tenant of every request).

Per run: the CPU seconds (utime + stime, /proc/<pid>/stat) of the Envoy
under test (the pinned scenario: its fleet), its service
(envoyproxy/ratelimit or the counter), Redis, the counting upstream and
wrk (its processes, waited for: this process's RUSAGE_CHILDREN over the
run); Redis's INFO commandstats over the run
(envoyproxy/ratelimit's INCRBY and EXPIRE, the counter's EVALSHA); the
rate-limit calls each Envoy made (its own rate-limit cluster's
upstream_rq_total: the native filter and this filter both call through
it), fail-opens (the native filter's ratelimit.failure_mode_allowed, this
filter's failure_mode_allowed), and, in the quota scenarios, every tracked
tenant's requests sent and admitted per second (bench/tenants.lua), from
which report.py derives admitted requests per quota window.

The quota scenarios give every configuration tenants of its own
("burst-filter_sync", "hot-native", ...), so that their windows' counters in
the one service never mix. The pinned scenario runs each limiting
configuration as a fleet of PINNED_FLEET Envoys: one tenant's traffic all on
the first (long-lived connections to one Envoy), another tenant on the
others, both with the same per-minute quota.

Results: bench-results/<time>/results.json (every run, raw), table.md and
chart.png; bench-results/latest points at the newest.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import counters  # noqa: E402
import flood  # noqa: E402
import harness as h  # noqa: E402
import report  # noqa: E402
import service_side  # noqa: E402

# bench/faults.py, the faults scenario (tests/faults.py comes first on sys.path).
_spec = importlib.util.spec_from_file_location("bench_faults", REPO / "bench" / "faults.py")
faults = sys.modules["bench_faults"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(faults)

LIMITS_FILE = REPO / "bench" / "limits.json"
WRK_SCRIPT = REPO / "bench" / "tenants.lua"
CONFIGS = ("baseline", "wasm_noop", "native", "native_counter", "filter",
           "filter_exact_counter", "filter_exact_counter_memory", "filter_lease",
           "filter_lease_counter", "filter_sync", "filter_sync_counter", "filter_local",
           "wasm_reply", "filter_logged")
# The configurations whose service is ratelimit-counter: (the Envoy they
# are: "native" or this filter's local.mode, the counter's store).
COUNTER_CONFIGS = {
    "native_counter": ("native", "redis"),
    "filter_exact_counter": ("exact", "redis"),
    "filter_exact_counter_memory": ("exact", "memory"),
    "filter_lease_counter": ("lease", "redis"),
    "filter_sync_counter": ("sync", "redis"),
}
# The configurations that limit nothing: no quota figures for them.
NON_LIMITING = ("baseline", "wasm_noop", "wasm_reply")
# Without --configs, these run in these scenarios only: wasm_noop limits and
# calls nothing (the pinned scenario is about a quota across a fleet, the
# outage one about the service), wasm_reply refuses everything (the floor of
# the local shed). Named in --configs, they run wherever the others do.
DEFAULT_SCENARIOS = {"wasm_noop": ("allowed", "hot", "local_shed", "mixed"),
                     # The floor of a refusal: wherever nearly every request
                     # is refused.
                     "wasm_reply": ("local_shed", "hot"),
                     # The refusal log's cost: where refusals are.
                     "filter_logged": ("local_shed", "hot"),
                     # The counter: its cost on the allowed path (every
                     # store, every mode), and in the hot scenario what it
                     # admits per window when refused requests count nowhere.
                     "native_counter": ("allowed", "hot"),
                     "filter_exact_counter": ("allowed", "hot"),
                     "filter_exact_counter_memory": ("allowed",),
                     "filter_lease_counter": ("allowed",),
                     "filter_sync_counter": ("allowed",)}
# bench/wasm-reply, built by `make bench` (and here when missing).
WASM_REPLY_CRATE = REPO / "bench" / "wasm-reply"
WASM_REPLY_TARGET_DIR = REPO / "target" / "wasm-reply"
WASM_REPLY = WASM_REPLY_TARGET_DIR / "wasm32-wasip1" / "release" / "wasm_reply.wasm"
# The outage scenario runs these only, and no other scenario runs
# filter_local (the same as filter while the service answers).
OUTAGE_CONFIGS = ("native", "filter", "filter_local")
# This filter's configurations that differ from `filter` only in local.mode.
MODE_CONFIGS = {"filter_lease": "lease", "filter_sync": "sync"}
# The pinned scenario: Envoys per configuration, and the quota of its group
# (the seed's mid-sized tenant: 6,000 requests per minute).
PINNED_FLEET = 3
PINNED_QUOTA = 6000
# Background load of the pinned scenario, per other Envoy of the fleet.
PINNED_BACKGROUND_CONNECTIONS = 2
# The flood run (--flood): tests/test_flood.py runs 100,000 in `make test`.
FLOOD_TENANTS = 1_000_000
FLOOD_SLOTS = 65_536
# For profiling, on request (--configs): where this filter's cost comes from.
EXTRA_CONFIGS = {
    # This filter without its local layer: every request goes to the service.
    "filter_no_local": "this filter with local.enabled false",
    # Another build of this filter (--alt-wasm), e.g. before a change.
    "filter_alt": "this filter, built from --alt-wasm",
}
# --exact-batch: this filter, mode exact, with one batching setting each.
BATCH_PREFIX = "filter_batch_"


def batch_setting(cfg: str) -> bool | int | None:
    """A --exact-batch configuration's `rate_limit_service.batch`: False
    (off) or its max_in_flight; None for any other configuration."""
    if not cfg.startswith(BATCH_PREFIX):
        return None
    value = cfg[len(BATCH_PREFIX):]
    if value == "off":
        return False
    if value.isdigit() and 1 <= int(value) <= 64:
        return int(value)
    return None


TIMEOUT_MS = 1000  # both filters: the native template's `timeout: 1s`
RLS_CACHE_BYTES = 64 * 1024 * 1024
# Envoy stats kept per run (deltas): status classes, the native filters' own
# counters, this filter's counters.
ENVOY_STATS = re.compile(
    r"^(http\.ingress\.downstream_rq_[1-5]xx"
    r"|cluster\.upstream\.ratelimit\..*"
    r"|cluster\.[a-z_-]+\.upstream_rq_(total|timeout)"
    r"|tenant_local\.http_local_rate_limit\..*"
    r"|.*tenant_ratelimit\.(?!vm)[a-z_]+)$")


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    # After `-- <header>`: see bench/tenants.lua. "{cfg}" becomes the
    # configuration's name: its tenants of its own.
    wrk_args: tuple[str, ...]
    # Tenants whose admitted requests per window are reported ("{cfg}" as above).
    tracked: tuple[str, ...] = ()
    # The units whose windows are reported, e.g. ("second",).
    quota_units: tuple[str, ...] = ()
    # Runs against the first Envoy of a fleet of PINNED_FLEET per configuration.
    pinned: bool = False
    # The service frozen (SIGSTOP) during each run.
    outage: bool = False

    def args_for(self, cfg: str) -> tuple[str, ...]:
        return tuple(a.format(cfg=cfg) for a in self.wrk_args)

    def tracked_for(self, cfg: str) -> list[str]:
        if cfg in NON_LIMITING:  # nothing limits it
            return []
        return [t.format(cfg=cfg) for t in self.tracked]


SCENARIOS = (
    Scenario("allowed", "Allowed path: 1,000 tenants, all under their limits",
             ("uniform", "a", "1000")),
    Scenario("hot", "Hot tenant: one tenant far over its quota (20/min, 100/h)",
             ("single", "hot-{cfg}"), ("hot-{cfg}",), ("minute", "hour")),
    Scenario("local_shed", "Local shed: one tenant bursting far beyond 100/s",
             ("single", "burst-{cfg}"), ("burst-{cfg}",), ("second",)),
    Scenario("mixed", "Mixed: 1,000 tenants, Zipf s=1.0, the busiest few over 100/s",
             ("zipf", "m-{cfg}-", "1000", "1.0"),
             ("m-{cfg}-0000", "m-{cfg}-0001", "m-{cfg}-0002"), ("second",)),
    Scenario("pinned", f"Pinned tenant: one tenant (quota per minute) on 1 of {PINNED_FLEET} "
             "Envoys, another on the other two",
             ("single", "pinned-{cfg}"), ("pinned-{cfg}",), ("minute",), pinned=True),
    Scenario("outage", "Outage: 1,000 tenants while the rate-limit service is frozen",
             ("uniform", "o-{cfg}-", "1000"), outage=True),
)
# The pinned scenario's other tenant: on every Envoy of the fleet but the first.
SPREAD_TENANT = "spread-{cfg}"


def quota_limits(limits: dict, configs: list[str], pinned_quota: int) -> dict:
    """bench/limits.json plus the bench's per-configuration tenants: each
    configuration's hot tenant in the "hot" group, and a "pinned" group (a
    per-minute quota only) for the pinned scenario's two tenants."""
    (header, groups), = limits.items()
    groups = json.loads(json.dumps(groups))
    hot = groups["hot"]["header_value"]
    hot += [f"hot-{c}" for c in configs if f"hot-{c}" not in hot]
    pinned = [t.format(cfg=c) for c in configs for t in ("pinned-{cfg}", SPREAD_TENANT)]
    if pinned:  # none when only the service-side scenario runs
        groups["pinned"] = {"perminute": pinned_quota, "header_value": pinned}
    return {header: groups}


# ------------------------------------------------------------------ configs

_RL_FILTER = re.compile(r"^( *)- name: envoy\.filters\.http\.ratelimit\n", re.M)
_ROUTER = re.compile(r"^ *- name: envoy\.filters\.http\.router\n", re.M)


def local_ratelimit_filter(limits: dict, indent: str, max_dynamic: int) -> str:
    """Envoy's local_ratelimit with a token bucket per tenant at the tenant's
    group per-second limit (burst = rate), as this filter's local layer has
    by default: a wildcard descriptor (one bucket per tenant value) for the
    default group, an exact one per listed tenant of a named group (exact
    descriptors win over wildcards in Envoy). A group with no per-second
    limit gets an exact descriptor with an unreachable bucket, so that its
    tenants do not fall into the default group's wildcard."""
    (header, groups), = limits.items()
    unlimited = 1_000_000_000

    def bucket(rate: int | None) -> str:
        if rate is None:
            return (f"{{ max_tokens: {unlimited}, tokens_per_fill: {unlimited}, "
                    "fill_interval: 1s }")
        if rate % 10 == 0:  # refill every 100 ms: close to a continuous refill
            return f"{{ max_tokens: {rate}, tokens_per_fill: {rate // 10}, fill_interval: 0.1s }}"
        return f"{{ max_tokens: {rate}, tokens_per_fill: {rate}, fill_interval: 1s }}"

    def descriptor(tenant: str, rate: int | None) -> list[str]:
        return [
            "- entries:",
            "  - { key: generic_key, value: per_second }",
            f"  - {{ key: tenant, value: {json.dumps(tenant)} }}",
            f"  token_bucket: {bucket(rate)}",
        ]

    descriptors: list[str] = []
    for name, group in groups.items():
        if name == "default":
            if "persecond" in group:
                descriptors += descriptor("", group["persecond"])
            continue
        for tenant in group["header_value"]:
            descriptors += descriptor(tenant, group.get("persecond"))
    enabled = "{ runtime_key: %s, default_value: { numerator: 100, denominator: HUNDRED } }"
    lines = [
        "- name: envoy.filters.http.local_ratelimit",
        "  typed_config:",
        '    "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit',
        "    stat_prefix: tenant_local",
        f"    filter_enabled: {enabled % 'local_rate_limit_enabled'}",
        f"    filter_enforced: {enabled % 'local_rate_limit_enforced'}",
        # No tenant header: no descriptor, and the default bucket never limits.
        f"    token_bucket: {bucket(None)}",
        "    always_consume_default_token_bucket: false",
        f"    max_dynamic_descriptors: {max_dynamic}",
        "    rate_limits:",
        "    - actions:",
        "      - generic_key: { descriptor_value: per_second }",
        f"      - request_headers: {{ header_name: {header}, descriptor_key: tenant }}",
        "    descriptors:",
        *("    " + d for d in descriptors),
    ]
    return "".join(indent + line + "\n" for line in lines)


_ACCESS_LOG = re.compile(r"^( *)access_log:\n(?:\1(?:- |  ).*\n)*", re.M)


def without_refusal_log(text: str) -> str:
    """An Envoy bootstrap rendered from envoy/envoy.yaml.tmpl without its
    connection manager's access log (the refusal log): every configuration
    under test then logs its refusals the same way, not at all, as the
    native ones."""
    found = _ACCESS_LOG.findall(text)
    if len(found) != 1:
        raise h.HarnessError(f"filter template: {len(found)} access_log blocks, expected 1")
    return _ACCESS_LOG.sub("", text)


def native_config(gen: h.Generated, max_dynamic: int, **ports) -> str:
    """The native bootstrap (envoy/native-ratelimit.yaml.tmpl with the generated
    rate_limits), local_ratelimit inserted before the ratelimit filter."""
    text = h.render_native_envoy_config(h.native_rate_limits(gen).read_text(), gen.domain,
                                        node_id="native", **ports)
    m = _RL_FILTER.search(text)
    if not m:
        raise h.HarnessError("native template: no envoy.filters.http.ratelimit entry")
    local = local_ratelimit_filter(gen.limits, m.group(1), max_dynamic)
    return text[:m.start()] + local + text[m.start():]


def baseline_config(gen: h.Generated, **ports) -> str:
    """The same bootstrap with no rate-limit filter: only the router."""
    text = h.render_native_envoy_config("", gen.domain, node_id="baseline", **ports)
    start, end = _RL_FILTER.search(text), _ROUTER.search(text)
    if not start or not end:
        raise h.HarnessError("native template: ratelimit or router filter entry missing")
    return text[:start.start()] + text[end.start():]


_HCM_STAT_PREFIX = re.compile(r"^( *)stat_prefix: upstream\n", re.M)


def counting_upstream(stack: h.Stack, header: str, tenants: list[str],
                      log_path: Path) -> h.Envoy:
    """The shared upstream (envoy/upstream.yaml.tmpl), answering every
    request 200 as it does in the tests, and writing one access-log line
    "<second> <tenant>" for every request of a tracked tenant: only
    admitted requests reach it, so this counts them where they arrive,
    including those wrk was still waiting for when its run ended. Flushed
    every 100 ms (--file-flush-interval-msec)."""
    listen, admin = h.free_port(), h.free_port()
    text = h.render_upstream_config(listen_port=listen, admin_port=admin)
    m = _HCM_STAT_PREFIX.search(text)
    if not m:
        raise h.HarnessError("upstream template: no `stat_prefix: upstream` line")
    ind = m.group(1)
    # One exact match per tenant (a regex of them all exceeds RE2's default
    # program size); an or_filter needs two at least.
    exact = [f"      - header_filter: {{ header: {{ name: {header}, "
             f"string_match: {{ exact: {json.dumps(t)} }} }} }}"
             for t in (tenants or ["\x00"]) * (1 if len(tenants) > 1 else 2)]
    lines = [
        "access_log:",
        "- name: envoy.access_loggers.file",
        "  filter:",
        "    or_filter:",
        "      filters:",
        *exact,
        "  typed_config:",
        '    "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog',
        f"    path: {json.dumps(str(log_path))}",
        "    log_format:",
        "      text_format_source:",
        f'        inline_string: "%START_TIME(%s)% %REQ({header})%\\n"',
    ]
    text = text[:m.end()] + "".join(ind + ln + "\n" for ln in lines) + text[m.end():]
    return h.Envoy(stack, "upstream", text, listen, admin, concurrency=1,
                   extra_args=["--file-flush-interval-msec", "100"])


def admitted_per_second(log_path: Path, deadline_s: float = 5.0) -> dict[str, dict[str, int]]:
    """The upstream's access log (counting_upstream) as tenant -> second ->
    requests, once the file has stopped growing (it is flushed every 100 ms)."""
    end = time.monotonic() + deadline_s
    size = -1
    while time.monotonic() < end:
        current = log_path.stat().st_size if log_path.exists() else 0
        if current == size:
            break
        size = current
        time.sleep(0.5)
    out: dict[str, dict[str, int]] = {}
    if not log_path.exists():
        return out
    with log_path.open() as f:
        for line in f:
            sec, _, tenant = line.strip().partition(" ")
            if tenant:
                per = out.setdefault(tenant, {})
                per[sec] = per.get(sec, 0) + 1
    return out


# ------------------------------------------------------------------ running

def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        mem_gib = round(kb / 1024 / 1024, 1)
    except (OSError, AttributeError):
        pass

    def first_line(argv: list[str]) -> str:
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
            return (p.stdout or p.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            return "unknown"

    envoy = first_line([str(h.ENVOY_BIN), "--version"])
    m = re.search(r"/(\d+\.\d+\.\d+)/", envoy)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "kernel": platform.release(),
        "envoy": m.group(1) if m else envoy,
        "wrk": first_line(["wrk", "-v"]).split(" [")[0],
    }


def wrk_start(url: str, wrk_args: tuple[str, ...], header: str, threads: int,
              connections: int, duration_s: int,
              track: list[str] | None = None) -> tuple[subprocess.Popen, list[str]]:
    """Start wrk; `track`: tenants whose requests are counted per second
    (TRL_WRK_TRACK, bench/tenants.lua)."""
    argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration_s}s", "--latency",
            "--timeout", "5s", "-s", str(WRK_SCRIPT), url, "--", header, *wrk_args]
    env = dict(os.environ, TRL_WRK_TRACK=",".join(track or ()))
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, stdin=subprocess.DEVNULL)
    return p, argv


def wrk_finish(started: tuple[subprocess.Popen, list[str]], duration_s: int) -> dict:
    p, argv = started
    try:
        stdout, stderr = p.communicate(timeout=duration_s + 60)
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, stderr = p.communicate()
    line = next((ln for ln in stdout.splitlines() if ln.startswith("TRL-WRK ")), None)
    if p.returncode != 0 or line is None:
        raise h.HarnessError(f"wrk failed ({p.returncode}): {' '.join(argv)}\n"
                             f"{stdout}\n{stderr}")
    return json.loads(line[len("TRL-WRK "):])


def wrk(url: str, scenario: Scenario, header: str, threads: int, connections: int,
        duration_s: int, cfg: str = "filter", track: list[str] | None = None) -> dict:
    return wrk_finish(wrk_start(url, scenario.args_for(cfg), header, threads, connections,
                                duration_s, track), duration_s)


def envoy_stats(e: h.Envoy) -> dict[str, int]:
    return {k: v for k, v in e.stats().items() if ENVOY_STATS.match(k)}


def delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def rls_calls(e: h.Envoy, cluster: str) -> int:
    """The rate-limit calls this Envoy made: its rate-limit cluster's
    upstream_rq_total (one HTTP/2 stream per ShouldRateLimit call, whichever
    filter makes it)."""
    return e.stats(rf"^cluster\.{re.escape(cluster)}\.upstream_rq_total$").get(
        f"cluster.{cluster}.upstream_rq_total", 0)


def settled_calls(e: h.Envoy, cluster: str, deadline_s: float = 3.0) -> int:
    """rls_calls once two reads 0.25 s apart agree: a lease refill or a sync
    push still in flight when the load stops belongs to the run."""
    end = time.monotonic() + deadline_s
    previous = rls_calls(e, cluster)
    while time.monotonic() < end:
        time.sleep(0.25)
        current = rls_calls(e, cluster)
        if current == previous:
            break
        previous = current
    return previous


CLK_TCK = os.sysconf("SC_CLK_TCK")
# The components whose CPU time each run records (cpu_s), in the table's order.
CPU_COMPONENTS = ("envoy", "service", "redis", "upstream", "wrk")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) and of its children it
    waited for (cutime + cstime), in seconds; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / CLK_TCK


def children_cpu_seconds() -> float:
    """CPU time of this process's children that ended and were waited for:
    during a run, only its wrk processes."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cpu_snapshot(fleet: list[h.Envoy], service: counters.Service,
                 parts: dict) -> dict[str, float]:
    return {
        "envoy": sum(cpu_seconds(e.process.pid) for e in fleet),
        "service": cpu_seconds(service.pid),
        "redis": cpu_seconds(parts["redis"].process.pid),
        "upstream": cpu_seconds(parts["upstream"].process.pid),
        "wrk": children_cpu_seconds(),
    }


def redis_commands(redis: h.Redis) -> dict[str, int]:
    """{command: calls} from INFO commandstats, without the INFO calls
    this script makes to read it."""
    out: dict[str, int] = {}
    for line in str(redis.command("INFO", "commandstats")).splitlines():
        k, sep, v = line.partition(":")
        m = re.match(r"calls=(\d+)", v)
        if sep and k.startswith("cmdstat_") and m and k != "cmdstat_info":
            out[k[len("cmdstat_"):]] = int(m.group(1))
    return out


def service_hits(metrics: dict[str, float]) -> float:
    """The service's total_hits summed over its rules: every descriptor
    that matched a rule, counted by its hits_addend."""
    return sum(v for k, v in metrics.items()
               if k.startswith("ratelimit_service_rate_limit_total_hits{"))


def descriptors_sent(stats: dict[str, int]) -> int:
    """This filter's descriptors sent to the service (its counter
    tenant_ratelimit.rls_descriptors) in a run's Envoy stat deltas."""
    return sum(v for k, v in stats.items() if k.endswith("tenant_ratelimit.rls_descriptors"))


def failures(stats: dict[str, int]) -> tuple[int, int]:
    """(fail-opens, rate-limit call errors) in a run's Envoy stat deltas: the
    native filter's cluster.<route cluster>.ratelimit.failure_mode_allowed and
    .error, this filter's tenant_ratelimit.failure_mode_allowed and .rls_error."""
    opened = errors = 0
    for k, v in stats.items():
        if k.endswith(".ratelimit.failure_mode_allowed") or k.endswith(
                "tenant_ratelimit.failure_mode_allowed"):
            opened += v
        elif k.endswith(".ratelimit.error") or k.endswith("tenant_ratelimit.rls_error"):
            errors += v
    return opened, errors


def add_windows(into: dict, windows: dict) -> None:
    """Sum a wrk run's per-second counts (tenant -> "sent" -> second)."""
    for tenant, kinds in windows.items():
        t = into.setdefault(tenant, {"sent": {}})
        for kind, per in kinds.items():
            for sec, n in per.items():
                t[kind][sec] = t[kind].get(sec, 0) + n


def run_once(stack_parts: dict, cfg: str, scenario: Scenario, rep: int, args,
             windows: dict | None = None, intervals: list | None = None,
             duration_s: int | None = None) -> dict:
    """One run of one configuration; its per-second counts go into `windows`
    and its [start, end] into `intervals`. With duration_s (the warm-up) it
    returns the run without printing it."""
    # The configuration's service: envoyproxy/ratelimit, or a counter.
    rls: counters.Service = stack_parts["services"][cfg]
    cluster: str = stack_parts["rls_cluster"]
    fleet: list[h.Envoy] = stack_parts["fleets"][cfg] if scenario.pinned else [stack_parts[cfg]]
    envoy = fleet[0]
    duration = duration_s or args.duration
    header = stack_parts["header"]
    metrics0 = rls.metrics()
    service0, hits0 = rls.calls(metrics0), service_hits(metrics0)
    calls0 = rls_calls(envoy, cluster)
    stats0 = [envoy_stats(e) for e in fleet]
    redis: h.Redis = stack_parts["redis"]
    commands0 = redis_commands(redis)
    track = scenario.tracked_for(cfg)
    if args.smoke and scenario.pinned:
        # The smoke test asserts the pinned tenant's whole minute window: keep
        # its one short run inside one window.
        h.ensure_window_room(60, duration + 5)
    background = []
    if scenario.pinned:
        spread = SPREAD_TENANT.format(cfg=cfg)
        background = [wrk_start(e.url, ("single", spread), header, 1,
                                PINNED_BACKGROUND_CONNECTIONS, duration, [spread])
                      for e in fleet[1:]]
    if scenario.outage:
        rls.freeze()
    cpu0 = cpu_snapshot(fleet, rls, stack_parts)
    t0 = time.time()
    try:
        result = wrk(envoy.url, scenario, header, args.threads, args.connections, duration,
                     cfg=cfg, track=track)
    finally:
        if scenario.outage:
            rls.thaw()
    t1 = time.time()
    spread_results = [wrk_finish(b, duration) for b in background]
    cpu1 = cpu_snapshot(fleet, rls, stack_parts)
    calls = settled_calls(envoy, cluster) - calls0
    metrics1 = rls.metrics()
    service_calls = rls.calls(metrics1) - service0
    hits = service_hits(metrics1) - hits0
    commands = delta(redis_commands(redis), commands0)
    if windows is not None:
        add_windows(windows, result.get("windows", {}))
        for r in spread_results:
            add_windows(windows, r.get("windows", {}))
    if intervals is not None:
        intervals.append([t0, t1])
    n = result["requests"]
    secs = result["duration_us"] / 1e6
    fleet_stats = [delta(envoy_stats(e), before) for e, before in zip(fleet, stats0)]
    stats = fleet_stats[0]
    # Fail-opens and errors over the whole fleet (the pinned scenario's too).
    failed_open = sum(failures(st)[0] for st in fleet_stats)
    rls_errors = sum(failures(st)[1] for st in fleet_stats)
    descriptors = descriptors_sent(stats)
    # Every request the measured processes served: the pinned scenario's
    # background load too.
    served = n + sum(r["requests"] for r in spread_results)
    run = {
        "scenario": scenario.name,
        "config": cfg,
        "rep": rep,
        "requests": n,
        "duration_s": secs,
        "rps": n / secs if secs else 0.0,
        "latency_ms": {k: v / 1000 for k, v in result["latency_us"].items()},
        "statuses": result["statuses"],
        "errors": result["errors"],
        # This Envoy's own calls (its rate-limit cluster), per request it answered.
        "rls_calls": int(calls),
        "rls_calls_per_request": calls / n if n else 0.0,
        # The service that answered: "ratelimit" (envoyproxy/ratelimit) or "counter".
        "service": rls.kind,
        # The service's own ShouldRateLimit counter over the run (every Envoy;
        # in the pinned scenario the background load's calls too).
        "service_calls": int(service_calls),
        # The hits the service counted on its rules (total_hits: each
        # descriptor's hits_addend, 1 for Envoy's native filter;
        # envoyproxy/ratelimit only).
        "service_hits": int(hits),
        # This filter's descriptors sent (this Envoy), per call it made.
        "rls_descriptors": descriptors,
        "descriptors_per_call": descriptors / calls if calls else 0.0,
        # Redis's commands over the run (INFO commandstats; every Envoy's
        # calls): envoyproxy/ratelimit's INCRBY and EXPIRE, the counter's
        # EVALSHA and the GET, INCRBY and PEXPIRE its script runs.
        "redis_commands": commands,
        # Of those, the commands the service sent (not its script's).
        "redis_commands_sent": counters.sent_commands(commands, rls.kind),
        # CPU seconds over the run: the Envoy under test (pinned: its fleet),
        # the service, Redis, the counting upstream, wrk (every wrk of the run).
        "cpu_s": {k: round(cpu1[k] - cpu0[k], 4) for k in CPU_COMPONENTS},
        # The requests those processes served (pinned: the background's too).
        "requests_served": served,
        "failed_open": failed_open,
        "rls_errors": rls_errors,
        "envoy_stats": stats,
    }
    if cfg == "wasm_reply" and (n == 0 or set(run["statuses"]) != {"429"}):
        # The floor of a refusal refuses everything, or it measures nothing.
        raise h.HarnessError(f"wasm_reply answered {run['statuses']} in {scenario.name}: "
                             "every request should get a 429")
    if spread_results:
        run["background"] = {
            "tenant": SPREAD_TENANT.format(cfg=cfg),
            "envoys": len(spread_results),
            "requests": sum(r["requests"] for r in spread_results),
            "statuses": {c: sum(r["statuses"].get(c, 0) for r in spread_results)
                         for r0 in spread_results for c in r0["statuses"]},
        }
    if duration_s is None:
        print(f"  {scenario.name:<10} {cfg:<12} rep {rep}: {run['rps']:>9.0f} req/s  "
              f"p50 {run['latency_ms']['p50']:.2f} ms  p99 {run['latency_ms']['p99']:.2f} ms  "
              f"statuses {run['statuses']}  calls/req {run['rls_calls_per_request']:.4f}  "
              f"fail-open {failed_open}  CPU µs/req "
              + " ".join(f"{k} {1e6 * v / served:.0f}" if served else f"{k} -"
                         for k, v in run["cpu_s"].items()), flush=True)
    return run


def build_wasm_reply() -> None:
    """bench/wasm-reply for wasm32-wasip1 (`make bench` builds it first;
    cargo does nothing when it is up to date)."""
    subprocess.run(["cargo", "build", "--quiet", "--release", "--target", "wasm32-wasip1",
                    "--manifest-path", str(WASM_REPLY_CRATE / "Cargo.toml"),
                    "--target-dir", str(WASM_REPLY_TARGET_DIR)],
                   check=True, stdin=subprocess.DEVNULL, timeout=600)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=10, help="seconds per run (10)")
    ap.add_argument("--reps", type=int, default=3, help="runs per configuration (3)")
    ap.add_argument("--warmup", type=int, default=3,
                    help="seconds of unrecorded load per configuration before a scenario (3)")
    ap.add_argument("--connections", type=int, default=32, help="wrk connections (32)")
    ap.add_argument("--threads", type=int, default=2, help="wrk threads (2)")
    ap.add_argument("--envoy-concurrency", type=int, default=2,
                    help="worker threads of each Envoy under test (2)")
    ap.add_argument("--configs",
                    help="comma-separated, in the order they take turns: "
                         + ", ".join((*CONFIGS, *EXTRA_CONFIGS))
                         + " (default: all but " + ", ".join(EXTRA_CONFIGS) + "; "
                         + "; ".join(f"{c} in {', '.join(s)} only"
                                     for c, s in DEFAULT_SCENARIOS.items()) + ")")
    ap.add_argument("--scenario-configs", action="append", default=[],
                    metavar="SCENARIO=CONFIG,...",
                    help="the configurations of one scenario, in place of those --configs "
                         "(or the default) gives it; repeatable, e.g. "
                         "--scenario-configs local_shed=native,wasm_reply,filter")
    ap.add_argument("--alt-wasm", type=Path,
                    help="the .wasm of the filter_alt configuration")
    ap.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS),
                    help="comma-separated subset of: " + ", ".join(s.name for s in SCENARIOS))
    ap.add_argument("--out", type=Path, default=REPO / "bench-results",
                    help="results go to OUT/<time>/ (bench-results)")
    ap.add_argument("--smoke", action="store_true",
                    help="one 1-second run per scenario and configuration, 2 connections: "
                         "checks the harness works, measures nothing")
    ap.add_argument("--service-side", choices=("on", "off", "only"),
                    help="the service-side scenario (bench/service_side.py: the allowed path "
                         "with 1 or 2 replicas of envoyproxy/ratelimit or of the counter, "
                         "one Redis or a Redis Cluster, and the counter's memory store): "
                         "on (default), off (default with --smoke), only")
    ap.add_argument("--service-side-configs", default=",".join(service_side.CONFIGS),
                    help="service-side scenario: comma-separated subset of "
                         + ", ".join(service_side.CONFIGS) + " (all)")
    ap.add_argument("--pin-service-cpu", type=int, metavar="CPU",
                    help="service-side scenario: pin every service replica to this CPU "
                         "(taskset) with GOMAXPROCS=1 (the counter: TOKIO_WORKER_THREADS=1)")
    ap.add_argument("--pinned-quota", type=int, default=PINNED_QUOTA, metavar="N",
                    help="the pinned scenario's quota per minute "
                         f"({PINNED_QUOTA:,}; --smoke: 50)")
    ap.add_argument("--exact-batch", default="", metavar="LIST",
                    help="comma-separated batching settings of mode exact, each a "
                         "configuration of its own in the allowed scenario: off (one "
                         "request per call) or a max_in_flight from 1 to 64, e.g. off,1,4,16 "
                         "(report.py: Envoy's CPU per call, latency per setting)")
    ap.add_argument("--flood", type=int, default=FLOOD_TENANTS, metavar="N",
                    help="after the scenarios, N distinct tenants through one Envoy on a "
                         "stack of their own (bench/flood.lua), Envoy's heap against the "
                         f"documented slot bound (docs/local-layer.md) ({FLOOD_TENANTS:,}; 0: skip; --smoke: 0)")
    faults.add_arguments(ap)
    args = ap.parse_args()
    if args.service_side is None:
        args.service_side = "off" if args.smoke else "on"
    if args.smoke:
        args.duration, args.reps, args.warmup = 1, 1, 0
        args.connections, args.threads = 2, 1
        args.flood = 0
        args.pinned_quota = 50
    chosen = [s for s in SCENARIOS if s.name in args.scenarios.split(",")]
    explicit = args.configs is not None
    configs = [c for c in (args.configs or ",".join(CONFIGS)).split(",") if c]
    # --scenario-configs: scenario -> its configurations (the others run
    # only where --configs or the default puts them).
    per_scenario: dict[str, list[str]] = {}
    for spec in args.scenario_configs:
        name, sep, cfgs = spec.partition("=")
        if not sep or name not in {sc.name for sc in SCENARIOS}:
            ap.error(f"--scenario-configs {spec!r}: SCENARIO=CONFIG,... with a scenario among "
                     + ", ".join(sc.name for sc in SCENARIOS))
        per_scenario[name] = [c for c in cfgs.split(",") if c]
    batches = [BATCH_PREFIX + b.strip() for b in args.exact_batch.split(",") if b.strip()]
    bad = [b for b in batches if batch_setting(b) is None]
    if bad:
        ap.error(f"--exact-batch: {bad}: each off or a max_in_flight from 1 to 64")
    configs += [b for b in batches if b not in configs]
    named = set(configs)
    configs += [c for cs in per_scenario.values() for c in cs if c not in configs]
    unknown = [c for c in configs if c not in CONFIGS and c not in EXTRA_CONFIGS
               and batch_setting(c) is None]
    if unknown or not configs:
        ap.error(f"unknown configuration(s) {unknown}")
    if "filter_alt" in configs and (args.alt_wasm is None or not args.alt_wasm.is_file()):
        ap.error("filter_alt needs --alt-wasm FILE")
    if not chosen:
        ap.error(f"no scenario among {args.scenarios!r}")
    side_configs = tuple(c for c in service_side.CONFIGS
                         if c in args.service_side_configs.split(","))
    side_unknown = set(args.service_side_configs.split(",")) - set(service_side.CONFIGS)
    if args.service_side != "off" and (side_unknown or not side_configs):
        ap.error(f"unknown service-side configuration(s) {sorted(side_unknown)}")
    if args.service_side == "only":
        chosen, configs = [], []
    if faults.settle(args):
        chosen, configs = [], []

    def runs_in(scenario: Scenario, cfg: str) -> bool:
        if scenario.name in per_scenario:
            return cfg in per_scenario[scenario.name]
        if batch_setting(cfg) is not None:  # the batching sweep: allowed only
            return scenario.name == "allowed" and cfg in named
        if cfg not in named:  # named by --scenario-configs only
            return False
        if not explicit and cfg in DEFAULT_SCENARIOS:
            return scenario.name in DEFAULT_SCENARIOS[cfg]
        if scenario.outage:
            return cfg in OUTAGE_CONFIGS
        # The pinned scenario is about a quota: no baseline fleet.
        return cfg != "filter_local" and not (scenario.pinned and cfg == "baseline")

    # A configuration no chosen scenario runs is not started.
    configs = [c for c in configs if any(runs_in(s, c) for s in chosen)]
    if shutil.which("wrk") is None:
        print("wrk not found: `make deps` installs it (Debian package wrk)", file=sys.stderr)
        return 1
    missing = h.missing_binaries()
    uses_counter = (any(c in COUNTER_CONFIGS for c in configs)
                    or (args.service_side != "off"
                        and any(c.startswith("cnt") for c in side_configs)))
    if uses_counter and not counters.COUNTER_BIN.exists():
        missing.append(str(counters.COUNTER_BIN))
    if missing:
        print("missing: " + ", ".join(missing) + " (run `make deps build`)", file=sys.stderr)
        return 1
    if "wasm_reply" in configs:
        build_wasm_reply()

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out / stamp
    out.mkdir(parents=True, exist_ok=True)
    limits = quota_limits(json.loads(LIMITS_FILE.read_text()), configs, args.pinned_quota)
    header = next(iter(limits))
    started = time.time()
    runs: list[dict] = []
    windows: dict[str, dict[str, dict]] = {}
    intervals: dict[str, dict[str, list]] = {}
    with h.Stack(out / "stack") as stack:
        gen = stack.generate(limits, domain="bench", timeout_ms=TIMEOUT_MS)
        plugin_cfg = gen.plugin_config()
        slots = plugin_cfg["local"]["slots"]
        redis = stack.redis()
        rls = stack.ratelimit(redis, gen, log_level="warn",
                              extra_env={"LOCAL_CACHE_SIZE_IN_BYTES": str(RLS_CACHE_BYTES)})
        # The counter, when a configuration calls it: one on the same Redis
        # (the configurations take turns), one with its memory store.
        stores = {COUNTER_CONFIGS[c][1] for c in configs if c in COUNTER_CONFIGS}
        counter_gen, counter_plugin_cfg = gen, {}
        counter_for: dict[str, counters.Service] = {}
        if stores:
            counter_gen = counters.generate_for_counter(stack, limits, gen.domain, TIMEOUT_MS)
            counter_plugin_cfg = counter_gen.plugin_config()
            for store in sorted(stores):
                url = "memory" if store == "memory" else counters.redis_store(redis)
                counter_for[store] = counters.Service("counter", counters.start_counter(
                    stack, gen.domain, limits, url, name=f"counter-{store}"))
        services = {c: counter_for[COUNTER_CONFIGS[c][1]] if c in COUNTER_CONFIGS
                    else counters.Service("ratelimit", rls) for c in configs}
        tracked = [t for sc in chosen for c in configs if runs_in(sc, c)
                   for t in (*sc.tracked_for(c), *([SPREAD_TENANT.format(cfg=c)]
                                                   if sc.pinned else []))]
        upstream_log = out / "stack" / "upstream-admitted.log"
        upstream = counting_upstream(stack, header, tracked, upstream_log)
        conc = args.envoy_concurrency

        def start(name: str, text: str, listen: int, admin: int) -> h.Envoy:
            return h.Envoy(stack, name, text, listen, admin, concurrency=conc)

        parts: dict = {"services": services, "redis": redis, "upstream": upstream,
                       "header": header, "fleets": {},
                       "rls_cluster": plugin_cfg["rate_limit_service"]["cluster"]}

        def envoy_for(cfg: str, name: str) -> h.Envoy:
            listen, admin = h.free_port(), h.free_port()
            ports = dict(listen_port=listen, admin_port=admin,
                         rls_port=services[cfg].grpc_port,
                         upstream_port=upstream.listen_port)
            if cfg in COUNTER_CONFIGS:
                kind = COUNTER_CONFIGS[cfg][0]
                if kind == "native":
                    text = native_config(counter_gen, max_dynamic=slots, **ports)
                else:
                    moded = dict(counter_plugin_cfg,
                                 local=dict(counter_plugin_cfg["local"], mode=kind))
                    text = h.render_envoy_config(moded, node_id=cfg, **ports)
            elif cfg == "baseline":
                text = baseline_config(gen, **ports)
            elif cfg == "native":
                text = native_config(gen, max_dynamic=slots, **ports)
            elif cfg == "wasm_noop":
                noop = dict(plugin_cfg, limits={"x-trl-bench-absent": limits[header]})
                text = h.render_envoy_config(noop, node_id=cfg, **ports)
            elif cfg == "wasm_reply":
                # The same template and plugin configuration (which it ignores).
                text = h.render_envoy_config(plugin_cfg, node_id=cfg, wasm_path=WASM_REPLY,
                                             **ports)
            elif cfg == "filter_no_local":
                no_local = dict(plugin_cfg, local=dict(plugin_cfg["local"], enabled=False))
                text = h.render_envoy_config(no_local, node_id=cfg, **ports)
            elif cfg == "filter_alt":
                text = h.render_envoy_config(plugin_cfg, node_id=cfg,
                                             wasm_path=args.alt_wasm.resolve(), **ports)
            elif cfg == "filter_local":
                local = dict(plugin_cfg, on_failure="local", fallback={"envoys": 1})
                text = h.render_envoy_config(local, node_id=cfg, **ports)
            elif cfg in MODE_CONFIGS:
                moded = dict(plugin_cfg, local=dict(plugin_cfg["local"], mode=MODE_CONFIGS[cfg]))
                text = h.render_envoy_config(moded, node_id=cfg, **ports)
            elif batch_setting(cfg) is not None:
                setting = batch_setting(cfg)
                service = dict(plugin_cfg["rate_limit_service"])
                batch = service.get("batch")
                service["batch"] = False if setting is False else dict(
                    batch if isinstance(batch, dict) else {}, max_in_flight=setting)
                text = h.render_envoy_config(dict(plugin_cfg, rate_limit_service=service),
                                             node_id=cfg, **ports)
            elif cfg == "filter_logged":
                # The one configuration that logs its refusals: the
                # template's access log as shipped, to /dev/null (its cost
                # in Envoy, without a disk's).
                text = h.render_envoy_config(plugin_cfg, node_id=cfg,
                                             access_log_path="/dev/null", **ports)
                return start(name, text, listen, admin)
            else:
                text = h.render_envoy_config(plugin_cfg, node_id="filter", **ports)
            if cfg not in ("baseline", "native", "native_counter"):
                # Rendered from envoy/envoy.yaml.tmpl: like with like.
                text = without_refusal_log(text)
            return start(name, text, listen, admin)

        for cfg in configs:
            parts[cfg] = envoy_for(cfg, cfg)
            if any(s.pinned and runs_in(s, cfg) for s in chosen):
                # The pinned scenario's fleet: this Envoy and copies of it.
                parts["fleets"][cfg] = [parts[cfg], *(
                    envoy_for(cfg, f"{cfg}-{i}") for i in range(2, PINNED_FLEET + 1))]

        for scenario in chosen:
            print(f"{scenario.title}", flush=True)
            cfgs = [c for c in configs if runs_in(scenario, c)]
            win = windows.setdefault(scenario.name, {})
            spans = intervals.setdefault(scenario.name, {})
            if args.warmup:
                for cfg in cfgs:
                    run_once(parts, cfg, scenario, 0, args, win.setdefault(cfg, {}),
                             spans.setdefault(cfg, []), duration_s=args.warmup)
            for rep in range(1, args.reps + 1):
                for cfg in cfgs:
                    runs.append(run_once(parts, cfg, scenario, rep, args,
                                         win.setdefault(cfg, {}), spans.setdefault(cfg, [])))

        # Admitted requests per second, as the upstream counted them.
        admitted = admitted_per_second(upstream_log)
        for per_cfg in windows.values():
            for per_tenant in per_cfg.values():
                for tenant, kinds in per_tenant.items():
                    kinds["admitted"] = admitted.get(tenant, {})

    flood_result = None
    if args.flood:
        print(f"flood: {args.flood:,} distinct tenants through one Envoy "
              f"({FLOOD_SLOTS:,} slots)", flush=True)
        with h.Stack(out / "flood-stack") as stack:
            flood_result = flood.run_flood(stack, args.flood, slots=FLOOD_SLOTS,
                                           threads=args.threads, connections=args.connections)
        f = flood_result
        f["within_bound"] = f["slots_bytes"] + f["heap_growth"] <= f["bound_bytes"]
        print(f"  {f['answered']:,} answered in {f['seconds']:.0f}s ({f['rps']:.0f} req/s), "
              f"statuses {f['statuses']}, wrk errors {f['wrk_errors']}; slots "
              f"{f['slots_bytes']:,} bytes, heap {f['heap_growth']:+,} bytes over the flood; "
              f"bound {f['bound_bytes']:,}: {'within' if f['within_bound'] else 'EXCEEDED'}",
              flush=True)

    results = {
        "started_utc": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(),
        "wall_s": round(time.time() - started, 1),
        "machine": machine(),
        "settings": {
            "duration_s": args.duration, "reps": args.reps, "warmup_s": args.warmup,
            "connections": args.connections, "wrk_threads": args.threads,
            "envoy_concurrency": args.envoy_concurrency, "timeout_ms": TIMEOUT_MS,
            "rls_local_cache_bytes": RLS_CACHE_BYTES, "filter_local_slots": slots,
            "smoke": args.smoke, "pinned_fleet": PINNED_FLEET,
            "pinned_quota_per_minute": args.pinned_quota,
            "pinned_background_connections": PINNED_BACKGROUND_CONNECTIONS,
            "modes": MODE_CONFIGS,
            "exact_batch": {c: batch_setting(c) for c in configs
                            if batch_setting(c) is not None},
            "counter_configs": {c: {"envoy": k, "store": st}
                                for c, (k, st) in COUNTER_CONFIGS.items() if c in configs},
            "counter_store_timeout_ms": counters.COUNTER_STORE_TIMEOUT_MS,
        },
        "limits": limits,
        "scenarios": {s.name: s.title for s in chosen},
        "configs": configs,
        # The configurations each scenario ran, in turn.
        "scenario_configs": {s.name: [c for c in configs if runs_in(s, c)] for s in chosen},
        "runs": runs,
        # Per scenario, configuration and tracked tenant: requests sent (wrk)
        # and admitted (the upstream's access log) per second, warm-ups
        # included, and the runs' [start, end].
        "quota": {s.name: {"units": list(s.quota_units),
                           "tracked": {c: s.tracked_for(c) for c in configs},
                           "spread": ({c: SPREAD_TENANT.format(cfg=c) for c in configs}
                                      if s.pinned else {})}
                  for s in chosen if s.quota_units},
        "windows": windows,
        "intervals": intervals,
        "flood": flood_result,
    }
    if args.service_side != "off":
        allowed = next(s for s in SCENARIOS if s.name == "allowed")
        results["service_side"] = service_side.run(args, out, wrk, allowed, header, limits,
                                                   side_configs)
        results["wall_s"] = round(time.time() - started, 1)
    if args.faults != "off":
        results["faults"] = faults.run(args, out, sys.modules[__name__])
        results["wall_s"] = round(time.time() - started, 1)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table = report.markdown(results) + faults.markdown(results.get("faults"))
    (out / "table.md").write_text(table)
    report.chart(results, out / "chart.png")
    latest = args.out / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(stamp)
    print()
    print(table)
    print(f"results: {out}/results.json, table.md, chart.png")
    if flood_result is not None and not flood_result["within_bound"]:
        print("flood: Envoy's heap exceeded the slot bound", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`make bench`'s service-side scenario: the allowed path (every request one
call to the rate-limit service) through this filter, with the service side
scaled four ways, envoyproxy/ratelimit and ratelimit-counter side by side,
in one run:

  svc1_single   1 envoyproxy/ratelimit replica,  one Redis
  svc2_single   2 envoyproxy/ratelimit replicas, one Redis
  svc1_cluster  1 envoyproxy/ratelimit replica,  a Redis Cluster (3 masters,
                a replica each)
  svc2_cluster  2 envoyproxy/ratelimit replicas, the same Redis Cluster
  cnt1_single, cnt2_single, cnt1_cluster, cnt2_cluster
                the same with ratelimit-counter replicas (the filter
                configured for the counter: `generate --service counter`),
                on the same Redis and the same Redis Cluster
  cnt1_memory   1 counter with its memory store (no Redis)
  cnt1_single_tls
                cnt1_single with TLS on both hops: Envoy to the counter over
                mutual TLS (the rate-limit cluster's transport_socket as
                `ratelimit-config render` writes it: ALPN h2, SNI, the
                counter's name checked, Envoy's client certificate), the
                counter to its own Redis (redis-server on a TLS port only)
                over mutual TLS (`--store rediss://`, --redis-ca/-cert/-key);
                against cnt1_single, the same path in plaintext: the TLS cost
  svc1_single_tls
                svc1_single with the same TLS on both hops, by
                envoyproxy/ratelimit's own settings (GRPC_SERVER_USE_TLS,
                GRPC_CLIENT_TLS_CACERT and _SAN, REDIS_TLS, REDIS_TLS_CACERT,
                REDIS_TLS_CLIENT_CERT and _KEY), against svc1_single

Each is its own filter Envoy whose rate-limit cluster lists its replicas;
all run for the whole scenario and take turns (A B C D A B C D ...). Besides
wrk's figures, each run records the service's calls (its own counter), the
CPU time the service replicas and the Redis servers used (/proc/<pid>/stat),
and the Redis commands they ran (INFO commandstats): where the time goes,
and where the bottleneck moves. Requests (and calls) per second per service
core are the requests (calls) over the CPU seconds the replicas used: what
one core of service answers.

Used by bench/bench.py (--service-side); the results go under
"service_side" in results.json, and report.py prints their table.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import cluster as cl  # noqa: E402
import counters  # noqa: E402
import harness as h  # noqa: E402
import redis_extra  # noqa: E402
import tlsfiles  # noqa: E402

CONFIGS = ("svc1_single", "svc2_single", "svc1_cluster", "svc2_cluster",
           "cnt1_single", "cnt2_single", "cnt1_cluster", "cnt2_cluster", "cnt1_memory",
           "cnt1_single_tls", "svc1_single_tls")
LABELS = {
    "svc1_single": "1 service, one Redis",
    "svc2_single": "2 services, one Redis",
    "svc1_cluster": "1 service, Redis Cluster",
    "svc2_cluster": "2 services, Redis Cluster",
    "cnt1_single": "1 counter, one Redis",
    "cnt2_single": "2 counters, one Redis",
    "cnt1_cluster": "1 counter, Redis Cluster",
    "cnt2_cluster": "2 counters, Redis Cluster",
    "cnt1_memory": "1 counter, memory store",
    "cnt1_single_tls": "1 counter, one Redis, mutual TLS to both",
    "svc1_single_tls": "1 service, one Redis, mutual TLS to both",
}
# A counter configuration against the envoyproxy/ratelimit one of the same
# topology (the memory store: against one service on one Redis).
AGAINST = {"cnt1_single": "svc1_single", "cnt2_single": "svc2_single",
           "cnt1_cluster": "svc1_cluster", "cnt2_cluster": "svc2_cluster",
           "cnt1_memory": "svc1_single"}
# A configuration with TLS against the same one in plaintext: the TLS cost.
TLS_AGAINST = {"cnt1_single_tls": "cnt1_single", "svc1_single_tls": "svc1_single"}
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The counter's name in its certificate (sent as SNI, checked by Envoy)
# and Envoy's in its client certificate (checked by the counter).
COUNTER_NAME = "counter.bench"
ENVOY_NAME = "envoy.bench"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def pin(process: h.Process, cpu: int) -> None:
    """Pin every thread of a process we started to one CPU (taskset -a)."""
    subprocess.run(["taskset", "-a", "-c", "-p", str(cpu), str(process.pid)],
                   check=True, capture_output=True, timeout=10)


def commandstats(nodes: list) -> dict[str, int]:
    """INFO commandstats summed over the masters (a replica counts the
    commands it applies again, as INCRBY and PEXPIREAT)."""
    total: dict[str, int] = {}
    for n in nodes:
        if not n.process.alive() or cl.info(n, "replication").get("role") != "master":
            continue
        for k, v in cl.commandstats(n).items():
            total[k] = total.get(k, 0) + v
    return total


def filter_failures(envoy: h.Envoy) -> dict[str, int]:
    """This filter's fail-opens and failed calls so far (its counters
    tenant_ratelimit.failure_mode_allowed and .rls_error)."""
    out = {"failed_open": 0, "rls_errors": 0}
    for k, v in envoy.stats(r"tenant_ratelimit\.(failure_mode_allowed|rls_error)$").items():
        out["failed_open" if k.endswith("failure_mode_allowed") else "rls_errors"] += v
    return out


class Tls:
    """The TLS configuration's certificates (one CA, openssl: tests/tlsfiles.py
    and tests/redis_extra.py's make_certs) and the Redis on a TLS port only
    that requires a client certificate."""

    def __init__(self, stack: h.Stack):
        d = stack.workdir / "tls"
        self.redis_certs = redis_extra.make_certs(d)
        ca = tlsfiles.CA(self.redis_certs.ca, d / "ca.key")
        self.counter = ca.issue(d, "counter", f"IP:{h.LOOPBACK},DNS:{COUNTER_NAME}", client=False)
        self.envoy = ca.issue(d, "envoy", f"DNS:{ENVOY_NAME}", client=True)
        self.ca = self.redis_certs.ca
        self.redis = redis_extra.TlsRedis(stack, self.redis_certs, auth_clients="yes")

    def store(self) -> str:
        return self.redis.url()

    def counter_args(self) -> list[str]:
        """The counter's flags: gRPC mutual TLS, and the files for Redis."""
        c = self.redis_certs
        return ["--tls-cert", str(self.counter.cert), "--tls-key", str(self.counter.key),
                "--tls-client-ca", str(self.ca), "--tls-client-san", ENVOY_NAME,
                "--redis-ca", str(c.ca), "--redis-cert", str(c.client_cert),
                "--redis-key", str(c.client_key)]

    def service_env(self) -> dict[str, str]:
        """envoyproxy/ratelimit's settings for the same: gRPC mutual TLS,
        and Redis over mutual TLS."""
        c = self.redis_certs
        return {"REDIS_TYPE": "single", "REDIS_URL": f"{h.LOOPBACK}:{self.redis.port}",
                "REDIS_TLS": "true", "REDIS_TLS_CACERT": str(c.ca),
                "REDIS_TLS_CLIENT_CERT": str(c.client_cert),
                "REDIS_TLS_CLIENT_KEY": str(c.client_key),
                "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": str(self.counter.cert),
                "GRPC_SERVER_TLS_KEY": str(self.counter.key),
                "GRPC_CLIENT_TLS_CACERT": str(self.ca), "GRPC_CLIENT_TLS_SAN": ENVOY_NAME}

    def transport_socket(self, limits: dict, domain: str, out: Path) -> dict:
        """The rate-limit cluster's transport_socket as `ratelimit-config
        render --target envoy --service counter` writes it for these files."""
        files = h.render_target(
            limits, "envoy", out, "--service", "counter", "--domain", domain,
            "--set", "redis.url=memory",
            "--set", f"service.tls.cert={self.counter.cert}",
            "--set", f"service.tls.key={self.counter.key}",
            "--set", f"service.tls.client_ca={self.ca}", "--set", f"service.tls.ca={self.ca}",
            "--set", f"service.tls.client_cert={self.envoy.cert}",
            "--set", f"service.tls.client_key={self.envoy.key}",
            "--set", f"service.tls.sni={COUNTER_NAME}")
        bootstrap = yaml.safe_load(files["envoy.yaml"])
        sockets = [c["transport_socket"] for c in bootstrap["static_resources"]["clusters"]
                   if "transport_socket" in c]
        if len(sockets) != 1:
            raise h.HarnessError(f"render wrote {len(sockets)} clusters with TLS, not one")
        return sockets[0]


def with_transport_socket(text: str, cluster: str, socket: dict) -> str:
    """A rendered Envoy config (envoy/envoy.yaml.tmpl) whose cluster
    `cluster` has `socket` as its transport_socket."""
    head = re.compile(rf"^  - name: {re.escape(cluster)}\n    type: \w+\n"
                      r"    connect_timeout: \S+\n", re.M)
    hits = list(head.finditer(text))
    if len(hits) != 1:
        raise h.HarnessError(f"expected one cluster {cluster!r} in the Envoy config")
    end = hits[0].end()
    return text[:end] + f"    transport_socket: {json.dumps(socket)}\n" + text[end:]


def run(args, out: Path, wrk, scenario, header: str, limits: dict,
        configs: tuple[str, ...] = CONFIGS) -> dict:
    """Start the topologies `configs` need, run the allowed scenario against
    each, return the results."""
    runs: list[dict] = []
    pinned = args.pin_service_cpu is not None
    with h.Stack(out / "stack-service-side") as stack:
        gen = stack.generate(limits, domain="bench", timeout_ms=1000)
        single = stack.redis()
        redis_cluster = (cl.RedisCluster.start(stack)
                         if any(c.endswith("_cluster") for c in configs) else None)
        env_single = cl.service_env(single=single)
        env_cluster = cl.service_env(cluster=redis_cluster) if redis_cluster else {}
        if pinned:
            # One core per replica, counted as such by the Go runtime too.
            env_single = dict(env_single, GOMAXPROCS="1")
            env_cluster = dict(env_cluster, GOMAXPROCS="1")

        def wanted(prefix: str, topology: str) -> int:
            """Replicas of one service on one topology that `configs` use."""
            return max((int(c[3]) for c in configs
                        if c.startswith(prefix) and c.endswith("_" + topology)), default=0)

        rls_single = cl.services(stack, gen, wanted("svc", "single"), env_single,
                                 log_level="warn")
        tls = Tls(stack) if any(c in TLS_AGAINST for c in configs) else None
        rls_single_tls = (cl.services(stack, gen, 1, dict(
            tls.service_env(), **({"GOMAXPROCS": "1"} if pinned else {})), log_level="warn")
                          if tls is not None and "svc1_single_tls" in configs else [])
        rls_cluster = cl.services(stack, gen, wanted("svc", "cluster"), env_cluster,
                                  log_level="warn")
        # The counter: one tokio worker per replica when pinned.
        counter_env = {"TOKIO_WORKER_THREADS": "1"} if pinned else None
        stores = {"single": counters.redis_store(single), "memory": "memory"}
        if redis_cluster is not None:
            stores["cluster"] = "redis-cluster://" + redis_cluster.url
        cnt = {topology: [counters.start_counter(stack, gen.domain, limits, store,
                                                 name=f"counter-{topology}-{i}",
                                                 env=counter_env)
                          for i in range(wanted("cnt", topology))]
               for topology, store in stores.items()}
        if tls is not None and "cnt1_single_tls" in configs:
            cnt["single_tls"] = [counters.start_counter(
                stack, gen.domain, limits, tls.store(), name="counter-single-tls",
                env=counter_env, extra_args=tls.counter_args())]
        if pinned:
            for s in (*rls_single, *rls_single_tls, *rls_cluster,
                      *(c for cs in cnt.values() for c in cs)):
                pin(s.process, args.pin_service_cpu)
        upstream = stack.upstream()
        plugin_cfg = gen.plugin_config()
        counter_cfg = (counters.generate_for_counter(stack, limits, gen.domain, 1000)
                       .plugin_config() if any(c.startswith("cnt") for c in configs) else {})
        redis_nodes = redis_cluster.nodes if redis_cluster else []
        parts = {
            "svc1_single": ("ratelimit", rls_single[:1], [single]),
            "svc2_single": ("ratelimit", rls_single, [single]),
            "svc1_cluster": ("ratelimit", rls_cluster[:1], redis_nodes),
            "svc2_cluster": ("ratelimit", rls_cluster, redis_nodes),
            "cnt1_single": ("counter", cnt["single"][:1], [single]),
            "cnt2_single": ("counter", cnt["single"], [single]),
            "cnt1_cluster": ("counter", cnt.get("cluster", [])[:1], redis_nodes),
            "cnt2_cluster": ("counter", cnt.get("cluster", []), redis_nodes),
            "cnt1_memory": ("counter", cnt["memory"][:1], []),
            "svc1_single_tls": ("ratelimit", rls_single_tls, [tls.redis] if tls else []),
            "cnt1_single_tls": ("counter", cnt.get("single_tls", []),
                                [tls.redis] if tls else []),
        }
        services = {cfg: [counters.Service(kind, s) for s in handles]
                    for cfg, (kind, handles, _) in parts.items() if cfg in configs}
        socket = (tls.transport_socket(limits, gen.domain, stack.workdir / "render-tls")
                  if tls is not None else None)

        def envoy(cfg: str) -> h.Envoy:
            config = counter_cfg if cfg.startswith("cnt") else plugin_cfg
            if cfg not in TLS_AGAINST:
                return cl.envoy_for(stack, config, parts[cfg][1], upstream, name=cfg,
                                    concurrency=args.envoy_concurrency)
            ports = [s.grpc_port for s in parts[cfg][1]]
            cluster = config["rate_limit_service"]["cluster"]
            return stack.envoy(config, ports[0], upstream, name=cfg,
                               concurrency=args.envoy_concurrency,
                               edit=lambda text: with_transport_socket(
                                   cl.with_rls_endpoints(text, ports), cluster, socket))

        envoys = {cfg: envoy(cfg) for cfg in configs}

        print(f"Service side: {scenario.title}, envoyproxy/ratelimit and the counter "
              f"({len(configs)} topologies)", flush=True)
        if args.warmup:
            for cfg in configs:
                wrk(envoys[cfg].url, scenario, header, args.threads, args.connections,
                    args.warmup)
        for rep in range(1, args.reps + 1):
            for cfg in configs:
                kind, _, redises = parts[cfg]
                rls = services[cfg]

                def calls_now() -> float:
                    return sum(s.calls(s.metrics()) for s in rls)

                calls0 = calls_now()
                svc_cpu0 = sum(cpu_seconds(s.pid) for s in rls)
                redis_cpu0 = sum(cpu_seconds(r.process.pid) for r in redises)
                envoy_cpu0 = cpu_seconds(envoys[cfg].process.pid)
                cmd0 = commandstats(redises)
                fail0 = filter_failures(envoys[cfg])
                result = wrk(envoys[cfg].url, scenario, header, args.threads,
                             args.connections, args.duration)
                calls = calls_now() - calls0
                svc_cpu = sum(cpu_seconds(s.pid) for s in rls) - svc_cpu0
                redis_cpu = sum(cpu_seconds(r.process.pid) for r in redises) - redis_cpu0
                envoy_cpu = cpu_seconds(envoys[cfg].process.pid) - envoy_cpu0
                cmd1 = commandstats(redises)
                fail1 = filter_failures(envoys[cfg])
                cmds = {k: v - cmd0.get(k, 0) for k, v in cmd1.items() if v - cmd0.get(k, 0)}
                n = result["requests"]
                secs = result["duration_us"] / 1e6
                data_cmds = counters.data_commands(cmds, kind)
                r = {
                    "scenario": f"service_{scenario.name}", "config": cfg, "rep": rep,
                    "service": kind,
                    "requests": n, "duration_s": secs, "rps": n / secs if secs else 0.0,
                    "latency_ms": {k: v / 1000 for k, v in result["latency_us"].items()},
                    "statuses": result["statuses"], "errors": result["errors"],
                    "rls_calls": int(calls),
                    # Calls that failed (the filter's count) and the requests
                    # it let through for them (on_failure allow): a run with
                    # any measures a service that did not answer.
                    "rls_errors": fail1["rls_errors"] - fail0["rls_errors"],
                    "failed_open": fail1["failed_open"] - fail0["failed_open"],
                    "rls_calls_per_s": calls / secs if secs else 0.0,
                    "service_cpu_s": round(svc_cpu, 3),
                    "redis_cpu_s": round(redis_cpu, 3),
                    "envoy_cpu_s": round(envoy_cpu, 3),
                    "envoy_cpu_us_per_request": 1e6 * envoy_cpu / n if n else 0.0,
                    "service_cpu_us_per_call": 1e6 * svc_cpu / calls if calls else 0.0,
                    "redis_cpu_us_per_call": 1e6 * redis_cpu / calls if calls else 0.0,
                    "service_cpu_us_per_request": 1e6 * svc_cpu / n if n else 0.0,
                    "redis_cpu_us_per_request": 1e6 * redis_cpu / n if n else 0.0,
                    # What one core of service answers: requests (calls) over
                    # the CPU seconds the replicas used.
                    "requests_per_service_core_s": n / svc_cpu if svc_cpu > 0 else 0.0,
                    "calls_per_service_core_s": calls / svc_cpu if svc_cpu > 0 else 0.0,
                    # INFO commandstats: the commands the counter's script runs
                    # inside Redis included.
                    "redis_commands": cmds,
                    # Sent: INCRBY and EXPIRE (envoyproxy/ratelimit), EVALSHA (the counter).
                    "redis_data_commands_per_call": data_cmds / calls if calls else 0.0,
                    "redis_data_commands_per_request": data_cmds / n if n else 0.0,
                }
                runs.append(r)
                print(f"  {cfg:<13} rep {rep}: {r['rps']:>8.0f} req/s  "
                      f"p99 {r['latency_ms']['p99']:.2f} ms  calls/s {r['rls_calls_per_s']:.0f}  "
                      f"service {r['service_cpu_us_per_call']:.0f} µs/call  "
                      f"req/s per service core {r['requests_per_service_core_s']:.0f}  "
                      f"redis {r['redis_cpu_us_per_call']:.0f} µs/call  "
                      f"envoy {r['envoy_cpu_us_per_request']:.0f} µs/req  "
                      f"redis cmds/call {r['redis_data_commands_per_call']:.2f}  "
                      f"statuses {r['statuses']}  failed calls {r['rls_errors']}  "
                      f"fail-open {r['failed_open']}", flush=True)
    return {
        "scenario": scenario.name,
        "title": scenario.title,
        "configs": list(configs),
        "labels": LABELS,
        "against": {c: a for c, a in AGAINST.items() if c in configs and a in configs},
        "tls_against": {c: a for c, a in TLS_AGAINST.items() if c in configs and a in configs},
        "tls": ("Envoy to the service: mutual TLS (ALPN h2, SNI, the rendered "
                "transport_socket); the service to Redis: mutual TLS (the counter: "
                "rediss://; envoyproxy/ratelimit: REDIS_TLS; redis-server --tls-port "
                "--tls-auth-clients yes); P-256 certificates"
                if any(c in TLS_AGAINST for c in configs) else None),
        "pinned_service_cpu": args.pin_service_cpu,
        "redis_cluster": "3 masters, 1 replica each (redis-server, cluster mode, loopback); "
                         "Redis CPU counts all 6 nodes, commands only the masters",
        "service_redis_settings": {"single": env_single, "cluster": {
            k: v for k, v in env_cluster.items() if k != "REDIS_URL"}},
        "counter_settings": {"store_timeout_ms": counters.COUNTER_STORE_TIMEOUT_MS,
                             "env": counter_env or {}},
        "runs": runs,
    }

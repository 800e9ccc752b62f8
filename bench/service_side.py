"""`make bench`'s service-side scenario: the allowed path (every request one
call to the rate-limit service) through this filter, with the service side
scaled four ways, in one run:

  svc1_single   1 service replica,  one Redis
  svc2_single   2 service replicas, one Redis
  svc1_cluster  1 service replica,  a Redis Cluster (3 masters, a replica each)
  svc2_cluster  2 service replicas, the same Redis Cluster

Each is its own filter Envoy whose rate-limit cluster lists its replicas;
all run for the whole scenario and take turns (A B C D A B C D ...). Besides
wrk's figures, each run records the service's calls (its own counter), the
CPU time the service replicas and the Redis servers used (/proc/<pid>/stat),
and the Redis commands they ran (INFO commandstats): where the time goes,
and where the bottleneck moves.

Used by bench/bench.py (--service-side); the results go under
"service_side" in results.json, and report.py prints their table.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import cluster as cl  # noqa: E402
import harness as h  # noqa: E402

CONFIGS = ("svc1_single", "svc2_single", "svc1_cluster", "svc2_cluster")
LABELS = {
    "svc1_single": "1 service, one Redis",
    "svc2_single": "2 services, one Redis",
    "svc1_cluster": "1 service, Redis Cluster",
    "svc2_cluster": "2 services, Redis Cluster",
}
RLS_CALLS = 'ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}'
CLK_TCK = os.sysconf("SC_CLK_TCK")


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


def run(args, out: Path, wrk, scenario, header: str, limits: dict) -> dict:
    """Start the topologies, run the allowed scenario against each, return the results."""
    runs: list[dict] = []
    with h.Stack(out / "stack-service-side") as stack:
        gen = stack.generate(limits, domain="bench", timeout_ms=1000)
        single = stack.redis()
        redis_cluster = cl.RedisCluster.start(stack)
        env_single = cl.service_env(single=single)
        env_cluster = cl.service_env(cluster=redis_cluster)
        if args.pin_service_cpu is not None:
            # One core per replica, counted as such by the Go runtime too.
            env_single = dict(env_single, GOMAXPROCS="1")
            env_cluster = dict(env_cluster, GOMAXPROCS="1")
        rls_single = cl.services(stack, gen, 2, env_single, log_level="warn")
        rls_cluster = cl.services(stack, gen, 2, env_cluster, log_level="warn")
        if args.pin_service_cpu is not None:
            for s in (*rls_single, *rls_cluster):
                pin(s.process, args.pin_service_cpu)
        upstream = stack.upstream()
        plugin_cfg = gen.plugin_config()
        parts = {
            "svc1_single": (rls_single[:1], [single]),
            "svc2_single": (rls_single, [single]),
            "svc1_cluster": (rls_cluster[:1], redis_cluster.nodes),
            "svc2_cluster": (rls_cluster, redis_cluster.nodes),
        }
        envoys = {cfg: cl.envoy_for(stack, plugin_cfg, rls, upstream, name=cfg,
                                    concurrency=args.envoy_concurrency)
                  for cfg, (rls, _) in parts.items()}

        print(f"Service side: {scenario.title}, the service scaled four ways", flush=True)
        if args.warmup:
            for cfg in CONFIGS:
                wrk(envoys[cfg].url, scenario, header, args.threads, args.connections,
                    args.warmup)
        for rep in range(1, args.reps + 1):
            for cfg in CONFIGS:
                rls, redises = parts[cfg]
                calls0 = sum(s.settled_metrics().get(RLS_CALLS, 0) for s in rls)
                svc_cpu0 = sum(cpu_seconds(s.process.pid) for s in rls)
                redis_cpu0 = sum(cpu_seconds(r.process.pid) for r in redises)
                envoy_cpu0 = cpu_seconds(envoys[cfg].process.pid)
                cmd0 = commandstats(redises)
                result = wrk(envoys[cfg].url, scenario, header, args.threads,
                             args.connections, args.duration)
                calls = sum(s.settled_metrics().get(RLS_CALLS, 0) for s in rls) - calls0
                svc_cpu = sum(cpu_seconds(s.process.pid) for s in rls) - svc_cpu0
                redis_cpu = sum(cpu_seconds(r.process.pid) for r in redises) - redis_cpu0
                envoy_cpu = cpu_seconds(envoys[cfg].process.pid) - envoy_cpu0
                cmd1 = commandstats(redises)
                cmds = {k: v - cmd0.get(k, 0) for k, v in cmd1.items() if v - cmd0.get(k, 0)}
                n = result["requests"]
                secs = result["duration_us"] / 1e6
                data_cmds = sum(v for k, v in cmds.items() if k in ("incrby", "expire"))
                r = {
                    "scenario": f"service_{scenario.name}", "config": cfg, "rep": rep,
                    "requests": n, "duration_s": secs, "rps": n / secs if secs else 0.0,
                    "latency_ms": {k: v / 1000 for k, v in result["latency_us"].items()},
                    "statuses": result["statuses"], "errors": result["errors"],
                    "rls_calls": int(calls),
                    "rls_calls_per_s": calls / secs if secs else 0.0,
                    "service_cpu_s": round(svc_cpu, 3),
                    "redis_cpu_s": round(redis_cpu, 3),
                    "envoy_cpu_s": round(envoy_cpu, 3),
                    "envoy_cpu_us_per_request": 1e6 * envoy_cpu / n if n else 0.0,
                    "service_cpu_us_per_call": 1e6 * svc_cpu / calls if calls else 0.0,
                    "redis_cpu_us_per_call": 1e6 * redis_cpu / calls if calls else 0.0,
                    "redis_commands": cmds,
                    "redis_data_commands_per_call": data_cmds / calls if calls else 0.0,
                }
                runs.append(r)
                print(f"  {cfg:<13} rep {rep}: {r['rps']:>8.0f} req/s  "
                      f"p99 {r['latency_ms']['p99']:.2f} ms  calls/s {r['rls_calls_per_s']:.0f}  "
                      f"service {r['service_cpu_us_per_call']:.0f} µs/call  "
                      f"redis {r['redis_cpu_us_per_call']:.0f} µs/call  "
                      f"envoy {r['envoy_cpu_us_per_request']:.0f} µs/req  "
                      f"redis cmds/call {r['redis_data_commands_per_call']:.2f}  "
                      f"statuses {r['statuses']}", flush=True)
    return {
        "scenario": scenario.name,
        "title": scenario.title,
        "configs": list(CONFIGS),
        "labels": LABELS,
        "pinned_service_cpu": args.pin_service_cpu,
        "redis_cluster": "3 masters, 1 replica each (redis-server, cluster mode, loopback); "
                         "Redis CPU counts all 6 nodes, commands only the masters",
        "service_redis_settings": {"single": env_single, "cluster": {
            k: v for k, v in env_cluster.items() if k != "REDIS_URL"}},
        "runs": runs,
    }

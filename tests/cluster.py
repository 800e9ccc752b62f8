"""Scaled-out topologies on loopback, built on tests/harness/:

  - a Redis Cluster of Debian's redis-server (3 masters, a replica each),
    created with `redis-cli --cluster create`;
  - a separate per-second Redis (the service's REDIS_PERSECOND* settings);
  - several envoyproxy/ratelimit replicas, all listed as endpoints of every
    Envoy's rate-limit cluster (Envoy balances calls over them round robin).

    stack = harness.Stack(workdir)
    fleet = scaled_fleet(stack, limits, envoys=3, services=2, persecond=True)
    fleet.cluster.master_of(key)    # the node that holds a key
    fleet.cluster.kill(node)        # SIGKILL, then wait_failover(node)

The service's Redis client (radix v4) reads the topology with CLUSTER SLOTS
and dials the addresses the nodes announce, so every node announces
127.0.0.1 (cluster-announce-ip); it follows MOVED, and re-reads the
topology every 5 s (ClusterConfig.SyncEvery, not settable through the
service's environment).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import harness
from harness import (LOOPBACK, REDIS_BIN, Envoy, Generated, HarnessError, Process,
                     RateLimitService, Redis, Stack, free_port, wait_until)

REDIS_CLI = Path(shutil.which("redis-cli") or "/usr/bin/redis-cli")
# How long a master may be unreachable before the cluster marks it failed
# and a replica takes over. Redis's default is 15 s; 1 s keeps the test short.
NODE_TIMEOUT_MS = 1000
FAILOVER_DEADLINE_S = 30.0
# radix v4 re-reads the topology every 5 s; the promoted replica is used
# from the first sync after the promotion.
RADIX_SYNC_S = 5.0


class ClusterNode(Redis):
    """One redis-server in cluster mode (no persistence), announcing 127.0.0.1."""

    def __init__(self, stack: Stack, index: int, password: str | None = None):
        self.index = index
        self.password = password
        self.port = free_port()
        self.bus_port = free_port()
        data = stack.workdir / "redis-cluster" / str(index)
        data.mkdir(parents=True, exist_ok=True)
        self.stack = stack
        self.argv = [REDIS_BIN, "--bind", LOOPBACK, "--port", self.port, "--save", "",
                     "--appendonly", "no", "--daemonize", "no", "--loglevel", "notice",
                     "--dir", data, "--cluster-enabled", "yes",
                     "--cluster-config-file", data / "nodes.conf",
                     "--cluster-port", self.bus_port,
                     "--cluster-announce-ip", LOOPBACK,
                     "--cluster-node-timeout", NODE_TIMEOUT_MS,
                     # A replica may always take over from its dead master, however
                     # long ago it last heard from it.
                     "--cluster-replica-validity-factor", "0",
                     # A replica's first full sync starts at once, not after 5 s.
                     "--repl-diskless-sync-delay", "0",
                     # CLUSTER SLOTS lists a replica only once its replication offset
                     # is not 0, and an idle master's offset moves with its pings to
                     # the replicas: every second, not every 10.
                     "--repl-ping-replica-period", "1"]
        if password:
            # Clients and replicas alike need it.
            self.argv += ["--requirepass", password, "--masterauth", password]
        self.start()

    def start(self) -> None:
        """Start (or restart, on the same ports and with the same nodes.conf,
        so that it rejoins the cluster as the node it was) and wait for PING."""
        self.process: Process = self.stack.spawn("redis-node", self.argv)
        wait_until(lambda: self.command("PING") == "PONG", f"redis node {self.index} PING",
                   process=self.process)

    @property
    def addr(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def info(self, section: str) -> dict[str, str]:
        return info(self, section)

    def role(self) -> str:
        return self.info("replication").get("role", "")

    def commandstats(self) -> dict[str, int]:
        return commandstats(self)


def info(redis: Redis, section: str) -> dict[str, str]:
    """INFO <section> of any Redis as {field: value}."""
    out = {}
    for line in redis.command("INFO", section).splitlines():
        k, sep, v = line.partition(":")
        if sep:
            out[k.strip()] = v.strip()
    return out


def commandstats(redis: Redis) -> dict[str, int]:
    """{command: calls} from INFO commandstats (cmdstat_incrby:calls=…)."""
    out = {}
    for k, v in info(redis, "commandstats").items():
        m = re.match(r"calls=(\d+)", v)
        if k.startswith("cmdstat_") and m:
            out[k[len("cmdstat_"):]] = int(m.group(1))
    return out


@dataclass
class RedisCluster:
    """3 masters with a replica each (by default), on loopback."""

    stack: Stack
    nodes: list[ClusterNode] = field(default_factory=list)

    @classmethod
    def start(cls, stack: Stack, masters: int = 3, replicas: int = 1,
              password: str | None = None) -> "RedisCluster":
        """`password`: every node requires it (requirepass, masterauth)."""
        c = cls(stack, [ClusterNode(stack, i, password)
                        for i in range(masters * (1 + replicas))])
        argv = [str(REDIS_CLI), "--cluster", "create", *(n.addr for n in c.nodes),
                "--cluster-replicas", str(replicas), "--cluster-yes"]
        log = stack.workdir / "logs" / "redis-cli-cluster-create.log"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               **({"REDISCLI_AUTH": password} if password else {})}
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL, env=env)
        log.write_text(f"### {' '.join(argv)}\n{proc.stdout}\n{proc.stderr}")
        if proc.returncode != 0:
            raise HarnessError(f"redis-cli --cluster create exited {proc.returncode}:\n"
                               f"{proc.stdout}\n{proc.stderr}")
        wait_until(lambda: c.healthy() and c._every_node_sees(masters, replicas),
                   "redis cluster: every node ok, every replica linked and known")
        return c

    def _every_node_sees(self, masters: int, replicas: int) -> bool:
        for n in self.nodes:
            ranges = n.command("CLUSTER", "SLOTS")
            if len({r[2][1] for r in ranges}) != masters:
                return False
            if any(len(r) - 3 != replicas for r in ranges):
                return False
        return True

    def alive(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.process.alive()]

    def healthy(self) -> bool:
        """Every live node sees the cluster ok and every live replica's link is up."""
        for n in self.alive():
            if "cluster_state:ok" not in n.command("CLUSTER", "INFO"):
                return False
            repl = n.info("replication")
            if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                return False
        return True

    @property
    def url(self) -> str:
        """REDIS_URL for REDIS_TYPE=cluster: every node, comma-separated."""
        return ",".join(n.addr for n in self.nodes)

    def slots(self) -> list[tuple[int, int, ClusterNode, list[ClusterNode]]]:
        """CLUSTER SLOTS from a live node: (first, last, master, replicas)."""
        by_port = {n.port: n for n in self.nodes}
        out = []
        for first, last, master, *replicas in self.alive()[0].command("CLUSTER", "SLOTS"):
            out.append((int(first), int(last), by_port[int(master[1])],
                        [by_port[int(r[1])] for r in replicas]))
        return out

    def masters(self) -> list[ClusterNode]:
        seen: list[ClusterNode] = []
        for _, _, m, _ in sorted(self.slots(), key=lambda s: s[0]):
            if m not in seen:
                seen.append(m)
        return seen

    def keyslot(self, key: str) -> int:
        return int(self.alive()[0].command("CLUSTER", "KEYSLOT", key))

    def master_of(self, key: str) -> ClusterNode:
        slot = self.keyslot(key)
        for first, last, m, _ in self.slots():
            if first <= slot <= last:
                return m
        raise HarnessError(f"no node serves slot {slot} of {key!r}")

    def replicas_of(self, master: ClusterNode) -> list[ClusterNode]:
        return next((r for _, _, m, r in self.slots() if m is master), [])

    def get_int(self, key: str) -> int | None:
        """The key's value, read from the master that holds it."""
        v = self.master_of(key).command("GET", key)
        return None if v is None else int(v)

    def keys(self, pattern: str = "*") -> list[str]:
        """Keys matching `pattern` on the live masters."""
        out: list[str] = []
        for n in self.alive():
            if n.role() == "master":
                out += n.command("KEYS", pattern)
        return sorted(out)

    def kill(self, node: ClusterNode) -> None:
        """SIGKILL: a crash, not a shutdown."""
        node.process.kill()

    def wait_failover(self, dead: ClusterNode, replica: ClusterNode,
                      deadline_s: float = FAILOVER_DEADLINE_S) -> float:
        """Wait until `replica` is a master and the cluster is ok without
        `dead`; returns when that was first seen (time.time())."""
        wait_until(lambda: replica.role() == "master" and self.healthy(),
                   f"replica {replica.addr} promoted in place of {dead.addr}", deadline_s)
        return time.time()

    def commandstats(self) -> Counter:
        """INFO commandstats summed over the live masters."""
        total: Counter = Counter()
        for n in self.alive():
            if n.role() == "master":
                total.update(n.commandstats())
        return total


# ------------------------------------------------------------------ the service

def service_env(*, cluster: RedisCluster | None = None, single: Redis | None = None,
                persecond: Redis | None = None, pool_size: int | None = None,
                pipeline_window: str | None = None) -> dict[str, str]:
    """The service's Redis settings for one topology."""
    env: dict[str, str] = {}
    if cluster is not None:
        env |= {"REDIS_TYPE": "cluster", "REDIS_URL": cluster.url,
                # The service says the cluster client needs a write-flush
                # window ("Required for Redis Cluster mode. Recommended value:
                # 150us-500us", src/settings/settings.go).
                "REDIS_PIPELINE_WINDOW": pipeline_window or "150us"}
    elif single is not None:
        env |= {"REDIS_TYPE": "single", "REDIS_URL": f"{LOOPBACK}:{single.port}"}
        if pipeline_window:
            env["REDIS_PIPELINE_WINDOW"] = pipeline_window
    if persecond is not None:
        env |= {"REDIS_PERSECOND": "true", "REDIS_PERSECOND_TYPE": "single",
                "REDIS_PERSECOND_SOCKET_TYPE": "tcp",
                "REDIS_PERSECOND_URL": f"{LOOPBACK}:{persecond.port}"}
    if pool_size is not None:
        env["REDIS_POOL_SIZE"] = str(pool_size)
        if persecond is not None:
            env["REDIS_PERSECOND_POOL_SIZE"] = str(pool_size)
    return env


def services(stack: Stack, gen: Generated | Path, count: int, env: dict[str, str],
             log_level: str | None = None) -> list[RateLimitService]:
    return [stack.ratelimit(None, gen, log_level=log_level, extra_env=env)  # type: ignore[arg-type]
            for _ in range(count)]


_RLS_ENDPOINT = re.compile(
    r"^( *)- endpoint:\n\1    address:\n\1      socket_address: "
    r"\{ address: [0-9.]+, port_value: (\d+) \}\n", re.M)


def with_rls_endpoints(config_text: str, rls_ports: list[int]) -> str:
    """A rendered Envoy config whose rate-limit cluster lists every port in
    `rls_ports` (the template has one endpoint; it is the first one)."""
    matches = [m for m in _RLS_ENDPOINT.finditer(config_text)
               if int(m.group(2)) == rls_ports[0]]
    if len(matches) != 1:
        raise HarnessError(f"expected one rate-limit endpoint on port {rls_ports[0]}")
    m = matches[0]
    indent = m.group(1)
    block = "".join(
        f"{indent}- endpoint:\n{indent}    address:\n{indent}      socket_address: "
        f"{{ address: {LOOPBACK}, port_value: {p} }}\n" for p in rls_ports)
    return config_text[:m.start()] + block + config_text[m.end():]


def envoy_for(stack: Stack, plugin_config: dict, rls: list[RateLimitService],
              upstream: Envoy, name: str, concurrency: int = 2) -> Envoy:
    """A filter Envoy whose rate-limit cluster is every service replica."""
    ports = [s.grpc_port for s in rls]
    return stack.envoy(plugin_config, ports[0], upstream, name=name, concurrency=concurrency,
                       edit=lambda text: with_rls_endpoints(text, ports))


@dataclass
class ScaledFleet(harness.EnvoysView):
    generated: Generated
    cluster: RedisCluster
    persecond: Redis | None
    services: list[RateLimitService]
    upstream: Envoy
    envoys: list[Envoy]

    def service_calls(self) -> list[int]:
        """ShouldRateLimit calls each service replica has answered or failed."""
        key = 'ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}'
        return [int(s.settled_metrics().get(key, 0)) for s in self.services]


def scaled_fleet(stack: Stack, limits: dict, *, envoys: int = 3, services_n: int = 2,
                 persecond: bool = False, timeout_ms: int | None = None,
                 cluster: RedisCluster | None = None) -> ScaledFleet:
    """Redis Cluster (+ a per-second Redis) + `services_n` service replicas +
    upstream + `envoys` filter Envoys, all sharing one generated config."""
    gen = stack.generate(limits, timeout_ms=timeout_ms)
    cluster = cluster or RedisCluster.start(stack)
    ps = stack.redis() if persecond else None
    env = service_env(cluster=cluster, persecond=ps)
    rls = services(stack, gen, services_n, env)
    upstream = stack.upstream()
    cfg = gen.plugin_config()
    members = [envoy_for(stack, cfg, rls, upstream, name=f"envoy-{i + 1}")
               for i in range(envoys)]
    return ScaledFleet(gen, cluster, ps, rls, upstream, members)


def tenants_on_distinct_masters(cluster: RedisCluster, domain: str, unit: str,
                                prefix: str, count: int = 3) -> list[str]:
    """`count` fresh tenants whose `unit` keys (this window) are held by
    `count` different masters: tenant names are tried until they are."""
    chosen: dict[int, str] = {}
    for _ in range(1000):
        tenant = harness.unique(prefix)
        node = cluster.master_of(harness.redis_key(domain, unit, tenant))
        if node.port not in chosen:
            chosen[node.port] = tenant
            if len(chosen) == count:
                return list(chosen.values())
    raise HarnessError(f"no {count} tenants on distinct masters in 1000 tries")

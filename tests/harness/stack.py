"""A Stack owns every process a test (or the demo) starts; a Fleet is the
whole stack for one team JSON."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .base import COUNTING_TIMEOUT_MS, SERVICES, HarnessError, selected_service, unique
from .config import Generated, generate
from .envoy import Envoy, render_envoy_config, render_upstream_config
from .processes import Process, free_port
from .redis import Redis
from .services import RateLimitService

if TYPE_CHECKING:
    import counter  # tests/counter.py, which imports this package


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
        self.service = service or selected_service()
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
            address = redis.address
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

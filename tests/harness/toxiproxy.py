"""Toxiproxy (Shopify's TCP proxy for fault injection) on loopback, driven
through its HTTP API: a proxy in front of a TCP server (Redis), latency
added to it, the proxy disabled (every connection refused and cut) and
enabled again.

    toxi = Toxiproxy(stack)                       # the server, started and ready
    redis_proxy = toxi.proxy("redis", redis.port) # listening at redis_proxy.port
    redis_proxy.latency(100)                      # every reply 100 ms later
    redis_proxy.clear()                           # no toxic left
    redis_proxy.disable(); redis_proxy.enable()

The binary is `make deps-toxiproxy`'s (`go install
github.com/Shopify/toxiproxy/v2/cmd/server`, pinned by the Makefile),
at $TRL_TOXIPROXY.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import requests

from .base import LOOPBACK, HarnessError, tool
from .processes import Process, Supervised, free_port, http_ok, wait_until

if TYPE_CHECKING:
    from .stack import Stack

TOXIPROXY_BIN = tool("TRL_TOXIPROXY", ".deps/gobin/toxiproxy-v2.12.0/server")


class ToxiProxy:
    """One proxy of a Toxiproxy server: LOOPBACK:`port` to `upstream`."""

    def __init__(self, server: "Toxiproxy", name: str, port: int, upstream: str):
        self.server = server
        self.name = name
        self.port = port
        self.upstream = upstream

    @property
    def address(self) -> str:
        """`host:port`, as envoyproxy/ratelimit's REDIS_URL takes it."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.server.api}/proxies/{self.name}"

    def latency(self, ms: int, jitter_ms: int = 0, stream: str = "downstream") -> None:
        """Every chunk the upstream sends back (`stream` "downstream"; "upstream":
        what the client sends) waits `ms` (± `jitter_ms`): a round trip costs
        `ms` more. Replaces a latency toxic already there."""
        self.remove("latency")
        self.server.call("POST", f"{self.url}/toxics", {
            "name": "latency", "type": "latency", "stream": stream, "toxicity": 1.0,
            "attributes": {"latency": int(ms), "jitter": int(jitter_ms)}})

    def toxics(self) -> list[dict]:
        return self.server.call("GET", f"{self.url}/toxics")

    def remove(self, toxic: str) -> None:
        if any(t.get("name") == toxic for t in self.toxics()):
            self.server.call("DELETE", f"{self.url}/toxics/{toxic}")

    def clear(self) -> None:
        """No toxic left."""
        for t in self.toxics():
            self.server.call("DELETE", f"{self.url}/toxics/{t['name']}")

    def disable(self) -> None:
        """Stops listening and closes every connection through it: the
        upstream unreachable (connections refused) until `enable()`."""
        self.server.call("POST", self.url, {"enabled": False})

    def enable(self) -> None:
        self.server.call("POST", self.url, {"enabled": True})

    def enabled(self) -> bool:
        return bool(self.server.call("GET", self.url).get("enabled"))


class Toxiproxy(Supervised):
    """A Toxiproxy server on loopback (its API on `api_port`), started by the stack."""

    def __init__(self, stack: "Stack"):
        if not TOXIPROXY_BIN.exists():
            raise HarnessError(f"{TOXIPROXY_BIN} is missing: run `make deps-toxiproxy`")
        self.stack = stack
        self.api_port = free_port()
        self.proxies: dict[str, ToxiProxy] = {}
        self.process: Process | None = None
        self.start()

    @property
    def api(self) -> str:
        return f"http://{LOOPBACK}:{self.api_port}"

    def start(self) -> None:
        if self.process is not None and self.process.alive():
            raise HarnessError("toxiproxy already running")
        self.process = self.stack.spawn(
            "toxiproxy", [TOXIPROXY_BIN, "-host", LOOPBACK, "-port", self.api_port])
        wait_until(lambda: http_ok(f"{self.api}/version"), "toxiproxy /version",
                   process=self.process)
        for p in self.proxies.values():  # a restarted server has none
            self._create(p.name, p.port, p.upstream)

    def call(self, method: str, url: str, body: dict | None = None):
        r = requests.request(method, url, json=body, timeout=5)
        if r.status_code >= 300:
            raise HarnessError(f"toxiproxy {method} {url}: {r.status_code} {r.text.strip()}")
        return r.json() if r.content else None

    def _create(self, name: str, port: int, upstream: str) -> None:
        self.call("POST", f"{self.api}/proxies", {
            "name": name, "listen": f"{LOOPBACK}:{port}", "upstream": upstream,
            "enabled": True})

    def proxy(self, name: str, upstream_port: int, upstream_host: str = LOOPBACK) -> ToxiProxy:
        """A proxy listening on a free loopback port, to upstream_host:upstream_port."""
        port = free_port()
        upstream = f"{upstream_host}:{upstream_port}"
        self._create(name, port, upstream)
        p = ToxiProxy(self, name, port, upstream)
        self.proxies[name] = p
        return p

"""redis-server on a loopback port, and a minimal RESP client for it."""

from __future__ import annotations

import signal
import socket
import ssl
from typing import TYPE_CHECKING

from .base import LOOPBACK, REDIS_BIN, HarnessError
from .processes import Process, Supervised, free_port, wait_until

if TYPE_CHECKING:
    from .stack import Stack


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


class Redis(Supervised):
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

    @property
    def address(self) -> str:
        """`host:port`, as envoyproxy/ratelimit's REDIS_URL takes it."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        """`redis://host:port`, as ratelimit-counter's `--store` takes it."""
        return f"redis://{self.address}"

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

    # stop(): SIGTERM, Redis's own shutdown (which flushes the AOF when persisting).

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a crash would: no shutdown, no final save."""
        if self.process is not None:
            self.process.signal_group(signal.SIGKILL)
            self.process.stop()

    def command(self, *args: str | int, timeout: float = 2.0):
        password = getattr(self, "password", None)
        return resp_command(self.port, *args, auth=(password,) if password else None,
                            timeout=timeout)

    def keys(self, pattern: str = "*") -> list[str]:
        return sorted(self.command("KEYS", pattern))

    def get_int(self, key: str) -> int | None:
        value = self.command("GET", key)
        return None if value is None else int(value)

    def ttl(self, key: str) -> int:
        return int(self.command("TTL", key))


def read_resp(f):
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
        return None if n < 0 else [read_resp(f) for _ in range(n)]
    raise RespError(f"unexpected RESP reply {line!r}")


def resp_command(port: int, *args: str | int, auth: tuple[str, ...] | None = None,
                 tls: ssl.SSLContext | None = None, timeout: float = 2.0):
    """One command to the Redis on LOOPBACK:port (after AUTH with `auth`,
    `(password,)` or `(user, password)`, if given; over `tls` if given): its answer."""
    commands = ([("AUTH", *auth)] if auth else []) + [args]
    payload = []
    for c in commands:
        payload.append(b"*%d\r\n" % len(c))
        for a in c:
            b = str(a).encode()
            payload.append(b"$%d\r\n%s\r\n" % (len(b), b))
    with socket.create_connection((LOOPBACK, port), timeout=timeout) as raw:
        s = tls.wrap_socket(raw, server_hostname=LOOPBACK) if tls else raw
        s.sendall(b"".join(payload))
        f = s.makefile("rb")
        if auth:
            read_resp(f)
        return read_resp(f)

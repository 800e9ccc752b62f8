"""Redis as managed services run it, for the counter's tests: TLS (and
mutual TLS) with certificates the test makes, ACL users, and a master with
a replica watched by Redis Sentinel. Each started from the test process on
loopback, through the stack (which stops them).

    certs = make_certs(stack.workdir / "tls")
    redis = TlsRedis(stack, certs, users={"rl": "s3cret"})
    group = SentinelGroup(stack)   # master, replica, one sentinel
"""

from __future__ import annotations

import os
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import harness
from harness import LOOPBACK, HarnessError, free_port, wait_until

REDIS_BIN = harness.REDIS_BIN
SENTINEL_BIN = Path(os.environ.get("TRL_REDIS_SENTINEL")
                    or harness.REPO / ".deps" / "bin" / "redis-sentinel")


# ------------------------------------------------------------------ certificates

@dataclass
class Certs:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *[str(a) for a in args]], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    _openssl("req", "-x509", "-new", "-nodes", "-newkey", "ec",
             "-pkeyopt", "ec_paramgen_curve:prime256v1", "-keyout", key, "-out", crt,
             "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return crt, key


def _leaf(d: Path, name: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    key, csr, crt, extfile = (d / f"{name}.key", d / f"{name}.csr", d / f"{name}.crt",
                              d / f"{name}.ext")
    _openssl("req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-keyout", key, "-out", csr,
             "-subj", f"/CN={name}")
    extfile.write_text(ext)
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1],
             "-CAcreateserial", "-out", crt, "-days", "2", "-extfile", extfile)
    return crt, key


def make_certs(d: Path) -> Certs:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it
    signed, and another CA."""
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca(d, "ca")
    server = _leaf(d, "server", ca, "subjectAltName=IP:127.0.0.1\n"
                   "extendedKeyUsage=serverAuth\n")
    client = _leaf(d, "client", ca, "extendedKeyUsage=clientAuth\n")
    other = _ca(d, "other-ca")
    return Certs(d, ca[0], server[0], server[1], client[0], client[1], other[0])


# One command over RESP, with AUTH and TLS: the harness's.
resp = harness.resp_command


# ------------------------------------------------------------------ servers

class TlsRedis:
    """redis-server on a TLS port only. `users`: ACL users (the default
    user then off); `auth_clients`: "yes" requires a client certificate."""

    def __init__(self, stack: harness.Stack, certs: Certs, users: dict[str, str] | None = None,
                 auth_clients: str = "no"):
        self.certs = certs
        self.port = free_port()
        self.users = users or {}
        argv = [REDIS_BIN, "--bind", LOOPBACK, "--port", "0", "--tls-port", self.port,
                "--tls-cert-file", certs.server_cert, "--tls-key-file", certs.server_key,
                "--tls-ca-cert-file", certs.ca, "--tls-auth-clients", auth_clients,
                "--save", "", "--appendonly", "no", "--dir", stack.workdir]
        if self.users:
            argv += ["--user", "default", "off"]
            for name, password in self.users.items():
                argv += ["--user", name, "on", f">{password}", "~*", "&*", "+@all"]
        self.process = stack.spawn("redis-tls", argv)
        wait_until(lambda: self._answers(), "TLS redis PING", process=self.process)

    def url(self, user: str | None = None, password: str | None = None) -> str:
        """The counter's `--store` for this server, with credentials if given."""
        auth = f"{user}:{password}@" if user is not None else ""
        return f"rediss://{auth}{LOOPBACK}:{self.port}"

    def tls_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.certs.ca))
        ctx.load_cert_chain(str(self.certs.client_cert), str(self.certs.client_key))
        return ctx

    def command(self, *args):
        auth = next(iter(self.users.items()), None)
        return resp(self.port, *args, auth=auth, tls=self.tls_context())

    def _answers(self) -> bool:
        try:
            return self.command("PING") == "PONG"
        except (OSError, HarnessError):
            return False

    def held(self, part: str) -> dict[str, int]:
        """The counts of the keys whose name holds `part`."""
        return {k: int(self.command("GET", k)) for k in self.command("KEYS", "*") if part in k}


class Server:
    """A plain redis-server (a master, or the replica of one)."""

    def __init__(self, stack: harness.Stack, name: str, replica_of: int | None = None):
        self.port = free_port()
        self.dir = stack.workdir / f"{name}-{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        argv = [REDIS_BIN, "--bind", LOOPBACK, "--port", self.port, "--dir", self.dir,
                "--save", "", "--appendonly", "no"]
        if replica_of is not None:
            argv += ["--replicaof", LOOPBACK, replica_of]
        self.process = stack.spawn(name, argv)
        wait_until(lambda: self._answers(), f"{name} PING", process=self.process)

    def command(self, *args):
        return resp(self.port, *args)

    def _answers(self) -> bool:
        try:
            return self.command("PING") == "PONG"
        except (OSError, HarnessError):
            return False

    def info(self, section: str) -> dict[str, str]:
        text = self.command("INFO", section)
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def held(self, part: str) -> dict[str, int]:
        return {k: int(self.command("GET", k)) for k in self.command("KEYS", "*") if part in k}


class SentinelGroup:
    """A master, its replica, and one sentinel (quorum 1) watching them as
    `name`, quick to fail over (the master down after 1 s)."""

    def __init__(self, stack: harness.Stack, name: str = "mymaster"):
        if not SENTINEL_BIN.exists():
            raise HarnessError(f"{SENTINEL_BIN} is missing: run `make deps`")
        self.name = name
        self.master = Server(stack, "redis-master")
        self.replica = Server(stack, "redis-replica", replica_of=self.master.port)
        wait_until(lambda: self.replica.info("replication").get("master_link_status") == "up",
                   "the replica in sync", process=self.replica.process)
        self.port = free_port()
        d = stack.workdir / f"sentinel-{self.port}"
        d.mkdir(parents=True, exist_ok=True)
        conf = d / "sentinel.conf"  # the sentinel rewrites it: its own file
        conf.write_text(
            f"bind {LOOPBACK}\nport {self.port}\ndir {d}\n"
            f"sentinel monitor {name} {LOOPBACK} {self.master.port} 1\n"
            f"sentinel down-after-milliseconds {name} 1000\n"
            f"sentinel failover-timeout {name} 10000\n"
            f"sentinel parallel-syncs {name} 1\n")
        self.process = stack.spawn("redis-sentinel", [SENTINEL_BIN, conf])
        wait_until(lambda: self._knows_replica(), "the sentinel sees the replica",
                   process=self.process)

    def command(self, *args):
        return resp(self.port, *args)

    def master_port(self) -> int | None:
        try:
            got = self.command("SENTINEL", "get-master-addr-by-name", self.name)
        except (OSError, HarnessError):
            return None
        return int(got[1]) if got else None

    def _knows_replica(self) -> bool:
        try:
            replicas = self.command("SENTINEL", "replicas", self.name)
        except (OSError, HarnessError):
            return False
        for r in replicas or []:
            fields = dict(zip(r[::2], r[1::2]))
            if fields.get("port") == str(self.replica.port) and "s_down" not in fields.get(
                    "flags", ""):
                return True
        return False

    @property
    def url(self) -> str:
        return f"redis-sentinel://{LOOPBACK}:{self.port}/{self.name}"

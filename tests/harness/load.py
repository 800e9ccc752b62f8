"""Traffic: requests sent, alone, one after another or from many clients,
and what came back counted."""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple
from urllib.parse import urlsplit

import requests

from .base import TENANT_HEADER


@dataclass
class Result:
    status: int  # 0: no HTTP response at all (connection error, client timeout)
    latency_s: float
    headers: dict[str, str] = field(default_factory=dict)
    target: int = 0  # index of the URL the request went to
    started: float = 0.0  # time.time() when it was sent
    error: str = ""


_local = threading.local()


def _session() -> requests.Session:
    s = getattr(_local, "session", None)
    if s is None:
        s = requests.Session()
        _local.session = s
    return s


def send(url: str, tenant: str | None = None, headers: dict | None = None,
         timeout: float = 10.0, target: int = 0) -> Result:
    """One GET; never raises for transport errors (status 0 then)."""
    h = dict(headers or {})
    if tenant is not None:
        h[TENANT_HEADER] = tenant
    started = time.time()
    t0 = time.perf_counter()
    try:
        r = _session().get(url, headers=h, timeout=timeout)
        r.content  # read the body: the latency covers the whole response
        return Result(r.status_code, time.perf_counter() - t0,
                      {k.lower(): v for k, v in r.headers.items()}, target, started)
    except requests.RequestException as e:
        _local.session = None
        return Result(0, time.perf_counter() - t0, {}, target, started, repr(e))


def run_sequential(urls: list[str], n: int, tenant: str | None = None,
                   headers: dict | None = None) -> list[Result]:
    """n requests one after another, round-robin over `urls` (one client)."""
    return [send(urls[i % len(urls)], tenant, headers, target=i % len(urls)) for i in range(n)]


def run_concurrent(urls: list[str], n: int, clients: int, tenant: str | None = None,
                   headers: dict | None = None) -> list[Result]:
    """n requests from `clients` threads at once, round-robin over `urls`."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=clients) as pool:
        futures = [pool.submit(send, urls[i % len(urls)], tenant, headers, 10.0, i % len(urls))
                   for i in range(n)]
        return [f.result() for f in futures]


def tally(results: Iterable[Result]) -> Counter:
    return Counter(r.status for r in results)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def summary(results: list[Result]) -> str:
    """k6-like lines, one per status: `status 200 ............ count=100   avg=3.15ms  p99=8.21ms`."""
    by_status: dict[int, list[float]] = {}
    for r in results:
        by_status.setdefault(r.status, []).append(r.latency_s * 1000)
    lines = []
    for status in sorted(by_status):
        lat = by_status[status]
        label = f"status {status}" if status else "no response"
        lines.append(f"  {label} {'.' * 12} count={len(lat):<5} "
                     f"avg={sum(lat) / len(lat):.2f}ms  p99={percentile(lat, 99):.2f}ms")
    return "\n".join(lines)


class RawResponse(NamedTuple):
    """What raw_get read: the status, and the header lines as they came."""

    status: int
    lines: list[str]  # `name: value`, decoded as latin-1, in the order sent

    @property
    def headers(self) -> dict[str, str]:
        """The header lines as {lowercased name: value} (a repeated name: its last value)."""
        out: dict[str, str] = {}
        for line in self.lines:
            name, _, value = line.partition(":")
            out[name.strip().lower()] = value.strip()
        return out


def raw_get(url: str, tenant_values: Iterable[bytes | str] = (), timeout: float = 10.0) -> RawResponse:
    """One HTTP/1.1 GET written byte for byte, with the tenant header once per
    value as it is given (bytes that are not UTF-8, a value repeated, a blank
    one); the response's status and raw header lines: a client library
    would already have split an injected line into a header of its own."""
    u = urlsplit(url)
    request = b"GET " + (u.path or "/").encode() + b" HTTP/1.1\r\nHost: x\r\n"
    for v in tenant_values:
        request += TENANT_HEADER.encode() + b": " + (v.encode() if isinstance(v, str) else v) + b"\r\n"
    request += b"Connection: close\r\n\r\n"
    with socket.create_connection((u.hostname, u.port), timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    status_line, *lines = head.split("\r\n")
    return RawResponse(int(status_line.split()[1]), lines)

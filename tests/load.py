"""A small HTTP/1.1 load client for tests that need many requests with a
different header each (100,000 distinct tenants): asyncio, keep-alive
connections, one request at a time per connection. `requests` with threads
manages a few hundred requests per second here; this manages thousands.

Every response is read whole and its status counted; a connection that
breaks counts its in-flight request as status 0 and is reopened.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlsplit


@dataclass
class Blast:
    statuses: Counter = field(default_factory=Counter)
    elapsed_s: float = 0.0
    # Headers of the first response of each status, for error messages.
    samples: dict[int, dict[str, str]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.statuses.values())


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status, headers


async def _blast(url: str, n: int, connections: int,
                 headers_for: Callable[[int], dict[str, str]]) -> Blast:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = parts.path or "/"
    result = Blast()
    next_index = iter(range(n))

    async def worker() -> None:
        reader = writer = None
        for i in next_index:
            extra = "".join(f"{k}: {v}\r\n" for k, v in headers_for(i).items())
            request = (f"GET {path} HTTP/1.1\r\nhost: {host}:{port}\r\n{extra}\r\n").encode()
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(host, port)
                writer.write(request)
                status, h = await _read_response(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                status, h = 0, {}
                if writer is not None:
                    writer.close()
                reader = writer = None
            result.statuses[status] += 1
            result.samples.setdefault(status, h)
        if writer is not None:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(connections)))
    result.elapsed_s = time.perf_counter() - t0
    return result


def blast(url: str, n: int, headers_for: Callable[[int], dict[str, str]],
          connections: int = 32) -> Blast:
    """Send n GETs to url over `connections` keep-alive connections; the
    headers of request i are headers_for(i)."""
    return asyncio.run(_blast(url, n, connections, headers_for))

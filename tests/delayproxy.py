"""A TCP proxy on loopback that adds latency, for fault tests: put it between
the rate-limit service and Redis and Redis becomes slow by `delay_s` each
way, without changing either.

    proxy = DelayProxy(target_port=redis.port)   # starts listening at once
    proxy.delay_s = 0.05                          # every chunk waits 50 ms
    ...
    proxy.close()

It runs an asyncio loop in a daemon thread of the test process. Each chunk
read from one side is written to the other `delay_s` after it was read (the
delay in force when it was read), in order, so a request/response round
trip costs at least 2 × `delay_s`. Bytes are never dropped or reordered;
`chunks` counts what went through, so a test can check that its traffic
really took the slow path. `sent` holds every byte the clients sent (read,
whether or not passed on yet), so a test can wait until a command reached
the proxy (`sent.count(b"EVALSHA")`); `hold()` keeps everything read from
passing on, either way, until `release()`.
"""

from __future__ import annotations

import asyncio
import threading
import time

from harness import LOOPBACK, HarnessError, free_port

CHUNK = 65536


class DelayProxy:
    def __init__(self, target_port: int, target_host: str = LOOPBACK, delay_s: float = 0.0):
        self.target = (target_host, target_port)
        self.port = free_port()
        self.delay_s = delay_s
        self.chunks = 0
        self.connections = 0
        self.sent = bytearray()
        self._held = False
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="delayproxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise HarnessError("delay proxy did not start")
        if self._error is not None:
            raise HarnessError(f"delay proxy: {self._error}")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._accept, LOOPBACK, self.port))
        except BaseException as e:  # reported to the constructor
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter):
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self.connections += 1
        pipes = asyncio.gather(self._pipe(client_r, server_w, record=True),
                               self._pipe(server_r, client_w),
                               return_exceptions=True)
        try:
            await pipes
        except asyncio.CancelledError:
            pipes.cancel()
            client_w.close()
            server_w.close()

    def hold(self) -> None:
        """Nothing read from now on (or still queued) passes on until `release()`."""
        self._held = True

    def release(self) -> None:
        self._held = False

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    record: bool = False) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                while self._held:
                    await asyncio.sleep(0.005)
                writer.write(data)
                await writer.drain()
                self.chunks += 1

        sender = asyncio.ensure_future(send())
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                if record:
                    self.sent.extend(data)
                queue.put_nowait((time.monotonic() + self.delay_s, data))
        except OSError:
            pass
        queue.put_nowait((0.0, None))
        try:
            await sender
        except OSError:
            pass
        writer.close()

    def close(self) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

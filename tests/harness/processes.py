"""Child processes: free loopback ports, polling for readiness, and one
process in its own session, logging to a file, stopped by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

import requests

from .base import LOOPBACK, POLL_INTERVAL_S, STARTUP_DEADLINE_S, STOP_DEADLINE_S, HarnessError, StartupError


class PortAllocator:
    """Free loopback ports: bind to port 0 and read it back.

    Ports already handed out in this process are never handed out twice, so
    two components of one stack cannot collide between allocation and bind.
    """

    _lock = threading.Lock()
    _given: set[int] = set()

    @classmethod
    def take(cls) -> int:
        with cls._lock:
            for _ in range(100):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((LOOPBACK, 0))
                    port = s.getsockname()[1]
                if port not in cls._given:
                    cls._given.add(port)
                    return port
        raise HarnessError("no free port")


free_port = PortAllocator.take


# ------------------------------------------------------------------ polling

def wait_until(
    probe: Callable[[], bool],
    what: str,
    deadline_s: float = STARTUP_DEADLINE_S,
    process: "Process | None" = None,
) -> None:
    """Poll `probe` until it returns true; fail if `process` exits or time runs out."""
    end = time.monotonic() + deadline_s
    last_error: Exception | None = None
    while True:
        if process is not None and not process.alive():
            raise StartupError(
                f"{what}: {process.name} exited with code {process.returncode} "
                f"before it was ready\n{process.tail()}",
                exit_code=process.returncode,
            )
        try:
            if probe():
                return
        except Exception as e:  # connection refused while it starts, etc.
            last_error = e
        if time.monotonic() > end:
            detail = f" (last error: {last_error})" if last_error else ""
            tail = f"\n{process.tail()}" if process is not None else ""
            raise StartupError(f"{what}: not ready after {deadline_s:.0f}s{detail}{tail}")
        time.sleep(POLL_INTERVAL_S)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    return requests.get(url, timeout=timeout).status_code == 200


# ------------------------------------------------------------------ processes

class Process:
    """One child process in its own session, logging to `log_path`."""

    def __init__(self, name: str, argv: list[str], log_path: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self._log.write(f"### {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,  # own process group; no controlling terminal
        )
        self.pid = self.popen.pid
        self.frozen = False

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal_group(self, sig: int) -> None:
        """`sig` to the process's whole group (it is its session's leader)."""
        # Only while the child has not been reaped: its PID (= its process
        # group id, start_new_session) cannot have been reused before that.
        if self.popen.poll() is None:
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass

    # The name signal_group had while the harness was one file.
    _signal_group = signal_group

    def kill(self) -> int | None:
        """SIGKILL, as a crash: no shutdown work (a Redis master then hands
        nothing more to its replicas). Waits until it is reaped."""
        self.signal_group(signal.SIGKILL)
        try:
            self.popen.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            pass
        return self.popen.returncode

    def freeze(self) -> None:
        """SIGSTOP: the process keeps its sockets (connects still succeed) but never answers.

        Returns once every thread of the group is stopped: the signal is
        delivered asynchronously, and a thread still running for a moment
        after kill() returns could answer one more call."""
        self.signal_group(signal.SIGSTOP)
        self.frozen = True
        if self.popen.poll() is None:
            wait_until(lambda: group_stopped(self.pid), f"{self.name} stopped (SIGSTOP)")

    def thaw(self) -> None:
        self.signal_group(signal.SIGCONT)
        self.frozen = False

    def stop(self, deadline_s: float = STOP_DEADLINE_S) -> int | None:
        if self.popen.poll() is None:
            self.signal_group(signal.SIGCONT)  # a stopped process would not act on SIGTERM
            self.signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout=deadline_s)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.popen.wait(timeout=deadline_s)
        self.frozen = False
        if not self._log.closed:
            self._log.close()
        return self.popen.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 40) -> str:
        text = self.log_text().splitlines()[-lines:]
        state = "running" if self.alive() else f"exited {self.returncode}"
        head = f"----- {self.name} (pid {self.pid}, {state}) {self.log_path} -----"
        return "\n".join([head, *text])


class Supervised:
    """A component the tests start, stop, freeze, thaw and kill through its
    `process` (None until it starts; a restart replaces it)."""

    process: Process | None = None

    def stop(self) -> int | None:
        return self.process.stop() if self.process is not None else None

    def freeze(self) -> None:
        """SIGSTOP: its sockets stay open, nothing answers."""
        if self.process is not None:
            self.process.freeze()

    def thaw(self) -> None:
        if self.process is not None:
            self.process.thaw()

    def kill(self) -> int | None:
        return self.process.kill() if self.process is not None else None


def group_stopped(pgid: int) -> bool:
    """Every thread of every process in process group `pgid` is stopped."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            # The fields after the command name (which may hold spaces or
            # parentheses): state, ppid, pgrp, ...
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            for task in (proc / "task").iterdir():
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("T", "t", "Z", "X"):
                    return False
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return True

"""A dockerd of our own, started and stopped by PID, for the compose demo.

Mandatory flags on these machines (DESIGN.md section 4): --ip-forward=false
and --ip-masq=false, so that dockerd never turns on forwarding or NAT and no
traffic can leave the machine through it. Also --iptables=false (no chains to
leave behind: containers on one compose network reach each other over its
bridge, and published ports go through docker-proxy on 127.0.0.1) and
--bridge=none (no docker0; compose creates, and removes, its own network).
Its own --data-root (kept in .deps/docker, so images and build cache survive
between runs), a short --exec-root and socket path in /tmp (unix socket paths
are limited to 108 bytes), its own pidfile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import harness  # noqa: E402

DATA_ROOT = REPO / ".deps" / "docker"
# What dockerd 20.10 and its containerd create outside their roots whatever
# the flags: removed after a run when that run created them (and dirs are empty).
SIDE_PATHS = (Path("/etc/docker/key.json"), Path("/run/docker/plugins"), Path("/run/docker"),
              Path("/run/containerd/s"), Path("/run/containerd"))
START_DEADLINE_S = 60.0
STOP_DEADLINE_S = 30.0


def docker_cli() -> str:
    # Debian's client, matching the daemon; a newer one elsewhere on PATH
    # would work too (API negotiation), but this is what `make deps-ship` installs.
    return "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"


class Dockerd:
    def __init__(self, log_dir: Path):
        self.exec_root = Path(tempfile.mkdtemp(prefix="trl-d", dir="/tmp"))
        self.socket = self.exec_root / "d.sock"
        self.host = f"unix://{self.socket}"
        self.log_dir = log_dir
        self.side_paths_before = {p for p in SIDE_PATHS if p.exists()}
        DATA_ROOT.mkdir(parents=True, exist_ok=True)
        argv = [
            "dockerd",
            "--ip-forward=false", "--ip-masq=false",
            "--iptables=false", "--ip6tables=false", "--bridge=none",
            "--data-root", str(DATA_ROOT),
            "--exec-root", str(self.exec_root / "x"),
            "--pidfile", str(self.exec_root / "d.pid"),
            "--host", self.host,
        ]
        self.process = harness.Process("dockerd", argv, log_dir / "dockerd.log")
        self.pid = self.process.pid

    def env(self) -> dict[str, str]:
        env = dict(os.environ, DOCKER_HOST=self.host)
        env.pop("DOCKER_CONTEXT", None)
        return env

    def docker(self, *args: str, timeout: float = 600, check: bool = True,
               input: str | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([docker_cli(), *args], capture_output=True, text=True,
                              env=self.env(), timeout=timeout, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise harness.HarnessError(
                f"docker {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def wait_ready(self) -> None:
        def ready() -> bool:
            return self.socket.exists() and self.docker("version", timeout=10,
                                                        check=False).returncode == 0
        harness.wait_until(ready, "dockerd", START_DEADLINE_S, process=self.process)

    def stop(self) -> int | None:
        """SIGTERM by PID (dockerd stops its containerd and shims), then remove the exec root."""
        code = self.process.stop(deadline_s=STOP_DEADLINE_S)
        # containerd and its shims live under the exec root: none may survive dockerd.
        end = time.monotonic() + STOP_DEADLINE_S
        while our_processes(self.exec_root) and time.monotonic() < end:
            time.sleep(0.1)
        shutil.rmtree(self.exec_root, ignore_errors=True)
        for p in SIDE_PATHS:
            if p in self.side_paths_before or not p.exists():
                continue
            try:
                p.rmdir() if p.is_dir() else p.unlink()
            except OSError:
                pass  # not empty: something else uses it; reported by leftovers()
        return code

    def side_leftovers(self) -> list[str]:
        return [str(p) for p in SIDE_PATHS if p.exists() and p not in self.side_paths_before]


def our_processes(marker: Path) -> list[str]:
    """Command lines of running processes that mention `marker` (our exec root)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(marker) in cmd:
            found.append(f"{proc.name}: {cmd.strip()}")
    return found

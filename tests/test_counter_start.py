"""ratelimit-counter's start: it never runs without limits. A `--limits`
path that is missing, an empty directory, or one whose only team file does
not parse makes it exit non-zero, saying why; a directory with at least
one good file starts, and `/readyz` names the bad one. Its gRPC health
agrees with `/readyz` (NOT_SERVING while the store does not answer)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import requests

import harness
from counter import Counter
from grpc_rls import unary
from harness import LOOPBACK, free_port, wait_until

RLS = "envoy.service.ratelimit.v3.RateLimitService"
CHECK = b"/grpc.health.v1.Health/Check"
SERVING, NOT_SERVING = 1, 2
TEAM = {"x-tenant-id": {"default": {"perhour": 5}}}


def health(port: int, service: str) -> tuple[int, int | None]:
    """grpc.health.v1.Health/Check: (grpc-status, serving status or None).
    The messages are one field each: HealthCheckRequest.service (1, a
    string), HealthCheckResponse.status (1, a varint under 128)."""
    name = service.encode()
    request = (b"\x0a" + bytes([len(name)]) + name) if name else b""
    status, data, _ = unary(port, CHECK, request)
    if data is None:
        return status, None
    return status, (data[1] if data[:1] == b"\x08" else 0)


def start(limits: Path, timeout_s: float = 30) -> subprocess.CompletedProcess:
    """The counter started on `limits`, expected to exit by itself."""
    argv = [str(harness.COUNTER_BIN), "--limits", str(limits),
            "--grpc-addr", f"{LOOPBACK}:{free_port()}",
            "--http-addr", f"{LOOPBACK}:{free_port()}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)


def test_a_missing_limits_path_exits_saying_so(stack):
    missing = stack.workdir / "no-such-limits"
    r = start(missing)
    assert r.returncode != 0, r
    assert f"--limits {missing}: cannot read: No such file or directory" in r.stderr, r.stderr


def test_an_empty_limits_directory_exits_saying_so(stack):
    empty = stack.workdir / "empty-limits"
    empty.mkdir()
    (empty / "README").write_text("not a team file\n")
    r = start(empty)
    assert r.returncode != 0, r
    assert f"--limits {empty}: no team file loaded" in r.stderr, r.stderr
    assert "no team file (NAME.json) in the directory" in r.stderr, r.stderr


def test_a_team_file_that_does_not_parse_exits_with_its_errors(stack):
    limits = stack.workdir / "bad-limits"
    limits.mkdir()
    bad = limits / "d.json"
    bad.write_text('{"x-tenant-id": {"default": {"perhour": -1}}')
    r = start(limits)
    assert r.returncode != 0, r
    assert f"--limits {limits}: no team file loaded: {bad}: has errors: line " in r.stderr, \
        r.stderr
    # A single file named by --limits: the same.
    r = start(bad)
    assert r.returncode != 0, r
    assert f"--limits {bad}: no team file loaded: {bad}: has errors" in r.stderr, r.stderr


def test_one_good_file_starts_and_readyz_names_the_bad_one(stack):
    limits = stack.workdir / "mixed-limits"
    limits.mkdir()
    (limits / "bad.json").write_text("{")
    counter = Counter(stack, {"good": TEAM}, limits_dir=limits)
    r = requests.get(f"{counter.http_url}/readyz", timeout=3)
    assert r.status_code == 200, r.text
    assert "team file loaded: true (domains: good; the last good version kept of: " \
        f"{limits / 'bad.json'}: has errors" in r.text, r.text
    assert "store answers: true" in r.text, r.text
    assert health(counter.grpc_port, RLS) == (0, SERVING)
    # The good file turned bad: its last good version still served, said so.
    counter.write_team("good", "{")
    wait_until(lambda: f"{limits / 'good.json'}: has errors" in
               requests.get(f"{counter.http_url}/readyz", timeout=3).text,
               "/readyz names the file that turned bad", process=counter.process)
    assert counter.readyz() == 200
    counter.write_team("good", json.dumps(TEAM))
    wait_until(lambda: "good.json" not in
               requests.get(f"{counter.http_url}/readyz", timeout=3).text,
               "/readyz drops the file once it loads", process=counter.process)


def test_grpc_health_is_not_serving_while_readyz_is_not_200(stack):
    redis = stack.redis()
    redis.stop()
    counter = Counter(stack, {"d": TEAM}, store=f"redis://{LOOPBACK}:{redis.port}",
                      wait_ready=False)
    wait_until(lambda: "not ready until it answers" in counter.process.log_text(),
               "the counter tells why it is not ready", process=counter.process)
    r = counter.readyz_page()
    assert r.status_code == 503
    assert "team file loaded: true (domains: d)" in r.text, r.text
    assert "store answers: false (" in r.text, r.text
    for name in ("", RLS):
        assert health(counter.grpc_port, name) == (0, NOT_SERVING), name
    redis.start()
    wait_until(counter.ready, "the counter is ready once Redis answers", process=counter.process)
    for name in ("", RLS):
        assert health(counter.grpc_port, name) == (0, SERVING), name

"""Operating ratelimit-counter: gRPC health, a graceful drain on SIGTERM,
a Redis Cluster replica restarted under traffic, and a Redis password
(REDIS_AUTH). Calls go straight to the counter (tests/grpc_rls.py), with
the descriptors `generate --service counter` writes."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import struct
import threading
from collections import Counter as Tally

import h2.config
import h2.connection

import harness
from cluster import RedisCluster
from counter import Counter
from delayproxy import DelayProxy
from grpc_rls import TIMEOUT_S, call, decode_fields, encode_field, request_bytes, unary
from harness import LOOPBACK, ensure_window_room, unique, wait_until

OK, OVER = 1, 2
SERVING, NOT_SERVING = 1, 2
RLS = "envoy.service.ratelimit.v3.RateLimitService"
CHECK = b"/grpc.health.v1.Health/Check"
WATCH = b"/grpc.health.v1.Health/Watch"


def hour(tenant: str) -> list[tuple[str, str]]:
    """A tenant's per-hour descriptor: an hour window, so that a test never
    waits long for room in one (ensure_window_room)."""
    return [("generic_key", "per_hour"), ("tenant", tenant)]


def _health_request(service: str) -> bytes:
    return encode_field(1, service.encode()) if service else b""


def _health_status(message: bytes) -> int:
    return dict(decode_fields(message)).get(1, 0)


def health_check(port: int, service: str) -> tuple[int, int | None]:
    """grpc.health.v1.Health/Check: (grpc-status, serving status or None)."""
    status, data, _ = unary(port, CHECK, _health_request(service))
    return status, (None if data is None else _health_status(data))


class HealthWatch:
    """grpc.health.v1.Health/Watch on its own connection: the statuses the
    server streams, one at a time. The request is encoded by the h2 library;
    the answer's frames are read here, because h2 closes its side on a
    GOAWAY, and a graceful drain sends GOAWAY first and then finishes the
    streams under way."""

    def __init__(self, port: int, service: str):
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.sock = socket.create_connection((LOOPBACK, port), timeout=TIMEOUT_S)
        conn.initiate_connection()
        self.sid = conn.get_next_available_stream_id()
        conn.send_headers(self.sid, [
            (b":method", b"POST"), (b":scheme", b"http"), (b":path", WATCH),
            (b":authority", b"counter"), (b"content-type", b"application/grpc"),
            (b"te", b"trailers")])
        message = _health_request(service)
        conn.send_data(self.sid, b"\x00" + struct.pack(">I", len(message)) + message,
                       end_stream=True)
        self.sock.sendall(conn.data_to_send())
        self.raw = bytearray()
        self.buffer = bytearray()
        self.ended = False
        self.goaway = False

    def _send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:  # the server has closed: what it sent is still read
            pass

    def _frame(self) -> bool:
        """Reads one frame (False: the connection closed)."""
        while len(self.raw) < 9 or len(self.raw) < 9 + int.from_bytes(self.raw[:3], "big"):
            chunk = self.sock.recv(65536)
            if not chunk:
                return False
            self.raw.extend(chunk)
        n = int.from_bytes(self.raw[:3], "big")
        kind, flags = self.raw[3], self.raw[4]
        sid = int.from_bytes(self.raw[5:9], "big") & 0x7FFFFFFF
        payload = bytes(self.raw[9:9 + n])
        del self.raw[:9 + n]
        if kind == 4 and not flags & 1:  # SETTINGS: acknowledged
            self._send(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")
        elif kind == 6 and not flags & 1:  # PING: answered
            self._send(b"\x00\x00\x08\x06\x01\x00\x00\x00\x00" + payload)
        elif kind == 7:  # GOAWAY
            self.goaway = True
        elif sid == self.sid:
            if kind == 0:  # DATA
                self.buffer.extend(payload)
                if n:  # flow control: the window given back
                    inc = struct.pack(">I", n)
                    self._send(b"\x00\x00\x04\x08\x00\x00\x00\x00\x00" + inc)
                    self._send(b"\x00\x00\x04\x08\x00" + struct.pack(">I", sid) + inc)
            if kind == 3 or (kind in (0, 1) and flags & 1):  # RST_STREAM, END_STREAM
                self.ended = True
        return True

    def next(self) -> int | None:
        """The next status streamed, or None once the stream has ended."""
        while True:
            if len(self.buffer) >= 5:
                (n,) = struct.unpack(">I", bytes(self.buffer[1:5]))
                if len(self.buffer) >= 5 + n:
                    message = bytes(self.buffer[5:5 + n])
                    del self.buffer[:5 + n]
                    return _health_status(message)
            if self.ended or not self._frame():
                self.ended = True
                return None

    def close(self) -> None:
        self.sock.close()


def _refused(port: int) -> bool:
    try:
        socket.create_connection((LOOPBACK, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_grpc_health_serves_then_turns_not_serving_on_sigterm(stack):
    counter = Counter(stack, {"d": {"x-tenant-id": {"default": {"perhour": 5}}}})
    port = counter.grpc_port
    # Ready: both the server ("") and the rate-limit service are SERVING.
    assert health_check(port, "") == (0, SERVING)
    assert health_check(port, RLS) == (0, SERVING)
    assert health_check(port, "no.such.Service")[0] == 5  # NOT_FOUND
    # A client watching the service's health (as gRPC clients with health
    # checking do) sees NOT_SERVING on SIGTERM, then its stream ends, and
    # the counter exits 0: an open watch does not hold the drain.
    watches = {name: HealthWatch(port, name) for name in ("", RLS)}
    for w in watches.values():
        assert w.next() == SERVING
    counter.process.signal_group(signal.SIGTERM)
    for name, w in watches.items():
        assert w.next() == NOT_SERVING, name
        assert w.next() is None, name
        w.close()
    assert counter.process.popen.wait(timeout=10) == 0
    assert _refused(port)


def test_sigterm_finishes_the_calls_under_way(stack):
    """Calls whose script call is under way in Redis when SIGTERM comes are
    answered, what they admitted is in Redis, and the counter exits 0."""
    limit = 5
    redis = stack.redis()
    proxy = DelayProxy(target_port=redis.port)
    try:
        # A deadline far longer than Redis is held below: the calls wait.
        counter = Counter(stack, {"d": {"x-tenant-id": {"default": {"perhour": limit}}}},
                          store=f"redis://{LOOPBACK}:{proxy.port}", store_timeout_ms=30_000)
        port = counter.grpc_port
        ensure_window_room(3600, 20)
        t = unique("tenant")
        # The connection made and the script loaded: one call.
        status, r, _ = call(port, request_bytes("d", [hour(t)]))
        assert status == 0 and r["overall_code"] == OK
        proxy.hold()
        before = proxy.sent.count(b"EVALSHA")
        n = 8
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            calls = [pool.submit(call, port, request_bytes("d", [hour(t)])) for _ in range(n)]
            wait_until(lambda: proxy.sent.count(b"EVALSHA") - before == n,
                       "the counter's script calls reached Redis's proxy", process=counter.process)
            os.kill(counter.process.pid, signal.SIGTERM)
            wait_until(lambda: "stopping; finishing" in counter.process.log_text(),
                       "the counter drains", process=counter.process)
            assert not any(c.done() for c in calls)
            proxy.release()
            answers = [c.result(timeout=30) for c in calls]
        assert [a[0] for a in answers] == [0] * n, answers
        codes = sorted(a[1]["overall_code"] for a in answers)
        assert codes == [OK] * (limit - 1) + [OVER] * (n - limit + 1), answers
        assert counter.process.popen.wait(timeout=10) == 0
        (key,) = [k for k in redis.keys("trl:*") if t in k]
        assert redis.get_int(key) == limit
        assert _refused(port)
    finally:
        proxy.close()


PASSWORD = "s3cret-" + unique("pw")


def test_redis_auth_counts_exactly_and_a_wrong_password_says_why(stack):
    limit = 5
    team = {"d": {"x-tenant-id": {"default": {"perhour": limit}}}}
    redis = stack.redis(password=PASSWORD)
    url = redis.url
    counter = Counter(stack, team, store=url, env={"REDIS_AUTH": PASSWORD},
                      store_timeout_ms=1000)
    ensure_window_room(3600, 20)
    t = unique("tenant")
    codes = [call(counter.grpc_port, request_bytes("d", [hour(t)]))[1]["overall_code"]
             for _ in range(limit + 2)]
    assert codes == [OK] * limit + [OVER] * 2
    (key,) = [k for k in redis.keys("trl:*") if t in k]
    assert redis.get_int(key) == limit

    # A wrong password: the counter runs, is not ready, fails each call at
    # once with a status that says why, and its log says why.
    wrong = Counter(stack, team, store=url, env={"REDIS_AUTH": "wrong"}, name="counter-wrong",
                    store_timeout_ms=1000, wait_ready=False)
    wait_until(lambda: "not ready until it answers" in wrong.process.log_text(),
               "the counter tells why it is not ready", process=wrong.process)
    assert wrong.process.alive()
    assert wrong.readyz() == 503
    status, _, message = call(wrong.grpc_port, request_bytes("d", [hour(t)]))
    assert status == 14 and "Password authentication failed" in message, (status, message)
    log = wrong.process.log_text()
    assert f"store {url}: Redis: Password authentication failed" in log, log
    assert "not ready until it answers" in log, log
    assert redis.get_int(key) == limit


class _Sender:
    """One tenant's calls, one after another over the counters in turn,
    paced, in a thread: (phase, grpc-status, overall code) of each."""

    def __init__(self, ports: list[int], tenant: str, pace_s: float = 0.01):
        self.ports, self.pace_s = ports, pace_s
        self.message = request_bytes("d", [hour(tenant)])
        self.phase = "before"
        self.results: list[tuple[str, int, int | None]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            phase = self.phase
            status, r, _ = call(self.ports[i % len(self.ports)], self.message)
            self.results.append((phase, status, r["overall_code"] if r else None))
            i += 1
            self.stop.wait(self.pace_s)

    def count(self, phase: str) -> int:
        return sum(1 for p, _, _ in list(self.results) if p == phase)


def test_a_cluster_replica_restarted_under_traffic(stack):
    """A replica of the master that holds the tenant's counter is killed and
    restarted while the tenant's calls go on: exactly the limit admitted,
    Redis holds exactly that, and no call fails."""
    limit = 200
    team = {"d": {"x-tenant-id": {"default": {"perhour": limit}}}}
    cluster = RedisCluster.start(stack)
    url = "redis-cluster://" + cluster.url
    counters = [Counter(stack, team, store=url, name=f"counter-{i}",
                        store_timeout_ms=harness.COUNTING_TIMEOUT_MS) for i in range(2)]
    ensure_window_room(3600, 60)
    tenant = unique("tenant")
    key = harness.counter_key("d", "hour", tenant)
    master = cluster.master_of(key)
    (replica,) = cluster.replicas_of(master)
    sender = _Sender([c.grpc_port for c in counters], tenant)
    try:
        wait_until(lambda: sender.count("before") >= 30, "calls before the replica dies", 30)
        sender.phase = "down"
        replica.process.kill()

        def marked_failed() -> bool:
            line = next(ln for ln in master.command("CLUSTER", "NODES").splitlines()
                        if f"{replica.addr}@" in ln)
            return "fail" in line.split()[2].split(",")

        wait_until(marked_failed, "the cluster marks the replica failed", 30)
        wait_until(lambda: sender.count("down") >= 30, "calls while the replica is down", 30)
        sender.phase = "restarting"
        replica.start()
        wait_until(lambda: replica.role() == "slave" and cluster.healthy(),
                   "the replica back in sync", 30)
        sender.phase = "after"
        wait_until(lambda: sender.count("after") >= 30, "calls after the restart", 30)
        wait_until(lambda: len(sender.results) >= limit + 30, "the limit passed", 30)
    finally:
        sender.stop.set()
        sender.thread.join(timeout=30)
    results = sender.results
    assert [r for r in results if r[1] != 0] == [], "calls failed"
    admitted = [p for p, _, code in results if code == OK]
    print(f"calls per phase: {Tally(p for p, _, _ in results)}, "
          f"admitted per phase: {Tally(admitted)}")
    assert len(admitted) == limit
    assert [code for _, _, code in results] == [OK] * limit + [OVER] * (len(results) - limit)
    assert cluster.get_int(key) == limit


def test_a_counter_started_before_redis_is_ready_once_redis_answers(stack):
    redis = stack.redis()
    redis.stop()
    team = {"d": {"x-tenant-id": {"default": {"perhour": 5}}}}
    counter = Counter(stack, team, store=redis.url, wait_ready=False)
    wait_until(lambda: "not ready until it answers" in counter.process.log_text(),
               "the counter tells why it is not ready", process=counter.process)
    assert counter.readyz() == 503
    t = unique("tenant")
    req = request_bytes("d", [hour(t)])
    assert call(counter.grpc_port, req)[0] == 14
    redis.start()
    wait_until(counter.ready, "the counter is ready once Redis answers", process=counter.process)
    status, r, _ = call(counter.grpc_port, req)
    assert status == 0 and r["statuses"][0]["remaining"] == 4


def test_redis_auth_on_a_cluster(stack):
    limit = 5
    team = {"d": {"x-tenant-id": {"default": {"perhour": limit}}}}
    cluster = RedisCluster.start(stack, password=PASSWORD)
    url = "redis-cluster://" + cluster.url
    counter = Counter(stack, team, store=url, env={"REDIS_AUTH": PASSWORD},
                      store_timeout_ms=harness.COUNTING_TIMEOUT_MS)
    ensure_window_room(3600, 20)
    t = unique("tenant")
    req = request_bytes("d", [hour(t)])
    codes = [call(counter.grpc_port, req)[1]["overall_code"] for _ in range(limit + 2)]
    assert codes == [OK] * limit + [OVER] * 2
    assert cluster.get_int(harness.counter_key("d", "hour", t)) == limit
    wrong = Counter(stack, team, store=url, env={"REDIS_AUTH": "wrong"}, name="counter-wrong",
                    store_timeout_ms=1000, wait_ready=False)
    wait_until(lambda: "not ready until it answers" in wrong.process.log_text(),
               "the counter tells why it is not ready", process=wrong.process)
    assert wrong.readyz() == 503
    status, _, message = call(wrong.grpc_port, req)
    assert status == 14 and "Password authentication failed" in message, (status, message)
    log = wrong.process.log_text()
    assert f"store {url}: Redis: " in log and "Password authentication failed" in log, log

"""A stand-in for the rate-limit service, for the tests that need an answer
the real one never gives: a gRPC server (HTTP/2 without TLS, as Envoy's
rate-limit cluster speaks it) on loopback that answers every
`ShouldRateLimit` call OK, with one OK status per descriptor or with none
at all (as Kuadrant's Limitador answers), and that can hold its answers
until the test lets them go.

    stub = RlsStub(statuses=False)   # starts listening at once
    stub.hold = True                  # answers wait for release()
    ...
    stub.release()
    stub.calls                        # descriptors per call, in order
    stub.close()

It runs in daemon threads of the test process: one accepting, one per
connection (Envoy opens one per worker).
"""

from __future__ import annotations

import socket
import threading

import h2.config
import h2.connection
import h2.events

from grpc_rls import decode_fields
from harness import LOOPBACK

# RateLimitResponse.overall_code = OK (1); a DescriptorStatus with code OK.
OK_CODE = b"\x08\x01"


def count_descriptors(message: bytes) -> int:
    """How many `descriptors` (field 2) a RateLimitRequest holds."""
    return sum(1 for num, v in decode_fields(message) if num == 2 and isinstance(v, bytes))


def response(descriptors: int, statuses: bool) -> bytes:
    """A RateLimitResponse, OK, with an OK status per descriptor or none, framed for gRPC."""
    body = OK_CODE
    if statuses:
        body += (b"\x12" + bytes([len(OK_CODE)]) + OK_CODE) * descriptors
    return b"\x00" + len(body).to_bytes(4, "big") + body


class RlsStub:
    def __init__(self, statuses: bool = True):
        self.statuses = statuses
        self.hold = False
        self.calls: list[int] = []
        self._lock = threading.Lock()
        self._held: list[tuple["_Conn", int, int]] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((LOOPBACK, 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, name="rlsstub", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            conn = _Conn(self, sock)
            threading.Thread(target=conn.run, name="rlsstub-conn", daemon=True).start()

    def _called(self, conn: "_Conn", stream_id: int, message: bytes) -> None:
        n = count_descriptors(message[5:])
        with self._lock:
            self.calls.append(n)
            if self.hold:
                self._held.append((conn, stream_id, n))
                return
        conn.answer(stream_id, response(n, self.statuses))

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def release(self) -> None:
        """Stops holding, and answers every held call."""
        with self._lock:
            self.hold = False
            held, self._held = self._held, []
        for conn, stream_id, n in held:
            conn.answer(stream_id, response(n, self.statuses))

    def close(self) -> None:
        self._closed = True
        self._sock.close()


class _Conn:
    def __init__(self, stub: RlsStub, sock: socket.socket):
        self.stub = stub
        self.sock = sock
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        self.lock = threading.Lock()
        self.bodies: dict[int, bytes] = {}

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.sock.sendall(data)

    def answer(self, stream_id: int, body: bytes) -> None:
        with self.lock:
            try:
                self.h2.send_headers(stream_id, [(":status", "200"),
                                                 ("content-type", "application/grpc")])
                self.h2.send_data(stream_id, body)
                self.h2.send_headers(stream_id, [("grpc-status", "0")], end_stream=True)
                self._flush()
            except Exception:  # the stream or connection is gone: nothing to answer
                pass

    def run(self) -> None:
        with self.lock:
            self.h2.initiate_connection()
            self._flush()
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            done = []
            with self.lock:
                for event in self.h2.receive_data(data):
                    if isinstance(event, h2.events.DataReceived):
                        self.bodies[event.stream_id] = (
                            self.bodies.get(event.stream_id, b"") + event.data)
                        self.h2.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded):
                        done.append(event.stream_id)
                self._flush()
            for stream_id in done:
                self.stub._called(self, stream_id, self.bodies.pop(stream_id, b""))

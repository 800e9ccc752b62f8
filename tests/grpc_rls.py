"""A raw gRPC client of envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
over h2c (the h2 library of tests/requirements.txt), with the protobuf
encoded and decoded by hand (field numbers of data-plane-api rls.proto), so
that the tests can send what no real client sends: a malformed message, an
oversized call.

    status, response = call(port, request_bytes(domain, [[("generic_key", "per_minute"), ...]]))
"""

from __future__ import annotations

import socket
import struct
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events

PATH = b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
TIMEOUT_S = 10.0


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_field(num: int, payload: bytes) -> bytes:
    """Field `num` of a message, length-delimited (a string, bytes or a message)."""
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def request_bytes(domain: str, descriptors: list, hits_addend: int = 0) -> bytes:
    """descriptors: [[(key, value), ...], ...], or ([(key, value), ...], hits) pairs."""
    out = encode_field(1, domain.encode())
    for d in descriptors:
        entries, hits = (d if isinstance(d, tuple) else (d, None))
        body = b"".join(encode_field(1, encode_field(1, k.encode()) + encode_field(2, v.encode()))
                        for k, v in entries)
        if hits is not None:
            body += encode_field(3, _varint(1 << 3) + _varint(hits))
        out += encode_field(2, body)
    if hits_addend:
        out += _varint(3 << 3) + _varint(hits_addend)
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = data[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def decode_fields(data: bytes):
    """A message's fields, in order, as (field number, value) pairs."""
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _read_varint(data, i)
            yield num, v
        elif wire == 2:
            n, i = _read_varint(data, i)
            yield num, data[i:i + n]
            i += n
        else:
            raise ValueError(f"wire type {wire}")


def decode_response(data: bytes) -> dict:
    """{"overall_code": int, "statuses": [{"code", "limit", "remaining"}, ...]}"""
    out = {"overall_code": 0, "statuses": []}
    for num, v in decode_fields(data):
        if num == 1:
            out["overall_code"] = v
        elif num == 2:
            s = {"code": 0, "limit": None, "remaining": 0}
            for n2, v2 in decode_fields(v):
                if n2 == 1:
                    s["code"] = v2
                elif n2 == 2:
                    s["limit"] = dict((n3, v3) for n3, v3 in decode_fields(v2)).get(1, 0)
                elif n2 == 3:
                    s["remaining"] = v2
            out["statuses"].append(s)
    return out


def call(port: int, message: bytes) -> tuple[int, dict | None, str]:
    """One unary call on a fresh connection: (grpc-status, response or None, grpc-message)."""
    status, data, message_text = unary(port, PATH, message)
    if data is None:
        return status, None, message_text
    return status, decode_response(data), message_text


def unary(port: int, path: bytes, message: bytes) -> tuple[int, bytes | None, str]:
    """One unary call of any method on a fresh connection: (grpc-status,
    the response message's bytes or None, grpc-message)."""
    config = h2.config.H2Configuration(client_side=True)
    conn = h2.connection.H2Connection(config=config)
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        frames = _Frames()
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"http"),
                                (b":path", path), (b":authority", b"counter"),
                                (b"content-type", b"application/grpc"), (b"te", b"trailers")])
        body = b"\x00" + struct.pack(">I", len(message)) + message
        sent = 0
        while sent < len(body):
            window = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
            if window <= 0:
                sock.sendall(conn.data_to_send())
                _pump(conn, sock, {}, bytearray(), frames)
                continue
            chunk = body[sent:sent + window]
            conn.send_data(sid, chunk)
            sent += len(chunk)
            sock.sendall(conn.data_to_send())
        conn.end_stream(sid)
        sock.sendall(conn.data_to_send())
        headers: dict[bytes, bytes] = {}
        data = bytearray()
        while not _pump(conn, sock, headers, data, frames):
            pass
    status = int(headers.get(b"grpc-status", b"-1"))
    message_text = unquote(headers.get(b"grpc-message", b"").decode())
    if status != 0 or len(data) < 5:
        return status, None, message_text
    (n,) = struct.unpack(">I", bytes(data[1:5]))
    return status, bytes(data[5:5 + n]), message_text


class _Frames:
    """The server's bytes, handed to h2 frame by frame with GOAWAY left out:
    h2 closes its whole connection on a GOAWAY, and a server that drains
    gracefully sends one first, then finishes the streams under way."""

    def __init__(self) -> None:
        self.raw = bytearray()
        self.goaway = False

    def feed(self, conn, chunk: bytes) -> list:
        self.raw.extend(chunk)
        out = bytearray()
        while len(self.raw) >= 9:
            n = int.from_bytes(self.raw[:3], "big")
            if len(self.raw) < 9 + n:
                break
            frame = bytes(self.raw[:9 + n])
            del self.raw[:9 + n]
            if frame[3] == 7:
                self.goaway = True
            else:
                out.extend(frame)
        return conn.receive_data(bytes(out)) if out else []


def _pump(conn, sock, headers: dict, data: bytearray, frames: _Frames) -> bool:
    """Reads once; True when the stream ended."""
    chunk = sock.recv(65536)
    if not chunk:
        return True
    done = False
    for ev in frames.feed(conn, chunk):
        if isinstance(ev, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
            headers.update(dict(ev.headers))
        elif isinstance(ev, h2.events.DataReceived):
            data.extend(ev.data)
            conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
            done = True
    sock.sendall(conn.data_to_send())
    return done

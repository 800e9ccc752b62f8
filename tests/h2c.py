"""A minimal HTTP/2 client over cleartext (h2c, prior knowledge) for the tests
that must send header shapes no ordinary client sends: a header repeated, an
empty value, bytes that are not UTF-8. Built on the h2 protocol library
(tests/requirements.txt) with its outbound checks off, so the bytes given are
the bytes sent; Envoy's listener (codec AUTO, the default) takes HTTP/2 with
prior knowledge.

    status, headers = h2c.get("http://127.0.0.1:10000/", [(b"x-tenant-id", b"acme")])
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.events

TIMEOUT_S = 10.0


def get(url: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict[str, str]]:
    """One GET on a fresh connection; the status and the response headers."""
    u = urlsplit(url)
    config = h2.config.H2Configuration(client_side=True, validate_outbound_headers=False,
                                       normalize_outbound_headers=False,
                                       validate_inbound_headers=False)
    conn = h2.connection.H2Connection(config=config)
    with socket.create_connection((u.hostname, u.port), timeout=TIMEOUT_S) as sock:
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        request = [(b":method", b"GET"), (b":path", (u.path or "/").encode()),
                   (b":scheme", b"http"), (b":authority", u.netloc.encode())]
        conn.send_headers(1, request + list(headers), end_stream=True)
        sock.sendall(conn.data_to_send())
        status, got, done = 0, {}, False
        while not done:
            data = sock.recv(65_536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    got = {k.decode().lower(): v.decode() for k, v in event.headers}
                    status = int(got.pop(":status"))
                elif isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                    done = True
            sock.sendall(conn.data_to_send())
        return status, got

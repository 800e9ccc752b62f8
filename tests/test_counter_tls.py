"""ratelimit-counter's gRPC over TLS and mutual TLS (--tls-cert, --tls-key,
--tls-client-ca, --tls-client-san), with certificates the tests make with
openssl (tests/tlsfiles.py): exact counting for a client with a
certificate; a client without one, with one another CA signed, or with a
name not allowed, refused in the handshake; the certificate files replaced
under paced calls with no call failed and the new certificate served."""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import threading
from pathlib import Path
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import pytest

import harness
from counter import Counter
from grpc_rls import PATH, decode_response, request_bytes
from harness import LOOPBACK, ensure_window_room, free_port, unique, wait_until
from tlsfiles import CA, Pair

OK, OVER = 1, 2
TIMEOUT_S = 10.0
SERVER_NAME = "counter.test"
CLIENT_NAME = "envoy.test"


def hour(tenant: str) -> list[tuple[str, str]]:
    return [("generic_key", "per_hour"), ("tenant", tenant)]


def team(limit: int) -> dict:
    return {"x-tenant-id": {"default": {"perhour": limit}}}


class TlsChannel:
    """One gRPC connection over TLS (ALPN h2), for any number of unary
    ShouldRateLimit calls, one after another. `ca`: the server's CA;
    `client`: the client's certificate and key, or None."""

    def __init__(self, port: int, ca: Path, client: Pair | None = None,
                 server_name: str = SERVER_NAME):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cafile=str(ca))
        if client is not None:
            ctx.load_cert_chain(str(client.cert), str(client.key))
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection((LOOPBACK, port), timeout=TIMEOUT_S)
        try:
            self.sock = ctx.wrap_socket(raw, server_hostname=server_name)
        except BaseException:
            raw.close()
            raise
        self.server_cert = self.sock.getpeercert(binary_form=True)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def call(self, message: bytes) -> tuple[int, dict | None, str]:
        """(grpc-status, the decoded response or None, grpc-message)."""
        conn, sid = self.conn, self.conn.get_next_available_stream_id()
        conn.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"https"),
                                (b":path", PATH), (b":authority", SERVER_NAME.encode()),
                                (b"content-type", b"application/grpc"), (b"te", b"trailers")])
        conn.send_data(sid, b"\x00" + struct.pack(">I", len(message)) + message,
                       end_stream=True)
        self.sock.sendall(conn.data_to_send())
        headers: dict[bytes, bytes] = {}
        data = bytearray()
        done = False
        while not done:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the counter closed the connection")
            for ev in conn.receive_data(chunk):
                if isinstance(ev, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    if ev.stream_id == sid:
                        headers.update(dict(ev.headers))
                elif isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    if ev.stream_id == sid:
                        data.extend(ev.data)
                elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                    done = done or ev.stream_id == sid
            self.sock.sendall(conn.data_to_send())
        status = int(headers.get(b"grpc-status", b"-1"))
        text = unquote(headers.get(b"grpc-message", b"").decode())
        if status != 0 or len(data) < 5:
            return status, None, text
        (n,) = struct.unpack(">I", bytes(data[1:5]))
        return status, decode_response(bytes(data[5:5 + n])), text

    def close(self) -> None:
        self.sock.close()


def tls_call(port: int, message: bytes, ca: Path, client: Pair | None = None):
    """One call on a fresh connection."""
    channel = TlsChannel(port, ca, client)
    try:
        return channel.call(message)
    finally:
        channel.close()


def refused(port: int, ca: Path, client: Pair | None) -> bool:
    """Whether the counter refuses this client: the handshake, or the first
    read after it (TLS 1.3 sends the client's certificate last), fails."""
    try:
        tls_call(port, request_bytes("d", [hour(unique("refused"))]), ca, client)
    except (ssl.SSLError, ConnectionError, OSError):
        return True
    return False


@pytest.fixture
def pki(stack):
    """A CA, the counter's certificate (127.0.0.1 and counter.test), a
    client certificate for envoy.test, one for another name, and one from
    another CA."""
    d = stack.workdir / "pki"
    ca = CA.make(d, "ca")
    other_ca = CA.make(d, "other-ca")
    return {
        "ca": ca,
        "server": ca.issue(d, "server", f"IP:{LOOPBACK},DNS:{SERVER_NAME}", client=False),
        "client": ca.issue(d, "client", f"DNS:{CLIENT_NAME}", client=True),
        "stranger": ca.issue(d, "stranger", "DNS:stranger.test", client=True),
        "foreign": other_ca.issue(d, "foreign", f"DNS:{CLIENT_NAME}", client=True),
        "dir": d,
    }


def mtls_counter(stack, pki, limit: int, **kw) -> Counter:
    """A counter with mutual TLS on gRPC; the allowed client name from the
    environment (TRL_COUNTER_TLS_CLIENT_SAN), the files from the flags."""
    return Counter(stack, {"d": team(limit)}, extra_args=[
        "--tls-cert", str(pki["server"].cert), "--tls-key", str(pki["server"].key),
        "--tls-client-ca", str(pki["ca"].cert)],
        env={"TRL_COUNTER_TLS_CLIENT_SAN": f"{CLIENT_NAME},other.test"}, **kw)


def test_mutual_tls_counts_exactly_and_refuses_clients_it_does_not_know(stack, pki):
    limit = 5
    counter = mtls_counter(stack, pki, limit)
    assert "gRPC (mutual TLS) on" in counter.process.log_text()
    ensure_window_room(3600, 20)
    t = unique("tenant")
    channel = TlsChannel(counter.grpc_port, pki["ca"].cert, pki["client"])
    try:
        answers = [channel.call(request_bytes("d", [hour(t)])) for _ in range(limit + 2)]
    finally:
        channel.close()
    assert [a[0] for a in answers] == [0] * (limit + 2), answers
    assert [a[1]["overall_code"] for a in answers] == [OK] * limit + [OVER] * 2
    # Fresh connections, each its own handshake: the same count goes on.
    status, r, _ = tls_call(counter.grpc_port, request_bytes("d", [hour(t)]),
                            pki["ca"].cert, pki["client"])
    assert (status, r["overall_code"]) == (0, OVER)

    calls = counter.metrics()["trl_counter_calls_total"]
    for who in (None, pki["foreign"], pki["stranger"]):
        assert refused(counter.grpc_port, pki["ca"].cert, who), who
    # Plaintext to the TLS port: no call either.
    plain = socket.create_connection((LOOPBACK, counter.grpc_port), timeout=TIMEOUT_S)
    try:
        plain.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        assert plain.recv(65536)[:1] in (b"", b"\x15")  # closed, or a TLS alert
    except ConnectionError:
        pass
    finally:
        plain.close()
    m = counter.metrics()
    assert m["trl_counter_calls_total"] == calls, "a refused client reached the service"
    assert m["trl_counter_tls_handshakes_failed_total"] >= 4, m
    assert "TLS handshake from 127.0.0.1:" in counter.process.log_text()


def test_tls_without_client_certificates(stack, pki):
    counter = Counter(stack, {"d": team(3)}, env={
        "TRL_COUNTER_TLS_CERT": str(pki["server"].cert),
        "TRL_COUNTER_TLS_KEY": str(pki["server"].key)})
    assert "gRPC (TLS) on" in counter.process.log_text()
    ensure_window_room(3600, 20)
    t = unique("tenant")
    codes = [tls_call(counter.grpc_port, request_bytes("d", [hour(t)]), pki["ca"].cert)[1]
             ["overall_code"] for _ in range(4)]
    assert codes == [OK] * 3 + [OVER]


def _start(argv_extra: list[str], limits: Path) -> subprocess.CompletedProcess:
    argv = [str(harness.COUNTER_BIN), "--limits", str(limits),
            "--grpc-addr", f"{LOOPBACK}:{free_port()}",
            "--http-addr", f"{LOOPBACK}:{free_port()}", *argv_extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)


def test_tls_files_that_do_not_load_stop_the_start(stack, pki):
    limits = stack.workdir / "d.json"
    limits.write_text('{"x-tenant-id": {"default": {"perhour": 5}}}')
    server, client = pki["server"], pki["client"]
    # A key that is not the certificate's.
    r = _start(["--tls-cert", str(server.cert), "--tls-key", str(client.key)], limits)
    assert r.returncode != 0 and f"{server.cert} and {client.key}: " in r.stderr, r.stderr
    # A missing client CA.
    missing = pki["dir"] / "missing-ca.crt"
    r = _start(["--tls-cert", str(server.cert), "--tls-key", str(server.key),
                "--tls-client-ca", str(missing)], limits)
    assert r.returncode != 0 and f"{missing}: cannot read" in r.stderr, r.stderr
    # A certificate without its key.
    r = _start(["--tls-cert", str(server.cert)], limits)
    assert r.returncode != 0 and "--tls-key" in r.stderr, r.stderr


class _Paced:
    """Paced calls for one tenant in a thread, alternately on one long-lived
    connection and on a fresh one each: (grpc-status or the error, overall
    code or None, the certificate the fresh connection was served)."""

    def __init__(self, port: int, pki: dict, tenant: str, pace_s: float = 0.02):
        self.port, self.pki, self.pace_s = port, pki, pace_s
        self.message = request_bytes("d", [hour(tenant)])
        self.results: list[tuple[object, int | None, bytes | None]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        ca, client = self.pki["ca"].cert, self.pki["client"]
        kept = TlsChannel(self.port, ca, client)
        try:
            i = 0
            while not self.stop.is_set():
                try:
                    if i % 2:
                        fresh = TlsChannel(self.port, ca, client)
                        try:
                            status, r, _ = fresh.call(self.message)
                        finally:
                            fresh.close()
                        served = fresh.server_cert
                    else:
                        status, r, _ = kept.call(self.message)
                        served = None
                    self.results.append((status, r["overall_code"] if r else None, served))
                except (ssl.SSLError, OSError) as e:
                    self.results.append((repr(e), None, None))
                i += 1
                self.stop.wait(self.pace_s)
        finally:
            kept.close()


def test_certificates_rotated_under_paced_calls(stack, pki):
    """The server's certificate and key replaced (a new key, the same CA)
    while calls go on: no call fails, the count stays exact, and new
    connections are served the new certificate without a restart."""
    limit = 10_000
    live = Pair(pki["dir"] / "live.crt", pki["dir"] / "live.key")
    live.replace(pki["server"])
    counter = Counter(stack, {"d": team(limit)}, extra_args=[
        "--tls-cert", str(live.cert), "--tls-key", str(live.key),
        "--tls-client-ca", str(pki["ca"].cert), "--tls-client-san", CLIENT_NAME])
    ensure_window_room(3600, 60)
    old_der, new = pki["server"].der(), pki["ca"].issue(
        pki["dir"], "server-2", f"IP:{LOOPBACK},DNS:{SERVER_NAME}", client=False)
    new_der = new.der()
    assert new_der != old_der
    sender = _Paced(counter.grpc_port, pki, unique("tenant"))
    try:
        wait_until(lambda: len(sender.results) >= 20, "calls before the rotation", 30)
        before = len(sender.results)
        live.replace(new)
        wait_until(lambda: any(s == new_der for _, _, s in sender.results[before:]),
                   "a new connection served the new certificate", 30,
                   process=counter.process)
        after = len(sender.results)
        wait_until(lambda: len(sender.results) >= after + 20, "calls after the rotation", 30)
    finally:
        sender.stop.set()
        sender.thread.join(timeout=30)
    results = sender.results
    assert [r for r in results if r[0] != 0] == [], "calls failed"
    assert [code for _, code, _ in results] == [OK] * len(results)
    served = [s for _, _, s in results if s is not None]
    assert set(served) <= {old_der, new_der}
    # Once the new one is served, only the new one.
    first_new = served.index(new_der)
    assert set(served[first_new:]) == {new_der}
    assert "TLS: loaded" in counter.process.log_text()
    # The count held across it: exactly the calls made.
    status, r, _ = tls_call(counter.grpc_port, sender.message, pki["ca"].cert, pki["client"])
    assert status == 0 and r["statuses"][0]["remaining"] == limit - len(results) - 1


def _upstream_tls(client: Pair | None, ca: Path) -> str:
    """The rate-limit cluster's transport socket: an UpstreamTlsContext that
    checks the counter's certificate (CA and SAN) and shows `client`'s."""
    certs = "" if client is None else f"""
          tls_certificates:
          - certificate_chain: {{ filename: "{client.cert}" }}
            private_key: {{ filename: "{client.key}" }}"""
    return f"""    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: {SERVER_NAME}
        common_tls_context:
          alpn_protocols: ["h2"]{certs}
          validation_context:
            trusted_ca: {{ filename: "{ca}" }}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {{ exact: {SERVER_NAME} }}
"""


def test_envoy_reaches_the_counter_over_mutual_tls_and_counts_exactly(stack, pki):
    """The filter's Envoy with a hand-written UpstreamTlsContext on its
    rate-limit cluster: exact through the filter. The same Envoy without a
    client certificate is refused by the counter: the filter fails open and
    nothing is counted."""
    limit = 20
    limits = {"x-tenant-id": {"default": {"perhour": limit}}}
    gen = stack.generate(limits, service="counter")
    counter = Counter(stack, {gen.domain: limits}, extra_args=[
        "--tls-cert", str(pki["server"].cert), "--tls-key", str(pki["server"].key),
        "--tls-client-ca", str(pki["ca"].cert), "--tls-client-san", CLIENT_NAME])
    upstream = stack.upstream()
    config = gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS)
    cluster = config["rate_limit_service"]["cluster"]

    def with_tls(client: Pair | None):
        def edit(text: str) -> str:
            head = f"  - name: {cluster}\n    type: STATIC\n    connect_timeout: 1s\n"
            assert head in text, text
            return text.replace(head, head + _upstream_tls(client, pki["ca"].cert), 1)
        return edit

    envoy = stack.envoy(config, counter, upstream, edit=with_tls(pki["client"]))
    ensure_window_room(3600, 30)
    t = unique("tenant")
    results = harness.run_sequential([envoy.url], limit + 5, tenant=t)
    assert [r.status for r in results] == [200] * limit + [429] * 5, harness.summary(results)
    # Every admission decided by the counter, over TLS (the refusals after
    # the first may come from the filter's own over-limit cache).
    assert counter.group_total("admitted", gen.domain) == limit
    calls = counter.metrics()["trl_counter_calls_total"]

    bare = stack.envoy(config, counter, upstream, name="envoy-no-cert", edit=with_tls(None))
    failed = counter.metrics()["trl_counter_tls_handshakes_failed_total"]
    results = harness.run_sequential([bare.url], 3, tenant=unique("tenant"))
    assert [r.status for r in results] == [200] * 3, harness.summary(results)
    m = counter.metrics()
    assert m["trl_counter_calls_total"] == calls
    assert m["trl_counter_tls_handshakes_failed_total"] > failed

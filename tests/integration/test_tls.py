"""TLS on the listeners of ``riverbed serve`` (``--tls-cert/--tls-key[/--tls-ca]``), with real clients:
rstream over the RabbitMQ Stream TLS port (it dials the advertised TLS port), the npm streamr-client over
``wss://`` (Node trusts the test CA through NODE_EXTRA_CA_CERTS), BSON and REAM over Python's ssl, HTTPS;
plaintext clients refused on every TLS port; client certificates with ``--tls-ca``; unusable files.

The certificates are made at test time in a temporary directory (a CA, a server certificate for
127.0.0.1/localhost, a client certificate, and a client certificate of another CA); no key is committed.
"""

import asyncio
import base64
import datetime
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import bson
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from rstream import Consumer, ConsumerOffsetSpecification, OffsetSpecification, OffsetType, Producer

from procs import ServerProcess

pytestmark = pytest.mark.integration

STREAMR_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js", "streamr_scenarios.js")
CREDS = dict(username="guest", password="guest")
TLS_PORTS = ("stream-tls", "bson", "ream", "ws", "http")


def run(coro, timeout=60):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


# ------------------------------------------------------------------------------------ certificates

def _name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_pem(path, key, cert):
    with open(path + ".key", "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    with open(path + ".pem", "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    return path + ".pem", path + ".key"


def _issue(cn, issuer=None, *, ca=False, server=False):
    """A P-256 key and a certificate for ``cn``, self-signed when ``issuer`` (key, cert) is None."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    signer_key, signer_name = (key, _name(cn)) if issuer is None else (issuer[0], issuer[1].subject)
    b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(signer_name).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=2))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        b = b.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer[0].public_key()),
                            critical=False)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        b = b.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return key, b.sign(signer_key, hashes.SHA256())


class Pki:
    """The test certificates: ``ca`` (PEM path), ``server_cert``/``server_key``, ``client_cert``/
    ``client_key`` (signed by ``ca``), ``rogue_cert``/``rogue_key`` (a client of another CA)."""

    def __init__(self, d):
        ca = _issue("riverbed test CA", ca=True)
        self.ca, _ = _write_pem(os.path.join(d, "ca"), *ca)
        self.server_cert, self.server_key = _write_pem(os.path.join(d, "server"), *_issue("127.0.0.1", ca, server=True))
        self.client_cert, self.client_key = _write_pem(os.path.join(d, "client"), *_issue("test client", ca))
        rogue_ca = _issue("another CA", ca=True)
        self.rogue_cert, self.rogue_key = _write_pem(os.path.join(d, "rogue"), *_issue("rogue client", rogue_ca))

    def client_context(self, cert=False, rogue=False):
        """A client context trusting the test CA; with ``cert`` it presents the client certificate."""
        ctx = ssl.create_default_context(cafile=self.ca)
        if cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        if rogue:
            ctx.load_cert_chain(self.rogue_cert, self.rogue_key)
        return ctx


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="module")
def server(tmp_path_factory, pki):
    srv = ServerProcess(tmp_path_factory.mktemp("tls") / "data", "--stream-tls-port", "0", "--bson-port", "0",
                        "--text-port", "0", "--ws-port", "0", "--http-port", "0", "--zmq-port", "0",
                        "--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--log-level", "debug").start()
    yield srv
    assert srv.stop() == 0, srv.log()
    assert "Traceback" not in srv.log() and " ERROR " not in srv.log(), srv.log()


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory, pki):
    srv = ServerProcess(tmp_path_factory.mktemp("mtls") / "data", "--stream-tls-port", "0", "--bson-port", "0",
                        "--http-port", "0", "--tls-cert", pki.server_cert, "--tls-key", pki.server_key,
                        "--tls-ca", pki.ca).start()
    yield srv
    assert srv.stop() == 0, srv.log()
    assert "Traceback" not in srv.log(), srv.log()


# ------------------------------------------------------------------------------------ helpers

def tls_socket(port, ctx, timeout=10):
    """A blocking TLS socket to 127.0.0.1:port (the handshake done); raises ssl.SSLError/OSError."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        return ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    except BaseException:
        raw.close()
        raise


def recv_until_closed(sock, timeout=5.0):
    """Every byte the peer sends until it closes (returns the bytes) or ``timeout`` (raises)."""
    sock.settimeout(timeout)
    out = bytearray()
    while True:
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            return bytes(out)
        if not data:
            return bytes(out)
        out += data


def bson_frames(sock, n):
    out, buf = [], bytearray()
    while len(out) < n:
        while len(buf) < 4 or len(buf) < int.from_bytes(buf[:4], "little"):
            data = sock.recv(65536)
            assert data, "connection closed"
            buf += data
        size = int.from_bytes(buf[:4], "little")
        out.append(bson.decode(bytes(buf[:size])))
        del buf[:size]
    return out


def ream_lines(sock, n):
    buf = bytearray()
    while buf.count(b"\n") < n:
        data = sock.recv(65536)
        assert data, "connection closed"
        buf += data
    return buf.decode().split("\n")[:n]


async def publish_rstream(port, stream, bodies, ctx):
    """Create ``stream`` and publish ``bodies`` through one rstream Producer; returns (confirmed count,
    the advertised port of its connection, the port Metadata gives for the stream's leader)."""
    confirmed = []
    done = asyncio.Event()

    def on_confirm(status):
        confirmed.append(status.is_confirmed)
        if len(confirmed) == len(bodies):
            done.set()

    async with Producer("127.0.0.1", port, ssl_context=ctx, **CREDS) as p:
        await p.create_stream(stream, exists_ok=True)
        await p.send_batch(stream, list(bodies), on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 20)
        client = await p.default_client
        leader, _ = await client.query_leader_and_replicas(stream)
        return sum(confirmed), int(client.server_properties["advertised_port"]), leader.port


async def consume_rstream(port, stream, n, ctx):
    got = []
    done = asyncio.Event()

    async def on_message(msg, message_context):
        got.append(bytes(msg))
        if len(got) >= n:
            done.set()

    async with Consumer("127.0.0.1", port, ssl_context=ctx, **CREDS) as c:
        await c.subscribe(stream, on_message,
                          offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        await asyncio.wait_for(done.wait(), 20)
    return got


# ------------------------------------------------------------------------------------ RabbitMQ Stream

def test_stream_tls_listener_beside_plain_one(server):
    assert server.ports["stream-tls"] > 0
    assert server.ports["stream-tls"] != server.port
    assert "listening stream-tls 127.0.0.1:" in server.log()
    from riverbed.shells import config
    assert config.BY_NAME["stream_tls_port"].default == 5551


def test_rstream_publish_and_consume_over_tls(server, pki):
    port = server.ports["stream-tls"]
    bodies = [b"tls-%04d" % i for i in range(300)]
    confirmed, advertised, leader_port = run(publish_rstream(port, "tls-rstream", bodies, pki.client_context()))
    assert confirmed == len(bodies)
    # the client of the TLS port is sent back to the TLS port (OpenResponse and Metadata), so the
    # producer's and the consumer's own connections are TLS too (they would fail on the plain port)
    assert advertised == port and leader_port == port
    assert run(consume_rstream(port, "tls-rstream", len(bodies), pki.client_context())) == bodies


def test_rstream_load_balancer_mode_over_tls(server, pki):
    # behind a load balancer rstream reconnects until the advertised address is the one it wants
    port = server.ports["stream-tls"]

    async def scenario():
        async with Producer("127.0.0.1", port, ssl_context=pki.client_context(), load_balancer_mode=True,
                            **CREDS) as p:
            await p.create_stream("tls-lb", exists_ok=True)
            await p.send_wait("tls-lb", b"lb")
    run(scenario())
    assert run(consume_rstream(port, "tls-lb", 1, pki.client_context())) == [b"lb"]


def test_plain_stream_port_stays_plain_and_advertises_itself(server, pki):
    confirmed, advertised, leader_port = run(publish_rstream(server.port, "tls-plain", [b"a", b"b"], None))
    assert (confirmed, advertised, leader_port) == (2, server.port, server.port)
    # one log: what went in through the plain port comes out through the TLS port
    assert run(consume_rstream(server.ports["stream-tls"], "tls-plain", 2, pki.client_context())) \
        == [b"a", b"b"]


@pytest.mark.slow
def test_single_active_consumer_group_spans_both_ports(server, pki):
    # both RabbitMQ Stream listeners share one shell, so one SAC group has members on either port
    stream, group = "tls-sac", "g"
    run(publish_rstream(server.port, stream, [b"m%d" % i for i in range(20)], None))

    async def scenario():
        props = {"single-active-consumer": "true", "name": group}
        a_got, b_got = [], []
        b_done = asyncio.Event()

        async def listener(is_active, ctx):
            return OffsetSpecification(OffsetType.FIRST, 0)

        async def on_a(msg, ctx):
            a_got.append(bytes(msg))

        async def on_b(msg, ctx):
            b_got.append(bytes(msg))
            if len(b_got) == 20:
                b_done.set()

        a = Consumer("127.0.0.1", server.port, **CREDS)
        b = Consumer("127.0.0.1", server.ports["stream-tls"], ssl_context=pki.client_context(), **CREDS)
        await a.start()
        await b.start()
        try:
            await a.subscribe(stream, on_a, properties=props, subscriber_name=group, consumer_update_listener=listener)
            await b.subscribe(stream, on_b, properties=props, subscriber_name=group, consumer_update_listener=listener)
            await asyncio.sleep(1.0)
            assert len(a_got) == 20 and b_got == []     # the TLS member waits while the plain one is active
            await a.close()
            await asyncio.wait_for(b_done.wait(), 20)   # and takes over when it leaves
        finally:
            await b.close()
        assert b_got == a_got
    run(scenario())


def test_rstream_plaintext_client_on_tls_port_fails(server):
    # the server closes the connection at once (see the raw test below); rstream 1.1.1 does not notice a
    # close while it waits for PeerPropertiesResponse, so it fails with its own 10 s request timeout
    async def attempt():
        async with Producer("127.0.0.1", server.ports["stream-tls"], **CREDS):
            pass
    started = time.monotonic()
    with pytest.raises(Exception):
        run(attempt(), timeout=60)
    assert time.monotonic() - started < 30


def test_connections_api_over_https_shows_tls_connection(server, pki):
    async def scenario():
        async with Producer("127.0.0.1", server.ports["stream-tls"], ssl_context=pki.client_context(),
                            connection_name="tls-conn", **CREDS) as p:
            await p.create_stream("tls-conn-stream", exists_ok=True)
            await p.send_wait("tls-conn-stream", b"x")     # rstream connects its producer on first send
            return await asyncio.to_thread(https_get, server.ports["http"], "/api/connections", pki.client_context())
    status, body = run(scenario())
    assert status == 200
    by_name = {c["name"]: c for c in json.loads(body)}
    assert "tls-conn" in by_name, by_name
    assert by_name["tls-conn"]["ssl"] is True and by_name["tls-conn"]["port"] == server.ports["stream-tls"]


# ------------------------------------------------------------------------------------ the one-port shells

def https_get(port, path, ctx):
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}",
                                 headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        return r.status, r.read()


def test_https_get(server, pki):
    status, body = https_get(server.ports["http"], "/api/connections", pki.client_context())
    assert status == 200 and isinstance(json.loads(body), list)


def test_healthz_over_https_sees_every_tls_listener_accepting(server, pki):
    status, body = https_get(server.ports["http"], "/healthz", pki.client_context())
    listeners = json.loads(body)["listeners"]
    assert status == 200 and all(listeners[name] == "accepting" for name in TLS_PORTS), listeners


def test_bson_over_tls(server, pki):
    with tls_socket(server.ports["bson"], pki.client_context()) as s:
        s.sendall(bson.encode({"type": "CONNECT", "frame": {"version": "0.1"}}))
        assert bson_frames(s, 1)[0]["frame"]["ok"] is True
        s.sendall(bson.encode({"type": "PUB", "frame": {"rID": 1, "channel": "tls-bson", "event": {"k": 1}}}))
        assert bson_frames(s, 1)[0]["frame"] == {"rID": 1, "ok": True}
        s.sendall(bson.encode({"type": "SUBSCRIBE", "frame": {"rID": 2, "channel": "tls-bson",
                                                              "startPos": bson.int64.Int64(0)}}))
        sub, ev = bson_frames(s, 2)
        assert sub["type"] == "SUBRESPONSE" and sub["frame"]["ok"] is True
        assert ev["type"] == "RECEV" and ev["frame"]["pos"] == 0 and ev["frame"]["event"] == {"k": 1}


def test_ream_over_tls(server, pki):
    with tls_socket(server.ports["ream"], pki.client_context()) as s:
        assert ream_lines(s, 1) == ["REAM 1.0"]
        payload = b'{"k":"tls"}'
        s.sendall(b"EVENT PUBLISH tlsream %d\n%s\n" % (len(payload), payload))
        assert ream_lines(s, 1) == ["EVENT PUBLISHED tlsream 1"]
        s.sendall(b"EVENT SUBSCRIBE tlsream 1\n")
        assert ream_lines(s, 3)[:2] == ["EVENT SUBSCRIBED tlsream 1 1", "EVENT tlsream 1 %d" % len(payload)]


def test_ws_rest_over_https(server, pki):
    import aiohttp

    async def scenario():
        base = f"https://127.0.0.1:{server.ports['ws']}/api/v1/streams/tls-rest/data"
        async with aiohttp.ClientSession() as s:
            async with s.post(base, json=[{"k": 1}, {"k": 2}], ssl=pki.client_context()) as r:
                assert r.status == 200, await r.text()
            async with s.get(base + "/partitions/0/last?count=5", ssl=pki.client_context()) as r:
                assert r.status == 200
                return await r.json()
    msgs = run(scenario())
    # v28 MSG arrays: [28, streamId, partition, timestamp, ttl, offset, previousOffset, 27, "<json text>"]
    assert [json.loads(m[8]) for m in msgs] == [{"k": 1}, {"k": 2}], msgs


def test_streamr_client_over_wss(server, pki, node_modules):
    port = server.ports["ws"]

    async def seed():
        async with Producer("127.0.0.1", server.ports["stream-tls"], ssl_context=pki.client_context(),
                            **CREDS) as p:
            await p.create_stream("tls-wss", exists_ok=True)
        with tls_socket(server.ports["bson"], pki.client_context()) as s:
            s.sendall(bson.encode({"type": "CONNECT", "frame": {"version": "0.1"}}))
            bson_frames(s, 1)
            for i in range(3):
                s.sendall(bson.encode({"type": "PUB", "frame": {"rID": i, "channel": "tls-wss", "event": {"k": i}}}))
            assert all(f["frame"]["ok"] for f in bson_frames(s, 3))
    run(seed())
    cfg = dict(scenario="collect", url=f"wss://127.0.0.1:{port}/api/v1/ws", restUrl=f"https://127.0.0.1:{port}/api/v1",
               stream="tls-wss", n=4, resend={"resend_all": True}, publish=[{"k": "live"}], timeoutMs=20000)
    out = subprocess.run(["node", STREAMR_SCRIPT, json.dumps(cfg)], capture_output=True, text=True, timeout=40,
                         env=dict(os.environ, NODE_PATH=node_modules, NODE_EXTRA_CA_CERTS=pki.ca))
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert "exception" not in res and not res.get("timeout"), (res, out.stderr)
    assert res["ok"] and res["errors"] == [], res
    assert [g["content"]["k"] for g in res["got"]] == [0, 1, 2, "live"]


def test_streamr_client_without_trust_fails(server, node_modules):
    port = server.ports["ws"]
    cfg = dict(scenario="collect", url=f"wss://127.0.0.1:{port}/api/v1/ws", restUrl=f"https://127.0.0.1:{port}/api/v1",
               stream="tls-wss-untrusted", n=1, timeoutMs=5000)
    env = {k: v for k, v in os.environ.items() if k != "NODE_EXTRA_CA_CERTS"}
    out = subprocess.run(["node", STREAMR_SCRIPT, json.dumps(cfg)], capture_output=True, text=True, timeout=40,
                         env=dict(env, NODE_PATH=node_modules))
    res = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {}
    assert not res.get("ok"), res


# ------------------------------------------------------------------------------------ plaintext refused

PLAINTEXT_HELLO = {
    "stream-tls": b"\x00\x00\x00\x0c\x00\x11\x00\x01\x00\x00\x00\x01\x00\x00\x00\x00",
    "bson": bson.encode({"type": "CONNECT", "frame": {"version": "0.1"}}),
    "ream": b"PING\n",
    "ws": b"GET /api/v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
          b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    "http": b"GET /api/connections HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
}


@pytest.mark.parametrize("listener", TLS_PORTS)
def test_plaintext_client_refused_others_unaffected(server, pki, listener):
    port = server.ports[listener]
    with tls_socket(port, pki.client_context()) as bystander:       # a TLS client connected before
        with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
            client_port = plain.getsockname()[1]
            plain.sendall(PLAINTEXT_HELLO[listener])
            answer = recv_until_closed(plain)
        # closed with at most a TLS alert record (content type 21), never a protocol answer
        assert answer == b"" or answer[:1] == b"\x15", answer[:80]
        bystander.sendall(PLAINTEXT_HELLO[listener])
        bystander.settimeout(10)
        assert bystander.recv(65536)                               # it is still served
    # one info line names the client, the listener and OpenSSL's reason; no traceback
    what = f"127.0.0.1:{client_port}: TLS handshake failed on the {listener} listener"
    assert wait_for_log(server, what), server.log()
    [line] = [ln for ln in server.lines if what in ln]
    assert " INFO " in line and ("WRONG_VERSION_NUMBER" in line or "HTTP_REQUEST" in line), line
    assert "Traceback" not in server.log()


def wait_for_log(srv, text, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in srv.log():
            return True
        time.sleep(0.05)
    return False


def test_plain_banner_protocol_gets_nothing_before_tls(server, pki):
    # REAM greets first in plaintext; on a TLS port nothing readable may reach a plaintext client, and a
    # client stuck before its handshake delays nobody else
    with socket.create_connection(("127.0.0.1", server.ports["ream"]), timeout=10) as plain:
        plain.settimeout(1.0)
        with pytest.raises(socket.timeout):
            plain.recv(100)
        with tls_socket(server.ports["ream"], pki.client_context()) as s:
            assert ream_lines(s, 1) == ["REAM 1.0"]


def test_zmq_is_not_tls(server):
    # ZeroMQ keeps CURVE: the listener still speaks ZMTP (a greeting starting 0xff ... 0x7f) in the clear
    with socket.create_connection(("127.0.0.1", server.ports["zmq"]), timeout=10) as s:
        s.sendall(b"\xff" + b"\x00" * 8 + b"\x7f\x03")
        s.settimeout(10)
        greeting = s.recv(64)
    assert greeting[:1] == b"\xff" and greeting[9:10] == b"\x7f"


# ------------------------------------------------------------------------------------ client certificates

def refused(port, ctx, hello):
    """Whether ``port`` drops a client of ``ctx`` that sent ``hello`` without answering it. TLS 1.3: the
    server checks the client certificate after the client's side of the handshake returned, so the
    refusal shows on the first read (a TLS alert or a closed connection)."""
    try:
        with tls_socket(port, ctx) as s:
            s.sendall(hello)
            return recv_until_closed(s) == b""
    except (ssl.SSLError, ConnectionError):
        return True


@pytest.mark.parametrize("listener", ["stream-tls", "bson", "http"])
def test_client_certificate_required_with_tls_ca(mtls_server, pki, listener):
    port = mtls_server.ports[listener]
    hello = PLAINTEXT_HELLO[listener]
    assert refused(port, pki.client_context(), hello)
    assert refused(port, pki.client_context(rogue=True), hello)
    assert wait_for_log(mtls_server, f"TLS handshake failed on the {listener} listener"), mtls_server.log()
    lines = [ln for ln in mtls_server.lines if f"TLS handshake failed on the {listener} listener" in ln]
    assert any("CERTIFICATE" in ln and " INFO " in ln for ln in lines), lines
    with tls_socket(port, pki.client_context(cert=True)) as s:
        s.sendall(hello)
        s.settimeout(10)
        assert s.recv(65536)


def test_rstream_with_client_certificate(mtls_server, pki):
    port = mtls_server.ports["stream-tls"]
    confirmed, advertised, _ = run(publish_rstream(port, "mtls", [b"x"], pki.client_context(cert=True)))
    assert (confirmed, advertised) == (1, port)
    assert run(consume_rstream(port, "mtls", 1, pki.client_context(cert=True))) == [b"x"]


@pytest.mark.slow
def test_rstream_without_client_certificate_refused(mtls_server, pki):
    # refused by the server at once (the alert is checked above); rstream 1.1.1 reports it as its 10 s
    # request timeout
    started = time.monotonic()
    with pytest.raises(Exception):
        run(publish_rstream(mtls_server.ports["stream-tls"], "mtls-no", [b"x"], pki.client_context()),
            timeout=60)
    assert time.monotonic() - started < 30


def test_https_client_certificate(mtls_server, pki):
    assert https_get(mtls_server.ports["http"], "/api/connections", pki.client_context(cert=True))[0] == 200
    with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
        https_get(mtls_server.ports["http"], "/api/connections", pki.client_context())


# ------------------------------------------------------------------------------------ start-up errors

def serve_fails(tmp_path, *flags):
    cmd = [sys.executable, "-m", "riverbed.shells.cli", "serve", "--data-dir", str(tmp_path / "data"),
           "--stream-port", "0", "--bson-port", "off", "--zmq-port", "off", "--ws-port", "off", "--text-port", "off",
           "--http-port", "off", "--kafka-port", "off", "--stream-tls-port", "0", *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    return out.returncode, out.stderr


def test_bad_tls_files_exit_2(tmp_path, pki):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with open(pki.server_key, "rb") as f:
        key = serialization.load_pem_private_key(f.read(), None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"secret")))
    cases = [
        (["--tls-cert", pki.server_cert, "--tls-key", str(encrypted)], "encrypted"),   # never a prompt
        (["--tls-cert", pki.server_cert, "--tls-key", str(tmp_path / "missing.key")], "--tls-key"),
        (["--tls-cert", str(tmp_path / "missing.pem"), "--tls-key", pki.server_key], "missing.pem: no such file"),
        (["--tls-cert", pki.server_cert, "--tls-key", pki.client_key], "--tls-cert"),       # key of another cert
        (["--tls-cert", str(garbage), "--tls-key", pki.server_key], "--tls-cert"),
        (["--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--tls-ca", str(garbage)], "--tls-ca"),
        (["--tls-cert", pki.server_cert], "--tls-key"),
        (["--tls-key", pki.server_key], "--tls-cert"),
    ]
    for flags, words in cases:
        code, err = serve_fails(tmp_path, *flags)
        assert code == 2, (flags, err)
        assert "Traceback" not in err and "listening" not in err, (flags, err)
        assert "cannot start" in err and words in err, (flags, err)


def test_admin_cli_over_tls_with_tls_ca(server, pki):
    """``riverbed streams ... --uri rabbitmq-stream+tls://... --tls-ca ca.pem``: the TLS stream port, and
    the HTTPS JSON API the server names in PeerProperties, both checked against the given CA (no
    SSL_CERT_FILE); without the CA the certificate is refused with one line, exit 3."""
    port = server.ports["stream-tls"]
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "RIVERBED_TLS_CA")}

    def cli(*args, input=None):
        return subprocess.run([sys.executable, "-m", "riverbed.shells.cli", *args], input=input, capture_output=True,
                              text=True, timeout=60, env=env)
    uri = ["--uri", f"rabbitmq-stream+tls://guest:guest@localhost:{port}", "--tls-ca", pki.ca]
    r = cli("streams", "create", "tls-cli", *uri)
    assert r.returncode == 0, r.stderr
    r = cli("publish", "tls-cli", *uri, input="a\nb\n")
    assert r.returncode == 0, r.stderr
    r = cli("streams", "ls", "--json", *uri)
    assert r.returncode == 0, r.stderr
    assert [s["records"] for s in json.loads(r.stdout) if s["name"] == "tls-cli"] == [2]
    r = cli("tail", "tls-cli", "--from", "first", "--format", "raw", *uri)
    assert (r.returncode, r.stdout) == (0, "a\nb\n"), r.stderr
    r = cli("streams", "ls", "--uri", f"rabbitmq-stream+tls://guest:guest@localhost:{port}")
    assert r.returncode == 3 and "certificate" in r.stderr.lower() and len(r.stderr.splitlines()) == 1, r.stderr


def test_bson_client_connects_over_tls(server, mtls_server, pki):
    """``BsonClient.connect(..., tls_ca=...)`` (or ``ssl=`` a context) reaches a TLS-only BSON port; the
    plain client there is refused, and so is one that does not trust the server's CA."""
    from riverbed.shells.bson_tcp.client import BsonClient

    async def go():
        port = server.ports["bson"]
        async with await BsonClient.connect("127.0.0.1", port, tls_ca=pki.ca) as cl:
            await cl.publish("tls-bson-client", {"k": 1})
            sub = await cl.subscribe("tls-bson-client", start_pos=0)
            assert (await sub.get(timeout=5)).event == {"k": 1}
        with pytest.raises(ssl.SSLCertVerificationError):
            await BsonClient.connect("127.0.0.1", port, ssl=True, timeout=5)      # the system CAs: not ours
        with pytest.raises((OSError, asyncio.TimeoutError, ConnectionError)):
            await BsonClient.connect("127.0.0.1", port, timeout=3)                # plaintext on a TLS port
        # a server that wants client certificates: the caller's own context carries one
        async with await BsonClient.connect("127.0.0.1", mtls_server.ports["bson"],
                                            ssl=pki.client_context(cert=True)) as cl:
            await cl.publish("tls-bson-client", {"k": 2})
    run(go())

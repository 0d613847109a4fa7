"""Issue 21, class 3 against the real server: the requests that dropped their connection with an "internal
error" line (or got a 500) are answered with each protocol's own error, the connection goes on where the
protocol keeps it, and the server log has no "internal error" and no aiohttp "Error handling request"."""

import asyncio
import base64
import json
import socket
import struct

import aiohttp
import bson
import pytest

from procs import ServerProcess
from rawwire import RawClient, frame, s

pytestmark = pytest.mark.integration
AUTH = b"Authorization: Basic " + base64.b64encode(b"guest:guest") + b"\r\n"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("hostile") / "data", "--bson-port", "0", "--ws-port", "0",
                      "--text-port", "0", "--http-port", "0").start()
    yield s
    assert s.stop() == 0, s.log()
    assert "internal error" not in s.log().lower()
    assert "Error handling request" not in s.log()


def http_exchange(port, requests):
    """Send raw HTTP/1.1 requests one after another on one connection; the status line of each answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    out = []
    try:
        buf = b""
        for raw in requests:
            try:
                sock.sendall(raw)
            except (BrokenPipeError, ConnectionResetError):
                out.append(None)            # the server closed after the previous answer
                return out
            while b"\r\n\r\n" not in buf:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                if not data:
                    out.append(None)
                    return out
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v)
            while len(buf) < length:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("closed inside a body")
                buf += data
            buf = buf[length:]
            out.append(head.split(b"\r\n")[0].decode())
    finally:
        sock.close()
    return out


@pytest.mark.parametrize("listener, path", [("http", b"/api/streams"), ("http", b"/metrics"),
                                            ("ws", b"/api/v1/streams/x/data/partitions/0/last"),
                                            ("ws", b"/api/v1/ws")])
@pytest.mark.parametrize("header", [b"Expect: \xff\xfe", b"Upgrade: \xed\xa0\x80", b"X-Any: \x80abc",
                                    b"\xffName: v"])
def test_undecodable_headers_get_400_and_the_connection_goes_on(srv, listener, path, header):
    bad = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + AUTH + header + b"\r\n\r\n"
    good = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" if listener == "http" else \
        b"GET /api/v1/streams/nope/data/partitions/0/last HTTP/1.1\r\nHost: x\r\n\r\n"
    statuses = http_exchange(srv.ports[listener], [bad, good])
    assert statuses[0] in ("HTTP/1.1 400 Bad Request", "HTTP/1.0 400 Bad Request"), statuses   # 1.0: aiohttp's parser
    if statuses[1] is not None:                # aiohttp may close after a 400; a new request works anyway
        assert statuses[1].split()[1] in ("200", "404"), statuses
    assert http_exchange(srv.ports[listener], [good])[0].split()[1] in ("200", "404")


def test_ws_lone_surrogate_type_gets_an_error_message(srv):
    async def go():
        async with aiohttp.ClientSession() as s:
            ws = await s.ws_connect(f"http://127.0.0.1:{srv.ports['ws']}/api/v1/ws")
            await ws.send_str('{"type":"\\ud800"}')
            err = json.loads((await ws.receive(timeout=5)).data)
            assert err[1] == 7 and "surrogate" in err[3]
            await ws.send_str(json.dumps({"type": "publish", "stream": "wsok", "msg": '{"a":1}'}))
            await ws.send_str(json.dumps({"type": "resend", "stream": "wsok", "sub": "r", "resend_all": True}))
            frames = [json.loads((await ws.receive(timeout=5)).data) for _ in range(3)]
            assert [f[1] for f in frames] == [4, 1, 5]
    asyncio.run(asyncio.wait_for(go(), 30))


def test_ws_rest_post_with_a_lone_surrogate_gets_400(srv):
    body = b'{"a":"\\ud800"}'
    req = (b"POST /api/v1/streams/restx/data HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    good = b'{"a":1}'
    ok = (b"POST /api/v1/streams/restx/data HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(good), good))
    assert http_exchange(srv.ports["ws"], [req, ok]) == ["HTTP/1.1 400 Bad Request", "HTTP/1.1 200 OK"]


def test_bson_pub_with_a_sessid_array_gets_a_response(srv):
    sock = socket.create_connection(("127.0.0.1", srv.ports["bson"]), timeout=10)

    def recv():
        buf = b""
        while len(buf) < 4 or len(buf) < struct.unpack_from("<i", buf)[0]:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("closed without an answer")
            buf += data
        return bson.decode(buf)
    try:
        sock.sendall(bson.encode({"type": "CONNECT", "frame": {"version": "0.1"}}))
        assert recv()["frame"]["ok"] is True
        sock.sendall(bson.encode({"type": "PUB", "frame": {"channel": "c", "event": {"a": 1}, "rID": 1,
                                                           "sessID": [1]}}))
        r = recv()["frame"]
        assert r["ok"] is False and r["errCode"] == 6 and r["rID"] == 1
        sock.sendall(bson.encode({"type": "PUB", "frame": {"channel": "c", "event": {"a": 1}, "rID": 2}}))
        assert recv()["frame"] == {"ok": True, "rID": 2}
    finally:
        sock.close()


def test_ream_separator_line_gets_an_error_line(srv):
    sock = socket.create_connection(("127.0.0.1", srv.ports["ream"]), timeout=10)
    f = sock.makefile("rb")
    try:
        f.readline()                               # banner
        sock.sendall(b"\x1c\n")
        assert f.readline().startswith(b'ERROR "Unknown command')
        sock.sendall(b"PING\n")
        assert f.readline() == b"PONG\n"
    finally:
        f.close()
        sock.close()


def test_rmq_null_keys_get_precondition_failed(srv):
    c = RawClient(srv.port)
    try:
        c.handshake()
        null_key = struct.pack(">i", 1) + struct.pack(">h", -1) + struct.pack(">h", 1) + b"1"
        corr = c.next_corr()
        c.send(frame(0x0D, struct.pack(">I", corr) + s("s1") + null_key))                  # Create
        assert struct.unpack_from(">H", c.wait_for(0x800D, corr), 4)[0] == 0x11
        assert c.create("s1") == 0x01
        corr = c.next_corr()
        c.send(frame(0x07, struct.pack(">IB", corr, 1) + s("s1") + struct.pack(">HH", 1, 10) + null_key))  # Subscribe
        assert struct.unpack_from(">H", c.wait_for(0x8007, corr), 4)[0] == 0x11
        assert c.create("s2") == 0x01
    finally:
        c.close()


def test_refusals_are_counted_in_metrics(srv):
    """Runs after the tests above (file order): their refusals are in riverbed_rejected_total."""
    test_bson_pub_with_a_sessid_array_gets_a_response(srv)

    async def ws_refused():
        async with aiohttp.ClientSession() as s:
            ws = await s.ws_connect(f"http://127.0.0.1:{srv.ports['ws']}/api/v1/ws")
            await ws.send_str('{"type":"\\ud800"}')
            assert json.loads((await ws.receive(timeout=5)).data)[1] == 7
    asyncio.run(asyncio.wait_for(ws_refused(), 30))
    c = RawClient(srv.port)
    try:
        c.handshake()
        corr = c.next_corr()
        c.send(frame(0x0D, struct.pack(">I", corr) + s("s9") + struct.pack(">ihh", 1, -1, 0)))
        assert struct.unpack_from(">H", c.wait_for(0x800D, corr), 4)[0] == 0x11
    finally:
        c.close()
    status = http_exchange(srv.ports["http"], [b"GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: \xff\r\n\r\n"])
    assert status[0].split()[1] == "400"
    sock = socket.create_connection(("127.0.0.1", srv.ports["http"]), timeout=10)
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Connection: close\r\n\r\n")
    data = b""
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    sock.close()
    counts = {}
    for line in data.decode().splitlines():
        if line.startswith("riverbed_rejected_total{"):
            labels, value = line.rsplit(" ", 1)
            counts[labels] = float(value)
    for listener, reason in (("bson", "field"), ("ws", "encoding"), ("stream", "field"), ("http", "encoding")):
        key = f'riverbed_rejected_total{{listener="{listener}",reason="{reason}"}}'
        assert counts.get(key, 0) >= 1, (key, counts)

"""The named size limits of every listener but RabbitMQ Stream (tests/integration/test_limits_rmq.py)
against one real ``riverbed serve`` with small limits: an oversized BSON frame, WebSocket message, REAM
declared payload and request line, ZeroMQ message (too big, too many parts) and HTTP body each get the
protocol's own error, the refusal is counted in ``riverbed_rejected_total{listener,reason}``, the
server's peak memory stays flat (VmHWM, reset before the oversized inputs) and a well-behaved client of
the same listener is served right after."""

import asyncio
import json
import socket
import struct
import time
import urllib.error
import urllib.request

import aiohttp
import bson
import pytest
import zmq

from procs import ServerProcess
from test_limits_rmq import proc_status, reset_peak, rejected, metrics

pytestmark = pytest.mark.integration

LIMIT = 64 << 10
BIG = 8 << 20           # what the hostile clients send (or declare) against a 64 KiB limit
MAX_EXTRA_PEAK_KB = 20 * 1024


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("limits-all") / "data", "--http-port", "0", "--bson-port", "0",
                      "--ws-port", "0", "--text-port", "0", "--zmq-port", "0",
                      "--bson-max-frame", "64KiB", "--ws-max-frame", "64KiB", "--text-max-payload", "64KiB",
                      "--text-max-line", "4KiB", "--zmq-max-message", "64KiB", "--zmq-max-parts", "8",
                      "--http-max-body", "64KiB").start()
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture
def flat_memory(srv):
    """The server's peak RSS may grow by under 20 MB during the test."""
    time.sleep(0.1)
    base = proc_status(srv.pid, "VmRSS")
    reset_peak(srv.pid)
    yield
    extra = proc_status(srv.pid, "VmHWM") - base
    print(f"extra peak {extra} kB")
    assert extra < MAX_EXTRA_PEAK_KB, f"extra peak memory {extra} kB"
    assert srv.proc.poll() is None


def counted(srv, listener, reason):
    return rejected(metrics(srv), listener, reason)


# ------------------------------------------------------------------------------------------------ BSON

def bson_connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(bson.encode({"type": "CONNECT", "frame": {"version": "0.1"}}))
    return s, bson_recv(s)


def bson_recv(s):
    buf = b""
    while True:
        if len(buf) >= 4 and len(buf) >= struct.unpack_from("<i", buf)[0]:
            return bson.decode(buf[:struct.unpack_from("<i", buf)[0]])
        chunk = s.recv(1 << 16)
        if not chunk:
            raise EOFError
        buf += chunk


def test_bson_oversized_document(srv, flat_memory):
    before = counted(srv, "bson", "frame_size")
    s, r = bson_connect(srv.ports["bson"])
    assert r["frame"]["ok"] is True
    # the declared length alone is refused: the body is never buffered
    s.sendall(struct.pack("<i", BIG) + b"\x00" * LIMIT)
    r = bson_recv(s)
    assert r["type"] == "RESPONSE" and r["frame"]["ok"] is False and r["frame"]["errCode"], r
    s.close()
    # a frame just at the limit is still read (and answered: an unknown type, not a size error)
    s, r = bson_connect(srv.ports["bson"])
    doc = bson.encode({"type": "PING", "frame": {"pad": "x" * (LIMIT - 100)}})
    assert len(doc) <= LIMIT
    s.sendall(doc)
    s.sendall(bson.encode({"type": "PING", "frame": {}}))
    assert bson_recv(s)["type"] == "PING"          # the server answers PING with PING
    s.close()
    assert counted(srv, "bson", "frame_size") == before + 1


# ------------------------------------------------------------------------------------------- WebSocket

def test_websocket_oversized_message(srv, flat_memory):
    before = counted(srv, "ws", "frame_size")

    async def main():
        url = f"http://127.0.0.1:{srv.ports['ws']}/api/v1/ws"
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(url, max_msg_size=0) as ws:
                # 3x the limit: refused from the frame header, and small enough to be in the socket
                # buffers when the server closes, so the client reads the close code
                await ws.send_str(json.dumps({"type": "publish", "stream": "w", "msg": "x" * (3 * LIMIT)}))
                msg = await ws.receive(timeout=10)
                assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), msg
                assert ws.close_code == 1009
            async with s.ws_connect(url) as ws:     # a well-behaved client is served
                await ws.send_str(json.dumps({"type": "subscribe", "stream": "w"}))
                assert json.loads((await ws.receive(timeout=10)).data)[1] == 2
            # REST bodies are bounded by --http-max-body on the WebSocket listener too
            async with s.post(f"http://127.0.0.1:{srv.ports['ws']}/api/v1/streams/w/data",
                              data=b"x" * BIG) as r:
                assert r.status == 413
    asyncio.run(main())
    assert counted(srv, "ws", "frame_size") == before + 2


# ------------------------------------------------------------------------------------------------ REAM

class Ream:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.f = self.sock.makefile("rb")
        self.banner = self.f.readline()

    def line(self):
        return self.f.readline().decode().rstrip("\n")

    def closed_within(self, seconds):
        self.sock.settimeout(seconds)
        try:
            while self.sock.recv(65536):
                pass
            return True
        except socket.timeout:
            return False
        except ConnectionResetError:
            return True


def test_ream_declared_size_and_long_line(srv, flat_memory):
    size_before = counted(srv, "ream", "frame_size")
    line_before = counted(srv, "ream", "string_length")
    bad = Ream(srv.ports["ream"])
    bad.sock.sendall(b"EVENT PUBLISH huge %d\n" % BIG)
    assert bad.line() == (f'EVENT NON PUBLISHED huge "Message too large: {BIG} bytes declared, '
                          f'the limit is {LIMIT}"')
    assert bad.closed_within(5)
    bad = Ream(srv.ports["ream"])
    bad.sock.sendall(b"PING " + b"x" * (64 << 10))       # no newline, past the 4 KiB line limit
    assert bad.line().startswith("ERROR ")
    assert bad.closed_within(5)
    good = Ream(srv.ports["ream"])
    good.sock.sendall(b"PING\n")
    assert good.line() == "PONG"
    assert counted(srv, "ream", "frame_size") == size_before + 1
    assert counted(srv, "ream", "string_length") == line_before + 1


# --------------------------------------------------------------------------------------------- ZeroMQ

def test_zmq_too_many_parts_and_too_big(srv, flat_memory):
    parts_before = counted(srv, "zmq", "parts")
    size_before = counted(srv, "zmq", "frame_size")
    ctx = zmq.Context()
    try:
        d = ctx.socket(zmq.DEALER)
        d.linger = 0
        d.connect(f"tcp://127.0.0.1:{srv.ports['zmq']}")

        def call(frames):
            d.send_multipart(frames)
            assert d.poll(5000), "no reply"
            return d.recv_multipart()

        many = [b""] + [b"NOOP"] + [b"x"] * 10_000          # 10,002 parts against a limit of 8
        assert call(many)[1] == b"ERROR"
        two_big = [b"", b"PUT", b"TOPIC", b"t", b"x" * (40 << 10), b"y" * (40 << 10)]   # 80 KiB in parts of 40
        assert call(two_big)[1] == b"ERROR"
        assert call([b"", b"NOOP", b"ID", b"after"])[1] == b"OK"      # the same client goes on
        # one part over ZMQ_MAXMSGSIZE: ZeroMQ itself drops that peer; the server and others are fine
        big = ctx.socket(zmq.DEALER)
        big.linger = 0
        big.connect(f"tcp://127.0.0.1:{srv.ports['zmq']}")
        big.send_multipart([b"", b"NOOP", b"z" * BIG])
        assert not big.poll(500)
        big.close()
        assert call([b"", b"NOOP", b"ID", b"again"])[1] == b"OK"
        d.close()
    finally:
        ctx.destroy(linger=0)
    assert counted(srv, "zmq", "parts") == parts_before + 1
    assert counted(srv, "zmq", "frame_size") == size_before + 1


# ----------------------------------------------------------------------------------------------- HTTP

def test_http_oversized_body(srv, flat_memory):
    before = counted(srv, "http", "frame_size")
    req = urllib.request.Request(f"http://127.0.0.1:{srv.ports['http']}/api/connections", data=b"x" * BIG,
                                 method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 413
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.ports['http']}/healthz", timeout=10) as r:
        assert r.status == 200
    assert counted(srv, "http", "frame_size") == before + 1

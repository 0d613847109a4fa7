"""Issue 21, class 2: one record must never stop the readers of the records after it.

Records nested deeper than ``--max-depth`` (default 64) are written straight through RabbitMQ Stream,
which stores what a client sends (so no publish-time check is in the way, as with data written before the
limit existed): a BSON event 600 documents deep (4.8 KB) in an AMQP message labeled application/bson, a
JSON text 600 deep labeled application/json, and a raw AMQP amqp-value of lists nested 600 deep. After
each comes a normal record. Every reader gets all six: the deep ones in the raw form of DESIGN.md
("neither": ``{"base64": ...}`` in JSON, ``{"data": Binary}`` in BSON, the data frames unchanged in
ZeroMQ), the normal ones as usual. And every protocol that takes structured payloads refuses a too-deep
one at publish with its own error, keeping the connection.
"""

import asyncio
import base64
import json
import socket
import time
import urllib.request

import aiohttp
import bson
import pytest
import zmq
from rstream import AMQPMessage, Producer
from rstream._pyamqp.message import Properties

from procs import ServerProcess
from riverbed.shells.bson_tcp.client import BsonClient, BsonError

pytestmark = pytest.mark.integration
CREDS = dict(username="guest", password="guest")
DEEP = 600


def run(coro, timeout=60):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def deep_doc(n):
    d = {"x": 1}
    for _ in range(n - 1):
        d = {"a": d}
    return d


def deep_json(n):
    return ('{"a":' * (n - 1) + '{"x":1}' + "}" * (n - 1)).encode()


def deep_amqp_value(n):
    """``00 53 77`` + lists (list32) nested ``n`` deep around a null: an amqp-value section."""
    v = b"\x40"
    for _ in range(n):
        v = b"\xd0" + (4 + len(v)).to_bytes(4, "big") + (1).to_bytes(4, "big") + v
    return b"\x00\x53\x77" + v


DEEP_BSON = bson.encode(deep_doc(DEEP))
DEEP_JSON = deep_json(DEEP)
DEEP_AMQP = deep_amqp_value(DEEP)


def b64(data):
    return base64.b64encode(data).decode()


# (what the RabbitMQ Stream client sends, the record's payload: its data section or the raw record)
RECORDS = [
    (AMQPMessage(body=DEEP_BSON, properties=Properties(content_type=b"application/bson")), DEEP_BSON),
    (AMQPMessage(body=bson.encode({"n": 1}), properties=Properties(content_type=b"application/bson")), None),
    (AMQPMessage(body=DEEP_JSON, properties=Properties(content_type=b"application/json")), DEEP_JSON),
    (AMQPMessage(body=b'{"n":2}', properties=Properties(content_type=b"application/json")), None),
    (DEEP_AMQP, DEEP_AMQP),
    (b'{"n":3}', None),
]
# each record as JSON text: the deep ones {"base64": payload}
JSON_TEXTS = [json.dumps({"base64": b64(p)}, separators=(",", ":")) if p is not None else t
              for (_, p), t in zip(RECORDS, [None, '{"n":1}', None, '{"n":2}', None, '{"n":3}'])]
# ... and as BSON documents: the deep ones {"data": Binary(payload)} (binary subtype 0 decodes as bytes)
BSON_DOCS = [{"data": p} if p is not None else d
             for (_, p), d in zip(RECORDS, [None, {"n": 1}, None, {"n": 2}, None, {"n": 3}])]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("poison") / "data", "--bson-port", "0", "--ws-port", "0",
                      "--text-port", "0", "--zmq-port", "0", "--http-port", "0").start()
    yield s
    assert s.stop() == 0, s.log()
    assert "internal error" not in s.log()


_n = [0]


def fresh(prefix="poison"):
    _n[0] += 1
    return f"{prefix}{_n[0]}x{time.monotonic_ns() % 100000}"


async def write_records(srv, stream):
    async with Producer("127.0.0.1", srv.port, **CREDS) as p:
        await p.create_stream(stream, exists_ok=True)
        for message, _ in RECORDS:
            await p.send_wait(stream, message)


def written(srv):
    stream = fresh()
    run(write_records(srv, stream))
    return stream


# ------------------------------------------------------------------------------------------ readers

async def ws_connect(s, srv):
    return await s.ws_connect(f"http://127.0.0.1:{srv.ports['ws']}/api/v1/ws")


async def ws_recv(ws, timeout=5):
    return json.loads((await ws.receive(timeout=timeout)).data)


def test_ws_live_subscriber_gets_the_records_after_a_deep_one(srv):
    stream = fresh()

    async def go():
        async with aiohttp.ClientSession() as s:
            ws = await ws_connect(s, srv)
            await ws.send_str(json.dumps({"type": "subscribe", "stream": stream}))     # creates it
            assert (await ws_recv(ws))[1] == 2
            await write_records(srv, stream)
            msgs = [(await ws_recv(ws))[3] for _ in RECORDS]
            assert [m[8] for m in msgs] == JSON_TEXTS
            assert [m[5] for m in msgs] == list(range(len(RECORDS)))
    run(go())


def test_ws_resend_gets_the_records_after_a_deep_one(srv):
    stream = written(srv)

    async def go():
        async with aiohttp.ClientSession() as s:
            ws = await ws_connect(s, srv)
            await ws.send_str(json.dumps({"type": "resend", "stream": stream, "sub": "s1", "resend_all": True}))
            assert (await ws_recv(ws))[1] == 4                       # resending
            frames = [await ws_recv(ws) for _ in RECORDS]
            assert [f[1] for f in frames] == [1] * len(RECORDS)
            assert [f[3][8] for f in frames] == JSON_TEXTS
            assert (await ws_recv(ws))[1] == 5                       # resent
    run(go())


def test_ws_rest_last_answers_with_the_deep_record_raw(srv):
    stream = written(srv)
    url = f"http://127.0.0.1:{srv.ports['ws']}/api/v1/streams/{stream}/data/partitions/0/last?count=6"
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        msgs = json.loads(r.read())
    assert [m[8] for m in msgs] == JSON_TEXTS


def test_http_records_route_answers_with_the_deep_record_raw(srv):
    stream = written(srv)
    req = urllib.request.Request(f"http://127.0.0.1:{srv.ports['http']}/api/streams/{stream}/records?last=6",
                                 headers={"Authorization": "Basic " + b64(b"guest:guest")})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        recs = json.loads(r.read())
    assert [r["offset"] for r in recs] == list(range(6))
    assert [r["kind"] for r in recs] == ["hex", "bson", "hex", "json", "hex", "json"]
    assert json.loads(recs[1]["body"]) == {"n": 1} and json.loads(recs[5]["body"]) == {"n": 3}


class Ream:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = bytearray()
        self.line()                                   # banner

    def send(self, data):
        self.sock.sendall(data)

    def line(self):
        while b"\n" not in self.buf:
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError
            self.buf += data
        i = self.buf.index(b"\n")
        out = bytes(self.buf[:i])
        del self.buf[:i + 1]
        return out.decode()

    def exact(self, n):
        while len(self.buf) < n + 1:
            self.buf += self.sock.recv(1 << 20)
        out = bytes(self.buf[:n])
        del self.buf[:n + 1]
        return out

    def close(self):
        self.sock.close()


def test_ream_subscriber_gets_the_records_after_a_deep_one(srv):
    stream = written(srv)
    c = Ream(srv.ports["ream"])
    try:
        c.send(f"EVENT SUBSCRIBE {stream} 1\n".encode())
        assert c.line() == f"EVENT SUBSCRIBED {stream} 1 6"
        bodies = []
        for i in range(len(RECORDS)):
            head = c.line().split()
            assert head[:3] == ["EVENT", stream, str(i + 1)]
            bodies.append(c.exact(int(head[3])).decode())
        assert bodies == JSON_TEXTS
    finally:
        c.close()


def test_bson_subscriber_gets_the_records_after_a_deep_one(srv):
    stream = written(srv)

    async def go():
        async with await BsonClient.connect("127.0.0.1", srv.ports["bson"]) as c:
            sub = await c.subscribe(stream, start_pos=0)
            got = []
            async for ev in sub:
                got.append(ev.event)
                if len(got) == len(RECORDS):
                    break
            assert got == BSON_DOCS
    run(go())


def test_zmq_subscriber_gets_the_records_after_a_deep_one(srv):
    stream = written(srv)
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(f"tcp://127.0.0.1:{srv.ports['zmq']}")
        sock.send_multipart([b"", b"SUB", b"ID", b"s", b"X-OFFSET", b"0", b"", stream.encode()])
        got = []
        while len(got) < 1 + len(RECORDS):
            assert sock.poll(5000), got
            got.append(sock.recv_multipart()[1:])
        assert got[0] == [b"OK", b"ID", b"s"]
        bodies = [m[-1] for m in got[1:]]
        assert bodies == [DEEP_BSON, bson.encode({"n": 1}), DEEP_JSON, b'{"n":2}', DEEP_AMQP, b'{"n":3}']
    finally:
        ctx.destroy(linger=0)


def test_render_fallbacks_are_counted_in_metrics(srv):
    written(srv)
    test_ream_subscriber_gets_the_records_after_a_deep_one(srv)
    req = urllib.request.Request(f"http://127.0.0.1:{srv.ports['http']}/metrics",
                                 headers={"Authorization": "Basic " + b64(b"guest:guest")})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    counts = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line.startswith("riverbed_render_fallback_total{")}
    assert counts.get('riverbed_render_fallback_total{reason="depth",target="json"}', 0) >= 2, counts


# ---------------------------------------------------------------------------------- publish refusal

def test_bson_pub_too_deep_is_refused_and_the_connection_goes_on(srv):
    channel = fresh("bdeep")

    async def go():
        async with await BsonClient.connect("127.0.0.1", srv.ports["bson"]) as c:
            for depth in (65, DEEP):
                with pytest.raises(BsonError) as e:
                    await c.publish(channel, deep_doc(depth))
                assert e.value.code == 6 and "deeper than the limit of 64" in str(e.value)
            await c.publish(channel, deep_doc(64))                 # at the limit: stored
            await c.publish(channel, {"n": 1})
            sub = await c.subscribe(channel, start_pos=0)
            got = []
            async for ev in sub:
                got.append(ev.event)
                if len(got) == 2:
                    break
            assert got == [deep_doc(64), {"n": 1}]
    run(go())


def test_ws_publish_too_deep_is_refused_with_an_error_message(srv):
    stream = fresh("wdeep")

    async def go():
        async with aiohttp.ClientSession() as s:
            ws = await ws_connect(s, srv)
            await ws.send_str(json.dumps({"type": "publish", "stream": stream, "msg": deep_json(65).decode()}))
            err = await ws_recv(ws)
            assert err[1] == 7 and "deeper than the limit of 64" in err[3]
            await ws.send_str(json.dumps({"type": "publish", "stream": stream, "msg": deep_json(64).decode()}))
            await ws.send_str(json.dumps({"type": "resend", "stream": stream, "sub": "r", "resend_all": True}))
            frames = [await ws_recv(ws) for _ in range(3)]
            assert [f[1] for f in frames] == [4, 1, 5]
            assert frames[1][3][8] == deep_json(64).decode()
    run(go())


def test_ws_rest_post_too_deep_is_refused_400(srv):
    stream = fresh("rdeep")
    url = f"http://127.0.0.1:{srv.ports['ws']}/api/v1/streams/{stream}/data"
    for body in (deep_json(65), b"[" + deep_json(65) + b"]", deep_json(5000)):
        req = urllib.request.Request(url, data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400 and "deeper than the limit" in e.value.read().decode()
    req = urllib.request.Request(url, data=b"[" + deep_json(64) + b"]", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def test_ream_publish_too_deep_is_refused_and_the_connection_goes_on(srv):
    stream = fresh("tdeep")
    c = Ream(srv.ports["ream"])
    try:
        for depth in (65, DEEP):
            body = deep_json(depth)
            c.send(b"EVENT PUBLISH %s %d\n%s\n" % (stream.encode(), len(body), body))
            assert c.line() == f'EVENT NON PUBLISHED {stream} "Invalid JSON: nested deeper than the limit of 64"'
        body = deep_json(64)
        c.send(b"EVENT PUBLISH %s %d\n%s\n" % (stream.encode(), len(body), body))
        assert c.line() == f"EVENT PUBLISHED {stream} 1"
    finally:
        c.close()


def test_max_depth_flag_sets_the_one_limit_for_publish_and_render(tmp_path):
    s = ServerProcess(tmp_path / "data", "--bson-port", "0", "--ws-port", "0", "--max-depth", "8").start()
    try:
        async def go():
            async with await BsonClient.connect("127.0.0.1", s.ports["bson"]) as c:
                with pytest.raises(BsonError) as e:
                    await c.publish("d8", deep_doc(9))          # under the fast path's own bound of 64
                assert e.value.code == 6 and "deeper than the limit of 8" in str(e.value)
                await c.publish("d8", deep_doc(8))
            async with aiohttp.ClientSession() as http:
                ws = await http.ws_connect(f"http://127.0.0.1:{s.ports['ws']}/api/v1/ws")
                await ws.send_str(json.dumps({"type": "publish", "stream": "d8", "msg": deep_json(9).decode()}))
                assert "deeper than the limit of 8" in (await ws_recv(ws))[3]
            async with Producer("127.0.0.1", s.port, **CREDS) as p:       # stored as sent: rendered raw
                await p.send_wait("d8", AMQPMessage(body=bson.encode(deep_doc(9)),
                                                    properties=Properties(content_type=b"application/bson")))
            async with aiohttp.ClientSession() as http:
                ws = await http.ws_connect(f"http://127.0.0.1:{s.ports['ws']}/api/v1/ws")
                await ws.send_str(json.dumps({"type": "resend", "stream": "d8", "sub": "r", "resend_all": True}))
                frames = [await ws_recv(ws) for _ in range(4)]
                assert [f[1] for f in frames] == [4, 1, 1, 5]
                assert json.loads(frames[1][3][8]) == deep_doc(8)
                assert json.loads(frames[2][3][8]) == {"base64": b64(bson.encode(deep_doc(9)))}
        run(go())
    finally:
        assert s.stop() == 0, s.log()

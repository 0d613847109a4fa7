"""The WebSocket JSON listener (Streamr v28) of ``riverbed serve`` through a raw WebSocket client (aiohttp):
every request, resend variant, error text, partitions, bad input, slow clients, REST, shutdown."""

import asyncio
import json
import os
import socket
import time

import aiohttp
import pytest

from procs import ServerProcess

pytestmark = pytest.mark.integration


def run(coro, timeout=60):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("ws") / "data", "--ws-port", "0", "--ws-max-frame", "65536",
                        "--ws-send-buffer", "262144").start()
    yield srv
    code = srv.stop()
    assert code == 0, srv.log()


class Ws:
    """A raw client: ``send(obj)``, ``recv()`` (one decoded frame or None after ``timeout``)."""

    def __init__(self, ws):
        self.ws = ws

    async def send(self, obj):
        await self.ws.send_str(obj if isinstance(obj, str) else json.dumps(obj))

    async def recv(self, timeout=2.0):
        try:
            m = await self.ws.receive(timeout=timeout)
        except asyncio.TimeoutError:
            return None
        if m.type != aiohttp.WSMsgType.TEXT:
            return ("closed", m.type, m.data, m.extra)
        return json.loads(m.data)

    async def recv_n(self, n, timeout=5.0):
        out = []
        for _ in range(n):
            f = await self.recv(timeout)
            if f is None:
                break
            out.append(f)
        return out

    async def quiet(self, timeout=0.3):
        return await self.recv(timeout)


async def connect(session, srv):
    return Ws(await session.ws_connect(f"http://127.0.0.1:{srv.ports['ws']}/api/v1/ws", autoping=True))


def scenario(srv, fn, timeout=60):
    async def main():
        async with aiohttp.ClientSession() as s:
            return await fn(s)
    return run(main(), timeout)


def test_log_line_and_default_port(server):
    assert server.ports["ws"] > 0
    from riverbed.shells import config
    assert config.BY_NAME["ws_port"].default == 8890


def test_subscribe_publish_unsubscribe(server):
    async def go(s):
        a, b = await connect(s, server), await connect(s, server)
        await a.send({"type": "subscribe", "stream": "raw1"})
        assert await a.recv() == [0, 2, "", {"stream": "raw1", "partition": 0}]
        await b.send({"type": "subscribe", "stream": "raw1", "partition": 0})
        assert await b.recv() == [0, 2, "", {"stream": "raw1", "partition": 0}]
        t0 = int(time.time() * 1000)
        await a.send({"type": "publish", "stream": "raw1", "msg": '{"hello": "wörld"}'})
        await a.send({"type": "publish", "stream": "raw1", "msg": "[1,2]", "ts": 1533924184016})
        for c in (a, b):
            f1, f2 = await c.recv_n(2)
            assert f1[:3] == [0, 0, ""] and f1[3][:3] == [28, "raw1", 0]
            assert f1[3][5:] == [0, None, 27, '{"hello": "wörld"}'] and t0 <= f1[3][3] <= t0 + 5000
            assert f2[3] == [28, "raw1", 0, 1533924184016, 0, 1, 0, 27, "[1,2]"]
        await a.send({"type": "unsubscribe", "stream": "raw1"})
        assert await a.recv() == [0, 3, "", {"stream": "raw1", "partition": 0}]
        await b.send({"type": "publish", "stream": "raw1", "msg": "3"})
        assert (await b.recv())[3][5:7] == [2, 1]
        assert await a.quiet() is None
        await a.send({"type": "unsubscribe", "stream": "raw1"})
        assert await a.recv() == [0, 7, "", {"error": "Not subscribed",
                                             "request": {"type": "unsubscribe", "stream": "raw1"}}]
    scenario(server, go)


def test_resend_variants(server):
    async def go(s):
        c = await connect(s, server)
        for i in range(20):
            await c.send({"type": "publish", "stream": "raw2", "msg": json.dumps({"i": i}), "ts": 10_000 + 100 * i})

        async def resend(sub, **kw):
            await c.send(dict({"type": "resend", "stream": "raw2", "sub": sub}, **kw))
            first = await c.recv()
            if first[1] == 6:
                return first, []
            assert first == [0, 4, "", {"stream": "raw2", "partition": 0, "sub": sub}]
            msgs = []
            while True:
                f = await c.recv()
                if f[1] == 5:
                    assert f == [0, 5, "", {"stream": "raw2", "partition": 0, "sub": sub}]
                    return first, msgs
                assert f[:3] == [0, 1, sub]
                msgs.append(f[3])

        _, m = await resend("0", resend_all=True)
        assert [x[5] for x in m] == list(range(20)) and [x[6] for x in m] == [None] + list(range(19))
        assert [json.loads(x[8])["i"] for x in m] == list(range(20))
        _, m = await resend("1", resend_last=5)
        assert [x[5] for x in m] == list(range(15, 20))
        _, m = await resend("2", resend_last=1_000_000)
        assert len(m) == 20
        _, m = await resend("3", resend_from=17)
        assert [x[5] for x in m] == [17, 18, 19]
        _, m = await resend("4", resend_from=3, resend_to=6)
        assert [x[5] for x in m] == [3, 4, 5, 6]
        _, m = await resend("5", resend_from_time=11_650)
        assert [x[3] for x in m] == [11_700, 11_800, 11_900]
        for sub, kw in [("6", {"resend_from": 99}), ("7", {}), ("8", {"resend_all": True, "resend_last": 3}),
                        ("9", {"resend_last": 0}), ("10", {"resend_from_time": 99_999_999_999_999}),
                        ("11", {"resend_from": 5, "resend_to": 2}), ("12", {"resend_all": "yes"})]:
            f, m = await resend(sub, **kw)
            assert f == [0, 6, "", {"stream": "raw2", "partition": 0, "sub": sub}] and m == [], (sub, kw)
    scenario(server, go)


def test_errors_and_bad_input(server):
    async def go(s):
        c = await connect(s, server)
        cases = [
            ("this is not json", "Request must be a JSON object!"),
            ("[1,2,3]", "Request must be a JSON object!"),
            ({"type": "frobnicate"}, "Unknown request type: frobnicate"),
            ({"no": "type"}, "Unknown request type: undefined"),
            ({"type": "publish", "msg": "{}"}, "Publish request is missing the stream id!"),
            ({"type": "publish", "stream": 42, "msg": "{}"}, "Publish request is missing the stream id!"),
            ({"type": "publish", "stream": "raw3", "msg": {"an": "object"}}, "Message must be stringified JSON!"),
            ({"type": "publish", "stream": "raw3", "msg": "{not json"}, "Message must be stringified JSON!"),
            ({"type": "publish", "stream": "raw3"}, "Message must be stringified JSON!"),
            ({"type": "publish", "stream": "raw3", "msg": "{}", "ts": "now"},
             "Invalid timestamp: ts must be a number of milliseconds since the epoch"),
            ({"type": "subscribe"}, "subscribe request is missing the stream id!"),
            ({"type": "subscribe", "stream": "raw3", "partition": -1}, "Invalid partition: -1"),
            ({"type": "subscribe", "stream": "raw3", "partition": 1},
             "Stream raw3 has 1 partition(s): partition 1 does not exist"),
            ({"type": "resend", "sub": "0", "resend_all": True}, "resend request is missing the stream id!"),
        ]
        for req, text in cases:
            await c.send(req)
            assert await c.recv() == [0, 7, "", text], req
        await c.ws.send_bytes(b"\xff\xfe\x00")
        assert await c.recv() == [0, 7, "", "Request must be a JSON object!"]
        await c.ws.send_str('{"type":"subscribe","stream":"' + "[" * 100_000 + '"}')   # over the frame cap
        closed = await c.recv()
        assert closed[0] == "closed" and c.ws.close_code == 1009
        c2 = await connect(s, server)        # the process is fine, new connections too
        await c2.send({"type": "subscribe", "stream": "raw3"})
        assert await c2.recv() == [0, 2, "", {"stream": "raw3", "partition": 0}]
        await c2.send("[" * 30_000 + "]" * 30_000)   # deep nesting under the cap: an error, not a crash
        assert (await c2.recv())[1] == 7
        await c2.send({"type": "publish", "stream": "raw3", "msg": "{}"})
        assert (await c2.recv())[3][8] == "{}"
    scenario(server, go)


def test_stalled_client_is_dropped(server):
    """A subscriber that never reads is dropped once its send buffer passes --ws-send-buffer (256 KiB);
    a reading subscriber on the same stream gets everything."""
    port = server.ports["ws"]

    async def go(s):
        # the stream exists before anyone subscribes (a publish makes it; a subscribe only waits for it),
        # so the publishes below reach the subscribers one by one, not as one burst at its creation
        async with s.post(f"http://127.0.0.1:{port}/api/v1/streams/raw4/data", json={"init": True}) as r:
            assert r.status == 200, await r.text()
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # before connect: a small window
        stalled.connect(("127.0.0.1", port))
        key = "dGhlIHNhbXBsZSBub25jZQ=="
        stalled.sendall((f"GET /api/v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += stalled.recv(1)
        assert b" 101 " in head
        payload = json.dumps({"type": "subscribe", "stream": "raw4"}).encode()
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        stalled.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + masked)
        good = await connect(s, server)
        await good.send({"type": "subscribe", "stream": "raw4"})
        assert (await good.recv())[1] == 2
        await asyncio.sleep(0.3)
        n = 8000       # 8 MB: more than loopback's kernel buffers (tcp_wmem max 4 MB) plus the bound
        body = json.dumps({"pad": "y" * 900})
        async def read_all():
            # read while publishing: a subscriber that only writes would pass the bound itself
            got = 0
            while got < n:
                f = await good.recv(5)
                assert f is not None, got
                got += 1
            return got
        reader = asyncio.ensure_future(read_all())
        for i in range(n):
            await good.send({"type": "publish", "stream": "raw4", "msg": body})
        got = await reader
        # the stalled connection was dropped: the server closed its socket
        stalled.settimeout(5)
        dropped = False
        try:
            while True:
                chunk = stalled.recv(1 << 20)
                if not chunk:
                    dropped = True
                    break
        except (ConnectionResetError, socket.timeout) as e:
            dropped = isinstance(e, ConnectionResetError)
        stalled.close()
        assert dropped
        assert "send buffer over" in server.log()
    scenario(server, go, timeout=90)


def test_rest_endpoints(server):
    base = f"http://127.0.0.1:{server.ports['ws']}/api/v1"

    async def go(s):
        async with s.post(f"{base}/streams/rest1/data?ts=5000", json={"a": 1}) as r:
            assert r.status == 200
        async with s.post(f"{base}/streams/rest1/data?ts=6000&pkey=dev", json=[{"b": 2}, {"c": 3}]) as r:
            assert r.status == 200
        async with s.get(f"{base}/streams/rest1/data/partitions/0/last?count=2") as r:
            assert r.status == 200
            assert await r.json() == [[28, "rest1", 0, 6000, 0, 1, 0, 27, '{"b":2}'],
                                      [28, "rest1", 0, 6000, 0, 2, 1, 27, '{"c":3}']]
        async with s.get(f"{base}/streams/rest1/data/partitions/0/last") as r:
            assert [m[5] for m in await r.json()] == [2]
        async with s.get(f"{base}/streams/rest1/data/partitions/0/range?fromOffset=0&toOffset=1") as r:
            assert [m[5] for m in await r.json()] == [0, 1]
        async with s.get(f"{base}/streams/rest1/data/partitions/0/range?fromOffset=1") as r:
            assert [m[5] for m in await r.json()] == [1, 2]
        async with s.get(f"{base}/streams/rest1/data/partitions/0/range?fromTimestamp=5500&toTimestamp=7000") as r:
            assert [m[5] for m in await r.json()] == [1, 2]
        async with s.get(f"{base}/streams/rest1/data/partitions/0/range") as r:
            assert r.status == 400 and "fromOffset" in (await r.json())["error"]
        async with s.get(f"{base}/streams/rest1/data/partitions/0/last?count=abc") as r:
            assert r.status == 400
        async with s.get(f"{base}/streams/nope/data/partitions/0/last") as r:
            assert r.status == 404 and await r.json() == {"error": "Stream nope not found."}
        async with s.get(f"{base}/streams/rest1/data/partitions/3/last") as r:
            assert r.status == 404
        async with s.post(f"{base}/streams/rest1/data", data=b"{nope") as r:
            assert r.status == 400
        async with s.post(f"{base}/streams/rest1/data", json=[1, 2]) as r:
            assert r.status == 400
        # a REST publish reaches WebSocket subscribers
        c = await connect(s, server)
        await c.send({"type": "subscribe", "stream": "rest1"})
        assert (await c.recv())[1] == 2
        async with s.post(f"{base}/streams/rest1/data", json={"live": True}) as r:
            assert r.status == 200
        assert (await c.recv())[3][5:] == [3, 2, 27, '{"live":true}']
    scenario(server, go)


def test_rest_reads_are_bounded(server):
    """A GET that asks for more than one answer may hold is refused with 400 and a text naming the
    bound, not clamped or cut short in silence; one within the bounds is answered."""
    base = f"http://127.0.0.1:{server.ports['ws']}/api/v1/streams/rest-bound/data"

    async def go(s):
        async with s.post(base, json=[{"i": i} for i in range(3)]) as r:
            assert r.status == 200
        async with s.get(f"{base}/partitions/0/last?count=100001") as r:
            assert r.status == 400 and await r.json() == {"error": "count must be at most 100000"}
        async with s.get(f"{base}/partitions/0/last?count=100000") as r:
            assert r.status == 200 and [m[5] for m in await r.json()] == [0, 1, 2]
        async with s.get(f"{base}/partitions/0/range?fromOffset=0&toOffset=100000") as r:
            assert r.status == 200 and [m[5] for m in await r.json()] == [0, 1, 2]
        async with s.post(base, json=[{"i": i} for i in range(100_000)]) as r:
            assert r.status == 200
        async with s.get(f"{base}/partitions/0/range?fromOffset=0") as r:       # 100,003 messages
            assert r.status == 400 and "more than 100000 messages" in (await r.json())["error"]
        async with s.get(f"{base}/partitions/0/range?fromOffset=3") as r:
            assert r.status == 200 and len(await r.json()) == 100_000
        async with s.get(f"{base}/partitions/0/range?fromTimestamp=0") as r:
            assert r.status == 400 and "more than 100000 messages" in (await r.json())["error"]
    scenario(server, go, timeout=120)


def test_graceful_shutdown_commits_and_closes(tmp_path):
    srv = ServerProcess(tmp_path / "data", "--ws-port", "0").start()
    try:
        async def go(s):
            c = await connect(s, srv)
            for i in range(500):
                await c.send({"type": "publish", "stream": "shut", "msg": json.dumps({"i": i})})
            await c.send({"type": "subscribe", "stream": "shut"})
            assert (await c.recv(10))[1] == 2
            # stop from another thread: this loop must go on reading to take part in the close handshake
            stopped = asyncio.get_running_loop().run_in_executor(None, srv.stop)
            closed = await c.recv(10)
            assert closed[0] == "closed" and c.ws.close_code == 1001
            assert await stopped == 0
        scenario(srv, go)
        srv2 = ServerProcess(tmp_path / "data", "--ws-port", "0").start()
        try:
            async def check(s):
                async with s.get(f"http://127.0.0.1:{srv2.ports['ws']}/api/v1/streams/shut/data/partitions/0/last"
                                 "?count=1000") as r:
                    assert len(await r.json()) == 500
            scenario(srv2, check)
        finally:
            assert srv2.stop() == 0
    finally:
        srv.kill()

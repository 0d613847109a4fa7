"""The dashboard's JSON API (shells/http/api.py) and its event stream against ``riverbed serve``, with
real rstream consumers and publishers and a BSON/TCP subscriber."""

import asyncio
import base64
import json
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid

import aiohttp
import bson
import pytest
import zmq
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer, Properties

from procs import ServerProcess
from riverbed.shells import auth
from riverbed.shells.bson_tcp.client import BsonClient

pytestmark = pytest.mark.integration

CREDS = dict(username="guest", password="guest")
STREAM_KEYS = {"name", "records", "bytes", "chunks", "first_offset", "last_offset", "committed_chunk_id",
               "arguments", "consumers", "publishers"}
CONSUMER_KEYS = {"stream", "protocol", "connection", "subscription_id", "reference", "offset", "lag", "credits"}
PUBLISHER_KEYS = {"stream", "protocol", "connection", "publisher_id", "reference", "published"}
# RabbitMQ's stream management fields, carried by the same objects (shells/http/mgmt_stream.py)
RABBIT_CONSUMER_KEYS = {"queue", "connection_details", "properties", "active", "activity_status", "offset_lag"}
RABBIT_PUBLISHER_KEYS = {"queue", "connection_details"}


def run(coro, timeout=60):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def get(port, path, user="guest", password="guest"):
    """(status, decoded JSON body) of GET path."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("api"), "--http-port", "0", "--bson-port", "0", "--ws-port", "0",
                      "--text-port", "0", "--zmq-port", "0").start()
    yield s
    assert s.stop() == 0


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_streams_list_and_one(srv):
    http = srv.ports["http"]
    empty, full = unique("api-empty"), unique("api-full")

    async def setup():
        async with Producer("127.0.0.1", srv.port, **CREDS) as p:
            await p.create_stream(empty, arguments={"max-age": "7D", "max-length-bytes": 1 << 30})
            await p.create_stream(full)
            await p.send_batch(full, [b"r%d" % i for i in range(30)])
            await p.send_wait(full, b"last")
    run(setup())

    status, streams = get(http, "/api/streams")
    assert status == 200
    names = [s["name"] for s in streams]
    assert names == sorted(names) and {empty, full} <= set(names)
    for s in streams:
        assert set(s) == STREAM_KEYS
    e = next(s for s in streams if s["name"] == empty)
    assert (e["records"], e["chunks"], e["last_offset"]) == (0, 0, None)
    assert (e["first_offset"], e["committed_chunk_id"]) == (0, -1)
    assert e["arguments"]["max-age"] == "7D"
    status, f = get(http, f"/api/streams/{full}")
    assert status == 200
    assert (f["records"], f["first_offset"], f["last_offset"]) == (31, 0, 30)
    # two publish frames: one chunk, or two when the writer committed the first alone
    assert (f["chunks"], f["committed_chunk_id"]) in ((1, 0), (2, 30)) and f["bytes"] > 31
    assert (f["consumers"], f["publishers"]) == (0, 0)
    status, body = get(http, "/api/streams/no-such-stream")
    assert status == 404 and body["error"] == "not_found" and "no-such-stream" in body["reason"]


def test_loopback_needs_no_login_without_a_users_file(srv):
    """DESIGN.md "Auth": without a users file every listener serves loopback clients without credentials;
    the JSON API and the dashboard as /metrics does. A wrong password is still refused."""
    status, body = get(srv.ports["http"], "/api/streams", user=None)
    assert status == 200 and isinstance(body, list)
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.ports['http']}/", timeout=10) as resp:
        assert resp.status == 200 and "text/html" in resp.headers["Content-Type"]
    status, _ = get(srv.ports["http"], "/api/stream/consumers", password="wrong")
    assert status == 401


def test_records_rendered_per_content_type(srv):
    http = srv.ports["http"]
    name = unique("api-records")
    big = json.dumps({"blob": "x" * 10_000}).encode()

    async def setup():
        async with Producer("127.0.0.1", srv.port, **CREDS) as p:
            await p.create_stream(name)
            await p.send_wait(name, json.dumps({"id": 1, "name": "book"}).encode())          # 0: sniffed JSON
            await p.send_wait(name, bson.encode({"n": 7, "tag": "b"}))                       # 1: sniffed BSON
            await p.send_wait(name, AMQPMessage(body=b"hello, text",
                                                properties=Properties(content_type="text/plain")))  # 2
            await p.send_wait(name, bytes(range(20)))                                         # 3: bytes
            await p.send_wait(name, big)                                                      # 4: over the cap
    run(setup())

    status, records = get(http, f"/api/streams/{name}/records")
    assert status == 200
    assert [r["offset"] for r in records] == [0, 1, 2, 3, 4]
    for r in records:
        assert {"offset", "timestamp", "content_type", "body", "truncated"} <= set(r)
        assert abs(r["timestamp"] - time.time() * 1000) < 120_000
    assert records[0]["kind"] == "json" and json.loads(records[0]["body"]) == {"id": 1, "name": "book"}
    assert "\n" in records[0]["body"]                       # pretty-printed
    assert records[1]["kind"] == "bson" and json.loads(records[1]["body"]) == {"n": 7, "tag": "b"}
    assert (records[2]["kind"], records[2]["body"], records[2]["content_type"]) == ("text", "hello, text", "text/plain")
    assert records[3]["kind"] == "hex"
    assert records[3]["body"] == "00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f\n10 11 12 13"
    assert records[4]["truncated"] is True and len(records[4]["body"]) == 4096
    assert not any(r["truncated"] for r in records[:4])

    status, last2 = get(http, f"/api/streams/{name}/records?last=2")
    assert status == 200 and [r["offset"] for r in last2] == [3, 4]
    for bad in ("0", "101", "x", "-3"):
        status, body = get(http, f"/api/streams/{name}/records?last={bad}")
        assert status == 400 and body["error"] == "bad_request", bad
    assert get(http, "/api/streams/no-such-stream/records")[0] == 404


def test_consumers_publishers_and_lag(srv):
    """A caught-up rstream consumer, a consumer that stopped taking records (its lag grows), a declared
    publisher, and a BSON/TCP subscriber, as /api/stream/consumers and /api/stream/publishers show them."""
    http = srv.ports["http"]
    name = unique("api-consumers")
    ready, stop, done = threading.Event(), threading.Event(), threading.Event()
    errors = []

    async def clients():
        async with Producer("127.0.0.1", srv.port, **CREDS, connection_name="api-producer") as p:
            await p.create_stream(name)
            await p.send_batch(name, [b"m%d" % i for i in range(100)], publisher_name="pub-ref")
            await p.send_wait(name, b"m100", publisher_name="pub-ref")
            fast = Consumer("127.0.0.1", srv.port, **CREDS, connection_name="api-fast")
            slow = Consumer("127.0.0.1", srv.port, **CREDS, connection_name="api-slow")
            got, held = [], asyncio.Event()

            async def on_fast(msg, ctx):
                got.append(ctx.offset)

            async def on_slow(msg, ctx):
                await held.wait()          # never returns before the end: the consumer stops taking chunks

            await fast.start()
            await slow.start()
            await fast.subscribe(name, on_fast, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
            # no credit: the server delivers it nothing, so it stays at the first offset
            await slow.subscribe(name, on_slow, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
                                 initial_credit=0)
            bc = await BsonClient.connect("127.0.0.1", srv.ports["bson"])
            sub = await bc.subscribe(name, start_pos=0)
            try:
                while len(got) < 101:
                    await asyncio.sleep(0.02)
                await p.send_batch(name, [b"n%d" % i for i in range(50)], publisher_name="pub-ref")
                await p.send_wait(name, b"n50", publisher_name="pub-ref")
                while len(got) < 152:
                    await asyncio.sleep(0.02)
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.05)
            finally:
                held.set()
                await sub.close()
                await bc.close()
                await fast.close()
                await slow.close()

    def runner():
        try:
            run(clients(), timeout=60)
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)
        finally:
            ready.set()
            done.set()

    t = threading.Thread(target=runner, daemon=True)
    t.start()
    try:
        assert ready.wait(30) and not errors, errors

        def settled():
            status, found = get(http, f"/api/stream/consumers?stream={name}")
            assert status == 200
            return found if len(found) == 3 and all(c["lag"] is not None for c in found) else None
        found = wait_for(settled)
        for c in found:
            assert set(c) == CONSUMER_KEYS | RABBIT_CONSUMER_KEYS and c["stream"] == name
        by_conn = {c["connection"]: c for c in found if c["protocol"] == "stream"}
        assert set(by_conn) == {"api-fast", "api-slow"}
        fast = wait_for(lambda: next((c for c in get(http, f"/api/stream/consumers?stream={name}")[1]
                                      if c["connection"] == "api-fast" and c["lag"] == 0), None))
        assert fast["offset"] == 152 and isinstance(fast["credits"], int) and fast["reference"] is None
        slow = by_conn["api-slow"]
        assert (slow["offset"], slow["lag"], slow["credits"]) == (0, 152, 0)
        bson_sub = next(c for c in found if c["protocol"] == "bson")
        assert bson_sub["credits"] is None and 0 <= bson_sub["lag"] <= 152

        status, every = get(http, "/api/stream/consumers")
        assert status == 200 and {c["connection"] for c in every if c["stream"] == name} >= {"api-fast", "api-slow"}
        status, pubs = get(http, f"/api/stream/publishers?stream={name}")
        assert status == 200 and len(pubs) == 1
        assert set(pubs[0]) == PUBLISHER_KEYS | RABBIT_PUBLISHER_KEYS
        p = pubs[0]
        assert (p["protocol"], p["connection"], p["reference"]) == ("stream", "api-producer", "pub-ref")
        status, one = get(http, f"/api/streams/{name}")
        assert (one["consumers"], one["publishers"]) == (3, 1)
        assert get(http, "/api/stream/consumers?stream=no-such-stream")[0] == 404
    finally:
        stop.set()
        assert done.wait(30)
    assert not errors, errors
    wait_for(lambda: get(http, f"/api/stream/consumers?stream={name}")[1] == [])


def test_event_stream_snapshots(srv):
    """/api/events sends a snapshot a second; the published rate and record count move with publishes."""
    http = srv.ports["http"]
    name = unique("api-events")
    run(_create(srv.port, name))
    token = base64.b64encode(b"guest:guest").decode()
    req = urllib.request.Request(f"http://127.0.0.1:{http}/api/events", headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")

        def next_snapshot():
            while True:
                line = resp.readline().decode()
                if line.startswith("data: "):
                    return json.loads(line[6:])

        first = next_snapshot()
        assert {"t", "interval", "streams", "connections", "consumers"} <= set(first)
        mine = next(s for s in first["streams"] if s["name"] == name)
        assert mine["records"] == 0
        run(_publish(srv.port, name, 500))
        for _ in range(5):
            snap = next_snapshot()
            mine = next(s for s in snap["streams"] if s["name"] == name)
            if mine["records"] == 500 and mine["rate"] > 0:
                break
        assert mine["records"] == 500 and mine["rate"] > 0 and mine["next_offset"] == 500
        later = next_snapshot()
        assert later["t"] > snap["t"]


async def _create(port, name):
    async with Producer("127.0.0.1", port, **CREDS) as p:
        await p.create_stream(name)


async def _publish(port, name, n):
    async with Producer("127.0.0.1", port, **CREDS) as p:
        await p.send_batch(name, [b"e%d" % i for i in range(n - 1)])
        await p.send_wait(name, b"last")


def test_only_readable_streams(tmp_path):
    users = tmp_path / "users.toml"
    auth.add_user(str(users), "alice", "s3cret", configure="^alice-", write="^alice-", read="^alice-")
    auth.add_user(str(users), "root", "r00t")
    s = ServerProcess(tmp_path / "data", "--http-port", "0", "--users", str(users)).start()
    try:
        async def setup():
            async with Producer("127.0.0.1", s.port, username="root", password="r00t") as p:
                await p.create_stream("alice-orders")
                await p.create_stream("bob-orders")
                await p.send_wait("bob-orders", b"secret")
        run(setup())
        http = s.ports["http"]
        assert [x["name"] for x in get(http, "/api/streams", "alice", "s3cret")[1]] == ["alice-orders"]
        assert [x["name"] for x in get(http, "/api/streams", "root", "r00t")[1]] == ["alice-orders", "bob-orders"]
        status, body = get(http, "/api/streams/bob-orders/records", "alice", "s3cret")
        assert status == 403 and body["error"] == "not_authorized"
        assert get(http, "/api/streams/bob-orders", "alice", "s3cret")[0] == 403
        assert get(http, "/api/streams", "alice", "wrong")[0] == 401
    finally:
        assert s.stop() == 0


def test_consumers_of_every_protocol(srv):
    """A WebSocket, a REAM text and a ZeroMQ subscriber show in /api/stream/consumers, caught up."""
    http = srv.ports["http"]
    name = f"apiprotos_{uuid.uuid4().hex[:8]}"        # REAM names: a letter, then letters, digits or _
    run(_create(srv.port, name))
    run(_publish(srv.port, name, 10))
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    ream = socket.create_connection(("127.0.0.1", srv.ports["ream"]), timeout=10)
    try:
        dealer.connect(f"tcp://127.0.0.1:{srv.ports['zmq']}")
        dealer.send_multipart([b"", b"SUB", b"ID", b"1", b"", name.encode()])
        assert dealer.poll(5000) and dealer.recv_multipart()[1] == b"OK"
        ream.sendall(f"EVENT SUBSCRIBE {name} 1\n".encode())
        got = b""
        while b"SUBSCRIBED" not in got:          # after the server's greeting line
            data = ream.recv(4096)
            assert data, got
            got += data
        assert f"EVENT SUBSCRIBED {name} 1".encode() in got

        async def with_ws():
            async with aiohttp.ClientSession() as session:
                ws = await session.ws_connect(f"http://127.0.0.1:{srv.ports['ws']}/api/v1/ws")
                await ws.send_str(json.dumps({"type": "subscribe", "stream": name}))
                assert json.loads((await ws.receive(timeout=5)).data)[1] == 2      # subscribed

                def all_three():
                    found = get(http, f"/api/stream/consumers?stream={name}")[1]
                    return found if {c["protocol"] for c in found} == {"ws", "ream", "zmq"} else None
                found = await asyncio.get_running_loop().run_in_executor(None, wait_for, all_three)
                await ws.close()
                return found
        found = run(with_ws())
    finally:
        ream.close()
        dealer.close(linger=0)
        ctx.term()
    by_proto = {c["protocol"]: c for c in found}
    for c in found:
        assert set(c) == CONSUMER_KEYS | RABBIT_CONSUMER_KEYS and c["credits"] is None and c["reference"] is None
        assert (c["offset"], c["lag"]) == (10, 0), c
    assert by_proto["ws"]["subscription_id"] == name and by_proto["ream"]["subscription_id"] == name
    assert by_proto["zmq"]["subscription_id"] == name and by_proto["zmq"]["connection"].startswith("zmq ")


def test_static_files_and_page(srv):
    base = f"http://127.0.0.1:{srv.ports['http']}"
    token = base64.b64encode(b"guest:guest").decode()

    def fetch(path):
        req = urllib.request.Request(base + path, headers={"Authorization": f"Basic {token}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    status, headers, body = fetch("/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    assert b"/static/dashboard.js" in body and b"http" not in body.replace(b"http-equiv", b"")
    for f, ctype in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        status, headers, body = fetch(f"/static/{f}")
        assert status == 200 and headers["Content-Type"].startswith(ctype) and len(body) > 1000
        assert b"https://" not in body and b"http://" not in body.replace(b"http://www.w3.org/2000/svg", b"")
    for bad in ("/static/nope.js", "/static/..%2Fapi.py", "/static/.hidden.js", "/static/api.py"):
        assert fetch(bad)[0] == 404, bad


def test_stop_ends_open_event_streams(tmp_path):
    """Open /api/events streams end at shutdown at once instead of holding it for the listener's
    grace period (SHUTDOWN_TIMEOUT, 2 s)."""
    s = ServerProcess(tmp_path / "data", "--http-port", "0").start()
    token = base64.b64encode(b"guest:guest").decode()
    streams = []
    try:
        for _ in range(2):
            req = urllib.request.Request(f"http://127.0.0.1:{s.ports['http']}/api/events",
                                         headers={"Authorization": f"Basic {token}"})
            resp = urllib.request.urlopen(req, timeout=10)
            while not resp.readline().startswith(b"data: "):
                pass
            streams.append(resp)
        t0 = time.monotonic()
        assert s.stop() == 0
        assert time.monotonic() - t0 < 1.5, s.log()
        for resp in streams:
            assert resp.read() in (b"", b"\n")       # the server ended the stream
    finally:
        s.kill()
        for resp in streams:
            resp.close()

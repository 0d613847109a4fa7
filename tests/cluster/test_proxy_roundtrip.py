"""Issue 25: every protocol on every node. The five-protocol round trip of the single-node tests with each
protocol's client connected to a different node: RabbitMQ Stream, BSON, ZeroMQ, WebSocket and REAM each
publish through one node, and each of them reads on each of the three nodes, one of which holds no copy
of the stream (it observes the stream: shells/cluster/remote_read.py), in one order at the same offsets.
Read-your-writes across nodes: a write acknowledged through one node is read at once through another.
Real etcd and three ``riverbed serve`` nodes, one cluster for the module."""

import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request

import aiohttp
import bson
import pytest
import zmq

import rawwire
from clusterfixtures import module_cluster
from fwdclients import publisher
from test_replication import connect, stream_of, wait_placed
from rawwire import entry_records

from riverbed.engine import core
from riverbed.engine.format import H_CHUNK_ID, LEN_CHUNK_HEADER
from riverbed.shells.cluster.kafka_view import node_id
from riverbed.shells.kafka import codec as kc

pytestmark = pytest.mark.integration

ALL_LISTENERS = ("--bson-port", "0", "--zmq-port", "0", "--ws-port", "0", "--text-port", "0", "--kafka-port", "0")
PROTOCOLS = ("rmq", "bson", "zmq", "ws", "ream")
MARK = re.compile(r"(rmq|bson|zmq|ws|ream)-(\d+)")
KEY_SUBSCRIBE, KEY_DELIVER, KEY_CREDIT, KEY_METADATA = 0x07, 0x08, 0x09, 0x0F
OFFSET_FIRST, OFFSET_NEXT = 1, 3
ROUNDS = 8
IDLE = 3.0          # seconds (RIVERBED_OBSERVER_IDLE_SECONDS of the nodes)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        # observer copies unread for this long are dropped (a new reader makes one again): short here, so
        # that the tests below also read through copies made again
        mp.setenv("RIVERBED_OBSERVER_IDLE_SECONDS", str(IDLE))
        # a node whose file is in this directory reads no new cluster state from etcd (viewhold.py)
        hold_dir = tmp_path_factory.mktemp("hold")
        mp.setenv("RIVERBED_CLUSTER_HOLD_DIR", str(hold_dir))
        with module_cluster(tmp_path_factory, "proxy", extra=ALL_LISTENERS) as c:
            c.hold_dir = hold_dir
            yield c


def marker(text):
    """``(protocol, n)`` of the marker in a record as a protocol rendered it (a binary one, e.g. a ZeroMQ
    body, comes as ``{"base64": ...}`` to the JSON protocols)."""
    m = MARK.search(text)
    if m is None and '"base64"' in text:
        try:
            m = MARK.search(base64.b64decode(json.loads(text)["base64"]).decode("utf-8", "replace"))
        except (ValueError, KeyError, TypeError):
            m = None
    return (m.group(1), int(m.group(2))) if m else None


# ------------------------------------------------------------------------------------- the readers
# Each reads ``stream`` on one node from its first offset until it has ``n`` records, and returns
# ``[(offset, (protocol, n))]`` as that protocol tells them.

def rmq_read(srv, stream, n, timeout=20):
    c = connect(srv.port)
    try:
        code, _ = c.request(KEY_SUBSCRIBE, struct.pack(">B", 0) + rawwire.s(stream)
                            + struct.pack(">HH", OFFSET_FIRST, 10) + struct.pack(">I", 0))
        assert code == rawwire.OK, code
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            assert time.monotonic() < deadline, f"rmq on {srv.port}: {len(out)} of {n}"
            f = c.pushed.pop(0) if c.pushed else c.recv_frame(timeout)
            key, _, body = f
            if key == KEY_DELIVER and body[0] == 0:
                chunk = bytes(body[1:])
                first = core.read_header(chunk)[H_CHUNK_ID]
                data_len = struct.unpack_from(">I", body, 1 + 36)[0]
                for i, r in enumerate(entry_records(chunk[LEN_CHUNK_HEADER:LEN_CHUNK_HEADER + data_len])):
                    out.append((first + i, marker(r.decode("utf-8", "replace"))))
                c.send(rawwire.frame(KEY_CREDIT, struct.pack(">BH", 0, 1)))
        return out
    finally:
        c.close()


def bson_read(srv, stream, n, timeout=20):
    s = socket.create_connection(("127.0.0.1", srv.ports["bson"]), timeout=timeout)
    buf = b""

    def send(ftype, frame):
        s.sendall(bson.encode({"type": ftype, "frame": frame}))

    def recv():
        nonlocal buf
        while True:
            if len(buf) >= 4 and len(buf) >= struct.unpack_from("<i", buf)[0]:
                size = struct.unpack_from("<i", buf)[0]
                doc, buf = buf[:size], buf[size:]
                return bson.decode(doc)
            chunk = s.recv(1 << 16)
            assert chunk, "BSON connection closed"
            buf += chunk
    try:
        send("CONNECT", {"version": "0.1"})
        assert recv()["frame"]["ok"] is True
        send("SUBSCRIBE", {"channel": stream, "rID": 1, "startPos": bson.int64.Int64(0)})
        resp = recv()
        assert resp["type"] == "SUBRESPONSE" and resp["frame"]["ok"] is True, resp
        out = []
        while len(out) < n:
            f = recv()
            if f["type"] == "RECEV":
                out.append((f["frame"]["pos"], marker(repr(f["frame"]["event"]))))
        return out
    finally:
        s.close()


def zmq_read(srv, stream, n, timeout=20):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(f"tcp://127.0.0.1:{srv.ports['zmq']}")
    try:
        sock.send_multipart([b"", b"SUB", b"ID", b"r", b"X-OFFSET", b"0", b"", stream.encode()])
        out = []
        while len(out) < n:
            assert sock.poll(int(timeout * 1000)), f"zmq on {srv.ports['zmq']}: {len(out)} of {n}"
            msg = sock.recv_multipart()
            if msg[1] == b"MESSAGE":
                offset = int(msg[msg.index(b"X-OFFSET") + 1])
                out.append((offset, marker(msg[-1].decode("utf-8", "replace"))))
            else:
                assert msg[1] == b"OK", msg
        # a DEALER that goes away says nothing to the server: the subscription would live on (and hold
        # the node's copy of the stream) until a TTL expires; DISCONNECT ends it
        sock.send_multipart([b"", b"DISCONNECT"])
        return out
    finally:
        sock.close(linger=1000)


def ream_read(srv, stream, n, timeout=20):
    s = socket.create_connection(("127.0.0.1", srv.ports["ream"]), timeout=timeout)
    buf = b""

    def line():
        nonlocal buf
        while b"\n" not in buf:
            chunk = s.recv(1 << 16)
            assert chunk, "REAM connection closed"
            buf += chunk
        ln, buf = buf.split(b"\n", 1)
        return ln.decode()
    try:
        line()      # the banner
        s.sendall(f"EVENT SUBSCRIBE {stream} 1\n".encode())
        assert line().startswith(f"EVENT SUBSCRIBED {stream} 1 ")
        out = []
        while len(out) < n:
            words = line().split()
            assert words[0] == "EVENT" and words[1] == stream, words
            size = int(words[3])
            while len(buf) < size + 1:
                buf += s.recv(1 << 16)
            payload, buf = buf[:size], buf[size + 1:]
            out.append((int(words[2]) - 1, marker(payload.decode())))      # an event id is the offset + 1
        return out
    finally:
        s.close()


def ws_resend(srv, stream, n, timeout=20, **variant):
    """A WebSocket resend (by default from offset 0); returns its messages."""
    async def go():
        async with aiohttp.ClientSession() as s:
            ws = await s.ws_connect(f"http://127.0.0.1:{srv.ports['ws']}/api/v1/ws")
            await ws.send_str(json.dumps({"type": "resend", "stream": stream, "sub": "r",
                                          **(variant or {"resend_from": 0})}))
            out = []
            while True:
                f = json.loads((await ws.receive(timeout=timeout)).data)
                assert f[1] != 7, f                       # an error frame
                if f[1] in (5, 6):                        # resent / no_resend
                    return out
                if f[1] == 1:                             # unicast: [.., msg]; msg[5] offset, msg[8] content
                    out.append((f[3][5], marker(f[3][8])))
    return asyncio.run(asyncio.wait_for(go(), timeout + 5))


def ws_read(srv, stream, n, timeout=20):
    out = ws_resend(srv, stream, n, timeout)
    assert len(out) == n, (srv.ports["ws"], len(out), n)
    return out


READERS = {"rmq": rmq_read, "bson": bson_read, "zmq": zmq_read, "ws": ws_read, "ream": ream_read}


class WsLive:
    """A WebSocket subscription (from the next message) on one node, collecting broadcast frames in a
    thread of its own until it has ``n``."""

    def __init__(self, srv, stream, n):
        import threading
        self.got, self.error = [], None
        self.subscribed = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run(srv, stream, n)), daemon=True)
        self.thread.start()
        assert self.subscribed.wait(20), "no SUBSCRIBED"

    async def _run(self, srv, stream, n):
        try:
            async with aiohttp.ClientSession() as s:
                ws = await s.ws_connect(f"http://127.0.0.1:{srv.ports['ws']}/api/v1/ws")
                await ws.send_str(json.dumps({"type": "subscribe", "stream": stream}))
                f = json.loads((await ws.receive(timeout=20)).data)
                assert f[1] == 2, f
                self.subscribed.set()
                while len(self.got) < n:
                    f = json.loads((await ws.receive(timeout=30)).data)
                    if f[1] == 0:
                        self.got.append((f[3][5], marker(f[3][8])))
        except BaseException as e:      # reported by result()
            self.error = e
            self.subscribed.set()

    def result(self):
        self.thread.join(40)
        assert self.error is None, repr(self.error)
        return self.got


class RmqJsonPub:
    """A RabbitMQ Stream publisher (raw frames, named) of JSON bodies, so that every protocol renders them."""

    def __init__(self, srv, stream):
        self.c = rawwire.RawClient(srv.port, timeout=10)
        assert self.c.handshake() == rawwire.OK
        assert self.c.declare_publisher(1, stream, "rt-rmq") == rawwire.OK

    def publish(self, n):
        ok, _ = self.c.publish_confirmed(1, [(n, json.dumps({"m": "rmq-%d" % n}).encode())], timeout=10)
        return n in ok

    def close(self):
        self.c.close()


def rest_last(srv, stream):
    url = f"http://127.0.0.1:{srv.ports['ws']}/api/v1/streams/{stream}/data/partitions/0/last?count=1"
    with urllib.request.urlopen(url, timeout=20) as r:
        msgs = json.loads(r.read())
    return [(m[5], marker(m[8])) for m in msgs]


def make_stream(c, name, size):
    cl = connect(c.nodes["n1"].port)
    assert cl.create(name, {"initial-cluster-size": str(size)}) == rawwire.OK
    cl.close()
    st = wait_placed(c, name)
    members = {m["node"] for m in stream_of(st, name)["members"]}
    assert len(members) == size
    return members


# --------------------------------------------------------------------------------------- the tests

def test_five_protocols_publish_through_every_node_and_read_on_every_node(cluster):
    c = cluster
    members = make_stream(c, "rt", 2)
    outside = ({"n1", "n2", "n3"} - members).pop()
    nodes = [c.nodes[n] for n in ("n1", "n2", "n3")]
    # live WebSocket subscribers first, one per node (the node without a copy makes one to serve it)
    live = {name: WsLive(srv, "rt", ROUNDS * 5) for name, srv in c.nodes.items()}
    # each protocol publishes through a node of its own (five clients, three nodes, all three used)
    through = {"rmq": nodes[0], "bson": nodes[1], "zmq": nodes[2], "ws": nodes[1], "ream": nodes[2]}
    pubs = {p: RmqJsonPub(srv, "rt") if p == "rmq" else publisher(p, srv, "rt") for p, srv in through.items()}
    for i in range(ROUNDS):
        for p in PROTOCOLS:
            assert pubs[p].publish(i), (p, i)
    for p in pubs.values():
        p.close()
    n = ROUNDS * 5
    expected = [(o, (p, i)) for o, (i, p) in enumerate((i, p) for i in range(ROUNDS) for p in PROTOCOLS)]
    for name, srv in c.nodes.items():
        for proto, read in READERS.items():
            got = read(srv, "rt", n)
            assert got == expected, (proto, name, "outside" if name == outside else "member", got[:6])
        assert live[name].result() == expected, (name, "live WebSocket")
    # the node outside the members observes the stream: no vote, its copy equal to the members'
    assert outside not in {m["node"] for m in stream_of(c.status(), "rt")["members"]}
    # `riverbed tail` pointed at the node outside the members
    srv = c.nodes[outside]
    r = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "tail", "rt", "--from", "first", "--format",
                        "raw", "--uri", f"rabbitmq-stream://guest:guest@127.0.0.1:{srv.port}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [(o, marker(line)) for o, line in enumerate(r.stdout.splitlines())] == expected


def test_read_your_writes_through_another_node(cluster):
    """A write acknowledged through one node is read at once through each other one (a WebSocket REST
    ``last`` and a resend of the last message: one-shot reads, which wait for the node's copy to reach
    what the leader has committed), including the two nodes holding no copy of a one-member stream."""
    c = cluster
    names = ("n1", "n2", "n3")
    for stream, size in (("ryw1", 1), ("ryw3", 3)):
        make_stream(c, stream, size)
        pubs = {name: publisher("ream", c.nodes[name], stream) for name in names}
        for i in range(30):
            via = names[i % 3]
            assert pubs[via].publish(i)
            for other in names:
                if other == via:
                    continue
                if i % 2:
                    assert rest_last(c.nodes[other], stream) == [(i, ("ream", i))], (stream, i, other)
                else:
                    assert ws_resend(c.nodes[other], stream, 1, resend_last=1) == [(i, ("ream", i))], (stream, i, other)
        for p in pubs.values():
            p.close()


def test_a_subscription_on_a_node_without_a_copy_of_a_missing_stream_is_answered_as_before(cluster):
    """No such stream anywhere: the node that would observe it answers each protocol's own 'no such
    stream' (after asking etcd), as a lone node does."""
    srv = cluster.nodes["n2"]
    cl = connect(srv.port)
    try:
        code, _ = cl.request(KEY_SUBSCRIBE, struct.pack(">B", 0) + rawwire.s("nowhere")
                             + struct.pack(">HH", OFFSET_FIRST, 10) + struct.pack(">I", 0))
        assert code == 0x02          # STREAM_DOES_NOT_EXIST
    finally:
        cl.close()
    assert ws_resend(srv, "nowhere", 0) == []       # no_resend


def local_streams(srv):
    req = urllib.request.Request(f"http://127.0.0.1:{srv.ports['http']}/api/queues",
                                 headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as r:
        return {q["name"] for q in json.loads(r.read())}


def test_an_idle_observer_copy_is_dropped_and_made_again(cluster):
    """A copy made for readers is deleted once no reader used it for a while (not the cluster's stream:
    the members keep theirs); the next reader makes a new one, at the same offsets."""
    c = cluster
    (member,) = make_stream(c, "idle", 1)
    outside = c.nodes[next(n for n in ("n1", "n2", "n3") if n != member)]
    pub = publisher("ream", c.nodes[member], "idle")
    for i in range(3):
        assert pub.publish(i)
    expected = [(i, ("ream", i)) for i in range(3)]
    # each protocol in turn makes the copy on a node holding none (each shell's own path to it)
    for proto, read in READERS.items():
        assert read(outside, "idle", 3) == expected, proto
        assert "idle" in local_streams(outside)
        deadline = time.monotonic() + IDLE + 10
        while "idle" in local_streams(outside):
            assert time.monotonic() < deadline, ("the idle observer copy was not dropped", proto)
            time.sleep(0.1)
        assert "idle" in local_streams(c.nodes[member])
        assert stream_of(c.status(), "idle") is not None            # the cluster's stream stays
    assert rest_last(outside, "idle") == expected[-1:]
    assert pub.publish(3)
    pub.close()
    assert bson_read(outside, "idle", 4) == expected + [(3, ("ream", 3))]


# ------------------------------------------------------------- nodes a change has not reached yet

@contextlib.contextmanager
def view_held(c, *names):
    """The view of the cluster of nodes ``names`` held where it is while the block runs: they read no new
    nodes or placements from etcd (RIVERBED_CLUSTER_HOLD_DIR), as a node a poll or a watch event behind."""
    for n in names:
        (c.hold_dir / n).touch()
    try:
        yield
    finally:
        for n in names:
            (c.hold_dir / n).unlink()


def kafka_call(srv, api_key, version, body):
    """One Kafka request to ``srv``'s Kafka listener; the decoded response."""
    with socket.create_connection(("127.0.0.1", srv.ports["kafka"]), timeout=20) as s:
        s.sendall(kc.encode_request(api_key, version, 7, "raw", body))
        head = s.recv(4, socket.MSG_WAITALL)
        data = s.recv(int.from_bytes(head, "big"), socket.MSG_WAITALL)
    return kc.decode_response(api_key, version, data)[1]


def rmq_metadata(srv, stream):
    """``(code, leader port)`` of ``stream`` in a RabbitMQ Stream Metadata answer of ``srv``."""
    cl = connect(srv.port)
    try:
        code, rest = cl.request(KEY_METADATA, struct.pack(">i", 1) + rawwire.s(stream))
    finally:
        cl.close()
    # (``code`` is the first two bytes of the broker list's count: Metadata has no response code)
    body = struct.pack(">H", code) + rest
    n, pos, ports = struct.unpack_from(">i", body)[0], 4, {}
    for _ in range(n):
        ref, hl = struct.unpack_from(">Hh", body, pos)
        pos += 4 + hl
        ports[ref] = struct.unpack_from(">I", body, pos)[0]
        pos += 4
    (m,) = struct.unpack_from(">i", body, pos)
    assert m == 1
    sl = struct.unpack_from(">h", body, pos + 4)[0]
    pos += 6 + sl
    rc, leader = struct.unpack_from(">HH", body, pos)
    return rc, ports.get(leader)


def create_on(c, srv, name, args):
    """Create ``name`` through ``srv`` and wait until etcd places it (not until its members report: a
    member whose view is held never does)."""
    cl = connect(srv.port)
    try:
        assert cl.create(name, args) == rawwire.OK
    finally:
        cl.close()
    c.wait(lambda st: stream_of(st, name) is not None, what=f"{name} placed")


def test_reads_through_nodes_that_have_not_seen_a_new_stream_yet(cluster):
    """Streams made on n1 are read at once through n3, whose view of the cluster is held (it has not read
    the new placements): as a member whose copy its control loop has not made yet (one stream per read
    path, so that each is the first reader: the five protocols' subscriptions, a REST ``last``, the HTTP
    API's stats) and as a node holding no copy. Each path that could answer "no such stream" asks etcd
    first, also RabbitMQ Stream and Kafka Metadata and a Kafka Fetch. Then the copy that n1, its view
    held too, made a stream with before placing it on another node: a read there follows that stream's
    leader (n1 adopts the copy); it does not wait in vain for a copy nothing updates."""
    c = cluster
    n1, n3 = c.nodes["n1"], c.nodes["n3"]
    local = {"queue-leader-locator": "client-local"}
    firsts = (*READERS, "rest", "api")
    expected = [(i, ("ream", i)) for i in range(2)]
    with view_held(c, "n3"):
        for first in firsts:       # n3 a member, its copy not made
            create_on(c, n1, f"held-{first}", dict(local, **{"initial-cluster-size": "3"}))
        create_on(c, n1, "held1", dict(local, **{"initial-cluster-size": "1"}))   # n3 holds no copy
        for stream in [f"held-{f}" for f in firsts] + ["held1"]:
            pub = publisher("ream", n1, stream)
            for i in range(2):
                assert pub.publish(i)
            pub.close()
        for stream in ("held-rmq", "held1"):
            assert rmq_metadata(n3, stream) == (rawwire.OK, n1.port), stream
            md = kafka_call(n3, kc.API_METADATA, 9, {"topics": [{"name": stream}], "allow_auto_topic_creation": False})
            (t,) = md["topics"]
            assert t["error_code"] == 0 and t["partitions"][0]["leader_id"] == node_id("n1"), (stream, t)
        for proto, read in READERS.items():
            assert read(n3, f"held-{proto}", 2) == expected, proto
        assert rest_last(n3, "held-rest") == expected[-1:]
        req = urllib.request.Request(f"http://127.0.0.1:{n3.ports['http']}/api/streams/held-api",
                                     headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
        with urllib.request.urlopen(req, timeout=20) as r:
            assert r.status == 200
        assert rest_last(n3, "held1") == expected[-1:]
        assert rmq_read(n3, "held1", 2) == expected
        # a Kafka Fetch of a stream n3 has not heard of and holds no copy of: not "unknown topic" but
        # "not the leader" (the client asks Metadata again, which names n1, and fetches there)
        create_on(c, n1, "held1k", dict(local, **{"initial-cluster-size": "1"}))
        fetch = {"max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
                 "topics": [{"topic": "held1k", "partitions": [{"partition": 0, "fetch_offset": 0,
                                                                "partition_max_bytes": 1 << 20}]}],
                 "forgotten_topics_data": []}
        res = kafka_call(n3, kc.API_FETCH, 12, fetch)["responses"][0]["partitions"][0]
        assert res["error_code"] == kc.ERR_NOT_LEADER_OR_FOLLOWER, res
    # n1 made "left1" and placed it on the node leading fewest streams (n1 leads the held-* ones): its
    # own copy, which no role keeps up to date, stays while its view is held
    with view_held(c, "n1"):
        create_on(c, n1, "left1", {"initial-cluster-size": "1"})
        st = wait_placed(c, "left1")
        leader = stream_of(st, "left1")["leader"]
        assert leader != "n1", st
        pub = publisher("ream", c.nodes[leader], "left1")
        for i in range(2):
            assert pub.publish(i)
        pub.close()
        assert rest_last(n1, "left1") == [(1, ("ream", 1))]
        assert rmq_read(n1, "left1", 2) == [(0, ("ream", 0)), (1, ("ream", 1))]


def test_a_subscription_from_next_on_a_lagging_member_starts_at_the_committed_end(cluster):
    """A member that fell behind (SIGSTOP while its leader committed more with the other member) gets a
    Subscribe from ``next`` (sent while it is stopped, so it is the first thing it reads when it runs
    again): the subscription starts at the committed end as the leader knows it, not at this member's
    own end; the first record it delivers is the one published after it subscribed."""
    c = cluster
    members = make_stream(c, "lagn", 3)
    leader = stream_of(c.status(), "lagn")["leader"]
    lagging = c.nodes[sorted(members - {leader})[0]]
    pub = rawwire.RawClient(c.nodes[leader].port, timeout=20)
    assert pub.handshake() == rawwire.OK and pub.declare_publisher(1, "lagn") == rawwire.OK
    ok, _ = pub.publish_confirmed(1, [(i, b"before-%d" % i) for i in range(10)], timeout=20)
    assert len(ok) == 10
    sub = connect(lagging.port)
    os.kill(lagging.proc.pid, signal.SIGSTOP)
    try:
        # committed by the leader and the other member; the lagging one holds none of it
        ok, _ = pub.publish_confirmed(1, [(10 + i, b"x" * 200) for i in range(2000)], timeout=20)
        assert len(ok) == 2000
        corr = sub.next_corr()
        sub.send(rawwire.frame(KEY_SUBSCRIBE, struct.pack(">I", corr) + struct.pack(">B", 0) + rawwire.s("lagn")
                               + struct.pack(">HH", OFFSET_NEXT, 10) + struct.pack(">I", 0)))
    finally:
        os.kill(lagging.proc.pid, signal.SIGCONT)
    try:
        resp = sub.wait_for(KEY_SUBSCRIBE | 0x8000, corr, timeout=20)
        assert struct.unpack_from(">H", resp, 4)[0] == rawwire.OK
        ok, _ = pub.publish_confirmed(1, [(5000, b"after")], timeout=20)
        assert ok == {5000}
        deadline = time.monotonic() + 20
        while True:
            f = sub.pushed.pop(0) if sub.pushed else sub.recv_frame(20)
            assert f is not None and time.monotonic() < deadline
            key, _, body = f
            if key == KEY_DELIVER and body[0] == 0:
                first, records = rawwire.delivered_chunk(body)
                break
        assert (first, records[:1]) == (2010, [b"after"])
    finally:
        sub.close()
        pub.close()


def test_an_observer_follows_the_next_leader(cluster):
    """Kill -9 (and restart) the leader of a two-member stream: the node outside its members, serving a
    live subscription from its copy, follows the next leader, takes no part in the election, and the
    subscription goes on at the log's offsets. Last in the module: it restarts a node."""
    c = cluster
    members = make_stream(c, "fo", 2)
    outside = ({"n1", "n2", "n3"} - members).pop()
    st = c.status()
    leader, epoch = stream_of(st, "fo")["leader"], stream_of(st, "fo")["epoch"]
    live = WsLive(c.nodes[outside], "fo", 20)
    pub = publisher("bson", c.nodes[outside], "fo")        # forwarded from the observer to the leader
    for i in range(10):
        assert pub.publish(i), i
    pub.close()
    c.restart(leader)
    st = c.wait(lambda st: stream_of(st, "fo")["epoch"] > epoch and stream_of(st, "fo")["leader"] and any(
        n["up"] and n["name"] == stream_of(st, "fo")["leader"] for n in st["nodes"]), timeout=30,
        what="a new leader of fo")
    assert {m["node"] for m in stream_of(st, "fo")["members"]} == members
    pub = publisher("ream", c.nodes[outside], "fo")
    for i in range(10):
        assert pub.publish(i), i
    pub.close()
    expected = [(o, m) for o, m in enumerate([("bson", i) for i in range(10)] + [("ream", i) for i in range(10)])]
    assert live.result() == expected
    for name in ("n1", "n2", "n3"):
        assert rmq_read(c.nodes[name], "fo", 20) == expected, name

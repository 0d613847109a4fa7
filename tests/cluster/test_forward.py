"""Forwarding (issues 23 and 25): a publish through any protocol to a node that does not lead the stream
is forwarded to the leader and acknowledged once the leader's majority holds it, with the leader's
offsets; the log holds it once, at the same offsets on every member; a named RabbitMQ publisher retrying
through another node is deduplicated; kill -9 of the leader while every protocol publishes through the
other nodes loses nothing acknowledged. Real etcd and three ``riverbed serve`` nodes."""

import asyncio
import collections
import json
import os
import signal
import struct
import threading
import time
import urllib.request

import aiohttp
import pytest

import rawwire
from clusterfixtures import running_cluster
from fwdclients import markers, publisher
from test_replication import connect, leader_of, publish_batches, stream_of, wait_placed
from rawwire import read_stream

pytestmark = pytest.mark.integration

PROTOCOLS = ("rmq", "bson", "zmq", "ws", "ream")
ALL_LISTENERS = ("--bson-port", "0", "--zmq-port", "0", "--ws-port", "0", "--text-port", "0", "--kafka-port", "0")


@pytest.fixture
def cluster3all(tmp_path, etcd):
    """etcd and three nodes with every listener on (loopback, port 0)."""
    with running_cluster(tmp_path, etcd, extra=ALL_LISTENERS) as c:
        yield c


def forwarded_metric(srv, stream):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.ports['http']}/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(f'riverbed_forwarded_publishes_total{{stream="{stream}"}}'):
            return float(line.split()[-1])
    return 0.0


def ws_publish(srv, stream, first, n):
    """Publish ``n`` messages over a WebSocket; a resend after them waits for their commit (the
    session's read-your-writes), and no error frame may come."""
    async def go():
        async with aiohttp.ClientSession() as s:
            ws = await s.ws_connect(f"http://127.0.0.1:{srv.ports['ws']}/api/v1/ws")
            for i in range(first, first + n):
                msg = json.dumps({"m": f"ws-{i}"})
                await ws.send_str(json.dumps({"type": "publish", "stream": stream, "msg": msg}))
            await ws.send_str(json.dumps({"type": "resend", "stream": stream, "sub": "x", "resend_last": 1}))
            while True:
                msg = json.loads((await ws.receive(timeout=15)).data)
                assert msg[1] != 7, msg                     # TYPE_ERROR: a publish failed
                if msg[1] in (5, 6):                        # resent / no_resend
                    return
    asyncio.run(asyncio.wait_for(go(), 30))


def settled(cluster, stream, total):
    cluster.wait(lambda st: all(m["committed_offset"] == total and m["lag"] == 0
                                for m in stream_of(st, stream)["members"]), what=f"every member at {total}")


def test_every_protocol_publishes_through_non_leaders(cluster3all):
    c = cluster3all
    n1, n2, n3 = (c.nodes[n] for n in ("n1", "n2", "n3"))
    cl = connect(n1.port)
    assert cl.create("fwd") == rawwire.OK
    cl.close()
    wait_placed(c, "fwd")
    assert leader_of(c, "fwd") == "n1"
    # RabbitMQ Stream through n2: a named publisher, confirmed with the leader's majority
    confirmed, errors = publish_batches(n2.port, "fwd", 0, 300, batch=100, ref="p1")
    assert errors == {} and confirmed == set(range(300))
    # the same publisher retries the same ids through n3: confirmed again, stored once (the leader's
    # publisher sequence dropped them)
    confirmed, errors = publish_batches(n3.port, "fwd", 200, 100, batch=100, ref="p1")
    assert errors == {} and confirmed == set(range(200, 300))
    # every other protocol, acknowledged one by one, through a node that does not lead the stream
    sent = {"rmq": set(range(300))}
    for proto, srv in (("bson", n3), ("zmq", n2), ("ws", n3), ("ream", n2)):
        pub = publisher(proto, srv, "fwd")
        for i in range(20):
            assert pub.publish(i), (proto, i)
        pub.close()
        sent[proto] = set(range(20))
    ws_publish(n2, "fwd", 100, 20)          # WebSocket frames too (not only its REST publish)
    sent["ws"] |= set(range(100, 120))
    # Kafka does not forward: its Metadata names each partition's leader (a raw Produce to another node
    # gets NOT_LEADER_OR_FOLLOWER: tests/cluster/test_kafka_cluster.py), so a client bootstrapped from a
    # node that does not lead the stream produces to the leader itself, and no node counts it as forwarded
    from kafka import KafkaProducer
    kp = KafkaProducer(bootstrap_servers=f"127.0.0.1:{n3.ports['kafka']}", acks="all", retries=0,
                       enable_idempotence=False)
    kp.send("fwd", b"kafka-0").get(timeout=15)
    kp.close()
    total = 300 + 4 * 20 + 20
    settled(c, "fwd", total + 1)
    logs = {name: read_stream(srv.port, "fwd") for name, srv in c.nodes.items()}
    assert logs["n1"] == logs["n2"] == logs["n3"], "the members' logs differ"
    got = markers(logs["n1"])
    assert len(got) == total and len(set(got)) == total, ("a record is missing or stored twice",
                                                          collections.Counter(p for p, _ in got))
    assert sum(b"kafka-0" in r for r in logs["n1"]) == 1
    for proto in PROTOCOLS:
        assert {i for p, i in got if p == proto} == sent[proto], proto
    # the forwarding nodes count what they forwarded (records the leader stored); the leader forwards nothing
    assert forwarded_metric(n2, "fwd") == 300 + 20 + 20 + 20      # rmq, zmq, ream, ws frames
    assert forwarded_metric(n3, "fwd") == 20 + 20                 # bson, ws REST; the dedup retry stored 0
    assert forwarded_metric(n1, "fwd") == 0
    # a StoreOffset on a member reaches the leader and, with the log, every member
    cl = connect(n3.port)
    cl.send(rawwire.frame(0x0A, rawwire.s("reader-1") + rawwire.s("fwd") + struct.pack(">Q", 42)))
    cl.close()
    for srv in (n1, n2, n3):
        assert query_offset(srv.port, "fwd", "reader-1") == 42, srv
    stream_made_by_a_publish_is_found_by_the_other_nodes(c)
    publish_through_a_node_holding_no_copy(c)


def publish_through_a_node_holding_no_copy(c):
    """A stream on two of the three nodes: a RabbitMQ publisher on the third (a load balancer's pick)
    declares, publishes and queries its sequence there; the leader stores and answers."""
    cl = connect(c.nodes["n1"].port)
    assert cl.create("two", {"initial-cluster-size": "2"}) == rawwire.OK
    cl.close()
    st = wait_placed(c, "two")
    members = {m["node"] for m in stream_of(st, "two")["members"]}
    assert len(members) == 2
    outside = c.nodes[({"n1", "n2", "n3"} - members).pop()]
    confirmed, errors = publish_batches(outside.port, "two", 0, 50, batch=25, ref="p2")
    assert errors == {} and confirmed == set(range(50))
    cl = connect(outside.port)
    code, body = cl.request(0x05, rawwire.s("p2") + rawwire.s("two"))
    cl.close()
    assert (code, struct.unpack(">Q", body)[0]) == (rawwire.OK, 49)
    assert markers(read_stream(c.nodes["n1"].port, "two")) == [("rmq", i) for i in range(50)]


def stream_made_by_a_publish_is_found_by_the_other_nodes(c):
    """A publish creates a stream on n3 (REAM); publishes through n2 (BSON) and n1 (ZeroMQ) right after
    find it in etcd, before their own copies exist, and are forwarded to n3 rather than making rivals."""
    n1, n2, n3 = (c.nodes[n] for n in ("n1", "n2", "n3"))
    ream = publisher("ream", n3, "made")
    assert ream.publish(0)
    bsonp, zmqp = publisher("bson", n2, "made"), publisher("zmq", n1, "made")
    for i in range(10):
        assert bsonp.publish(i) and zmqp.publish(i) and ream.publish(i + 1)
    for p in (ream, bsonp, zmqp):
        p.close()
    st = wait_placed(c, "made")
    assert stream_of(st, "made")["leader"] == "n3" and stream_of(st, "made")["epoch"] == 1
    settled(c, "made", 31)
    logs = {name: read_stream(srv.port, "made") for name, srv in c.nodes.items()}
    assert logs["n1"] == logs["n2"] == logs["n3"]
    assert sorted(markers(logs["n1"])) == sorted([("ream", i) for i in range(11)] + [("bson", i) for i in range(10)]
                                                 + [("zmq", i) for i in range(10)])


def query_offset(port, stream, ref, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        cl = connect(port)
        try:
            code, body = cl.request(0x0B, rawwire.s(ref) + rawwire.s(stream))
        finally:
            cl.close()
        if code == rawwire.OK:
            return struct.unpack_from(">Q", body, 0)[0]
        assert time.monotonic() < deadline, f"no offset of {ref} on {port} (code {code})"
        time.sleep(0.1)


def malformed_forward_frames_drop_only_their_connection(cluster, node):
    """A forwarding connection with a malformed frame is closed by the leader; the node goes on."""
    import socket

    from riverbed.shells.cluster import forward_wire as fw
    from riverbed.shells.cluster import wire
    port = next(n["replication_port"] for n in cluster.status()["nodes"] if n["name"] == node)
    bad = [wire.frame(fw.FWD_APPEND, b"\x00" * 9 + b"\xff\xff"),                        # a name past the end
           wire.frame(fw.FWD_APPEND, struct.pack(">QB", 1, 0x80) + b"\x00\x01s\x00\x00" + b"\x00" * 8),
           wire.frame(fw.FWD_OFFSET, b"\x01"),
           wire.frame(fw.FWD_RESULT, b"")]                                                 # not the leader's to get
    for frame in bad:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(fw.encode_hello("intruder") + frame)
        assert s.recv(1024) == b"", "the connection stayed open"
        s.close()


@pytest.mark.parametrize("fault", ["kill", pytest.param("sigstop", marks=pytest.mark.slow)])
def test_kill_leader_while_every_protocol_publishes_through_other_nodes(cluster3all, fault):
    """kill -9 (or SIGSTOP) of the leader while the five protocols publish with acknowledgements through
    the other two nodes: every acknowledged message is in the final log (the RabbitMQ publisher, retried
    with its ids, exactly once), and the survivors hold the same log. A paused leader keeps its
    connections open: what it has not answered is resent or refused once etcd names another leader."""
    c = cluster3all
    cl = connect(c.nodes["n1"].port)
    assert cl.create("kl") == rawwire.OK
    cl.close()
    wait_placed(c, "kl")
    assert leader_of(c, "kl") == "n1"
    malformed_forward_frames_drop_only_their_connection(c, "n1")
    routes = {"rmq": "n2", "bson": "n3", "zmq": "n2", "ws": "n3", "ream": "n2"}
    acked = {p: set() for p in PROTOCOLS}
    after = dict.fromkeys(PROTOCOLS, 0)
    refused = dict.fromkeys(PROTOCOLS, 0)      # refusals and dropped connections (then the same message again)
    first_after = {}                           # protocol -> seconds from the kill to its first acknowledgement
    stop, killed = threading.Event(), threading.Event()
    t_kill = [0.0]

    def run(proto):
        srv = c.nodes[routes[proto]]
        pub, n = None, 0
        while not stop.is_set():
            try:
                if pub is None:
                    pub = publisher(proto, srv, "kl", ref="kill-ref")
                if pub.publish(n):
                    acked[proto].add(n)
                    if killed.is_set():
                        after[proto] += 1
                        first_after.setdefault(proto, time.monotonic() - t_kill[0])
                    n += 1
                else:
                    refused[proto] += 1
                    time.sleep(0.05)      # refused: the same message again (RabbitMQ: the same id)
            except (OSError, ConnectionError, AssertionError):
                refused[proto] += 1
                if pub is not None:
                    pub.close()
                pub = None
                time.sleep(0.1)
        if pub is not None:
            pub.close()
    threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in PROTOCOLS]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while min(len(a) for a in acked.values()) < 20:
            assert time.monotonic() < deadline, {p: len(a) for p, a in acked.items()}
            time.sleep(0.05)
        if fault == "kill":
            c.nodes["n1"].kill()
        else:
            os.kill(c.nodes["n1"].pid, signal.SIGSTOP)
        t_kill[0] = time.monotonic()
        killed.set()
        deadline = time.monotonic() + 40
        while min(after.values()) < 20:
            assert time.monotonic() < deadline, f"acknowledged after the kill: {after}"
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(15)
        if fault == "sigstop":
            os.kill(c.nodes["n1"].pid, signal.SIGCONT)
    new = leader_of(c, "kl", not_this="n1")
    other = ({"n2", "n3"} - {new}).pop()
    deadline = time.monotonic() + 20
    while True:
        logs = {n: read_stream(c.nodes[n].port, "kl") for n in (new, other)}
        if logs[new] == logs[other]:
            break
        assert time.monotonic() < deadline, "the survivors' logs differ"
        time.sleep(0.2)
    got = markers(logs[new])
    for proto in PROTOCOLS:
        stored = [i for p, i in got if p == proto]
        lost = sorted(acked[proto] - set(stored))
        assert not lost, f"{proto}: acknowledged messages lost: {lost[:10]}"
    rmq = [i for p, i in got if p == "rmq"]
    assert len(rmq) == len(set(rmq)), "the RabbitMQ publisher's retries were stored twice"
    stored = collections.Counter(p for p, _ in got)
    print(f"{fault} of the leader: acknowledged {({p: len(a) for p, a in acked.items()})}, stored {dict(stored)}, "
          f"refused/retried {refused}, first acknowledgement after the kill (s) "
          f"{({p: round(t, 2) for p, t in first_after.items()})}, new leader {new}")


@pytest.mark.slow
def test_pipelined_rabbitmq_publisher_through_a_non_leader_loses_nothing_on_leader_kill(cluster3):
    """A named RabbitMQ publisher keeps ~400 messages in flight through n2 while the leader n1 is killed:
    the forwarder resends what n1 had not confirmed to the next leader, in order (its ids make that
    safe), so every message is confirmed, stored once and in publishing-id order, and none is refused."""
    c = cluster3
    cl = connect(c.nodes["n1"].port)
    assert cl.create("pipe") == rawwire.OK
    cl.close()
    wait_placed(c, "pipe")
    pc = rawwire.RawClient(c.nodes["n2"].port, timeout=30)
    assert pc.handshake() == rawwire.OK and pc.declare_publisher(1, "pipe", "pipe-ref") == rawwire.OK
    confirmed, errors, stop = set(), {}, threading.Event()

    def read():
        while not stop.is_set():
            try:
                f = pc.recv_frame(0.5)
            except OSError:
                continue
            if f is None:
                return
            key, _, body = f
            n = struct.unpack_from(">i", body, 1)[0]
            if key == 0x03:
                confirmed.update(struct.unpack_from(">%dQ" % n, body, 5))
            elif key == 0x04:
                errors.update(struct.unpack_from(">QH", body, 5 + 10 * j) for j in range(n))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sent, t0, killed = 0, time.monotonic(), False
    try:
        while time.monotonic() - t0 < 6:
            while sent - len(confirmed) - len(errors) < 400:
                pc.publish(1, [(i, b"m-%d" % i) for i in range(sent, sent + 10)])
                sent += 10
            if not killed and time.monotonic() - t0 > 1.5:
                c.nodes["n1"].kill()
                killed = True
            time.sleep(0.002)
        deadline = time.monotonic() + 25
        while len(confirmed) + len(errors) < sent and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        reader.join(5)
        pc.close()
    new = leader_of(c, "pipe", not_this="n1")
    ids = [int(r[2:]) for r in read_stream(c.nodes[new].port, "pipe")]
    assert errors == {} and confirmed == set(range(sent))
    assert ids == list(range(sent)), "a message was lost, stored twice or out of order"

"""Super stream definitions on every node of a cluster (issue 25, shells/cluster/superstreams.py): made,
grown or deleted through one node with any protocol, they answer the same everywhere (RabbitMQ Route and
Partitions, Kafka Metadata), and a Kafka client bootstrapped from another node uses them."""

import os
import socket
import struct
import sys
import time

import pytest

import rawwire
from clusterproc import Cluster

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "integration"))
from test_kafka_clients import raw_call  # noqa: E402
from test_kafka_cluster import http  # noqa: E402
from test_replication import wait_placed  # noqa: E402

from riverbed.shells.kafka import codec as C  # noqa: E402
from riverbed.shells.kafka.shell import partition_name  # noqa: E402
from riverbed.shells.rmq_stream.constants import RC_STREAM_ALREADY_EXISTS, RC_STREAM_DOES_NOT_EXIST  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

CMD_ROUTE, CMD_PARTITIONS, CMD_CREATE_SUPER, CMD_DELETE_SUPER = 0x18, 0x19, 0x1D, 0x1E


def strings(items):
    return struct.pack(">i", len(items)) + b"".join(rawwire.s(x) for x in items)


def read_strings(body):
    n, = struct.unpack_from(">i", body, 0)
    pos, out = 4, []
    for _ in range(n):
        ln, = struct.unpack_from(">h", body, pos)
        out.append(body[pos + 2:pos + 2 + ln].decode())
        pos += 2 + ln
    return out


def client(port):
    c = rawwire.RawClient(port)
    assert c.handshake() == rawwire.OK
    return c


def answers(port, name, keys):
    """``(Partitions, {key: Route})`` of super stream ``name`` as the node at ``port`` answers them (a
    response code instead of a list when it is not OK)."""
    c = client(port)
    try:
        code, body = c.request(CMD_PARTITIONS, rawwire.s(name))
        parts = read_strings(body) if code == rawwire.OK else code
        routes = {}
        for k in keys:
            code, body = c.request(CMD_ROUTE, rawwire.s(k) + rawwire.s(name))
            routes[k] = read_strings(body) if code == rawwire.OK else code
        return parts, routes
    finally:
        c.close()


def wait_for(cond, timeout=20, what="the condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_rmq_super_stream_made_on_one_node_routes_the_same_on_every_node(cluster3):
    names = sorted(cluster3.nodes)
    ports = {n: cluster3.nodes[n].port for n in names}
    c = client(ports["n1"])
    body = rawwire.s("inv") + strings(["inv-a", "inv-b", "inv-c"]) + strings(["a", "b", "c"]) + struct.pack(">i", 0)
    assert c.request(CMD_CREATE_SUPER, body)[0] == rawwire.OK
    c.close()
    # the same name with other partitions through n2 at once (before n2's next poll): etcd says it exists
    c = client(ports["n2"])
    other = rawwire.s("inv") + strings(["inv-x"]) + strings(["x"]) + struct.pack(">i", 0)
    assert c.request(CMD_CREATE_SUPER, other)[0] == RC_STREAM_ALREADY_EXISTS
    c.close()
    expected = (["inv-a", "inv-b", "inv-c"], {"a": ["inv-a"], "b": ["inv-b"], "c": ["inv-c"], "zz": []})
    for n in names:
        wait_for(lambda n=n: answers(ports[n], "inv", ["a", "b", "c", "zz"]) == expected, what=f"inv on {n}")

    # through n3's management API: n1 answers for it
    http_port = cluster3.nodes["n3"].ports["http"]
    assert http(http_port, "PUT", "/api/stream/super-streams/%2F/mg", {"partitions": 2}) in (201, 204)
    wait_for(lambda: answers(ports["n1"], "mg", ["0", "1"]) == (["mg-0", "mg-1"], {"0": ["mg-0"], "1": ["mg-1"]}),
             what="mg on n1")

    # deleted through n3 while n2 is down: gone on every node, its partitions too; n2, back, forgets its
    # copy (the tombstone) instead of bringing it back to the others
    for p in ("inv-a", "inv-b", "inv-c"):
        wait_placed(cluster3, p)
    cluster3.nodes["n2"].kill()
    c = client(ports["n3"])
    assert c.request(CMD_DELETE_SUPER, rawwire.s("inv"))[0] == rawwire.OK
    c.close()
    ports["n2"] = cluster3.restart("n2").port
    cluster3.wait(lambda st: all(n["up"] for n in st["nodes"]), what="n2 back")
    for n in names:
        wait_for(lambda n=n: answers(ports[n], "inv", [])[0] == RC_STREAM_DOES_NOT_EXIST, what=f"inv gone on {n}")
    cluster3.wait(lambda st: not any(s["name"].startswith("inv-") for s in st["streams"]),
                  what="the partitions deleted")
    time.sleep(1.0)          # several polls later, no node has published its old copy again
    assert all(answers(ports[n], "inv", [])[0] == RC_STREAM_DOES_NOT_EXIST for n in names)


def metadata_partitions(port, topic):
    """The partition count of ``topic`` in the Metadata of the node at ``port`` (None when unknown)."""
    frame = C.encode_request(C.API_METADATA, 9, 3, "t", {"topics": [{"name": topic}],
                                                         "allow_auto_topic_creation": False})
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        _, res = raw_call(s, frame, C.API_METADATA, 9)
    t = res["topics"][0]
    return len(t["partitions"]) if t["error_code"] == 0 else None


def test_kafka_topic_made_through_one_node_is_served_and_deleted_through_others(tmp_path, etcd):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    cluster = Cluster(tmp_path, etcd, extra=("--kafka-port", "0"))
    try:
        cluster.start()
        names = sorted(cluster.nodes)
        kafka = {n: cluster.nodes[n].ports["kafka"] for n in names}
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{kafka['n1']}"})
        admin.create_topics([NewTopic("kt3", 3, 1)])["kt3"].result(15)
        for n in names:
            wait_for(lambda n=n: metadata_partitions(kafka[n], "kt3") == 3, what=f"kt3 in {n}'s Metadata")
        for i in range(3):
            wait_placed(cluster, partition_name("kt3", i))

        boot = f"127.0.0.1:{kafka['n2']}"
        p = Producer({"bootstrap.servers": boot, "acks": "all", "linger.ms": 5})
        errors = []
        for v in range(300):
            p.produce("kt3", key=b"k%d" % v, value=b"%d" % v, on_delivery=lambda err, msg: err and errors.append(err))
        assert p.flush(60) == 0 and errors == []
        c = Consumer({"bootstrap.servers": f"127.0.0.1:{kafka['n3']}", "group.id": "g3",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.subscribe(["kt3"])
        seen, parts = set(), set()
        deadline = time.monotonic() + 60
        while len(seen) < 300 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                seen.add(int(m.value()))
                parts.add(m.partition())
        c.close()
        assert seen == set(range(300)) and parts == {0, 1, 2}

        # grown through n3 (CreatePartitions): the fourth partition is listed by every node
        admin3 = AdminClient({"bootstrap.servers": f"127.0.0.1:{kafka['n3']}"})   # kept: its futures need it
        admin3.create_partitions([NewPartitions("kt3", 4)])["kt3"].result(15)
        for n in names:
            wait_for(lambda n=n: metadata_partitions(kafka[n], "kt3") == 4, what=f"4 partitions in {n}'s Metadata")
        wait_placed(cluster, partition_name("kt3", 3))

        admin3.delete_topics(["kt3"])["kt3"].result(15)
        for n in names:
            wait_for(lambda n=n: metadata_partitions(kafka[n], "kt3") is None, what=f"kt3 gone from {n}")
    finally:
        cluster.stop()


def test_a_change_begun_here_and_never_ended_stops_holding_etcds_copy_back():
    """While a change to a super stream is under way on a node (begun, not yet written to etcd), the node
    does not apply etcd's copy of it (that would undo the change); a change whose caller failed between
    begin and end must not keep the node from following etcd for ever."""
    import types

    from riverbed.shells.cluster import superstreams as ss
    s = ss.SuperStreams(types.SimpleNamespace(engine=None, prefix="/t/"))
    s.begin("x")
    s.begin("x")
    s.ended("x")
    assert s.busy("x") and not s.busy("y")          # one change still under way
    s.ended("x")
    assert not s.busy("x")
    s.begin("x")                                     # never closed
    s._begun_at["x"] -= ss.BEGUN_STALE + 1
    assert not s.busy("x") and "x" not in s.dirty

"""Deleting a stream or a super stream in a cluster (issue 23: "Deleting a stream removes it from every
member; a member that was down when it was deleted removes it when it returns"): through any node, with
any protocol, whichever nodes hold and lead each partition, the stream is gone from every node's Metadata,
from ``riverbed cluster status`` and from every data directory; a member that was down forgets its copy
when it returns; the name can be made again and is placed ``balanced``; the nodes keep no per-stream state
of it (metric series, pending placements). Real etcd and three ``riverbed serve`` nodes, one cluster for
the module.

Partitions are made with ``initial-cluster-size=1`` where a test needs a node that holds no copy of some
of them (the bench's scale-up row does the same): the delete must then reach partitions the node it came
to has never held."""

import os
import socket
import struct
import sys
import time
import urllib.request

import pytest

import rawwire
from clusterfixtures import module_cluster
from test_replication import connect, publish_batches, stream_of, wait_placed

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "integration"))
from test_kafka_clients import raw_call  # noqa: E402
from test_kafka_cluster import http  # noqa: E402

from riverbed.engine.log import Engine  # noqa: E402
from riverbed.shells.kafka import codec as C  # noqa: E402
from riverbed.shells.rmq_stream.constants import RC_STREAM_DOES_NOT_EXIST, RC_STREAM_NOT_AVAILABLE  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

KEY_METADATA, KEY_METADATA_UPDATE, KEY_PARTITIONS, KEY_CREATE_SUPER, KEY_DELETE_SUPER = 0x0F, 0x10, 0x19, 0x1D, 0x1E
ONE_COPY = {"initial-cluster-size": "1"}
NODES = ("n1", "n2", "n3")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        # a node whose file is in this directory reads no new cluster state from etcd (viewhold.py)
        hold_dir = tmp_path_factory.mktemp("hold")
        mp.setenv("RIVERBED_CLUSTER_HOLD_DIR", str(hold_dir))
        with module_cluster(tmp_path_factory, "ssdel", extra=("--kafka-port", "0")) as c:
            c.hold_dir = hold_dir
            yield c


# ------------------------------------------------------------------------------------------- helpers

def strings(items):
    return struct.pack(">i", len(items)) + b"".join(rawwire.s(x) for x in items)


def create_super(port, name, parts, args=None):
    c = connect(port)
    try:
        body = rawwire.s(name) + strings(parts) + strings([str(i) for i in range(len(parts))]) + rawwire.props(args or {})
        return c.request(KEY_CREATE_SUPER, body, timeout=20)[0]
    finally:
        c.close()


def delete_super(port, name):
    c = connect(port)
    try:
        return c.request(KEY_DELETE_SUPER, rawwire.s(name), timeout=20)[0]
    finally:
        c.close()


def metadata_codes(port, streams):
    """``{stream: response code}`` of a Metadata request to the node at ``port``."""
    c = connect(port)
    try:
        corr = c.next_corr()
        c.send(rawwire.frame(KEY_METADATA, struct.pack(">I", corr) + strings(streams)))
        body = c.wait_for(KEY_METADATA | 0x8000, corr, timeout=10)
    finally:
        c.close()
    pos = 4
    (nb,) = struct.unpack_from(">i", body, pos)
    pos += 4
    for _ in range(nb):
        (hl,) = struct.unpack_from(">H", body, pos + 2)
        pos += 8 + hl
    (ns,) = struct.unpack_from(">i", body, pos)
    pos += 4
    out = {}
    for _ in range(ns):
        (sl,) = struct.unpack_from(">H", body, pos)
        name = body[pos + 2:pos + 2 + sl].decode()
        pos += 2 + sl
        code, _, nrep = struct.unpack_from(">HHi", body, pos)
        pos += 8 + 2 * nrep
        out[name] = code
    return out


def partitions_code(port, name):
    c = connect(port)
    try:
        return c.request(KEY_PARTITIONS, rawwire.s(name))[0]
    finally:
        c.close()


def local_streams(cluster, node):
    """The streams in ``node``'s data directory (read-only, as ``riverbed dump`` reads it while it runs)."""
    eng = Engine(str(cluster.data_dir(node)), readonly=True)
    try:
        return set(eng.list_streams())
    finally:
        eng.close()


def wait_for(cond, timeout=20, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def metrics(srv):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.ports['http']}/metrics", timeout=10) as r:
        return r.read().decode()


def series_of(text, stream):
    """The metric lines of ``text`` that carry ``stream="<stream>"``."""
    label = f'stream="{stream}"'
    return [line for line in text.splitlines() if not line.startswith("#") and label in line]


def gauge(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def leaders(cluster, parts):
    st = cluster.wait(lambda st: all(stream_of(st, p) and stream_of(st, p)["leader"] for p in parts),
                      what=f"leaders of {parts}")
    return {p: stream_of(st, p)["leader"] for p in parts}


def assert_gone_everywhere(cluster, names, superstream=None):
    """``names`` (and ``superstream``) deleted on the cluster: absent from the status at once (the delete
    was answered once etcd held it), then from every node's Metadata and data directory."""
    st = cluster.status_cli()
    assert not [s["name"] for s in st["streams"] if s["name"] in names], st["streams"]
    for n in NODES:
        srv = cluster.nodes[n]
        wait_for(lambda: set(metadata_codes(srv.port, list(names)).values()) == {RC_STREAM_DOES_NOT_EXIST},
                 what=f"{names} gone from {n}'s Metadata")
        wait_for(lambda: not (local_streams(cluster, n) & set(names)), what=f"{names} gone from {n}'s data directory")
        if superstream is not None:
            wait_for(lambda: partitions_code(srv.port, superstream) == RC_STREAM_DOES_NOT_EXIST,
                     what=f"super stream {superstream} gone on {n}")


def make_spread_super(cluster, port, name, args=ONE_COPY):
    """Super stream ``name`` of three partitions made through ``port``, each led by another node."""
    parts = [f"{name}-{i}" for i in range(3)]
    assert create_super(port, name, parts, args) == rawwire.OK
    where = leaders(cluster, parts)
    assert sorted(where.values()) == list(NODES), where      # balanced: one leader per node
    for p in parts:
        wait_placed(cluster, p)
    return parts, where


# --------------------------------------------------------------------------------------------- tests

def test_super_stream_deleted_through_one_node_is_gone_from_every_node_and_made_again_balanced(cluster):
    n1 = cluster.nodes["n1"]
    parts, where = make_spread_super(cluster, n1.port, "ss")
    for p in parts:          # data in every partition, on the node leading it
        confirmed, errors = publish_batches(cluster.nodes[where[p]].port, p, 0, 20, batch=10, ref="d")
        assert errors == {} and len(confirmed) == 20
    # n1 made them all, then dropped the copies it is no member of: the other two live only on n2 and n3
    wait_for(lambda: local_streams(cluster, "n1") & set(parts) == {p for p in parts if where[p] == "n1"},
             what="n1 holding its own partition alone")
    assert delete_super(n1.port, "ss") == rawwire.OK
    assert_gone_everywhere(cluster, parts, superstream="ss")

    # the same name again, through another node: placed balanced (nothing of the old one counts)
    parts, _ = make_spread_super(cluster, cluster.nodes["n2"].port, "ss")
    assert delete_super(cluster.nodes["n3"].port, "ss") == rawwire.OK
    assert_gone_everywhere(cluster, parts, superstream="ss")


def test_super_stream_with_a_copy_on_every_node_deleted_through_one_is_gone_everywhere(cluster):
    parts, _ = make_spread_super(cluster, cluster.nodes["n2"].port, "full", args={})
    assert delete_super(cluster.nodes["n1"].port, "full") == rawwire.OK
    assert not [s["name"] for s in cluster.status()["streams"] if s["name"] in parts]
    # made again at once through another node (n1 answered once etcd held the deletion and the
    # definition's tombstone: the name is free for every node)
    assert create_super(cluster.nodes["n3"].port, "full", parts, {}) == rawwire.OK
    where = leaders(cluster, parts)
    assert sorted(where.values()) == list(NODES), where
    for p in parts:
        wait_placed(cluster, p)
    assert delete_super(cluster.nodes["n1"].port, "full") == rawwire.OK
    assert_gone_everywhere(cluster, parts, superstream="full")


def test_kafka_delete_topics_removes_every_partition_on_every_node(cluster):
    from confluent_kafka.admin import AdminClient
    parts, where = make_spread_super(cluster, cluster.nodes["n1"].port, "kt")
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{cluster.nodes['n2'].ports['kafka']}"})
    admin.delete_topics(["kt"])["kt"].result(20)
    assert_gone_everywhere(cluster, parts, superstream="kt")


def test_plain_stream_deleted_through_a_node_holding_no_copy_and_through_a_member(cluster):
    n1, n3 = cluster.nodes["n1"], cluster.nodes["n3"]
    c = connect(n3.port)
    assert c.create("solo", dict(ONE_COPY, **{"queue-leader-locator": "client-local"})) == rawwire.OK
    c.close()
    wait_placed(cluster, "solo")
    # published through n1, which holds no copy: forwarded to n3, counted in n1's metric
    confirmed, errors = publish_batches(n1.port, "solo", 0, 10, batch=5, ref="f")
    assert errors == {} and len(confirmed) == 10
    assert series_of(metrics(n1), "solo"), "n1 counts its forwarded publishes"
    assert "solo" not in local_streams(cluster, "n1")
    # a publisher on n2, which holds no copy either: told when the stream goes, as RabbitMQ tells it
    n2 = cluster.nodes["n2"]
    pub = connect(n2.port)
    assert pub.declare_publisher(1, "solo", "p2") == rawwire.OK
    assert pub.publish_confirmed(1, [(i, b"m") for i in range(5)]) == (set(range(5)), {})
    assert series_of(metrics(n2), "solo")
    c = connect(n1.port)
    assert c.delete("solo") == rawwire.OK
    c.close()
    assert_gone_everywhere(cluster, ["solo"])
    update = pub.wait_for(KEY_METADATA_UPDATE, timeout=10)
    assert struct.unpack_from(">H", update, 0)[0] == RC_STREAM_NOT_AVAILABLE and update[4:] == b"solo"
    pub.close()
    # no node keeps a metric series of the deleted stream (forwarded publishes, replica lag, ...)
    for n in NODES:
        wait_for(lambda: not series_of(metrics(cluster.nodes[n]), "solo"), what=f"solo's series gone on {n}")

    # a stream on every node, led by n1, deleted through a member that does not lead it
    c = connect(n1.port)
    assert c.create("led") == rawwire.OK
    c.close()
    st = wait_placed(cluster, "led")
    assert stream_of(st, "led")["leader"] == "n1"
    c = connect(cluster.nodes["n2"].port)
    assert c.delete("led") == rawwire.OK
    c.close()
    assert_gone_everywhere(cluster, ["led"])
    for n in NODES:
        wait_for(lambda: not series_of(metrics(cluster.nodes[n]), "led"), what=f"led's series gone on {n}")

    # the management API of a node holding no copy (RabbitMQ's DELETE /api/queues)
    c = connect(n3.port)
    assert c.create("viahttp", dict(ONE_COPY, **{"queue-leader-locator": "client-local"})) == rawwire.OK
    c.close()
    wait_placed(cluster, "viahttp")
    assert http(n1.ports["http"], "DELETE", "/api/queues/%2F/viahttp") == 204
    assert_gone_everywhere(cluster, ["viahttp"])


def test_super_stream_deleted_while_a_member_is_down_is_removed_when_it_returns(cluster):
    parts, where = make_spread_super(cluster, cluster.nodes["n1"].port, "away")
    down = next(n for n in ("n2", "n3") if n in where.values())
    own = {p for p in parts if where[p] == down}
    cluster.nodes[down].kill()
    assert delete_super(cluster.nodes["n1"].port, "away") == rawwire.OK
    st = cluster.status_cli()
    assert not [s["name"] for s in st["streams"] if s["name"] in parts]
    # its copy is still on its disk while it is away
    assert own <= local_streams(cluster, down)
    cluster.restart(down)
    cluster.wait(lambda st: all(n["up"] for n in st["nodes"]), what=f"{down} back")
    assert_gone_everywhere(cluster, parts, superstream="away")
    time.sleep(1.0)          # several reconciles later, nothing came back
    assert not [s["name"] for s in cluster.status()["streams"] if s["name"] in parts]
    parts, _ = make_spread_super(cluster, cluster.nodes["n2"].port, "away")
    assert delete_super(cluster.nodes["n2"].port, "away") == rawwire.OK
    assert_gone_everywhere(cluster, parts, superstream="away")


def partitions_of(port, name):
    c = connect(port)
    try:
        code, body = c.request(KEY_PARTITIONS, rawwire.s(name))
    finally:
        c.close()
    if code != rawwire.OK:
        return code
    n, = struct.unpack_from(">i", body, 0)
    pos, out = 4, []
    for _ in range(n):
        ln, = struct.unpack_from(">h", body, pos)
        out.append(body[pos + 2:pos + 2 + ln].decode())
        pos += 2 + ln
    return out


def test_a_partition_deleted_through_a_node_holding_no_copy_leaves_its_super_stream_everywhere(cluster):
    """As a deleted queue's bindings go with it on RabbitMQ: every node's Partitions stops naming it, and
    no node's reconcile brings it back from etcd."""
    parts, where = make_spread_super(cluster, cluster.nodes["n1"].port, "bnd")
    victim = next(p for p in parts if where[p] != "n1")
    wait_for(lambda: victim not in local_streams(cluster, "n1"), what="n1 holding no copy of " + victim)
    c = connect(cluster.nodes["n1"].port)
    assert c.delete(victim) == rawwire.OK
    c.close()
    assert_gone_everywhere(cluster, [victim])
    left = [p for p in parts if p != victim]
    for n in NODES:
        wait_for(lambda: partitions_of(cluster.nodes[n].port, "bnd") == left, what=f"bnd without {victim} on {n}")
    time.sleep(1.0)          # several reconciles later
    assert all(partitions_of(cluster.nodes[n].port, "bnd") == left for n in NODES)
    assert delete_super(cluster.nodes["n2"].port, "bnd") == rawwire.OK
    assert_gone_everywhere(cluster, left, superstream="bnd")


def test_a_stream_made_again_through_a_node_that_has_not_seen_its_deletion_is_placed_anew(cluster):
    """n3's view of etcd is held (a watch event late): it still has the deleted stream's placement when a
    client makes the name again through it. The creation asks etcd, so the new stream is placed, and
    when n3's view catches up the tombstone does not take it away."""
    n1, n3 = cluster.nodes["n1"], cluster.nodes["n3"]
    c = connect(n1.port)
    assert c.create("again", dict(ONE_COPY, **{"queue-leader-locator": "client-local"})) == rawwire.OK
    c.close()
    wait_placed(cluster, "again")
    assert "again" not in local_streams(cluster, "n3")
    (cluster.hold_dir / "n3").touch()
    try:
        c = connect(n1.port)
        assert c.delete("again") == rawwire.OK
        c.close()
        c = connect(n3.port)
        assert c.create("again", dict(ONE_COPY, **{"queue-leader-locator": "client-local"})) == rawwire.OK
        c.close()
        st = cluster.wait(lambda st: stream_of(st, "again") is not None, what="again placed anew")
        assert stream_of(st, "again")["leader"] == "n3"
    finally:
        (cluster.hold_dir / "n3").unlink()
    time.sleep(1.5)          # n3's view caught up with the deletion (and the tombstone it left)
    st = cluster.status()
    assert stream_of(st, "again") is not None and stream_of(st, "again")["leader"] == "n3"
    assert "again" in local_streams(cluster, "n3")
    confirmed, errors = publish_batches(n3.port, "again", 0, 5, batch=5, ref="a")
    assert errors == {} and len(confirmed) == 5
    c = connect(n1.port)
    assert c.delete("again") == rawwire.OK
    c.close()
    assert_gone_everywhere(cluster, ["again"])


def kafka_metadata_autocreate(port, topic):
    frame = C.encode_request(C.API_METADATA, 9, 7, "t", {"topics": [{"name": topic}],
                                                         "allow_auto_topic_creation": True})
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        _, res = raw_call(s, frame, C.API_METADATA, 9)
    return res["topics"][0]["error_code"]


def test_pending_leaders_do_not_grow(cluster):
    """A stream a publish makes is led where it was made until etcd places it (the node's pending
    leaders): the entry goes once the placement is known, and also when the creation fails."""
    for n in NODES:
        assert gauge(metrics(cluster.nodes[n]), "riverbed_cluster_pending_leaders") == 0
    n1 = cluster.nodes["n1"]
    # auto-created topics whose name the engine refuses (over 255 bytes): each creation fails
    for i in range(5):
        assert kafka_metadata_autocreate(n1.ports["kafka"], f"{i}" + "x" * 300) != 0
    # and ones that work: made, placed, then known
    for i in range(3):
        kafka_metadata_autocreate(n1.ports["kafka"], f"auto{i}")
    for i in range(3):
        wait_placed(cluster, f"auto{i}")
    wait_for(lambda: gauge(metrics(n1), "riverbed_cluster_pending_leaders") == 0, timeout=10,
             what="no pending leader left on n1")
    for i in range(3):
        c = connect(n1.port)
        assert c.delete(f"auto{i}") == rawwire.OK
        c.close()

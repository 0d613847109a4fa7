"""A stream's members changed on a running cluster (issue 23): ``riverbed cluster add-replica`` copies the
log to a new member byte for byte and it then follows; ``delete-replica`` takes a member off (the leader
hands over first) and deletes its copy; the leader locator places leaders (client-local, balanced), and a
super stream's partitions spread their leaders over the nodes."""

import struct
import subprocess
import sys
import time

import pytest

import rawwire
from test_replication import chunk_lines, connect, dump, publish_batches, stream_of, wait_placed

pytestmark = pytest.mark.integration

KEY_CREATE_SUPER_STREAM = 0x1D


def cli(cluster, *argv, timeout=60):
    """``riverbed cluster ARGV --etcd ... --cluster test``: (exit status, stdout + stderr)."""
    out = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "cluster", *argv, "--etcd", cluster.etcd.url,
                          "--cluster", "test", "--timeout", "30"], capture_output=True, text=True, timeout=timeout)
    return out.returncode, out.stdout + out.stderr


def has_stream(port, stream):
    c = connect(port)
    try:
        code, _ = c.request(0x1C, rawwire.s(stream))       # StreamStats: 0x02 when it does not exist
        return code == rawwire.OK
    finally:
        c.close()


def members(st, stream):
    return [m["node"] for m in stream_of(st, stream)["members"]]


def test_add_replica_copies_the_log_byte_identical_then_follows(cluster3):
    from rawwire import read_stream
    n1, n2 = cluster3.nodes["n1"], cluster3.nodes["n2"]
    cl = connect(n1.port)
    # the nodes run --fsync never; this stream asks for fsync=always, on every member (its arguments
    # travel with the placement): replication and fsync together
    assert cl.create("solo", {"initial-cluster-size": "1", "queue-leader-locator": "client-local",
                              "fsync": "always"}) == rawwire.OK
    cl.close()
    st = wait_placed(cluster3, "solo")
    assert members(st, "solo") == ["n1"]
    confirmed, errors = publish_batches(n1.port, "solo", 0, 2000, batch=200)
    assert len(confirmed) == 2000 and not errors
    assert not has_stream(n2.port, "solo")

    rc, out = cli(cluster3, "add-replica", "solo", "n2")
    assert rc == 0, out
    assert "n2 is a member of solo" in out
    st = cluster3.status()
    assert members(st, "solo") == ["n1", "n2"] and stream_of(st, "solo")["learners"] == []
    # it follows: new publishes are confirmed only once both hold them (a majority of two), and reach n2
    confirmed, errors = publish_batches(n1.port, "solo", 2000, 500, batch=100)
    assert len(confirmed) == 500 and not errors
    cluster3.wait(lambda st: all(m["committed_offset"] == 2500 and m["lag"] == 0
                                 for m in stream_of(st, "solo")["members"]), what="n2 at 2500")
    assert read_stream(n2.port, "solo") == [b"m-%d" % i for i in range(2500)]

    # clear refusals, nothing changed
    for argv, exit_status, text in (
            (("add-replica", "solo", "n2"), 1, "already a member"),
            (("add-replica", "nosuch", "n2"), 1, "unknown stream"),
            (("add-replica", "solo", "n9"), 1, "unknown node"),
            (("delete-replica", "solo", "n3"), 1, "not a member")):
        rc, out = cli(cluster3, *argv)
        assert rc == exit_status and text in out, (argv, rc, out)
    cluster3.nodes["n3"].kill()
    cluster3.wait(lambda st: not any(n["name"] == "n3" and n["up"] for n in st["nodes"]), what="n3 down")
    rc, out = cli(cluster3, "add-replica", "solo", "n3")
    assert rc == 1 and "is down" in out, out
    assert members(cluster3.status(), "solo") == ["n1", "n2"]

    # the copy is the leader's chunks as stored: the dump lines (offsets, epochs, CRCs) agree
    for name in ("n1", "n2"):
        cluster3.nodes[name].stop()
    texts = {n: dump(cluster3.data_dir(n), "solo") for n in ("n1", "n2")}
    d1, d2 = (chunk_lines(texts[n], 2500) for n in ("n1", "n2"))
    assert len(d1) > 1 and d1 == d2
    assert all("'fsync': 'always'" in t for t in texts.values()), texts["n2"][:300]


def test_delete_replica_follower_then_leader_hands_over_last_member_stays(cluster3):
    from rawwire import read_stream
    n1 = cluster3.nodes["n1"]
    cl = connect(n1.port)
    assert cl.create("trio", {"queue-leader-locator": "client-local"}) == rawwire.OK
    cl.close()
    st = wait_placed(cluster3, "trio")
    assert stream_of(st, "trio")["leader"] == "n1" and sorted(members(st, "trio")) == ["n1", "n2", "n3"]
    confirmed, errors = publish_batches(n1.port, "trio", 0, 300, ref="p")
    assert len(confirmed) == 300 and not errors

    # a follower that is down: off the placement now, its copy deleted when it returns
    cluster3.nodes["n3"].kill()
    cluster3.wait(lambda st: not any(n["name"] == "n3" and n["up"] for n in st["nodes"]), what="n3 down")
    rc, out = cli(cluster3, "delete-replica", "trio", "n3")
    assert rc == 0 and "deleted when it returns" in out, out
    assert sorted(members(cluster3.status(), "trio")) == ["n1", "n2"]
    n3 = cluster3.restart("n3")
    deadline = time.monotonic() + 15
    while has_stream(n3.port, "trio"):
        assert time.monotonic() < deadline, "n3 kept its copy"
        time.sleep(0.1)
    confirmed, errors = publish_batches(n1.port, "trio", 300, 100, ref="p")
    assert len(confirmed) == 100 and not errors

    # the leader: it hands leadership to n2 first, then leaves
    rc, out = cli(cluster3, "delete-replica", "trio", "n1")
    assert rc == 0, out
    st = cluster3.status()
    s = stream_of(st, "trio")
    assert s["leader"] == "n2" and members(st, "trio") == ["n2"] and s["epoch"] == 2
    n2 = cluster3.nodes["n2"]
    deadline = time.monotonic() + 10
    while True:       # n2 takes the lead at its next poll of etcd (a fraction of the lease TTL)
        ok, errors = publish_batches(n2.port, "trio", 400, 100, ref="p")
        if len(ok) == 100:
            break
        assert time.monotonic() < deadline, f"n2 does not confirm: {errors}"
        time.sleep(0.1)
    assert read_stream(n2.port, "trio") == [b"m-%d" % i for i in range(500)]
    deadline = time.monotonic() + 10
    while has_stream(n1.port, "trio"):
        assert time.monotonic() < deadline, "n1 kept its copy"
        time.sleep(0.1)

    # the last member stays
    rc, out = cli(cluster3, "delete-replica", "trio", "n2")
    assert rc == 1 and "last member" in out, out
    assert members(cluster3.status(), "trio") == ["n2"]


def test_leader_locator_client_local_and_balanced_and_super_stream_spread(cluster3):
    n1, n2 = cluster3.nodes["n1"], cluster3.nodes["n2"]
    cl = connect(n2.port)
    assert cl.create("here", {"queue-leader-locator": "client-local"}) == rawwire.OK
    assert cl.create("bad", {"queue-leader-locator": "nowhere"}) != rawwire.OK
    cl.close()
    assert stream_of(wait_placed(cluster3, "here"), "here")["leader"] == "n2"

    # balanced (the default): the node leading the fewest streams. n2 leads one, so a stream created on n1
    # is led by n1, the next one (asked of n1 again) by n3
    cl = connect(n1.port)
    assert cl.create("b1") == rawwire.OK
    assert cl.create("b2", {"x-queue-leader-locator": "balanced"}) == rawwire.OK
    cl.close()
    wait_placed(cluster3, "b1")
    st = wait_placed(cluster3, "b2")
    assert stream_of(st, "b1")["leader"] == "n1" and stream_of(st, "b2")["leader"] == "n3"
    # answered once the leader leads: a publish to it right after the create is confirmed
    ok, errors = publish_batches(cluster3.nodes["n3"].port, "b2", 0, 50)
    assert len(ok) == 50 and not errors

    # a super stream of three partitions, asked of n1: one leader on each node
    partitions = ["ss-0", "ss-1", "ss-2"]
    body = (rawwire.s("ss") + struct.pack(">i", 3) + b"".join(rawwire.s(p) for p in partitions)
            + struct.pack(">i", 3) + b"".join(rawwire.s(str(k)) for k in range(3)) + rawwire.props({}))
    c = connect(n1.port)
    try:
        code, _ = c.request(KEY_CREATE_SUPER_STREAM, body, timeout=15)
        assert code == rawwire.OK
    finally:
        c.close()
    for p in partitions:
        st = wait_placed(cluster3, p)
    leaders = {p: stream_of(st, p)["leader"] for p in partitions}
    assert sorted(leaders.values()) == ["n1", "n2", "n3"], leaders
    for p, leader in leaders.items():
        ok, errors = publish_batches(cluster3.nodes[leader].port, p, 0, 10, batch=10)
        assert len(ok) == 10 and not errors, (p, leader, errors)

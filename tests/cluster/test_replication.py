"""A stream on three real nodes joined through a real etcd (issue 23): membership, replication byte for
byte, confirms only once a majority holds a chunk, readers limited to the committed offset, failover."""

import os
import signal
import struct
import subprocess
import sys
import time

import pytest

import rawwire

pytestmark = pytest.mark.integration

KEY_SUBSCRIBE = 0x07
KEY_DELIVER = 0x08
OFFSET_FIRST = 1


def connect(port):
    c = rawwire.RawClient(port)
    assert c.handshake() == rawwire.OK
    return c


def stream_of(st, name):
    return next((s for s in st["streams"] if s["name"] == name), None)


def publish_batches(port, stream, first_id, n, batch=100, ref="", timeout=10.0):
    """Publish ``n`` messages (ids from ``first_id``) in batches; returns (confirmed ids, {id: error})."""
    c = connect(port)
    try:
        assert c.declare_publisher(1, stream, ref) == rawwire.OK
        confirmed, errors = set(), {}
        for start in range(first_id, first_id + n, batch):
            ids = range(start, min(start + batch, first_id + n))
            ok, bad = c.publish_confirmed(1, [(i, b"m-%d" % i) for i in ids], timeout=timeout)
            confirmed |= ok
            errors.update(bad)
        return confirmed, errors
    finally:
        c.close()



def dump(data_dir, stream):
    out = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "dump", data_dir, "--stream", stream],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def chunk_lines(text, upto):
    """The chunk lines of a dump for chunks below offset ``upto``."""
    lines = []
    for line in text.splitlines():
        f = line.split()
        if f and f[0].isdigit() and int(f[0]) < upto:
            lines.append(line)
    return lines


def test_status_lists_the_nodes(cluster3):
    st = cluster3.status()
    assert st["cluster"] == "test"
    assert sorted(n["name"] for n in st["nodes"]) == ["n1", "n2", "n3"]
    for n in st["nodes"]:
        assert n["up"] and n["stream_port"] == cluster3.nodes[n["name"]].port and n["replication_port"] > 0
        assert n["advertised_host"] == "127.0.0.1" and set(n) >= {"http_port", "leads"}


def test_replication_byte_identical_and_majority_confirms(cluster3):
    n1 = cluster3.nodes["n1"]
    c = connect(n1.port)
    assert c.create("orders") == rawwire.OK
    c.close()
    st = cluster3.wait(lambda st: stream_of(st, "orders") is not None, what="the placement")
    s = stream_of(st, "orders")
    assert s["leader"] == "n1" and s["epoch"] == 1 and sorted(m["node"] for m in s["members"]) == ["n1", "n2", "n3"]
    confirmed, errors = publish_batches(n1.port, "orders", 0, 3000)
    assert errors == {} and len(confirmed) == 3000
    st = cluster3.wait(lambda st: all(m["committed_offset"] == 3000 and m["lag"] == 0
                                      for m in stream_of(st, "orders")["members"]), what="all members at 3000")
    # a follower refuses a publish: only the leader appends
    _, errors = publish_batches(cluster3.nodes["n2"].port, "orders", 5000, 10, batch=10)
    assert len(errors) == 10
    for srv in cluster3.nodes.values():
        srv.stop()
    dumps = {name: chunk_lines(dump(cluster3.data_dir(name), "orders"), 3000) for name in cluster3.nodes}
    assert len(dumps["n1"]) > 1
    assert dumps["n1"] == dumps["n2"] == dumps["n3"]

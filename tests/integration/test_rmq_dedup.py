"""Publisher deduplication through the real server, with raw frames (issue 19, item 1).

A named publisher (DeclarePublisher with a reference) whose reference has no stored sequence has seen
nothing: its id 0 is new, as in RabbitMQ (Osiris), while QueryPublisherSequence still answers 0 for it.
Only an id at or below the highest id stored for that reference is a duplicate (confirmed, not stored).
Each path that decides a duplicate is driven here: Publish v1 (the compiled fast path), Publish v2 with
filter values, sub-entry batches, super-stream partitions, after a restart (the writer's cache is cold and
the sequence comes from LMDB) and after the stream is deleted and created again.
"""

import struct

import pytest

import rawwire
from procs import ServerProcess
from rawwire import connect, entry_records, frame, props, read_stream, s  # noqa: F401  (older cluster tests import read_stream, entry_records from here)

pytestmark = pytest.mark.integration

KEY_PUBLISH = 0x02
KEY_QUERY_PUBLISHER_SEQUENCE = 0x05
KEY_CREATE_SUPER_STREAM = 0x1D
KEY_DELETE_SUPER_STREAM = 0x1E


# ------------------------------------------------------------------------------------ raw helpers

def query_sequence(c, ref, stream):
    code, rest = c.request(KEY_QUERY_PUBLISHER_SEQUENCE, s(ref) + s(stream))
    return code, struct.unpack_from(">Q", rest)[0]


def simple(body):
    return struct.pack(">I", len(body)) + body


def sub_batch(records):
    """An uncompressed sub-entry batch of ``records`` (an Osiris sub-batch entry)."""
    inner = b"".join(simple(r) for r in records)
    return struct.pack(">BHII", 0x80, len(records), len(inner), len(inner)) + inner


def publish_entries(c, pid, entries, timeout=5.0):
    """Publish v1 of ``[(publishing id, entry bytes)]`` and wait for a confirm or error of each id."""
    body = struct.pack(">Bi", pid, len(entries)) + b"".join(struct.pack(">Q", i) + e for i, e in entries)
    c.send(frame(KEY_PUBLISH, body))
    return c.wait_confirms({i for i, _ in entries}, timeout)


def publish_v2(c, pid, messages, timeout=5.0):
    """Publish v2 of ``[(publishing id, filter value, bytes)]``; waits as publish_entries."""
    body = struct.pack(">Bi", pid, len(messages)) + b"".join(
        struct.pack(">Q", i) + s(fv) + simple(m) for i, fv, m in messages)
    c.send(frame(KEY_PUBLISH, body, version=2))
    return c.wait_confirms({i for i, _, _ in messages}, timeout)


@pytest.fixture
def conn(server):
    c = connect(server.port)
    yield c
    c.close()


# ------------------------------------------------------------------------------------ the paths

def test_unknown_reference_publishing_0_1_2_stores_all_three(server, conn):
    """The issue's reproduction: DeclarePublisher(7, "ref-1", s), Publish [0, 1, 2]: three confirms,
    and three records (not two: id 0 of a reference that stored nothing is not a duplicate)."""
    stream = "dedup-repro"
    assert conn.create(stream) == rawwire.OK
    assert conn.declare_publisher(7, stream, "ref-1") == rawwire.OK
    assert query_sequence(conn, "ref-1", stream) == (rawwire.OK, 0)
    confirmed, errors = conn.publish_confirmed(7, [(0, b"m0"), (1, b"m1"), (2, b"m2")])
    assert sorted(confirmed) == [0, 1, 2] and not errors
    assert read_stream(server.port, stream) == [b"m0", b"m1", b"m2"], "a confirmed message was not stored"
    assert query_sequence(conn, "ref-1", stream) == (rawwire.OK, 2)


def test_id_0_alone_then_again_is_stored_once(server, conn):
    """Publish [0] then [0] again, in separate frames: the second is the true duplicate."""
    stream = "dedup-zero-twice"
    assert conn.create(stream) == rawwire.OK
    assert conn.declare_publisher(1, stream, "ref-z") == rawwire.OK
    assert sorted(conn.publish_confirmed(1, [(0, b"first")])[0]) == [0]
    assert sorted(conn.publish_confirmed(1, [(0, b"again")])[0]) == [0]     # confirmed, as RabbitMQ does
    assert read_stream(server.port, stream) == [b"first"]
    assert query_sequence(conn, "ref-z", stream) == (rawwire.OK, 0)


def test_repeated_id_0_within_one_frame_keeps_the_first(server, conn):
    """Ids [0, 0, 1] in one frame (not increasing: the slow path): the second 0 is dropped."""
    stream = "dedup-zero-in-frame"
    assert conn.create(stream) == rawwire.OK
    assert conn.declare_publisher(1, stream, "ref-f") == rawwire.OK
    confirmed, errors = publish_entries(conn, 1, [(0, simple(b"a")), (0, simple(b"b")), (1, simple(b"c"))])
    assert sorted(confirmed) == [0, 0, 1] and not errors
    assert read_stream(server.port, stream) == [b"a", b"c"]


def test_publish_v2_with_filter_values_keeps_id_0(server, conn):
    stream = "dedup-v2"
    assert conn.create(stream) == rawwire.OK
    assert conn.declare_publisher(2, stream, "ref-v2") == rawwire.OK
    confirmed, errors = publish_v2(conn, 2, [(0, "eu", b"a"), (1, "us", b"b"), (2, "eu", b"c")])
    assert sorted(confirmed) == [0, 1, 2] and not errors
    confirmed, errors = publish_v2(conn, 2, [(2, "eu", b"dup"), (3, "us", b"d")])
    assert sorted(confirmed) == [2, 3] and not errors
    assert read_stream(server.port, stream) == [b"a", b"b", b"c", b"d"]


def test_sub_entry_batch_with_id_0_is_stored(server, conn):
    """A sub-entry batch carries one publishing id for all its records: id 0 keeps its three records."""
    stream = "dedup-sub-batch"
    assert conn.create(stream) == rawwire.OK
    assert conn.declare_publisher(3, stream, "ref-sb") == rawwire.OK
    confirmed, errors = publish_entries(conn, 3, [(0, sub_batch([b"a", b"b", b"c"])), (1, sub_batch([b"d"]))])
    assert sorted(confirmed) == [0, 1] and not errors
    confirmed, errors = publish_entries(conn, 3, [(1, sub_batch([b"dup"])), (2, sub_batch([b"e", b"f"]))])
    assert sorted(confirmed) == [1, 2] and not errors
    assert read_stream(server.port, stream) == [b"a", b"b", b"c", b"d", b"e", b"f"]


def test_super_stream_partitions_each_keep_id_0(server, conn):
    """A super-stream producer declares one publisher per partition with the same reference; each
    partition has its own sequence, so id 0 is new on each of them."""
    partitions = ["dedup-ss-0", "dedup-ss-1", "dedup-ss-2"]
    body = (s("dedup-ss") + struct.pack(">i", 3) + b"".join(s(p) for p in partitions)
            + struct.pack(">i", 3) + b"".join(s(str(k)) for k in range(3)) + props({}))
    code, _ = conn.request(KEY_CREATE_SUPER_STREAM, body)
    assert code == rawwire.OK
    for pid, p in enumerate(partitions):
        assert conn.declare_publisher(pid, p, "ss-producer") == rawwire.OK
    for pid, p in enumerate(partitions):
        confirmed, errors = conn.publish_confirmed(pid, [(0, p.encode() + b"-0"), (1, p.encode() + b"-1")])
        assert sorted(confirmed) == [0, 1] and not errors
    for p in partitions:
        assert read_stream(server.port, p) == [p.encode() + b"-0", p.encode() + b"-1"]
        assert query_sequence(conn, "ss-producer", p) == (rawwire.OK, 1)


def test_deleted_and_recreated_super_stream_partitions_start_with_no_sequence(server, conn):
    """DeleteSuperStream then CreateSuperStream of the same partitions: each partition's reference has
    seen nothing again."""
    partitions = ["dedup-ss-rc-0", "dedup-ss-rc-1"]
    body = (s("dedup-ss-rc") + struct.pack(">i", 2) + b"".join(s(p) for p in partitions)
            + struct.pack(">i", 2) + s("0") + s("1") + props({}))
    for rnd in (b"old", b"new"):
        code, _ = conn.request(KEY_CREATE_SUPER_STREAM, body)
        assert code == rawwire.OK
        for pid, p in enumerate(partitions):
            assert query_sequence(conn, "ss-rc", p) == (rawwire.OK, 0)
            assert conn.declare_publisher(10 + pid, p, "ss-rc") == rawwire.OK
            confirmed, errors = conn.publish_confirmed(10 + pid, [(0, rnd + b"0"), (1, rnd + b"1")])
            assert sorted(confirmed) == [0, 1] and not errors
        for p in partitions:
            assert read_stream(server.port, p) == [rnd + b"0", rnd + b"1"]
        for pid in range(len(partitions)):
            code, _ = conn.request(0x06, struct.pack(">B", 10 + pid))       # DeletePublisher
            assert code == rawwire.OK
        code, _ = conn.request(KEY_DELETE_SUPER_STREAM, s("dedup-ss-rc"))
        assert code == rawwire.OK


def test_deleted_and_recreated_stream_starts_with_no_sequence(server, conn):
    """After Delete and Create of the same name the reference has seen nothing again: no sequence
    lingers in the writer's cache or in LMDB."""
    stream = "dedup-recreate"
    assert conn.create(stream) == rawwire.OK
    assert conn.declare_publisher(4, stream, "ref-rc") == rawwire.OK
    assert sorted(conn.publish_confirmed(4, [(i, b"old%d" % i) for i in range(5)])[0]) == list(range(5))
    assert query_sequence(conn, "ref-rc", stream) == (rawwire.OK, 4)
    assert conn.delete(stream) == rawwire.OK
    assert conn.create(stream) == rawwire.OK
    assert query_sequence(conn, "ref-rc", stream) == (rawwire.OK, 0)
    assert conn.declare_publisher(5, stream, "ref-rc") == rawwire.OK
    confirmed, errors = conn.publish_confirmed(5, [(0, b"new0"), (1, b"new1"), (2, b"new2")])
    assert sorted(confirmed) == [0, 1, 2] and not errors
    assert read_stream(server.port, stream) == [b"new0", b"new1", b"new2"]


def test_after_a_restart_unknown_references_keep_id_0_and_known_ones_dedup(tmp_path):
    """Restart: the writer's sequence cache is cold, so each decision reads LMDB; a reference stored
    before the restart drops its old ids, one never stored keeps id 0."""
    srv = ServerProcess(tmp_path / "data").start()
    try:
        c = connect(srv.port)
        assert c.create("r") == rawwire.OK
        assert c.declare_publisher(1, "r", "known") == rawwire.OK
        assert sorted(c.publish_confirmed(1, [(0, b"k0"), (1, b"k1")])[0]) == [0, 1]
        c.close()
        assert srv.stop() == 0, srv.log()
        srv.start()
        c = connect(srv.port)
        assert query_sequence(c, "known", "r") == (rawwire.OK, 1)
        assert query_sequence(c, "fresh", "r") == (rawwire.OK, 0)
        assert c.declare_publisher(1, "r", "fresh") == rawwire.OK
        assert c.declare_publisher(2, "r", "known") == rawwire.OK
        assert sorted(c.publish_confirmed(1, [(0, b"f0"), (1, b"f1")])[0]) == [0, 1]
        assert sorted(c.publish_confirmed(2, [(1, b"k1-dup"), (2, b"k2")])[0]) == [1, 2]
        c.close()
        assert read_stream(srv.port, "r") == [b"k0", b"k1", b"f0", b"f1", b"k2"]
    finally:
        srv.stop()

"""The one-message path of the RabbitMQ Stream session (issue 26): ``_publish_alone`` beside the general
path (``_received`` -> ``_dispatch`` -> ``_publish_v1`` -> ``_send_confirm`` -> ``_flush``).

The same reads go to two sessions over two engines, one with the fast path and one without it: the client
must get the same bytes, the engines must store the same chunks (byte for byte, with the engine clock
fixed) and the same publisher sequence, and the log must say the same. Then the parser that picks the
frames (``wire.publish_alone``) against its pure twin, and the limits it leaves to the general path.
"""

import dataclasses
import logging
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rstream import schema
from rstream.encoding import decode_frame, encode_publish

from riverbed.engine import core
from riverbed.shells import _pywire, wire
from riverbed.shells import rmq_stream as rs

from .conftest import Harness, split_out

PROPERTY = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
needs_compiled = pytest.mark.skipif(wire.NO_EXTENSIONS, reason="RIVERBED_NO_EXTENSIONS=1")
ENGINE_MS = 1_700_000_000_000       # the engines' clock: the chunks' timestamps equal on both sides


def publish(publisher_id, messages):
    return encode_publish(schema.Publish(publisher_id, [schema.Message(i, None, body) for i, body in messages]), 1)


def sub_batch_frame(publisher_id, pid, records):
    inner = core.encode_entries(records)
    body = struct.pack(">Bi", publisher_id, 1) + struct.pack(">QBHII", pid, 0x80, len(records), len(inner),
                                                              len(inner)) + inner
    return rs.frame(rs.CMD_PUBLISH, body)


# each item is one read; the first four are one Publish frame alone (the fast path's), the others not
READS = [
    publish(1, [(7, b"one")]),                                  # unnamed publisher: no deduplication
    publish(2, [(10, b"named")]),                               # named: its sequence stored with it
    publish(2, [(11, b"a"), (12, b"b"), (13, b"c")]),           # several messages, one chunk, one confirm
    publish(2, [(12, b"again")]),                               # a duplicate: confirmed, not stored
    publish(9, [(1, b"nobody")]),                               # undeclared publisher: PublishError
    sub_batch_frame(1, 8, [b"s1", b"s2"]),                      # a sub-batch entry
    publish(1, [(20, b"x")]) + publish(2, [(21, b"y")]),        # two frames in one read
    publish(1, [(22, b"p")])[:10],                              # a frame cut across two reads ...
    publish(1, [(22, b"p")])[10:],                              # ... and its rest
    publish(1, [(23, b"z")])[:-1],                              # a frame that is not whole yet ...
    b"z" + publish(1, [(24, b"w")]),                            # ... ends with this byte, then another frame
]
FAST_READS = 4


def run(tmp_path, fast, caplog):
    """Send READS to a fresh session; returns (what the client got after each read, the stored chunks,
    the named publisher's sequence, the log, the keys the general dispatch saw per read)."""
    h = Harness(tmp_path)
    h.eng.clock = lambda: ENGINE_MS
    try:
        c = h.connect()
        c.handshake()
        c.create("s")
        assert c.declare(1, "s") == rs.RC_OK and c.declare(2, "s", ref="app") == rs.RC_OK
        if not fast:
            c.s._publish_alone = lambda data: False
        seen = []
        general = c.s._dispatch
        c.s._dispatch = lambda f: (seen[-1].append(struct.unpack_from(">H", f)[0]), general(f))
        c.io.out.clear()
        c.io.writes = 0
        got = []
        caplog.clear()
        for data in READS:
            seen.append([])
            c.send_raw(data)
            h.settle()
            got.append((bytes(c.io.out), c.io.writes))
            c.io.out.clear()
            c.io.writes = 0
        log = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
        chunks = [(cid, bytes(chunk)) for cid, chunk in h.eng.read_chunks("s", 0, 100)]
        return got, chunks, h.eng.query_publisher_sequence("s", "app"), log, seen
    finally:
        h.close()


def test_fast_and_general_paths_give_the_same_bytes_chunks_and_log(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="riverbed")
    fast = run(tmp_path / "fast", True, caplog)
    slow = run(tmp_path / "slow", False, caplog)
    assert fast[0] == slow[0]               # the client's bytes, read by read, and one write each
    assert fast[1] == slow[1]               # the stored chunks, byte for byte
    assert fast[2] == slow[2] == 21         # the named publisher's sequence
    assert fast[3] == slow[3]               # the log
    # the one-frame reads took the fast path: the general dispatch never saw them
    assert fast[4][:FAST_READS] == [[]] * FAST_READS
    assert slow[4][:FAST_READS] == [[rs.CMD_PUBLISH]] * FAST_READS
    assert fast[4][FAST_READS:] == slow[4][FAST_READS:]
    replies = [[decode_frame(f, 1) for f in split_out(bytearray(out))] for out, _ in fast[0]]
    assert [r.publishing_ids for r in replies[0] + replies[1] + replies[2] + replies[3]] == \
        [[7], [10], [11, 12, 13], [12]]
    assert isinstance(replies[4][0], schema.PublishError)
    stored = [r for chunk in fast[1] for r in core.chunk_records(chunk[1])]
    assert stored == [b"one", b"named", b"a", b"b", b"c", b"s1", b"s2", b"x", b"y", b"p", b"z", b"w"]


def test_a_frame_alone_is_confirmed_in_the_read_with_one_write(tmp_path):
    h = Harness(tmp_path)
    try:
        c = h.connect()
        c.handshake()
        c.create("s")
        c.declare(1, "s")
        c.io.writes = 0
        c.send_raw(publish(1, [(5, b"one")]))
        # committed and confirmed before data_received returned: nothing left for the loop
        assert c.io.writes == 1 and h.q.empty() and not h.broker._inbox
        assert bytes(c.io.out) == struct.pack(">IHHBiQ", 17, rs.CMD_PUBLISH_CONFIRM, 1, 1, 1, 5)
        assert [rec for _, rec in h.eng.scan("s")] == [b"one"]          # a confirm means stored
    finally:
        h.close()


def test_a_busy_writer_takes_the_frame_the_usual_way(tmp_path):
    h = Harness(tmp_path)
    try:
        c = h.connect()
        c.handshake()
        c.create("s")
        c.declare(1, "s", ref="p")
        writer = h.eng._writer
        with writer._claim:                 # busy: the frame goes to the writer's queue, unconfirmed
            c.send_raw(publish(1, [(1, b"a")]))
            assert bytes(c.io.out) == b"" and c.s.pending_ops == 1
        deadline = time.monotonic() + 10
        while writer._outstanding and time.monotonic() < deadline:
            time.sleep(0.001)
        # committed, its completion not delivered yet: the next frame must not be confirmed before it
        c.send_raw(publish(1, [(2, b"b")]))
        assert bytes(c.io.out) == b""
        assert [i for f in c.frames() for i in f.publishing_ids] == [1, 2]
        assert [rec for _, rec in h.eng.scan("s")] == [b"a", b"b"]
        assert h.eng.query_publisher_sequence("s", "p") == 2
    finally:
        h.close()


def test_limits_are_the_general_paths_before_any_work(tmp_path):
    h = Harness(tmp_path)
    try:
        c = h.connect()
        c.s.limits = dataclasses.replace(c.s.limits, max_entries_per_frame=2)
        c.handshake()
        c.create("s")
        c.declare(1, "s")
        c.send_raw(publish(1, [(1, b"a"), (2, b"b"), (3, b"c")]))
        (close,) = [f for f in c.frames() if isinstance(f, schema.Close)]
        assert close.code == rs.RC_FRAME_TOO_LARGE and c.io.closed
        assert list(h.eng.scan("s")) == []
    finally:
        h.close()


def test_a_small_frame_max_keeps_confirms_within_it(tmp_path):
    h = Harness(tmp_path)
    try:
        c = h.connect()
        c.handshake(frame_max=8192)         # at most (8192 - 13) // 8 = 1022 ids per PublishConfirm
        c.create("s")
        c.declare(1, "s")
        assert c.s._alone_entries == 1022
        seen = []
        general = c.s._dispatch
        c.s._dispatch = lambda f: (seen.append(f), general(f))
        c.send_raw(publish(1, [(i, b"x") for i in range(1000)]))       # its confirm fits: the fast path
        assert seen == []
        c.send_raw(publish(1, [(i, b"x") for i in range(1000, 1100)] * 11))    # 1,100 ids: the general path
        assert len(seen) == 1
        confirms = [decode_frame(f, 1) for f in c.raw_frames()]
        assert [i for x in confirms for i in x.publishing_ids] == list(range(1000)) + list(range(1000, 1100)) * 11
    finally:
        h.close()


# ---- the parser: wire.publish_alone ----------------------------------------------------------------------

def test_publish_alone_takes_one_whole_plain_frame(wire_twin):
    f = publish(3, [(7, b"hello"), (9, b"rabbit")])
    pub, count, chunk, ids, first, last, increasing, records, confirm = wire_twin.publish_alone(f, 1 << 16, 100)
    assert (pub, count, first, last, increasing, records) == (3, 2, 7, 9, True, 2)
    assert (chunk, ids) == wire_twin.publish_chunk(f[4:], False)[2:4]
    assert confirm == struct.pack(">IHHBiQQ", 25, rs.CMD_PUBLISH_CONFIRM, 1, 3, 2, 7, 9)
    assert decode_frame(confirm[4:], 1).publishing_ids == [7, 9]


@pytest.mark.parametrize("data, max_size, max_entries", [
    (publish(1, [(1, b"x")])[:-1], 1 << 16, 10),                        # not whole
    (publish(1, [(1, b"x")]) + b"\x00", 1 << 16, 10),                   # more than one frame
    (publish(1, [(1, b"x")]), 20, 10),                                  # over max_size
    (publish(1, [(1, b"x"), (2, b"y")]), 1 << 16, 1),                   # over max_entries
    (publish(1, []), 1 << 16, 10),                                      # no message
    (encode_publish(schema.Publish(1, [schema.Message(1, "f", b"x")]), 2), 1 << 16, 10),   # version 2
    (rs.frame(rs.CMD_HEARTBEAT, b""), 1 << 16, 10),                     # another command
    (sub_batch_frame(1, 1, [b"a"]), 1 << 16, 10),                       # a sub-batch entry
    (rs.frame(rs.CMD_PUBLISH, struct.pack(">Bi", 1, 1) + struct.pack(">QI", 1, 5) + b"ab"), 1 << 16, 10),
    (b"", 1 << 16, 10),
])
def test_publish_alone_leaves_everything_else_to_the_general_path(wire_twin, data, max_size, max_entries):
    assert wire_twin.publish_alone(data, max_size, max_entries) is None


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # the exception type and message are part of the contract
        return ("error", type(exc), str(exc))


@needs_compiled
@PROPERTY
@given(messages=st.lists(st.tuples(st.integers(0, 2**64 - 1) | st.integers(0, 5), st.binary(max_size=30)),
                         max_size=6),
       flips=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 255)), max_size=2),
       cut=st.integers(0, 300), tail=st.binary(max_size=2), max_size=st.integers(0, 400),
       max_entries=st.integers(0, 8))
def test_twins_agree_on_publish_alone(messages, flips, cut, tail, max_size, max_entries):
    from riverbed.shells import _wire
    f = bytearray(publish(1, messages))
    for pos, value in flips:
        if pos < len(f):
            f[pos] = value
    f = bytes(f[:cut]) + tail if cut < len(f) else bytes(f)
    assert _outcome(_wire.publish_alone, f, max_size, max_entries) == \
        _outcome(_pywire.publish_alone, f, max_size, max_entries)

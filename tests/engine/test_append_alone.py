"""The one-message commit (issue 26): ``Engine.append_chunk_now`` -> ``_Writer.append_alone`` ->
``_commit_alone``, whose byte work is one compiled call (``core.stamp_chunk``, with its pure twin).

What it stores must be what the general group commit stores for the same append: two engines with the
same clock take the same appends, one through ``append_chunk_now`` and one through ``append_chunk``,
and must end with the same chunks, the same stream state and the same publisher sequences."""

import os
import struct
import sys
import zlib

import pytest

from riverbed.engine import Engine, PublishingIds, core
from riverbed.engine.errors import ChunkError, StreamNotFound
from riverbed.shells import wire

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import twins  # noqa: E402

ENGINE_MS = 1_700_000_000_000
needs_compiled = pytest.mark.skipif(core.NO_EXTENSIONS, reason="RIVERBED_NO_EXTENSIONS=1")


def sealed(records):
    """A Publish frame's chunk: header and data, its CRC left 0 (wire.publish_chunk with crc=False)."""
    body = b"".join(struct.pack(">QI", i, len(r)) + r for i, r in enumerate(records))
    payload = struct.pack(">HHBi", 2, 1, 0, len(records)) + body
    return wire.publish_chunk(payload, False)[2]


# ---- core.stamp_chunk ----------------------------------------------------------------------------------

def test_stamp_chunk_stamps_in_place(twin):
    chunk = sealed([b"hello", b"rabbit"])
    assert twin.stamp_chunk(chunk, 42, ENGINE_MS, 3, True) is None
    h = core.check_chunk(chunk)             # the CRC is right now
    assert (h[4], h[5], h[6], h[7]) == (ENGINE_MS, 3, 42, zlib.crc32(bytes(chunk[48:])))
    again = sealed([b"hello", b"rabbit"])
    twin.stamp_chunk(again, 42, ENGINE_MS, 3, False)     # the CRC left as it was
    assert again[:32] == chunk[:32] and again[32:36] == b"\0\0\0\0" and again[36:] == chunk[36:]
    before = sealed([b"x"])
    twin.stamp_chunk(before, 0, -5, 1, True)             # a time before 1970
    assert core.read_header(before)[4] == -5


@needs_compiled
@pytest.mark.parametrize("args", [
    (bytes(60), 0, 0, 1, True),                 # not a bytearray
    (bytearray(47), 0, 0, 1, True),             # shorter than the header
    (bytearray(48), 2**64, 0, 1, True),         # chunk id over u64
    (bytearray(48), -1, 0, 1, True),
    (bytearray(48), 0, 2**63, 1, True),         # timestamp over i64
    (bytearray(48), 0, -2**63 - 1, 1, True),
    (bytearray(48), 0, 0, -1, True),            # epoch under u64
    (bytearray(48), 7, -1, 2**64 - 1, True),    # an empty data section: fine
])
def test_stamp_chunk_twins_agree(args):
    from riverbed.engine import _core, _pycore
    a = bytearray(args[0]) if type(args[0]) is bytearray else args[0]
    b = bytearray(args[0]) if type(args[0]) is bytearray else args[0]
    assert twins.outcome(_core.stamp_chunk, a, *args[1:]) == twins.outcome(_pycore.stamp_chunk, b, *args[1:])
    assert a == b


def test_stamp_chunk_refuses_what_is_not_a_chunk(twin):
    with pytest.raises(TypeError):
        twin.stamp_chunk(bytes(60), 0, 0, 1, True)
    short = bytearray(47)
    with pytest.raises(ChunkError, match="shorter than the 48-byte chunk header"):
        twin.stamp_chunk(short, 0, 0, 1, True)
    assert short == bytearray(47)


# ---- append_chunk_now against the general commit ---------------------------------------------------------

@pytest.fixture
def pair(tmp_path):
    """Two engines on the same clock: ``fsync=never`` (inline commits) and ``batch``, whose appends all
    take the writer thread's general group commit (what is stored does not depend on the policy)."""
    engines = []
    for name, fsync in (("now", "never"), ("queued", "batch")):
        e = Engine(tmp_path / name, fsync=fsync, retention_interval=0, clock=lambda: ENGINE_MS)
        e.create_stream("s").result(10)
        engines.append(e)
    yield engines
    for e in engines:
        e.close()


def ids_of(*ids):
    raw = b"".join(struct.pack(">Q", i) for i in ids)
    return PublishingIds(raw, ids[0], ids[-1], all(a < b for a, b in zip(ids, ids[1:])))


APPENDS = [     # (records, publisher, ids)
    ([b"one"], None, None),
    ([b"two"], "app", (5,)),
    ([b"three", b"four"], "app", (6, 7)),
    ([b"dup"], "app", (6,)),                # a duplicate: the general path inside append_alone drops it
    ([b"five"], "other", (0,)),
    ([b"six"], None, None),
]


def test_append_chunk_now_stores_what_the_group_commit_stores(pair):
    now, queued = pair
    results = []
    for records, publisher, ids in APPENDS:
        got = now.append_chunk_now("s", sealed(records), num_entries=len(records), num_records=len(records),
                                   publishing_ids=ids_of(*ids) if ids else None, publisher=publisher,
                                   crc_done=False)
        assert got is not None and got[1] is None
        want = queued.append_chunk("s", sealed(records), num_entries=len(records), num_records=len(records),
                                   publishing_ids=ids_of(*ids) if ids else None, publisher=publisher,
                                   crc_done=False).result(10)
        assert got[0] == want
        results.append(got[0])
    assert results[3].duplicates == [6] and results[3].first_offset == -1
    assert now.read_chunks("s", 0, 100) == queued.read_chunks("s", 0, 100)
    assert now.stream_info("s") == queued.stream_info("s")
    for ref in ("app", "other"):
        assert now.query_publisher_sequence("s", ref) == queued.query_publisher_sequence("s", ref)
    assert [r for _, r in now.scan("s")] == [b"one", b"two", b"three", b"four", b"five", b"six"]
    # the stored state, reopened
    pair.remove(now)
    now.close()
    again = Engine(now.path, fsync="never", retention_interval=0)
    try:
        assert again.stream_info("s") == queued.stream_info("s")
        assert again.query_publisher_sequence("s", "app") == 7
    finally:
        again.close()


def test_append_chunk_now_does_nothing_when_it_cannot_commit_now(pair):
    eng = pair[0]
    with eng._writer._claim:                # the writer is busy
        assert eng.append_chunk_now("s", sealed([b"x"]), num_entries=1, num_records=1) is None
    eng.create_stream("synced", {"fsync": "batch"}).result(10)
    assert eng.append_chunk_now("synced", sealed([b"x"]), num_entries=1, num_records=1) is None
    assert list(eng.scan("s")) == [] and list(eng.scan("synced")) == []
    res, exc = eng.append_chunk_now("gone", sealed([b"x"]), num_entries=1, num_records=1)
    assert res is None and isinstance(exc, StreamNotFound)

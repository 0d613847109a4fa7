"""``publish_chunk``: a RabbitMQ Stream Publish v1 payload turned into a sealed chunk in one pass.

The shells' wire parser (:mod:`riverbed.shells.wire`; the chunk it builds is the engine's). Golden bytes
built by hand, both twins (``wire_twin`` fixture), a differential property test over valid and
damaged frames, and the engine's ``append_chunk`` taking the result (dedup, splitting, stamping).
"""

import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.engine import Engine, PublishingIds, _pycore, core
from riverbed.engine.errors import FrameError
from riverbed.engine.format import COMPRESSION_GZIP, gzip_compress
from riverbed.shells import _pywire, wire

PROPERTY = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])
needs_compiled = pytest.mark.skipif(wire.NO_EXTENSIONS, reason="RIVERBED_NO_EXTENSIONS=1")

# ---- golden bytes ---------------------------------------------------------------------------------------

GOLDEN_PUBLISH = bytes.fromhex(
    # off  field                value
    "0002"                # 0   key u16            2 (Publish)
    "0001"                # 2   version u16        1
    "05"                  # 4   PublisherId u8     5
    "00000002"            # 5   count i32          2
    "0000000000000007"    # 9   PublishingId u64   7
    "00000005"            # 17  simple entry       0:1 | Length:31 = 5
    "68656c6c6f"          # 21  body               b"hello"
    "0000000000000009"    # 26  PublishingId u64   9
    "00000006"            # 34  simple entry       0:1 | Length:31 = 6
    "726162626974"        # 38  body               b"rabbit"
)                         # 44  end

# The chunk: the data section is the frame minus the two ids; chunk id, timestamp and epoch are 0 for
# the writer to stamp. Same data section as GOLDEN_CHUNK in tests/engine/test_core.py, so the same CRC.
GOLDEN_SEALED = bytes.fromhex(
    "50"                  # 0   magic | version
    "00"                  # 1   ChunkType u8       0 (user)
    "0002"                # 2   NumEntries u16     2
    "00000002"            # 4   NumRecords u32     2
    "0000000000000000"    # 8   Timestamp i64      0 (stamped by the writer)
    "0000000000000000"    # 16  Epoch u64          0
    "0000000000000000"    # 24  ChunkId u64        0 (stamped by the writer)
    "e7e6de8b"            # 32  DataCrc u32        crc32 of bytes 48..66
    "00000013"            # 36  DataLength u32     19
    "00000000"            # 40  TrailerLen u32     0
    "00"                  # 44  BloomSize u8       0
    "000000"              # 45  Reserved
    "00000005" "68656c6c6f" "00000006" "726162626974"   # 48 data section
)


def publish_frame(messages, publisher_id=0, count=None):
    """A Publish v1 payload (key and version included) from ``[(id, entry bytes)]``."""
    body = b"".join(struct.pack(">Q", pid) + entry for pid, entry in messages)
    return struct.pack(">HHBi", 2, 1, publisher_id, len(messages) if count is None else count) + body


def test_golden_publish_becomes_the_golden_chunk(wire_twin):
    pub, count, chunk, ids, first, last, increasing, records, subs = wire_twin.publish_chunk(GOLDEN_PUBLISH)
    assert (pub, count, first, last, increasing, records, subs) == (5, 2, 7, 9, True, 2, [])
    assert type(chunk) is bytearray and bytes(chunk) == GOLDEN_SEALED
    assert ids == bytes.fromhex("0000000000000007" "0000000000000009")
    # exactly what the engine's own encoder builds for the same records
    assert chunk == core.encode_chunk_buffer([b"hello", b"rabbit"])
    assert core.check_chunk(chunk)[7] == zlib.crc32(GOLDEN_SEALED[48:]) == 0xE7E6DE8B


def test_sub_batch_counts_its_records_and_is_located(wire_twin):
    inner = core.encode_entries([b"one", b"two", b"three"])
    body = gzip_compress(inner)
    sub = struct.pack(">BHII", 0x80 | COMPRESSION_GZIP << 4, 3, len(inner), len(body)) + body
    f = publish_frame([(1, struct.pack(">I", 1) + b"a"), (2, sub), (3, struct.pack(">I", 0))])
    pub, count, chunk, ids, first, last, increasing, records, subs = wire_twin.publish_chunk(f)
    assert (count, records, first, last, increasing) == (3, 5, 1, 3, True)
    start = 9 + 13 + 8 + 11
    assert subs == [(1, 0x90, 3, len(inner), start, start + len(body))]
    assert f[start:start + len(body)] == body
    assert core.chunk_records(chunk) == [b"a", b"one", b"two", b"three", b""]


def test_empty_publish_and_id_order_flag(wire_twin):
    out = wire_twin.publish_chunk(publish_frame([]))
    assert out[1:] == (0, bytearray(core.encode_chunk([], 0, 0)), b"", 0, 0, True, 0, [])
    entry = struct.pack(">I", 1) + b"x"
    assert wire_twin.publish_chunk(publish_frame([(5, entry), (5, entry)]))[6] is False     # repeated
    assert wire_twin.publish_chunk(publish_frame([(5, entry), (4, entry)]))[6] is False     # falling
    assert wire_twin.publish_chunk(publish_frame([(2**64 - 2, entry), (2**64 - 1, entry)]))[4:7] == \
        (2**64 - 2, 2**64 - 1, True)


def test_more_than_65535_messages_leave_the_counts_zero(wire_twin):
    n = 65536
    f = publish_frame([(i, struct.pack(">I", 1) + bytes([i & 0xFF])) for i in range(n)])
    _, count, chunk, ids, first, last, increasing, records, _ = wire_twin.publish_chunk(f)
    assert (count, records, first, last, increasing, len(ids)) == (n, n, 0, n - 1, True, 8 * n)
    h = core.read_header(chunk)
    assert (h[2], h[3], h[8]) == (0, 0, 5 * n)     # NumEntries cannot hold 65536: not sealable
    assert core.data_records(chunk[48:], n, n)[-1] == bytes([(n - 1) & 0xFF])


@pytest.mark.parametrize("raw, message", [
    (b"\x00\x02\x00\x01", "Publish frame too short"),
    (struct.pack(">HHBi", 2, 1, 0, 1), "Publish message count 1 does not fit the frame"),
    (struct.pack(">HHBi", 2, 1, 0, -1), "Publish message count -1 does not fit the frame"),
    (struct.pack(">HHBi", 2, 1, 0, 10 ** 9), "Publish message count 1000000000 does not fit the frame"),
    (struct.pack(">HHBiQI", 2, 1, 0, 1, 1, 100) + b"short", "Publish frame ends inside a message"),
    (struct.pack(">HHBiQI", 2, 1, 0, 1, 1, 1) + b"ab", "1 bytes left over after 1 messages"),
    (struct.pack(">HHBiQBH", 2, 1, 0, 1, 1, 0x80, 1) + b"\x00", "Publish frame ends inside a message"),
    # the first message swallows the room the second one needs
    (struct.pack(">HHBiQI", 2, 1, 0, 2, 1, 12) + b"x" * 12, "Publish frame ends inside a message"),
    (struct.pack(">HHBiQBHII", 2, 1, 0, 1, 1, 0x80, 1, 5, 9) + b"x" * 5, "Publish frame ends inside a message"),
])
def test_malformed_publish_raises_frame_error(wire_twin, raw, message):
    with pytest.raises(FrameError) as info:
        wire_twin.publish_chunk(raw)
    assert str(info.value) == message


# ---- differential: both twins, same input, same outcome -------------------------------------------------

def _outcome(fn, arg):
    try:
        return ("ok", fn(arg))
    except Exception as exc:  # the exception type and message are part of the contract
        return ("error", type(exc), str(exc))


entry_st = st.one_of(
    st.binary(max_size=40).map(lambda b: struct.pack(">I", len(b)) + b),
    st.lists(st.binary(max_size=10), max_size=4).map(lambda recs: _pycore.encode_sub_batch(recs)),
    st.lists(st.binary(max_size=10), max_size=4).map(
        lambda recs: _pycore.encode_sub_batch(recs, COMPRESSION_GZIP, gzip_compress)),
)
messages_st = st.lists(st.tuples(st.integers(0, 2**64 - 1) | st.integers(0, 20), entry_st), max_size=12)


@needs_compiled
@PROPERTY
@given(messages=messages_st, publisher_id=st.integers(0, 255))
def test_twins_agree_on_valid_frames(messages, publisher_id):
    from riverbed.shells import _wire
    f = publish_frame(messages, publisher_id)
    a, b = _outcome(_wire.publish_chunk, f), _outcome(_pywire.publish_chunk, f)
    assert a == b and a[0] == "ok"
    _, count, chunk, ids, first, last, increasing, records, subs = a[1]
    assert count == len(messages) and ids == b"".join(struct.pack(">Q", pid) for pid, _ in messages)
    assert chunk[48:] == b"".join(e for _, e in messages)
    assert core.check_chunk(chunk)[2] == count
    assert increasing == all(messages[i][0] < messages[i + 1][0] for i in range(len(messages) - 1))
    assert len(subs) == sum(1 for _, e in messages if e[0] & 0x80)


@needs_compiled
@PROPERTY
@given(messages=messages_st, flips=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=3),
       cut=st.integers(0, 2000), count_delta=st.integers(-2, 2), tail=st.binary(max_size=3))
def test_twins_agree_on_damaged_frames(messages, flips, cut, count_delta, tail):
    from riverbed.shells import _wire
    f = bytearray(publish_frame(messages, count=len(messages) + count_delta))
    for pos, value in flips:
        if 4 <= pos < len(f):      # key and version are the caller's business
            f[pos] = value
    f = bytes(f[:max(cut, 4)]) + tail
    assert _outcome(_wire.publish_chunk, f) == _outcome(_pywire.publish_chunk, f)


@needs_compiled
@PROPERTY
@given(blob=st.binary(max_size=200))
def test_twins_agree_on_arbitrary_bytes(blob):
    from riverbed.shells import _wire
    f = b"\x00\x02\x00\x01" + blob
    assert _outcome(_wire.publish_chunk, f) == _outcome(_pywire.publish_chunk, f)


def test_publish_chunk_takes_any_buffer(wire_twin):
    assert wire_twin.publish_chunk(memoryview(bytearray(GOLDEN_PUBLISH)))[2] == GOLDEN_SEALED


# ---- the engine takes the sealed chunk ------------------------------------------------------------------

@pytest.fixture
def eng(tmp_path):
    e = Engine(tmp_path / "data", fsync="never", retention_interval=0)
    yield e
    e.close()


def _append(eng, f, publisher=None):
    _, count, chunk, ids, first, last, increasing, records, _ = wire.publish_chunk(f)
    pids = PublishingIds(ids, first, last, increasing)
    return eng.append_chunk("s", chunk, num_entries=count, num_records=records,
                            publishing_ids=pids if publisher else None, publisher=publisher).result()


def test_append_chunk_stores_and_stamps(eng):
    eng.create_stream("s").result()
    res = _append(eng, GOLDEN_PUBLISH)
    assert (res.first_offset, res.last_offset, res.duplicates) == (0, 1, [])
    big = publish_frame([(i, struct.pack(">I", 200) + bytes([i]) * 200) for i in range(100)])   # own chunk
    res = _append(eng, big)
    assert (res.first_offset, res.last_offset) == (2, 101)
    records = [r for _, r in eng.scan("s")]
    assert records[:2] == [b"hello", b"rabbit"] and records[2:] == [bytes([i]) * 200 for i in range(100)]
    chunks = eng.read_chunks("s", 0, 10)
    assert [cid for cid, _ in chunks] == [0, 2]
    assert core.read_header(chunks[1][1])[6] == 2 and core.read_header(chunks[1][1])[4] > 0


def test_append_chunk_drops_duplicates_of_a_named_publisher(eng):
    eng.create_stream("s").result()
    entry = struct.pack(">I", 1)
    res = _append(eng, publish_frame([(i, entry + bytes([i])) for i in (1, 2, 3)]), "p")
    assert (res.first_offset, res.last_offset, res.duplicates) == (0, 2, [])
    # ids 2, 3 again, then 4 and a repeated 4: the slow path expands the raw ids
    res = _append(eng, publish_frame([(i, entry + bytes([i])) for i in (2, 3, 4, 4)]), "p")
    assert (res.first_offset, res.last_offset, res.duplicates) == (3, 3, [2, 3, 4])
    assert [r for _, r in eng.scan("s")] == [b"\x01", b"\x02", b"\x03", b"\x04"]
    assert eng.query_publisher_sequence("s", "p") == 4


def test_append_chunk_over_65535_entries_is_split(eng):
    eng.create_stream("s").result()
    n = 70000
    res = _append(eng, publish_frame([(i + 1, struct.pack(">I", 1) + bytes([i & 0xFF])) for i in range(n)]), "p")
    assert (res.first_offset, res.last_offset) == (0, n - 1)
    info = eng.stream_info("s")
    assert info.records == n and info.chunks >= 2
    assert eng.query_publisher_sequence("s", "p") == n


def test_crc_left_to_the_engine_is_filled_in_when_stored_whole_and_unused_when_cut(eng, wire_twin):
    eng.create_stream("s").result()
    # crc=False: the header CRC is 0 until the engine stores the chunk
    _, count, chunk, _, _, _, _, records, _ = wire_twin.publish_chunk(GOLDEN_PUBLISH, False)
    assert chunk[32:36] == b"\0\0\0\0" and chunk[48:] == GOLDEN_SEALED[48:]
    big = publish_frame([(i, struct.pack(">I", 200) + bytes([i]) * 200) for i in range(100)])   # own chunk
    _, count, chunk, _, _, _, _, records, _ = wire_twin.publish_chunk(big, False)
    eng.append_chunk("s", chunk, num_entries=count, num_records=records, crc_done=False).result()
    # over the closing chunk's bound (1,000 records; the append is alone in its commit): cut into a head and
    # a closing 1,000, each with its own CRC
    huge = publish_frame([(i, struct.pack(">I", 100) + b"x" * 100) for i in range(2500)])
    _, count, chunk, _, _, _, _, records, _ = wire_twin.publish_chunk(huge, False)
    eng.append_chunk("s", chunk, num_entries=count, num_records=records, crc_done=False).result()
    got = eng.read_chunks("s", 0, 10)            # read_chunks checks every CRC
    assert [(cid, core.read_header(raw)[3]) for cid, raw in got] == [(0, 100), (100, 1500), (1600, 1000)]


def test_append_chunk_refuses_immutable_buffers(eng):
    with pytest.raises(Exception):
        eng.append_chunk("s", bytes(GOLDEN_SEALED), num_entries=2, num_records=2)


def test_publishing_ids_is_a_sequence_of_ints():
    ids = PublishingIds(struct.pack(">3Q", 4, 9, 2**64 - 1), 4, 2**64 - 1, True)
    assert len(ids) == 3 and ids[0] == 4 and ids[-1] == 2**64 - 1 and list(ids) == [4, 9, 2**64 - 1]
    assert not PublishingIds(b"", 0, 0, True)

"""chunk_to_arrow: the Arrow column buffers the Spark reader builds batches from, in both core twins.

Every test takes the ``twin`` fixture (compiled ``_core`` and pure-Python ``_pycore``); the differential
test feeds the same chunks to both and compares the buffers byte for byte.
"""

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.engine import _pycore, core
from riverbed.engine.errors import ChunkError, UnsupportedCompression
from riverbed.engine.format import COMPRESSION_GZIP, COMPRESSION_ZSTD, gzip_compress

PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

TS = 1_700_000_000_123          # ms


def unpack(res):
    """The buffers as Python values: (offsets, timestamps_us, chunk_ids, bodies, appended)."""
    offsets, timestamps, chunk_ids, value_offsets, data, appended = res
    n = len(offsets) // 8
    vo = struct.unpack(f"<{n + 1}i", value_offsets)
    bodies = [bytes(data[vo[i]:vo[i + 1]]) for i in range(n)]
    return (list(struct.unpack(f"<{n}q", offsets)), list(struct.unpack(f"<{n}q", timestamps)),
            list(struct.unpack(f"<{n}q", chunk_ids)), bodies, appended)


def mixed_chunk(twin, chunk_id=100, bloom=b""):
    """Offsets 100..107: simple, sub-batch(none: 3), simple, sub-batch(gzip: 2), simple."""
    data = b"".join([
        twin.encode_entries([b"s0"]),
        twin.encode_sub_batch([b"n1", b"n2", b"n3"]),
        twin.encode_entries([b"s4"]),
        twin.encode_sub_batch([b"g5", b"g6"], COMPRESSION_GZIP, gzip_compress),
        twin.encode_entries([b"s7"]),
    ])
    return twin.build_chunk(data, 5, 8, TS, chunk_id, bloom=bloom)


def test_golden_buffers(twin):
    chunk = twin.encode_chunk([b"hello", b"rabbit"], 42, 1_700_000_000_000)
    offsets, timestamps, chunk_ids, value_offsets, data, appended = twin.chunk_to_arrow(chunk)
    assert bytes(offsets) == bytes.fromhex("2a00000000000000" "2b00000000000000")
    assert bytes(timestamps) == struct.pack("<2q", 1_700_000_000_000_000, 1_700_000_000_000_000)
    assert bytes(chunk_ids) == struct.pack("<2q", 42, 42)
    assert bytes(value_offsets) == bytes.fromhex("00000000" "05000000" "0b000000")
    assert bytes(data) == b"hellorabbit"
    assert appended == 2
    assert all(type(b) is bytearray for b in (offsets, timestamps, chunk_ids, value_offsets, data))


def test_sub_batches_are_expanded_with_their_offsets(twin):
    offsets, ts, ids, bodies, n = unpack(twin.chunk_to_arrow(mixed_chunk(twin)))
    assert offsets == list(range(100, 108))
    assert bodies == [b"s0", b"n1", b"n2", b"n3", b"s4", b"g5", b"g6", b"s7"]
    assert ts == [TS * 1000] * 8 and ids == [100] * 8 and n == 8


@pytest.mark.parametrize("first,end", [(0, None), (100, 108), (101, 104), (102, 103), (104, 106), (105, 107),
                                       (107, 200), (108, None), (0, 100), (103, 103), (106, 105)])
def test_range_is_exact(twin, first, end):
    offsets, _, _, bodies, n = unpack(twin.chunk_to_arrow(mixed_chunk(twin), first, end))
    want = [o for o in range(100, 108) if o >= first and (end is None or o < end)]
    assert offsets == want and n == len(want) and len(bodies) == len(want)


def test_compressed_sub_batch_outside_the_range_is_not_decompressed(twin):
    data = twin.encode_entries([b"a"]) + twin.encode_sub_batch([b"x", b"y"], 6, lambda b: b"opaque")
    chunk = twin.build_chunk(data, 2, 3, TS, 0)
    assert unpack(twin.chunk_to_arrow(chunk, 0, 1))[3] == [b"a"]
    with pytest.raises(UnsupportedCompression):
        twin.chunk_to_arrow(chunk, 0, 2)


def test_zstd_sub_batch(twin):
    import zstandard
    data = twin.encode_sub_batch([b"z" * 50, b"q"], COMPRESSION_ZSTD, zstandard.ZstdCompressor().compress)
    chunk = twin.build_chunk(data, 1, 2, TS, 7)
    assert unpack(twin.chunk_to_arrow(chunk))[:4:3] == ([7, 8], [b"z" * 50, b"q"])


def test_out_accumulates_several_chunks(twin):
    out = twin.new_arrow_buffers()
    twin.chunk_to_arrow(twin.encode_chunk([b"a", b"bb"], 0, 1), out=out)
    res = twin.chunk_to_arrow(twin.encode_chunk([b"ccc"], 2, 2), out=out)
    assert all(a is b for a, b in zip(res, out))
    offsets, ts, ids, bodies, n = unpack(res)
    assert (offsets, ts, ids, bodies, n) == ([0, 1, 2], [1000, 1000, 2000], [0, 0, 2], [b"a", b"bb", b"ccc"], 1)


def test_many_chunks_grow_the_buffers_geometrically():
    # A batch is hundreds of chunks appended to one set of buffers. Each call of the compiled core trims
    # the buffers to what they hold; growing again must reuse the allocation CPython keeps, not realloc
    # (and maybe copy the megabytes held so far) on every call: count the reallocations of the data
    # buffer. (The pure twin's bytearray.extend grows by CPython's own 1/8 steps.)
    if core.NO_EXTENSIONS:
        pytest.skip("RIVERBED_NO_EXTENSIONS=1")
    out = core.new_arrow_buffers()
    allocs = set()
    for i in range(400):
        core.chunk_to_arrow(core.encode_chunk([bytes([i % 251]) * 100] * 100, i * 100, 0), out=out)
        allocs.add(out[4].__alloc__())
    assert len(out[4]) == 400 * 100 * 100
    assert unpack(out + (0,))[3][-1] == bytes([399 % 251]) * 100
    assert len(allocs) <= 24, len(allocs)


def test_bloom_is_skipped_and_wire_form_is_read(twin):
    chunk = mixed_chunk(twin, bloom=bytes(16))
    stored = unpack(twin.chunk_to_arrow(chunk))
    wire = chunk[:48] + chunk[64:]          # Deliver: header (bloom size kept) + data
    assert unpack(twin.chunk_to_arrow(wire, wire=True)) == stored
    with pytest.raises(ChunkError, match="CRC"):
        twin.chunk_to_arrow(wire[:60] + bytes([wire[60] ^ 1]) + wire[61:], wire=True)
    with pytest.raises(ChunkError, match="delivered"):
        twin.chunk_to_arrow(wire + b"x", wire=True)


def test_crc_is_checked_unless_verify_is_off(twin):
    chunk = bytearray(twin.encode_chunk([b"abc"], 0, 0))
    chunk[-1] ^= 0xFF
    with pytest.raises(ChunkError, match="CRC"):
        twin.chunk_to_arrow(chunk)
    assert unpack(twin.chunk_to_arrow(chunk, verify=False))[3] == [b"ab\x9c"]


@pytest.mark.parametrize("damage,match", [
    (lambda c: c[:4] + struct.pack(">I", 3) + c[8:], "entries hold 2 records, header says 3"),
    (lambda c: c[:2] + struct.pack(">H", 3) + c[4:], "ends before the last entry"),
    (lambda c: c[:48] + struct.pack(">I", 99) + c[52:], "overruns"),
    (lambda c: b"\x51" + c[1:], "magic"),
])
def test_malformed_chunks_raise_and_leave_out_untouched(twin, damage, match):
    out = twin.new_arrow_buffers()
    twin.chunk_to_arrow(twin.encode_chunk([b"keep"], 0, 0), out=out)
    before = [bytes(b) for b in out]
    bad = damage(twin.encode_chunk([b"hello", b"rabbit"], 1, 0))
    with pytest.raises(ChunkError, match=match):
        twin.chunk_to_arrow(bad, out=out, verify=False)
    assert [bytes(b) for b in out] == before


def test_bad_out_is_refused(twin):
    chunk = twin.encode_chunk([b"a"], 0, 0)
    with pytest.raises(ValueError):
        twin.chunk_to_arrow(chunk, out=(bytearray(),) * 5)     # no leading value offset
    with pytest.raises(ValueError):
        twin.chunk_to_arrow(chunk, out=[b"", b"", b"", b"\0\0\0\0", b""])


def test_pyarrow_wraps_the_buffers_without_a_copy(twin):
    pa = pytest.importorskip("pyarrow")
    offsets, ts, ids, vo, data, n = twin.chunk_to_arrow(mixed_chunk(twin), 101)
    body = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(vo), pa.py_buffer(data)])
    off = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)])
    stamp = pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, pa.py_buffer(ts)])
    assert body.to_pylist() == [b"n1", b"n2", b"n3", b"s4", b"g5", b"g6", b"s7"]
    assert off.to_pylist() == list(range(101, 108))
    assert stamp[0].value == TS * 1000
    assert body.buffers()[2].address == pa.py_buffer(data).address


entry = st.one_of(
    st.lists(st.binary(max_size=20), min_size=1, max_size=4).map(lambda r: ("simple", r)),
    st.lists(st.binary(max_size=20), min_size=1, max_size=4).map(lambda r: ("none", r)),
    st.lists(st.binary(max_size=20), min_size=1, max_size=4).map(lambda r: ("gzip", r)),
)


@PROPERTY
@given(entries=st.lists(entry, min_size=1, max_size=6), first=st.integers(0, 40), span=st.integers(0, 40),
       verify=st.booleans())
def test_twins_agree(entries, first, span, verify):
    parts, records, expected = [], 0, []
    n_entries = 0
    for kind, recs in entries:
        if kind == "simple":
            parts.append(_pycore.encode_entries(recs))
            n_entries += len(recs)
        else:
            code = 0 if kind == "none" else COMPRESSION_GZIP
            parts.append(_pycore.encode_sub_batch(recs, code, gzip_compress))
            n_entries += 1
        records += len(recs)
        expected += recs
    chunk = _pycore.build_chunk(b"".join(parts), n_entries, records, TS, 10)
    end = 10 + first + span
    py = _pycore.chunk_to_arrow(chunk, 10 + first, end, verify=verify)
    assert unpack(py)[3] == expected[first:first + span]
    if core.COMPILED:
        from riverbed.engine import _core
        assert _core.chunk_to_arrow(chunk, 10 + first, end, verify=verify) == py

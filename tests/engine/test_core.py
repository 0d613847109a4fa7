"""Byte-level tests of the core twins (compiled ``_core`` and pure-Python ``_pycore``).

Every test takes the ``twin`` fixture and so runs against both implementations, except the differential
tests, which feed the same input to both and compare. Layouts: riverbed.engine.format.
"""

import mmap
import os
import struct
import sys
import threading
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.engine import _pycore, core
from riverbed.engine.errors import ChunkError, UnsupportedCompression
from riverbed.engine.format import (
    BLOOM_SEED_2, CHUNK_TRACKING_DELTA, COMPRESSION_GZIP, COMPRESSION_NONE, H_BLOOM_SIZE, H_CHUNK_ID, H_CRC,
    H_DATA_LEN, H_ENTRIES,
    H_EPOCH, H_MAGIC, H_RECORDS, H_TIMESTAMP, H_TRAILER_LEN, H_TYPE, gzip_compress,
)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import twins  # noqa: E402

# The twin fixture is function-scoped but stateless (it returns a module), so sharing it across the
# examples of one hypothesis test is safe.
PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])

PUBLIC = ["crc32", "encode_entries", "encode_sub_batch", "build_chunk", "encode_chunk", "read_header",
          "check_chunk", "scan_entries", "data_records", "chunk_records", "build_bloom", "bloom_match",
          "chunk_bloom_match", "cut_entries", "walk_simple_entries"]

# ---- golden bytes, built by hand ----------------------------------------------------------------------

GOLDEN_RECORDS = [b"hello", b"rabbit"]
GOLDEN_CHUNK_ID = 42
GOLDEN_TIMESTAMP = 1700000000000    # 0x0000018bcfe56800
GOLDEN_EPOCH = 1
GOLDEN_DATA_CRC = 0xE7E6DE8B        # zlib.crc32 of bytes 48..66 (the data section) only

GOLDEN_CHUNK = bytes.fromhex(
    # off  field               value
    "50"                  # 0   magic | version   0x50 = magic 5 << 4 | chunk version 0
    "00"                  # 1   ChunkType u8      0 (user)
    "0002"                # 2   NumEntries u16    2
    "00000002"            # 4   NumRecords u32    2
    "0000018bcfe56800"    # 8   Timestamp i64     1700000000000 ms
    "0000000000000001"    # 16  Epoch u64         1
    "000000000000002a"    # 24  ChunkId u64       42
    "e7e6de8b"            # 32  DataCrc u32       crc32(bytes 48..66), header not covered
    "00000013"            # 36  DataLength u32    19
    "00000000"            # 40  TrailerLen u32    0
    "00"                  # 44  BloomSize u8      0 (no bloom)
    "000000"              # 45  Reserved          0
    # data section (48 .. 66)
    "00000005"            # 48  simple entry      0:1 | Length:31 = 5
    "68656c6c6f"          # 52  body              b"hello"
    "00000006"            # 57  simple entry      0:1 | Length:31 = 6
    "726162626974"        # 61  body              b"rabbit"
)                         # 67  end

GOLDEN_HEADER = (0x50, 0, 2, 2, GOLDEN_TIMESTAMP, GOLDEN_EPOCH, GOLDEN_CHUNK_ID, GOLDEN_DATA_CRC, 19, 0, 0)

GOLDEN_SUB_BATCH = bytes.fromhex(
    # off  field                value
    "80"                  # 0   flags              1:1 sub-batch | Compression:3 = 0 none | 0:4
    "0002"                # 1   NumRecords u16     2
    "00000013"            # 3   UncompressedLen u32 19
    "00000013"            # 7   Length u32         19 (body bytes)
    "00000005"            # 11  simple entry       0:1 | Length:31 = 5
    "68656c6c6f"          # 15  body               b"hello"
    "00000006"            # 20  simple entry       0:1 | Length:31 = 6
    "726162626974"        # 24  body               b"rabbit"
)                         # 30  end


def test_twin_fixture_yields_the_named_implementation(twin):
    assert twin.COMPILED is (twin is not _pycore)
    for name in PUBLIC:
        assert callable(getattr(twin, name)), name


def test_golden_chunk_crc_covers_the_data_section_only():
    assert zlib.crc32(GOLDEN_CHUNK[48:]) == GOLDEN_DATA_CRC
    assert struct.unpack_from(">I", GOLDEN_CHUNK, 32)[0] == GOLDEN_DATA_CRC
    assert len(GOLDEN_CHUNK) == 48 + 19


def test_golden_chunk_is_what_the_encoders_write(twin):
    assert twin.encode_chunk(GOLDEN_RECORDS, GOLDEN_CHUNK_ID, GOLDEN_TIMESTAMP, GOLDEN_EPOCH) == GOLDEN_CHUNK
    data = twin.encode_entries(GOLDEN_RECORDS)
    assert data == GOLDEN_CHUNK[48:]
    assert twin.build_chunk(data, 2, 2, GOLDEN_TIMESTAMP, GOLDEN_CHUNK_ID, epoch=GOLDEN_EPOCH) == GOLDEN_CHUNK
    assert twin.crc32(data) == GOLDEN_DATA_CRC


def test_golden_chunk_parses_back(twin):
    header = twin.read_header(GOLDEN_CHUNK)
    assert header == GOLDEN_HEADER
    assert (header[H_MAGIC], header[H_TYPE], header[H_ENTRIES], header[H_RECORDS], header[H_TIMESTAMP],
            header[H_EPOCH], header[H_CHUNK_ID], header[H_CRC], header[H_DATA_LEN], header[H_TRAILER_LEN],
            header[H_BLOOM_SIZE]) == GOLDEN_HEADER
    assert twin.check_chunk(GOLDEN_CHUNK) == GOLDEN_HEADER
    assert twin.chunk_records(GOLDEN_CHUNK) == GOLDEN_RECORDS
    assert twin.chunk_records(GOLDEN_CHUNK, verify=False) == GOLDEN_RECORDS
    assert twin.scan_entries(GOLDEN_CHUNK[48:]) == ([9, 19], [1, 1])
    for kind in (bytearray, memoryview):
        assert twin.check_chunk(kind(GOLDEN_CHUNK)) == GOLDEN_HEADER
        assert twin.chunk_records(kind(GOLDEN_CHUNK)) == GOLDEN_RECORDS


def test_golden_sub_batch_is_what_the_encoder_writes(twin):
    assert twin.encode_sub_batch(GOLDEN_RECORDS) == GOLDEN_SUB_BATCH
    assert twin.encode_sub_batch(GOLDEN_RECORDS, COMPRESSION_NONE) == GOLDEN_SUB_BATCH


def test_golden_sub_batch_parses_back(twin):
    assert twin.scan_entries(GOLDEN_SUB_BATCH) == ([30], [2])
    assert twin.data_records(GOLDEN_SUB_BATCH, 1, 2) == GOLDEN_RECORDS
    chunk = twin.build_chunk(GOLDEN_SUB_BATCH, 1, 2, GOLDEN_TIMESTAMP, 7)
    assert twin.check_chunk(chunk)[H_CRC] == zlib.crc32(GOLDEN_SUB_BATCH)
    assert twin.chunk_records(chunk) == GOLDEN_RECORDS


def test_gzip_sub_batch_header_and_records(twin):
    entry = twin.encode_sub_batch(GOLDEN_RECORDS, COMPRESSION_GZIP, gzip_compress)
    flags, count, usize, size = struct.unpack_from(">BHII", entry)
    assert (flags, count, usize, size) == (0x90, 2, 19, len(entry) - 11)
    assert zlib.decompress(entry[11:], 47) == GOLDEN_CHUNK[48:]
    assert twin.data_records(entry, 1, 2) == GOLDEN_RECORDS


def test_gzip_sub_batch_expands_past_the_data_size(twin):
    # 5,000 empty records compress to a few dozen bytes: more records than the data section has bytes.
    records = [b""] * 4000 + [b"tail"] * 1000
    entry = twin.encode_sub_batch(records, COMPRESSION_GZIP, gzip_compress)
    data = GOLDEN_CHUNK[48:] + entry
    assert len(data) < len(records)
    assert twin.data_records(data, 3, 5002) == GOLDEN_RECORDS + records
    chunk = twin.build_chunk(data, 3, 5002, 0, 0)
    assert twin.chunk_records(chunk) == GOLDEN_RECORDS + records
    with pytest.raises(ChunkError, match="entries hold 5002 records, header says 5003"):
        twin.data_records(data, 3, 5003)


def test_build_chunk_places_bloom_data_and_trailer(twin):
    bloom, trailer = bytes(range(16)), b"\x01\x03ref" + bytes(8)
    chunk = twin.build_chunk(GOLDEN_CHUNK[48:], 2, 2, GOLDEN_TIMESTAMP, 42, epoch=1, chunk_type=1, bloom=bloom,
                             trailer=trailer)
    assert chunk[48:64] == bloom and chunk[64:83] == GOLDEN_CHUNK[48:] and chunk[83:] == trailer
    h = twin.check_chunk(chunk)
    assert (h[H_TYPE], h[H_DATA_LEN], h[H_TRAILER_LEN], h[H_BLOOM_SIZE], h[H_CRC]) == (1, 19, 13, 16,
                                                                                         GOLDEN_DATA_CRC)
    assert twin.chunk_records(chunk) == GOLDEN_RECORDS


def test_crc32_matches_zlib_on_any_buffer(twin):
    data = bytes(range(256)) * 300          # over the size where the compiled twin releases the GIL
    for buf in (data, bytearray(data), memoryview(data), memoryview(data)[7:1000], b""):
        assert twin.crc32(buf) == zlib.crc32(buf)
    assert twin.crc32(data[100:], twin.crc32(data[:100])) == zlib.crc32(data)
    assert twin.crc32(b"x", BLOOM_SEED_2) == zlib.crc32(b"x", BLOOM_SEED_2)
    assert twin.crc32(b"x", -1) == zlib.crc32(b"x", 0xFFFFFFFF)
    with pytest.raises(TypeError):
        twin.crc32("text")


def test_crc32_from_threads_is_correct(twin):
    data = [bytes([i]) * (4 << 20) for i in range(4)]
    want = [zlib.crc32(d) for d in data]
    got = [None] * 4

    def work(i):
        got[i] = twin.crc32(data[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


def test_empty_chunk_and_empty_records(twin):
    chunk = twin.encode_chunk([], 0, 0)
    assert len(chunk) == 48 and twin.check_chunk(chunk)[H_CRC] == 0
    assert twin.chunk_records(chunk) == []
    chunk = twin.encode_chunk([b"", b"", b""], 5, 6)
    assert twin.chunk_records(chunk) == [b"", b"", b""]
    assert twin.encode_sub_batch([]) == bytes.fromhex("80" "0000" "00000000" "00000000")
    assert twin.data_records(twin.encode_sub_batch([]), 1, 0) == []


# ---- property tests ------------------------------------------------------------------------------------

def _large(n_and_byte):
    n, b = n_and_byte
    return bytes([b]) * n


small_records = st.binary(max_size=200)
large_records = st.tuples(st.integers(60_000, 140_000), st.integers(0, 255)).map(_large)
records_st = st.lists(st.one_of(small_records, small_records, small_records, st.just(b""), large_records),
                      max_size=25)
buffer_kinds = st.sampled_from([bytes, bytearray, memoryview])


@PROPERTY
@given(records=records_st, kinds=st.lists(buffer_kinds, min_size=25, max_size=25),
       chunk_id=st.integers(0, 2**64 - 1), timestamp=st.integers(-2**63, 2**63 - 1),
       epoch=st.integers(0, 2**64 - 1))
def test_records_round_trip_through_a_chunk(twin, records, kinds, chunk_id, timestamp, epoch):
    given_records = [kind(r) for kind, r in zip(kinds, records)]
    chunk = twin.encode_chunk(given_records, chunk_id, timestamp, epoch)
    assert chunk == _pycore.encode_chunk(records, chunk_id, timestamp, epoch)
    h = twin.check_chunk(chunk)
    assert (h[H_ENTRIES], h[H_RECORDS], h[H_CHUNK_ID], h[H_TIMESTAMP], h[H_EPOCH]) == \
        (len(records), len(records), chunk_id, timestamp, epoch)
    assert h[H_CRC] == zlib.crc32(chunk[48:])
    assert twin.chunk_records(chunk) == records
    assert twin.chunk_records(bytearray(chunk), verify=False) == records


@PROPERTY
@given(records=records_st)
def test_records_round_trip_through_entries(twin, records):
    data = twin.encode_entries(records)
    ends, counts = twin.scan_entries(data)
    want_ends, pos = [], 0
    for r in records:
        pos += 4 + len(r)
        want_ends.append(pos)
    assert ends == want_ends and counts == [1] * len(records)
    assert twin.data_records(data, len(records), len(records)) == records
    assert twin.data_records(memoryview(data), len(records), len(records)) == records
    chunk = twin.build_chunk(data, len(records), len(records), 0, 0)
    assert twin.chunk_records(chunk) == records


# one data-section item: a simple record, or (compression, records) for a sub-batch
entry_st = st.one_of(
    small_records,
    st.tuples(st.sampled_from([COMPRESSION_NONE, COMPRESSION_GZIP]), st.lists(small_records, max_size=12)),
)


def _encode_section(mod, items):
    parts, flat, counts = [], [], []
    for item in items:
        if isinstance(item, bytes):
            parts.append(mod.encode_entries([item]))
            flat.append(item)
            counts.append(1)
        else:
            code, recs = item
            parts.append(mod.encode_sub_batch(recs, code, gzip_compress if code == COMPRESSION_GZIP else None))
            flat.extend(recs)
            counts.append(len(recs))
    return b"".join(parts), flat, counts


@PROPERTY
@given(items=st.lists(entry_st, max_size=12))
def test_sub_batches_mixed_with_simple_entries_round_trip(twin, items):
    data, flat, counts = _encode_section(twin, items)
    assert data == _encode_section(_pycore, items)[0]
    ends, got_counts = twin.scan_entries(data)
    assert got_counts == counts and (ends[-1] if ends else 0) == len(data)
    assert twin.data_records(data, len(items), len(flat)) == flat
    chunk = twin.build_chunk(data, len(items), len(flat), 1, 2)
    assert twin.chunk_records(chunk) == flat


@PROPERTY
@given(items=st.lists(entry_st, max_size=12), max_bytes=st.integers(1, 400), max_entries=st.integers(1, 5),
       max_records=st.integers(1, 8))
def test_cut_entries_respects_every_bound_and_covers_the_section(twin, items, max_bytes, max_entries, max_records):
    data, flat, counts = _encode_section(twin, items)
    cuts = twin.cut_entries(data, max_bytes, max_entries, max_records)
    ends, _ = twin.scan_entries(data)
    start = done_entries = 0
    for end, entries, records in cuts:
        assert end in ends and entries >= 1
        assert records == sum(counts[done_entries:done_entries + entries])
        # every piece is within the bounds, unless it is one entry that alone is over one of them
        assert entries == 1 or (end - start <= max_bytes and entries <= max_entries and records <= max_records)
        start, done_entries = end, done_entries + entries
    assert start == len(data) and done_entries == len(items)


def test_cut_entries_of_a_big_publish(twin):
    data = twin.encode_entries([b"x" * 100] * 4999)
    cuts = twin.cut_entries(data, 1 << 20, 0xFFFF, 1000)
    assert [(e, r) for _, e, r in cuts] == [(1000, 1000)] * 4 + [(999, 999)]



# ---- differential: both twins, same input, same outcome -------------------------------------------------

needs_compiled = pytest.mark.skipif(core.NO_EXTENSIONS, reason="RIVERBED_NO_EXTENSIONS=1")


def _both(name, *args):
    from riverbed.engine import _core
    return twins.both(_core, _pycore, name, *args)


@needs_compiled
def test_both_twins_have_the_same_public_names():
    from riverbed.engine import _core
    twins.check_public_names(_core, _pycore, PUBLIC)


@needs_compiled
@PROPERTY
@given(items=st.lists(entry_st, max_size=8), flips=st.lists(st.tuples(st.integers(0, 10_000),
                                                                      st.integers(0, 255)), max_size=3),
       cut=st.integers(0, 10_000), entries_delta=st.integers(-2, 2), records_delta=st.integers(-2, 2))
def test_twins_agree_on_damaged_chunks(items, flips, cut, entries_delta, records_delta):
    data, flat, _ = _encode_section(_pycore, items)
    chunk = bytearray(_pycore.build_chunk(data, len(items), len(flat), 3, 4))
    for pos, value in flips:
        chunk[pos % len(chunk)] = value
    for buf in (bytes(chunk), bytes(chunk[:cut % (len(chunk) + 1)])):
        _both("read_header", buf)
        _both("check_chunk", buf)
        _both("chunk_records", buf, False)
        _both("chunk_records", buf, True)
        section = buf[48:]
        _both("scan_entries", section)
        _both("data_records", section, len(items) + entries_delta, len(flat) + records_delta)


@needs_compiled
@PROPERTY
@given(blob=st.binary(max_size=400), ne=st.integers(-1, 200), nr=st.integers(-1, 200))
def test_twins_agree_on_arbitrary_bytes(blob, ne, nr):
    _both("read_header", blob)
    _both("check_chunk", blob)
    _both("chunk_records", blob, False)
    _both("scan_entries", blob)
    _both("cut_entries", blob, 100, 3, 5)
    _both("data_records", blob, ne, nr)
    _both("data_records", blob, 2**70, nr)


@needs_compiled
@PROPERTY
@given(records=records_st, chunk_id=st.integers(0, 2**64 - 1), timestamp=st.integers(-2**63, 2**63 - 1),
       items=st.lists(entry_st, max_size=6))
def test_twins_agree_on_encoding(records, chunk_id, timestamp, items):
    _both("encode_entries", records)
    _both("encode_chunk", records, chunk_id, timestamp, 5)
    _both("encode_sub_batch", records[:20])
    from riverbed.engine import _core
    assert _encode_section(_core, items) == _encode_section(_pycore, items)
    data = _pycore.encode_entries(records)
    _both("build_chunk", data, len(records), len(records), timestamp, chunk_id, 9, 2, bytes(range(16)), b"tr")


@needs_compiled
@PROPERTY
@given(values=st.lists(st.binary(max_size=40), max_size=12), probe=st.lists(st.binary(max_size=40), max_size=12),
       has_unfiltered=st.booleans(), match_unfiltered=st.booleans(), size=st.integers(16, 255))
def test_twins_agree_on_bloom(values, probe, has_unfiltered, match_unfiltered, size):
    _, bloom = _both("build_bloom", values, has_unfiltered, size)
    _both("bloom_match", bloom, probe, match_unfiltered)
    _both("bloom_match", bloom, values, match_unfiltered)


# ---- corruption and bad input ---------------------------------------------------------------------------

def test_flipped_data_byte_is_crc_error(twin):
    for pos in (48, 55, len(GOLDEN_CHUNK) - 1):
        bad = bytearray(GOLDEN_CHUNK)
        bad[pos] ^= 0x01
        with pytest.raises(ChunkError, match="CRC"):
            twin.check_chunk(bytes(bad))
        with pytest.raises(ChunkError, match="CRC"):
            twin.chunk_records(bad)


def test_flipped_header_crc_is_crc_error(twin):
    bad = bytearray(GOLDEN_CHUNK)
    bad[32] ^= 0x80
    with pytest.raises(ChunkError, match="CRC 0xe7e6de8b does not match header CRC 0x67e6de8b"):
        twin.check_chunk(bad)


def test_flipped_magic_is_chunk_error(twin):
    bad = b"\x51" + GOLDEN_CHUNK[1:]
    with pytest.raises(ChunkError, match="magic") as err:
        twin.read_header(bad)
    assert "0x51" in str(err.value)
    with pytest.raises(ChunkError, match="magic"):
        twin.check_chunk(bad)
    with pytest.raises(ChunkError, match="magic"):
        twin.chunk_records(bad, verify=False)


def test_truncated_chunk_is_length_error(twin):
    with pytest.raises(ChunkError, match="do not add up"):
        twin.check_chunk(GOLDEN_CHUNK[:-1])
    with pytest.raises(ChunkError, match="do not add up"):
        twin.check_chunk(GOLDEN_CHUNK + b"\x00")
    with pytest.raises(ChunkError, match="shorter than the 48-byte"):
        twin.read_header(GOLDEN_CHUNK[:47])
    with pytest.raises(ChunkError, match="shorter than the 48-byte"):
        twin.chunk_records(b"")


def test_truncated_entry_is_overrun_error(twin):
    with pytest.raises(ChunkError, match="overruns"):
        twin.data_records(GOLDEN_CHUNK[48:-1], 2, 2)
    with pytest.raises(ChunkError, match="overruns"):
        twin.scan_entries(GOLDEN_CHUNK[48:-1])
    with pytest.raises(ChunkError, match="overruns"):
        twin.chunk_records(GOLDEN_CHUNK[:-1], verify=False)
    with pytest.raises(ChunkError, match="truncated simple entry header"):
        twin.data_records(b"\x00\x00", 1, 1)
    with pytest.raises(ChunkError, match="truncated sub-batch entry header"):
        twin.data_records(GOLDEN_SUB_BATCH[:10], 1, 2)
    with pytest.raises(ChunkError, match="sub-batch entry overruns"):
        twin.data_records(GOLDEN_SUB_BATCH[:-1], 1, 2)


def test_entry_count_over_header_is_chunk_error(twin):
    with pytest.raises(ChunkError, match="ends before the last entry"):
        twin.data_records(GOLDEN_CHUNK[48:], 3, 2)
    with pytest.raises(ChunkError, match="ends before the last entry"):
        twin.data_records(GOLDEN_CHUNK[48:], 10**30, 2)
    with pytest.raises(ChunkError, match="10 bytes left after 1 entries"):
        twin.data_records(GOLDEN_CHUNK[48:], 1, 1)


def test_record_count_mismatch_is_chunk_error(twin):
    for claimed in (0, 1, 3, 2**32 - 1):
        chunk = twin.build_chunk(GOLDEN_CHUNK[48:], 2, claimed, 0, 0)
        with pytest.raises(ChunkError, match=f"entries hold 2 records, header says {claimed}"):
            twin.chunk_records(chunk)
        with pytest.raises(ChunkError, match=f"entries hold 2 records, header says {claimed}"):
            twin.data_records(GOLDEN_CHUNK[48:], 2, claimed)
    bad_sub = GOLDEN_SUB_BATCH[:1] + b"\x00\x03" + GOLDEN_SUB_BATCH[3:]   # NumRecords 3, body holds 2
    with pytest.raises(ChunkError, match="ends before the last entry"):
        twin.data_records(bad_sub, 1, 3)


def test_bad_bloom_size_is_chunk_error(twin):
    for size in (1, 8, 15):
        chunk = twin.build_chunk(GOLDEN_CHUNK[48:], 2, 2, 0, 0, bloom=bytes(size))
        with pytest.raises(ChunkError, match=f"bloom size {size} is neither 0 nor 16..255"):
            twin.check_chunk(chunk)
    for size in (16, 255):
        chunk = twin.build_chunk(GOLDEN_CHUNK[48:], 2, 2, 0, 0, bloom=bytes(size))
        assert twin.check_chunk(chunk)[H_BLOOM_SIZE] == size
        assert twin.chunk_records(chunk) == GOLDEN_RECORDS


def test_unknown_compression_code_5_is_unsupported(twin):
    entry = bytes([0x80 | (5 << 4)]) + GOLDEN_SUB_BATCH[1:]
    with pytest.raises(UnsupportedCompression) as err:
        twin.data_records(entry, 1, 2)
    assert err.value.code == 5
    chunk = twin.build_chunk(entry, 1, 2, 0, 0)
    with pytest.raises(UnsupportedCompression):
        twin.chunk_records(chunk)
    assert twin.scan_entries(entry) == ([30], [2])     # scanning does not decode bodies


def test_gzip_body_shorter_than_declared_is_chunk_error(twin):
    # a ChunkError like every other bad sub-batch, so readers that handle corrupt chunks handle this too
    entry = bytearray(twin.encode_sub_batch(GOLDEN_RECORDS, COMPRESSION_GZIP, gzip_compress))
    entry[3:7] = struct.pack(">I", 20)
    with pytest.raises(ChunkError, match="decompressed to 19 bytes, header says 20"):
        twin.data_records(bytes(entry), 1, 2)


def test_record_over_2gib_is_value_error(twin):
    huge = mmap.mmap(-1, 0x80000000)      # address space only: nothing is copied before the length check
    try:
        with pytest.raises(ValueError, match="2 GiB"):
            twin.encode_entries([b"ok", huge])
        with pytest.raises(ValueError, match="2 GiB"):
            twin.encode_chunk([huge], 0, 0)
    finally:
        huge.close()


def test_sub_batch_over_65535_records_is_value_error(twin):
    with pytest.raises(ValueError, match="65535"):
        twin.encode_sub_batch([b""] * 65536)
    assert twin.scan_entries(twin.encode_sub_batch([b""] * 65535))[1] == [65535]


def test_header_field_out_of_range_is_struct_error(twin):
    with pytest.raises(struct.error):
        twin.build_chunk(b"", 65536, 0, 0, 0)
    with pytest.raises(struct.error):
        twin.build_chunk(b"", 0, 0, 0, -1)
    with pytest.raises(struct.error):
        twin.build_chunk(b"", 0, 0, 2**63, 0)
    with pytest.raises(struct.error):
        twin.build_chunk(b"", 0, 0, 0, 0, bloom=bytes(256))
    with pytest.raises(struct.error):
        twin.encode_chunk([b""] * 65536, 0, 0)


def test_records_must_be_buffers(twin):
    with pytest.raises(TypeError):
        twin.encode_entries(["text"])
    with pytest.raises(TypeError):
        twin.encode_chunk([b"ok", 3], 0, 0)
    with pytest.raises(TypeError):
        twin.chunk_records("not bytes" * 10)


# ---- bloom ----------------------------------------------------------------------------------------------

def _bit(bloom, bit):
    return bool(bloom[bit >> 3] & (0x80 >> (bit & 7)))


def test_bloom_sets_the_two_crc32_bits_of_each_value(twin):
    bloom = twin.build_bloom([b"eu-west"], False, 16)
    assert len(bloom) == 16
    h1 = zlib.crc32(b"eu-west", 0) % 127 + 1
    h2 = zlib.crc32(b"eu-west", BLOOM_SEED_2) % 127 + 1
    want = bytearray(16)
    for bit in (h1, h2):
        want[bit >> 3] |= 0x80 >> (bit & 7)
    assert bloom == bytes(want)


def test_bloom_values_added_are_matched(twin):
    values = [b"eu", b"us", b"apac", "latam".encode(), bytes(30)]
    for size in (16, 64, 255):
        bloom = twin.build_bloom(values, False, size)
        assert len(bloom) == size
        for v in values:
            assert twin.bloom_match(bloom, [v], False) is True
            assert twin.bloom_match(bytearray(bloom), [b"other", v], False) is True


def test_bloom_value_not_added_is_usually_not_matched(twin):
    bloom = twin.build_bloom([b"eu", b"us", b"apac"], False, 16)
    misses = sum(not twin.bloom_match(bloom, [f"region-{i}".encode()], False) for i in range(200))
    assert misses >= 180      # 6 of 127 bits set: about 0.2 % false positives


def test_bloom_bit_0_flags_unfiltered_entries(twin):
    with_unfiltered = twin.build_bloom([b"eu"], True, 16)
    without = twin.build_bloom([b"eu"], False, 16)
    assert _bit(with_unfiltered, 0) and not _bit(without, 0)
    assert with_unfiltered[1:] == without[1:]
    stranger = [b"no-such-value"]
    assert twin.bloom_match(without, stranger, False) is False
    assert twin.bloom_match(with_unfiltered, stranger, True) is True
    assert twin.bloom_match(with_unfiltered, stranger, False) is False
    assert twin.bloom_match(without, stranger, True) is False


def test_chunk_bloom_match_reads_the_bloom_of_a_stored_chunk(twin):
    data = twin.encode_entries([b"r"])
    bloom = twin.build_bloom([b"eu"], False, 16)
    chunk = twin.build_chunk(data, 1, 1, 5, 0, bloom=bloom)
    assert twin.chunk_bloom_match(chunk, [b"eu"], False) is True
    assert twin.chunk_bloom_match(memoryview(chunk), [b"no-such-value"], False) is False
    plain = twin.build_chunk(data, 1, 1, 5, 0)         # no bloom: only unfiltered subscribers
    assert twin.chunk_bloom_match(plain, [b"eu"], True) is True
    assert twin.chunk_bloom_match(plain, [b"eu"], False) is False
    tracking = twin.build_chunk(data, 1, 1, 5, 0, chunk_type=CHUNK_TRACKING_DELTA, bloom=bloom)
    assert twin.chunk_bloom_match(tracking, [b"eu"], True) is False      # the log's own chunk: never
    with pytest.raises(ChunkError):
        twin.chunk_bloom_match(chunk[:50], [b"eu"], False)                 # bloom cut off
    with pytest.raises(ChunkError):
        twin.chunk_bloom_match(b"\x51" + chunk[1:], [b"eu"], False)       # bad magic


def test_empty_bloom_matches_only_unfiltered_subscribers(twin):
    assert twin.build_bloom([], True, 16) == b""
    assert twin.build_bloom([], False, 16) == b""
    assert twin.bloom_match(b"", [b"eu"], True) is True
    assert twin.bloom_match(b"", [b"eu"], False) is False
    assert twin.bloom_match(bytearray(), [b"eu"], True) is True


def test_deeply_nested_sub_batches_fail_cleanly(twin):
    # _pycore decodes a sub-batch body as a data section, so nesting is possible; 5,000 levels must end in
    # an exception (not a C stack overflow, not a lost error indicator).
    body = twin.encode_entries([b"x"])
    for _ in range(5000):
        body = struct.pack(">BHII", 0x80, 1, len(body), len(body)) + body
    with pytest.raises((RecursionError, ChunkError)):
        twin.data_records(body, 1, 1)
    with pytest.raises((RecursionError, ChunkError)):
        twin.chunk_records(twin.build_chunk(body, 1, 1, 0, 0))


# ---- walk_simple_entries: a sub-batch body counted piece by piece (issue 21) ------------------------------

def test_walk_simple_entries_counts_without_collecting(twin):
    body = twin.encode_entries([b"a", b"", b"xyz", b"q" * 10])
    assert twin.walk_simple_entries(body, 0, 100) == (4, len(body))
    assert twin.walk_simple_entries(body, 0, 2) == (2, 9)           # stops after max_count
    assert twin.walk_simple_entries(body, 0, 0) == (0, 0)
    # pieces: an entry's body running past the end returns a position past it; a cut header stays behind
    assert twin.walk_simple_entries(body[:14], 0, 100) == (3, 16)
    assert twin.walk_simple_entries(body[:12], 0, 100) == (2, 9)    # the 3rd header is cut: left for the next
    assert twin.walk_simple_entries(body[:18], 0, 100) == (3, 16)   # 2 bytes of the 4th header: left
    assert twin.walk_simple_entries(body, 16, 100) == (1, len(body))
    with pytest.raises(ChunkError):
        twin.walk_simple_entries(twin.encode_sub_batch([b"a"]), 0, 10)
    with pytest.raises(ValueError):
        twin.walk_simple_entries(body, 0, -1)


def test_walk_simple_entries_of_millions_of_empty_entries_stops_at_the_limit(twin):
    zeros = bytes(64 << 20)          # 16.7M empty entries, as a decompression bomb inflates to
    assert twin.walk_simple_entries(memoryview(zeros), 0, 65536) == (65536, 4 * 65536)


@PROPERTY
@given(records=st.lists(st.binary(max_size=40), max_size=30), cuts=st.lists(st.integers(1, 50), max_size=8))
def test_walk_simple_entries_piecewise_agrees_with_the_whole(twin, records, cuts):
    body = twin.encode_entries(records)
    pieces, pos = [], 0
    for c in cuts:
        pieces.append(body[pos:pos + c])
        pos += c
    pieces.append(body[pos:])
    total, skip, carry = 0, 0, b""
    for piece in pieces:
        if skip >= len(piece):
            skip -= len(piece)
            continue
        piece = carry + piece
        n, p = twin.walk_simple_entries(piece, skip, 1000)
        total += n
        skip, carry = (p - len(piece), b"") if p >= len(piece) else (0, piece[p:])
    assert (total, skip, carry) == (len(records), 0, b"")

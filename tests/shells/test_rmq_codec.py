"""Pure-bytes tests of the RabbitMQ Stream codec: every server frame decodes in rstream's own decoder,
every client frame rstream builds decodes here."""

import gzip
import struct
import zlib

import pytest
from rstream import schema
from rstream.encoding import decode_frame, encode_frame, encode_publish

from riverbed.engine import core
from riverbed.engine import format as fmt
from riverbed.shells import rmq_stream as rs


def payload(frame_bytes):
    n = struct.unpack_from(">I", frame_bytes)[0]
    assert n == len(frame_bytes) - 4
    return frame_bytes[4:]


def rdecode(frame_bytes):
    return decode_frame(payload(frame_bytes))


def test_response_frames_decode_in_rstream():
    r = rdecode(rs.response(rs.CMD_DECLARE_PUBLISHER, 7, rs.RC_OK))
    assert isinstance(r, schema.DeclarePublisherResponse) and (r.correlation_id, r.response_code) == (7, 1)
    r = rdecode(rs.response(rs.CMD_QUERY_OFFSET, 3, rs.RC_NO_OFFSET, struct.pack(">Q", 0)))
    assert isinstance(r, schema.QueryOffsetResponse) and r.response_code == 0x13
    r = rdecode(rs.response(rs.CMD_PEER_PROPERTIES, 1, rs.RC_OK, rs.enc_properties({"a": "b", "é": "ü"})))
    assert {p.key: p.value for p in r.properties} == {"a": "b", "é": "ü"}
    r = rdecode(rs.response(rs.CMD_SASL_HANDSHAKE, 2, rs.RC_OK, rs.enc_strings(["PLAIN", "ANONYMOUS"])))
    assert r.mechanisms == ["PLAIN", "ANONYMOUS"]
    r = rdecode(rs.response(rs.CMD_ROUTE, 4, rs.RC_OK, rs.enc_strings(["s-0", "s-1"])))
    assert isinstance(r, schema.SuperStreamRouteResponse) and r.streams == ["s-0", "s-1"]


def test_server_commands_decode_in_rstream():
    r = rdecode(rs.encode_tune(1048576, 60))
    assert isinstance(r, schema.Tune) and (r.frame_max, r.heartbeat) == (1048576, 60)
    assert isinstance(rdecode(rs.encode_heartbeat()), schema.Heartbeat)
    r = rdecode(rs.encode_close(9, rs.RC_UNKNOWN_FRAME, "unknown frame"))
    assert isinstance(r, schema.Close) and (r.code, r.reason) == (0x0D, "unknown frame")
    r = rdecode(rs.encode_metadata_update(rs.RC_STREAM_NOT_AVAILABLE, "gone"))
    assert r.metadata_info.code == 6 and r.metadata_info.stream == "gone"
    r = rdecode(rs.encode_consumer_update(5, 3, True))
    assert isinstance(r, schema.ConsumerUpdateResponse) and (r.correlation_id, r.subscription_id, r.active) == (5, 3, 1)
    r = rdecode(rs.encode_credit_response(rs.RC_SUBSCRIPTION_ID_DOES_NOT_EXIST, 4))
    assert isinstance(r, schema.CreditResponse) and (r.response_code, r.subscription_id) == (4, 4)
    r = rdecode(rs.encode_publish_confirm(2, [1, 2, 2 ** 64 - 1]))
    assert isinstance(r, schema.PublishConfirm) and r.publishing_ids == [1, 2, 2 ** 64 - 1]
    r = rdecode(rs.encode_publish_error(2, [(5, 0x12), (6, 0x02)]))
    assert [(e.publishing_id, e.response_code) for e in r.errors] == [(5, 0x12), (6, 0x02)]
    r = rdecode(rs.encode_metadata_response(1, [(0, "127.0.0.1", 5552)],
                                            [("a", 1, 0, []), ("b", 2, 0xFFFF, [])]))
    assert r.brokers[0].host == "127.0.0.1" and r.brokers[0].port == 5552
    assert [(m.name, m.response_code, m.leader_ref) for m in r.metadata] == [("a", 1, 0), ("b", 2, 0xFFFF)]


def test_command_versions_in_rabbitmq_order_for_rstream():
    r = rdecode(rs.encode_command_versions(1, rs.SERVER_COMMAND_VERSIONS))
    # rstream looks up Publish at index key - 1 = 1
    assert r.command_versions[1].key_command == rs.CMD_PUBLISH and r.command_versions[1].max_version == 2
    assert r.command_versions[0].key_command == rs.CMD_DECLARE_PUBLISHER
    keys = [v.key_command for v in r.command_versions]
    assert keys == [1, 2, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 22, 23, 24, 25, 28, 29, 30, 31]


def test_stream_stats_layout():
    f = payload(rs.encode_stream_stats(8, rs.RC_OK, [("first_chunk_id", 0), ("committed_chunk_id", -1)]))
    key, ver, corr, code, n = struct.unpack_from(">HHIHi", f)
    assert (key, ver, corr, code, n) == (0x801C, 1, 8, 1, 2)
    r = rs.Reader(f, 14)
    assert (r.string(), r.i64(), r.string(), r.i64()) == ("first_chunk_id", 0, "committed_chunk_id", -1)
    r.done()


def test_deliver_of_stored_chunk_decodes_in_rstream():
    data = core.encode_entries([b"a", b"bc", b""])
    chunk = core.build_chunk(data, 3, 3, 1234, 10)
    n, parts = rs.deliver_parts(chunk)
    assert n == len(data) and parts == [chunk]
    wire = rs.encode_deliver_prefix(7, n) + b"".join(bytes(p) for p in parts)
    d = rdecode(wire)
    assert isinstance(d, schema.Deliver) and d.subscription_id == 7 and d.chunk_first_offset == 10
    assert d.get_messages() == [b"a", b"bc", b""]


def test_deliver_skips_the_bloom_but_keeps_bloom_size():
    data = core.encode_entries([b"x"])
    bloom = core.build_bloom([b"v"], False, 16)
    chunk = core.build_chunk(data, 1, 1, 5, 0, bloom=bloom)
    n, parts = rs.deliver_parts(chunk)
    wire = rs.encode_deliver_prefix(1, n) + b"".join(bytes(p) for p in parts)
    d = rdecode(wire)
    assert d.get_messages() == [b"x"] and d.chunk_crc == zlib.crc32(data)
    assert wire[4 + 5 + 44] == 16           # BloomSize still in the header


def test_deliver_v2_prefix():
    data = core.encode_entries([b"x"])
    chunk = core.build_chunk(data, 1, 1, 5, 40)
    wire = rs.encode_deliver_prefix(3, len(data), 2, 99) + chunk
    size, key, ver, sub, committed = struct.unpack_from(">IHHBQ", wire)
    assert (size, key, ver, sub, committed) == (len(wire) - 4, 8, 2, 3, 99)
    assert wire[17:] == chunk


def test_decode_publish_v1_strips_ids_into_a_data_section():
    msgs = [schema.Message(i, None, b"m%d" % i) for i in range(1, 6)]
    f = payload(encode_publish(schema.Publish(3, msgs)))
    b = rs.decode_publish(f, 1)
    assert b.publisher_id == 3 and b.ids == [1, 2, 3, 4, 5] and b.filters is None and not b.sub_batches
    assert b"".join(b.parts) == core.encode_entries([b"m1", b"m2", b"m3", b"m4", b"m5"])


def test_decode_publish_v2_filter_values():
    msgs = [schema.Message(1, "apple", b"a"), schema.Message(2, "pear", b"bb")]
    f = payload(encode_publish(schema.Publish(0, msgs), 2))
    b = rs.decode_publish(f, 2)
    assert b.ids == [1, 2] and b.filters == [b"apple", b"pear"]
    assert b"".join(b.parts) == core.encode_entries([b"a", b"bb"])
    # a v2 message without a filter value (length -1)
    raw = struct.pack(">HHBiQhI", 2, 2, 0, 1, 9, -1, 1) + b"z"
    b = rs.decode_publish(raw, 2)
    assert b.filters == [None] and b.ids == [9]


def test_decode_publish_sub_batch_as_rstream_sends_it():
    inner = core.encode_entries([b"one", b"two"])
    body = gzip.compress(inner)
    f = payload(encode_frame(schema.PublishSubBatching(1, 1, 42, 0x80 | (1 << 4), 2, len(inner), len(body), body)))
    b = rs.decode_publish(f, 1)
    assert b.ids == [42] and len(b.sub_batches) == 1
    idx, flags, nrec, usize, sb = b.sub_batches[0]
    assert (idx, flags, nrec, usize, bytes(sb)) == (0, 0x90, 2, len(inner), body)
    assert rs.check_sub_batch(flags, nrec, usize, sb) is None
    # the stored entry reads back as the two records
    assert core.data_records(b"".join(b.parts), 1, 2) == [b"one", b"two"]


@pytest.mark.parametrize("code", [fmt.COMPRESSION_NONE, fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY,
                                  fmt.COMPRESSION_LZ4, fmt.COMPRESSION_ZSTD])
def test_every_supported_codec_is_accepted(code):
    import cramjam
    import lz4.frame
    import zstandard
    inner = core.encode_entries([b"r%d" % i * 10 for i in range(50)])
    body = {fmt.COMPRESSION_NONE: lambda d: d, fmt.COMPRESSION_GZIP: gzip.compress,
            fmt.COMPRESSION_SNAPPY: lambda d: bytes(cramjam.snappy.compress(d)),
            fmt.COMPRESSION_LZ4: lz4.frame.compress,
            fmt.COMPRESSION_ZSTD: lambda d: zstandard.ZstdCompressor().compress(d)}[code](inner)
    assert rs.check_sub_batch(0x80 | code << 4, 50, len(inner), body) is None


def test_bad_sub_batches_are_refused_with_a_reason():
    inner = core.encode_entries([b"a", b"b"])
    assert "not supported" in rs.check_sub_batch(0x80 | 5 << 4, 2, len(inner), inner)
    assert "not supported" in rs.check_sub_batch(0x80 | 7 << 4, 2, len(inner), inner)
    assert "decompress" in rs.check_sub_batch(0x80 | 1 << 4, 2, len(inner), b"not gzip at all")
    assert "header says" in rs.check_sub_batch(0x80, 3, len(inner), inner)
    assert rs.check_sub_batch(0x80, 2, len(inner) + 1, inner) is not None
    assert "over" in rs.check_sub_batch(0x80 | 4 << 4, 2, 1 << 30, b"x")


@pytest.mark.parametrize("raw", [
    b"\x00\x02\x00\x01",                                     # no publisher id / count
    struct.pack(">HHBi", 2, 1, 0, 1),                         # count 1, no message
    struct.pack(">HHBi", 2, 1, 0, -1),                        # negative count
    struct.pack(">HHBiQI", 2, 1, 0, 1, 1, 100) + b"short",   # message overruns
    struct.pack(">HHBiQI", 2, 1, 0, 1, 1, 1) + b"ab",         # bytes left over
    struct.pack(">HHBi", 2, 1, 0, 10 ** 9),                   # count far beyond the frame
    struct.pack(">HHBiQBH", 2, 1, 0, 1, 1, 0x80, 1),          # truncated sub-batch header
])
def test_malformed_publish_raises_decode_error(raw):
    with pytest.raises(rs.DecodeError):
        rs.decode_publish(raw, 1)


def test_reader_never_raises_anything_but_decode_error():
    r = rs.Reader(b"\x00\x01\x00\x01\x00\x05ab")
    with pytest.raises(rs.DecodeError):
        r.string()
    r = rs.Reader(b"\x00\x01\x00\x01\x00\x02\xff\xfe")
    with pytest.raises(rs.DecodeError):
        r.string()
    r = rs.Reader(b"\x00\x01\x00\x01\x7f\xff\xff\xff")
    with pytest.raises(rs.DecodeError):
        r.count()
    r = rs.Reader(b"\x00\x01\x00\x01\xff\xff")
    assert r.string() is None
    r.done()


def test_offset_spec_decoding():
    assert rs.decode_offset_spec(rs.Reader(struct.pack(">HHHQ", 7, 1, 4, 17))) == (4, 17)
    assert rs.decode_offset_spec(rs.Reader(struct.pack(">HHHq", 7, 1, 5, -3))) == (5, -3)
    assert rs.decode_offset_spec(rs.Reader(struct.pack(">HHH", 7, 1, 1))) == (1, None)
    with pytest.raises(rs.DecodeError):
        rs.decode_offset_spec(rs.Reader(struct.pack(">HHH", 7, 1, 9)))
    with pytest.raises(rs.DecodeError):
        rs.decode_offset_spec(rs.Reader(struct.pack(">HHH", 7, 1, 0)))
    assert rs.decode_offset_spec(rs.Reader(struct.pack(">HHH", 7, 1, 0)), allow_none=True) == (0, None)


def test_filter_values_in_index_order():
    props = {"filter.10": "k", "filter.2": "b", "filter.0": "a", "name": "x", "match-unfiltered": "true"}
    assert rs.filter_values(props) == [b"a", b"b", b"k"]


# ---- sub-batch limits (issue 21): bombs are refused after the limit, not after inflating ---------------

def _bomb_codecs():
    import cramjam
    import lz4.frame
    import zstandard
    return {
        1: fmt.gzip_compress,
        2: lambda d: bytes(cramjam.snappy.compress(d)),
        3: lz4.frame.compress,
        4: lambda d: zstandard.ZstdCompressor().compress(d),
    }


@pytest.mark.parametrize("code", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_sub_batch_bomb_is_refused_within_bounded_memory(code):
    import tracemalloc
    from riverbed.shells.broker import limits as _limits
    body = _bomb_codecs()[code](bytes(16 << 20))       # 4M empty entries once inflated
    flags = 0x80 | code << 4
    tracemalloc.start()
    try:
        cases = [(65535, 16 << 20), (3, 4096), (65535, 40 << 20)]
        why = [rs.check_sub_batch(flags, nrec, usize, memoryview(body)) for nrec, usize in cases]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, f"peak {peak} bytes"
    assert why[0] is not None and why[0].reason in (_limits.REASON_ENTRIES, _limits.REASON_DECOMPRESSION_RATIO)
    assert why[1] is not None and why[1].reason == _limits.REASON_DECOMPRESSED_SIZE
    assert why[2] is not None and why[2].reason in (_limits.REASON_DECOMPRESSION_RATIO,
                                                    _limits.REASON_DECOMPRESSED_SIZE, _limits.REASON_ENTRIES)


@pytest.mark.parametrize("code", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_sub_batch_limits_let_real_batches_through(code):
    import dataclasses
    from riverbed.shells.broker import limits as _limits
    records = [b"x" * 300_000, b"", b"y" * 70_000] + [b"r%d" % i for i in range(1000)]
    inner = core.encode_entries(records)
    body = inner if code == 0 else _bomb_codecs()[code](inner)
    flags = 0x80 | code << 4
    assert rs.check_sub_batch(flags, len(records), len(inner), memoryview(body)) is None
    assert rs.check_sub_batch(flags, len(records) + 1, len(inner), memoryview(body)) is not None
    assert rs.check_sub_batch(flags, len(records), len(inner) + 1, memoryview(body)) is not None
    tight = dataclasses.replace(_limits.DEFAULT, max_decompressed_size=len(inner) - 1)
    why = rs.check_sub_batch(flags, len(records), len(inner), memoryview(body), tight)
    assert why is not None and why.reason == _limits.REASON_DECOMPRESSED_SIZE

"""The Kafka codec: request/response framing (classic and flexible versions), golden bytes as annotated
hex, and record batches v2 checked against kafka-python's own record encoder and reader."""

import pytest

from riverbed.shells.kafka import codec as C
from riverbed.shells.kafka import records as R

# kafka-python (the reference encoder here) reads its own schemas with a deprecated importlib call
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def unhex(text):
    """Annotated hex: ``#`` starts a comment, whitespace is ignored."""
    return bytes.fromhex("".join(line.split("#")[0] for line in text.splitlines()).replace(" ", ""))


# ApiVersions v3 (flexible: request header v2 = classic client id + tagged fields; compact body strings)
API_VERSIONS_V3 = unhex("""
    00000011            # size 17
    0012 0003 00000001  # api key 18, version 3, correlation id 1
    0001 63             # client id "c": a classic int16-length string even in header v2
    00                  # header tagged fields: none
    02 61               # client_software_name "a": compact string, length + 1
    02 31               # client_software_version "1"
    00                  # body tagged fields: none
""")


def test_api_versions_v3_request_golden():
    frame = C.encode_request(18, 3, 1, "c", {"client_software_name": "a", "client_software_version": "1"})
    assert frame == API_VERSIONS_V3
    hdr = C.decode_header(frame[4:])
    assert (hdr.api_key, hdr.version, hdr.correlation_id, hdr.client_id) == (18, 3, 1, "c")
    assert C.decode_request(18, 3, frame[4:], hdr.body) == {"client_software_name": "a",
                                                              "client_software_version": "1"}


def test_api_versions_response_keeps_header_v0():
    frame = C.encode_response(18, 3, 7, {"error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0,
                                                                        "max_version": 3}]})
    assert frame == unhex("""
        00000013      # size 19
        00000007      # correlation id; no header tagged fields (ApiVersions responses keep header v0)
        0000          # error code
        02 0012 0000 0003 00   # compact array of 1: key 18, versions 0..3, the element's tagged fields
        00000000      # throttle time
        00            # tagged fields
    """)


def test_metadata_v1_classic_and_v9_flexible_round_trip():
    body = {"brokers": [{"node_id": 0, "host": "h", "port": 9092, "rack": None}], "cluster_id": "rb",
            "controller_id": 0, "topics": [{"error_code": 0, "name": "t", "is_internal": False, "partitions": [
                {"error_code": 0, "partition_index": 0, "leader_id": 0, "replica_nodes": [0], "isr_nodes": [0]}]}]}
    for v in (1, 9):
        frame = C.encode_response(3, v, 5, body)
        corr, back = C.decode_response(3, v, frame[4:])
        assert corr == 5 and back["brokers"][0]["host"] == "h"
        assert back["topics"][0]["partitions"][0]["isr_nodes"] == [0]
    # v1: no header tags, no throttle time, the brokers array counted in an int32
    assert C.encode_response(3, 1, 5, body)[8:12] == b"\x00\x00\x00\x01"
    # v9: header tagged fields (none), throttle time, then a compact array: count + 1
    assert C.encode_response(3, 9, 5, body)[8:14] == b"\x00" + b"\x00\x00\x00\x00" + b"\x02"


def test_tagged_fields_written_only_when_set_and_skipped_when_unknown():
    # Fetch v12 request: cluster_id is tag 0; a set one is written as a tagged field
    req = {"max_wait_ms": 100, "min_bytes": 1, "max_bytes": 1000, "topics": [], "forgotten_topics_data": [],
           "rack_id": "", "cluster_id": "cl"}
    frame = C.encode_request(1, 12, 9, None, req)
    hdr = C.decode_header(frame[4:])
    back = C.decode_request(1, 12, frame[4:], hdr.body)
    assert back["cluster_id"] == "cl" and back["max_wait_ms"] == 100
    assert frame.endswith(unhex("01 00 03 03 636c"))    # one tagged field: tag 0, size 3, compact "cl"


def test_truncated_and_bogus_counts_raise_decode_error():
    frame = C.encode_request(3, 1, 1, "c", {"topics": [{"name": "abc"}]})[4:]
    hdr = C.decode_header(frame)
    for cut in range(hdr.body, len(frame)):
        with pytest.raises(C.DecodeError):
            C.decode_request(3, 1, frame[:cut], hdr.body)
    bogus = frame[:hdr.body] + b"\x7f\xff\xff\xff"      # two billion topics in four bytes
    with pytest.raises(C.DecodeError):
        C.decode_request(3, 1, bogus, hdr.body)


def test_split_frames_refuses_negative_and_oversized():
    with pytest.raises(C.DecodeError):
        C.split_frames(b"\xff\xff\xff\xff")
    with pytest.raises(C.DecodeError):
        C.split_frames((C.MAX_FRAME + 1).to_bytes(4, "big"))
    frames, used = C.split_frames(b"\x00\x00\x00\x02ab\x00\x00\x00\x05abc")
    assert [bytes(f) for f in frames] == [b"ab"] and used == 6


# one record, key "k", value "v", header h=x, at 1000 ms: the batch as Kafka defines it
BATCH_GOLDEN = unhex("""
    0000000000000000    # base offset 0
    0000003e            # batch length 62 (from the leader epoch on)
    ffffffff            # partition leader epoch -1
    02                  # magic 2
    85d4936f            # CRC-32C of attributes .. end
    0000                # attributes: no compression, create time
    00000000            # last offset delta 0
    00000000000003e8    # base timestamp 1000
    00000000000003e8    # max timestamp 1000
    ffffffffffffffff    # producer id -1
    ffff                # producer epoch -1
    ffffffff            # base sequence -1
    00000001            # 1 record
    18                  # record length 12 (zigzag varint)
    00 00 00            # attributes, timestamp delta 0, offset delta 0
    02 6b               # key length 1, "k"
    02 76               # value length 1, "v"
    02                  # 1 header
    02 68 02 78         # "h" = "x"
""")


def test_record_batch_golden_and_kafka_python_agrees():
    from kafka.record.default_records import DefaultRecordBatch
    batch = C.encode_batch(0, [(1000, b"k", b"v", [("h", b"x")])])
    assert batch == BATCH_GOLDEN
    theirs = DefaultRecordBatch(bytearray(batch))
    assert theirs.validate_crc()
    (rec,) = list(theirs)
    assert (rec.key, rec.value, rec.timestamp, list(rec.headers)) == (b"k", b"v", 1000, [("h", b"x")])


# snappy: kafka-python needs python-snappy, not a dependency here; librdkafka's snappy batches are
# decoded in the integration tests, Java's xerial framing below
@pytest.mark.parametrize("compression", [0, 1, 3, 4])
def test_batches_from_kafka_python_decode(compression):
    from kafka.record.default_records import DefaultRecordBatchBuilder
    b = DefaultRecordBatchBuilder(2, compression, False, 7, 0, 5, 1 << 20)
    for i in range(50):
        b.append(i, 1000 + i, b"k%d" % i, b"v%d" % i * 20, [("n", b"%d" % i)])
    data = bytes(b.build())
    (batch,) = C.decode_batches(data, 1 << 20)
    assert batch.compression == compression and (batch.producer_id, batch.base_sequence) == (7, 5)
    assert batch.records[49] == (1049, b"k49", b"v49" * 20, [("n", b"49")])


def test_xerial_snappy_decodes():
    import cramjam
    body = b"".join(C.encode_record(i, 0, None, b"x" * 100, []) for i in range(3))
    block = bytes(cramjam.snappy.compress_raw(body))
    xerial = C.XERIAL_MAGIC + b"\x00\x00\x00\x01\x00\x00\x00\x01" + len(block).to_bytes(4, "big") + block
    assert C.decompress(C.COMPRESSION_SNAPPY, xerial, 1 << 20) == body


def test_wrong_crc_truncation_and_bombs_are_corrupt():
    batch = bytearray(C.encode_batch(0, [(1, None, b"v", [])]))
    batch[-1] ^= 1
    with pytest.raises(C.CorruptBatch, match="CRC"):
        C.decode_batches(batch, 1 << 20)
    with pytest.raises(C.CorruptBatch):
        C.decode_batches(BATCH_GOLDEN[:-3], 1 << 20)
    bomb = C.encode_batch(0, [(1, None, b"\0" * (1 << 20), [])], compression=C.COMPRESSION_GZIP)
    with pytest.raises(C.CorruptBatch, match="more than"):
        C.decode_batches(bomb, 1 << 16)
    bad_codec = bytearray(C.encode_batch(0, [(1, None, b"v", [])]))
    bad_codec[22] |= 5          # compression code 5: not defined
    bad_codec[17:21] = C.crc32c(bytes(bad_codec[21:])).to_bytes(4, "big")
    with pytest.raises(C.UnsupportedCompression):
        C.decode_batches(bad_codec, 1 << 20)


def test_record_mapping_round_trip_and_other_protocols():
    from riverbed.engine.record import decode_record, from_bson, from_json_text
    stored = R.to_stored(b"key", b'{"a":1}', [("h", b"text"), ("b", b"\xff\x00")], 1234)
    rec = decode_record(stored)
    assert rec.amqp and rec.creation_time == 1234 and rec.kind == "json"
    assert rec.app_properties == {"h": "text", "b": b"\xff\x00"}
    assert R.from_stored(stored, 1) == (1234, b"key", b'{"a":1}', [("h", b"text"), ("b", b"\xff\x00")])
    # WebSocket: pkey is the key; JSON as its text. BSON: its bytes. A raw record: whole.
    assert R.from_stored(from_json_text('{"x":2}', app_properties={"pkey": "p1"}), 9) == \
        (9, b"p1", b'{"x":2}', [("pkey", b"p1")])
    doc = from_bson({"y": 3})
    assert R.from_stored(doc, 9)[2] == decode_record(doc).payload
    assert R.from_stored(b"\x01raw", 9) == (9, None, b"\x01raw", [])


def test_null_where_the_version_forbids_it_is_written_empty():
    # JoinGroup's protocol_name is nullable from v7 only: an error answer at v5 must still carry a string
    body = {"error_code": 79, "member_id": "m", "protocol_name": None}
    _, v5 = C.decode_response(11, 5, C.encode_response(11, 5, 1, body)[4:])
    _, v7 = C.decode_response(11, 7, C.encode_response(11, 7, 1, body)[4:])
    assert v5["protocol_name"] == "" and v7["protocol_name"] is None

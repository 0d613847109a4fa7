"""Pieces of riverbed.spark that need no SparkSession: options, planning, AMQP decoding, the URI.

Marked ``spark`` like the rest of the folder: they need the spark extra (pyspark, pyarrow) installed."""

import struct
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from riverbed.engine import Engine
from riverbed.spark import amqp
from riverbed.spark.remote import parse_uri
from riverbed.spark.source import LocalBackend, Options, OptionError, PushedFilters, plan_ranges, split_ranges

pytestmark = pytest.mark.spark
MAP = pa.map_(pa.string(), pa.string())


def data(body):
    return b"\x00\x53\x75\xa0" + bytes([len(body)]) + body


def test_options_are_validated():
    o = Options({"path": "/d", "stream": " a, b ", "startingOffset": '{"a": 5, "b": "latest"}',
                 "endingTimestamp": "2024-01-01T00:00:00", "numPartitions": "3"})
    assert o.names == ["a", "b"] and o.start_per == {"a": 5, "b": "latest"} and o.start_default == "earliest"
    assert o.end_ts == 1704067200000 and o.num_partitions == 3 and o.ddl().endswith("body binary")
    for bad in [{"stream": "a"}, {"path": "/d", "uri": "rabbitmq-stream://h", "stream": "a"},
                {"path": "/d"}, {"path": "/d", "stream": "a", "decode": "xml"},
                {"path": "/d", "stream": "a", "decode": "json"}, {"path": "/d", "stream": "a", "startingOffset": "-1"},
                {"path": "/d", "stream": "a", "startingTimestamp": "yesterday"},
                {"path": "/d", "stream": "a", "numPartitions": "0"}]:
        with pytest.raises(OptionError):
            Options(bad)
    with pytest.raises(ValueError):
        Options({"uri": "http://h", "stream": "a"})


def test_uri():
    assert parse_uri("rabbitmq-stream://127.0.0.1") == ("127.0.0.1", 5552, "guest", "guest", "/")
    assert parse_uri("rabbitmq-stream://u:p%40ss@h:1234/v%2F1") == ("h", 1234, "u", "p@ss", "v/1")


def test_planning_splits_evenly_at_chunk_boundaries(tmp_path):
    path = str(tmp_path / "d")
    with Engine(path) as eng:
        eng.create_stream("s").result()
        for i in range(10):
            eng.append("s", [b"x"] * 100).result()
    o = Options({"path": path, "stream": "s", "startingOffset": "150", "endingOffset": "950"})
    backend = LocalBackend(o)
    ranges = plan_ranges(o, backend)
    assert ranges == [("s", 0, 150, 950)]
    parts = split_ranges(ranges, backend, 4)
    assert [(p.start, p.end) for p in parts] == [(150, 300), (300, 500), (500, 700), (700, 950)]
    pushed = PushedFilters()
    from pyspark.sql.datasource import GreaterThan, LessThanOrEqual
    assert pushed.accept(GreaterThan(("offset",), 420)) and pushed.accept(LessThanOrEqual(("offset",), 600))
    assert plan_ranges(o, backend, pushed) == [("s", 0, 421, 601)]
    assert split_ranges([("s", 0, 5, 5)], backend, 4) == []


def test_amqp_message_sections():
    props = b"\x00\x53\x74\xc1\x0c\x04\xa1\x01k\xa1\x01v\xa3\x01n\x54\x07"        # {"k": "v", "n": 7 (byte)}
    header = b"\x00\x53\x70\x45"                                                # header section: list0
    assert amqp.decode_message(header + props + data(b"hi") + data(b"!")) == (b"hi!", {"k": "v", "n": "7"})
    big = b"\x00\x53\x75\xb0" + struct.pack(">I", 300) + b"z" * 300
    assert amqp.decode_message(big) == (b"z" * 300, {})
    assert amqp.decode_message(b"\x00\x53\x77\xa1\x03abc") == (b"abc", {})       # amqp-value string
    for bad in [b"plain text", b"\x00\x53\x75\xa0\x09short", b"\x00\x53\x74\xa1\x01x"]:
        with pytest.raises(amqp.AmqpError):
            amqp.decode_message(bad)


def test_amqp_batch_fast_and_slow_paths_agree():
    bare = [data(b"a" * i) for i in range(20)] + [b"\x00\x53\x75\xb0" + struct.pack(">I", 3) + b"xyz"]
    body, props = amqp.decode_batch(pa.array(bare, pa.binary()).slice(1), MAP)
    assert body.to_pylist() == [b"a" * i for i in range(1, 20)] + [b"xyz"]
    assert props.to_pylist() == [[]] * 20 and props.type == MAP
    mixed = bare + [b"junk", None]
    body, props = amqp.decode_batch(pa.array(mixed, pa.binary()), MAP)
    assert body.to_pylist() == [b"a" * i for i in range(20)] + [b"xyz", b"junk", None]
    assert props.to_pylist()[-3:] == [[], None, None]


def test_json_and_bson_documents_become_typed_columns():
    import bson

    from riverbed.spark.amqp import decode_documents
    fields = [pa.field("id", pa.int64()), pa.field("at", pa.timestamp("us", tz="UTC")), pa.field("name", pa.string())]
    docs = [b'{"id": 1, "at": "2024-05-01T12:00:00Z", "name": "a"}', b"nope", b'{"id": "x", "name": {"k": 1}}']
    ids, at, names = decode_documents(pa.array(docs, pa.binary()), "json", fields)
    assert ids.to_pylist() == [1, None, None] and names.to_pylist() == ["a", None, '{"k": 1}']
    assert at[0].value == 1714564800 * 1_000_000 and at[1].as_py() is None
    from datetime import datetime, timezone
    raw = bson.encode({"id": 7, "at": datetime(2024, 5, 1, 12, tzinfo=timezone.utc), "name": "b"})
    ids, at, names = decode_documents(pa.array([raw, b"\x05\x00"], pa.binary()), "bson", fields)
    assert ids.to_pylist() == [7, None] and at[0].value == 1714564800 * 1_000_000


def mixed_records():
    """One document published every way a shell or a client can store it, then a few that are no document."""
    import bson

    from riverbed.engine import record
    at = datetime(2024, 5, 1, 12, tzinfo=timezone.utc)
    return [
        b'{"id": 1, "name": "raw-json", "at": "2024-05-01T12:00:00Z"}',                     # RabbitMQ client, raw
        record.from_json_text('{"id": 2, "name": "ws", "at": "2024-05-01T12:00:00Z"}', 1714564800000,
                              {"pkey": "k"}),                                             # WebSocket shell
        data(b'{"id": 3, "name": "rstream", "at": "2024-05-01T12:00:00Z"}'),               # rstream AMQPMessage
        record.from_bson({"id": 4, "name": "bson-shell", "at": at}),                       # BSON shell
        bson.encode({"id": 5, "name": "raw-bson", "at": at}),                              # RabbitMQ client, raw
        record.encode_record([bson.encode({"id": 6, "name": "zmq", "at": at})], record.CT_OCTET),   # ZeroMQ shell
        b"\x01\x02\x03",                                                                   # bytes
        record.encode_record(b"[1, 2]", record.CT_JSON),                                   # JSON, not an object
        None,
    ]


def test_json_and_bson_decoders_read_the_one_record_format():
    from riverbed.engine import record
    fields = [pa.field("id", pa.int64()), pa.field("name", pa.string()), pa.field("at", pa.timestamp("us", tz="UTC")),
              pa.field("base64", pa.string()), pa.field("data", pa.binary())]
    body = pa.array(mixed_records(), pa.binary())
    at = 1714564800 * 1_000_000
    ids, names, ats, b64, raw = amqp.decode_documents(body, "json", fields)
    assert ids.to_pylist() == [1, 2, 3, 4, 5, 6, None, None, None]
    assert names.to_pylist() == ["raw-json", "ws", "rstream", "bson-shell", "raw-bson", "zmq", None, None, None]
    assert [a.value for a in ats[:6]] == [at] * 6 and ats[6].as_py() is None
    assert b64.to_pylist()[6] == "AQID" and raw.to_pylist()[6] is None          # bytes: {"base64": ...}
    ids, names, ats, b64, raw = amqp.decode_documents(body, "bson", fields)
    assert ids.to_pylist() == [1, 2, 3, 4, 5, 6, None, None, None]
    assert [a.value for a in ats[:6]] == [at] * 6
    assert raw.to_pylist()[6:8] == [b"\x01\x02\x03", b"[1, 2]"] and b64.to_pylist()[6] is None   # {"data": Binary}
    # Extended JSON wrappers of a BSON record unwrap to the column types under decode=json
    import bson
    from bson import Decimal128, ObjectId
    oid = ObjectId("65a1b2c3d4e5f60718293a4b")
    doc = {"_id": oid, "d": Decimal128("1.25"), "b": b"\x00\x01", "nested": {"at": datetime(2024, 5, 1, tzinfo=timezone.utc)},
           "inf": float("inf"), "l": [oid]}
    fields = [pa.field("_id", pa.string()), pa.field("d", pa.string()), pa.field("b", pa.binary()),
              pa.field("nested", pa.struct([pa.field("at", pa.timestamp("us", tz="UTC"))])),
              pa.field("inf", pa.float64()), pa.field("l", pa.list_(pa.string()))]
    for decode in ("json", "bson"):
        cols = amqp.decode_documents(pa.array([record.from_bson(doc)], pa.binary()), decode, fields)
        assert [c.to_pylist()[0] for c in cols] == [
            str(oid), "1.25", b"\x00\x01", {"at": datetime(2024, 5, 1, tzinfo=timezone.utc)}, float("inf"), [str(oid)]]
    assert bson.decode(bson.encode(doc))["_id"] == oid


def test_document_batches_from_core_buffers():
    from riverbed.engine import core
    from riverbed.spark.batches import BatchBuilder
    recs = [r for r in mixed_records() if r is not None]
    bufs = core.chunk_to_arrow(core.encode_chunk(recs, 100, 1_700_000_000_000))[:5]
    schema = pa.schema([("stream", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                        ("timestamp", pa.timestamp("us", tz="UTC")), ("chunk_id", pa.int64()),
                        ("id", pa.int64()), ("name", pa.string())])
    batch = BatchBuilder(schema, "mixed", 0, "json", ["id", "name"]).build(bufs)
    assert batch.schema == schema and batch.num_rows == len(recs)
    assert batch.column("offset").to_pylist() == list(range(100, 100 + len(recs)))
    assert batch.column("id").to_pylist() == [1, 2, 3, 4, 5, 6, None, None]
    assert batch.column("stream").to_pylist() == ["mixed"] * len(recs)


def test_a_too_deep_record_loads_raw_and_the_next_one_loads():
    """Issue 21: a record nested deeper than the depth limit (here a 600-deep BSON event and JSON text,
    and a raw AMQP value 600 lists deep) loads as the raw form, {"base64"} / {"data"}, and the records
    after it load as usual; a ``decode=json`` read never fails on it."""
    import bson

    from riverbed.engine import record
    from riverbed.spark import amqp
    doc = {"x": 1}
    for _ in range(599):
        doc = {"a": doc}
    deep_bson = bson.encode(doc)
    deep_json = ('{"a":' * 599 + '{"x":1}' + "}" * 599).encode()
    value = b"\x40"
    for _ in range(600):
        value = b"\xd0" + (4 + len(value)).to_bytes(4, "big") + (1).to_bytes(4, "big") + value
    deep_amqp = b"\x00\x53\x77" + value
    records = [record.from_bson(deep_bson), record.from_bson({"id": 1}), record.from_json_text(deep_json),
               record.from_json_text('{"id": 2}'), deep_amqp, b'{"id": 3}']
    fields = [pa.field("id", pa.int64()), pa.field("base64", pa.string()), pa.field("data", pa.binary())]
    body = pa.array(records, pa.binary())
    ids, b64, _ = amqp.decode_documents(body, "json", fields)
    assert ids.to_pylist() == [None, 1, None, 2, None, 3]
    import base64
    assert [b64.to_pylist()[i] for i in (0, 2, 4)] == [base64.b64encode(p).decode()
                                                       for p in (deep_bson, deep_json, deep_amqp)]
    ids, _, raw = amqp.decode_documents(body, "bson", fields)
    assert ids.to_pylist() == [None, 1, None, 2, None, 3]
    assert [raw.to_pylist()[i] for i in (0, 2, 4)] == [deep_bson, deep_json, deep_amqp]


def test_a_deep_descriptor_chain_loads_as_raw_bytes():
    """A record of 5,000 nested descriptors (``00 00 00 ...``) is not a message: its body is its bytes."""
    from riverbed.spark import amqp
    chain = b"\x00\x53\x77" + b"\x00" * 5000 + b"\x40" * 5001
    bodies, props = amqp.decode_batch(pa.array([chain, b"\x00\x53\x75\xa0\x02hi"], pa.binary()),
                                      pa.map_(pa.string(), pa.string()))
    assert bodies.to_pylist() == [chain, b"hi"] and props.to_pylist()[0] is None

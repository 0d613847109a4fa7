"""The ``riverbed`` data source end to end on a local[2] SparkSession: batch, pushdown, super streams,
decoders, remote reads from a running broker, and streaming across a restart.

One data directory (module fixture) holds 3 plain streams and a 3-partition super stream, 112,000
records in all, in simple entries and none/gzip sub-batches. Expected values come from the engine's own
scan (``Engine.scan``), never from the data source.
"""

import json
import os
import re
import struct
import sys
import time
import zlib
from datetime import datetime, timezone

import pytest

from riverbed.engine import Engine
from riverbed.engine import _pycore
from riverbed.engine.format import COMPRESSION_GZIP, gzip_compress

pytestmark = pytest.mark.spark

FILTER_NODE = re.compile(r"\bFilter \(")     # a Filter operator in a physical plan (not "RuntimeFilters")
T0 = 1_700_000_000_000      # ms: chunk timestamps of the "timed" stream are T0 + 1000 * k


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def amqp(body, props=None):
    """An AMQP 1.0 message as rstream encodes one: [application-properties] data."""
    out = b""
    if props:
        items = b""
        for k, v in props.items():
            kb, vb = k.encode(), v.encode()
            items += b"\xa1" + bytes([len(kb)]) + kb + b"\xa1" + bytes([len(vb)]) + vb
        out += b"\x00\x53\x74\xc1" + bytes([len(items) + 1, 2 * len(props)]) + items
    if len(body) < 256:
        return out + b"\x00\x53\x75\xa0" + bytes([len(body)]) + body
    return out + b"\x00\x53\x75\xb0" + struct.pack(">I", len(body)) + body


def mixed_records():
    """The same kind of document as every protocol stores it (riverbed.engine.record), then bytes."""
    import bson

    from riverbed.engine import record
    at = datetime(2024, 5, 1, 12, tzinfo=timezone.utc)
    return [
        b'{"id": 0, "name": "raw-json"}',                                          # RabbitMQ client, raw
        record.from_json_text('{"id": 1, "name": "ws"}', T0, {"pkey": "k"}),       # WebSocket shell
        amqp(b'{"id": 2, "name": "rstream"}'),                                     # rstream AMQPMessage
        record.from_bson({"id": 3, "name": "bson", "at": at}),                     # BSON shell
        bson.encode({"id": 4, "name": "raw-bson"}),                                # RabbitMQ client, raw BSON
        record.encode_record([bson.encode({"id": 5, "name": "zmq"})], record.CT_OCTET, T0),   # ZeroMQ shell
        b"\x01\x02\x03",                                                           # bytes
    ]


def write_data(path):
    clock = Clock(T0)
    with Engine(path, fsync="never", clock=clock) as eng:
        for name in ("orders", "events", "timed", "amqp", "json", "mixed", "ss-0", "ss-1", "ss-2"):
            eng.create_stream(name).result()
        # orders: 60,000 simple records in appends of 1,000 (separate commits: separate chunks)
        for i in range(0, 60_000, 1000):
            eng.append("orders", [b"order-%06d|" % j + b"x" * (j % 37) for j in range(i, i + 1000)]).result()
        # events: 40,000 records in sub-batches of 100, every other one gzip, 20 per append
        for i in range(0, 40_000, 2000):
            data = b""
            for k in range(i, i + 2000, 100):
                recs = [b"event-%d" % j for j in range(k, k + 100)]
                code = COMPRESSION_GZIP if (k // 100) % 2 else 0
                data += _pycore.encode_sub_batch(recs, code, gzip_compress)
            eng.append_entries("events", data, num_entries=20, num_records=2000).result()
        # timed: 10 chunks of 50, one second apart
        for k in range(10):
            clock.now = T0 + 1000 * k
            eng.append("timed", [b"t%d-%d" % (k, j) for j in range(50)]).result()
        clock.now = T0 + 20_000
        eng.append("amqp", [amqp(b"plain-%d" % i) for i in range(300)]).result()
        eng.append("amqp", [amqp(b"big" * 100), amqp(b"with-props", {"k": "v", "n": "1"}), b"not amqp"]).result()
        docs = [json.dumps({"id": i, "name": f"n{i}", "at": "2024-05-01T12:00:00Z", "tags": ["a", str(i)]})
                for i in range(200)]
        eng.append("json", [d.encode() for d in docs] + [b"{broken", b'{"id": "x", "name": 5}']).result()
        eng.append("mixed", mixed_records()).result()
        for p in range(3):
            for i in range(0, 4000, 1000):
                eng.append(f"ss-{p}", [b"p%d-%d" % (p, j) for j in range(i, i + 1000)]).result()
        # the super stream over those partitions, in the engine's table as every shell records it
        eng.create_super_stream("ss", ["ss-0", "ss-1", "ss-2"], ["0", "1", "2"], adopt=True).result()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("spark") / "data")
    write_data(path)
    return path


@pytest.fixture(scope="module")
def scans(data_dir):
    """stream -> [(offset, bytes)] from the engine's own scan."""
    eng = Engine(data_dir, readonly=True)
    try:
        return {name: list(eng.scan(name)) for name in eng.list_streams()}
    finally:
        eng.close()


@pytest.fixture(scope="module")
def chunk_ids(data_dir):
    eng = Engine(data_dir, readonly=True)
    try:
        return {name: [c for c, _ in eng.chunk_index(name)] for name in eng.list_streams()}
    finally:
        eng.close()


def load(spark, data_dir, stream, **options):
    r = spark.read.format("riverbed").option("path", data_dir).option("stream", stream)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def offsets(df):
    return sorted(r.offset for r in df.select("offset").collect())


# ------------------------------------------------------------------------------------------- batch

def test_counts_and_checksums_match_the_engine_scan(spark, data_dir, scans):
    df = load(spark, data_dir, "orders,events,ss")
    rows = df.selectExpr("stream", "offset", "crc32(body) AS c", "length(body) AS l").groupBy("stream") \
        .agg({"offset": "sum", "c": "sum", "l": "sum", "*": "count"}).collect()
    want_streams = ["orders", "events", "ss-0", "ss-1", "ss-2"]
    assert sorted(r.stream for r in rows) == sorted(want_streams)
    total = 0
    for r in rows:
        recs = scans[r.stream]
        assert r["count(1)"] == len(recs)
        assert r["sum(offset)"] == sum(o for o, _ in recs)
        assert r["sum(c)"] == sum(zlib.crc32(b) for _, b in recs)
        assert r["sum(l)"] == sum(len(b) for _, b in recs)
        total += len(recs)
    assert total >= 100_000


def test_rows_are_the_records(spark, data_dir, scans):
    rows = load(spark, data_dir, "events", startingOffset="1995", endingOffset="2105").orderBy("offset").collect()
    want = [(o, b) for o, b in scans["events"] if 1995 <= o < 2105]
    assert [(r.offset, bytes(r.body)) for r in rows] == want
    assert {r.stream for r in rows} == {"events"} and {r.partition for r in rows} == {0}
    assert all(r.chunk_id <= r.offset for r in rows)
    assert rows[0].timestamp.year >= 2023


def test_partitions_split_at_chunk_boundaries(spark, data_dir, chunk_ids):
    df = load(spark, data_dir, "orders", numPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    per_task = df.rdd.mapPartitions(lambda rows: [sorted({r.chunk_id for r in rows})]).collect()
    seen = [c for cs in per_task for c in cs]
    assert sorted(seen) == chunk_ids["orders"]        # every chunk read, and by one task only


@pytest.mark.parametrize("start_off,end_off", [(0, 1), (0, 2), (1, 3), (2, 3), (0, 60)])
def test_offset_ranges_are_exact_at_chunk_boundaries(spark, data_dir, chunk_ids, start_off, end_off):
    ids = chunk_ids["orders"] + [60_000]
    for start, end in [(ids[start_off], ids[end_off]), (ids[start_off] + 1, ids[end_off] - 1),
                       (max(ids[start_off] - 1, 0), ids[end_off] + 1 if end_off < 60 else 60_000)]:
        df = load(spark, data_dir, "orders", startingOffset=str(start), endingOffset=str(end))
        assert df.count() == end - start
        if end - start <= 3000:
            assert offsets(df) == list(range(start, end))


def test_per_stream_offsets_and_latest(spark, data_dir):
    df = load(spark, data_dir, "orders,events", startingOffset=json.dumps({"orders": 59_990, "events": "latest"}))
    assert offsets(df) == list(range(59_990, 60_000))
    assert load(spark, data_dir, "orders", startingOffset="latest").count() == 0


def test_timestamp_ranges_are_exact_at_chunk_boundaries(spark, data_dir):
    df = load(spark, data_dir, "timed", startingTimestamp=str(T0 + 3000), endingTimestamp=str(T0 + 6000))
    assert offsets(df) == list(range(150, 300))
    df = load(spark, data_dir, "timed", startingTimestamp=str(T0 + 2999), endingTimestamp=str(T0 + 6001))
    assert offsets(df) == list(range(150, 350))
    iso = load(spark, data_dir, "timed", startingTimestamp="2023-11-14T22:13:29Z")      # T0 + 9000 - 11
    assert offsets(iso) == list(range(450, 500))
    ts = {r.offset: r.timestamp for r in df.collect()}
    assert int(ts[150].timestamp() * 1000) == T0 + 3000


def test_filters_are_pushed_down_and_exact(spark, data_dir, spark_conf):
    with spark_conf({"spark.sql.python.filterPushdown.enabled": "true"}):
        df = load(spark, data_dir, "timed,orders")
        q = df.filter("stream = 'timed' AND offset >= 120 AND offset < 430 "
                      "AND timestamp >= timestamp_millis(%d) AND timestamp < timestamp_millis(%d)"
                      % (T0 + 2000, T0 + 8000))
        plan = q._jdf.queryExecution().executedPlan().toString()
        assert not FILTER_NODE.search(plan), plan
        assert offsets(q) == list(range(120, 400))
        # a filter the source cannot apply stays with Spark
        q2 = df.filter("stream = 'timed' AND length(body) = 5")
        assert FILTER_NODE.search(q2._jdf.queryExecution().executedPlan().toString())
        assert q2.count() == 400          # "tK-10" .. "tK-49" in each of the 10 chunks
    # with pushdown off the same query works (and Spark filters)
    assert offsets(load(spark, data_dir, "timed").filter("offset >= 495")) == list(range(495, 500))


def test_super_stream(spark, data_dir, scans):
    rows = load(spark, data_dir, "ss").groupBy("stream", "partition").count().collect()
    assert sorted((r.stream, r.partition, r["count"]) for r in rows) == [
        ("ss-0", 0, 4000), ("ss-1", 1, 4000), ("ss-2", 2, 4000)]


def test_decode_amqp(spark, data_dir):
    rows = load(spark, data_dir, "amqp", decode="amqp").orderBy("offset").collect()
    assert [bytes(r.body) for r in rows[:300]] == [b"plain-%d" % i for i in range(300)]
    assert all(r.properties == {} for r in rows[:300])
    assert bytes(rows[300].body) == b"big" * 100
    assert bytes(rows[301].body) == b"with-props" and rows[301].properties == {"k": "v", "n": "1"}
    assert bytes(rows[302].body) == b"not amqp" and rows[302].properties is None
    assert load(spark, data_dir, "amqp", decode="amqp").columns[-2:] == ["body", "properties"]


def test_decode_json(spark, data_dir):
    df = load(spark, data_dir, "json", decode="json", schema="id bigint, name string, at timestamp, tags array<string>")
    assert df.columns == ["stream", "partition", "offset", "timestamp", "chunk_id", "id", "name", "at", "tags"]
    rows = df.orderBy("offset").collect()
    assert [r.id for r in rows[:200]] == list(range(200))
    assert rows[7].name == "n7" and rows[7].tags == ["a", "7"]
    assert rows[7].at.isoformat().startswith("2024-05-01T12:00")
    assert rows[200].id is None and rows[200].name is None          # not JSON
    assert rows[201].id is None and rows[201].name == "5"           # wrong type: null; number as text
    # without the timestamp column every column type is one the bulk path (one Arrow parse) takes: the
    # same values as the per-record path above
    bulk = load(spark, data_dir, "json", decode="json", schema="id bigint, name string, tags array<string>") \
        .orderBy("offset").collect()
    assert [(r.id, r.name, r.tags) for r in bulk] == [(r.id, r.name, r.tags) for r in rows]


def test_decode_json_and_bson_read_records_of_every_protocol(spark, data_dir):
    for decode, extra in (("json", "base64 string"), ("bson", "data binary")):
        rows = load(spark, data_dir, "mixed", decode=decode, schema=f"id bigint, name string, {extra}") \
            .orderBy("offset").collect()
        assert [r.id for r in rows] == [0, 1, 2, 3, 4, 5, None]
        assert [r.name for r in rows[:6]] == ["raw-json", "ws", "rstream", "bson", "raw-bson", "zmq"]
        assert rows[6][extra.split()[0]] in ("AQID", bytearray(b"\x01\x02\x03"))


def test_bad_options_are_reported(spark, data_dir):
    from pyspark.errors import PySparkException
    with pytest.raises(PySparkException, match="does not exist"):
        load(spark, data_dir, "nope").count()
    with pytest.raises(PySparkException, match="needs option"):
        load(spark, data_dir, "json", decode="json").count()


# ------------------------------------------------------------------------------------------ remote

@pytest.fixture(scope="module")
def broker(data_dir):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
    from procs import ServerProcess     # the integration suite's helper: `riverbed serve` on port 0
    srv = ServerProcess(data_dir).start()
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.mark.integration
def test_remote_read_matches_the_engine(spark, broker, data_dir, scans):
    uri = f"rabbitmq-stream://guest:guest@127.0.0.1:{broker.port}"
    df = spark.read.format("riverbed").option("uri", uri).option("stream", "events,ss") \
        .option("numPartitions", "3").load()
    rows = df.selectExpr("stream", "partition", "offset", "crc32(body) AS c").groupBy("stream", "partition") \
        .agg({"*": "count", "offset": "sum", "c": "sum"}).collect()
    assert sorted(r.stream for r in rows) == ["events", "ss-0", "ss-1", "ss-2"]
    for r in rows:
        recs = scans[r.stream]
        assert (r["count(1)"], r["sum(offset)"], r["sum(c)"]) == (
            len(recs), sum(o for o, _ in recs), sum(zlib.crc32(b) for _, b in recs))
    sub = spark.read.format("riverbed").option("uri", uri).option("stream", "orders") \
        .option("startingOffset", "1500").option("endingOffset", "4321").load()
    assert offsets(sub) == list(range(1500, 4321))
    # the same directory read from disk while the broker has it open
    assert load(spark, data_dir, "events").count() == 40_000


# --------------------------------------------------------------------------------------- streaming

@pytest.mark.slow
def test_streaming_exactly_once_across_a_restart(spark, tmp_path):
    data = str(tmp_path / "data")
    out = tmp_path / "out"
    checkpoint = str(tmp_path / "checkpoint")
    eng = Engine(data, fsync="never")
    try:
        for s in ("a", "b"):
            eng.create_stream(s).result()
        written = {"a": 0, "b": 0}

        def write(n):
            for s in ("a", "b"):
                eng.append(s, [b"%s-%d" % (s.encode(), written[s] + i) for i in range(n)]).result()
                written[s] += n

        def sink(batch_df, batch_id):
            # idempotent per batch id: a batch replayed after a restart overwrites its own output
            batch_df.select("stream", "offset", "body").write.mode("overwrite").parquet(str(out / f"b={batch_id}"))

        def start(**trigger):
            src = spark.readStream.format("riverbed").option("path", data).option("stream", "a,b") \
                .option("maxRecordsPerTrigger", "3000").load()
            return src.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint) \
                .trigger(**trigger).start()

        write(2000)
        q = start(processingTime="200 milliseconds")
        try:
            for _ in range(5):          # records arrive while the query runs
                write(1000)
                time.sleep(0.3)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                p = q.lastProgress
                if p and p["sources"] and all(
                        json.loads(p["sources"][0]["endOffset"] or "{}").get(s) == written[s] for s in written):
                    break
                time.sleep(0.2)
            else:
                pytest.fail(f"query did not catch up: {q.lastProgress}")
        finally:
            q.stop()
        write(1500)                     # arrives while no query runs
        q2 = start(availableNow=True)
        q2.awaitTermination(120)
        assert q2.exception() is None
    finally:
        eng.close()
    got = spark.read.parquet(str(out)).groupBy("stream").agg(
        {"*": "count", "offset": "max"}).collect()
    dup = spark.read.parquet(str(out)).groupBy("stream", "offset").count().filter("count > 1").count()
    assert dup == 0
    assert sorted((r.stream, r["count(1)"], r["max(offset)"]) for r in got) == [
        ("a", written["a"], written["a"] - 1), ("b", written["b"], written["b"] - 1)]
    bodies = spark.read.parquet(str(out)).filter("stream = 'a' AND offset = 4242").collect()
    assert bytes(bodies[0].body) == b"a-4242"


# --------------------------------------------------------------------------------------- spark-load

def test_spark_load_to_parquet(spark, data_dir, tmp_path, scans, capsys):
    from riverbed.spark import load as spark_load
    out = str(tmp_path / "orders.parquet")
    code = spark_load.main(["orders,timed", "--path", data_dir, "--to", "parquet", "--output", out,
                            "--partition-by", "stream", "--starting-offset", "100"])
    assert code == 0, capsys.readouterr().err
    assert "loaded 60,300 records into parquet" in capsys.readouterr().err
    back = spark.read.parquet(out)
    assert back.count() == 60_300
    assert back.filter("stream = 'orders'").selectExpr("min(offset)").first()[0] == 100
    assert spark_load.main(["orders", "--path", data_dir, "--to", "parquet", "--output", out]) == 1   # exists
    assert spark_load.main(["orders", "--path", data_dir, "--to", "table"]) == 2
    assert spark_load.main(["nope", "--path", data_dir, "--to", "parquet", "--output", out + "2"]) == 2


def test_spark_load_is_a_riverbed_command():
    import subprocess
    r = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "spark-load", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--to {parquet,delta,table}" in r.stdout

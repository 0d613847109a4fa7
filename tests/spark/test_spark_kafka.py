"""The ``riverbed`` Spark data source reads what the Kafka shell stores: a topic of three partitions (a
super stream) of Kafka records (AMQP messages: the value as data, headers as application properties, the
key as the ``x-key`` annotation, the timestamp as creation-time), decoded as AMQP and as JSON."""

import json

import pytest

from riverbed.engine import Engine
from riverbed.shells.kafka.records import to_stored

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def kafka_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("spark-kafka") / "data"
    with Engine(path, fsync="never") as eng:
        eng.create_super_stream("topic", ["topic-0", "topic-1", "topic-2"], ["0", "1", "2"]).result()
        for p in range(3):
            eng.append(f"topic-{p}", [to_stored(b"k%d" % i, json.dumps({"id": i, "p": p}).encode(),
                                                [("h", b"v%d" % i)], 1_700_000_000_000 + i)
                                      for i in range(100)]).result()
    return str(path)


def load(spark, path, **options):
    r = spark.read.format("riverbed").option("path", path).option("stream", "topic")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_spark_reads_a_kafka_topic_as_amqp_and_json(spark, kafka_dir):
    rows = load(spark, kafka_dir, decode="amqp").orderBy("partition", "offset").collect()
    assert len(rows) == 300 and {r.partition for r in rows} == {0, 1, 2}
    assert json.loads(bytes(rows[0].body)) == {"id": 0, "p": 0} and rows[0].properties == {"h": "v0"}
    got = load(spark, kafka_dir, decode="json", schema="id bigint, p int").groupBy("p").count().collect()
    assert sorted((r.p, r["count"]) for r in got) == [(0, 100), (1, 100), (2, 100)]

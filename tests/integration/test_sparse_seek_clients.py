"""Seeking by time with real clients on a stream of one-message chunks, whose timestamp index is sparse
(an entry every 64 offsets, engine/sparse.py): rstream's TIMESTAMP offset specification and Kafka
ListOffsets by time (kafka-python ``offsets_for_times``) find the first message at or after the time,
not the indexed chunk after it."""

import asyncio
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from procs import fresh  # noqa: E402
from test_rmq_rstream import CREDS, body, check, consume, run  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

KAFKA_SERVER_ARGS = ()


def test_rstream_timestamp_offset_spec_between_two_index_entries(kafka_server):
    from rstream import ConsumerOffsetSpecification, OffsetType, Producer
    port = kafka_server.port

    async def scenario():
        async with Producer("127.0.0.1", port, **CREDS) as p:
            await p.create_stream("sparse-ts")
            for i in range(100):                    # one message a chunk: offsets 0..99
                await p.send_wait("sparse-ts", body(i))
            await asyncio.sleep(0.05)
            ts = int(time.time() * 1000)
            await asyncio.sleep(0.05)
            for i in range(100, 200):               # index entries at 0, 64, 128, 192: 100 lies between
                await p.send_wait("sparse-ts", body(i))
        check(await consume(port, "sparse-ts", ConsumerOffsetSpecification(OffsetType.TIMESTAMP, ts), 100),
              range(100, 200))
    run(scenario())


def test_kafka_offsets_for_times_between_two_index_entries(bootstrap):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    topic = fresh("sparse")
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, linger_ms=0)
    for i in range(100):
        p.send(topic, value=b"v%d" % i).get(10)     # one record a produce request: one chunk each
    time.sleep(0.05)
    mid = int(time.time() * 1000)
    time.sleep(0.05)
    for i in range(100, 200):
        p.send(topic, value=b"v%d" % i).get(10)
    p.close()
    tp = TopicPartition(topic, 0)
    c = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=3000, enable_auto_commit=False)
    try:
        c.assign([tp])
        found = c.offsets_for_times({tp: mid})[tp]
        assert found.offset == 100 and found.timestamp >= mid
        c.seek(tp, found.offset)
        assert next(iter(c)).value == b"v100"
    finally:
        c.close()

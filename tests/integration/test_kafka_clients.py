"""The Kafka listener with real clients, unchanged: confluent-kafka (librdkafka), kafka-python and
aiokafka produce and consume on the one log (no consumer group yet: assigned partitions), every
compression, seek by timestamp, long polling; records cross to and from RabbitMQ Stream (rstream) with
keys and headers kept; bad input closes one connection and harms no other."""

import asyncio
import os
import socket
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from procs import fresh  # noqa: E402

from riverbed.shells.kafka import codec as C  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

# conftest.kafka_server starts the other protocols too
KAFKA_SERVER_ARGS = ("--ream-port", "0", "--ws-port", "0", "--bson-port", "0", "--zmq-port", "0")


@pytest.fixture(scope="module")
def srv(kafka_server):
    return kafka_server


def create_topic(bootstrap, name, partitions):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)


def consume_assigned(bootstrap, topic, partitions, expect, timeout=30):
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.time() + timeout
    while len(got) < expect and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append(m)
    c.close()
    return got


def test_confluent_kafka_keyed_records_on_three_partitions(srv, bootstrap):
    from confluent_kafka import Producer
    topic = fresh()
    create_topic(bootstrap, topic, 3)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    n = 3000
    for i in range(n):
        p.produce(topic, key=b"key-%d" % (i % 50), value=b"value-%d" % i, headers=[("i", b"%d" % i)])
    assert p.flush(30) == 0
    got = consume_assigned(bootstrap, topic, 3, n)
    assert sorted(int(m.value()[6:]) for m in got) == list(range(n))     # every record once
    by_key = {}
    for m in got:
        by_key.setdefault(m.key(), set()).add(m.partition())
        assert m.headers() == [("i", m.value()[6:])]
    assert all(len(parts) == 1 for parts in by_key.values())           # the client's partitioner held
    assert len({m.partition() for m in got}) == 3
    # offsets are the log's: partition i of topic T is the stream T-i
    per_part = {}
    for m in got:
        per_part.setdefault(m.partition(), []).append(m.offset())
    assert all(offs == list(range(len(offs))) for offs in per_part.values())


@pytest.mark.parametrize("compression", ["gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_every_compression(bootstrap, compression):
    from confluent_kafka import Producer
    topic = fresh(compression)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "compression.type": compression,
                  "linger.ms": 20})
    for i in range(500):
        p.produce(topic, value=b"%d:" % i + b"x" * 200)
    assert p.flush(30) == 0
    got = consume_assigned(bootstrap, topic, 1, 500)
    assert [m.value().split(b":")[0] for m in got] == [b"%d" % i for i in range(500)]


def test_kafka_python_produce_consume_and_seek_by_timestamp(bootstrap):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    topic = fresh()
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, compression_type="gzip")
    base = int(time.time() * 1000) - 100_000
    for i in range(100):
        p.send(topic, key=b"k", value=b"v%d" % i, timestamp_ms=base + i * 1000)
    p.flush(30)
    p.close()
    tp = TopicPartition(topic, 0)
    c = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=3000, enable_auto_commit=False)
    c.assign([tp])
    c.seek_to_beginning(tp)
    got = list(c)
    assert [m.value for m in got] == [b"v%d" % i for i in range(100)]
    assert got[7].timestamp == base + 7000 and got[7].offset == 7
    found = c.offsets_for_times({tp: base + 41_500})[tp]
    assert (found.offset, found.timestamp) == (42, base + 42_000)
    c.seek(tp, found.offset)
    assert next(iter(c)).value == b"v42"
    c.close()


def test_aiokafka_produce_consume_and_long_polling(bootstrap):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    topic = fresh()

    async def main():
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type="lz4")
        await p.start()
        for i in range(200):
            await p.send(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("h", b"x")])
        await p.flush()
        tp = TopicPartition(topic, 0)
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=1000)
        await c.start()
        c.assign([tp])
        await c.seek_to_beginning(tp)
        got = []
        while len(got) < 200:
            batch = await c.getmany(tp, timeout_ms=5000)
            assert batch, "no records"
            got += batch[tp]
        assert [(m.key, m.value, list(m.headers)) for m in got[:2]] == [(b"k0", b"v0", [("h", b"x")]),
                                                                       (b"k1", b"v1", [("h", b"x")])]
        # an empty Fetch waits (fetch_max_wait_ms) and is answered early when a record arrives
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        waiter = asyncio.ensure_future(c.getone(tp))
        await asyncio.sleep(0.3)
        await p.send_and_wait(topic, b"wake")
        msg = await asyncio.wait_for(waiter, 5)
        assert msg.value == b"wake" and loop.time() - t0 < 1.0
        await c.stop()
        await p.stop()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_rstream_record_read_by_kafka_and_kafka_record_read_by_rstream(srv, bootstrap):
    from confluent_kafka import Producer
    from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Properties
    from rstream import Producer as RProducer

    from riverbed.engine.record import decode_record
    from riverbed.shells.kafka.records import from_stored
    topic = fresh("x")
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    p.produce(topic, key=b"kk", value=b'{"from":"kafka"}', headers=[("who", b"kafka")])
    assert p.flush(15) == 0

    async def main():
        async with RProducer("127.0.0.1", srv.port, username="guest", password="guest") as rp:
            await rp.send_wait(topic, AMQPMessage(body=b"from rstream", application_properties={"who": "rstream"},
                                                  properties=Properties(content_type="text/plain")))
            await rp.send_wait(topic, b"raw bytes")
        got = []
        done = asyncio.Event()

        async def on_message(msg, ctx):
            got.append((ctx.offset, bytes(msg)))
            if len(got) == 3:
                done.set()
        consumer = Consumer("127.0.0.1", srv.port, username="guest", password="guest")
        await consumer.start()
        await consumer.subscribe(topic, on_message, decoder=None,
                                 offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        await asyncio.wait_for(done.wait(), 15)
        await consumer.close()
        return got
    got = asyncio.run(asyncio.wait_for(main(), 60))
    offset, raw = got[0]
    rec = decode_record(raw)
    assert offset == 0 and rec.amqp and rec.payload == b'{"from":"kafka"}' and rec.kind == "json"
    assert rec.app_properties == {"who": "kafka"}
    assert from_stored(raw, 0)[1] == b"kk"          # the key, as the message annotation x-key

    msgs = consume_assigned(bootstrap, topic, 1, 3)
    assert [(m.offset(), m.key(), m.value(), m.headers()) for m in msgs] == [
        (0, b"kk", b'{"from":"kafka"}', [("who", b"kafka")]),
        (1, None, b"from rstream", [("who", b"rstream")]),
        (2, None, b"raw bytes", None)]


def test_ream_json_event_read_by_kafka_and_kafka_json_read_by_ream(srv, bootstrap):
    from confluent_kafka import Producer
    topic = fresh("ream")
    sock = socket.create_connection(("127.0.0.1", srv.ports["ream"]), timeout=10)
    f = sock.makefile("rb")
    f.readline()                                          # the banner
    event = b'{"from":"ream","n":1}'
    sock.sendall(b"EVENT PUBLISH %s %d\n%s\n" % (topic.encode(), len(event), event))
    assert f.readline().startswith(b"EVENT PUBLISHED")
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    p.produce(topic, key=b"kk", value=b'{"from":"kafka"}', headers=[("h", b"v")])
    assert p.flush(15) == 0
    (first, second) = consume_assigned(bootstrap, topic, 1, 2)
    assert (first.key(), first.value()) == (None, event)            # JSON as its text
    assert first.timestamp()[1] > 0
    # the Kafka record is JSON to REAM (its value sniffed as a JSON object)
    sock.sendall(b"EVENT SUBSCRIBE %s 1\n" % topic.encode())
    assert f.readline().startswith(b"EVENT SUBSCRIBED")
    got = []
    while len(got) < 2:
        line = f.readline().split()
        got.append(f.read(int(line[-1]) + 1)[:-1])
    assert got == [event, b'{"from":"kafka"}']
    sock.close()


def test_websocket_publish_with_pkey_read_by_kafka_and_kafka_record_over_websocket(srv, bootstrap):
    import json

    import aiohttp
    from confluent_kafka import Producer
    topic = fresh("ws")

    async def go():
        async with aiohttp.ClientSession() as s:
            ws = await s.ws_connect(f"http://127.0.0.1:{srv.ports['ws']}/api/v1/ws")
            await ws.send_str(json.dumps({"type": "subscribe", "stream": topic}))     # live from here on
            assert json.loads((await ws.receive(timeout=5)).data)[1] == 2
            await ws.send_str(json.dumps({"type": "publish", "stream": topic, "msg": '{"temp": 21.5}',
                                          "ts": 1533924184016, "pkey": "dev-7"}))
            first = json.loads((await ws.receive(timeout=5)).data)[3]
            p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
            p.produce(topic, key=b"k", value=b'{"from": "kafka"}', timestamp=1600000000000)
            assert p.flush(15) == 0
            second = json.loads((await ws.receive(timeout=5)).data)[3]
            await ws.close()
            return first, second
    first, second = asyncio.run(asyncio.wait_for(go(), 30))
    assert first[8] == '{"temp": 21.5}'
    assert (second[8], second[3]) == ('{"from": "kafka"}', 1600000000000)    # JSON, with its creation time
    (m,) = consume_assigned(bootstrap, topic, 1, 2)[:1]
    assert (m.key(), m.value(), m.headers(), m.timestamp()[1]) == (b"dev-7", b'{"temp": 21.5}', [("pkey", b"dev-7")],
                                                                   1533924184016)


def test_bson_event_read_by_kafka_as_its_bytes_and_kafka_json_read_by_bson(srv, bootstrap):
    import bson

    from confluent_kafka import Producer

    from riverbed.shells.bson_tcp.client import BsonClient
    topic = fresh("bson")

    async def go():
        async with await BsonClient.connect("127.0.0.1", srv.ports["bson"]) as cl:
            await cl.publish(topic, {"from": "bson", "n": 1})
            p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
            p.produce(topic, value=b'{"from": "kafka", "n": 2}')
            assert p.flush(15) == 0
            sub = await cl.subscribe(topic, start_pos=0)
            return [(await sub.get(timeout=10)).event for _ in range(2)]
    events = asyncio.run(asyncio.wait_for(go(), 30))
    assert [{k: v for k, v in e.items() if k != "_id"} for e in events] == [{"from": "bson", "n": 1},
                                                                             {"from": "kafka", "n": 2}]
    first = consume_assigned(bootstrap, topic, 1, 2)[0]
    assert bson.decode(first.value()) == {"from": "bson", "n": 1}          # BSON as its bytes


def test_zeromq_put_with_headers_read_by_kafka_and_kafka_record_over_zeromq(srv, bootstrap):
    import zmq

    from confluent_kafka import Producer
    topic = fresh("zmq")
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(f"tcp://127.0.0.1:{srv.ports['zmq']}")

        def call(*frames):
            sock.send_multipart([b""] + [f if isinstance(f, bytes) else f.encode() for f in frames])
            assert sock.poll(10000)
            return sock.recv_multipart()[1:]
        assert call("PUT", "TOPIC", topic, "X-REPLY-TO", "node1", "ID", "p", "", "hello zmq")[0] == b"OK"
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        p.produce(topic, key=b"k", value=b"from kafka", headers=[("X-TRACE", b"t1")])
        assert p.flush(15) == 0
        assert call("SUB", "ID", "s", "X-OFFSET", "0", "", topic)[0] == b"OK"
        msgs = []
        while len(msgs) < 2:
            assert sock.poll(10000)
            msgs.append(sock.recv_multipart()[1:])
        assert msgs[1][-1] == b"from kafka" and msgs[1][msgs[1].index(b"X-TRACE") + 1] == b"t1"
    finally:
        ctx.destroy(linger=0)
    first = consume_assigned(bootstrap, topic, 1, 2)[0]
    assert (first.value(), first.headers()) == (b"hello zmq", [("X-REPLY-TO", b"node1")])


# ------------------------------------------------------------------------------------------ bad input

def raw_call(sock, frame, api_key, version):
    sock.sendall(frame)
    head = _exact(sock, 4)
    body = _exact(sock, int.from_bytes(head, "big"))
    return C.decode_response(api_key, version, body)


def _exact(sock, n):
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise ConnectionError("closed")
        buf += part
    return buf


def closed(sock):
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionError:
        return True


def test_bad_input_closes_one_connection_only(srv, bootstrap):
    topic = fresh("bad")
    port = srv.ports["kafka"]
    good = socket.create_connection(("127.0.0.1", port), timeout=10)
    md = {"topics": [{"name": topic}], "allow_auto_topic_creation": True}
    assert raw_call(good, C.encode_request(C.API_METADATA, 9, 1, "g", md), C.API_METADATA, 9)[1]["topics"][0][
        "error_code"] == 0
    # a batch with a wrong CRC: CORRUPT_MESSAGE, nothing stored, the connection stays
    bad = bytearray(C.encode_batch(0, [(1, None, b"never stored", [])]))
    bad[-3] ^= 1
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": bytes(bad)}]}]}
    res = raw_call(good, C.encode_request(C.API_PRODUCE, 9, 2, "g", body), C.API_PRODUCE, 9)[1]
    assert res["responses"][0]["partition_responses"][0]["error_code"] == C.ERR_CORRUPT_MESSAGE
    lo = {"replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
        {"partition_index": 0, "timestamp": -1}]}]}
    res = raw_call(good, C.encode_request(C.API_LIST_OFFSETS, 6, 3, "g", lo), C.API_LIST_OFFSETS, 6)[1]
    assert res["topics"][0]["partitions"][0]["offset"] == 0
    # an unknown API key, an unsupported version, a truncated header, an oversized frame: each closes its own
    frames = [b"\x00\x00\x00\x08" + C._HEAD.pack(4242, 0, 1),
              C.encode_request(C.API_FETCH, 13, 1, "x", {"topics": [], "forgotten_topics_data": []}),
              b"\x00\x00\x00\x03\x00\x01\x02",
              b"\x7f\xff\xff\xff" + b"\x00" * 100]
    for frame in frames:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(frame)
        assert closed(s), frame[:12]
        s.close()
    res = raw_call(good, C.encode_request(C.API_LIST_OFFSETS, 6, 4, "g", lo), C.API_LIST_OFFSETS, 6)[1]
    assert res["topics"][0]["partitions"][0]["error_code"] == 0
    good.close()

"""Kafka topic administration and idempotent producers with real clients: DescribeConfigs (retention as
configs), CreatePartitions, DeleteTopics (a Fetch of the deleted topic is an error, never a crash),
idempotent producers of all three clients, and kill -9 of the server during an acks=all idempotent
produce: nothing acknowledged is lost, nothing is stored twice."""

import asyncio
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from procs import ServerProcess, fresh  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def read_all(bootstrap, topic, partitions, expect, timeout=30):
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=3000, enable_auto_commit=False)
    c.assign([TopicPartition(topic, p) for p in range(partitions)])
    c.seek_to_beginning()
    got = []
    deadline = time.time() + timeout
    while len(got) < expect and time.time() < deadline:
        got += list(c)
    c.close()
    return got


def test_describe_configs_create_partitions_delete_topics(bootstrap):
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic
    topic = fresh("adm")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"retention.ms": "7200000",
                                                        "retention.bytes": "100000000"})])[topic].result(15)
    (configs,) = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    values = {n: c.value for n, c in configs.result(15).items()}
    assert values["retention.ms"] == "7200000" and values["retention.bytes"] == "100000000"
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    p.produce(topic, value=b"before")
    assert p.flush(15) == 0
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(15)
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 3
    with pytest.raises(KafkaException):
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(15)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})     # a new client sees 3 partitions at once
    for i in range(30):
        p.produce(topic, key=b"k%d" % i, value=b"after")
    assert p.flush(15) == 0
    got = read_all(bootstrap, topic, 3, 31)
    assert sorted(m.value for m in got) == [b"after"] * 30 + [b"before"]
    assert {m.partition for m in got} == {0, 1, 2}
    admin.delete_topics([topic])[topic].result(15)
    assert topic not in admin.list_topics(timeout=10).topics
    # a consumer of the deleted topic gets a Kafka error, and the server goes on
    from riverbed.shells.kafka import codec as C
    import socket
    s = socket.create_connection(bootstrap.split(":"), timeout=10)
    body = {"max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0, "topics": [
        {"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": []}
    s.sendall(C.encode_request(C.API_FETCH, 12, 1, "t", body))
    head = s.recv(4)
    data = b""
    while len(data) < int.from_bytes(head, "big"):
        data += s.recv(65536)
    _, res = C.decode_response(C.API_FETCH, 12, data)
    assert res["responses"][0]["partitions"][0]["error_code"] == C.ERR_UNKNOWN_TOPIC_OR_PARTITION
    s.close()


def test_idempotent_producers_of_every_client(bootstrap):
    from aiokafka import AIOKafkaProducer
    from confluent_kafka import Producer
    from kafka import KafkaProducer
    topic = fresh("idem")
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    for i in range(2000):
        p.produce(topic, key=b"k%d" % (i % 10), value=b"c%d" % i)
    assert p.flush(30) == 0
    kp = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    futures = [kp.send(topic, value=b"p%d" % i) for i in range(200)]
    kp.flush(30)
    assert [f.get(5).offset for f in futures] == list(range(2000, 2200))
    kp.close()

    async def aio():
        ap = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await ap.start()
        md = await ap.send_and_wait(topic, b"a0")
        await ap.stop()
        return md.offset
    assert asyncio.run(aio()) == 2200
    got = read_all(bootstrap, topic, 1, 2201)
    assert len(got) == 2201 and len({m.value for m in got}) == 2201


PRODUCER = """
import sys
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "acks": "all", "enable.idempotence": True, "linger.ms": 2,
              "message.timeout.ms": 60000, "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200})
def acked(err, msg):
    if err is None:
        print(msg.value().decode(), flush=True)
for i in range(int(sys.argv[3])):
    while True:
        try:
            p.produce(sys.argv[2], value=b"%d" % i, on_delivery=acked)
            break
        except BufferError:
            p.poll(0.05)
    p.poll(0)
p.flush(90)
print("done", flush=True)
"""


def test_kill_9_during_idempotent_produce_loses_nothing_acknowledged_doubles_nothing(tmp_path):
    data = tmp_path / "data"
    first = ServerProcess(data, "--kafka-port", "0").start()
    port = first.ports["kafka"]
    bootstrap = f"127.0.0.1:{port}"
    topic = fresh("crash")
    n = 20000
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, bootstrap, topic, str(n)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    acked = []
    second = None
    try:
        while len(acked) < 2000:
            line = producer.stdout.readline()
            assert line, "the producer stopped early"
            acked.append(line.strip())
        first.kill()                                  # kill -9 with batches in flight
        second = ServerProcess(data, "--kafka-port", str(port)).start()
        for line in producer.stdout:
            acked.append(line.strip())
        assert producer.wait(120) == 0
        assert acked[-1] == "done"
        acked = acked[:-1]
        got = [int(m.value) for m in read_all(bootstrap, topic, 1, n, timeout=60)]
        assert len(got) == len(set(got)), "a record was stored twice"
        assert set(int(a) for a in acked) <= set(got), "an acknowledged record was lost"
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait()
        first.kill()
        if second is not None:
            assert second.stop() == 0, second.log()

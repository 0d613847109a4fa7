"""Kafka workloads of ``bench.compare``, against Riverbed's Kafka shell: confluent-kafka (librdkafka).

librdkafka is a native client: it batches, compresses (not here) and parses on its own threads, so these
rows measure the broker rather than the client, and they run on the very log the RabbitMQ Stream rows
use. Only Riverbed runs them (RabbitMQ does not speak Kafka); Redis and NATS show their publish and
consume rows beside them (``bench._workloads.PEER_MAP``), and the report sets their server CPU per record
beside the RabbitMQ Stream shell's on the same server (``SAME_LOG``).

Run by ``bench._client`` (same READY/GO handshake, CPU snapshots and RESULT line as every workload); the
topic is ``--stream`` with one partition (so it is that stream), created untimed and deleted at the end.

- ``kafka-produce``: one Producer, ``acks=all``, idempotent (the engine's publisher sequences), no key,
  ``--size``-byte values, batches of 5,000 records (``batch.num.messages``, ``linger.ms`` 20) as the
  RabbitMQ Stream rows send, enqueued by ``produce_batch`` (10,000 a call); the timed window
  runs from the first enqueue to the end of ``flush`` (every record acknowledged).
- ``kafka-consume``: the topic filled first (untimed, the same producer), then one Consumer assigned the
  partition from offset 0 reads until it has every record.
"""

import time

WORKLOADS = ("kafka-produce", "kafka-consume")
# Produce batches of up to BATCH_RECORDS, the RabbitMQ Stream rows' size (send_batch 5k), so both rows cost
# the broker about the same requests per record: librdkafka fills one within LINGER_MS from 250k records/s
# on (with linger 5 ms a run slowed by a loaded machine sent batches of a few hundred)
LINGER_MS = 20
BATCH_RECORDS = 5_000
MAX_BATCH_BYTES = 1 << 20
CONSUME_BATCH = 10_000
# The consumer's fetching, shared with the native row (bench._kafka_native) so that the two differ only by
# the binding. librdkafka fetches while its queue for the partition holds fewer than queued.min.messages
# records and queued.max.messages.kbytes; past either it waits fetch.queue.backoff.ms (default 1 s)
# before fetching again, however fast the application drains the queue
CONSUME_CONF = {"fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20, "fetch.wait.max.ms": 100,
                "fetch.queue.backoff.ms": 1}
PRODUCE_BATCH = 10_000
QUEUE_MESSAGES = 1_000_000


def _producer(a):
    from confluent_kafka import Producer
    return Producer({"bootstrap.servers": f"{a.host}:{a.port}", "acks": "all", "enable.idempotence": True,
                     "linger.ms": LINGER_MS, "batch.size": MAX_BATCH_BYTES, "batch.num.messages": BATCH_RECORDS,
                     "queue.buffering.max.messages": QUEUE_MESSAGES, "queue.buffering.max.kbytes": 1 << 20})


def _produce(p, topic, n, value):
    # produce_batch: librdkafka's batch enqueue, one call per PRODUCE_BATCH records, so the Python loop
    # costs nothing per record and the row measures the broker (and librdkafka), not the interpreter
    one = {"value": value}
    full = [one] * PRODUCE_BATCH
    room = QUEUE_MESSAGES - PRODUCE_BATCH
    sent = 0
    while sent < n:
        k = min(PRODUCE_BATCH, n - sent)
        while len(p) > room:         # the client's queue is full: let it send first
            p.poll(0.005)
        queued = p.produce_batch(topic, full if k == PRODUCE_BATCH else [one] * k)
        for _ in range(k - queued):  # refused ones (queue full after all): one by one
            while True:
                try:
                    p.produce(topic, value)
                    break
                except BufferError:
                    p.poll(0.005)
        sent += k
        p.poll(0)
    left = p.flush(600)
    if left:
        raise RuntimeError(f"{left} records not acknowledged")


def _count(msgs):
    """(records, value bytes) of a ``consume`` list, errors left out: C-level maps, no Python per record
    unless some message is an error."""
    from confluent_kafka import Message
    if any(map(Message.error, msgs)):
        ok = [m for m in msgs if m.error() is None]
        return len(ok), sum(len(m.value() or b"") for m in ok)
    return len(msgs), sum(map(len, msgs))        # a Message's len is its value's


def _admin(a):
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": f"{a.host}:{a.port}"})


async def run(runner):
    """Run ``runner.a.workload`` (kafka-produce or kafka-consume) against the Kafka listener at
    ``--host``/``--port``; the topic is ``--stream``, one partition, deleted at the end."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import NewTopic
    a = runner.a
    topic = a.stream
    admin = _admin(a)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
    p = _producer(a)
    try:
        # one untimed record: metadata, the connection and InitProducerId are behind us before GO
        _produce(p, topic, 1, runner.body)
        if a.workload == "kafka-produce":
            runner.wait_go()
            runner.start()
            _produce(p, topic, a.n, runner.body)
            runner.stop()
        elif a.workload == "kafka-consume":
            _produce(p, topic, a.n - 1, runner.body)
            c = Consumer({"bootstrap.servers": f"{a.host}:{a.port}", "group.id": f"bench-{topic}",
                          "enable.auto.commit": False, **CONSUME_CONF})
            try:
                runner.wait_go()
                runner.start()
                c.assign([TopicPartition(topic, 0, 0)])
                got = nbytes = 0
                deadline = time.monotonic() + 600
                while got < a.n:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"consumed {got} of {a.n} records")
                    # no more than are left: consume waits for as many as it is asked (or the timeout)
                    k, b = _count(c.consume(min(CONSUME_BATCH, a.n - got), 1.0))
                    got += k
                    nbytes += b
                runner.stop()
                runner.result["received"] = got
                runner.result["received_bytes"] = nbytes
            finally:
                c.close()
        else:
            raise ValueError(f"not a Kafka workload: {a.workload}")
    finally:
        del p
        if not a.keep_stream:
            admin.delete_topics([topic])[topic].result(60)

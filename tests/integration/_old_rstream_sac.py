"""rstream 0.20.x's own single-active-consumer super stream tests (issue 19, item 5), run as

    <old venv python> _old_rstream_sac.py PORT 'JSON ARGS'

with the python of ci/rstream-old.sh's venv. It does what rstream 0.20's
``test_consume_superstream_with_sac_all_active`` / ``..._one_non_active`` /
``test_consume_superstream_with_callback_first|next|offset`` do, in the same order with the same
objects: a super stream of three partitions (binding keys key1..key3), N SuperStreamConsumers that each
subscribe with ``single-active-consumer``, ``name`` and ``super-stream`` (rstream's ``run_consumer``),
one SuperStreamProducer hashing ``message_id``, 10,000 ``send()`` calls, then ``sleep(1)``.

The client is driven unchanged; two of its functions are wrapped only to take timestamps:

* the moment each Publish frame is encoded and handed to the socket (``encode_publish``), with the
  publishing ids it carries and the partition of its publisher (from ``declare_publisher``): the earliest
  moment any broker can have those messages;
* the moment each message reaches its consumer's callback (the callback itself).

So the result separates the broker's part (write of the Publish frame -> callback) from the client's
own (``send()`` only buffers; a 0.5 s timer flushes the buffers, one partition after another, encoding
every message on the event loop). Printed as one JSON line; ``{"error": ...}`` if the scenario broke.
"""

import asyncio
import json
import resource
import sys
import time
import traceback
from collections import defaultdict

import rstream
import rstream.client as rclient
import rstream.connection as rconnection
from rstream import (
    AMQPMessage, OffsetSpecification, OffsetType, Properties, RouteType, SuperStreamConsumer, SuperStreamProducer,
    amqp_decoder,
)

HOST = "127.0.0.1"
CREDS = dict(username="guest", password="guest")
FRAME_MAX = 1024 * 1024

# ------------------------------------------------------------------------------------ timestamps

_encoded_at = [0.0]
_publisher_stream = {}        # (id(client), publisher id) -> partition
_publish_writes = []          # (monotonic time, partition, [publishing ids])
_round_trips = []             # (start, end, request frame name or "new connection"): waits on the broker


def _instrument():
    encode_publish = rconnection.encode_publish

    def timed_encode_publish(frame, version=1):
        data = encode_publish(frame, version)
        _encoded_at[0] = time.monotonic()     # the bytes go to the transport right after this
        return data
    rconnection.encode_publish = timed_encode_publish

    declare = rclient.Client.declare_publisher

    async def declare_publisher(self, stream, reference, publisher_id):
        _publisher_stream[(id(self), publisher_id)] = stream
        return await declare(self, stream, reference, publisher_id)
    rclient.Client.declare_publisher = declare_publisher

    send_publish_frame = rclient.BaseClient.send_publish_frame

    async def timed_send_publish_frame(self, frame, version=1):
        await send_publish_frame(self, frame, version)
        _publish_writes.append((_encoded_at[0], _publisher_stream.get((id(self), frame.publisher_id)),
                                [m.publishing_id for m in frame.messages]))
    rclient.BaseClient.send_publish_frame = timed_send_publish_frame

    sync_request = rclient.BaseClient.sync_request

    async def timed_sync_request(self, frame, resp_schema, raise_exception=True):
        t0 = time.monotonic()
        try:
            return await sync_request(self, frame, resp_schema, raise_exception=raise_exception)
        finally:
            _round_trips.append((t0, time.monotonic(), type(frame).__name__))
    rclient.BaseClient.sync_request = timed_sync_request

    new_client = rclient.ClientPool.new

    async def timed_new(self, *args, **kwargs):
        t0 = time.monotonic()
        try:
            return await new_client(self, *args, **kwargs)
        finally:
            _round_trips.append((t0, time.monotonic(), "new connection"))
    rclient.ClientPool.new = timed_new


def _run_queue_wait():
    """Seconds this process has spent runnable but not running (CPU contention), from schedstat."""
    try:
        with open("/proc/self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return -1.0


def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ------------------------------------------------------------------------------------ the scenario

async def _handler_first(is_active, ctx):
    return OffsetSpecification(OffsetType.FIRST, 0)


async def _handler_next(is_active, ctx):
    return OffsetSpecification(OffsetType.NEXT, 0)


LISTENERS = {"none": None, "first": _handler_first, "next": _handler_next}


async def sac_super_stream(port, super_stream, group, listener="none", consumers=3, n=10_000, host=HOST,
                           port_as_str=False):
    _instrument()
    if port_as_str:
        port = str(port)
    rclient.DEFAULT_REQUEST_TIMEOUT = 1          # as rstream's conftest sets it
    partitions = [f"{super_stream}-{k}" for k in range(3)]
    admin = rclient.Client(host, port, frame_max=FRAME_MAX, heartbeat=60)
    await admin.start()
    await admin.authenticate("/", **CREDS)
    await admin.create_super_stream(super_stream, partitions, ["key1", "key2", "key3"])
    counted = defaultdict(list)      # consumer index -> [(partition, offset, message id, monotonic time)]
    # off before the consumers close: closing one hands its partitions to the others, which then read
    # again from where their listener says (FIRST: the start), as on RabbitMQ; rstream's test counts
    # before its fixtures close too
    counting = [True]
    subscribed = []
    producer = SuperStreamProducer(host, port, **CREDS, frame_max=FRAME_MAX, heartbeat=60, routing=RouteType.Hash,
                                   routing_extractor=_message_id, super_stream=super_stream)
    try:
        for _ in range(consumers):
            c = SuperStreamConsumer(host, port, **CREDS, frame_max=FRAME_MAX, heartbeat=60, super_stream=super_stream)
            await c.start()
            subscribed.append(c)
        await producer.start()
        for i, c in enumerate(subscribed):
            await _run_consumer(c, i, group, super_stream, counted, counting, LISTENERS[listener])
        t_first_send = time.monotonic()
        for i in range(n):
            await producer.send(AMQPMessage(body=b"a:%d" % i, properties=Properties(message_id=str(i))))
        loop_end = time.monotonic()
        cpu0, rq0 = _cpu(), _run_queue_wait()
        await asyncio.sleep(1)
        at_1s = {i: len(v) for i, v in counted.items()}     # what rstream's test asserts on
        cpu1, rq1 = _cpu(), _run_queue_wait()
        deadline = time.monotonic() + 60
        while sum(len(v) for v in counted.values()) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)       # duplicates, if any, arrive meanwhile
    finally:
        counting[0] = False
        await _close_quietly(producer)
        for c in subscribed:
            await _close_quietly(c)
        try:
            await asyncio.wait_for(admin.delete_super_stream(super_stream), 10)
        finally:
            await _close_quietly(admin)
    return _report(n, partitions, counted, at_1s, t_first_send, loop_end, cpu1 - cpu0, rq1 - rq0)


async def _message_id(message):
    return str(message.properties.message_id)


async def _run_consumer(consumer, index, group, super_stream, counted, counting, listener):
    """rstream 0.20's tests/util.py run_consumer, recording what its callback sees."""
    properties = defaultdict(str)
    properties["single-active-consumer"] = "true"
    properties["name"] = group
    properties["super-stream"] = super_stream

    def callback(message, ctx):
        if counting[0]:
            counted[index].append((ctx.consumer.get_stream(ctx.subscriber_name), ctx.offset,
                                   str(message.properties.message_id), time.monotonic()))
    await consumer.subscribe(callback=callback, decoder=amqp_decoder, properties=properties,
                             consumer_update_listener=listener)


async def _close_quietly(obj, timeout=10):
    try:
        await asyncio.wait_for(obj.close(), timeout)
    except Exception:
        pass


def _union_length(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total, end = total + (b - a), b
        elif b > end:
            total, end = total + (b - end), b
    return total


def _report(n, partitions, counted, at_1s, t_first_send, loop_end, cpu_window, rq_window):
    # when the frame carrying (partition, publishing id) left the client; ids start at 1 on a fresh
    # partition (QueryPublisherSequence 0, then +1) so offset k is publishing id k + 1
    written = {}
    for t, part, ids in _publish_writes:
        for pid in ids:
            written.setdefault((part, pid), t)
    seen = defaultdict(int)
    latencies, unknown = [], 0
    by_consumer = {}
    for i, rows in counted.items():
        by_consumer[i] = sorted({p for p, _, _, _ in rows})
        for part, offset, mid, t in rows:
            seen[mid] += 1
            w = written.get((part, offset + 1))
            if w is None:
                unknown += 1
            else:
                latencies.append(t - w)
    latencies.sort()
    writes = [t for t, _, _ in _publish_writes]
    last_write_by_part = {}
    for t, part, _ in _publish_writes:
        last_write_by_part[part] = max(t, last_write_by_part.get(part, 0.0))
    last_counted = max((t for rows in counted.values() for *_, t in rows), default=None)
    return {
        "counted": {i: len(v) for i, v in counted.items()},
        "partitions_by_consumer": by_consumer,
        "unique": len(seen), "missing": n - len(seen), "duplicates": sum(v - 1 for v in seen.values()),
        "latency_max": latencies[-1] if latencies else None,
        "latency_p50": latencies[len(latencies) // 2] if latencies else None,
        "latency_unmatched": unknown,
        "counted_at_loop_end_plus_1s": at_1s,
        "send_loop_s": loop_end - t_first_send,
        "first_publish_write_after_loop_end": (min(writes) - loop_end) if writes else None,
        "first_publish_write_after_first_send": (min(writes) - t_first_send) if writes else None,
        "last_publish_write_after_loop_end": {p: t - loop_end for p, t in last_write_by_part.items()},
        "last_counted_after_last_write": (last_counted - max(writes)) if writes and last_counted else None,
        "client_cpu_s_in_the_1s": cpu_window,
        "client_run_queue_wait_s_in_the_1s": rq_window,
        "publish_frames": len(_publish_writes),
        # the flush: what the client waited for from the broker between the end of the send loop and its
        # last Publish frame (round trips overlap when nested: a new connection's handshake)
        "flush_round_trips": [(round(a - loop_end, 4), round(b - a, 4), name) for a, b, name in _round_trips
                              if writes and loop_end <= a <= max(writes)],
        "flush_broker_wait_s": _union_length([(a, b) for a, b, _ in _round_trips
                                              if writes and loop_end <= a <= max(writes)]),
        "partitions": partitions,
    }


def main():
    port, args = int(sys.argv[1]), json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")
    try:
        result = asyncio.run(asyncio.wait_for(sac_super_stream(port, **args), 240))
    except BaseException as e:  # report, don't crash: the test shows the reason
        result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    result["rstream_version"] = rstream.__version__
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

"""Scenarios of tests/integration/test_rmq_compat.py driven by the OLD rstream (0.20.x), run as

    <old venv python> _old_rstream_client.py SCENARIO PORT 'JSON ARGS'

with the python of ci/rstream-old.sh's venv (the project's .venv has rstream 1.1.1). Only rstream and the
standard library are used. Each scenario prints its result as one JSON line on stdout (the last line);
interactive ones print ``{"event": ...}`` lines before it. A scenario that breaks reports
``{"error": "..."}`` instead of a traceback, so the test can say what went wrong. Every wait is bounded.
"""

import asyncio
import json
import sys
import traceback
from functools import partial

import rstream
from rstream import (
    Consumer, ConsumerOffsetSpecification, OffsetSpecification, OffsetType, Producer, RouteType,
    SuperStreamConsumer, SuperStreamCreationOption, SuperStreamProducer,
)

HOST = "127.0.0.1"
CREDS = dict(username="guest", password="guest")


def emit(obj):
    print(json.dumps(obj), flush=True)


def stream_of(ctx):
    """The stream of a Deliver/ConsumerUpdate context: 0.20 names a subscriber
    ``<stream>_subscriber_<id>`` unless given a name."""
    return ctx.subscriber_name.rsplit("_subscriber_", 1)[0]


async def wait_until(pred, timeout, step=0.05):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(step)
    return True


async def publish_confirmed(producer, stream, bodies, timeout=20):
    """send_batch, then wait for every confirm; returns the number confirmed."""
    confirmed = []
    await producer.send_batch(stream, list(bodies), on_publish_confirm=confirmed.append)
    await wait_until(lambda: len(confirmed) >= len(bodies), timeout)
    return sum(1 for c in confirmed if c.is_confirmed)


def probe_epochs(consumer, epochs):
    """Record the chunk epoch of every Deliver the consumer handles (the callback never sees it)."""
    original = consumer._on_deliver

    async def on_deliver(frame, *args, **kwargs):
        epochs.append(frame.epoch)
        return await original(frame, *args, **kwargs)
    consumer._on_deliver = on_deliver


async def close_quietly(obj, timeout=5):
    try:
        await asyncio.wait_for(obj.close(), timeout)
    except Exception:
        pass


# ------------------------------------------------------------------------------------ finding 1

async def delete_consumed(port, streams, per_stream=10, delete_timeout=8):
    """A consumer subscribes to every stream, then deletes them one by one on its own connection."""
    result = {"deleted": [], "timed_out": None, "failed": None, "received": 0}
    async with Producer(HOST, port, **CREDS) as p:
        for s in streams:
            await p.create_stream(s, exists_ok=True)
            await publish_confirmed(p, s, [b"%s-%d" % (s.encode(), i) for i in range(per_stream)])
    got = {s: 0 for s in streams}

    async def on_message(msg, ctx):
        got[stream_of(ctx)] += 1

    c = Consumer(HOST, port, **CREDS, connection_name="compat-delete-old")
    await c.start()
    try:
        for s in streams:
            await c.subscribe(s, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        await wait_until(lambda: all(v >= per_stream for v in got.values()), 15)
        result["received"] = sum(got.values())
        for s in streams:
            try:
                await asyncio.wait_for(c.delete_stream(s), delete_timeout)
            except asyncio.TimeoutError:
                result["timed_out"] = s
                break
            except Exception as e:
                result["failed"] = f"{s}: {type(e).__name__}: {e}"
                break
            result["deleted"].append(s)
    finally:
        await close_quietly(c)
    return result


# ------------------------------------------------------------------------------------ finding 2

def _sac_body(rnd, i):
    return b"r%d-%06d" % (rnd, i)


async def delete_super_stream(port, ss):
    """Through a SuperStreamProducer of its own: the one that routed has closed its locator connection."""
    async def no_routing(msg):
        return ""
    ssp = SuperStreamProducer(HOST, port, **CREDS, super_stream=ss, routing_extractor=no_routing)
    await ssp.start()
    try:
        await ssp.delete_super_stream(ss)
    finally:
        await close_quietly(ssp)


async def _sac_round(port, ss, group, n, rnd, delete_while_subscribed):
    partitions = [f"{ss}-{k}" for k in range(3)]
    out = {"round": rnd, "error": None}
    active = {}            # partition -> index of the consumer that was last activated on it
    deliveries = []        # (message index, consumer, partition)
    confirmed = []

    async def on_message(i, msg, ctx):
        deliveries.append((int(bytes(msg).split(b"-")[1]), i, stream_of(ctx)))

    async def on_update(i, is_active, ctx):
        part = stream_of(ctx)
        if is_active:
            active[part] = i
        elif active.get(part) == i:
            del active[part]
        return OffsetSpecification(OffsetType.FIRST, 0)

    async def routing_key(msg):
        return bytes(msg).split(b"-")[1].decode()

    def settled():
        return sorted(active) == partitions and sorted(active.values()) == [0, 1, 2]

    ssp = SuperStreamProducer(HOST, port, **CREDS, super_stream=ss, routing_extractor=routing_key,
                              routing=RouteType.Hash,
                              super_stream_creation_option=SuperStreamCreationOption(n_partitions=3))
    await ssp.start()
    consumers = []
    try:
        props = {"single-active-consumer": "true", "name": group, "super-stream": ss}
        for i in range(3):
            c = SuperStreamConsumer(HOST, port, **CREDS, super_stream=ss, connection_name=f"sac-old-{i}")
            await c.start()
            consumers.append(c)
            await c.subscribe(partial(on_message, i), properties=dict(props),
                              offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
                              consumer_update_listener=partial(on_update, i))
        if not await wait_until(settled, 15):
            out["error"] = f"the SAC group never settled to one active consumer per partition: {active}"
            return out
        out["active"] = dict(active)
        for i in range(n):
            await ssp.send(_sac_body(rnd, i), on_publish_confirm=confirmed.append)
        await wait_until(lambda: len(confirmed) >= n, 30)
        out["confirmed"] = sum(1 for c in confirmed if c.is_confirmed)
        await wait_until(lambda: len(deliveries) >= n, 30)
        await asyncio.sleep(0.5)                      # catch duplicates
    finally:
        out["deliveries"] = len(deliveries)
        seen = {}
        for idx, i, part in deliveries:
            seen[idx] = seen.get(idx, 0) + 1
        out["unique"] = len(seen)
        out["duplicates"] = sum(v - 1 for v in seen.values())
        out["missing"] = n - len(seen)
        by_part = {}
        for _, i, part in deliveries:
            by_part.setdefault(part, set()).add(i)
        out["consumers_by_partition"] = {p: sorted(v) for p, v in by_part.items()}
        await close_quietly(ssp)
        if delete_while_subscribed:
            await delete_super_stream(port, ss)
            for c in consumers:
                await close_quietly(c)
        else:
            for c in consumers:
                await close_quietly(c)
            await delete_super_stream(port, ss)
    return out


async def sac_super_stream(port, super_stream, group, n, rounds=3):
    """The same SAC scenario ``rounds`` times; round 2 deletes the super stream under its consumers."""
    results = []
    for rnd in range(1, rounds + 1):
        results.append(await _sac_round(port, super_stream, group, n, rnd, delete_while_subscribed=(rnd == 2)))
    return {"rounds": results}


# --------------------------------------------------------------------------------- findings 3-5

async def consume(port, stream, offset_type, *, until_offset=None, until_body=None, timeout=10, settle=0.5,
                  before=None):
    """Subscribe and collect (offset, body) until a given offset or body arrived (then ``settle`` more
    seconds) or ``timeout``; ``before`` (a coroutine function) runs right after subscribing."""
    got, epochs = [], []

    async def on_message(msg, ctx):
        got.append((ctx.offset, bytes(msg).decode("latin-1")))

    def done():
        return any((until_offset is not None and o >= until_offset) or (until_body is not None and b == until_body)
                   for o, b in got)

    c = Consumer(HOST, port, **CREDS, connection_name="compat-consume-old")
    await c.start()
    probe_epochs(c, epochs)
    try:
        await c.subscribe(stream, on_message,
                          offset_specification=ConsumerOffsetSpecification(OffsetType[offset_type], None))
        if before is not None:
            await before()
        complete = await wait_until(done, timeout)
        await asyncio.sleep(settle)
    finally:
        await close_quietly(c)
    return {"messages": got, "complete": complete, "epochs": sorted(set(epochs))}


async def last(port, stream, last_offset):
    return await consume(port, stream, "LAST", until_offset=last_offset)


async def epoch(port, stream):
    return await consume(port, stream, "FIRST", until_offset=0, settle=0.2)


async def next_after_unconfirmed(port, stream, batch=10):
    """send_batch of ``batch`` (confirms not awaited), subscribe NEXT, send one more: only it is due."""
    async with Producer(HOST, port, **CREDS) as p:
        await p.create_stream(stream, exists_ok=True)
        await p.send_batch(stream, [b"early-%d" % i for i in range(batch)])

        async def one_more():
            await publish_confirmed(p, stream, [b"the-last"])
        return await consume(port, stream, "NEXT", until_body="the-last", before=one_more, settle=0.7)


# ------------------------------------------------------------------------------------ finding 6

async def mgmt_closed(port, stream, name, timeout=15):
    """A named consumer; prints ``{"event": "ready"}`` and waits for the test to close its connection
    through the management API, then reconnects as 0.20 users do (reconnect_stream) and checks that a
    message published afterwards arrives."""
    got, closed = [], []

    async def on_message(msg, ctx):
        got.append(bytes(msg).decode())

    async def on_close(info):
        closed.append({"reason": info.reason, "streams": list(info.streams)})

    async with Producer(HOST, port, **CREDS) as p:
        await p.create_stream(stream, exists_ok=True)
        await publish_confirmed(p, stream, [b"before"])
    c = Consumer(HOST, port, **CREDS, connection_name=name, on_close_handler=on_close)
    await c.start()
    out = {"closed": closed, "received": got}
    try:
        await c.subscribe(stream, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        await wait_until(lambda: "before" in got, 10)
        emit({"event": "ready", "client_properties_version": rstream.__version__})
        out["saw_close"] = await wait_until(lambda: closed, timeout)
        if out["saw_close"]:
            await c.reconnect_stream(stream)
            await asyncio.sleep(0.5)
            async with Producer(HOST, port, **CREDS) as p:
                await publish_confirmed(p, stream, [b"after"])
            out["after_received"] = await wait_until(lambda: "after" in got, 10)
    finally:
        await close_quietly(c)
    return out


SCENARIOS = {
    "delete_consumed": delete_consumed,
    "sac_super_stream": sac_super_stream,
    "last": last,
    "epoch": epoch,
    "next_after_unconfirmed": next_after_unconfirmed,
    "mgmt_closed": mgmt_closed,
}


def main():
    name, port, args = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3] if len(sys.argv) > 3 else "{}")
    try:
        result = asyncio.run(asyncio.wait_for(SCENARIOS[name](port, **args), 240))
    except BaseException as e:  # report, don't crash: the test shows the reason
        result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    result["rstream_version"] = rstream.__version__
    emit(result)


if __name__ == "__main__":
    main()

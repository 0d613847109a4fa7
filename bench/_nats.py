"""NATS JetStream as a peer of ``bench.compare``: the server (``ci/nats.sh``) and its client workloads.

Server: Debian's nats-server (2.9), started by the bench as ``nats-server -js`` on 127.0.0.1 and a free
port, its JetStream store in a temporary directory, default settings otherwise (a file-backed stream; a
PubAck means the message is in the stream's file store, written without an fsync per message).

Client: nats-py (asyncio). One JetStream stream per run, named ``--stream``, file storage, capturing the
subject of the same name. The workloads (run by ``bench._client``; setup untimed):

- ``nats-publish``: ``publish_async`` of every message, at most ``--batch`` × ``--inflight`` (80,000)
  unacknowledged (nats-py's own window), then ``publish_async_completed``; every PubAck checked.
- ``nats-consume``: the stream filled first (``publish_async``), then a pull consumer (deliver all, no acks:
  like a RabbitMQ stream consumer, it only reads) created and ``fetch(--batch)`` until every message came.
- ``nats-latency``: ``publish`` (a request that waits for the stream's PubAck) one message at a time:
  ``--warmup`` untimed, then ``--timed`` timed.

The ``nats-r3-*`` workloads are the same three on a stream with ``num_replicas=3``, against the
three-server cluster of ``bench._cluster.NatsCluster`` (the cluster rows): a PubAck then means a
majority of the three stored the message.
"""

import asyncio
import time

from bench._procs import ScriptServer


class Nats(ScriptServer):
    name = "nats"
    label = "NATS"
    script = "nats.sh"
    package = "nats-server"
    port_env = "NATS_PORT"
    dir_env = "NATS_DIR"


# --------------------------------------------------------------------------------------------------
# client side (inside a bench._client process)

async def _publish_all(js, subject, n, body, window):
    failed = []

    def check(fut):
        if fut.cancelled() or fut.exception() is not None:
            failed.append(fut)

    for _ in range(n):
        fut = await js.publish_async(subject, body)
        fut.add_done_callback(check)
    await asyncio.wait_for(js.publish_async_completed(), 900)
    if failed:
        first = failed[0]
        raise RuntimeError(f"{len(failed)} of {n} publishes were not acknowledged: "
                           f"{'cancelled' if first.cancelled() else first.exception()!r}")


async def run(runner):
    """Run ``runner.a.workload`` (one of nats-publish, nats-consume, nats-latency) against the NATS server
    at ``--host``/``--port``; the stream (and subject) is ``--stream``, deleted at the end."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

    a = runner.a
    # nats-r3-*: the same workload on a stream with three replicas (bench._cluster.NatsCluster)
    workload = a.workload.replace("nats-r3-", "nats-")
    replicas = 3 if a.workload.startswith("nats-r3-") else 1
    window = a.batch * a.inflight
    nc = await nats.connect(f"nats://{a.host}:{a.port}", allow_reconnect=False)
    js = nc.jetstream(timeout=60, publish_async_max_pending=window)
    subject = stream = a.stream
    await js.add_stream(name=stream, subjects=[subject], storage=StorageType.FILE,
                        num_replicas=replicas)
    try:
        if workload == "nats-publish":
            runner.wait_go()
            runner.start()
            await _publish_all(js, subject, a.n, runner.body, window)
            runner.stop()
            await _check_len(js, stream, a.n)
        elif workload == "nats-consume":
            await _publish_all(js, subject, a.n, runner.body, window)
            await _check_len(js, stream, a.n)
            runner.wait_go()
            runner.start()
            sub = await js.pull_subscribe(subject, stream=stream, config=ConsumerConfig(
                ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
            got = nbytes = 0
            while got < a.n:
                msgs = await sub.fetch(min(a.batch, a.n - got), timeout=60)
                got += len(msgs)
                for m in msgs:
                    nbytes += len(m.data)
            runner.stop()
            await sub.unsubscribe()
            runner.result["received"] = got
            runner.result["received_bytes"] = nbytes
        elif workload == "nats-latency":
            body = runner.body
            runner.wait_go()
            for _ in range(a.warmup):
                await js.publish(subject, body)
            runner.start()
            clock = time.perf_counter_ns
            lat = []
            for _ in range(a.timed):
                t = clock()
                await js.publish(subject, body)
                lat.append(clock() - t)
            runner.stop()
            runner.latency(lat)
            await _check_len(js, stream, a.warmup + a.timed)
        else:
            raise ValueError(f"not a NATS workload: {a.workload}")
    finally:
        try:
            if not a.keep_stream:
                await js.delete_stream(stream)
        finally:
            await nc.close()


async def _check_len(js, stream, n):
    info = await js.stream_info(stream)
    if info.state.messages != n:
        raise RuntimeError(f"stream {stream} has {info.state.messages} messages, expected {n}")

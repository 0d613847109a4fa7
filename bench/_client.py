"""One benchmark workload in one client process: ``python -m bench._client WORKLOAD --port P ...``.

Each workload drives a real RabbitMQ Stream client (rstream 1.1.1 or rbfly 0.10.0) against one broker;
the broker is whatever listens on ``--host``/``--port`` (RabbitMQ or ``riverbed serve``), so the same
code runs against both. The process talks to the harness (``bench.compare``) over its stdin/stdout:

1. it connects, creates its stream and, for consume workloads, fills it (untimed), then prints ``READY``;
2. it waits for a ``GO`` line on stdin (so that two clients can start together);
3. it runs the timed part, taking a snapshot of CPU counters at the start and the end of the timed
   window: the server's process tree (utime+stime from /proc, ``--server-pid``), its own CPU
   (getrusage), the harness's CPU (its parent) and the machine's /proc/stat;
4. it prints ``RESULT <json>`` and deletes its stream.

Workloads (bodies are ``--size`` bytes, default 100):

- ``rstream-raw``: rstream ``Producer.send_batch`` of raw bytes, ``--batch`` (5,000) messages per call,
  at most ``--inflight`` (16) batches unconfirmed.
- ``rbfly-raw``: rbfly's binary publisher (``PublisherBin.send``, opaque bytes, no AMQP encoding), one
  message per Publish frame, each publisher waits for its confirm before the next (rbfly's way);
  ``--publishers`` (1 or 4) publishers run concurrently on the client's one connection.
- ``rbfly-amqp``: the same with rbfly's AMQP publisher (``Publisher.send``; bodies AMQP 1.0 encoded).
- ``rbfly-amqp-batch``: rbfly's AMQP batch publisher (``PublisherBatchFast``): ``batch()`` ``--batch``
  messages, then ``flush()`` (which sends as many frames as needed and waits for their confirms).
- ``consume-rstream``: rstream ``Consumer`` from ``first`` (credit 10, as rstream does), raw bodies.
- ``consume-rbfly-raw`` / ``consume-rbfly-amqp``: rbfly ``subscribe(offset=Offset.FIRST, amqp=...)``;
  the stream is filled with raw or AMQP-encoded bodies accordingly. After the timed window each consume
  row reads the stream once more, untimed, with the load generator's reader (``bench._loadgen.chunk_census``)
  and reports the chunk shape the broker stored (``chunk_shape``: records and bytes per chunk).
- ``latency-rstream``: rstream ``send_wait`` one message at a time: ``--warmup`` (100) untimed, then
  ``--timed`` (5,000) timed, each from the call to the confirm.
- ``latency-rbfly``: the same with rbfly ``PublisherBin.send``.
- ``memory-rstream``: ``--streams`` (1,000) streams created on one connection, 64 requests in flight
  (``setup_s``, untimed), then, over ``--connections`` (10; more when needed, at most 200 streams per
  connection, rstream's limit) rstream ``Producer`` + ``Consumer`` pairs, one consumer from ``first`` and
  one publisher per stream, ``--n`` messages published to each and every one delivered (``attach_s``);
  then, with all of them still connected, the server's VmRSS and RssAnon (process tree) go into the
  RESULT (``server_rss_kb``, ``server_anon_kb``); ``detach_s``: closing them (rstream unsubscribes one at a
  time).

The other peers' workloads (``redis-*``, ``nats-*``) are in ``bench._redis`` and ``bench._nats``, and the
server-bound load generator (``loadgen-publish``, ``loadgen-consume``, ``loadgen-latency``: pre-encoded
frames on a plain socket, any RabbitMQ Stream broker) in ``bench._loadgen``; they use the same Runner
(READY/GO, snapshots, RESULT).
"""

import argparse
import asyncio
import json
import os
import resource
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
MEMORY_PER_CONNECTION = 200     # memory-rstream: rstream's limit of publishers (subscribers) per connection
MEMORY_CREATE_INFLIGHT = 64     # memory-rstream: create/delete requests in flight on the setup connection

WORKLOADS = ("rstream-raw", "rbfly-raw", "rbfly-amqp", "rbfly-amqp-batch", "consume-rstream",
             "consume-rbfly-raw", "consume-rbfly-amqp", "latency-rstream", "latency-rbfly", "memory-rstream")
# peer workloads -> the module that runs them (``await module.run(runner)``)
PEER_CLIENTS = {w: "bench._redis" for w in ("redis-publish", "redis-consume", "redis-latency")}
PEER_CLIENTS.update({w: "bench._nats" for w in ("nats-publish", "nats-consume", "nats-latency")})
PEER_CLIENTS.update({w: "bench._nats" for w in ("nats-r3-publish", "nats-r3-consume", "nats-r3-latency")})
# the server-bound load generator (raw frames, any RabbitMQ Stream broker): bench._loadgen
PEER_CLIENTS.update({w: "bench._loadgen" for w in ("loadgen-publish", "loadgen-consume", "loadgen-latency")})
# Riverbed's Kafka shell with confluent-kafka (librdkafka): bench._kafka
PEER_CLIENTS.update({w: "bench._kafka" for w in ("kafka-produce", "kafka-consume")})
# the same rows with librdkafka driven from C (bench/kafka_native.c): bench._kafka_native
PEER_CLIENTS.update({w: "bench._kafka_native" for w in ("kafka-produce-native", "kafka-consume-native")})
# issue 26's Spark rows: the riverbed data source on local[2] reading what the broker holds
PEER_CLIENTS.update({w: "bench._spark_rows" for w in ("spark-raw", "spark-json")})


# --------------------------------------------------------------------------------------------------
# /proc counters (the same helpers are used by the harness)

def proc_cpu(pid):
    """utime+stime of one process (all its threads), seconds; 0.0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def descendants(pid):
    """pid and every process below it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def tree_cpu(pid):
    return sum(proc_cpu(p) for p in descendants(pid)) if pid else 0.0


def machine_stat():
    """Aggregate /proc/stat jiffies, seconds: busy (user+nice+system), irq (irq+softirq), steal, total."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    v += [0] * (10 - len(v))
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
    return {"busy": (user + nice + system) / CLK_TCK, "irq": (irq + softirq) / CLK_TCK,
            "steal": steal / CLK_TCK, "total": (user + nice + system + idle + iowait + irq + softirq + steal) / CLK_TCK}


def self_cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def snapshot(server_pid, idle_pids=(), also_server=()):
    """CPU counters now; ``also_server``: more server processes (a cluster's other nodes), summed in."""
    nodes = [tree_cpu(server_pid)] + [tree_cpu(p) for p in also_server]
    return {"t": time.monotonic(), "server": sum(nodes), "server_nodes": nodes, "client": self_cpu(),
            "harness": proc_cpu(os.getppid()), "idle_brokers": sum(tree_cpu(p) for p in idle_pids),
            "stat": machine_stat()}


# --------------------------------------------------------------------------------------------------
# workloads

USER = PASSWORD = "guest"


def rstream_producer(a):
    from rstream import Producer
    return Producer(a.host, a.port, username=USER, password=PASSWORD)


async def rstream_create(a):
    async with rstream_producer(a) as p:
        # --stream-arg K=V: stream arguments (the cluster rows: queue-leader-locator=client-local)
        args = dict(kv.split("=", 1) for kv in a.stream_arg) or None
        await p.create_stream(a.stream, arguments=args, exists_ok=True)


async def rstream_delete(a):
    async with rstream_producer(a) as p:
        await p.delete_stream(a.stream, missing_ok=True)


async def rstream_fill(a, body):
    """Untimed: put n messages into the stream with rstream send_batch."""
    async with rstream_producer(a) as p:
        await publish_rstream_batches(p, a.stream, a.n, body, a.batch, a.inflight)


async def publish_rstream_batches(p, stream, n, body, batch, inflight):
    state = {"confirmed": 0, "refused": 0, "code": None}
    sent = 0
    done = asyncio.Event()
    room = asyncio.Event()
    window = batch * inflight

    def on_confirm(status):
        # a PublishError answers a message too (it frees its place in the window) but is not a confirm:
        # the run fails below rather than count it as published
        state["confirmed"] += 1
        if not status.is_confirmed:
            state["refused"] += 1
            state["code"] = state["code"] or status.response_code
        if sent - state["confirmed"] < window:
            room.set()
        if state["confirmed"] >= n:
            done.set()

    while sent < n:
        while sent - state["confirmed"] >= window:
            room.clear()
            await room.wait()
        k = min(batch, n - sent)
        sent += k
        await p.send_batch(stream, [body] * k, on_publish_confirm=on_confirm)
    await asyncio.wait_for(done.wait(), 900)
    if state["refused"]:
        raise RuntimeError(f"{state['refused']} of {n} messages answered with PublishError "
                           f"(first code {state['code']:#x}), not confirmed")


def rbfly_client(a):
    from rbfly.streams import streams_client
    return streams_client(f"rabbitmq-stream://{USER}:{PASSWORD}@{a.host}:{a.port}")


def publisher_name(i):
    return f"bench/{os.getpid()}/{i}"


async def rbfly_fill_amqp(a, body):
    from rbfly.streams import PublisherBatchFast
    client = rbfly_client(a)
    try:
        async with client.publisher(a.stream, name=publisher_name("fill"), cls=PublisherBatchFast) as pub:
            left = a.n
            while left:
                k = min(a.batch, left)
                for _ in range(k):
                    pub.batch(body)
                await pub.flush()
                left -= k
    finally:
        await client.disconnect()


class Runner:
    """Setup, READY/GO handshake, timed window, RESULT line."""

    def __init__(self, a):
        self.a = a
        self.body = b"x" * a.size
        self.result = {"workload": a.workload, "n": a.n, "size": a.size}

    def wait_go(self):
        print("READY", flush=True)
        if self.a.no_sync:
            return
        line = sys.stdin.readline()
        if line.strip() != "GO":
            raise SystemExit("harness went away")

    def start(self):
        self.s0 = snapshot(self.a.server_pid, self.a.idle_pid, self.a.also_server_pid)

    def stop(self):
        self.s1 = snapshot(self.a.server_pid, self.a.idle_pid, self.a.also_server_pid)

    async def run(self):
        a = self.a
        w = a.workload
        if w in PEER_CLIENTS:
            import importlib
            await importlib.import_module(PEER_CLIENTS[w]).run(self)
            return
        if w == "memory-rstream":
            await self.w_memory_rstream()
            return
        await rstream_create(a)
        if w == "consume-rbfly-amqp":
            await rbfly_fill_amqp(a, self.body)
        elif w.startswith("consume-"):
            await rstream_fill(a, self.body)
        try:
            await getattr(self, "w_" + w.replace("-", "_"))()
        finally:
            if not a.keep_stream:
                await rstream_delete(a)

    # --- publish ---

    async def w_rstream_raw(self):
        a = self.a
        async with rstream_producer(a) as p:
            # One untimed message declares the publisher and opens the data connection.
            await p.send_wait(a.stream, self.body)
            self.wait_go()
            self.start()
            await publish_rstream_batches(p, a.stream, a.n, self.body, a.batch, a.inflight)
            self.stop()

    async def _rbfly_send(self, cls, amqp):
        a = self.a
        client = rbfly_client(a)
        pubs = []
        try:
            from contextlib import AsyncExitStack
            async with AsyncExitStack() as stack:
                for i in range(a.publishers):
                    pubs.append(await stack.enter_async_context(
                        client.publisher(a.stream, name=publisher_name(i), cls=cls)))
                body = self.body
                share = [a.n // a.publishers + (1 if i < a.n % a.publishers else 0) for i in range(a.publishers)]

                async def one(pub, k):
                    send = pub.send
                    for _ in range(k):
                        await send(body)

                self.wait_go()
                self.start()
                await asyncio.gather(*(one(p, k) for p, k in zip(pubs, share)))
                self.stop()
        finally:
            await client.disconnect()
        self.result["publishers"] = a.publishers

    async def w_rbfly_raw(self):
        from rbfly.streams._client import PublisherBin
        await self._rbfly_send(PublisherBin, amqp=False)

    async def w_rbfly_amqp(self):
        from rbfly.streams import Publisher
        await self._rbfly_send(Publisher, amqp=True)

    async def w_rbfly_amqp_batch(self):
        from rbfly.streams import PublisherBatchFast
        a = self.a
        client = rbfly_client(a)
        try:
            async with client.publisher(a.stream, name=publisher_name(0), cls=PublisherBatchFast) as pub:
                body = self.body
                self.wait_go()
                self.start()
                left = a.n
                while left:
                    k = min(a.batch, left)
                    for _ in range(k):
                        pub.batch(body)
                    await pub.flush()
                    left -= k
                self.stop()
        finally:
            await client.disconnect()

    # --- consume ---

    async def w_consume_rstream(self):
        from rstream import Consumer, ConsumerOffsetSpecification, OffsetType
        a = self.a
        state = {"got": 0, "bytes": 0}
        done = asyncio.Event()

        async def on_message(msg, ctx):
            state["got"] += 1
            state["bytes"] += len(msg)
            if state["got"] >= a.n:
                done.set()

        async with Consumer(a.host, a.port, username=USER, password=PASSWORD) as c:
            self.wait_go()
            self.start()
            await c.subscribe(a.stream, on_message,
                              offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
                              initial_credit=10)
            await asyncio.wait_for(done.wait(), 900)
            self.stop()
        self.result["received"] = state["got"]
        self.result["received_bytes"] = state["bytes"]
        self.census()

    async def _consume_rbfly(self, amqp):
        from rbfly.streams import Offset
        a = self.a
        client = rbfly_client(a)
        got = nbytes = 0
        try:
            # Connect before the timed window (rbfly connects lazily).
            await client.get_protocol()
            self.wait_go()
            self.start()
            async for msg in client.subscribe(a.stream, offset=Offset.FIRST, amqp=amqp):
                got += 1
                nbytes += len(msg)
                if got >= a.n:
                    break
            self.stop()
        finally:
            await client.disconnect()
        self.result["received"] = got
        self.result["received_bytes"] = nbytes
        self.census()

    def census(self):
        """Untimed, after the window: the chunk shape the broker stored for this row's publishes (records
        and bytes per chunk, the last chunk's records), read with the load generator's reader."""
        from bench._loadgen import chunk_census
        a = self.a
        self.result["chunk_shape"] = chunk_census(a.host, a.port, a.stream, a.n)

    async def w_consume_rbfly_raw(self):
        await self._consume_rbfly(False)

    async def w_consume_rbfly_amqp(self):
        await self._consume_rbfly(True)

    # --- latency ---

    async def w_latency_rstream(self):
        a = self.a
        body = self.body
        lat = []
        async with rstream_producer(a) as p:
            self.wait_go()
            for _ in range(a.warmup):
                await p.send_wait(a.stream, body)
            self.start()
            clock = time.perf_counter_ns
            for _ in range(a.timed):
                t = clock()
                await p.send_wait(a.stream, body)
                lat.append(clock() - t)
            self.stop()
        self.latency(lat)

    async def w_latency_rbfly(self):
        from rbfly.streams._client import PublisherBin
        a = self.a
        body = self.body
        lat = []
        client = rbfly_client(a)
        try:
            async with client.publisher(a.stream, name=publisher_name(0), cls=PublisherBin) as pub:
                self.wait_go()
                for _ in range(a.warmup):
                    await pub.send(body)
                self.start()
                clock = time.perf_counter_ns
                for _ in range(a.timed):
                    t = clock()
                    await pub.send(body)
                    lat.append(clock() - t)
                self.stop()
        finally:
            await client.disconnect()
        self.latency(lat)

    # --- memory ---

    async def w_memory_rstream(self):
        from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer
        from bench._procs import rss_kb
        a = self.a
        names = [f"{a.stream}-{i}" for i in range(a.streams)]
        # rstream takes at most 200 publishers (subscribers) per connection: more streams, more connections
        conns = max(a.connections, -(-a.streams // MEMORY_PER_CONNECTION))
        groups = [names[g::conns] for g in range(conns)]
        expect = a.n * a.streams
        state = {"confirmed": 0, "got": 0, "bytes": 0}
        all_confirmed, all_got = asyncio.Event(), asyncio.Event()

        def on_confirm(status):
            state["confirmed"] += 1
            if state["confirmed"] >= expect:
                all_confirmed.set()

        async def on_message(msg, ctx):
            state["got"] += 1
            state["bytes"] += len(msg)
            if state["got"] >= expect:
                all_got.set()

        def producer():
            return Producer(a.host, a.port, username=USER, password=PASSWORD)

        async def each_stream(op):
            # On one connection kept open: Producer.create_stream/delete_stream open and close a locator
            # connection per call (~200 ms each here), which would make 1,000 streams take minutes. Up to
            # MEMORY_CREATE_INFLIGHT requests are in flight at a time (rstream matches answers by
            # correlation id), as an application creating many streams at start would send them; both
            # brokers get the same requests the same way.
            async with producer() as p:
                client = await p.default_client
                room = asyncio.Semaphore(MEMORY_CREATE_INFLIGHT)

                async def one(s):
                    async with room:
                        await getattr(client, op)(s)
                await asyncio.gather(*(one(s) for s in names))

        t0 = time.monotonic()
        await each_stream("create_stream")   # setup, untimed (reported as setup_s)
        self.result["setup_s"] = time.monotonic() - t0
        self.result["streams"] = a.streams
        self.result["connections"] = conns
        try:
            from contextlib import AsyncExitStack
            self.wait_go()
            self.start()
            t1 = time.monotonic()
            async with AsyncExitStack() as stack:
                pairs = []
                for group in groups:
                    c = await stack.enter_async_context(Consumer(a.host, a.port, username=USER,
                                                                         password=PASSWORD))
                    p = await stack.enter_async_context(producer())
                    pairs.append((p, c, group))

                async def one(p, c, group):
                    for s in group:
                        await c.subscribe(s, on_message, initial_credit=10,
                                          offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
                    for s in group:
                        await p.send_batch(s, [self.body] * a.n, on_publish_confirm=on_confirm)

                await asyncio.gather(*(one(*pair) for pair in pairs))
                await asyncio.wait_for(asyncio.gather(all_confirmed.wait(), all_got.wait()), 300)
                self.result["attach_s"] = time.monotonic() - t1    # connect, subscribe, publish, deliver
                await asyncio.sleep(0.5)   # let the server settle (freed buffers) before reading its memory
                self.result["server_rss_kb"] = rss_kb(a.server_pid)
                self.result["server_anon_kb"] = rss_kb(a.server_pid, "RssAnon")
                self.stop()
                t2 = time.monotonic()
            self.result["detach_s"] = time.monotonic() - t2        # rstream closes each subscription in turn
        finally:
            if not a.keep_stream:
                await each_stream("delete_stream")
        self.result.update(n=state["got"], received=state["got"], received_bytes=state["bytes"],
                           confirmed=state["confirmed"])

    def latency(self, lat):
        """Record latencies (ns, one per message) as the result's n and p50/p99/p999/max/mean in µs."""
        lat.sort()
        k = len(lat)
        pct = lambda q: lat[min(k - 1, int(q * k))] / 1e3  # noqa: E731  (µs)
        self.result.update(n=k, lat_p50_us=pct(0.50), lat_p99_us=pct(0.99), lat_p999_us=pct(0.999),
                           lat_max_us=lat[-1] / 1e3, lat_mean_us=sum(lat) / k / 1e3)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="one benchmark workload (see the module docstring)")
    ap.add_argument("workload", choices=WORKLOADS + tuple(PEER_CLIENTS))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--stream", required=True)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=5000)
    ap.add_argument("--inflight", type=int, default=16)
    ap.add_argument("--publishers", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--timed", type=int, default=5000)
    ap.add_argument("--server-pid", type=int, default=0, help="the broker process to measure")
    ap.add_argument("--idle-pid", type=int, action="append", default=[],
                    help="other brokers running meanwhile (their CPU is reported, and counts as noise)")
    ap.add_argument("--also-server-pid", type=int, action="append", default=[],
                    help="another server process whose CPU counts as the server's (a cluster's other nodes)")
    ap.add_argument("--stream-arg", action="append", default=[], metavar="K=V",
                    help="a stream argument for the rstream workloads' create_stream")
    ap.add_argument("--streams", type=int, default=1000, help="memory-rstream: streams (default 1,000)")
    ap.add_argument("--connections", type=int, default=10,
                    help="memory-rstream: producer/consumer connection pairs (default 10)")
    ap.add_argument("--no-sync", action="store_true", help="do not wait for GO on stdin")
    ap.add_argument("--keep-stream", action="store_true")
    return ap.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)
    r = Runner(a)
    asyncio.run(r.run())
    res = r.result
    res["s0"], res["s1"] = r.s0, r.s1
    res.setdefault("received_bytes", None)
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()

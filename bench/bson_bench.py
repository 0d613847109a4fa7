"""BSON/TCP (mewbase) shell benchmark, next to the RabbitMQ Stream shell, one ``riverbed serve``, one run.

Workloads (100-byte events by default):

1. BSON pipelined PUB: one raw-socket client keeps ``--depth`` PUBs unanswered (default 1,000); frames
   are pre-encoded so the client costs as little as possible.
2. BSON PUB -> RECEV fan-out: ``--subscribers`` raw-socket subscribers (new events only, ACKEV every
   1 MiB) while one client publishes as in 1; timed until every subscriber has every event.
3. RabbitMQ Stream, same records: rstream ``send_batch`` of the same 100-byte payloads (batches of 1,000
   confirmed), then one rstream consumer reading them from the first offset.

For each: events/s and the server's CPU (utime+stime from /proc) per event. On a 2-core machine the
Python clients compete with the server for CPU, so the per-event CPU figure is the one to compare.

    .venv/bin/python bench/bson_bench.py [--n 200000] [--size 100] [--depth 1000] [--subscribers 2]
        [--fsync never]
"""

import argparse
import asyncio
import os
import socket
import struct
import sys
import tempfile
import threading
import time

import bson

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

from procs import ServerProcess  # noqa: E402

_I32 = struct.Struct("<i")


def event(i, size):
    # a document of exactly ``size`` bytes of BSON: {"i": int32, "p": "xxx..."}
    base = len(bson.encode({"i": i, "p": ""}))
    return {"i": i, "p": "x" * max(0, size - base)}


def connect(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(bson.encode({"type": "CONNECT", "frame": {"version": "0.1"}}))
    buf = b""
    while len(buf) < 4 or len(buf) < _I32.unpack_from(buf)[0]:
        buf += s.recv(4096)
    assert bson.decode(buf)["frame"]["ok"]
    return s


class FrameCounter:
    """Counts whole frames off a socket, keeping a partial frame for the next call."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def count(self, want, on_bytes=None):
        """Read until ``want`` more frames arrived (frames past them stay buffered)."""
        got = 0
        buf = self.buf
        while True:
            pos, end = 0, len(buf)
            while got < want and end - pos >= 4:
                n = _I32.unpack_from(buf, pos)[0]
                if end - pos < n:
                    break
                pos += n
                got += 1
            del buf[:pos]
            if got >= want:
                return
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("server closed")
            buf += chunk
            if on_bytes is not None:
                on_bytes(len(chunk))


def count_frames(sock, want, on_bytes=None):
    FrameCounter(sock).count(want, on_bytes)


def pipelined_publish(port, channel, n, size, depth):
    s = connect(port)
    frames = [bson.encode({"type": "PUB", "frame": {"channel": channel, "rID": i, "event": event(i, size)}})
              for i in range(n)]
    window = threading.Semaphore(depth)
    done = threading.Event()

    def reader():
        def ok(raw):
            f = bson.decode(raw)["frame"]
            assert f["ok"], f
        buf = bytearray()
        got = 0
        while got < n:
            chunk = s.recv(1 << 20)
            if not chunk:
                raise EOFError
            buf += chunk
            pos, end, k = 0, len(buf), 0
            while end - pos >= 4:
                ln = _I32.unpack_from(buf, pos)[0]
                if end - pos < ln:
                    break
                if got == 0 and k == 0:
                    ok(bytes(buf[pos:pos + ln]))
                pos += ln
                k += 1
            del buf[:pos]
            got += k
            for _ in range(k):
                window.release()
        done.set()
    t = threading.Thread(target=reader, daemon=True)
    t0 = time.perf_counter()
    t.start()
    batch = 100
    for i in range(0, n, batch):
        part = frames[i:i + batch]
        for _ in part:
            window.acquire()
        s.sendall(b"".join(part))
    done.wait()
    dt = time.perf_counter() - t0
    s.close()
    return dt


def subscriber(port, channel, n, ready, result):
    s = connect(port)
    s.sendall(bson.encode({"type": "SUBSCRIBE", "frame": {"channel": channel, "rID": 1}}))
    counter = FrameCounter(s)
    counter.count(1)              # SUBRESPONSE
    ready.release()
    unacked = [0]

    def on_bytes(k):
        unacked[0] += k
        if unacked[0] >= 1 << 20:
            s.sendall(bson.encode({"type": "ACKEV", "frame": {"subID": 0, "bytes": unacked[0]}}))
            unacked[0] = 0
    counter.count(n, on_bytes)
    result.append(time.perf_counter())
    s.close()


def bench_bson(srv, a):
    port = srv.ports["bson"]
    out = {}
    c0 = srv.cpu_seconds()
    dt = pipelined_publish(port, "bench-pub", a.n, a.size, a.depth)
    cpu = srv.cpu_seconds() - c0
    out["bson_pub"] = (a.n / dt, cpu / a.n * 1e6)

    ready = threading.Semaphore(0)
    results = []
    threads = [threading.Thread(target=subscriber, args=(port, "bench-fan", a.n, ready, results), daemon=True)
               for _ in range(a.subscribers)]
    # the channel must exist before subscribing to "new events only"
    s = connect(port)
    s.sendall(bson.encode({"type": "CREATECHANNEL", "frame": {"name": "bench-fan", "rID": 1}}))
    count_frames(s, 1)
    s.close()
    for t in threads:
        t.start()
    for _ in threads:
        ready.acquire()
    c0 = srv.cpu_seconds()
    t0 = time.perf_counter()
    pipelined_publish(port, "bench-fan", a.n, a.size, a.depth)
    for t in threads:
        t.join()
    dt = max(results) - t0
    cpu = srv.cpu_seconds() - c0
    out["bson_fanout"] = (a.n * a.subscribers / dt, cpu / (a.n * (1 + a.subscribers)) * 1e6)
    return out


async def bench_rmq(srv, a):
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer
    port = srv.port
    body = bson.encode(event(0, a.size))
    out = {}
    async with Producer("127.0.0.1", port, username="guest", password="guest") as p:
        await p.create_stream("bench-rmq")
        confirmed = [0]
        done = asyncio.Event()

        def cb(status):
            confirmed[0] += 1
            if confirmed[0] >= a.n:
                done.set()
        c0 = srv.cpu_seconds()
        t0 = time.perf_counter()
        for i in range(0, a.n, 1000):
            await p.send_batch("bench-rmq", [body] * min(1000, a.n - i), on_publish_confirm=cb)
        await asyncio.wait_for(done.wait(), 300)
        dt = time.perf_counter() - t0
        out["rmq_pub"] = (a.n / dt, (srv.cpu_seconds() - c0) / a.n * 1e6)

    got = [0]
    done = asyncio.Event()

    async def on_message(msg, ctx):
        got[0] += 1
        if got[0] >= a.n:
            done.set()
    consumer = Consumer("127.0.0.1", port, username="guest", password="guest")
    await consumer.start()
    c0 = srv.cpu_seconds()
    t0 = time.perf_counter()
    await consumer.subscribe("bench-rmq", on_message, decoder=None,
                             offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
    await asyncio.wait_for(done.wait(), 300)
    dt = time.perf_counter() - t0
    out["rmq_consume"] = (a.n / dt, (srv.cpu_seconds() - c0) / a.n * 1e6)
    await consumer.close()
    return out


def bson_consume(srv, a):
    """One BSON subscriber reading the pipelined-PUB channel from the start (the RECEV path alone)."""
    port = srv.ports["bson"]
    c0 = srv.cpu_seconds()
    t0 = time.perf_counter()
    s = connect(port)
    s.sendall(bson.encode({"type": "SUBSCRIBE", "frame": {"channel": "bench-pub", "rID": 1,
                                                          "startPos": bson.int64.Int64(0)}}))
    counter = FrameCounter(s)
    counter.count(1)
    unacked = [0]

    def on_bytes(k):
        unacked[0] += k
        if unacked[0] >= 1 << 20:
            s.sendall(bson.encode({"type": "ACKEV", "frame": {"subID": 0, "bytes": unacked[0]}}))
            unacked[0] = 0
    counter.count(a.n, on_bytes)
    dt = time.perf_counter() - t0
    s.close()
    return {"bson_consume": (a.n / dt, (srv.cpu_seconds() - c0) / a.n * 1e6)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--depth", type=int, default=1000)
    ap.add_argument("--subscribers", type=int, default=2)
    ap.add_argument("--fsync", default="never")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        srv = ServerProcess(os.path.join(d, "data"), "--bson-port", "0", "--fsync", a.fsync).start()
        try:
            res = bench_bson(srv, a)
            res.update(bson_consume(srv, a))
            res.update(asyncio.run(bench_rmq(srv, a)))
        except BaseException:
            print(srv.log()[-5000:], file=sys.stderr)
            raise
        finally:
            code = srv.stop()
    print(f"{a.n:,} events of {a.size} B, fsync={a.fsync}, PUB pipeline depth {a.depth}, "
          f"{a.subscribers} fan-out subscribers; server exit {code}")
    print(f"{'workload':<34}{'events/s':>12}{'server CPU us/event':>22}")
    labels = {
        "bson_pub": "BSON pipelined PUB",
        "bson_fanout": f"BSON PUB->RECEV x{a.subscribers} (deliveries/s)",
        "bson_consume": "BSON RECEV from start (1 sub)",
        "rmq_pub": "RabbitMQ Stream publish (rstream)",
        "rmq_consume": "RabbitMQ Stream consume (rstream)",
    }
    for k, label in labels.items():
        rate, cpu = res[k]
        print(f"{label:<34}{rate:>12,.0f}{cpu:>22.2f}")
    print(f"ratios: PUB rate BSON/RMQ {res['bson_pub'][0] / res['rmq_pub'][0]:.2f}, "
          f"PUB CPU/event BSON/RMQ {res['bson_pub'][1] / res['rmq_pub'][1]:.2f}, "
          f"RECEV CPU/event vs RMQ consume {res['bson_consume'][1] / res['rmq_consume'][1]:.2f}")
    print("(fan-out CPU per event counts each published event and each delivery as one event)")


if __name__ == "__main__":
    main()

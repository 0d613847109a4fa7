"""BSON/TCP (mewbase) shell benchmark, next to a bare BSON relay and the RabbitMQ Stream shell, one run.

Workloads 1 and 2 run against both ``riverbed serve`` (every event stored) and the bare relay (``--relay``
mode of this script, its own process): asyncio (uvloop when installed), the same ``bson`` codec, each frame
decoded with ``bson.decode``, a PUB answered RESPONSE {ok, rID} and forwarded as a RECEV encoded with
``bson.encode`` to each subscriber of its channel, replies written once per read; no storage, no auth, no
flow control. It is the ceiling for "the protocol library doing nothing but relaying" (issue 26); the
ratios riverbed/relay of rate and server CPU per event are printed.

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
        [--fsync never] [--rounds 1] [--no-rmq]
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
sys.path.insert(0, ROOT)
from bench._relay import RelayProcess, serve_forever  # noqa: E402

from procs import ServerProcess  # noqa: E402

_I32 = struct.Struct("<i")


# ------------------------------------------------------------------------------------------ relay

class _RelayConn(asyncio.Protocol):
    """One connection of the bare relay; ``channels`` maps a channel name to its subscribers' (conn, subID)."""

    def __init__(self, channels, positions):
        self.channels = channels
        self.positions = positions
        self.buf = b""
        self.out = []
        self.transport = None
        self.sub_ids = 0

    def connection_made(self, transport):
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc):
        for subs in self.channels.values():
            subs[:] = [x for x in subs if x[0] is not self]

    def data_received(self, data):
        buf = self.buf + data if self.buf else data
        pos, end = 0, len(buf)
        touched = set()
        encode = bson.encode
        while end - pos >= 4:
            n = _I32.unpack_from(buf, pos)[0]
            if end - pos < n:
                break
            doc = bson.decode(buf[pos:pos + n])
            pos += n
            ftype, f = doc["type"], doc.get("frame") or {}
            if ftype == "PUB":
                channel = f["channel"]
                at = self.positions.get(channel, 0)
                self.positions[channel] = at + 1
                now = bson.int64.Int64(int(time.time() * 1000))
                for conn, sub_id in self.channels.get(channel, ()):
                    conn.out.append(encode({"type": "RECEV", "frame": {"subID": sub_id, "pos": bson.int64.Int64(at),
                                                                       "timestamp": now, "event": f["event"]}}))
                    touched.add(conn)
                self.out.append(encode({"type": "RESPONSE", "frame": {"ok": True, "rID": f["rID"]}}))
            elif ftype == "SUBSCRIBE":
                self.channels.setdefault(f["channel"], []).append((self, self.sub_ids))
                self.out.append(encode({"type": "SUBRESPONSE", "frame": {"ok": True, "rID": f["rID"],
                                                                         "subID": self.sub_ids}}))
                self.sub_ids += 1
            elif ftype == "CONNECT":
                self.out.append(encode({"type": "RESPONSE", "frame": {"ok": True}}))
            elif ftype != "ACKEV":       # CREATECHANNEL and anything else: ok
                self.out.append(encode({"type": "RESPONSE", "frame": {"ok": True, "rID": f.get("rID")}}))
        self.buf = buf[pos:]
        touched.add(self)
        for conn in touched:
            if conn.out:
                conn.transport.write(b"".join(conn.out))
                conn.out.clear()


def relay_main():
    """The bare relay's process: prints ``listening bson 127.0.0.1:<port>``, then serves until killed."""
    channels, positions = {}, {}

    async def start():
        server = await asyncio.get_running_loop().create_server(lambda: _RelayConn(channels, positions),
                                                                "127.0.0.1", 0)
        return server.sockets[0].getsockname()[1]
    serve_forever(start, "bson")


def Relay():
    """The bare relay as a child process (bench._relay.RelayProcess)."""
    return RelayProcess(__file__, "bson")


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


def bench_bson(srv, a, tag=""):
    """Workloads 1 and 2 on ``srv`` (a ServerProcess or a Relay); channels ``bench-pub<tag>``, ``bench-fan<tag>``."""
    port = srv.ports["bson"]
    out = {}
    c0 = srv.cpu_seconds()
    dt = pipelined_publish(port, "bench-pub" + tag, a.n, a.size, a.depth)
    cpu = srv.cpu_seconds() - c0
    out["bson_pub"] = (a.n / dt, cpu / a.n * 1e6)

    ready = threading.Semaphore(0)
    results = []
    threads = [threading.Thread(target=subscriber, args=(port, "bench-fan" + tag, a.n, ready, results), daemon=True)
               for _ in range(a.subscribers)]
    # the channel must exist before subscribing to "new events only"
    s = connect(port)
    s.sendall(bson.encode({"type": "CREATECHANNEL", "frame": {"name": "bench-fan" + tag, "rID": 1}}))
    count_frames(s, 1)
    s.close()
    for t in threads:
        t.start()
    for _ in threads:
        ready.acquire()
    c0 = srv.cpu_seconds()
    t0 = time.perf_counter()
    pipelined_publish(port, "bench-fan" + tag, a.n, a.size, a.depth)
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


def bson_consume(srv, a, tag=""):
    """One BSON subscriber reading the pipelined-PUB channel from the start (the RECEV path alone)."""
    port = srv.ports["bson"]
    c0 = srv.cpu_seconds()
    t0 = time.perf_counter()
    s = connect(port)
    s.sendall(bson.encode({"type": "SUBSCRIBE", "frame": {"channel": "bench-pub" + tag, "rID": 1,
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


def _ratio(ours, theirs):
    # a short run can read 0 s of CPU (clock ticks of 10 ms)
    return f"{ours / theirs:.2f}" if theirs else "n/a"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--depth", type=int, default=1000)
    ap.add_argument("--subscribers", type=int, default=2)
    ap.add_argument("--fsync", default="never")
    ap.add_argument("--rounds", type=int, default=1, help="relay/riverbed rounds of workloads 1 and 2 (best kept)")
    ap.add_argument("--no-rmq", action="store_true", help="skip the RECEV-from-start and RabbitMQ Stream rows")
    ap.add_argument("--relay", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.relay:
        relay_main()
        return
    rounds = {"relay": [], "riverbed": []}
    with tempfile.TemporaryDirectory() as d:
        relay = Relay()
        try:
            srv = ServerProcess(os.path.join(d, "data"), "--bson-port", "0", "--fsync", a.fsync).start()
        except BaseException:
            relay.stop()
            raise
        try:
            for r in range(a.rounds):
                for label, target in (("relay", relay), ("riverbed", srv)):
                    got = bench_bson(target, a, tag=f"-{r}")
                    rounds[label].append(got)
                    print(f"round {r} {label:8s} " + "   ".join(f"{k} {v[0]:,.0f}/s {v[1]:.2f} us"
                                                             for k, v in got.items()), flush=True)
            res = {}
            if not a.no_rmq:
                res.update(bson_consume(srv, a, tag="-0"))
                res.update(asyncio.run(bench_rmq(srv, a)))
        except BaseException:
            print(srv.log()[-5000:], file=sys.stderr)
            raise
        finally:
            relay.stop()
            code = srv.stop()

    def best(rows, k):        # the best rate and the lowest CPU per event over the rounds
        return max(x[k][0] for x in rows), min(x[k][1] for x in rows)
    print(f"{a.n:,} events of {a.size} B, fsync={a.fsync}, PUB pipeline depth {a.depth}, "
          f"{a.subscribers} fan-out subscribers, {a.rounds} round(s), best of each; server exit {code}")
    labels = {
        "bson_pub": "BSON pipelined PUB",
        "bson_fanout": f"BSON PUB->RECEV x{a.subscribers} (deliveries/s)",
    }
    print(f"{'workload':<36}{'relay ev/s':>12}{'riverbed':>11}{'ratio':>7}   {'relay us/ev':>11}{'riverbed':>9}"
          f"{'ratio':>7}")
    for k, label in labels.items():
        (r_rate, r_cpu), (v_rate, v_cpu) = best(rounds["relay"], k), best(rounds["riverbed"], k)
        res[k] = (v_rate, v_cpu)
        print(f"{label:<36}{r_rate:>12,.0f}{v_rate:>11,.0f}{_ratio(v_rate, r_rate):>7s}   {r_cpu:>11.2f}{v_cpu:>9.2f}"
              f"{_ratio(v_cpu, r_cpu):>7s}")
    print("(goal, issue 26: riverbed >= 1.0x the relay's rate at <= 1.0x its CPU per event; riverbed stores "
          "every event, the relay none)")
    if a.no_rmq:
        return
    print(f"{'riverbed workload':<36}{'events/s':>12}{'server CPU us/event':>22}")
    labels.update({
        "bson_consume": "BSON RECEV from start (1 sub)",
        "rmq_pub": "RabbitMQ Stream publish (rstream)",
        "rmq_consume": "RabbitMQ Stream consume (rstream)",
    })
    for k, label in labels.items():
        rate, cpu = res[k]
        print(f"{label:<36}{rate:>12,.0f}{cpu:>22.2f}")
    print(f"ratios: PUB rate BSON/RMQ {res['bson_pub'][0] / res['rmq_pub'][0]:.2f}, "
          f"PUB CPU/event BSON/RMQ {res['bson_pub'][1] / res['rmq_pub'][1]:.2f}, "
          f"RECEV CPU/event vs RMQ consume {res['bson_consume'][1] / res['rmq_consume'][1]:.2f}")
    print("(fan-out CPU per event counts each published event and each delivery as one event)")


if __name__ == "__main__":
    main()

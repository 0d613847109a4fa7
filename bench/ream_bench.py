"""REAM text benchmark against a local ``riverbed serve --ream-port 0`` (issue 15) and a bare line relay.

The bare relay (``--relay`` mode of this script, its own process; issue 26) is asyncio (uvloop when
installed): it parses ``EVENT PUBLISH <stream> <size>`` and the payload, answers ``EVENT PUBLISHED
<stream> <id>`` and forwards the payload as the REAM delivery ``EVENT <stream> <id> <size>`` line to each
subscriber, writing once per read; no storage, no JSON check, no auth. The pipelined publish and a live
publish -> deliver run (one subscriber subscribed first) go to both in the same run, and the ratios
riverbed/relay of rate and server CPU per event are printed (goal: >= 1.0x the rate at <= 1.0x the CPU).

Measures, in one run:

* pipelined ``EVENT PUBLISH`` of 100-byte JSON events (one connection, at most WINDOW unanswered),
  events/s and server CPU µs per event (utime+stime from /proc);
* delivery of all of them to one ``EVENT SUBSCRIBE <stream> 1`` subscriber, events/s and CPU µs/event;
* ``PROJECTION SELECT`` of an equality on an indexed (``*``) field returning 10 of ROWS rows, against the
  same expression on a plain field: median round-trip latency of each and their ratio.

    .venv/bin/python bench/ream_bench.py [--events 300000] [--rows 100000] [--window 20000] [--rounds 1]
        [--relay-only]

Goals (issue 15): >= 80k events/s published; indexed SELECT <= 2 ms and >= 50x faster than unindexed.
"""

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, ROOT)
from bench._relay import RelayProcess, serve_forever  # noqa: E402
from procs import ServerProcess  # noqa: E402


# ------------------------------------------------------------------------------------------ relay

class _RelayConn(asyncio.Protocol):
    """One connection of the bare relay (an asyncio protocol); ``streams`` maps a name to [next id, subscribers]."""

    def __init__(self, streams):
        self.streams = streams
        self.buf = b""
        self.out = []
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.write(b"REAM 1.0\n")

    def connection_lost(self, exc):
        for st in self.streams.values():
            st[1].discard(self)

    def data_received(self, data):
        buf = self.buf + data if self.buf else data
        pos, end = 0, len(buf)
        touched = {self}
        while True:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            words = buf[pos:nl].split()
            if len(words) == 4 and words[0] == b"EVENT" and words[1] == b"PUBLISH":
                size = int(words[3])
                if nl + 2 + size > end:
                    break
                body = buf[nl + 1:nl + 1 + size]
                pos = nl + 2 + size
                name = words[2]
                st = self.streams.get(name)
                if st is None:
                    st = self.streams[name] = [1, set()]
                eid = st[0]
                st[0] = eid + 1
                if st[1]:
                    line = b"EVENT %s %d %d\n%s\n" % (name, eid, size, body)
                    for conn in st[1]:
                        conn.out.append(line)
                        touched.add(conn)
                self.out.append(b"EVENT PUBLISHED %s %d\n" % (name, eid))
                continue
            pos = nl + 1
            if len(words) == 4 and words[0] == b"EVENT" and words[1] == b"SUBSCRIBE":
                st = self.streams.setdefault(words[2], [1, set()])
                st[1].add(self)
                self.out.append(b"EVENT SUBSCRIBED %s EMPTY\n" % words[2])
            else:
                self.out.append(b"NON %s unknown\n" % b" ".join(words[:2]))
        self.buf = buf[pos:]
        for conn in touched:
            if conn.out:
                conn.transport.write(b"".join(conn.out))
                conn.out.clear()


def relay_main():
    """The bare relay's process: prints ``listening ream 127.0.0.1:<port>``, then serves until killed."""
    streams = {}

    async def start():
        server = await asyncio.get_running_loop().create_server(lambda: _RelayConn(streams), "127.0.0.1", 0)
        return server.sockets[0].getsockname()[1]
    serve_forever(start, "ream")


def Relay():
    """The bare relay as a child process (bench._relay.RelayProcess)."""
    return RelayProcess(__file__, "ream")


# ----------------------------------------------------------------------------------------- clients

class Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.line()

    def line(self):
        while b"\n" not in self.buf:
            self.buf += self.sock.recv(1 << 20)
        i = self.buf.index(b"\n")
        out = bytes(self.buf[:i])
        del self.buf[:i + 1]
        return out

    def sized(self):
        head = self.line()
        n = int(head.rsplit(b" ", 1)[1])
        while len(self.buf) < n + 1:
            self.buf += self.sock.recv(1 << 20)
        body = bytes(self.buf[:n])
        del self.buf[:n + 1]
        return head, body

    def count_lines(self, n, until=None):
        """Read until ``n`` newlines arrived (replies are one line each)."""
        seen = self.buf.count(b"\n")
        self.buf.clear()
        while seen < n:
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError
            seen += data.count(b"\n")
            if until is not None:
                until(seen)
        return seen


def event(i):
    body = json.dumps({"i": i, "pad": ""}, separators=(",", ":"))
    return json.dumps({"i": i, "pad": "x" * (100 - len(body))}, separators=(",", ":")).encode()


def bench_publish(srv, port, n, window, stream="bench_events"):
    reqs = [b"EVENT PUBLISH %s %d\n%s\n" % (stream.encode(), len(e), e) for e in (event(i) for i in range(n))]
    assert len(event(0)) == 100
    c = Conn(port)
    answered = [0]
    lock = threading.Condition()

    def progress(seen):
        with lock:
            answered[0] = seen
            lock.notify()

    def send():
        sent = 0
        step = 2000
        while sent < n:
            with lock:
                while sent - answered[0] > window:
                    lock.wait()
            c.sock.sendall(b"".join(reqs[sent:sent + step]))
            sent += step
    cpu0 = srv.cpu_seconds()
    t0 = time.perf_counter()
    th = threading.Thread(target=send)
    th.start()
    c.count_lines(n, progress)
    dt = time.perf_counter() - t0
    cpu = srv.cpu_seconds() - cpu0
    th.join()
    c.sock.close()
    return n / dt, cpu / n * 1e6, stream


def bench_live(srv, port, n, window, stream):
    """Publish -> deliver with one subscriber subscribed first: events/s until the subscriber has all ``n``
    (timed from the first publish) and server CPU us per published event."""
    warm = Conn(port)
    e = event(0)
    warm.sock.sendall(b"EVENT PUBLISH %s %d\n%s\n" % (stream.encode(), len(e), e))   # the stream exists
    warm.line()
    warm.sock.close()
    sub = Conn(port)
    sub.sock.sendall(b"EVENT SUBSCRIBE %s 2\n" % stream.encode())
    sub.line()
    done = []
    th = threading.Thread(target=lambda: done.append((sub.count_lines(2 * n), time.perf_counter())))
    cpu0 = srv.cpu_seconds()
    t0 = time.perf_counter()
    th.start()
    bench_publish(srv, port, n, window, stream)
    th.join(300)
    cpu = srv.cpu_seconds() - cpu0
    sub.sock.close()
    if not done:
        raise RuntimeError("the subscriber did not get every event")
    return n / (done[0][1] - t0), cpu / n * 1e6


def bench_deliver(srv, port, stream, n):
    c = Conn(port)
    cpu0 = srv.cpu_seconds()
    t0 = time.perf_counter()
    c.sock.sendall(b"EVENT SUBSCRIBE %s 1\n" % stream.encode())
    c.count_lines(1 + 2 * n)           # SUBSCRIBED, then a header line and a payload line per event
    dt = time.perf_counter() - t0
    cpu = srv.cpu_seconds() - cpu0
    c.sock.close()
    return n / dt, cpu / n * 1e6


def bench_select(port, rows, indexed_runs=300, plain_runs=7):
    c = Conn(port)
    c.sock.sendall(b"PROJECTION CREATE bench_rows 4 +id *grp pgrp note\n")
    assert c.line() == b"PROJECTION CREATED bench_rows", "projection exists: use a fresh data dir"
    t0 = time.perf_counter()
    step = 5000
    for start in range(0, rows, step):
        parts = []
        for i in range(start, min(rows, start + step)):
            doc = json.dumps({"id": i, "grp": i // 10, "pgrp": i // 10, "note": "row %d" % i}).encode()
            parts.append(b"PROJECTION SET bench_rows %d\n%s\n" % (len(doc), doc))
        c.sock.sendall(b"".join(parts))
        c.count_lines(len(parts))
    load_rate = rows / (time.perf_counter() - t0)

    def timed(field, runs):
        out = []
        for k in range(runs):
            g = (k * 7919) % (rows // 10)
            e = b"%s = %d" % (field, g)
            t = time.perf_counter()
            c.sock.sendall(b"PROJECTION SELECT bench_rows %d\n%s\n" % (len(e), e))
            head, body = c.sized()
            out.append(time.perf_counter() - t)
            assert len(json.loads(body)) == 10, (head, body[:200])
        return statistics.median(out) * 1e3
    timed(b"grp", 20)   # warm-up
    idx = timed(b"grp", indexed_runs)
    plain = timed(b"pgrp", plain_runs)
    c.sock.close()
    return load_rate, idx, plain


def _ratio(ours, theirs):
    # a short run can read 0 s of CPU (clock ticks of 10 ms)
    return f"{ours / theirs:.2f}" if theirs else "n/a"


def relay_rounds(relay, srv, a):
    """The pipelined publish and the live publish -> deliver on the relay and riverbed, ``a.rounds`` times;
    prints each and the best of each side with the ratios."""
    rows = {}
    for r in range(a.rounds):
        for label, target in (("relay", relay), ("riverbed", srv)):
            port = target.ports["ream"]
            rate, cpu, _ = bench_publish(target, port, a.events, a.window, f"relay_pub_{r}")
            lrate, lcpu = bench_live(target, port, a.events, a.window, f"relay_live_{r}")
            rows.setdefault(("publish", label), []).append((rate, cpu))
            rows.setdefault(("live", label), []).append((lrate, lcpu))
            print(f"round {r} {label:8s} publish {rate:10,.0f} events/s {cpu:6.2f} us/event   "
                  f"publish->deliver {lrate:10,.0f} events/s {lcpu:6.2f} us/event", flush=True)
    print(f"{'workload (best of rounds)':<30}{'relay ev/s':>12}{'riverbed':>11}{'ratio':>7}   {'relay us/ev':>11}"
          f"{'riverbed':>9}{'ratio':>7}")
    for wl, label in (("publish", "pipelined EVENT PUBLISH"), ("live", "publish -> 1 live subscriber")):
        best = [(max(x[0] for x in rows[wl, s]), min(x[1] for x in rows[wl, s])) for s in ("relay", "riverbed")]
        (r_rate, r_cpu), (v_rate, v_cpu) = best
        print(f"{label:<30}{r_rate:>12,.0f}{v_rate:>11,.0f}{_ratio(v_rate, r_rate):>7s}   {r_cpu:>11.2f}{v_cpu:>9.2f}"
              f"{_ratio(v_cpu, r_cpu):>7s}")
    print("(goal, issue 26: riverbed >= 1.0x the relay's rate at <= 1.0x its CPU per event; riverbed stores "
          "every event, the relay none)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--window", type=int, default=20_000, help="publishes in flight at most")
    ap.add_argument("--fsync", default="batch")
    ap.add_argument("--rounds", type=int, default=1, help="relay/riverbed rounds")
    ap.add_argument("--relay-only", action="store_true", help="only the rows against the bare relay")
    ap.add_argument("--relay", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.relay:
        relay_main()
        return
    with tempfile.TemporaryDirectory(prefix="ream-bench-") as d:
        relay = Relay()
        try:
            srv = ServerProcess(os.path.join(d, "data"), "--ream-port", "0", "--fsync", a.fsync).start()
        except BaseException:
            relay.stop()
            raise
        try:
            print(f"{a.events:,} events of 100 B JSON, window {a.window}, riverbed fsync={a.fsync}")
            relay_rounds(relay, srv, a)
            if a.relay_only:
                return
            port = srv.ports["ream"]
            rate, cpu_pub, stream = bench_publish(srv, port, a.events, a.window)
            print(f"publish   {a.events} x 100 B JSON, pipelined: {rate:10,.0f} events/s   server CPU "
                  f"{cpu_pub:6.1f} us/event   (goal >= 80,000/s: {'ok' if rate >= 80_000 else 'MISSED'})")
            drate, cpu_del = bench_deliver(srv, port, stream, a.events)
            print(f"deliver   {a.events} to one subscriber:    {drate:10,.0f} events/s   server CPU "
                  f"{cpu_del:6.1f} us/event")
            load, idx, plain = bench_select(port, a.rows)
            print(f"load      {a.rows} PROJECTION SET rows:     {load:10,.0f} rows/s")
            print(f"select    indexed  *grp = N  (10 of {a.rows}): median {idx:8.3f} ms   "
                  f"(goal <= 2 ms: {'ok' if idx <= 2 else 'MISSED'})")
            print(f"select    plain    pgrp = N  (10 of {a.rows}): median {plain:8.3f} ms")
            print(f"ratio     unindexed / indexed: {plain / idx:8.1f}x   (goal >= 50x: "
                  f"{'ok' if plain / idx >= 50 else 'MISSED'})")
        finally:
            relay.stop()
            srv.stop()


if __name__ == "__main__":
    main()

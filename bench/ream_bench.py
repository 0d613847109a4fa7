"""REAM text benchmark against a local ``riverbed serve --ream-port 0`` (issue 15).

Measures, in one run:

* pipelined ``EVENT PUBLISH`` of 100-byte JSON events (one connection, at most WINDOW unanswered),
  events/s and server CPU µs per event (utime+stime from /proc);
* delivery of all of them to one ``EVENT SUBSCRIBE <stream> 1`` subscriber, events/s and CPU µs/event;
* ``PROJECTION SELECT`` of an equality on an indexed (``*``) field returning 10 of ROWS rows, against the
  same expression on a plain field: median round-trip latency of each and their ratio.

    .venv/bin/python bench/ream_bench.py [--events 300000] [--rows 100000] [--window 20000]

Goals (issue 15): >= 80k events/s published; indexed SELECT <= 2 ms and >= 50x faster than unindexed.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
from procs import ServerProcess  # noqa: E402


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


def bench_publish(srv, port, n, window):
    stream = "bench_events"
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--window", type=int, default=20_000, help="publishes in flight at most")
    ap.add_argument("--fsync", default="batch")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ream-bench-") as d:
        srv = ServerProcess(os.path.join(d, "data"), "--ream-port", "0", "--fsync", a.fsync).start()
        try:
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
            srv.stop()


if __name__ == "__main__":
    main()

"""Regression guard for the one-message publish path, in process: ``make bench`` prints it.

One RabbitMQ Stream session (the real :class:`RmqStreamSession`, the real Broker and Engine in a temp
dir, a real uvloop event loop) is fed Publish frames of one 100-byte message each, as rbfly's ``send``
and rstream's ``send_wait`` produce them, and each waits for its PublishConfirm before the next: the
stop-and-wait path every other shell's one-event publish takes too. No sockets and no client process, so
what it prints is the broker's own cost, free of loopback and client noise:

- confirm latency p50 / p99 (µs): from handing the frame to the session to the confirm being written;
- CPU per message (µs): the process's user+system time over the timed part (every thread, the writer
  included) divided by the messages.

For fsync ``never`` and ``batch``. A change that slows the path shows as a larger figure here first;
the full side-by-side rows are ``make bench-compare``'s.

Reference, 20,000 messages, this 2-core VM with other work running (2026-11-22, two alternating runs):
before the inline commit (bc26e76) fsync=never p50 43-58 µs, 55-60 µs CPU/msg; with it, p50 19 µs,
20-24 µs CPU/msg. fsync=batch p50 272-319 µs either way (the fsync itself; an LMDB commit with a sync
costs ~160 µs here and a bare fdatasync ~340 µs).
2026-11-26, the one-message path beside the general one (RmqStreamSession._publish_alone): fsync=never
p50 22.9 µs, 26.5 µs CPU/msg at load 10-13 (no quiet window was left to time it against the old path);
the comparison that holds is the instruction count (bench.onemsg_profile --tool callgrind): 121,873 ->
81,926 per message for this client shape, 139,164 -> 96,541 for rbfly's named publisher.

After the table it measures the fsync floor in the same run (``bench/fsync_floor.py``: a bare LMDB
commit with a sync, on the same filesystem) and prints fsync=batch's p50 against it: issue 26's goal is
<= 2x that floor.

    .venv/bin/python -m bench.bench_publish [--messages 20000] [--fsync never,batch] [--floor-commits 2000]
"""

import argparse
import asyncio
import os
import resource
import shutil
import struct
import sys
import tempfile
import time

from rstream import schema
from rstream.encoding import encode_frame, encode_publish

from bench import fsync_floor
from riverbed.engine import Engine
from riverbed.shells import rmq_stream as rs
from riverbed.shells.broker import Broker

KEY_PUBLISH_CONFIRM = 0x0003


class _CaptureIO:
    """A session's ``io`` that resolves ``waiter`` when a PublishConfirm is written."""

    def __init__(self, loop):
        self.loop = loop
        self.waiter = None
        self.out = bytearray()
        self.confirms = 0

    def _seen(self, data):
        self.out += data
        while len(self.out) >= 6:
            n = struct.unpack_from(">I", self.out)[0]
            if len(self.out) < 4 + n:
                return
            key = struct.unpack_from(">H", self.out, 4)[0] & 0x7FFF
            del self.out[:4 + n]
            if key == KEY_PUBLISH_CONFIRM:
                self.confirms += 1
                w, self.waiter = self.waiter, None
                if w is not None and not w.done():
                    w.set_result(None)

    def write(self, data):
        self._seen(data)

    def writelines(self, parts):
        for p in parts:
            self._seen(p)

    def close(self):
        pass

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def defer(self, fn, *args):
        self.loop.call_soon(fn, *args)


def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _request(session, io, frame):
    session.data_received(encode_frame(frame, 1))
    for _ in range(100):
        await asyncio.sleep(0.001)


async def run_one(fsync, n, warmup=500):
    loop = asyncio.get_running_loop()
    tmp = tempfile.mkdtemp(prefix="rb-bench-publish-")
    eng = Engine(os.path.join(tmp, "data"), fsync=fsync, retention_interval=0)
    broker = Broker(eng, post=loop.call_soon_threadsafe, post_local=loop.call_soon, data_dir=os.path.join(tmp, "data"))
    shell = rs.RmqShell(broker)
    io = _CaptureIO(loop)
    s = rs.RmqStreamSession(shell, io, peer="bench", local_host="127.0.0.1", peer_loopback=True)
    try:
        s.data_received(encode_frame(schema.PeerProperties(1, []), 1))
        s.data_received(encode_frame(schema.SaslHandshake(2), 1))
        s.data_received(encode_frame(schema.SaslAuthenticate(3, "PLAIN", b"\0guest\0guest"), 1))
        s.data_received(encode_frame(schema.Tune(1048576, 0), 1))
        s.data_received(encode_frame(schema.Open(4, "/"), 1))
        await _request(s, io, schema.Create(5, "bench", []))
        await _request(s, io, schema.DeclarePublisher(6, 1, "", "bench"))
        body = b"x" * 100
        frames = [encode_publish(schema.Publish(1, [schema.Message(i + 1, None, body)]), 1)
                  for i in range(n + warmup)]
        lat = []
        for i, frame in enumerate(frames):
            if i == warmup:
                cpu0, wall0 = _cpu(), time.perf_counter()
            fut = io.waiter = loop.create_future()
            t0 = time.perf_counter_ns()
            s.data_received(frame)
            await fut
            lat.append(time.perf_counter_ns() - t0)
        cpu = _cpu() - cpu0
        wall = time.perf_counter() - wall0
        lat = sorted(lat[warmup:])
        return {"fsync": fsync, "n": n, "p50_us": lat[len(lat) // 2] / 1000,
                "p99_us": lat[int(len(lat) * 0.99)] / 1000, "cpu_us": cpu / n * 1e6, "rate": n / wall}
    finally:
        s.connection_lost()
        broker.close()
        eng.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--fsync", default="never,batch")
    ap.add_argument("--floor-commits", type=int, default=2000, help="fsync floor: synced commits (0: skip)")
    a = ap.parse_args(argv)
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    print(f"one-message publish path, in process (RmqStreamSession -> Broker -> Engine), "
          f"{a.messages:,} x 100 B, each confirmed before the next")
    print(f"{'fsync':<7} {'p50 µs':>8} {'p99 µs':>8} {'CPU µs/msg':>11} {'msgs/s':>9}")
    rows = {}
    for fsync in a.fsync.split(","):
        r = rows[fsync] = runner(run_one(fsync, a.messages))
        print(f"{fsync:<7} {r['p50_us']:>8.1f} {r['p99_us']:>8.1f} {r['cpu_us']:>11.1f} {r['rate']:>9,.0f}")
        sys.stdout.flush()
    if a.floor_commits > 0:
        floor = fsync_floor.measure(a.floor_commits)
        print(f"{'floor':<7} {floor['p50_us']:>8.1f} {floor['p99_us']:>8.1f}   (bare LMDB commit with sync, "
              f"{a.floor_commits:,} commits: bench/fsync_floor.py)")
        if "batch" in rows:
            ratio = rows["batch"]["p50_us"] / floor["p50_us"]
            print(f"fsync=batch confirm p50 / fsync floor p50: {ratio:.2f}x  (goal <= 2x: "
                  f"{'met' if ratio <= 2 else 'MISSED'})")


if __name__ == "__main__":
    main()

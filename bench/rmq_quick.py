"""Quick RabbitMQ Stream benchmark: rstream against a local ``riverbed serve``.

Publishes N messages of SIZE bytes with confirms (``send_batch``, BATCH messages per Publish frame,
at most WINDOW unconfirmed messages), then consumes them all from the first offset, and prints msgs/s
both ways and the server's CPU seconds per million messages (utime+stime from /proc; on 2 cores the
Python client, not the broker, is the bottleneck, so the CPU figure is the one to compare).

    .venv/bin/python bench/rmq_quick.py [--messages 1000000] [--size 100] [--batch 5000]
        [--fsync batch] [--port PORT]   # --port: use an already running broker instead of starting one

Reference (same client, this machine): RabbitMQ 3.10.8 took in ~279k msgs/s, delivered 689k msgs/s,
~1.9 us broker CPU per published message.
"""

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

# every listener but RabbitMQ Stream off: two servers of one run must not fight over default ports
OTHER_LISTENERS_OFF = ("--bson-port", "off", "--zmq-port", "off", "--ws-port", "off", "--ream-port", "off",
                       "--http-port", "off", "--kafka-port", "off")
LISTEN_RE = re.compile(r"listening stream (\S+):(\d+)")


def start_server(data_dir, fsync):
    cmd = [sys.executable, "-m", "riverbed.shells.cli", "serve", "--data-dir", data_dir, "--stream-port", "0",
           *OTHER_LISTENERS_OFF, "--fsync", fsync]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    port = None
    ready = threading.Event()
    lines = []

    def read():
        nonlocal port
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            lines.append(line)
            m = LISTEN_RE.search(line)
            if m:
                port = int(m.group(2))
            if line.endswith(" ready"):
                ready.set()
        ready.set()
    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(30) or port is None:
        proc.kill()
        raise SystemExit("server did not start:\n" + "\n".join(lines))
    return proc, port


def cpu_seconds(pid):
    if pid is None:
        return float("nan")
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def publish(port, stream, n, size, batch, window):
    payload = b"x" * size
    confirmed = 0
    sent = 0
    done = asyncio.Event()
    room = asyncio.Event()

    def on_confirm(status):
        nonlocal confirmed
        confirmed += 1
        if sent - confirmed <= window:
            room.set()
        if confirmed >= n:
            done.set()

    async with Producer("127.0.0.1", port, username="guest", password="guest") as p:
        await p.create_stream(stream, exists_ok=True)
        t0 = time.perf_counter()
        while sent < n:
            while sent - confirmed > window:
                room.clear()
                await room.wait()
            k = min(batch, n - sent)
            sent += k
            await p.send_batch(stream, [payload] * k, on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 600)
        return time.perf_counter() - t0


async def consume(port, stream, n):
    got = 0
    done = asyncio.Event()
    t0 = None

    async def on_message(msg, ctx):
        nonlocal got, t0
        if t0 is None:
            t0 = time.perf_counter()
        got += 1
        if got >= n:
            done.set()

    async with Consumer("127.0.0.1", port, username="guest", password="guest") as c:
        start = time.perf_counter()
        await c.subscribe(stream, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
                          initial_credit=10)
        await asyncio.wait_for(done.wait(), 600)
        return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=5000, help="messages per send_batch (Publish frame)")
    ap.add_argument("--window", type=int, default=50_000, help="unconfirmed messages allowed in flight")
    ap.add_argument("--fsync", default="batch")
    ap.add_argument("--port", type=int, help="benchmark an already running broker (no CPU figures)")
    args = ap.parse_args()

    proc = None
    tmp = None
    if args.port:
        port, pid = args.port, None
    else:
        tmp = tempfile.TemporaryDirectory(prefix="rmq-bench-")
        proc, port = start_server(os.path.join(tmp.name, "data"), args.fsync)
        pid = proc.pid
    stream = f"bench-{int(time.time())}"
    try:
        cpu0 = cpu_seconds(pid)
        pub_s = asyncio.run(publish(port, stream, args.messages, args.size, args.batch, args.window))
        cpu1 = cpu_seconds(pid)
        con_s = asyncio.run(consume(port, stream, args.messages))
        cpu2 = cpu_seconds(pid)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        if tmp is not None:
            tmp.cleanup()
    m = args.messages / 1e6
    print(f"messages: {args.messages:,} x {args.size} B, batch {args.batch}, fsync {args.fsync}")
    print(f"publish (confirmed): {args.messages / pub_s:>10,.0f} msgs/s  ({pub_s:.2f} s)")
    print(f"consume:             {args.messages / con_s:>10,.0f} msgs/s  ({con_s:.2f} s)")
    if pid is not None:
        print(f"server CPU publish:  {(cpu1 - cpu0) / m:.2f} s per million messages "
              f"({(cpu1 - cpu0) / args.messages * 1e6:.2f} us/msg)")
        print(f"server CPU consume:  {(cpu2 - cpu1) / m:.2f} s per million messages "
              f"({(cpu2 - cpu1) / args.messages * 1e6:.2f} us/msg)")


if __name__ == "__main__":
    main()

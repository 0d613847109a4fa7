"""Where the one-message path's time goes (issue 26): a server driven stop-and-wait, one message per frame,
by the load generator's client (``bench._loadgen.send_wait``), under a tool that counts what the server does
for the timed messages only.

Servers (``--target``):

- ``riverbed``: ``riverbed serve --fsync never`` (every listener but RabbitMQ Stream off) on a fresh data
  directory; one stream, one publisher without a reference, Publish frames of one ``--size``-byte message
  (``--client rbfly``: rbfly's ``PublisherBin.send`` instead, a named publisher, as the rbfly rows);
  With ``--prefill N``, first N messages are published in frames of 5,000 to another stream, which is
  then deleted and purged (the server idle again) before anything is timed: the state of a long-running
  server, whose LMDB free list holds the pages of the streams it deleted (``bench.compare`` runs every
  row on a fresh stream that it deletes after);
- ``echo``: the bare uvloop echo server of ``bench.loop_floor``, sent ``--size`` + 20 bytes (a Publish
  frame's size) and echoing them: the floor the first is judged against.

Tools (``--tool``):

- ``cpu``: none; the server's utime+stime (/proc) per message, and the client's round trip p50/p99;
- ``callgrind``: ``valgrind --tool=callgrind --instr-atstart=no``, collection switched on with
  ``callgrind_control -i on`` for the timed messages only: instructions per message, which do not move with
  the machine's load (the profile is kept with ``--out``; read it with ``callgrind_annotate``);
- ``strace``: ``strace -c -f`` attached for the timed messages: system calls per message;
- ``pyspy``: ``py-spy record --native`` over the timed messages, folded stacks into ``--out``;
- ``perf``: ``perf record -g`` of the server (kernel included) over the timed messages, into ``--out``
  (``perf report -i OUT --no-children --sort dso,sym``).

    .venv/bin/python -m bench.onemsg_profile --target riverbed --tool callgrind --messages 20000
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types

from bench import _loadgen
from bench._client import proc_cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LISTEN_RE = re.compile(r"listening stream (\S+):(\d+)")
OTHER_LISTENERS_OFF = ("--bson-port", "off", "--zmq-port", "off", "--ws-port", "off", "--ream-port", "off",
                       "--http-port", "off", "--kafka-port", "off")
LEN_PUBLISH_OVER_BODY = 25      # size 4, key 2, version 2, publisher 1, count 4, id 8, entry length 4


class Server:
    """The server process (under the tool's wrapper), its port and its stop."""

    def __init__(self, target, wrap, startup):
        self.tmp = tempfile.mkdtemp(prefix="rb-onemsg-")
        if target == "riverbed":
            cmd = [sys.executable, "-m", "riverbed.shells.cli", "serve", "--data-dir", os.path.join(self.tmp, "data"),
                   "--host", "127.0.0.1", "--stream-port", "0", *OTHER_LISTENERS_OFF, "--fsync", "never"]
        else:
            cmd = [sys.executable, "-m", "bench.loop_floor", "--serve"]
        self.proc = subprocess.Popen(wrap + cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd=ROOT, text=True)
        self.pid = self.proc.pid
        self.lines = []
        self.port = None
        ready = threading.Event()

        def read_err():
            for line in self.proc.stderr:
                self.lines.append(line.rstrip())
                m = LISTEN_RE.search(line)
                if m:
                    self.port = int(m.group(2))
                if line.rstrip().endswith(" ready"):
                    ready.set()
            ready.set()

        def read_out():
            first = self.proc.stdout.readline()
            if target == "echo" and first.strip().isdigit():
                self.port = int(first)
                ready.set()
            for _ in self.proc.stdout:
                pass

        threading.Thread(target=read_err, daemon=True).start()
        threading.Thread(target=read_out, daemon=True).start()
        if not ready.wait(startup) or self.port is None:
            self.stop()
            raise RuntimeError("the server did not start:\n" + "\n".join(self.lines[-30:]))

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()         # the echo server ends when its stdin closes
            except OSError:
                pass
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(600)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


def minor_faults(pid):
    """Minor page faults of the process so far (all its threads; /proc/PID/stat field 10)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[7])
    except (OSError, IndexError, ValueError):
        return 0


def riverbed_client(port, size):
    """A load-generator connection with a stream and a publisher; returns (conn, round trip)."""
    a = types.SimpleNamespace(host="127.0.0.1", port=port, stream="onemsg")
    conn = _loadgen._setup(a)
    frame = _loadgen.publish_frame(1, b"x" * size)
    return conn, lambda n, lat=None: _loadgen.send_wait(conn, n, frame, lat)


def rbfly_client(port, size):
    """rbfly's ``PublisherBin.send`` as ``bench.compare``'s publish-rbfly-raw-1 and latency-rbfly rows drive
    it (a named publisher: deduplication on), on an event loop of its own; returns (conn, round trip).
    The stream is made by a load-generator connection, kept open beside it."""
    import asyncio

    from rbfly.streams import streams_client
    from rbfly.streams._client import PublisherBin

    a = types.SimpleNamespace(host="127.0.0.1", port=port, stream="onemsg")
    setup = _loadgen._setup(a)
    loop = asyncio.new_event_loop()
    client = streams_client(f"rabbitmq-stream://guest:guest@127.0.0.1:{port}")
    ctx = client.publisher(a.stream, name=f"onemsg/{os.getpid()}", cls=PublisherBin)
    pub = loop.run_until_complete(ctx.__aenter__())
    body = b"x" * size
    clock = time.perf_counter_ns

    async def send(n, lat):
        for _ in range(n):
            t = clock()
            await pub.send(body)
            if lat is not None:
                lat.append(clock() - t)

    def close():
        loop.run_until_complete(ctx.__aexit__(None, None, None))
        loop.run_until_complete(client.disconnect())
        loop.close()
        setup.close()
    return types.SimpleNamespace(close=close), lambda n, lat=None: loop.run_until_complete(send(n, lat))


def prefill(port, n, size):
    """Publish ``n`` messages to a stream of their own, delete it, and wait until the server is idle."""
    a = types.SimpleNamespace(host="127.0.0.1", port=port, stream="onemsg-prefill")
    conn = _loadgen._setup(a)
    try:
        _loadgen.publish(conn, n, 5000, b"x" * size, 16)
    finally:
        conn.close()
    _loadgen._delete(a)


def wait_idle(pid, budget=600.0, busy=0.05):
    """Until ``pid`` used less than ``busy`` of a core over a second (the purge of a deleted stream done)."""
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        c0 = proc_cpu(pid)
        time.sleep(1.0)
        if proc_cpu(pid) - c0 < busy:
            return


def echo_client(port, size):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = b"x" * (size + LEN_PUBLISH_OVER_BODY)
    clock = time.perf_counter_ns

    def run(n, lat=None):
        for _ in range(n):
            t = clock()
            s.sendall(msg)
            got = 0
            while got < len(msg):
                got += len(s.recv(4096))
            if lat is not None:
                lat.append(clock() - t)
    return types.SimpleNamespace(close=s.close), run


def callgrind_total(path):
    """Instructions in one callgrind dump (its ``summary:`` or ``totals:`` line)."""
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", choices=("riverbed", "echo"), default="riverbed")
    ap.add_argument("--client", choices=("loadgen", "rbfly"), default="loadgen",
                    help="riverbed: the load generator's unnamed publisher (default) or rbfly's named one")
    ap.add_argument("--tool", choices=("cpu", "callgrind", "strace", "pyspy", "perf"), default="cpu")
    ap.add_argument("--messages", type=int, default=20000, help="timed messages (default 20,000)")
    ap.add_argument("--warmup", type=int, default=2000, help="untimed messages first (default 2,000)")
    ap.add_argument("--size", type=int, default=100, help="message body, bytes (default 100)")
    ap.add_argument("--prefill", type=int, default=0,
                    help="riverbed: messages published to another stream and deleted first (default 0)")
    ap.add_argument("--out", help="callgrind: the profile file; pyspy: the folded stacks; strace: the summary")
    a = ap.parse_args(argv)
    out = a.out or os.path.join(tempfile.gettempdir(), f"onemsg-{a.target}-{a.tool}-{os.getpid()}")
    wrap, startup = [], 60
    if a.tool == "callgrind":
        wrap = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        startup = 600
    srv = Server(a.target, wrap, startup)
    helper = None
    try:
        if a.prefill and a.target == "riverbed":
            prefill(srv.port, a.prefill, a.size)
            wait_idle(srv.pid)
        client = echo_client if a.target == "echo" else rbfly_client if a.client == "rbfly" else riverbed_client
        conn, run = client(srv.port, a.size)
        run(a.warmup)
        if a.tool == "callgrind":
            subprocess.run(["callgrind_control", "-i", "on", str(srv.pid)], check=True, capture_output=True)
        elif a.tool == "strace":
            helper = subprocess.Popen(["strace", "-c", "-f", "-o", out, "-p", str(srv.pid)],
                                      stderr=subprocess.DEVNULL)
            time.sleep(1.0)     # attached to every thread
        elif a.tool == "perf":
            helper = subprocess.Popen(["perf", "record", "-F", "4000", "-g", "-p", str(srv.pid), "-o", out],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        elif a.tool == "pyspy":
            pyspy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
            helper = subprocess.Popen([pyspy, "record", "-p", str(srv.pid), "-r", "500", "-f", "raw", "--native",
                                       "--threads", "-o", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        cpu0 = proc_cpu(srv.pid)
        flt0 = minor_faults(srv.pid)
        lat = []
        t0 = time.perf_counter()
        run(a.messages, lat)
        wall = time.perf_counter() - t0
        cpu = proc_cpu(srv.pid) - cpu0
        faults = minor_faults(srv.pid) - flt0
        if a.tool == "callgrind":
            # dump the timed part, then count an idle window of the same length: what the server does by
            # the clock (ticks, the writer's wake-ups), which valgrind's slowness stretches over each message
            subprocess.run(["callgrind_control", "-d", str(srv.pid)], check=True, capture_output=True)
            time.sleep(wall)
            subprocess.run(["callgrind_control", "-d", str(srv.pid)], check=True, capture_output=True)
            subprocess.run(["callgrind_control", "-i", "off", str(srv.pid)], check=True, capture_output=True)
        elif helper is not None:
            helper.send_signal(signal.SIGINT)
            helper.wait(120)
        conn.close()
    finally:
        srv.stop()
    lat.sort()
    n = a.messages
    print(f"{a.target} under {a.tool}: {n:,} messages of {a.size} B, one per frame, stop-and-wait"
          + (f", client {a.client}" if a.target == "riverbed" else "")
          + (f", after {a.prefill:,} published and deleted" if a.prefill and a.target == "riverbed" else "")
          + f"; load {os.getloadavg()[0]:.2f}")
    print(f"  server CPU {cpu / n * 1e6:.1f} µs/msg, round trip p50 {lat[n // 2] / 1e3:.0f} µs, "
          f"p99 {lat[int(n * 0.99)] / 1e3:.0f} µs, {n / wall:,.0f} msgs/s, {faults / n:.2f} minor faults/msg")
    if a.tool == "callgrind":
        timed, idle = callgrind_total(out + ".1"), callgrind_total(out + ".2")
        print(f"  callgrind: {timed:,} instructions over the timed messages, {timed / n:,.0f} per message; "
              f"an idle window as long: {idle:,}; the difference {(timed - idle) / n:,.0f} per message "
              f"(profiles: {out}.1, {out}.2)")
    elif a.tool == "strace":
        with open(out) as f:
            summary = f.read()
        print(summary)
        for line in summary.splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[-1] not in ("syscall", "total") and parts[3].isdigit():
                print(f"  {parts[-1]}: {int(parts[3]) / n:.2f} per message")
    elif a.tool == "pyspy":
        print(f"  py-spy folded stacks: {out}")
    elif a.tool == "perf":
        print(f"  perf data: {out} (perf report -i {out} --no-children --sort dso,sym)")


if __name__ == "__main__":
    main()

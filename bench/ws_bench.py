"""WebSocket JSON (Streamr v28) benchmark: ``riverbed serve --ws-port`` next to a bare aiohttp relay.

Two workloads, each against both servers in the same run, 100 B JSON messages:

* **echo**: one connection subscribes to a stream and publishes to it; publish -> broadcast end to end.
* **fanout**: one publisher connection and 10 subscriber connections; every subscriber gets every message.

The publisher keeps at most WINDOW messages in flight (counted on the first subscriber's receipts). The
bare relay (``--relay`` mode of this script, started as its own process) is what the issue compares
against: aiohttp, parse the publish, broadcast a v28 frame built once with ``json.dumps`` and sent with
``send_str`` to each subscriber, no storage. Riverbed stores every message (fsync policy ``batch``).
Printed: msgs/s (published messages per second, end to end), server CPU µs per published message
(utime+stime from /proc), and the ratios Riverbed/relay. The clients run in this process (aiohttp); on a
small machine they share the cores with the server, so the CPU figure is the one to compare.

    .venv/bin/python bench/ws_bench.py [--messages 20000] [--fanout-messages 10000] [--subscribers 10]
        [--window 1000] [--rounds 1]
"""

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, ROOT)
from bench._relay import RelayProcess, serve_forever  # noqa: E402

_BASE = {"sensor": "t-0001", "value": 21.5, "unit": "C", "pad": ""}
MSG = json.dumps(dict(_BASE, pad="x" * (100 - len(json.dumps(_BASE)))))      # 100 B of JSON
assert len(MSG) == 100


# ------------------------------------------------------------------------------------------ relay

def relay_main(port):
    """The bare relay: aiohttp, v28 broadcast frames, no storage, no auth, one partition per stream."""
    from aiohttp import WSMsgType, web
    subs = {}          # stream -> set of ws
    offsets = {}

    async def handler(request):
        ws = web.WebSocketResponse(compress=False)
        await ws.prepare(request)
        mine = set()
        try:
            async for m in ws:
                if m.type is not WSMsgType.TEXT:
                    continue
                req = json.loads(m.data)
                t = req.get("type")
                if t == "subscribe":
                    s = req["stream"]
                    subs.setdefault(s, set()).add(ws)
                    mine.add(s)
                    await ws.send_str(json.dumps([0, 2, "", {"stream": s, "partition": 0}]))
                elif t == "publish":
                    s = req["stream"]
                    msg = req["msg"]
                    json.loads(msg)
                    off = offsets.get(s, -1) + 1
                    offsets[s] = off
                    ts = req.get("ts") or int(time.time() * 1000)
                    frame = json.dumps([0, 0, "", [28, s, 0, ts, 0, off, off - 1 if off else None, 27, msg]])
                    for w in list(subs.get(s, ())):
                        await w.send_str(frame)
        finally:
            for s in mine:
                subs.get(s, set()).discard(ws)
        return ws

    async def start():
        app = web.Application()
        app.router.add_get("/api/v1/ws", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        return site._server.sockets[0].getsockname()[1]
    serve_forever(start, "ws")


def Relay():
    """The bare relay as a child process (bench._relay.RelayProcess)."""
    return RelayProcess(__file__, "ws")


class Riverbed:
    def __init__(self, data_dir):
        from procs import ServerProcess
        self.srv = ServerProcess(data_dir, "--ws-port", "0").start()
        self.port = self.srv.ports["ws"]

    def cpu_seconds(self):
        return self.srv.cpu_seconds()

    def stop(self):
        self.srv.stop()


# ----------------------------------------------------------------------------------------- clients

async def workload(port, stream, n, n_subs, window, separate_publisher):
    """Publish ``n`` messages; return seconds until every subscriber has all of them."""
    import aiohttp
    url = f"http://127.0.0.1:{port}/api/v1/ws"
    async with aiohttp.ClientSession() as session:
        subs = [await session.ws_connect(url, compress=0, max_msg_size=0) for _ in range(n_subs)]
        for ws in subs:
            await ws.send_str(json.dumps({"type": "subscribe", "stream": stream}))
            await ws.receive()
        pub = await session.ws_connect(url, compress=0) if separate_publisher else subs[0]
        counts = [0] * n_subs
        done = asyncio.Event()
        progress = asyncio.Event()

        async def reader(i, ws):
            while counts[i] < n:
                m = await ws.receive()
                if m.type != aiohttp.WSMsgType.TEXT:
                    raise RuntimeError(f"subscriber {i}: {m}")
                counts[i] += 1
                if i == 0:
                    progress.set()
            if all(c >= n for c in counts):
                done.set()

        req = json.dumps({"type": "publish", "stream": stream, "msg": MSG})
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(reader(i, ws)) for i, ws in enumerate(subs)]
        sent = 0
        while sent < n:
            while sent - counts[0] >= window:
                progress.clear()
                await progress.wait()
            burst = min(n - sent, window - (sent - counts[0]))
            for _ in range(burst):
                await pub.send_str(req)
            sent += burst
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - t0
        for t in tasks:
            t.cancel()
        for ws in subs + ([pub] if separate_publisher else []):
            await ws.close()
        return elapsed


def measure(server, name, n, n_subs, window, separate):
    stream = f"bench-{name}-{time.monotonic_ns()}"
    c0 = server.cpu_seconds()
    secs = asyncio.run(workload(server.port, stream, n, n_subs, window, separate))
    cpu = server.cpu_seconds() - c0
    return n / secs, cpu / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--fanout-messages", type=int, default=10000)
    ap.add_argument("--subscribers", type=int, default=10)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--relay", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.relay:
        relay_main(0)
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="ws-bench-") as tmp:
        relay = Relay()
        try:
            rb = Riverbed(os.path.join(tmp, "data"))
        except BaseException:
            relay.stop()
            raise
        try:
            for r in range(args.rounds):
                for wl, n, subs, sep in [("echo", args.messages, 1, False),
                                         ("fanout", args.fanout_messages, args.subscribers, True)]:
                    for label, srv in (("relay", relay), ("riverbed", rb)):
                        rate, us = measure(srv, f"{wl}{r}", n, subs, args.window, sep)
                        rows.append((wl, label, rate, us))
                        print(f"round {r} {wl:6s} {label:8s} {rate:10.0f} msgs/s  {us:7.1f} us server CPU/msg",
                              flush=True)
        finally:
            relay.stop()
            rb.stop()
    print()
    print(f"{'workload':8s} {'relay msgs/s':>13s} {'riverbed':>10s} {'ratio':>6s}   "
          f"{'relay us/msg':>12s} {'riverbed':>9s} {'ratio':>6s}")
    for wl in ("echo", "fanout"):
        rel = [x for x in rows if x[0] == wl and x[1] == "relay"]
        riv = [x for x in rows if x[0] == wl and x[1] == "riverbed"]
        best = lambda xs: (max(x[2] for x in xs), min(x[3] for x in xs))   # noqa: E731
        (r_rate, r_us), (v_rate, v_us) = best(rel), best(riv)
        print(f"{wl:8s} {r_rate:13.0f} {v_rate:10.0f} {v_rate / r_rate:6.2f}   {r_us:12.1f} {v_us:9.1f} "
              f"{v_us / r_us:6.2f}")


if __name__ == "__main__":
    main()

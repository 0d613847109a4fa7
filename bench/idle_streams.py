"""What a published message costs the server while it holds (or has just deleted) many idle streams.

    .venv/bin/python -m bench.idle_streams [--idle 0,1000,10000] [--records 10] [--then keep|delete]
                                           [--setup memory|plain] [--n 200000] [--settle 2]
                                           [--callgrind DIR] [--restart] [--max-ratio 1.10]

For each idle count K, a fresh ``riverbed serve`` (fsync=never, the RabbitMQ Stream and Kafka listeners,
as the bench's headline server) gets K idle streams made as the bench's memory row makes them
(``bench._client`` ``memory-rstream``: K streams created on one connection, a publisher and a consumer on
each over K/200 connection pairs, ``--records`` messages published to each and all delivered, the
connections closed), then with ``--then delete`` the K streams deleted again, as that row ends. Then two
rstream producers publish ``--n`` messages in all to two new streams, as the ``publish-2streams`` row does
(send_batch of 5,000, 16 batches in flight each), untimed first (one batch each), then timed.

Printed per K: the server's CPU per message over the timed part (schedstat, every thread; noisy on a
busy machine) and, with ``--callgrind DIR``, callgrind's instructions per message (the server runs under
``valgrind --tool=callgrind --instr-atstart=no``, collection switched on for the timed part only: the
figure does not move with the machine's load). ``--restart`` stops the server after the idle streams are
made and publishes to a new one on the same data directory (what is stored, without what the first
process kept in memory). A line at the end compares every K with the first; with ``--max-ratio R`` the
command fails (exit 1) when one is over R: the check that a message does not cost more with idle streams
(issue 26: publishing while the writer purged 10,000 just deleted streams, one transaction each after
every commit, cost 2.7× the CPU per message).

``--settle`` (2 s) is the pause between the idle streams and the publish: with ``--then delete`` the
writer is still purging the deleted streams' keys then, as it was when a bench row followed the memory
row.
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                                "integration"))
from procs import ServerProcess  # noqa: E402

from bench.produce_counts import counters  # noqa: E402

BATCH = 5_000
INFLIGHT = 16
CLIENTS = 2


def make_idle(port, k, records, then):
    """K idle streams as the memory row makes them (bench._client's w_memory_rstream), in this process."""
    if k <= 0:
        return 0.0
    from bench import _client
    a = types.SimpleNamespace(host="127.0.0.1", port=port, stream="idle", streams=k, connections=10, n=records,
                              keep_stream=(then == "keep"), server_pid=None)
    runner = _client.Runner.__new__(_client.Runner)
    runner.a = a
    runner.body = b"x" * 100
    runner.result = {}
    runner.wait_go = lambda: None
    runner.start = lambda: None
    runner.stop = lambda: None
    t0 = time.monotonic()
    import bench._procs as bp
    real = bp.rss_kb
    bp.rss_kb = lambda *_a, **_k: 0
    try:
        asyncio.run(runner.w_memory_rstream())
    finally:
        bp.rss_kb = real
    if runner.result.get("confirmed") != k * records or runner.result.get("received") != k * records:
        raise RuntimeError(f"idle streams: {runner.result}")
    return time.monotonic() - t0


def make_plain(port, k, records, then):
    """K idle streams made cheaply, for a server under valgrind: on one connection of the load generator
    (bench._loadgen), each stream created, then a publisher declared on it, one Publish frame of
    ``records`` messages and the publisher's deletion sent in one write and read back up to its
    confirm; no consumers. With
    ``then == "delete"`` the streams are deleted after, a request at a time."""
    if k <= 0:
        return 0.0
    from bench import _loadgen as lg
    from riverbed.shells.rmq_stream import codec
    from riverbed.shells.rmq_stream.constants import (
        CMD_CREATE, CMD_DECLARE_PUBLISHER, CMD_DELETE, CMD_DELETE_PUBLISHER, CMD_PUBLISH_CONFIRM, RESPONSE)
    t0 = time.monotonic()
    conn = lg.Conn("127.0.0.1", port)
    frame = lg.publish_frame(records, b"x" * 100)
    try:
        for i in range(k):
            name = codec.enc_string(f"idle-{i}")
            conn.request(CMD_CREATE, name + codec.enc_properties({}))
            # the publisher waits for the creation's answer (the broker would not know the stream yet)
            corr = conn.corr = conn.corr + 2
            out = (codec.frame(CMD_DECLARE_PUBLISHER, struct.pack(">IB", corr - 1, 0) + codec.enc_string("") + name)
                   + frame
                   + codec.frame(CMD_DELETE_PUBLISHER, struct.pack(">IB", corr, 0)))
            conn.sock.sendall(out)
            got = set()
            while len(got) < 3:
                key, body = conn.read_frame()
                if key in (RESPONSE | CMD_DECLARE_PUBLISHER, RESPONSE | CMD_DELETE_PUBLISHER):
                    if struct.unpack_from(">H", body, 4)[0] != lg.CODE_OK:
                        raise RuntimeError(f"idle stream {i}: command 0x{key:04x} refused: {body.hex()}")
                    got.add(key)
                elif key == CMD_PUBLISH_CONFIRM:
                    got.add(key)
                elif key != lg.CMD_HEARTBEAT:
                    raise RuntimeError(f"idle stream {i}: unexpected frame 0x{key:04x}")
        if then == "delete":
            for i in range(k):
                conn.request(CMD_DELETE, codec.enc_string(f"idle-{i}"))
    finally:
        conn.close()
    return time.monotonic() - t0


def _publisher(port, stream, n, go, ready, done):
    from bench import _client
    body = b"x" * 100

    async def run():
        a = types.SimpleNamespace(host="127.0.0.1", port=port, stream=stream, stream_arg=[])
        await _client.rstream_create(a)
        async with _client.rstream_producer(a) as p:
            await _client.publish_rstream_batches(p, stream, BATCH, body, BATCH, INFLIGHT)   # untimed
            ready.set()
            await asyncio.get_running_loop().run_in_executor(None, go.wait)
            await _client.publish_rstream_batches(p, stream, n, body, BATCH, INFLIGHT)
    asyncio.run(run())
    done.set()


def measure(k, a, d, run=0):
    """One server: K idle streams, then the timed publish; returns the figures as a dict."""
    wrap = []
    cg_out = None
    data = os.path.join(d, f"data-{run}-{k}")
    args = ["--fsync", "never", "--kafka-port", "0"]
    if a.callgrind:
        tag = f"{'-' + a.then if k else ''}{'-restart' if a.restart else ''}"
        cg_out = os.path.join(a.callgrind, f"idle-{run}-{k}{tag}.cg")
        wrap = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={cg_out}"]
    srv = ServerProcess(data, *args, wrap=[] if a.restart else wrap).start(timeout=900)
    try:
        setup_s = (make_plain if a.setup == "plain" else make_idle)(srv.port, k, a.records, a.then)
        if a.restart:
            srv.stop(timeout=900)
            srv = ServerProcess(data, *args, wrap=wrap).start(timeout=900)
        time.sleep(a.settle)
        ctx = multiprocessing.get_context("fork")
        go = ctx.Event()
        procs = []
        share = [a.n // CLIENTS + (1 if i < a.n % CLIENTS else 0) for i in range(CLIENTS)]
        for i in range(CLIENTS):
            ready, done = ctx.Event(), ctx.Event()
            p = ctx.Process(target=_publisher, args=(srv.port, f"pub-{i}", share[i], go, ready, done), daemon=True)
            p.start()
            procs.append((p, ready, done))
        for p, ready, _ in procs:
            if not ready.wait(900):
                raise RuntimeError("a publisher did not get ready")
        time.sleep(0.5)
        if cg_out:
            subprocess.run(["callgrind_control", "-i", "on", str(srv.pid)], check=True, capture_output=True)
        c0, t0 = counters(srv.pid), time.perf_counter()
        go.set()
        for p, _, done in procs:
            if not done.wait(1800):
                raise RuntimeError("a publisher did not finish")
            p.join(60)
            if p.exitcode != 0:
                raise RuntimeError(f"a publisher failed (exit {p.exitcode})")
        t1, c1 = time.perf_counter(), counters(srv.pid)
        if cg_out:
            subprocess.run(["callgrind_control", "-i", "off", str(srv.pid)], check=True, capture_output=True)
    finally:
        srv.stop(timeout=900)
    ran = sum(c1["threads"].values()) - sum(c0["threads"].get(t, 0.0) for t in c1["threads"])
    res = {"idle": k, "setup": a.setup, "then": a.then if k else "-", "restart": a.restart, "n": a.n,
           "setup_s": round(setup_s, 2),
           "wall_s": round(t1 - t0, 3), "rate": round(a.n / (t1 - t0)), "cpu_us_per_msg": round(ran * 1e6 / a.n, 4),
           "minflt_per_msg": round((c1["minflt"] - c0["minflt"]) / a.n, 5),
           "wchar_per_msg": round((c1["wchar"] - c0["wchar"]) / a.n, 2), "load": round(os.getloadavg()[0], 2)}
    if cg_out:
        ann = subprocess.run(["callgrind_annotate", "--inclusive=no", cg_out], capture_output=True, text=True).stdout
        with open(cg_out + ".top", "w") as f:
            f.write(ann)
        m = re.search(r"([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", ann) or re.search(r"([\d,]+)\s+PROGRAM TOTALS", ann)
        if m:
            total = int(m.group(1).replace(",", ""))
            res["instr_per_msg"] = round(total / a.n, 1)
            res["callgrind"] = cg_out
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", default="0,1000,10000", help="idle stream counts, comma-separated")
    ap.add_argument("--records", type=int, default=10, help="messages per idle stream (the memory row's 10)")
    ap.add_argument("--then", choices=("keep", "delete"), default="keep",
                    help="keep the idle streams, or delete them before the timed publish (the memory row does)")
    ap.add_argument("--setup", choices=("memory", "plain"), default="memory",
                    help="memory: as the memory row (a consumer per stream too); plain: create and publish only "
                         "(fast enough under valgrind)")
    ap.add_argument("--restart", action="store_true", help="restart the server on the data before publishing")
    ap.add_argument("--n", type=int, default=200_000, help="messages published in the timed part, in all")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds between the idle streams and the publish")
    ap.add_argument("--callgrind", metavar="DIR", help="run the server under callgrind, profiles in DIR")
    ap.add_argument("--json", metavar="FILE", help="also write the figures here")
    ap.add_argument("--max-ratio", type=float, default=None,
                    help="exit 1 when a message costs more than this times the first count's (instructions with "
                         "--callgrind, else CPU); e.g. 1.10")
    a = ap.parse_args(argv)
    if a.callgrind:
        os.makedirs(a.callgrind, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="riverbed-idle-") as d:
        for run, k in enumerate(int(x) for x in a.idle.split(",")):
            r = measure(k, a, d, run)
            rows.append(r)
            print(json.dumps(r), flush=True)
    base = rows[0]
    worst = 0.0
    for r in rows[1:]:
        ratio = r["cpu_us_per_msg"] / base["cpu_us_per_msg"]
        line = f"idle {r['idle']:,} ({r['then']}) vs {base['idle']:,}: CPU {ratio:.3f}x"
        if "instr_per_msg" in r and "instr_per_msg" in base:
            ratio = r["instr_per_msg"] / base["instr_per_msg"]
            line += f", instructions {ratio:.3f}x"
        worst = max(worst, ratio)
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if a.max_ratio and worst > a.max_ratio:
        # the check: instructions per message when under callgrind, else CPU per message (noisy)
        print(f"FAILED: a message costs {worst:.3f}x with idle streams (at most {a.max_ratio}x)")
        sys.exit(1)


if __name__ == "__main__":
    main()

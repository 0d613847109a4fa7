"""Network soak: hostile traffic on every listener at once while well-behaved clients publish and read
back, then a SIGTERM, a restart, and every confirmed message read again.

    python -m bench.soak --minutes 10            # the full run; --seconds 30 for a short one

A real ``riverbed serve`` (a fresh data directory, every listener on 127.0.0.1 port 0) gets, for the
whole run and all at once:

* well-behaved clients, one per protocol, each publishing to its own stream and reading it back:
  rstream (RabbitMQ Stream), the project's BsonClient, pyzmq DEALERs (mc0), aiohttp WebSocket (Streamr),
  a raw REAM text client, and the HTTP records API reading every one of those streams;
* structured hostile input: frames valid in shape with hostile values (tests/fuzz/strategies.py, the
  same hypothesis strategies the fuzz targets use) on RabbitMQ Stream, BSON, ZeroMQ, WebSocket and REAM,
  each followed by a well-formed probe that must be answered, or the connection closed, within 3 s;
* unstructured hostile input: the fuzz corpus with random byte mutations, random bytes, on every port
  (HTTP included: random methods, paths with bad percent-escapes and lone surrogates, huge headers);
* slowloris connections (a byte a second) and connection floods (bursts of connects, half reset).

It then checks: the server never died; no hang (every probe answered or closed within 3 s, no
well-behaved request over 3 s); every well-behaved round trip succeeded; anonymous RSS growth under
100 MB; open file descriptors back to the baseline once clients are gone; a clean exit on SIGTERM;
after a restart every confirmed message readable; no "internal error" (or other traceback) in the
server log. Prints a JSON summary and exits 1 on any failed check. Loopback only, bounded rates.
"""

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from bench._soak_hostile import (
    ANSWER_S, bson_answered, examples, flood, hostile_http, hostile_raw, hostile_stream, hostile_ws, hostile_zmq,
    rmq_answered, slowloris, text_answered,
)

ROUNDTRIP_S = 10.0           # a well-behaved publish-then-read-back may take this long under load
RSS_GROWTH_MAX = 100 << 20   # bytes of anonymous memory the server may gain over the run
LISTEN_RE = re.compile(r"listening (\S+) (\S+):(\d+)")
ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ the server

class Server:
    """``riverbed serve`` with every listener on port 0; its stderr goes to ``log_path`` and ``lines``."""

    def __init__(self, data_dir, log_path):
        self.data_dir = str(data_dir)
        self.log_path = log_path
        self.proc = None
        self.ports = {}
        self.lines = []
        self._ready = threading.Event()

    def start(self, timeout=30):
        cmd = [sys.executable, "-m", "riverbed.shells.cli", "serve", "--data-dir", self.data_dir, "--host", "127.0.0.1"]
        for flag in ("--stream-port", "--bson-port", "--zmq-port", "--ws-port", "--ream-port", "--http-port", "--kafka-port"):
            cmd += [flag, "0"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     cwd=ROOT)
        self._ready.clear()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(timeout) or self.proc.poll() is not None:
            self.proc.kill()
            raise RuntimeError("server did not start:\n" + "\n".join(self.lines[-30:]))
        return self

    def _read(self):
        with open(self.log_path, "a") as log:
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip()
                self.lines.append(line)
                log.write(line + "\n")
                m = LISTEN_RE.search(line)
                if m:
                    self.ports[m.group(1)] = int(m.group(3))
                if line.endswith(" ready"):
                    self._ready.set()
        self._ready.set()

    def alive(self):
        return self.proc.poll() is None

    def status_kb(self, field):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return 0

    def fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self, timeout=30):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return "killed after SIGTERM timeout"


# -------------------------------------------------------------------------------------------- results

class Results:
    def __init__(self):
        self.roundtrips = Counter()          # protocol -> ok
        self.roundtrip_failures = Counter()  # protocol -> failed
        self.failure_examples = []
        self.slow_requests = Counter()       # protocol -> well-behaved requests over ANSWER_S
        self.confirmed = defaultdict(set)    # stream -> payload bytes confirmed stored
        self.hostile = Counter()             # kind -> inputs sent
        self.hangs = Counter()               # listener -> probes neither answered nor closed in ANSWER_S
        self.hang_examples = []
        self.http_status = Counter()

    def fail(self, proto, what):
        self.roundtrip_failures[proto] += 1
        if len(self.failure_examples) < 20:
            self.failure_examples.append(f"{proto}: {what}")


async def timed(res, proto, aw, limit=ANSWER_S):
    t0 = time.monotonic()
    out = await asyncio.wait_for(aw, ROUNDTRIP_S)
    if time.monotonic() - t0 > limit:
        res.slow_requests[proto] += 1
    return out


# -------------------------------------------------------------------------------- well-behaved clients

async def good_rmq(port, stop, res):
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

    stream, seen, i = "soak_rmq", set(), 0

    async def on_message(msg, ctx):
        seen.add(bytes(msg))

    async with Producer("127.0.0.1", port, username="guest", password="guest") as p, \
            Consumer("127.0.0.1", port, username="guest", password="guest") as c:
        await p.create_stream(stream, exists_ok=True)
        await c.subscribe(stream, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        while not stop.is_set():
            batch = [b"rmq-%d" % (i + k) for k in range(20)]
            i += len(batch)
            try:
                for m in batch:
                    await timed(res, "rmq", p.send_wait(stream, m))
                    res.confirmed[stream].add(m)
                await wait_seen(seen, batch)
                res.roundtrips["rmq"] += 1
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                res.fail("rmq", repr(e))
            await asyncio.sleep(0.2)


async def wait_seen(seen, batch, timeout=ROUNDTRIP_S):
    deadline = time.monotonic() + timeout
    while not all(m in seen for m in batch):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sum(m not in seen for m in batch)} of {len(batch)} not read back")
        await asyncio.sleep(0.02)


async def good_bson(port, stop, res):
    sys.path.insert(0, str(ROOT))
    from riverbed.shells.bson_tcp.client import BsonClient

    stream, seen, i = "soak_bson", set(), 0
    pub = await BsonClient.connect("127.0.0.1", port)
    await pub.publish(stream, {"i": -1})
    res.confirmed[stream].add(("bson", -1))
    sub_conn = await BsonClient.connect("127.0.0.1", port)
    sub = await sub_conn.subscribe(stream, start_pos=0)

    async def reader():
        async for ev in sub:
            seen.add(ev.event.get("i"))
    task = asyncio.create_task(reader())
    try:
        while not stop.is_set():
            batch = list(range(i, i + 20))
            i += 20
            try:
                for n in batch:
                    await timed(res, "bson", pub.publish(stream, {"i": n, "s": "x" * (n % 50)}))
                    res.confirmed[stream].add(("bson", n))
                await wait_seen(seen, batch)
                res.roundtrips["bson"] += 1
            except Exception as e:  # noqa: BLE001
                res.fail("bson", repr(e))
            await asyncio.sleep(0.2)
    finally:
        task.cancel()
        await pub.close()
        await sub_conn.close()


async def good_zmq(port, stop, res):
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    pub, sub = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    for s in (pub, sub):
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://127.0.0.1:{port}")
    topic, seen, i = b"soak_zmq", set(), 0
    try:
        await pub.send_multipart([b"", b"PUT", b"TOPIC", topic, b"ID", b"first", b"", b"zmq-first"])
        await timed(res, "zmq", pub.recv_multipart())
        res.confirmed["soak_zmq"].add(b"zmq-first")
        await sub.send_multipart([b"", b"SUB", b"ID", b"s", b"X-OFFSET", b"0", b"", topic])

        async def reader():
            while True:
                frames = await sub.recv_multipart()
                if frames[1:2] == [b"MESSAGE"] and b"" in frames[2:]:
                    body = frames[frames.index(b"", 2) + 1:]
                    if body:
                        seen.add(body[0])
        task = asyncio.create_task(reader())
        while not stop.is_set():
            batch = [b"zmq-%d" % (i + k) for k in range(20)]
            i += 20
            try:
                for k, m in enumerate(batch):
                    rid = b"r%d" % (i + k)
                    await pub.send_multipart([b"", b"PUT", b"TOPIC", topic, b"ID", rid, b"", m])
                    reply = await timed(res, "zmq", pub.recv_multipart())
                    if reply[:2] != [b"", b"OK"]:
                        raise RuntimeError(f"PUT answered {reply!r}")
                    res.confirmed["soak_zmq"].add(m)
                await wait_seen(seen, batch)
                res.roundtrips["zmq"] += 1
            except Exception as e:  # noqa: BLE001
                res.fail("zmq", repr(e))
            await asyncio.sleep(0.2)
        task.cancel()
    finally:
        pub.close()
        sub.close()
        ctx.term()


async def good_ws(port, stop, res):
    import aiohttp

    stream, seen, i = "soak_ws", set(), 0
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(f"http://127.0.0.1:{port}/api/v1/ws") as ws:
            await ws.send_str(json.dumps({"type": "subscribe", "stream": stream}))
            await timed(res, "ws", ws.receive())

            async def reader():
                async for msg in ws:
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        frame = json.loads(msg.data)
                        if frame[1] == 0:
                            seen.add(frame[3][8])
            task = asyncio.create_task(reader())
            while not stop.is_set():
                batch = [json.dumps({"ws": i + k}) for k in range(20)]
                i += 20
                try:
                    for m in batch:
                        await ws.send_str(json.dumps({"type": "publish", "stream": stream, "msg": m}))
                    await wait_seen(seen, batch)
                    # Streamr has no publish confirm: a message read back is a message stored
                    res.confirmed[stream].update(m.encode() for m in batch)
                    res.roundtrips["ws"] += 1
                except Exception as e:  # noqa: BLE001
                    res.fail("ws", repr(e))
                await asyncio.sleep(0.2)
            task.cancel()


async def good_ream(port, stop, res):
    stream, seen, i = "soak_ream", set(), 0
    pr, pw = await asyncio.open_connection("127.0.0.1", port)
    sr, sw = await asyncio.open_connection("127.0.0.1", port)
    await pr.readline()
    await sr.readline()
    sw.write(f"EVENT SUBSCRIBE {stream} 1\n".encode())
    await sw.drain()

    async def reader():
        while True:
            line = await sr.readline()
            if not line:
                return
            words = line.split()
            if len(words) == 4 and words[0] == b"EVENT" and words[1] == stream.encode():
                payload = await sr.readexactly(int(words[3]) + 1)
                seen.add(payload[:-1])
    task = asyncio.create_task(reader())
    try:
        while not stop.is_set():
            batch = [json.dumps({"ream": i + k}).encode() for k in range(20)]
            i += 20
            try:
                for m in batch:
                    pw.write(f"EVENT PUBLISH {stream} {len(m)}\n".encode() + m + b"\n")
                    await pw.drain()
                    line = await timed(res, "ream", pr.readline())
                    if not line.startswith(f"EVENT PUBLISHED {stream} ".encode()):
                        raise RuntimeError(f"publish answered {line!r}")
                    res.confirmed[stream].add(m)
                await wait_seen(seen, batch)
                res.roundtrips["ream"] += 1
            except Exception as e:  # noqa: BLE001
                res.fail("ream", repr(e))
            await asyncio.sleep(0.2)
    finally:
        task.cancel()
        pw.close()
        sw.close()


async def good_http(port, stop, res):
    import aiohttp

    import base64

    guest = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
    async with aiohttp.ClientSession(headers=guest) as http:
        while not stop.is_set():
            for stream in ("soak_rmq", "soak_bson", "soak_zmq", "soak_ws", "soak_ream"):
                try:
                    async with http.get(f"http://127.0.0.1:{port}/api/streams/{stream}/records?last=5") as r:
                        await timed(res, "http", r.read())
                        if r.status not in (200, 404):
                            raise RuntimeError(f"records of {stream}: HTTP {r.status}")
                    res.roundtrips["http"] += 1
                except Exception as e:  # noqa: BLE001
                    res.fail("http", repr(e))
            await asyncio.sleep(0.5)


# ----------------------------------------------------------------------------------------- the run

def log_errors(lines):
    """Tracebacks in the server log. Returns ``(internal, bad_http)``: ``internal`` counts the unhandled
    exceptions ("internal error", "request failed", "error in tick", and aiohttp's "Error handling
    request" for anything but a malformed request) by listener (the outermost ``shells/<protocol>``
    frame), announcing line and exception type (the last of a chain); ``bad_http`` counts the malformed
    HTTP requests aiohttp answered 400 and logged with a traceback anyway."""
    internal = Counter()
    bad_http = Counter()
    event = None            # [announcement, listener, last exception type]

    def finish():
        if event is None or event[2] is None:
            return
        announced, where, exc = event
        if announced == "Error handling request" and exc.startswith("aiohttp.http_exceptions."):
            bad_http[exc.rsplit(".", 1)[1]] += 1
        else:
            internal[f"{where}: {announced}: {exc}"] += 1

    for line in lines + ["0 end"]:
        if line[:1].isdigit():
            finish()
            event = None
            m = re.search(r"(internal error[^;]*|request failed|Error handling request|error in tick|error while closing)",
                          line)
            if m and (" ERROR " in line or "internal error" in line):
                event = [m.group(1), "?", None]
            continue
        if event is None or not line or line.startswith(("Traceback", "During handling", "The above exception")):
            continue
        if line[:1].isspace():
            m = re.search(r"/shells/(\w+)/", line)
            if m and m.group(1) != "broker" and 'File "' in line and event[1] == "?":  # the outermost protocol frame
                event[1] = m.group(1)
            continue
        m = re.match(r"^([A-Za-z_][\w.]*)(:|$)", line)
        if m:
            event[2] = m.group(1)
    return internal, bad_http


async def run(args):
    rng = random.Random(args.seed)
    work = Path(args.work or tempfile.mkdtemp(prefix="riverbed-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / "server.log"
    data_dir = work / "data"
    server = Server(data_dir, log_path).start()
    try:
        ports = server.ports
        res = Results()
        fds_start = server.fds()
        summary = {"ports": ports, "work": str(work), "seconds": args.seconds}
        stop = asyncio.Event()
        sys.path.insert(0, str(ROOT))
        from tests.fuzz import t_bson, t_ream, t_rmq
        from tests.fuzz.targets import corpus_inputs, make_target

        n_ex = 60 if args.seconds < 120 else 200
        ex = {}
        for name in ("rmq", "bson", "ream"):
            target = make_target(name, work / f"seeds-{name}")
            try:
                ex[name] = examples(name, n_ex, args.seed) + list(target.seeds())
            finally:
                target.close()
        ex["ws"] = examples("ws", n_ex, args.seed)
        ex["zmq"] = examples("zmq", n_ex, args.seed)
        corpus = {name: [d for _, d in corpus_inputs(name)] for name in ("rmq", "bson", "ream", "ws", "zmq")}

        good = [good_rmq(ports["stream"], stop, res), good_bson(ports["bson"], stop, res),
                good_zmq(ports["zmq"], stop, res), good_ws(ports["ws"], stop, res), good_ream(ports["ream"], stop, res),
                good_http(ports["http"], stop, res)]
        rmq_probe = t_rmq.PROBE_HANDSHAKE
        hostile = [
            hostile_stream("stream", ports["stream"], stop, res, ex["rmq"], t_rmq.PRELUDE, rmq_probe,
                           rmq_answered(0x8011), random.Random(rng.random())),
            hostile_stream("bson", ports["bson"], stop, res, ex["bson"], t_bson.PRELUDE, t_bson.PROBE_OPEN,
                           bson_answered, random.Random(rng.random())),
            hostile_stream("ream", ports["ream"], stop, res, [e for e in ex["ream"]], t_ream.PRELUDE, b"\n" + t_ream.PROBE,
                           text_answered, random.Random(rng.random())),
            hostile_ws(ports["ws"], stop, res, ex["ws"], random.Random(rng.random())),
            hostile_zmq(ports["zmq"], stop, res, ex["zmq"], random.Random(rng.random())),
            hostile_http("http", ports["http"], stop, res, random.Random(rng.random())),
            hostile_http("ws-http", ports["ws"], stop, res, random.Random(rng.random())),
        ]
        for listener, name in (("stream", "rmq"), ("bson", "bson"), ("ream", "ream"), ("ws", "ws"), ("zmq", "zmq"),
                               ("http", None)):
            port = ports[listener]
            hostile.append(hostile_raw(listener, port, stop, res, corpus.get(name, []), random.Random(rng.random())))
            hostile.append(slowloris(listener, port, stop, res, random.Random(rng.random())))
            hostile.append(flood(listener, port, stop, res, random.Random(rng.random())))

        samples = []

        async def monitor():
            while not stop.is_set():
                if not server.alive():
                    summary["crashed"] = True
                    stop.set()
                    return
                samples.append((time.monotonic(), server.status_kb("VmRSS"), server.status_kb("RssAnon")))
                await asyncio.sleep(1.0)

        t0 = time.monotonic()
        tasks = [asyncio.create_task(c) for c in good + hostile] + [asyncio.create_task(monitor())]
        done, _ = await asyncio.wait(tasks, timeout=args.seconds, return_when=asyncio.FIRST_EXCEPTION)
        stop.set()
        _, pending = await asyncio.wait(tasks, timeout=30)
        for t in pending:
            t.cancel()
        errors = [repr(t.exception()) for t in tasks if t.done() and not t.cancelled() and t.exception()]
        elapsed = time.monotonic() - t0

        # file descriptors back to the baseline once every client has gone
        await asyncio.sleep(2.0)
        deadline = time.monotonic() + 20
        fds_end = server.fds() if server.alive() else None
        while server.alive() and fds_end > fds_start and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            fds_end = server.fds()
        warm = [s for s in samples if s[0] - t0 >= min(10.0, args.seconds / 4)] or samples
        rss_base, anon_base = (warm[0][1], warm[0][2]) if warm else (0, 0)
        rss_end, anon_end = (samples[-1][1], samples[-1][2]) if samples else (0, 0)
        anon_max = max((s[2] for s in samples), default=0)

        alive = server.alive()
        exit_status = server.stop() if alive else server.proc.returncode
    except BaseException:
        # a soak that fails before its end (a bad input list, an interrupt) still stops its server
        if server.alive():
            server.stop()
        raise
    errs_counts, errs_announced = log_errors(server.lines)

    # restart, and read every confirmed message back out of the log
    server2 = Server(data_dir, log_path).start()
    missing = {}
    try:
        missing = read_back(data_dir, res.confirmed)
    finally:
        exit2 = server2.stop()

    summary.update({
        "elapsed_s": round(elapsed, 1), "crashed": not alive or summary.get("crashed", False),
        "client_task_errors": errors,
        "roundtrips_ok": dict(res.roundtrips), "roundtrips_failed": dict(res.roundtrip_failures),
        "failure_examples": res.failure_examples, "slow_requests": dict(res.slow_requests),
        "hostile_inputs": dict(res.hostile), "hostile_total": sum(res.hostile.values()),
        "hangs": dict(res.hangs), "hang_examples": res.hang_examples,
        "http_status": dict(res.http_status),
        "rss_mb": {"baseline": round(rss_base / 1024, 1), "end": round(rss_end / 1024, 1)},
        "anon_mb": {"baseline": round(anon_base / 1024, 1), "end": round(anon_end / 1024, 1),
                    "max": round(anon_max / 1024, 1), "growth": round((anon_end - anon_base) / 1024, 1)},
        "fds": {"start": fds_start, "end": fds_end},
        "sigterm_exit": exit_status, "restart_exit": exit2,
        "confirmed": {s: len(v) for s, v in res.confirmed.items()}, "missing_after_restart": missing,
        "log_internal_errors": dict(errs_counts), "http_400_logged_by_aiohttp": dict(errs_announced),
    })
    checks = {
        "no crash": not summary["crashed"],
        "no hang": not res.hangs and not res.slow_requests,
        "every round trip succeeded": not res.roundtrip_failures and all(res.roundtrips[p] for p in
                                                                        ("rmq", "bson", "zmq", "ws", "ream", "http")),
        "anonymous RSS growth < 100 MB": (anon_end - anon_base) * 1024 < RSS_GROWTH_MAX,
        "fds back to baseline": fds_end is not None and fds_end <= fds_start,
        "clean exit on SIGTERM": exit_status == 0 and exit2 == 0,
        "every confirmed message readable after restart": not missing and bool(res.confirmed),
        "no internal error in the log": not errs_counts,
        "no HTTP 5xx": not any(k.split()[-1].startswith("5") for k in res.http_status),
    }
    summary["checks"] = checks
    return summary


def read_back(data_dir, confirmed):
    """``{stream: missing count}`` of confirmed payloads not found in the stream after the restart."""
    import bson

    from riverbed.engine import Engine, core
    from riverbed.engine import record as rec

    eng = Engine(data_dir, readonly=True)
    missing = {}
    try:
        for stream, want in confirmed.items():
            have = set()
            for _, raw in eng.read_chunks(stream, 0, 1 << 30):
                for r in core.chunk_records(raw, False):
                    payload = rec.decode_record(r).payload
                    if stream == "soak_bson":
                        try:
                            have.add(("bson", bson.decode(payload).get("i")))
                        except Exception:  # noqa: BLE001 - another client's record
                            pass
                    else:
                        have.add(bytes(payload))
            lost = len(want - have)
            if lost:
                missing[stream] = lost
    finally:
        eng.close()
    return missing


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--work", help="directory for the data and server.log (default: a new temp dir, removed if "
                                   "every check passed)")
    a = ap.parse_args(argv)
    if a.minutes:
        a.seconds = a.minutes * 60
    summary = asyncio.run(run(a))
    print(json.dumps(summary, indent=1, default=str))
    failed = [k for k, ok in summary["checks"].items() if not ok]
    print("FAILED: " + ", ".join(failed) if failed else "all checks passed")
    if not failed and not a.work:
        import shutil

        shutil.rmtree(summary["work"], ignore_errors=True)     # kept (data and server.log) only on failure
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

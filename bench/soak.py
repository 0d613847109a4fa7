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
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

ANSWER_S = 3.0               # a request must be answered (or the connection closed) within this
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
        for flag in ("--stream-port", "--bson-port", "--zmq-port", "--ws-port", "--text-port", "--http-port"):
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


# ------------------------------------------------------------------------------------------ hostile

def _mutate(data, rng):
    data = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if not data:
            break
        op = rng.randrange(4)
        p = rng.randrange(len(data))
        if op == 0:
            data[p] = rng.randrange(256)
        elif op == 1:
            del data[p:p + rng.randint(1, 16)]
        elif op == 2:
            data[p:p] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        else:
            data[p:p] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xff", b"\x80"])
    return bytes(data)


async def _drain_until(reader, pred, timeout):
    """Read until ``pred(buffer)`` or EOF (True) or the timeout (False)."""
    buf = bytearray()
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            chunk = await asyncio.wait_for(reader.read(65536), left)
        except (asyncio.TimeoutError, TimeoutError):
            return False
        except (ConnectionError, OSError):
            return True
        if not chunk:
            return True
        buf += chunk
        if pred(buf):
            return True


def _examples(name, n, seed):
    """``n`` inputs of fuzz target ``name`` drawn from its hypothesis strategy."""
    from tests.fuzz.runner import hypothesis_examples

    random.seed(seed)
    return hypothesis_examples(name, n)


async def hostile_stream(listener, port, stop, res, examples, prelude, probe, answered, rng):
    """Structured inputs on a byte-stream listener: input, probe, then an answer or a close in 3 s."""
    while not stop.is_set():
        data = rng.choice(examples)
        flags, body = data[0], data[1:]
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), ANSWER_S)
        except (OSError, asyncio.TimeoutError, TimeoutError):
            res.hangs[listener + " connect"] += 1
            continue
        try:
            if listener == "text":
                await asyncio.wait_for(r.readline(), ANSWER_S)
            w.write((prelude if flags & 1 else b"") + body + probe)
            await w.drain()
            res.hostile[listener + " structured"] += 1
            if not await _drain_until(r, answered, ANSWER_S):
                res.hangs[listener] += 1
                if len(res.hang_examples) < 10:
                    res.hang_examples.append(f"{listener}: {data.hex()[:400]}")
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, TimeoutError):
            pass
        finally:
            w.close()
        await asyncio.sleep(0.01)


async def hostile_raw(listener, port, stop, res, corpus, rng):
    """Unstructured input: mutated corpus inputs and random bytes; we wait briefly and close."""
    while not stop.is_set():
        if corpus and rng.random() < 0.8:
            data = _mutate(rng.choice(corpus)[1:], rng)
        else:
            data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 512)))
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), ANSWER_S)
        except (OSError, asyncio.TimeoutError, TimeoutError):
            res.hangs[listener + " connect"] += 1
            continue
        try:
            w.write(data)
            await w.drain()
            res.hostile[listener + " raw"] += 1
            await _drain_until(r, lambda b: len(b) > 65536, 0.3)
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()
        await asyncio.sleep(0.01)


def _http_garbage(rng, port):
    method = rng.choice([b"GET", b"POST", b"DELETE", b"PUT", b"G\xffT", b"OPTIONS", b"\x00"])
    path = rng.choice([b"/api/streams/", b"/api/streams/soak_rmq/records?last=", b"/api/connections/", b"/metrics",
                       b"/api/v1/streams/", b"/healthz", b"/api/stream/consumers?stream=", b"/"])
    junk = rng.choice([b"%ed%a0%80", b"%ff", b"%00", b"\xed\xa0\x80", b"..%2f..%2f", b"x" * rng.randint(1, 9000),
                       b"-1", b"99999999999999999999", b"%", b"\xff\xfe", b"?a=%zz", b"\r\n"])
    headers = rng.choice([b"", b"X-A: \xed\xa0\x80\r\n", b"Authorization: Basic %%%%\r\n",
                          b"Authorization: Basic " + b"A" * 5000 + b"\r\n", b"Content-Length: -1\r\n",
                          b"Content-Length: 99999999999\r\n", b"Transfer-Encoding: chunked\r\n",
                          b"Host: \x00\r\n", b"Cookie: " + b"c" * 9000 + b"\r\n"])
    return method + b" " + path + junk + b" HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % port + headers + b"Connection: close\r\n\r\n"


async def hostile_http(listener, port, stop, res, rng):
    """Malformed HTTP requests: each must get a status line or a close in 3 s; 5xx are counted."""
    while not stop.is_set():
        req = _http_garbage(rng, port)
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), ANSWER_S)
        except (OSError, asyncio.TimeoutError, TimeoutError):
            res.hangs[listener + " connect"] += 1
            continue
        status = []
        try:
            w.write(req)
            await w.drain()
            res.hostile[listener + " http"] += 1

            def got_status(buf):
                if b"\r\n" in buf:
                    status.append(bytes(buf[:buf.index(b"\r\n")]))
                    return True
                return False
            if not await _drain_until(r, got_status, ANSWER_S):
                res.hangs[listener] += 1
            if status:
                parts = status[0].split()
                res.http_status[f"{listener} {parts[1].decode(errors='replace') if len(parts) > 1 else '?'}"] += 1
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()
        await asyncio.sleep(0.01)


async def hostile_ws(port, stop, res, examples, rng):
    """Structured Streamr requests over a real WebSocket; the probe's error must come back in 3 s."""
    import aiohttp

    from tests.fuzz.t_ws import decode_messages

    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            data = rng.choice(examples)
            try:
                async with http.ws_connect(f"http://127.0.0.1:{port}/api/v1/ws", timeout=ANSWER_S) as ws:
                    for m in decode_messages(data[1:]):
                        if isinstance(m, bytes):
                            await ws.send_bytes(m)
                        else:
                            await ws.send_str(m.encode("utf-8", "replace").decode("utf-8"))
                    await ws.send_str(json.dumps({"type": "unsubscribe", "stream": "__fuzz_probe"}))
                    res.hostile["ws structured"] += 1
                    deadline = time.monotonic() + ANSWER_S
                    ok = False
                    while time.monotonic() < deadline:
                        try:
                            msg = await ws.receive(timeout=deadline - time.monotonic())
                        except (asyncio.TimeoutError, TimeoutError):
                            break
                        if msg.type != aiohttp.WSMsgType.TEXT or "__fuzz_probe" in msg.data:
                            ok = True
                            break
                    if not ok:
                        res.hangs["ws"] += 1
                        if len(res.hang_examples) < 10:
                            res.hang_examples.append(f"ws: {data.hex()[:400]}")
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError, TimeoutError):
                pass
            await asyncio.sleep(0.01)


async def hostile_zmq(port, stop, res, examples, rng):
    """Structured mc0 requests from DEALERs; a NOOP probe must be answered in 3 s."""
    import zmq
    import zmq.asyncio

    from tests.fuzz.t_zmq import decode_messages

    ctx = zmq.asyncio.Context()
    try:
        while not stop.is_set():
            data = rng.choice(examples)
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://127.0.0.1:{port}")
            try:
                for _, frames in decode_messages(data[1:]):
                    if frames:
                        await sock.send_multipart([bytes(f) for f in frames])
                await sock.send_multipart([b"", b"NOOP", b"ID", b"__probe"])
                res.hostile["zmq structured"] += 1
                deadline = time.monotonic() + ANSWER_S
                ok = False
                while time.monotonic() < deadline:
                    if await sock.poll(int((deadline - time.monotonic()) * 1000) + 1):
                        reply = await sock.recv_multipart()
                        if b"__probe" in reply:
                            ok = True
                            break
                if not ok:
                    res.hangs["zmq"] += 1
                    if len(res.hang_examples) < 10:
                        res.hang_examples.append(f"zmq: {data.hex()[:400]}")
            finally:
                sock.close()
            await asyncio.sleep(0.01)
    finally:
        ctx.term()


async def slowloris(listener, port, stop, res, rng, conns=8):
    """Connections that send a valid-looking request one byte a second, renewed every 20 s."""
    starts = {"stream": b"\x00\x00\x00\x20\x00\x11\x00\x01", "bson": b"\x40\x00\x00\x00\x02type\x00",
              "text": b"EVENT PUBLISH slow 100\n", "http": b"GET /api/streams HTTP/1.1\r\nHost: x\r\nX-A: ",
              "ws": b"GET /api/v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n", "zmq": b"\xff\x00\x00\x00"}
    data = starts.get(listener, b"\x00") + b"a" * 64
    while not stop.is_set():
        socks = []
        for _ in range(conns):
            try:
                socks.append(await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), ANSWER_S))
            except (OSError, asyncio.TimeoutError, TimeoutError):
                pass
        res.hostile[listener + " slowloris"] += len(socks)
        for i in range(20):
            if stop.is_set():
                break
            for _, w in socks:
                if w.is_closing() or w.transport.get_extra_info("socket") is None:
                    continue
                try:
                    w.write(data[i:i + 1])
                except (ConnectionError, OSError, RuntimeError):
                    pass
            await asyncio.sleep(1.0)
        for _, w in socks:
            w.close()


async def flood(listener, port, stop, res, rng, burst=100):
    """Bursts of connections opened and dropped at once, half of them with a reset."""
    import socket

    while not stop.is_set():
        socks = []
        for _ in range(burst):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                continue
            socks.append(s)
        await asyncio.sleep(0.2)
        for k, s in enumerate(socks):
            if k % 2:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        res.hostile[listener + " flood"] += len(socks)
        await asyncio.sleep(5.0)


# ----------------------------------------------------------------------------------------- the run

def _rmq_answered(probe_key):
    def pred(buf):
        pos = 0
        while len(buf) - pos >= 8:
            n = struct.unpack_from(">I", buf, pos)[0]
            if len(buf) - pos - 4 < n:
                return False
            if struct.unpack_from(">H", buf, pos + 4)[0] == probe_key:
                return True
            pos += 4 + n
        return False
    return pred


def _text_answered(buf):
    return b"EVENT LISTED" in buf or b"EVENT NON LISTED" in buf


def _bson_answered(buf):
    return b"rID\x00" in buf and struct.pack("<i", 0x5EED) in buf


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
    ports = server.ports
    res = Results()
    fds_start = server.fds()
    summary = {"ports": ports, "work": str(work), "seconds": args.seconds}
    stop = asyncio.Event()
    sys.path.insert(0, str(ROOT))
    from tests.fuzz import t_bson, t_ream, t_rmq
    from tests.fuzz.targets import corpus_inputs

    n_ex = 60 if args.seconds < 120 else 200
    ex = {name: _examples(name, n_ex, args.seed) + [s for s in __import__(f"tests.fuzz.t_{name}", fromlist=["x"])
                                                   .__dict__[cls]().seeds()]
          for name, cls in (("rmq", "RmqTarget"), ("bson", "BsonTarget"), ("ream", "ReamTarget"))}
    ex["ws"] = _examples("ws", n_ex, args.seed)
    ex["zmq"] = _examples("zmq", n_ex, args.seed)
    corpus = {name: [d for _, d in corpus_inputs(name)] for name in ("rmq", "bson", "ream", "ws", "zmq")}

    good = [good_rmq(ports["rabbitmq-stream"], stop, res), good_bson(ports["bson"], stop, res),
            good_zmq(ports["zmq"], stop, res), good_ws(ports["ws"], stop, res), good_ream(ports["text"], stop, res),
            good_http(ports["http"], stop, res)]
    rmq_probe = t_rmq.PROBE_HANDSHAKE
    hostile = [
        hostile_stream("stream", ports["rabbitmq-stream"], stop, res, ex["rmq"], t_rmq.PRELUDE, rmq_probe,
                       _rmq_answered(0x8011), random.Random(rng.random())),
        hostile_stream("bson", ports["bson"], stop, res, ex["bson"], t_bson.PRELUDE, t_bson.PROBE_OPEN,
                       _bson_answered, random.Random(rng.random())),
        hostile_stream("text", ports["text"], stop, res, [e for e in ex["ream"]], t_ream.PRELUDE, b"\n" + t_ream.PROBE,
                       _text_answered, random.Random(rng.random())),
        hostile_ws(ports["ws"], stop, res, ex["ws"], random.Random(rng.random())),
        hostile_zmq(ports["zmq"], stop, res, ex["zmq"], random.Random(rng.random())),
        hostile_http("http", ports["http"], stop, res, random.Random(rng.random())),
        hostile_http("ws-http", ports["ws"], stop, res, random.Random(rng.random())),
    ]
    for listener, name in (("stream", "rmq"), ("bson", "bson"), ("text", "ream"), ("ws", "ws"), ("zmq", "zmq"),
                           ("http", None)):
        port = ports[{"stream": "rabbitmq-stream"}.get(listener, listener)]
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
    ap.add_argument("--work", help="directory for the data and server.log (default: a new temp dir)")
    a = ap.parse_args(argv)
    if a.minutes:
        a.seconds = a.minutes * 60
    summary = asyncio.run(run(a))
    print(json.dumps(summary, indent=1, default=str))
    failed = [k for k, ok in summary["checks"].items() if not ok]
    print("FAILED: " + ", ".join(failed) if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The hostile side of the network soak (bench/soak.py): structured frames with a probe each, mutated
and random byte streams, malformed HTTP requests, slowloris connections and connection floods. Each
generator loops until ``stop`` is set, counts what it sent in ``res.hostile`` and what went unanswered in
``res.hangs``; all of them connect to 127.0.0.1 only and pace themselves (a short sleep per input)."""

import asyncio
import json
import random
import struct
import time

ANSWER_S = 3.0               # a request must be answered (or the connection closed) within this


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


def examples(name, n, seed):
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
                async with http.ws_connect(f"http://127.0.0.1:{port}/api/v1/ws",
                                           timeout=aiohttp.ClientWSTimeout(ws_close=ANSWER_S)) as ws:
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


# ----------------------------------------------------------------------------------- probe answers

def rmq_answered(probe_key):
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


def text_answered(buf):
    return b"EVENT LISTED" in buf or b"EVENT NON LISTED" in buf


def bson_answered(buf):
    return b"rID\x00" in buf and struct.pack("<i", 0x5EED) in buf

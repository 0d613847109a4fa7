"""A server-bound load generator for the RabbitMQ Stream protocol (issue 26): the bench's real clients
(rstream, rbfly) spend more CPU per message than either broker, so their rates sink toward 1x; these
workloads spend almost none, so a row's rate is the broker's.

Run by ``bench._client`` (same READY/GO handshake, CPU snapshots and RESULT line as every workload):

- ``loadgen-publish``: one connection, one publisher without a reference (no deduplication, as the
  real-client rows), Publish frames of ``--batch`` messages of ``--size`` bytes built once with the
  project's codec (``riverbed.shells.rmq_stream.codec.frame``) and written again and again with plain
  ``socket.sendall``; at most ``--inflight`` frames unconfirmed. A reader thread counts confirms: of each
  PublishConfirm it reads the size, key and id count, never the ids. The publishing ids repeat from frame
  to frame (neither broker looks at them for a publisher without a reference).
- ``loadgen-consume``: the stream filled first (untimed, the same publisher), then Subscribe from
  ``first`` with credit ``--inflight``; of each Deliver it reads the 17 bytes up to the chunk header's
  record count, gives one credit back (a frame built once), and skips the rest of the frame unread.
- ``loadgen-latency``: stop-and-wait, as the echo floor's client (``bench.loop_floor``) drives the bare
  uvloop server: one Publish frame of one ``--size`` message (built once), then plain blocking socket
  reads until its PublishConfirm, then the next; ``--warmup`` untimed, ``--timed`` timed, each from
  the write to the confirm. The confirm latency and the server CPU per message of one message per
  frame with a client that costs what the floor's costs (rstream and rbfly add their own time to the
  p50 and their own frames to the server's work).

Several processes: the harness's ``procs`` (each process its own connection and stream). Client CPU is
the process's own (both threads), reported by the harness beside the server's.
"""

import contextlib
import socket
import struct
import threading
import time

from riverbed.shells.rmq_stream import codec
from riverbed.shells.rmq_stream.constants import (
    CMD_CLOSE, CMD_CREATE, CMD_CREATE_SUPER_STREAM, CMD_CREDIT, CMD_DECLARE_PUBLISHER, CMD_DELETE, CMD_DELETE_SUPER_STREAM,
    CMD_DELIVER, CMD_HEARTBEAT, CMD_METADATA, CMD_OPEN, CMD_PEER_PROPERTIES, CMD_PUBLISH, CMD_PUBLISH_CONFIRM,
    CMD_PUBLISH_ERROR, CMD_SASL_AUTHENTICATE, CMD_SASL_HANDSHAKE, CMD_SUBSCRIBE, CMD_TUNE, OFFSET_TYPE_FIRST,
    RESPONSE,
)

WORKLOADS = ("loadgen-publish", "loadgen-consume", "loadgen-latency")
LEN_PEEK = 17            # size 4, key 2, version 2, subscription id 1, chunk magic 1, type 1, entries 2, records 4
LEN_HEAD = 23            # bytes of a frame on_frame sees at least: a PublishError's first id and its code
LEN_RECV_BUF = 4 << 20
LEN_WHOLE = 4096         # frames up to this size reach on_frame whole (a Close with its reason)
CODE_OK = 1
CODE_STREAM_DOES_NOT_EXIST, CODE_STREAM_ALREADY_EXISTS = 2, 5
CHUNK_TYPE_USER = 0
PUBLISHER_ID, SUBSCRIPTION_ID = 0, 0
_U32 = struct.Struct(">I")
_PEEK = struct.Struct(">IHHBBBHI")
_HEAD = struct.Struct(">IHH")
_KEY = struct.Struct(">H")


class LoadgenError(RuntimeError):
    pass


class Conn:
    """A RabbitMQ Stream connection on a blocking socket: the handshake, requests answered in order
    (setup only), then raw frame writes and a frame-header reader."""

    def __init__(self, host, port, user="guest", password="guest", vhost="/"):
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(LEN_RECV_BUF)
        self.have = 0
        self.corr = 0
        self.closed_why = None      # a Close frame from the broker: "code 0x.. reason"
        self.request(CMD_PEER_PROPERTIES, codec.enc_properties({"product": "riverbed-loadgen"}))
        self.request(CMD_SASL_HANDSHAKE, b"")
        self.request(CMD_SASL_AUTHENTICATE, codec.enc_string("PLAIN") + _bytes32(f"\0{user}\0{password}".encode()))
        key, body = self.read_frame()
        if key != CMD_TUNE:
            raise LoadgenError(f"expected Tune, got key 0x{key:04x}")
        frame_max, heartbeat = struct.unpack_from(">II", body)
        self.frame_max = frame_max
        self.heartbeat = heartbeat
        self.sock.sendall(codec.frame(CMD_TUNE, struct.pack(">II", frame_max, heartbeat)))
        self.request(CMD_OPEN, codec.enc_string(vhost))

    # --- setup: one request at a time

    def request(self, key, body, ok=(CODE_OK,)):
        code = struct.unpack_from(">H", self.call(key, body))[0]
        if code not in ok:
            raise LoadgenError(f"command 0x{key:04x} answered code {code}")
        return code

    def call(self, key, body):
        """One request; its response's body after the correlation id (a response code first for every
        command but Metadata)."""
        self.corr += 1
        self.sock.sendall(codec.frame(key, struct.pack(">I", self.corr) + body))
        while True:
            rkey, rbody = self.read_frame()
            if rkey == RESPONSE | key:
                return rbody[4:]

    def read_frame(self):
        """One whole frame (setup only): (key, body after key and version)."""
        while True:
            if self.have >= 4:
                size = _U32.unpack_from(self.buf)[0]
                end = 4 + size
                if self.have >= end:
                    key = struct.unpack_from(">H", self.buf, 4)[0]
                    body = bytes(self.buf[8:end])
                    rest = self.have - end
                    self.buf[:rest] = self.buf[end:self.have]
                    self.have = rest
                    return key, body
            self._recv()

    def _recv(self):
        k = self.sock.recv_into(memoryview(self.buf)[self.have:])
        if k == 0:
            raise LoadgenError("the broker closed the connection" +
                               (f" after a Close frame ({self.closed_why})" if self.closed_why else
                                " (no Close frame before it)"))
        self.have += k

    def note_close(self, buf, pos, size):
        """A whole Close frame at ``buf[pos:]`` (the broker ends the connection): keep its code and
        reason for the error that follows. Layout: size, key, version, correlation id, code, reason."""
        if size < 12:
            self.closed_why = "a malformed Close"
            return
        code, n = struct.unpack_from(">Hh", buf, pos + 12)
        reason = bytes(buf[pos + 16:pos + 16 + max(0, min(n, size - 12))]).decode("utf-8", "replace")
        self.closed_why = f"code 0x{code:02x}: {reason}"

    def headers(self, on_frame, done):
        """Call ``on_frame(buf, pos, size)`` for each frame once at least ``min(LEN_HEAD, 4 + size)``
        bytes of it are at ``buf[pos:]`` (all of it up to LEN_WHOLE bytes); the rest of a longer frame
        is skipped unread. Until ``done()``."""
        buf = self.buf
        skip = 0
        while True:
            have, pos = self.have, 0
            if skip:
                pos = min(skip, have)
                skip -= pos
            while not skip and have - pos >= 4:
                size = _U32.unpack_from(buf, pos)[0]
                avail = have - pos
                if avail >= 4 + size:
                    on_frame(buf, pos, size)
                    pos += 4 + size
                elif avail >= LEN_HEAD and size > LEN_WHOLE:
                    on_frame(buf, pos, size)
                    skip = 4 + size - avail
                    pos = have
                else:
                    break
            left = have - pos
            if left:
                buf[:left] = buf[pos:have]
            self.have = left
            if done():
                return
            self._recv()

    @contextlib.contextmanager
    def heartbeats(self):
        """While the block runs (the connection idle: waiting for the harness's GO), send a Heartbeat
        every half interval, as a client must when it has nothing else to send; none after it."""
        if not self.heartbeat:
            yield
            return
        stop = threading.Event()
        lock = threading.Lock()
        beat = codec.frame(CMD_HEARTBEAT)

        def beats():
            while not stop.wait(self.heartbeat / 2):
                with lock:
                    if not stop.is_set():
                        self.sock.sendall(beat)
        t = threading.Thread(target=beats, daemon=True)
        t.start()
        try:
            yield
        finally:
            with lock:
                stop.set()
            t.join()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def _bytes32(b):
    return _U32.pack(len(b)) + b


# --- super streams (the scale-up row, bench._scaleup): made, located and deleted by the harness

def create_super_stream(conn, name, partitions, args=None):
    """CreateSuperStream ``name`` with ``partitions`` (binding keys "0", "1", ...) and stream arguments
    ``args``. Raises LoadgenError unless the broker answers OK."""
    keys = [str(i) for i in range(len(partitions))]
    conn.request(CMD_CREATE_SUPER_STREAM, codec.enc_string(name) + codec.enc_strings(partitions) +
                 codec.enc_strings(keys) + codec.enc_properties(args or {}))


def delete_super_stream(conn, name):
    """DeleteSuperStream ``name`` (and its partitions); one that is gone already is fine."""
    conn.request(CMD_DELETE_SUPER_STREAM, codec.enc_string(name), ok=(CODE_OK, CODE_STREAM_DOES_NOT_EXIST))


def leaders(conn, streams):
    """``{stream: (host, port) of its leader, or None}`` from one Metadata request."""
    body = conn.call(CMD_METADATA, codec.enc_strings(streams))
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, body, pos)
        pos += struct.calcsize(fmt)
        return v if len(v) > 1 else v[0]

    def string():
        nonlocal pos
        n = max(take(">h"), 0)
        pos += n
        return body[pos - n:pos].decode()
    brokers, out = {}, {}
    for _ in range(take(">i")):
        ref, host = take(">H"), string()
        brokers[ref] = (host, take(">I"))
    for _ in range(take(">i")):
        stream = string()
        code, leader = take(">HH")
        replicas = take(">i")
        pos += 2 * replicas
        out[stream] = brokers.get(leader) if code == CODE_OK else None
    return out


def publish_frame(batch, body):
    """A Publish v1 frame of ``batch`` messages (ids 1..batch), built with the project's codec."""
    entry = _U32.pack(len(body)) + body
    messages = b"".join(struct.pack(">Q", i + 1) + entry for i in range(batch))
    return codec.frame(CMD_PUBLISH, struct.pack(">BI", PUBLISHER_ID, batch) + messages)


def publish(conn, n, batch, body, inflight):
    """Send ``n`` messages in pre-encoded frames, at most ``inflight`` frames unconfirmed; returns when
    every one is confirmed. The confirms are counted by a second thread."""
    full = publish_frame(batch, body)
    tail = publish_frame(n % batch, body) if n % batch else None
    frames = n // batch
    window = batch * inflight
    state = {"confirmed": 0, "errors": 0, "code": None}
    cond = threading.Condition()

    def on_frame(buf, pos, size):
        key = struct.unpack_from(">H", buf, pos + 4)[0]
        if key == CMD_CLOSE:
            conn.note_close(buf, pos, size)
        elif key == CMD_PUBLISH_CONFIRM or key == CMD_PUBLISH_ERROR:
            count = _U32.unpack_from(buf, pos + 9)[0]
            with cond:
                state["confirmed"] += count
                if key == CMD_PUBLISH_ERROR:
                    state["errors"] += count
                    if state["code"] is None and count:
                        state["code"] = struct.unpack_from(">H", buf, pos + 21)[0]
                cond.notify()

    failure = []

    def reader():
        try:
            conn.headers(on_frame, lambda: state["confirmed"] >= n)
        except Exception as e:
            failure.append(e)
            with cond:
                cond.notify()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    sendall = conn.sock.sendall
    sent = 0
    for _ in range(frames):
        if sent - state["confirmed"] >= window:
            with cond:
                while sent - state["confirmed"] >= window and not failure:
                    cond.wait()
        if failure:
            break
        sendall(full)
        sent += batch
    if tail is not None and not failure:
        sendall(tail)
    t.join()
    if failure:
        raise failure[0]
    if state["errors"]:
        raise LoadgenError(f"{state['errors']} messages answered with PublishError (the first with code "
                           f"0x{state['code']:02x})")


def send_wait(conn, n, frame, lat=None):
    """Send ``frame`` (a Publish of one message) ``n`` times, each after the confirm of the one before,
    reading with plain blocking ``recv_into``; other frames (a heartbeat) are skipped. With ``lat`` (a
    list), each round trip's nanoseconds, from the write to the whole PublishConfirm read, are appended.
    Raises LoadgenError on a PublishError or when the broker closes the connection."""
    sock = conn.sock
    send = sock.sendall
    recv_into = sock.recv_into
    buf = conn.buf
    mv = memoryview(buf)
    clock = time.perf_counter_ns
    have = conn.have
    note = lat.append if lat is not None else None
    for _ in range(n):
        t = clock()
        send(frame)
        while True:
            if have >= 6:
                end = 4 + _U32.unpack_from(buf, 0)[0]
                if have >= end:
                    key = _KEY.unpack_from(buf, 4)[0]
                    if have > end:
                        buf[:have - end] = buf[end:have]
                    have -= end
                    if key == CMD_PUBLISH_CONFIRM:
                        break
                    if key == CMD_PUBLISH_ERROR:
                        raise LoadgenError("a message was answered with PublishError")
                    continue
            k = recv_into(mv[have:])
            if k == 0:
                raise LoadgenError("the broker closed the connection")
            have += k
        if note is not None:
            note(clock() - t)
    conn.have = have


def consume(conn, stream, n, credit):
    """Subscribe from the first offset and count records of user chunks until ``n``."""
    conn.request(CMD_SUBSCRIBE, struct.pack(">B", SUBSCRIPTION_ID) + codec.enc_string(stream) +
                 struct.pack(">HH", OFFSET_TYPE_FIRST, credit) + codec.enc_properties({}))
    one_credit = codec.frame(CMD_CREDIT, struct.pack(">BH", SUBSCRIPTION_ID, 1))
    sendall = conn.sock.sendall
    state = {"records": 0, "chunks": 0}

    def on_frame(buf, pos, size):
        if size >= LEN_PEEK - 4:
            _, key, _, _, _, chunk_type, _, records = _PEEK.unpack_from(buf, pos)
            if key == CMD_DELIVER:
                sendall(one_credit)
                state["chunks"] += 1
                if chunk_type == CHUNK_TYPE_USER:
                    state["records"] += records

    conn.headers(on_frame, lambda: state["records"] >= n)
    return state


def _setup(a):
    conn = Conn(a.host, a.port)
    # --stream-arg K=V: stream arguments (the cluster and scale-up rows: where the stream is led)
    props = dict(kv.split("=", 1) for kv in getattr(a, "stream_arg", None) or [])
    conn.request(CMD_CREATE, codec.enc_string(a.stream) + codec.enc_properties(props), ok=(CODE_OK, 5))
    conn.request(CMD_DECLARE_PUBLISHER, struct.pack(">B", PUBLISHER_ID) + codec.enc_string("") +
                 codec.enc_string(a.stream))
    return conn


def _delete(a):
    conn = Conn(a.host, a.port)
    try:
        conn.request(CMD_DELETE, codec.enc_string(a.stream), ok=(CODE_OK, 2))
    finally:
        conn.close()


async def run(runner):
    """Run ``runner.a.workload`` (loadgen-publish, loadgen-consume or loadgen-latency) against
    ``--host``/``--port``; the stream ``--stream`` is created here and deleted at the end. Blocking I/O: the event loop that
    ``bench._client`` runs is idle meanwhile."""
    a = runner.a
    body = runner.body
    batch = max(1, min(a.batch, 5000))
    conn = _setup(a)
    try:
        if a.workload == "loadgen-publish":
            publish(conn, batch, batch, body, a.inflight)        # untimed: the path is warm
            with conn.heartbeats():
                runner.wait_go()
            runner.start()
            publish(conn, a.n, batch, body, a.inflight)
            runner.stop()
        elif a.workload == "loadgen-latency":
            frame = publish_frame(1, body)
            with conn.heartbeats():
                runner.wait_go()
            send_wait(conn, a.warmup, frame)                     # untimed: the path is warm
            lat = []
            runner.start()
            send_wait(conn, a.timed, frame, lat)
            runner.stop()
            runner.latency(lat)
        else:
            publish(conn, a.n, batch, body, a.inflight)          # untimed fill
            conn.close()
            conn = Conn(a.host, a.port)
            with conn.heartbeats():
                runner.wait_go()
            runner.start()
            state = consume(conn, a.stream, a.n, a.inflight)
            runner.stop()
            runner.result.update(received=state["records"], chunks=state["chunks"],
                                 received_bytes=state["records"] * a.size)
    finally:
        conn.close()
        if not a.keep_stream:
            _delete(a)

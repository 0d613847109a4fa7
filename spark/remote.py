"""A small blocking RabbitMQ Stream client for Spark executors: plan and read offset ranges remotely.

Executors on other machines read a stream from a running ``riverbed serve`` (or any RabbitMQ Stream
broker) instead of the shared disk. The client speaks just what that needs: the handshake
(PeerProperties, SASL PLAIN, Tune, Open), Partitions, ResolveOffsetSpec, and Subscribe/Credit/Deliver/
Unsubscribe. A Deliver frame carries whole chunks (48-byte header + data), so the executor hands each one
to the compiled core's ``chunk_to_arrow(..., wire=True)`` exactly like a chunk read from LMDB, with no
per-message decoding.

Frames are encoded and decoded with the shell's own codec helpers (``riverbed.shells.rmq_stream``:
``frame``, ``enc_string``, ``enc_properties``, ``Reader`` and the command constants), so the two sides
cannot drift. URI: ``rabbitmq-stream://[user[:password]@]host[:port][/vhost]``; default guest/guest, port
5552, vhost ``/``. One client is one TCP connection; not thread-safe.
"""

import socket
import struct
import time
from urllib.parse import unquote, urlsplit

from riverbed.engine import core
from riverbed.engine import format as fmt
from riverbed.shells import rmq_stream as rmq

DEFAULT_PORT = 5552
DEFAULT_CREDIT = 8           # chunks in flight per subscription: enough to keep the socket busy
SUBSCRIPTION_ID = 0
_CREDIT = struct.Struct(">BH")


class RemoteError(RuntimeError):
    """The broker refused a command (``code`` is the response code) or broke the protocol."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


def parse_uri(uri):
    """``(host, port, user, password, vhost)`` from a ``rabbitmq-stream://`` URI. Raises ValueError."""
    u = urlsplit(uri)
    if u.scheme not in ("rabbitmq-stream", "rabbitmq-stream+tls") or not u.hostname:
        raise ValueError(f"{uri!r} is not rabbitmq-stream://[user[:password]@]host[:port][/vhost]")
    if u.scheme.endswith("+tls"):
        raise ValueError("TLS is not supported by the Spark reader yet")
    vhost = unquote(u.path[1:]) if u.path and u.path != "/" else "/"
    return (u.hostname, u.port or DEFAULT_PORT, unquote(u.username or "guest"), unquote(u.password or "guest"),
            vhost)


class StreamClient:
    """One authenticated, open connection. Use as a context manager. Raises RemoteError and OSError."""

    def __init__(self, uri, timeout=30.0):
        host, port, user, password, vhost = parse_uri(uri)
        self.timeout = timeout
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        self._corr = 0
        try:
            self._handshake(user, password, vhost)
        except BaseException:
            self.sock.close()
            raise

    # --------------------------------------------------------------------------------------- plumbing

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Close politely (Close command), then the socket. Idempotent; never raises."""
        if self.sock is None:
            return
        try:
            self._request(rmq.CMD_CLOSE, struct.pack(">H", rmq.RC_OK) + rmq.enc_string("spark reader done"))
        except Exception:   # noqa: BLE001 - closing a broken connection
            pass
        try:
            self.sock.close()
        finally:
            self.sock = None

    def _next_corr(self):
        self._corr += 1
        return self._corr

    def _send(self, key, body, version=1):
        self.sock.sendall(rmq.frame(key, body, version))

    def _read_exact(self, n):
        out = bytearray(n)
        view = memoryview(out)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if not k:
                raise RemoteError("the broker closed the connection")
            got += k
        return out

    def read_frame(self):
        """The next frame payload (key, version, body) as a bytearray; answers heartbeats itself."""
        while True:
            size = struct.unpack(">I", self._read_exact(4))[0]
            payload = self._read_exact(size)
            key = struct.unpack_from(">H", payload)[0]
            if key == rmq.CMD_HEARTBEAT:
                self._send(rmq.CMD_HEARTBEAT, b"")
                continue
            if key == rmq.CMD_CLOSE:
                r = rmq.Reader(payload)
                corr, code, reason = r.u32(), r.u16(), r.string()
                self.sock.sendall(rmq.response(rmq.CMD_CLOSE, corr, rmq.RC_OK))
                raise RemoteError(f"the broker closed the connection: {reason} (code {code})", code)
            return payload

    def _request(self, key, body_after_corr, ok=(rmq.RC_OK,)):
        """Send a command with a fresh correlation id; return ``(response code, Reader past it)``."""
        corr = self._next_corr()
        self._send(key, struct.pack(">I", corr) + body_after_corr)
        while True:
            payload = self.read_frame()
            k = struct.unpack_from(">H", payload)[0]
            if k == key | rmq.RESPONSE:
                r = rmq.Reader(payload)
                if r.u32() != corr:
                    continue
                code = r.u16()
                if code not in ok:
                    raise RemoteError(f"command 0x{key:02x} failed with response code 0x{code:02x}", code)
                return code, r
            # Deliver frames of a subscription being torn down, metadata updates: not for us

    def _handshake(self, user, password, vhost):
        self._request(rmq.CMD_PEER_PROPERTIES, rmq.enc_properties({"product": "riverbed-spark"}))
        mechanisms = self._request(rmq.CMD_SASL_HANDSHAKE, b"")[1].strings()
        if "PLAIN" not in mechanisms:
            raise RemoteError(f"the broker offers no PLAIN authentication ({mechanisms})")
        sasl = b"\0" + user.encode() + b"\0" + password.encode()
        self._request(rmq.CMD_SASL_AUTHENTICATE, rmq.enc_string("PLAIN") + struct.pack(">i", len(sasl)) + sasl)
        tune = self.read_frame()
        if struct.unpack_from(">H", tune)[0] != rmq.CMD_TUNE:
            raise RemoteError("expected Tune after authentication")
        frame_max, heartbeat = struct.unpack_from(">II", tune, 4)
        self.frame_max = frame_max
        self._send(rmq.CMD_TUNE, struct.pack(">II", frame_max, heartbeat))
        self._request(rmq.CMD_OPEN, rmq.enc_string(vhost))

    # ------------------------------------------------------------------------------------------- API

    def partitions(self, super_stream):
        """Partition stream names of ``super_stream`` in order, or None when it is not a super stream."""
        code, r = self._request(rmq.CMD_PARTITIONS, rmq.enc_string(super_stream),
                                ok=(rmq.RC_OK, rmq.RC_STREAM_DOES_NOT_EXIST))
        return r.strings() if code == rmq.RC_OK else None

    def metadata(self, streams):
        """``{stream: ((leader host, port) or None, [(replica host, port)])}`` of the ``streams`` that
        exist, as the broker's Metadata names them (on a cluster: the advertised stream addresses of
        the stream's leader and members; on a single node: itself, no replicas)."""
        corr = self._next_corr()
        self._send(rmq.CMD_METADATA, struct.pack(">I", corr) + rmq.enc_strings(list(streams)))
        while True:
            payload = self.read_frame()
            if struct.unpack_from(">H", payload)[0] != rmq.CMD_METADATA | rmq.RESPONSE:
                continue
            r = rmq.Reader(payload)
            if r.u32() != corr:
                continue
            brokers = {}
            for _ in range(r.count(8)):
                ref, host, port = r.u16(), r.string(), r.u32()
                brokers[ref] = (host, port)
            out = {}
            for _ in range(r.count(6)):
                name, code, leader = r.string(), r.u16(), r.u16()
                replicas = [brokers.get(r.u16()) for _ in range(r.count(2))]
                if code == rmq.RC_OK:
                    out[name] = (brokers.get(leader), [x for x in replicas if x is not None])
            return out

    def resolve(self, stream, kind, value=None):
        """The offset ``kind`` ("first", "last", "next", "offset", "timestamp" with ``value``) resolves to
        on ``stream``, as the broker would start a subscription there. Raises RemoteError (code 2 when
        the stream does not exist)."""
        _, r = self._request(rmq.CMD_RESOLVE_OFFSET_SPEC, rmq.enc_string(stream) + _offset_spec(kind, value) +
                          rmq.enc_properties({}))
        r.u16()
        return r.u64()

    def read_chunks(self, stream, start, end, idle_timeout=None):
        """Yield each delivered chunk (header + data, a bytearray) of ``stream`` from the one holding
        ``start`` until one reaches ``end`` (exclusive). ``end`` must not be beyond the committed end
        (plan it with ``resolve(stream, "next")``); ``idle_timeout`` seconds without a chunk raise
        RemoteError. Unsubscribes when done or abandoned."""
        if start >= end:
            return
        self._request(rmq.CMD_SUBSCRIBE, bytes([SUBSCRIPTION_ID]) + rmq.enc_string(stream) +
                      _offset_spec("offset", start) + struct.pack(">H", DEFAULT_CREDIT) + rmq.enc_properties({}))
        idle = idle_timeout or self.timeout
        try:
            deadline = time.monotonic() + idle
            while True:
                payload = self.read_frame()
                key, version = struct.unpack_from(">HH", payload)
                if key != rmq.CMD_DELIVER:
                    if time.monotonic() > deadline:
                        raise RemoteError(f"no chunk of {stream!r} for {idle:.0f} s")
                    continue
                skip = 5 if version == 1 else 13         # key, version, subscription id (+ committed id)
                self.sock.sendall(rmq.frame(rmq.CMD_CREDIT, _CREDIT.pack(SUBSCRIPTION_ID, 1)))
                chunk = memoryview(payload)[skip:]
                header = core.read_header(chunk)      # the engine parses the chunk header, as for LMDB
                chunk_id, records = header[fmt.H_CHUNK_ID], header[fmt.H_RECORDS]
                deadline = time.monotonic() + idle
                yield chunk
                if chunk_id + records >= end:
                    return
        finally:
            if self.sock is not None:
                try:
                    self._request(rmq.CMD_UNSUBSCRIBE, bytes([SUBSCRIPTION_ID]),
                                  ok=(rmq.RC_OK, rmq.RC_SUBSCRIPTION_ID_DOES_NOT_EXIST))
                except (OSError, RemoteError):
                    self.close()


def _offset_spec(kind, value):
    if kind == "first":
        return struct.pack(">H", rmq.OFFSET_TYPE_FIRST)
    if kind == "last":
        return struct.pack(">H", rmq.OFFSET_TYPE_LAST)
    if kind == "next":
        return struct.pack(">H", rmq.OFFSET_TYPE_NEXT)
    if kind == "offset":
        return struct.pack(">HQ", rmq.OFFSET_TYPE_OFFSET, value)
    if kind == "timestamp":
        return struct.pack(">Hq", rmq.OFFSET_TYPE_TIMESTAMP, value)
    raise ValueError(f"unknown offset spec {kind!r}")

"""A deliberately small, blocking RabbitMQ Stream client over a raw socket, written from the spec (not
from the server's codec), for bad-input tests and for commands rstream does not implement."""

import socket
import struct
import time

OK = 0x01
KEY_PUBLISH_CONFIRM = 0x03
KEY_PUBLISH_ERROR = 0x04
KEY_SUBSCRIBE = 0x07
KEY_DELIVER = 0x08
KEY_CREDIT = 0x09
OFFSET_FIRST = 1
LEN_CHUNK_HEADER = 48
POS_CHUNK_FIRST_OFFSET = 24      # in the chunk header: the offset of its first record
POS_DATA_LEN = 36


def s(text):
    b = text.encode()
    return struct.pack(">h", len(b)) + b


def props(d):
    return struct.pack(">i", len(d)) + b"".join(s(k) + s(v) for k, v in d.items())


def frame(key, body=b"", version=1):
    return struct.pack(">IHH", len(body) + 4, key, version) + body


class RawClient:
    def __init__(self, port, host="127.0.0.1", timeout=5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.corr = 0
        self.pushed = []     # frames received while waiting for something else

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data):
        self.sock.sendall(data)

    def next_corr(self):
        self.corr += 1
        return self.corr

    def recv_frame(self, timeout=5.0):
        """(key, version, body) of the next frame, or None on EOF. Raises socket.timeout."""
        self.sock.settimeout(timeout)
        while True:
            if len(self.buf) >= 4:
                n = struct.unpack_from(">I", self.buf)[0]
                if len(self.buf) >= 4 + n:
                    payload = self.buf[4:4 + n]
                    self.buf = self.buf[4 + n:]
                    key, version = struct.unpack_from(">HH", payload)
                    return key, version, payload[4:]
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self.buf += chunk

    def wait_for(self, key, corr=None, timeout=5.0):
        """The body of the next frame with ``key`` (and correlation id), keeping others in pushed."""
        deadline = time.monotonic() + timeout
        while True:
            f = self.recv_frame(max(0.01, deadline - time.monotonic()))
            if f is None:
                raise ConnectionError("connection closed while waiting for 0x%04x" % key)
            k, _, body = f
            if k == key and (corr is None or struct.unpack_from(">I", body)[0] == corr):
                return body
            self.pushed.append(f)

    def request(self, key, body, timeout=5.0):
        """Send a request with a fresh correlation id; returns (response code, rest of body)."""
        corr = self.next_corr()
        self.send(frame(key, struct.pack(">I", corr) + body))
        resp = self.wait_for(key | 0x8000, corr, timeout)
        return struct.unpack_from(">H", resp, 4)[0], resp[6:]

    def handshake(self, user="guest", password="guest", heartbeat=60, frame_max=1048576):
        self.request(0x11, props({"product": "rawwire"}))
        code, _ = self.request(0x12, b"")
        assert code == OK
        creds = b"\0" + user.encode() + b"\0" + password.encode()
        code, _ = self.request(0x13, s("PLAIN") + struct.pack(">i", len(creds)) + creds)
        if code != OK:
            return code
        tune = self.wait_for(0x14)
        server_frame_max, server_hb = struct.unpack(">II", tune)
        self.send(frame(0x14, struct.pack(">II", min(frame_max, server_frame_max), min(heartbeat, server_hb))))
        code, _ = self.request(0x15, s("/"))
        return code

    def create(self, stream, args=None):
        return self.request(0x0D, s(stream) + props(args or {}))[0]

    def delete(self, stream):
        return self.request(0x0E, s(stream))[0]

    def declare_publisher(self, pid, stream, ref=""):
        return self.request(0x01, struct.pack(">B", pid) + s(ref) + s(stream))[0]

    def publish(self, pid, messages):
        """messages: [(publishing id, bytes)]."""
        body = struct.pack(">Bi", pid, len(messages)) + b"".join(
            struct.pack(">QI", i, len(m)) + m for i, m in messages)
        self.send(frame(0x02, body))

    def publish_confirmed(self, pid, messages, timeout=5.0):
        """Publish and wait for confirms (or errors) of every id; returns ({id}, {id: code})."""
        self.publish(pid, messages)
        confirmed, errors = self.wait_confirms({i for i, _ in messages}, timeout)
        return set(confirmed), errors

    def wait_confirms(self, want, timeout=5.0):
        """Read PublishConfirm and PublishError frames until every id in ``want`` has one; returns
        ``([id] in the order confirmed, repeats kept, {id: code})``. Other frames go to ``pushed``.
        Raises ConnectionError when the server closes, socket.timeout past ``timeout`` seconds."""
        confirmed, errors = [], {}
        deadline = time.monotonic() + timeout
        while set(want) - set(confirmed) - set(errors):
            f = self.recv_frame(max(0.01, deadline - time.monotonic()))
            if f is None:
                raise ConnectionError("closed while waiting for confirms")
            k, _, body = f
            if k == KEY_PUBLISH_CONFIRM:
                n = struct.unpack_from(">i", body, 1)[0]
                confirmed.extend(struct.unpack_from(">%dQ" % n, body, 5))
            elif k == KEY_PUBLISH_ERROR:
                n = struct.unpack_from(">i", body, 1)[0]
                for j in range(n):
                    i, c = struct.unpack_from(">QH", body, 5 + 10 * j)
                    errors[i] = c
            else:
                self.pushed.append(f)
        return confirmed, errors

    def read_from_first(self, stream, settle=0.5, timeout=10.0, sub_id=0):
        """Every record of ``stream`` (subscription ``sub_id`` at FIRST, credit 10) until ``settle``
        seconds pass without a chunk: the list indexed by offset (a chunk that does not start where the
        last ended fails). A cluster node's readers stop at the committed offset."""
        code, _ = self.request(KEY_SUBSCRIBE, struct.pack(">B", sub_id) + s(stream)
                               + struct.pack(">HH", OFFSET_FIRST, 10) + props({}))
        assert code == OK, f"Subscribe {stream!r}: code {code:#x}"
        log = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pushed:
                f = self.pushed.pop(0)
            else:
                try:
                    f = self.recv_frame(settle)
                except socket.timeout:
                    return log
            assert f is not None, "the server closed the reading connection"
            key, _, body = f
            if key == KEY_DELIVER and body[0] == sub_id:
                first, records = delivered_chunk(body)
                assert first == len(log), f"chunk at {first} after {len(log)} records"
                log.extend(records)
                self.send(frame(KEY_CREDIT, struct.pack(">BH", sub_id, 1)))
        raise AssertionError(f"{stream!r} still delivering after {timeout} s")

    def stream_stats(self, stream):
        code, rest = self.request(0x1C, s(stream))
        n = struct.unpack_from(">i", rest)[0]
        pos, out = 4, {}
        for _ in range(n):
            ln = struct.unpack_from(">h", rest, pos)[0]
            name = rest[pos + 2:pos + 2 + ln].decode()
            pos += 2 + ln
            out[name] = struct.unpack_from(">q", rest, pos)[0]
            pos += 8
        return code, out

    def expect_close(self, timeout=5.0):
        """Read until the server's Close frame; return its code, and check the socket then closes."""
        code = None
        deadline = time.monotonic() + timeout
        while True:
            f = self.recv_frame(max(0.01, deadline - time.monotonic()))
            if f is None:
                return code
            k, _, body = f
            if k == 0x16:
                code = struct.unpack_from(">H", body, 4)[0]

    def closed_within(self, timeout):
        """True if the server closes the connection (EOF/reset) within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.recv_frame(max(0.01, deadline - time.monotonic())) is None:
                    return True
        except socket.timeout:
            return False
        return False


def entry_records(data):
    """The records of an Osiris data section (simple entries and uncompressed sub-batches)."""
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        if n & 0x80000000:
            _, nrec, _, size = struct.unpack_from(">BHII", data, pos)
            inner, q = data[pos + 11:pos + 11 + size], 0
            for _ in range(nrec):
                (m,) = struct.unpack_from(">I", inner, q)
                out.append(bytes(inner[q + 4:q + 4 + m]))
                q += 4 + m
            pos += 11 + size
        else:
            out.append(bytes(data[pos + 4:pos + 4 + n]))
            pos += 4 + n
    return out


def delivered_chunk(body):
    """``(first offset, [record bytes])`` of a Deliver v1 body (subscription id, then the chunk)."""
    first = struct.unpack_from(">Q", body, 1 + POS_CHUNK_FIRST_OFFSET)[0]
    data_len = struct.unpack_from(">I", body, 1 + POS_DATA_LEN)[0]
    return first, entry_records(body[1 + LEN_CHUNK_HEADER:1 + LEN_CHUNK_HEADER + data_len])


def connect(port, host="127.0.0.1", timeout=5.0):
    """A RawClient past the handshake as guest; raises ConnectionError if it is refused."""
    c = RawClient(port, host=host, timeout=timeout)
    if c.handshake() != OK:
        c.close()
        raise ConnectionError("handshake refused")
    return c


def read_stream(port, stream, settle=0.5, timeout=10.0):
    """Every record stored in ``stream`` on the server at ``port``: RawClient.read_from_first on a
    connection of its own."""
    c = connect(port)
    try:
        return c.read_from_first(stream, settle, timeout)
    finally:
        c.close()

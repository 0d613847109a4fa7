"""Blocking one-message-at-a-time publishers of the five protocols, for the forwarding tests: each
``publish(marker)`` returns once the node acknowledged it (True) or refused it (False); a dropped
connection raises OSError (the caller reconnects). Every message carries its marker (``b"bson-17"``)
so that the final log can be checked whatever the stored form (BSON, JSON text, AMQP, raw bytes)."""

import json
import re
import socket
import urllib.error
import urllib.request

import zmq

import rawwire
from bsonwire import RawBson

MARKER = re.compile(rb"(rmq|bson|zmq|ws|ream)-(\d+)")
RMQ_BATCH = re.compile(rb"m-\d+")


def markers(records):
    """``[(protocol, n)]`` of the markers in ``records`` (raw stored records), in log order."""
    out = []
    for r in records:
        m = MARKER.search(r)
        if m:
            out.append((m.group(1).decode(), int(m.group(2))))
        elif RMQ_BATCH.fullmatch(r):      # test_replication.publish_batches' messages
            out.append(("rmq", int(r[2:])))
    return out


class RmqPub:
    """RabbitMQ Stream, raw frames, a named publisher (dedup): the publishing id is the message number."""

    def __init__(self, port, stream, ref, timeout=5.0):
        self.c = rawwire.RawClient(port, timeout=timeout)
        assert self.c.handshake() == rawwire.OK
        assert self.c.declare_publisher(1, stream, ref) == rawwire.OK
        self.timeout = timeout

    def publish(self, n):
        try:
            ok, bad = self.c.publish_confirmed(1, [(n, b"rmq-%d" % n)], timeout=self.timeout)
        except socket.timeout:
            return False
        return n in ok

    def close(self):
        self.c.close()


class BsonPub:
    """BSON/TCP PUB with a request id: RESPONSE ok after the commit."""

    def __init__(self, port, stream, timeout=5.0):
        self.raw = RawBson(port, timeout=timeout)
        self.stream = stream
        self.timeout = timeout
        self.rid = 0

    def publish(self, n):
        self.rid += 1
        self.raw.send("PUB", {"channel": self.stream, "event": {"m": "bson-%d" % n}, "rID": self.rid})
        try:
            while True:
                f = self.raw.recv(self.timeout)["frame"]
                if f.get("rID") == self.rid:
                    return bool(f.get("ok"))
        except EOFError:
            raise ConnectionError("closed") from None
        except socket.timeout:
            self.raw.close()
            raise ConnectionError("no answer") from None

    def close(self):
        self.raw.close()


class ZmqPub:
    """ZeroMQ mc0 PUT with an ID from a DEALER: OK after the commit, ERROR when refused."""

    def __init__(self, port, stream, timeout=5.0, ctx=None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        self.stream = stream
        self.timeout = timeout

    def publish(self, n):
        rid = b"z%d" % n
        self.sock.send_multipart([b"", b"PUT", b"TOPIC", self.stream.encode(), b"ID", rid, b"", b"zmq-%d" % n])
        while self.sock.poll(int(self.timeout * 1000)):
            msg = self.sock.recv_multipart()
            if rid in msg:
                return msg[1] == b"OK"
        raise ConnectionError("no answer")

    def close(self):
        self.sock.close(linger=0)


class WsRestPub:
    """The WebSocket listener's REST publish (POST /api/v1/streams/:id/data): 200 after the commit."""

    def __init__(self, port, stream, timeout=5.0):
        self.url = f"http://127.0.0.1:{port}/api/v1/streams/{stream}/data"
        self.timeout = timeout

    def publish(self, n):
        req = urllib.request.Request(self.url, data=json.dumps({"m": "ws-%d" % n}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return r.status == 200
        except urllib.error.HTTPError:
            return False
        except (urllib.error.URLError, socket.timeout) as e:
            raise ConnectionError(str(e))

    def close(self):
        pass


class ReamPub:
    """REAM EVENT PUBLISH: EVENT PUBLISHED after the commit, EVENT NON PUBLISHED when refused."""

    def __init__(self, port, stream, timeout=5.0):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.stream = stream
        self.buf = b""
        self._line()     # the banner

    def _line(self):
        while b"\n" not in self.buf:
            chunk = self.s.recv(1 << 16)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def publish(self, n):
        payload = json.dumps({"m": "ream-%d" % n}).encode()
        self.s.sendall(b"EVENT PUBLISH %s %d\n%s\n" % (self.stream.encode(), len(payload), payload))
        try:
            line = self._line()
        except socket.timeout:
            self.s.close()
            raise ConnectionError("no answer")
        if line.startswith("EVENT NON PUBLISHED"):
            # a refusal may carry a payload line of its own
            return False
        return line.startswith("EVENT PUBLISHED")

    def close(self):
        self.s.close()


def publisher(proto, srv, stream, ref="rmq-pub"):
    """A publisher of ``proto`` connected to node ``srv`` (a ServerProcess)."""
    if proto == "rmq":
        return RmqPub(srv.port, stream, ref)
    if proto == "bson":
        return BsonPub(srv.ports["bson"], stream)
    if proto == "zmq":
        return ZmqPub(srv.ports["zmq"], stream)
    if proto == "ws":
        return WsRestPub(srv.ports["ws"], stream)
    if proto == "ream":
        return ReamPub(srv.ports["ream"], stream)
    raise ValueError(proto)

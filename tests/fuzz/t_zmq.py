"""ZeroMQ mc0: the request parser (codec) and McShell (the session of every client of one ROUTER).

libzmq does the framing on the wire; what reaches Riverbed is a routing identity and a list of frames.
Input: flag byte, then messages, each ``u8 identity | u8 frame count | (u16 length | bytes) x count``
(big-endian; a short tail ends the input). FLAG_PRELUDE makes the harness send CONNECT for identity 0
first.
"""

import struct

from riverbed.shells.zmq_mc0 import codec
from riverbed.shells.zmq_mc0.codec import RequestError
from riverbed.shells.zmq_mc0.session import GONE, SENT, McShell

from .harness import FLAG_PRELUDE, SessionTarget

PROBE_ID = b"fuzz-probe"


def encode_messages(messages):
    """Fuzz bytes for ``[(identity byte, [frame bytes...])]``."""
    out = bytearray()
    for ident, frames in messages:
        out += bytes((ident & 0xFF, len(frames) & 0xFF))
        for f in frames:
            out += struct.pack(">H", len(f)) + f
    return bytes(out)


def decode_messages(body):
    msgs = []
    pos = 0
    n = len(body)
    while pos + 2 <= n:
        ident, count = body[pos], body[pos + 1]
        pos += 2
        frames = []
        for _ in range(count):
            if pos + 2 > n:
                break
            ln = struct.unpack_from(">H", body, pos)[0]
            pos += 2
            frames.append(body[pos:pos + ln])
            pos += ln
        msgs.append((b"id%d" % ident, frames))
    return msgs


class ZmqIO:
    """The ROUTER's io: frames per identity; identities in ``gone`` have disconnected."""

    def __init__(self):
        self.sent = []
        self.deferred = []
        self.gone = set()

    def send(self, identity, frames):
        if identity in self.gone:
            return GONE
        self.sent.append((identity, list(frames)))
        return SENT

    def defer(self, fn, *args):
        self.deferred.append((fn, args))


def req(*frames):
    return [b""] + [f if isinstance(f, bytes) else f.encode() for f in frames]


class ZmqTarget(SessionTarget):
    name = "zmq"
    codec_errors = (RequestError,)

    def make_shell(self):
        self.io = ZmqIO()
        self.rig.ios = [self.io]
        return McShell(self.rig.broker, self.io)

    def close_shell(self):
        self.shell.close()

    def _clean_up(self):
        for client in list(self.shell.clients.values()):
            self.shell.forget(client, None)
        super()._clean_up()

    def codec(self, body):
        for _, frames in decode_messages(body):
            try:
                r = codec.parse_request(frames)
            except RequestError:
                continue
            for k, v in r.headers:
                codec.shown(v)
            if r.verb == codec.VERB_PUT:
                try:
                    codec.put_record(r.headers, r.body)
                except RequestError:
                    pass

    def open_session(self):
        self.io.sent.clear()
        return self.shell

    def prelude(self, s):
        s.handle(b"id0", req("CONNECT", "VERSION", "1", "ID", "c"))

    def feed(self, s, piece):
        raise AssertionError("not used")

    def session_run(self, flags, body):
        s = self.open_session()
        if flags & FLAG_PRELUDE:
            self.prelude(s)
        for ident, frames in decode_messages(body):
            s.handle(ident, frames)
        self.rig.settle()
        if flags & 0x08:
            self.rig.now += 100.0
            s.tick(self.rig.now)
            self.rig.settle()
        # a well-formed request from a new identity and from every identity the input used
        idents = {ident for ident, _ in decode_messages(body)} | {PROBE_ID} | set(self.shell.clients)
        self.io.sent.clear()
        for ident in idents:
            s.handle(ident, req("NOOP", "ID", "probe"))
        self.rig.settle()
        answered = {i for i, f in self.io.sent if f[:2] == [b"", b"OK"] or f[:2] == [b"", b"ERROR"]}
        missing = idents - answered
        if missing:
            from .harness import InvariantBroken
            raise InvariantBroken(f"NOOP after the input got no answer for {sorted(missing)!r}")
        # every client goes away: state must go with it
        for ident in idents:
            s.handle(ident, req("DISCONNECT"))
        self.rig.settle()
        self.io.gone.update(self.shell.clients)
        s.tick(self.rig.now)
        self.rig.settle()
        self.io.gone.clear()
        if self.shell.clients or self.rig.broker.sessions:
            from .harness import InvariantBroken
            raise InvariantBroken(f"clients left after DISCONNECT: {list(self.shell.clients)[:3]!r}")

    def seeds(self):
        m = encode_messages
        p = bytes([FLAG_PRELUDE])
        return [
            b"\x00" + m([(0, req("CONNECT", "VERSION", "1", "ID", "c", "TTL", "5000"))]),
            p + m([(0, req("PUT", "TOPIC", "t", "X-K", "v", "", "b1", "b2"))]),
            p + m([(0, req("SUB", "ID", "s", "", "t")), (1, req("PUT", "TOPIC", "t", "", "body"))]),
            p + m([(0, req("SUB", "ID", "s", "X-OFFSET", "0", "", "t")), (0, req("UNSUB", "", "t"))]),
            p + m([(0, req("PUT", "TOPIC", "t", "MESSAGE", "m", "", '{"a":1}')), (0, req("NOOP", "ID", "n"))]),
            p + m([(0, req("DISCONNECT")), (0, req("NOOP"))]),
            p + m([(2, req("CONNECT", "TTL", "1", "ID", "x")), (2, req("SUB", "", "a", "b", "c"))]),
            b"\x00" + m([(0, [b"", b"BOGUS", b"ID"])]),
        ]

"""WebSocket JSON (Streamr v28): the request parser and checks (codec), and WsSession (session).

aiohttp does the WebSocket framing; what reaches Riverbed is one text (str) or binary (bytes) message at
a time. Input: flag byte, then messages, each ``u8 kind | u16 length | bytes`` (kind bit 0: binary,
else text, decoded as UTF-8 with replacement as aiohttp hands only valid text on). FLAG_PRELUDE
subscribes to stream ``s`` first, so the input's publishes are delivered back.
"""

import json
import struct

from riverbed.shells.ws_json import WsSession, WsShell, codec
from riverbed.shells.ws_json.codec import RequestError
from riverbed.shells.ws_json.session import ST_OPEN

from .harness import FLAG_PRELUDE, SessionTarget

PROBE = json.dumps({"type": "unsubscribe", "stream": "__fuzz_probe"})


def encode_messages(messages):
    out = bytearray()
    for m in messages:
        binary = isinstance(m, bytes)
        data = m if binary else m.encode("utf-8", "surrogatepass")
        out += struct.pack(">BH", 1 if binary else 0, len(data)) + data
    return bytes(out)


def decode_messages(body):
    out = []
    pos = 0
    while pos + 3 <= len(body):
        kind, n = struct.unpack_from(">BH", body, pos)
        pos += 3
        data = body[pos:pos + n]
        pos += n
        out.append(bytes(data) if kind & 1 else bytes(data).decode("utf-8", "replace"))
    return out


class WsIO:
    def __init__(self, rig):
        self.rig = rig
        self.out = bytearray()
        self.closed = None
        self.aborted = None
        self.deferred = []
        self.reading = True

    def write(self, data):
        self.out += data

    def buffer_size(self):
        return 0

    def close(self, code, reason):
        self.closed = (code, reason)

    def abort(self, reason):
        self.aborted = reason

    def defer(self, fn):
        self.deferred.append((fn, ()))

    def call_later(self, seconds, fn):
        self.deferred.append((fn, ()))

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True


class WsTarget(SessionTarget):
    name = "ws"
    codec_errors = (RequestError,)

    def make_shell(self):
        return WsShell(self.rig.broker, defer=lambda fn: self.rig.q.put((fn, ())))

    def codec(self, body):
        for m in decode_messages(body):
            try:
                req = codec.parse_request(m)
            except RequestError:
                continue
            for check in (codec.request_stream, codec.request_partition, codec.check_publish, codec.resend_variant):
                try:
                    check(req)
                except RequestError:
                    pass

    def open_session(self):
        io = WsIO(self.rig)
        self.rig.ios = [io]
        return WsSession(self.shell, io, peer=("127.0.0.1", 5000), local=("127.0.0.1", 8890), peer_loopback=True)

    def prelude(self, s):
        s.text_received(json.dumps({"type": "subscribe", "stream": "s"}))
        self.rig.settle()
        s.io.out.clear()

    def session_run(self, flags, body):
        s = self.open_session()
        if flags & FLAG_PRELUDE:
            self.prelude(s)
        for m in decode_messages(body):
            if isinstance(m, bytes):
                s.binary_received(m)
            else:
                s.text_received(m)
        self.rig.settle()
        answered = self.probe(s)
        if answered is False:
            from .harness import InvariantBroken
            raise InvariantBroken("a well-formed request after the input got no answer")
        s.connection_lost()
        self.rig.settle()
        if self.rig.broker.sessions:
            from .harness import InvariantBroken
            raise InvariantBroken("session still registered after connection_lost")

    def probe(self, s):
        if s.state != ST_OPEN or s.io.closed or s.io.aborted:
            return None
        mark = len(s.io.out)
        s.text_received(PROBE)
        self.rig.settle()
        return len(s.io.out) > mark

    def seeds(self):
        m = encode_messages
        p = bytes([FLAG_PRELUDE])
        pub = lambda **kw: json.dumps(dict({"type": "publish", "stream": "s", "msg": json.dumps({"a": 1})}, **kw))
        return [
            b"\x00" + m([pub()]),
            p + m([pub(ts=1234, pkey="k"), pub(msg='{"b":[1,2,{"c":null}]}')]),
            p + m([pub(), json.dumps({"type": "resend", "stream": "s", "resendLast": 2, "sub": "r"})]),
            p + m([pub(), json.dumps({"type": "resend", "stream": "s", "resendFrom": {"offset": 0}, "sub": "r"})]),
            p + m([pub(), json.dumps({"type": "resend", "stream": "s", "resendFrom": {"offset": 0},
                                      "resendTo": {"offset": 1}, "partition": 0})]),
            b"\x00" + m([json.dumps({"type": "subscribe", "stream": "t", "partition": 0}),
                         json.dumps({"type": "unsubscribe", "stream": "t"})]),
            b"\x00" + m([pub().encode(), b"\xff\xfe"]),
            b"\x00" + m([json.dumps({"type": "publish", "stream": "s", "msg": "[1,2]", "authKey": "k"})]),
            b"\x00" + m(["{}", "[]", '{"type": 5}', '{"type":"nope"}']),
        ]

"""BSON/TCP (mewbase): the frame splitter, the PUB recogniser and the envelope decoder (codec), and
BsonSession (session).

Input: flag byte, then raw client bytes (BSON documents back to back). With FLAG_PRELUDE the harness
first sends CONNECT, so the fuzz bytes reach an open connection.
"""

import struct

import bson
from bson.int64 import Int64

from riverbed.engine.errors import FrameError
from riverbed.shells import _pywire, wire
from riverbed.shells.bson_tcp import codec as c
from riverbed.shells.bson_tcp.session import ST_CLOSED, ST_OPEN, BsonSession
from riverbed.shells.bson_tcp.shell import BsonShell

from .harness import FLAG_PRELUDE, FakeIO, InvariantBroken, SessionTarget

PROBE_RID = 0x5EED


def envelope(ftype, frame):
    return bson.encode({"type": ftype, "frame": frame})


PRELUDE = envelope("CONNECT", {"version": "0.1"})
PROBE_OPEN = envelope("LISTCHANNELS", {"rID": PROBE_RID})


def documents(out, start):
    docs = []
    pos = start
    while len(out) - pos >= 4:
        n = struct.unpack_from("<i", out, pos)[0]
        if n < 5 or len(out) - pos < n:
            break
        docs.append(bson.decode(bytes(out[pos:pos + n])))
        pos += n
    return docs


class BsonTarget(SessionTarget):
    name = "bson"
    codec_errors = (FrameError, c.DecodeError)

    def make_shell(self):
        return BsonShell(self.rig.broker)

    def codec(self, body):
        frames, _ = wire.split_bson_frames(body, c.MAX_FRAME)
        for raw in frames:
            pub = wire.bson_pub(raw)
            twin = _pywire.bson_pub(raw) if not isinstance(raw, memoryview) else _pywire.bson_pub(bytes(raw))
            if wire.COMPILED and pub != twin:
                raise InvariantBroken(f"bson_pub: compiled {pub!r} != pure {twin!r}")
            try:
                c.decode_envelope(raw)
            except c.DecodeError:
                pass

    def open_session(self):
        io = FakeIO()
        self.rig.ios = [io]
        return BsonSession(self.shell, io, peer="fuzz", peer_loopback=True)

    def prelude(self, s):
        s.data_received(PRELUDE)
        self.rig.settle()
        s.io.out.clear()

    def feed(self, s, piece):
        s.data_received(piece)

    def probe(self, s):
        if s.io.closed or s.state == ST_CLOSED or s._buf or not s.io.reading:
            return None
        mark = len(s.io.out)
        if s.state == ST_OPEN:
            s.data_received(PROBE_OPEN)
            self.rig.settle()
            return s.io.closed or any(d.get("frame", {}).get("rID") == PROBE_RID for d in documents(s.io.out, mark))
        s.data_received(PRELUDE)
        self.rig.settle()
        return s.io.closed or any(d.get("type") == "RESPONSE" for d in documents(s.io.out, mark))

    def seeds(self):
        p = bytes([FLAG_PRELUDE])
        e = envelope
        return [
            b"\x00" + PRELUDE,
            b"\x00" + e("CONNECT", {"version": "0.1", "username": "u", "password": "p"}),
            p + e("PUB", {"channel": "ch", "event": {"a": 1, "b": "x"}, "rID": 1}),
            p + e("PUB", {"channel": "ch", "event": {"a": 1}, "rID": 2, "sessID": 3})
            + e("STARTTX", {"rID": 3, "sessID": 9}) + e("PUB", {"channel": "ch", "event": {"n": [1, 2]}, "sessID": 9})
            + e("COMMITTX", {"rID": 4, "sessID": 9}),
            p + e("PUB", {"channel": "ch", "event": {"a": 1}, "rID": 1})
            + e("SUBSCRIBE", {"rID": 5, "channel": "ch", "startPos": Int64(0), "durableID": "d"})
            + e("ACKEV", {"subID": 0, "pos": Int64(0), "bytes": 10}) + e("UNSUBSCRIBE", {"subID": 0})
            + e("SUBCLOSE", {"subID": 0}),
            p + e("CREATECHANNEL", {"rID": 6, "name": "c2"}) + e("LISTCHANNELS", {"rID": 7})
            + e("LISTCHANNNELS", {"rID": 8}),
            p + e("CREATEBINDER", {"rID": 9, "name": "b1"}) + e("LISTBINDERS", {"rID": 10}),
            p + e("CREATEBINDER", {"rID": 9, "name": "b1"})
            + e("FINDBYID", {"rID": 11, "binder": "b1", "docID": "x"})
            + e("QUERY", {"rID": 12, "queryID": 1, "binder": "b1", "matcher": {"a": {"$gt": 1}}})
            + e("QUERYACK", {"queryID": 1, "bytes": 100}),
            p + e("CREATEPROJECTION", {"rID": 13, "name": "pr", "channel": "ch", "binder": "b1",
                                        "eventFilter": {}, "identityExpression": "a"}),
            p + e("PING", {"sequence": 4, "type": 8}) + e("ABORTTX", {"rID": 1, "sessID": 1}),
            p + e("PUB", {"channel": "ch", "event": {"d": {"e": {"f": [1, {"g": None}]}}}, "rID": 1}),
        ]

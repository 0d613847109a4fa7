"""The BSON/TCP session as a sans-I/O state machine over a real engine: a fake ``io`` records bytes and
the broker's ``post`` queue is drained by the test instead of an event loop."""

import struct

import bson
import pytest
from bson.int64 import Int64

from riverbed.shells import auth
from riverbed.shells.bson_tcp.session import BsonSession
from riverbed.shells.bson_tcp.shell import BsonShell

from .harness import Loop


class Harness(Loop):
    def __init__(self, tmp_path, users=None):
        super().__init__(tmp_path, auth=auth.Authenticator(users) if users else None)
        self.shell = BsonShell(self.broker)


class Conn:
    def __init__(self, h, loopback=True, connect=True):
        self.h = h
        self.io = h.new_io()
        self.s = BsonSession(h.shell, self.io, peer="test", peer_loopback=loopback)
        if connect:
            self.send("CONNECT", {"version": "0.1"})
            assert self.frames() == [{"type": "RESPONSE", "frame": {"ok": True}}]

    def send(self, ftype, frame):
        self.s.data_received(bson.encode({"type": ftype, "frame": frame}))

    def send_many(self, frames):
        self.s.data_received(b"".join(bson.encode({"type": t, "frame": f}) for t, f in frames))

    def frames(self):
        self.h.settle()
        out = []
        buf = self.io.out
        while len(buf) >= 4:
            n = struct.unpack_from("<i", buf)[0]
            out.append(bson.decode(bytes(buf[:n])))
            del buf[:n]
        return out


@pytest.fixture
def h(tmp_path):
    h = Harness(tmp_path)
    yield h
    h.close()


def test_non_loopback_refused_without_users_file(h):
    c = Conn(h, loopback=False, connect=False)
    c.send("CONNECT", {"version": "0.1"})
    f = c.frames()[0]["frame"]
    assert f["ok"] is False and f["errCode"] == 1 and c.io.closed


def test_users_file_checks_credentials(tmp_path):
    users = tmp_path / "users.toml"
    auth.add_user(str(users), "alice", "pw", write="^a", read="^a", configure="^a")
    h = Harness(tmp_path, users=str(users))
    try:
        c = Conn(h, loopback=False, connect=False)
        c.send("CONNECT", {"version": "0.1", "username": "alice", "password": "pw"})
        assert c.frames()[0]["frame"] == {"ok": True}
        c.send("PUB", {"channel": "b1", "event": {"x": 1}, "rID": 1})
        assert c.frames()[0]["frame"]["errCode"] == 2 and not c.io.closed
        c.send("PUB", {"channel": "a1", "event": {"x": 1}, "rID": 2})
        assert c.frames()[0]["frame"] == {"ok": True, "rID": 2}
        assert not h.broker.has_stream("b1")
    finally:
        h.close()


def test_frames_before_connect_and_second_connect(h):
    c = Conn(h, connect=False)
    c.send("LISTCHANNELS", {"rID": 11})
    assert c.frames()[0]["frame"] == {"ok": False, "rID": 11, "errCode": 2, "errMsg": "CONNECT first"}
    assert c.io.closed
    c = Conn(h)
    c.send("CONNECT", {"version": "0.1", "rID": 3})
    assert c.frames()[0]["frame"]["ok"] is False and not c.io.closed


def test_pipelined_pubs_are_one_append_and_answered_in_order(h):
    c = Conn(h)
    c.send_many([("PUB", {"channel": "p", "event": {"i": i}, "rID": i}) for i in range(500)])
    fs = c.frames()
    assert [f["frame"] for f in fs] == [{"ok": True, "rID": i} for i in range(500)]
    info = h.eng.stream_info("p")
    chunks = h.eng.read_chunks("p", 0, 100)
    assert len(chunks) == 1, info          # one batch, one chunk


def test_pub_then_other_frame_keeps_order(h):
    c = Conn(h)
    c.send_many([("PUB", {"channel": "o", "event": {"i": 1}, "rID": 1}),
                 ("SUBSCRIBE", {"channel": "o", "rID": 2, "startPos": Int64(0)})])
    fs = c.frames()
    types = [f["type"] for f in fs]
    # the SUBSCRIBE waits for the channel the PUB creates (answers may come in any order, but the
    # SUBRESPONSE always before the subscription's first RECEV)
    assert sorted(types) == ["RECEV", "RESPONSE", "SUBRESPONSE"], fs
    assert types.index("SUBRESPONSE") < types.index("RECEV")
    assert fs[types.index("RECEV")]["frame"]["event"] == {"i": 1}


def test_split_reads_and_a_bad_length_after_good_frames(h):
    c = Conn(h)
    data = b"".join(bson.encode({"type": "PING", "frame": {"type": 8, "sequence": i}}) for i in range(3))
    for i in range(0, len(data), 7):
        c.s.data_received(data[i:i + 7])
    assert [f["frame"]["sequence"] for f in c.frames()] == [1, 2, 3]
    c.s.data_received(bson.encode({"type": "PING", "frame": {"type": 8, "sequence": 9}}) + struct.pack("<i", 1 << 30))
    fs = c.frames()
    assert fs[0]["frame"]["sequence"] == 10 and fs[1]["frame"]["ok"] is False and c.io.closed


def test_unknown_type_and_bad_fields_keep_the_connection(h):
    c = Conn(h)
    c.send("NOPE", {"rID": 1})
    c.send("SUBSCRIBE", {"rID": 2, "channel": 5})
    c.send("CREATECHANNEL", {"rID": 3})
    c.send("FINDBYID", {"rID": 4, "binder": "none", "docID": 1})
    fs = [f["frame"] for f in c.frames()]
    assert [(f["rID"], f["ok"], f["errCode"]) for f in fs] == [(1, False, 6), (2, False, 6), (3, False, 6),
                                                               (4, False, 4)]
    assert not c.io.closed


def test_durable_ack_holds_later_replies_until_stored(h):
    c = Conn(h)
    c.send_many([("PUB", {"channel": "d", "event": {"i": i}, "rID": i}) for i in range(3)])
    c.frames()
    c.send("SUBSCRIBE", {"channel": "d", "rID": 10, "startPos": Int64(0), "durableID": "x"})
    fs = c.frames()
    assert fs[0]["frame"]["subID"] == 0 and len(fs) == 4
    c.send_many([("ACKEV", {"subID": 0, "bytes": 100, "pos": Int64(1)}), ("SUBCLOSE", {"subID": 0, "rID": 11})])
    assert bytes(c.io.out) == b""             # the SUBCLOSE answer waits for the ACKEV's commit
    assert [f["frame"] for f in c.frames()] == [{"ok": True, "rID": 11}]
    assert h.eng.query_offset("d", "mewbase-durable:x") == 1
    c.send("SUBSCRIBE", {"channel": "d", "rID": 12, "durableID": "x"})
    fs = c.frames()
    assert [f["frame"].get("pos") for f in fs[1:]] == [2]


def test_transaction_limits_and_discard_on_close(h):
    c = Conn(h)
    c.send("STARTTX", {"sessID": 1, "rID": 1})
    c.send("PUB", {"channel": "t", "event": {"a": 1}, "rID": 2, "sessID": 1})
    c.send("PUB", {"channel": "t", "event": {"a": 2}, "rID": 3, "sessID": 2})   # no tx on 2: published
    fs = [f["frame"] for f in c.frames()]
    assert [f["rID"] for f in fs] == [1, 2, 3] and all(f["ok"] for f in fs)
    c.s.connection_lost()         # the open transaction on 1 is discarded
    h.settle()
    chunks = h.eng.read_chunks("t", 0, 10)
    assert len(chunks) == 1 and int.from_bytes(chunks[0][1][4:8], "big") == 1     # one record: the PUB on 2


def test_stream_deleted_ends_subscriptions(h):
    c = Conn(h)
    c.send("PUB", {"channel": "gone", "event": {"a": 1}, "rID": 1})
    c.send("SUBSCRIBE", {"channel": "gone", "rID": 2})
    c.frames()
    done = []
    h.broker.delete_stream("gone", done.append)
    h.settle()
    assert done == [None] and c.s.subscriptions == {}


def test_pub_fast_path_stores_what_the_slow_path_would(h):
    # wire.bson_pub takes well-formed PUBs without decoding them; anything else (here: a regex, an extra
    # field, a DBRef-shaped event, bad BSON) takes the decoding path. Both store the event's BSON as is.
    from bson.regex import Regex

    from riverbed.engine import core
    from riverbed.engine.record import decode_record
    from riverbed.shells import wire
    c = Conn(h)
    events = [{"i": 1, "s": "é"}, {"r": Regex("^a", "i")}, {"i": 3}, {"_id": 4, "a": [1, {"b": None}]}]
    fast = [wire.bson_pub(bson.encode({"type": "PUB", "frame": {"channel": "f", "event": e}})) for e in events]
    assert [r is not None for r in fast] == [True, False, True, True]
    c.send("PUB", {"channel": "f", "event": events[0], "rID": 1})
    c.send("PUB", {"channel": "f", "event": events[1], "rID": 2})
    c.send("PUB", {"channel": "f", "event": events[2], "rID": 3, "extra": True})
    c.send("PUB", {"channel": "f", "event": events[3], "rID": Int64(4)})
    c.send("PUB", {"channel": "", "event": {"a": 1}, "rID": 5})
    c.send("PUB", {"channel": "f", "event": {"$ref": "x", "$id": 1}, "rID": 6})
    fs = sorted((f["frame"] for f in c.frames()), key=lambda f: f["rID"])     # errors need no append
    assert fs[:4] == [{"ok": True, "rID": i} for i in (1, 2, 3, 4)] and type(fs[3]["rID"]) is Int64
    assert fs[4] == {"ok": False, "rID": 5, "errCode": 6, "errMsg": "PUB needs a string 'channel'"}
    assert fs[5] == {"ok": False, "rID": 6, "errCode": 6, "errMsg": "PUB needs a document 'event'"}
    stored = [decode_record(r).payload for _, chunk in h.eng.read_chunks("f", 0, 10)
              for r in core.chunk_records(chunk)]
    assert stored == [bson.encode(e) for e in events]
    bad = bytearray(bson.encode({"type": "PUB", "frame": {"channel": "f", "event": {"t": True}, "rID": 7}}))
    bad[bad.index(b"t\x00\x01") + 2] = 2            # a boolean byte of 2: invalid BSON
    c.s.data_received(bytes(bad))
    f = c.frames()[0]["frame"]
    assert f["ok"] is False and f["errCode"] == 6 and c.io.closed


def test_inflight_budget_pauses_publishers_and_resumes_them_in_turn(h):
    # the broker-wide budget (limits.py InflightBudget), shared by every connection and protocol
    a, b = Conn(h), Conn(h)
    a.send("PUB", {"channel": "p", "event": {"x": 0}, "rID": 0})         # creates the channel
    assert len(a.frames()) == 1
    h.broker.inflight.limit, h.broker.inflight.low = 1000, 500
    a.send("PUB", {"channel": "p", "event": {"x": "a" * 2000}, "rID": 1})
    assert not a.io.reading and h.broker.inflight.used > 1000
    b.send("PUB", {"channel": "p", "event": {"x": "b" * 10}, "rID": 2})    # the budget is still exceeded
    assert not b.io.reading
    assert [f["frame"] for f in a.frames()] == [{"ok": True, "rID": 1}]   # committed: the budget frees
    assert b.frames() == [{"type": "RESPONSE", "frame": {"ok": True, "rID": 2}}]
    assert a.io.reading and b.io.reading and h.broker.inflight.used == 0
    assert h.broker.inflight.paused_total == 2

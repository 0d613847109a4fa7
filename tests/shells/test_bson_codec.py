"""The BSON/TCP codec: hand-laid frames equal what pymongo's bson encodes, envelope errors, versions,
and the wire parsers' self-counting splitter as the shell uses it."""

import bson
import pytest
from bson.int64 import Int64

from riverbed.engine.errors import FrameError, FrameTooLarge
from riverbed.shells import wire
from riverbed.shells.bson_tcp import codec as c


@pytest.mark.parametrize("event", [{}, {"a": 1}, {"s": "x" * 5000, "n": {"d": [1, 2.5, None]}}])
@pytest.mark.parametrize("sub_id,pos,ts", [(0, 0, 0), (7, 2 ** 40, 1_700_000_000_123), (2 ** 31 - 1, 2 ** 63 - 1, -1)])
def test_recev_is_the_bson_of_the_envelope(event, sub_id, pos, ts):
    raw = bson.encode(event)
    f = c.encode_recev(sub_id, pos, ts, raw)
    assert f == bson.encode({"type": "RECEV", "frame": {"subID": sub_id, "pos": Int64(pos), "timestamp": Int64(ts),
                                                        "event": event}})
    assert len(f) == c.LEN_RECEV_OVERHEAD + len(raw)


@pytest.mark.parametrize("rid", [0, 1, -5, 2 ** 31 - 1, -(2 ** 31)])
def test_response_ok_template(rid):
    assert c.response_ok(rid) == bson.encode({"type": "RESPONSE", "frame": {"ok": True, "rID": rid}})


def test_response_ok_falls_back_for_other_ids():
    assert bson.decode(c.response_ok(2 ** 40))["frame"] == {"ok": True, "rID": 2 ** 40}
    assert bson.decode(c.response_ok(None))["frame"] == {"ok": True}
    assert bson.decode(c.response_ok("x"))["frame"] == {"ok": True, "rID": "x"}


def test_response_and_query_result_fields():
    assert bson.decode(c.response(None, True)) == {"type": "RESPONSE", "frame": {"ok": True}}
    assert bson.decode(c.response(3, False, 6, "no"))["frame"] == {"ok": False, "rID": 3, "errCode": 6,
                                                                  "errMsg": "no"}
    assert bson.decode(c.sub_response(4, True, 0))["frame"] == {"ok": True, "rID": 4, "subID": 0}
    doc = bson.encode({"a": 1})
    assert bson.decode(c.encode_query_result(2, doc, True)) == {
        "type": "QUERYRESULT", "frame": {"queryID": 2, "result": {"a": 1}, "last": True}}
    assert bson.decode(c.encode_query_result(2, None, True))["frame"] == {"queryID": 2, "last": True}
    assert bson.decode(c.encode_ping(5)) == {"type": "PING", "frame": {"type": 0, "sequence": 5}}


def test_decode_envelope():
    assert c.decode_envelope(bson.encode({"type": "PUB", "frame": {"a": 1}})) == ("PUB", {"a": 1})
    assert c.decode_envelope(bson.encode({"frame": {}, "type": "X"})) == ("X", {})   # any field order
    for bad in (bson.encode({"hello": 1}), bson.encode({"type": 1, "frame": {}}),
                bson.encode({"type": "PUB", "frame": [1]}), bson.encode({"type": "PUB"}),
                b"\x0c\x00\x00\x00\x7fabc\x00\x00\x00\x00", b"\x05\x00\x00\x00\x01"):
        with pytest.raises(c.DecodeError):
            c.decode_envelope(bad)


def test_event_roundtrip_keeps_types():
    from bson.binary import Binary
    from bson.decimal128 import Decimal128
    from bson.objectid import ObjectId
    ev = {"i32": 1, "i64": Int64(2), "f": 1.5, "b": Binary(b"\x00", 4), "d": Decimal128("1.10"), "o": ObjectId(),
          "big": bson.datetime_ms.DatetimeMS(2 ** 62), "n": {"x": [True, None]}}
    raw = bson.encode(ev)
    _, f = c.decode_envelope(bson.encode({"type": "PUB", "frame": {"event": ev}}))
    assert c.encode_event(f["event"]) == raw


@pytest.mark.parametrize("value,expect", [("0.1", 0.1), ("0.05", 0.05), (0.1, 0.1), (0, 0.0), ("1.0", 1.0),
                                          ("x", None), (None, None), (True, None), ("nan", None), ([1], None)])
def test_parse_version(value, expect):
    assert c.parse_version(value) == expect


def test_splitter_contract():
    a, b = bson.encode({"a": 1}), bson.encode({"b": "x" * 100})
    frames, used = wire.split_bson_frames(a + b + b[:10], c.MAX_FRAME)
    assert frames == [a, b] and used == len(a) + len(b)
    with pytest.raises(FrameTooLarge):
        wire.split_bson_frames((100_000_000).to_bytes(4, "little"), c.MAX_FRAME)
    with pytest.raises(FrameError):
        wire.split_bson_frames((4).to_bytes(4, "little"), c.MAX_FRAME)
    with pytest.raises(FrameError):
        wire.split_bson_frames((-1).to_bytes(4, "little", signed=True), c.MAX_FRAME)

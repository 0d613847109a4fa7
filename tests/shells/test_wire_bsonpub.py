"""bson_pub (shells/bsonpub.pxi / shells/_pybsonpub.py, picked by riverbed.shells.wire): a mewbase PUB
frame recognised without decoding it.

An accept must never be wrong: whenever a twin returns a tuple, pymongo decodes the frame (with the
session's codec options) to the same channel, rID, sessID and event, and encoding that event again gives
exactly the bytes at ``frame[start:end]`` (what the slow path would have stored).
"""

import struct

import bson
import pytest
from bson.binary import Binary
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.shells import _pywire, wire

DECODE = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)   # the BSON shell's options
_I32 = struct.Struct("<i")


# ---- raw BSON builders (for frames bson.encode will not make) ------------------------------------------

def doc(*elems):
    body = b"".join(elems)
    return _I32.pack(len(body) + 5) + body + b"\x00"


def el(t, key, value):
    return bytes([t]) + key + b"\x00" + value


def s(text):
    return _I32.pack(len(text) + 1) + text + b"\x00"


def pub(*frame_elems, typ=b"PUB"):
    return doc(el(2, b"type", s(typ)), el(3, b"frame", doc(*frame_elems)))


CH = el(2, b"channel", s(b"ch"))
EV = el(3, b"event", doc(el(0x10, b"a", _I32.pack(1))))
RID = el(0x10, b"rID", _I32.pack(5))


def ev(*elems):
    return pub(CH, el(3, b"event", doc(*elems)), RID)


def both(frame):
    """The result of the twins, which must agree."""
    r = _pywire.bson_pub(frame)
    if not wire.NO_EXTENSIONS:
        from riverbed.shells import _wire
        assert _wire.bson_pub(frame) == r, frame
        if r is not None:
            assert tuple(map(type, _wire.bson_pub(frame))) == tuple(map(type, r))
    return r


def check_accept(frame, r):
    """An accepted frame decodes, the slow way, to what bson_pub says."""
    env = bson.decode(frame, codec_options=DECODE)
    assert set(env) == {"type", "frame"} and env["type"] == "PUB"
    f = env["frame"]
    assert set(f) <= {"channel", "event", "rID", "sessID"}
    channel, rid, sess, start, end = r
    assert channel == f["channel"] and type(channel) is str and channel
    assert rid == f.get("rID") and type(rid) is type(f.get("rID"))
    assert sess == f.get("sessID") and type(sess) is type(f.get("sessID"))
    assert type(f["event"]) is dict
    assert bson._dict_to_bson(f["event"], False, bson.DEFAULT_CODEC_OPTIONS) == frame[start:end]


# ---- golden cases ---------------------------------------------------------------------------------------

def test_plain_pub(wire_twin):
    event = {"i": 1, "p": "x" * 80}
    frame = bson.encode({"type": "PUB", "frame": {"channel": "orders", "event": event, "rID": 7}})
    channel, rid, sess, start, end = wire_twin.bson_pub(frame)
    assert (channel, rid, sess) == ("orders", 7, None)
    assert frame[start:end] == bson.encode(event)
    assert wire_twin.bson_pub(bytearray(frame)) == wire_twin.bson_pub(memoryview(frame)) == \
        (channel, rid, sess, start, end)


def test_fields_in_any_order_and_optional(wire_twin):
    frame = bson.encode({"frame": {"sessID": "s1", "event": {}, "channel": "é"}, "type": "PUB"})
    r = wire_twin.bson_pub(frame)
    assert r[:3] == ("é", None, "s1")
    assert frame[r[3]:r[4]] == bson.encode({})
    check_accept(frame, r)


def test_int64_ids_stay_int64(wire_twin):
    frame = bson.encode({"type": "PUB", "frame": {"channel": "c", "event": {"a": 1}, "rID": Int64(3),
                                                  "sessID": Int64(4)}})
    r = wire_twin.bson_pub(frame)
    assert r[1] == 3 and type(r[1]) is Int64 and type(r[2]) is Int64
    frame = bson.encode({"type": "PUB", "frame": {"channel": "c", "event": {"a": 1}, "rID": 3, "sessID": 4}})
    r = wire_twin.bson_pub(frame)
    assert type(r[1]) is int and type(r[2]) is int


def test_every_accepted_type(wire_twin):
    event = {"_id": ObjectId(), "d": 1.5, "nan": float("nan"), "s": "a\x00b", "doc": {"x": [1, {"y": None}]},
             "b0": b"raw", "uuid": Binary(b"0" * 16, 4), "user": Binary(b"u", 0x80), "t": True, "f": False,
             "dt": DatetimeMS(1_700_000_000_000), "far": DatetimeMS(-(1 << 62)), "n": None, "i": -5,
             "ts": Timestamp(1, 2), "l": Int64(1 << 40), "dec": Decimal128("1.25"), "min": MinKey(),
             "max": MaxKey(), "$set": 1, "a.b": 2, "": 3}
    frame = bson.encode({"type": "PUB", "frame": {"channel": "c", "event": event}})
    r = wire_twin.bson_pub(frame)
    assert r is not None
    check_accept(frame, r)


@pytest.mark.parametrize("frame", [
    pytest.param(b"", id="empty"),
    pytest.param(b"\x05\x00\x00\x00\x00", id="empty-doc"),
    pytest.param(pub(CH, EV, RID, typ=b"SUBSCRIBE"), id="other-type"),
    pytest.param(pub(CH, EV, RID, typ=b"PUBX"), id="type-prefix"),
    pytest.param(doc(el(0x10, b"type", _I32.pack(1)), el(3, b"frame", doc(CH, EV))), id="type-not-string"),
    pytest.param(doc(el(2, b"type", s(b"PUB"))), id="no-frame"),
    pytest.param(doc(el(3, b"frame", doc(CH, EV))), id="no-type"),
    pytest.param(doc(el(2, b"type", s(b"PUB")), el(3, b"frame", doc(CH, EV)), el(0x10, b"x", _I32.pack(1))),
                 id="extra-envelope-field"),
    pytest.param(doc(el(2, b"type", s(b"PUB")), el(2, b"type", s(b"PUB")), el(3, b"frame", doc(CH, EV))),
                 id="type-twice"),
    pytest.param(doc(el(2, b"type", s(b"PUB")), el(4, b"frame", doc(CH, EV))), id="frame-an-array"),
    pytest.param(pub(CH, EV, RID, el(0x10, b"x", _I32.pack(1))), id="extra-field"),
    pytest.param(pub(CH, RID), id="no-event"),
    pytest.param(pub(EV, RID), id="no-channel"),
    pytest.param(pub(CH, CH, EV), id="channel-twice"),
    pytest.param(pub(CH, EV, RID, RID), id="rid-twice"),
    pytest.param(pub(CH, EV, EV), id="event-twice"),
    pytest.param(pub(el(2, b"channel", s(b"")), EV), id="empty-channel"),
    pytest.param(pub(el(0x10, b"channel", _I32.pack(1)), EV), id="channel-int"),
    pytest.param(pub(CH, el(4, b"event", doc()), RID), id="event-array"),
    pytest.param(pub(CH, el(0x0A, b"event", b""), RID), id="event-null"),
    pytest.param(pub(CH, EV, el(1, b"rID", struct.pack("<d", 1.0))), id="rid-double"),
    pytest.param(pub(CH, EV, el(2, b"rID", s(b"1"))), id="rid-string"),
    pytest.param(pub(CH, EV, el(1, b"sessID", struct.pack("<d", 1.0))), id="sess-double"),
    pytest.param(pub(CH, EV, el(0x0A, b"sessID", b"")), id="sess-null"),
    pytest.param(pub(el(2, b"channel", s(b"\xff")), EV), id="channel-bad-utf8"),
    pytest.param(pub(CH, EV, el(2, b"sessID", s(b"\xed\xa0\x80"))), id="sess-surrogate"),
    pytest.param(ev(el(0x0B, b"r", b"a\x00i\x00")), id="regex"),
    pytest.param(ev(el(0x0D, b"c", s(b"x"))), id="code"),
    pytest.param(ev(el(0x0E, b"y", s(b"x"))), id="symbol"),
    pytest.param(ev(el(0x06, b"u", b"")), id="undefined"),
    pytest.param(ev(el(0x0C, b"p", s(b"x") + b"\x00" * 12)), id="dbpointer"),
    pytest.param(ev(el(0x0F, b"w", _I32.pack(4 + 6 + 5) + s(b"x") + doc())), id="code-with-scope"),
    pytest.param(ev(el(0x14, b"z", b"")), id="unknown-type"),
    pytest.param(ev(el(0x08, b"t", b"\x02")), id="bool-2"),
    pytest.param(ev(el(0x05, b"b", _I32.pack(4) + b"\x02" + _I32.pack(0))), id="binary-old"),
    pytest.param(ev(el(0x05, b"b", _I32.pack(1) + b"\x09" + b"x")), id="binary-reserved-9"),
    pytest.param(ev(el(0x05, b"b", _I32.pack(-1) + b"\x00")), id="binary-negative"),
    pytest.param(ev(el(0x05, b"b", _I32.pack(50) + b"\x00")), id="binary-overrun"),
    pytest.param(ev(el(2, b"s", _I32.pack(0))), id="string-length-0"),
    pytest.param(ev(el(2, b"s", _I32.pack(2) + b"ab")), id="string-no-nul"),
    pytest.param(ev(el(2, b"s", s(b"\xc0\x80"))), id="string-overlong"),
    pytest.param(ev(el(2, b"s", s(b"\xf4\x90\x80\x80"))), id="string-past-10ffff"),
    pytest.param(ev(el(2, b"s", s(b"\xe2\x82"))), id="string-truncated-utf8"),
    pytest.param(ev(el(0x10, b"\xff", _I32.pack(1))), id="key-bad-utf8"),
    pytest.param(ev(el(0x10, b"a", _I32.pack(1)), el(0x10, b"a", _I32.pack(2))), id="duplicate-key"),
    pytest.param(ev(el(3, b"d", doc(el(0x0A, b"k", b""), el(0x0A, b"k", b"")))), id="nested-duplicate-key"),
    pytest.param(ev(el(3, b"d", doc(el(2, b"$ref", s(b"c")), el(0x10, b"$id", _I32.pack(1))))), id="dbref"),
    pytest.param(ev(el(0x10, b"a", _I32.pack(1)), el(0x10, b"_id", _I32.pack(2))), id="id-not-first"),
    pytest.param(ev(el(4, b"a", doc(el(0x10, b"1", _I32.pack(1))))), id="array-key-1-first"),
    pytest.param(ev(el(4, b"a", doc(el(0x10, b"00", _I32.pack(1))))), id="array-key-00"),
    pytest.param(ev(el(4, b"a", doc(el(0x10, b"x", _I32.pack(1))))), id="array-key-x"),
    pytest.param(ev(el(3, b"d", _I32.pack(6) + b"\x0a\x00")), id="nested-bad-eoo"),
    pytest.param(ev(el(0x10, b"i", _I32.pack(1)[:3])), id="int-truncated"),
])
def test_refused(wire_twin, frame):
    assert wire_twin.bson_pub(frame) is None
    both(frame)


def test_refused_length_and_tail(wire_twin):
    good = pub(CH, EV, RID)
    assert wire_twin.bson_pub(good) is not None
    assert wire_twin.bson_pub(good + b"\x00") is None                 # a byte past the declared length
    assert wire_twin.bson_pub(good[:-1]) is None
    assert wire_twin.bson_pub(good[:-1] + b"\x01") is None           # bad terminator
    assert wire_twin.bson_pub(_I32.pack(len(good) - 1) + good[4:]) is None
    for i in range(len(good)):
        assert wire_twin.bson_pub(good[:i]) is None


def test_depth_and_key_limits(wire_twin):
    def nested(n):
        d = {"v": 1}
        for _ in range(n - 1):
            d = {"d": d}
        return bson.encode({"type": "PUB", "frame": {"channel": "c", "event": d}})
    assert wire_twin.bson_pub(nested(64)) is not None                 # the event is depth 1
    assert wire_twin.bson_pub(nested(65)) is None
    wide = {f"k{i}": i for i in range(64)}
    assert wire_twin.bson_pub(bson.encode({"type": "PUB", "frame": {"channel": "c", "event": wide}})) is not None
    wide["k64"] = 64
    assert wire_twin.bson_pub(bson.encode({"type": "PUB", "frame": {"channel": "c", "event": wide}})) is None
    long_array = {"a": list(range(1000))}                       # arrays have no element limit
    frame = bson.encode({"type": "PUB", "frame": {"channel": "c", "event": long_array}})
    r = wire_twin.bson_pub(frame)
    assert r is not None and frame[r[3]:r[4]] == bson.encode(long_array)


# ---- hypothesis: valid frames are accepted, anything accepted is right ------------------------------------

_key = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6).filter(lambda k: k != "$ref")
_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 31), (1 << 31) - 1),
    st.integers(-(1 << 63), (1 << 63) - 1).map(Int64), st.floats(allow_nan=True), st.text(max_size=12),
    st.binary(max_size=12),
    st.builds(Binary, st.binary(max_size=12), st.sampled_from([1, 3, 4, 5, 6, 7, 8, 0x80, 0xFF])),
    st.binary(min_size=12, max_size=12).map(ObjectId),
    st.integers(-(1 << 63), (1 << 63) - 1).map(DatetimeMS),
    st.builds(Timestamp, st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1)),
    st.binary(min_size=16, max_size=16).map(Decimal128.from_bid), st.just(MinKey()), st.just(MaxKey()),
)
_value = st.recursive(_scalar, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(_key, inner, max_size=4)), max_leaves=12)


def _id_first(d):
    return {"_id": d.pop("_id"), **d} if "_id" in d else d


_event = st.dictionaries(st.one_of(_key, st.just("_id")), _value, max_size=6).map(_id_first)
_id_value = st.one_of(st.integers(-(1 << 31), (1 << 31) - 1), st.integers(-(1 << 63), (1 << 63) - 1).map(Int64))


@st.composite
def pub_frames(draw):
    fields = {"channel": draw(st.text(min_size=1, max_size=10)), "event": draw(_event)}
    if draw(st.booleans()):
        fields["rID"] = draw(_id_value)
    if draw(st.booleans()):
        fields["sessID"] = draw(st.one_of(_id_value, st.text(max_size=8)))
    order = draw(st.permutations(list(fields)))
    frame = {k: fields[k] for k in order}
    env = {"type": "PUB", "frame": frame} if draw(st.booleans()) else {"frame": frame, "type": "PUB"}
    return bson.encode(env), fields


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pub_frames())
def test_valid_frames_are_accepted(built):
    frame, fields = built
    r = both(frame)
    assert r is not None
    channel, rid, sess, start, end = r
    assert channel == fields["channel"]
    assert rid == fields.get("rID") and type(rid) is type(fields.get("rID"))
    assert sess == fields.get("sessID") and type(sess) is type(fields.get("sessID"))
    assert frame[start:end] == bson.encode(fields["event"])
    check_accept(frame, r)


_mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10_000), st.integers(0, 8)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.binary(min_size=1, max_size=4)),
)


def _mutate(frame, ops):
    b = bytearray(frame)
    for op, at, arg in ops:
        if not b:
            break
        at %= len(b)
        if op == "flip":
            b[at] = arg
        elif op == "cut":
            del b[at:at + arg]
        else:
            b[at:at] = arg
    if ops and ops[0][0] != "flip" and len(b) >= 4 and ops[0][1] % 2:
        b[:4] = _I32.pack(len(b))              # half the time keep the outer length right
    return bytes(b)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pub_frames(), st.lists(_mutation, min_size=1, max_size=3))
def test_mutated_frames(built, ops):
    frame = _mutate(built[0], ops)
    r = both(frame)
    if r is not None:
        check_accept(frame, r)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_garbage(data):
    for frame in (data, _I32.pack(len(data) + 4) + data):
        r = both(frame)
        if r is not None:
            check_accept(frame, r)


def test_every_single_byte_change():
    event = {"_id": ObjectId(b"a" * 12), "s": "é\x00x", "a": [1, {"b": None, "t": True}], "d": DatetimeMS(5),
             "f": 1.5, "l": Int64(7), "bin": Binary(b"xy", 0x80), "raw": b"q"}
    frame = bson.encode({"type": "PUB", "frame": {"channel": "chan", "event": event, "rID": 3, "sessID": "s"}})
    accepted = 0
    for i in range(len(frame)):
        for v in range(256):
            b = bytearray(frame)
            b[i] = v
            b = bytes(b)
            r = both(b)
            if r is not None:
                accepted += 1
                check_accept(b, r)
    assert accepted > len(frame)          # the unchanged frame, and many changes of values inside strings

"""Issue 21, class 3: well-framed requests with hostile field values get each protocol's own error, never
an exception out of the session (which the listener guard answered by dropping the connection with an
"internal error" line), and the connection goes on where the protocol keeps it.

Per protocol: the cases the issue names, then a hypothesis test that builds structurally valid frames
whose field values are hostile (nulls, wrong types, invalid UTF-8, lone surrogates, huge and negative
numbers, deep nesting) and checks after each that nothing escaped, no reply says "internal", and a
well-formed request on the same connection still works.
"""

import json
import os
import shutil
import struct
from contextlib import contextmanager

import bson
import pytest
from bson.int64 import Int64
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rstream import schema

from riverbed.shells import rmq_stream as rs
from riverbed.shells.ream_text import codec as ream_codec

from . import test_bson_session as bsonh
from . import test_ream_session as reamh
from . import test_ws_session as wsh
from . import test_zmq_session as zmqh
from .conftest import Harness as RmqHarness

@contextmanager
def scratch(tmp_path_factory, name):
    """A directory for one hypothesis example's engine, removed after it: an engine reserves its whole
    map on disk (64 MiB), and hundreds of examples would otherwise keep gigabytes until pytest prunes."""
    d = tmp_path_factory.mktemp(name)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# RIVERBED_HOSTILE_EXAMPLES=5000 for a longer search than the suite's
FUZZ = settings(max_examples=int(os.environ.get("RIVERBED_HOSTILE_EXAMPLES", "60")), deadline=None,
                suppress_health_check=list(HealthCheck))


def deep(n):
    d = {"x": 1}
    for _ in range(n - 1):
        d = {"a": d}
    return d


# ----------------------------------------------------------------------------------- RabbitMQ Stream

def rmq_string(s):
    if s is None:
        return struct.pack(">h", -1)
    b = s if isinstance(s, bytes) else s.encode("utf-8")
    return struct.pack(">h", len(b)) + b


def rmq_props(pairs):
    return struct.pack(">i", len(pairs)) + b"".join(rmq_string(k) + rmq_string(v) for k, v in pairs)


def rmq_frame(key, body):
    payload = struct.pack(">HH", key, 1) + body
    return struct.pack(">I", len(payload)) + payload


def rmq_code(c, key):
    """The response code of the one response to ``key`` the session wrote."""
    frames = [f for f in c.raw_frames() if struct.unpack_from(">H", f)[0] == key | 0x8000]
    assert len(frames) == 1, frames
    return struct.unpack_from(">H", frames[0], 8)[0]


@pytest.fixture
def rmq(tmp_path):
    h = RmqHarness(tmp_path)
    c = h.connect()
    c.handshake()
    yield h, c
    h.close()
    shutil.rmtree(tmp_path, ignore_errors=True)       # the engine's reserved map: 64 MiB each


def test_rmq_create_with_a_null_argument_key_gets_precondition_failed(rmq):
    h, c = rmq
    c.send_raw(rmq_frame(rs.CMD_CREATE, struct.pack(">I", 7) + rmq_string("s1") + rmq_props([(None, "1")])))
    assert rmq_code(c, rs.CMD_CREATE) == rs.RC_PRECONDITION_FAILED
    assert not c.io.closed
    assert c.create("s1") == rs.RC_OK                          # the connection goes on


def test_rmq_subscribe_with_a_null_property_key_gets_precondition_failed(rmq):
    h, c = rmq
    assert c.create("s2") == rs.RC_OK
    body = (struct.pack(">IB", 9, 1) + rmq_string("s2") + struct.pack(">H", 1) + struct.pack(">H", 10)
            + rmq_props([(None, "x"), ("name", None)]))
    c.send_raw(rmq_frame(rs.CMD_SUBSCRIBE, body))
    assert rmq_code(c, rs.CMD_SUBSCRIBE) == rs.RC_PRECONDITION_FAILED
    fs = c.subscribe(1, "s2")
    assert any(isinstance(f, schema.SubscribeResponse) and f.response_code == rs.RC_OK for f in fs), fs


@pytest.mark.parametrize("key, body", [
    (rs.CMD_DELETE, struct.pack(">I", 3) + rmq_string(None)),
    (rs.CMD_DECLARE_PUBLISHER, struct.pack(">IB", 3, 1) + rmq_string(None) + rmq_string(None)),
    (rs.CMD_QUERY_OFFSET, struct.pack(">I", 3) + rmq_string(None) + rmq_string(None)),
    (rs.CMD_QUERY_PUBLISHER_SEQUENCE, struct.pack(">I", 3) + rmq_string(None) + rmq_string("x")),
    (rs.CMD_ROUTE, struct.pack(">I", 3) + rmq_string(None) + rmq_string(None)),
    (rs.CMD_PARTITIONS, struct.pack(">I", 3) + rmq_string(None)),
    (rs.CMD_STREAM_STATS, struct.pack(">I", 3) + rmq_string(None)),
    (rs.CMD_CREATE_SUPER_STREAM, struct.pack(">I", 3) + rmq_string("ss") + struct.pack(">i", 1)
     + rmq_string(None) + struct.pack(">i", 1) + rmq_string("k") + rmq_props([])),
    (rs.CMD_DELETE_SUPER_STREAM, struct.pack(">I", 3) + rmq_string(None)),
])
def test_rmq_null_strings_are_answered_not_raised(rmq, key, body):
    h, c = rmq
    c.send_raw(rmq_frame(key, body))
    frames = c.raw_frames()
    assert [struct.unpack_from(">H", f)[0] for f in frames] == [key | 0x8000]
    assert struct.unpack_from(">H", frames[0], 8)[0] != rs.RC_OK
    assert not c.io.closed and c.create("after") == rs.RC_OK


def rmq_hostile_string():
    return st.one_of(st.none(), st.just(""), st.text(max_size=20), st.binary(max_size=20),
                     st.just(b"\xed\xa0\x80"), st.just("x" * 300))


def rmq_field(kind):
    if kind == "str":
        return rmq_hostile_string().map(rmq_string)
    if kind == "props":
        return st.lists(st.tuples(rmq_hostile_string(), rmq_hostile_string()), max_size=4).map(
            lambda pairs: struct.pack(">i", len(pairs)) + b"".join(rmq_string(k) + rmq_string(v) for k, v in pairs))
    if kind == "strs":
        return st.lists(rmq_hostile_string(), max_size=4).map(
            lambda items: struct.pack(">i", len(items)) + b"".join(rmq_string(s) for s in items))
    if kind == "spec":
        return st.one_of(st.integers(0, 0xFFFF).map(lambda t: struct.pack(">H", t)),
                         st.tuples(st.sampled_from([4, 5]), st.integers(-(1 << 63), (1 << 63) - 1)).map(
                             lambda tv: struct.pack(">Hq", *tv)))
    width = {"u8": ">B", "u16": ">H", "u32": ">I", "u64": ">Q"}[kind]
    return st.integers(0, (1 << (8 * struct.calcsize(width))) - 1).map(lambda v: struct.pack(width, v))


RMQ_SHAPES = {
    rs.CMD_CREATE: ["u32", "str", "props"],
    rs.CMD_DELETE: ["u32", "str"],
    rs.CMD_DECLARE_PUBLISHER: ["u32", "u8", "str", "str"],
    rs.CMD_QUERY_PUBLISHER_SEQUENCE: ["u32", "str", "str"],
    rs.CMD_DELETE_PUBLISHER: ["u32", "u8"],
    rs.CMD_SUBSCRIBE: ["u32", "u8", "str", "spec", "u16", "props"],
    rs.CMD_UNSUBSCRIBE: ["u32", "u8"],
    rs.CMD_CREDIT: ["u8", "u16"],
    rs.CMD_STORE_OFFSET: ["str", "str", "u64"],
    rs.CMD_QUERY_OFFSET: ["u32", "str", "str"],
    rs.CMD_METADATA: ["u32", "strs"],
    rs.CMD_ROUTE: ["u32", "str", "str"],
    rs.CMD_PARTITIONS: ["u32", "str"],
    rs.CMD_STREAM_STATS: ["u32", "str"],
    rs.CMD_CREATE_SUPER_STREAM: ["u32", "str", "strs", "strs", "props"],
    rs.CMD_DELETE_SUPER_STREAM: ["u32", "str"],
    rs.CMD_RESOLVE_OFFSET_SPEC: ["u32", "str", "spec", "props"],
    rs.CMD_PEER_PROPERTIES: ["u32", "props"],
}


@st.composite
def rmq_hostile_frame(draw):
    key = draw(st.sampled_from(sorted(RMQ_SHAPES)))
    return rmq_frame(key, b"".join(draw(rmq_field(kind)) for kind in RMQ_SHAPES[key]))


@FUZZ
@given(frames=st.lists(rmq_hostile_frame(), min_size=1, max_size=4))
def test_rmq_hostile_field_values_never_escape(tmp_path_factory, frames):
    with scratch(tmp_path_factory, "rmqf") as d:
        h = RmqHarness(d)
        try:
            c = h.connect()
            c.handshake()
            for data in frames:
                c.send_raw(data)
                h.settle()
            if c.s.state < rs.ST_CLOSING:       # only a frame cut short closes (0x0d); else it goes on
                c.raw_frames()
                assert c.create("well-formed") in (rs.RC_OK, rs.RC_STREAM_ALREADY_EXISTS)
        finally:
            h.close()


# ------------------------------------------------------------------------------------------- BSON/TCP

@pytest.fixture
def bh(tmp_path):
    h = bsonh.Harness(tmp_path)
    yield h
    h.close()
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_bson_pub_with_a_sessid_array_gets_errcode_6(bh):
    c = bsonh.Conn(bh)
    c.send("PUB", {"channel": "c", "event": {"a": 1}, "rID": 1, "sessID": [1, 2]})
    (f,) = c.frames()
    assert f["frame"] == {"ok": False, "rID": 1, "errCode": 6,
                          "errMsg": "'sessID' must be a string or an integer, not an array"}
    c.send("PUB", {"channel": "c", "event": {"a": 1}, "rID": 2})
    assert c.frames()[0]["frame"] == {"ok": True, "rID": 2}


@pytest.mark.parametrize("ftype, frame, reply", [
    ("SUBSCRIBE", {"rID": 1, "channel": "c", "startPos": "0"}, "SUBRESPONSE"),
    ("SUBSCRIBE", {"rID": 1, "channel": "c", "matcher": [1]}, "SUBRESPONSE"),
    ("SUBSCRIBE", {"rID": 1, "channel": "c", "matcher": deep(100)}, "SUBRESPONSE"),
    ("SUBSCRIBE", {"rID": 1, "channel": 5}, "SUBRESPONSE"),
    ("SUBCLOSE", {"rID": 1, "subID": [1]}, "RESPONSE"),
    ("UNSUBSCRIBE", {"rID": 1, "subID": {"a": 1}}, "RESPONSE"),
    ("STARTTX", {"rID": 1, "sessID": {"a": 1}}, "RESPONSE"),
    ("COMMITTX", {"rID": 1, "sessID": [1]}, "RESPONSE"),
    ("ABORTTX", {"rID": 1, "sessID": 1.5}, "RESPONSE"),
    ("CREATECHANNEL", {"rID": 1, "name": ["x"]}, "RESPONSE"),
    ("CREATEBINDER", {"rID": 1, "name": None}, "RESPONSE"),
    ("FINDBYID", {"rID": 1, "binder": 1, "docID": 1}, "RESPONSE"),
    ("QUERY", {"queryID": "q", "binder": "b"}, "QUERYRESULT"),
    ("QUERY", {"queryID": 1, "binder": "b", "matcher": "x"}, "QUERYRESULT"),
    ("CREATEPROJECTION", {"rID": 1, "name": 1, "channel": "c", "binder": "b"}, "RESPONSE"),
    ("PUB", {"rID": 1, "channel": "c", "event": deep(65)}, "RESPONSE"),
])
def test_bson_wrong_types_are_answered_and_the_connection_goes_on(bh, ftype, frame, reply):
    c = bsonh.Conn(bh)
    c.send(ftype, frame)
    fs = c.frames()
    assert [f["type"] for f in fs] == [reply], fs
    body = fs[0]["frame"]
    assert body["ok"] is False and body["errCode"] == 6, body
    assert not c.io.closed
    c.send("PUB", {"channel": "c", "event": {"a": 1}, "rID": 99})
    assert c.frames()[0]["frame"] == {"ok": True, "rID": 99}


def test_bson_frames_without_a_reply_with_wrong_types_are_dropped(bh):
    c = bsonh.Conn(bh)
    for ftype, frame in (("ACKEV", {"subID": [1], "bytes": "x"}), ("QUERYACK", {"queryID": {}, "bytes": []}),
                         ("PING", {"sequence": "s"})):
        c.send(ftype, frame)
    assert c.frames() == []
    c.send("PUB", {"channel": "c", "event": {"a": 1}, "rID": 3})
    assert c.frames()[0]["frame"] == {"ok": True, "rID": 3}


BSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 31), (1 << 31) - 1), st.integers(-(1 << 63), (1 << 63) - 1).map(Int64),
    st.floats(allow_nan=True), st.text(max_size=12), st.binary(max_size=8))
BSON_VALUES = st.recursive(BSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6).filter(lambda k: "\x00" not in k and
                                                                            not k.startswith("$")), inner, max_size=3)),
    max_leaves=8)
BSON_FIELDS = ["rID", "channel", "event", "sessID", "subID", "queryID", "bytes", "pos", "startPos", "startTimestamp",
               "durableID", "matcher", "name", "binder", "docID", "sequence", "type", "mode", "version"]
BSON_TYPES = ["PUB", "SUBSCRIBE", "SUBCLOSE", "UNSUBSCRIBE", "ACKEV", "STARTTX", "COMMITTX", "ABORTTX", "QUERY",
              "QUERYACK", "FINDBYID", "CREATECHANNEL", "CREATEBINDER", "CREATEPROJECTION", "LISTCHANNELS",
              "LISTBINDERS", "PING", "CONNECT", "NOPE"]


@FUZZ
@given(frames=st.lists(st.tuples(st.sampled_from(BSON_TYPES),
                                 st.dictionaries(st.sampled_from(BSON_FIELDS), BSON_VALUES, max_size=5)),
                       min_size=1, max_size=4))
def test_bson_hostile_field_values_never_escape(tmp_path_factory, frames):
    with scratch(tmp_path_factory, "bsonf") as d:
        h = bsonh.Harness(d)
        try:
            c = bsonh.Conn(h)
            for ftype, frame in frames:
                c.send(ftype, frame)
                h.settle()
            for f in c.frames():
                assert f["frame"].get("errCode") != 100 or "internal" not in str(f["frame"].get("errMsg")).lower()
            assert not c.io.closed
            c.send("PUB", {"channel": "well-formed", "event": {"a": 1}, "rID": -7})
            assert {"ok": True, "rID": -7} in [f["frame"] for f in c.frames()]
        finally:
            h.close()


# ---------------------------------------------------------------------------------------- REAM text

@pytest.fixture
def rh(tmp_path):
    h = reamh.Harness(tmp_path)
    yield h
    h.close()
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.parametrize("line", [b"\x1c\n", b"\x1c\x1d\x1e\x1f\n", "\u2028\n".encode(), "EVENT\u00a0LIST\n".encode()])
def test_ream_separator_only_lines_get_an_error_line(rh, line):
    c = rh.connect()
    c.send(line)
    (reply,) = c.take().decode().split("\n")[:-1]      # lines end at \n only (not at U+2028)
    assert reply.startswith('ERROR "Unknown command') and "Internal" not in reply
    c.send(b"PING\n")
    assert c.lines() == ["PONG"]


@pytest.mark.parametrize("request_bytes", [
    "EVENT SUBSCRIBE abc \u00b2\n".encode(),             # a Unicode digit: isdigit() but not int()
    "EVENT SUBSCRIBE abc \u0661\u0662\n".encode(),
    b"EVENT SUBSCRIBE abc 99999999999999999999999\n",
    b"AGGREGATE GET abc 99999999999999999999999\n",
    b"EVENT PUBLISH abc 11\n{\"a\":NaN}\n",
    b"EVENT PUBLISH abc 12\n{\"a\":\"\\ud800\"}\n",
    b"EVENT PUBLISH abc 2\n\xff\xfe\n",
    b"AGGREGATE SET abc 1 5\n[1,2]\n",
])
def test_ream_hostile_words_and_payloads_are_refused_in_kind(rh, request_bytes):
    c = rh.connect()
    c.send(request_bytes)
    lines = c.take().decode().split("\n")[:-1]
    assert len(lines) == 1 and "Internal" not in lines[0], lines
    c.send(b"PING\n")
    assert c.lines() == ["PONG"]


REAM_WORD = st.one_of(st.sampled_from(["EVENT", "AGGREGATE", "PROJECTION", "PUBLISH", "SUBSCRIBE", "LIST", "GET",
                                       "SET", "REMOVE", "SELECT", "UPDATE", "DELETE", "CREATE", "DROP", "abc",
                                       "stream1", "0", "1", "-1", "99999999999999999999", "\u00b2", "\x1c"]),
                      st.text(alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)),
                              min_size=1, max_size=8))
REAM_PAYLOAD = st.one_of(st.just(b'{"a":1}'), st.just(b"[]"), st.just(b'{"a":NaN}'), st.just(b'{"a":"\\ud800"}'),
                         st.just(json.dumps(deep(70)).encode()), st.binary(max_size=12).filter(lambda b: b"\n" not in b),
                         st.just(b'{"x":{"$date":"nope"}}'), st.just(b'"a > 1"'))


@st.composite
def ream_request(draw):
    words = draw(st.lists(REAM_WORD, min_size=1, max_size=5))
    line = " ".join(words).encode("utf-8")
    sizes = ream_codec.SIZE_POSITIONS.get((words[0], words[1] if len(words) > 1 else None))
    if not sizes:
        return line + b"\n"
    payloads = [draw(REAM_PAYLOAD) for _ in sizes]
    words = (words + ["x"] * 8)[:sizes[-1] + 1]
    for p, payload in zip(sizes, payloads):
        words[p] = str(len(payload))
    return " ".join(words).encode("utf-8") + b"\n" + b"".join(p + b"\n" for p in payloads)


@FUZZ
@given(requests=st.lists(ream_request(), min_size=1, max_size=4))
def test_ream_hostile_requests_never_escape(tmp_path_factory, requests):
    with scratch(tmp_path_factory, "reamf") as d:
        h = reamh.Harness(d)
        try:
            c = h.connect()
            for r in requests:
                c.send(r)
                h.settle()
            out = c.take()
            assert b"Internal error" not in out, out
            if not c.io.closed:
                c.send(b"PING\n")
                assert c.lines()[-1] == "PONG"
        finally:
            h.close()


# ------------------------------------------------------------------------------------ WebSocket JSON

@pytest.fixture
def wh(tmp_path):
    h = wsh.Harness(tmp_path)
    yield h
    h.close()
    shutil.rmtree(tmp_path, ignore_errors=True)


def ws_errors(frames):
    return [f[3] for f in frames if f[1] == 7]


def ws_well_formed_round_trip(c, stream="wellformed"):
    c.send({"type": "publish", "stream": stream, "msg": '{"ok":1}'})
    c.send({"type": "resend", "stream": stream, "sub": "r", "resend_last": 1})
    fs = c.frames()
    assert [f[1] for f in fs][-3:] == [4, 1, 5], fs
    assert fs[-2][3][8] == '{"ok":1}'


@pytest.mark.parametrize("text", [
    '{"type":"\\ud800"}',
    '{"type":"publish","stream":"s","msg":"{\\"a\\":1}","pkey":"\\udfff"}',
    '{"type":"publish","stream":"\\ud800x","msg":"{}"}',
    '{"type":"publish","stream":"s","msg":"{}","ts":NaN}',
    '{"type":"publish","stream":"s","msg":"{}","ts":1e400}',
    '{"type":"publish","stream":"s","msg":"{\\"a\\":NaN}"}',
    '{"type":"subscribe","stream":"s","authKey":["k"]}',
    '{"type":"resend","stream":"s","sub":{"a":1},"resend_all":true}',
    '{"type":"subscribe","stream":"s","partition":1e30}',
    '{"type":"subscribe","stream":"s","partition":123456789012345678901234567890}',
    '{"type":"unsubscribe","stream":["s"]}',
    '{"type":"publish","stream":"s","msg":' + json.dumps(json.dumps(deep(65))) + "}",
    json.dumps({"type": "subscribe", "stream": "s", "x": deep(200)}),
])
def test_ws_hostile_requests_get_an_error_frame_and_the_connection_goes_on(wh, text):
    c = wsh.Client(wh)
    c.send(text)
    fs = c.frames()
    assert len(ws_errors(fs)) == 1, fs
    assert "Internal" not in json.dumps(fs)
    ws_well_formed_round_trip(c)


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=True),
                         st.text(alphabet=st.characters(blacklist_categories=()), max_size=8))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=8)
WS_FIELDS = ["stream", "partition", "msg", "ts", "pkey", "authKey", "sub", "resend_all", "resend_last",
             "resend_from", "resend_to", "resend_from_time"]


@FUZZ
@given(reqs=st.lists(st.tuples(st.one_of(st.sampled_from(["subscribe", "unsubscribe", "publish", "resend"]),
                                         JSON_SCALARS),
                               st.dictionaries(st.sampled_from(WS_FIELDS), JSON_VALUES, max_size=5)),
                     min_size=1, max_size=4))
def test_ws_hostile_field_values_never_escape(tmp_path_factory, reqs):
    with scratch(tmp_path_factory, "wsf") as d:
        h = wsh.Harness(d)
        try:
            c = wsh.Client(h)
            for t, fields in reqs:
                req = dict(fields, type=t)
                c.send(json.dumps(req))              # ensure_ascii: lone surrogates travel as \\ud800 escapes
            fs = c.frames()
            assert "Internal error" not in json.dumps(fs)
            ws_well_formed_round_trip(c, "wellformed-x")
        finally:
            h.close()


# ------------------------------------------------------------------------------------------- ZeroMQ

ZMQ_WORD = st.one_of(st.sampled_from([b"CONNECT", b"DISCONNECT", b"SUB", b"UNSUB", b"PUT", b"NOOP", b"ID", b"TOPIC",
                                      b"TTL", b"X-OFFSET", b"X-A", b"VERSION", b"", b"t", b"-1",
                                      b"99999999999999999999999", b"\xff\xfe", b"\xed\xa0\x80"]),
                     st.binary(max_size=10))


@FUZZ
@given(messages=st.lists(st.lists(ZMQ_WORD, min_size=1, max_size=8), min_size=1, max_size=4))
def test_zmq_hostile_frames_never_escape(tmp_path_factory, messages):
    with scratch(tmp_path_factory, "zmqf") as d:
        h = zmqh.Harness(d)
        try:
            for frames in messages:
                h.req(b"C", *frames)
                h.settle()
            h.io.take()
            h.req(b"C", "NOOP", "ID", "after")
            h.settle()
            replies = h.io.take(b"C")
            assert [b"", b"OK", b"ID", b"after"] in replies, replies
        finally:
            h.close()

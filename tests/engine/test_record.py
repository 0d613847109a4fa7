"""The one record format: the AMQP 1.0 codec twins (``_core`` / ``_pyrecord``) and riverbed.engine.record.

Codec tests take the ``twin`` fixture and run against both implementations; the differential tests feed
the same bytes to both and compare. Golden bytes come from the real clients' encoders (rstream 1.1.1,
rbfly 0.10.0), captured once and pasted here with one comment per field; the live checks assert the
clients still produce them. The record-layer tests run on whichever core is in use (the suite runs once
compiled and once with RIVERBED_NO_EXTENSIONS=1).
"""

import base64
import json
import re
import struct
import uuid
from datetime import datetime, timezone

import bson
import pytest
from bson import ObjectId
from bson.binary import Binary
from bson.int64 import Int64
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.engine import _pycore, _pyrecord, core, record
from riverbed.engine.record import CT_BSON, CT_JSON, CT_OCTET

PROPERTY = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])
needs_compiled = pytest.mark.skipif(core.NO_EXTENSIONS, reason="RIVERBED_NO_EXTENSIONS=1")
TEXT = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")    # what BSON can encode
KEYS = st.text(TEXT, max_size=8)

PUBLIC = ["encode_message", "decode_message", "payload_kind"]
CONSTANTS = ["BODY_DATA", "BODY_VALUE_BINARY", "BODY_VALUE_STRING", "BODY_VALUE", "BODY_SEQUENCE",
             "KIND_BYTES", "KIND_JSON", "KIND_BSON"]


def annotated(text):
    """Bytes from annotated hex: whitespace and ``# comments`` are dropped."""
    return bytes.fromhex(re.sub(r"#[^\n]*", "", text))


def compiled_twin():
    from riverbed.engine import _core
    return _core


# ---- golden bytes ----------------------------------------------------------------------------------------

# rstream 1.1.1: AMQPMessage(body=b"hello", header=Header(durable=True), message_annotations={b"x-opt": "v"},
#     properties=Properties(message_id="m1", content_type="application/json", creation_time=1700000000123),
#     application_properties={"k": "v", "n": 7}, footer={b"f": 1})
RSTREAM_FULL = annotated("""
    00 53 70                # header section (described, smallulong 0x70)
    c0 07 05                #   list8: size 7, 5 fields
    56 01                   #   0 durable: boolean true
    40 40 40 40             #   1-4 priority, ttl, first-acquirer, delivery-count: null
    00 53 72                # message-annotations section
    c1 0b 02                #   map8: size 11, 2 items
    a3 05 782d6f7074        #   key: sym8 "x-opt"
    a1 01 76                #   value: str8 "v"
    00 53 73                # properties section
    c0 2a 0d                #   list8: size 42, 13 fields
    a1 02 6d31              #   0 message-id: str8 "m1"
    40 40 40 40 40          #   1-5 user-id, to, subject, reply-to, correlation-id: null
    a3 10 6170706c69636174696f6e2f6a736f6e   # 6 content-type: sym8 "application/json"
    40 40                   #   7-8 content-encoding, absolute-expiry-time: null
    83 0000018bcfe5687b     #   9 creation-time: timestamp 1700000000123 ms
    40 40 40                #   10-12 group-id, group-sequence, reply-to-group-id: null
    00 53 74                # application-properties section
    c1 0c 04                #   map8: size 12, 4 items
    a1 01 6b  a1 01 76      #   "k": str8 "v"
    a1 01 6e  54 07         #   "n": smallint 7
    00 53 75                # data section
    a0 05 68656c6c6f        #   vbin8 "hello"
    00 53 78                # footer section
    c1 06 02                #   map8: size 6, 2 items
    a3 01 66  54 01         #   sym8 "f": smallint 1
""")

# rstream 1.1.1: AMQPMessage(body=b'{"a":1}') -- the bare message real clients send most
RSTREAM_BARE = annotated("""
    00 53 75                # data section
    a0 07 7b2261223a317d    #   vbin8 '{"a":1}'
""")

# rstream 1.1.1: AMQPMessage(body="text") -- a str body goes into the data section as a map, which is not
# a binary: not a complete AMQP 1.0 message, so it is read as a raw payload
RSTREAM_STR_BODY = annotated("""
    00 53 75                # data section ...
    a0 04                   #   ... "vbin8" of 4 bytes: c1 1c 04 a1 -- then 28 bytes the section does not hold
    c11c04a1 0454595045a10642494e415259a10556414c5545a10474657874
""")

# rstream 1.1.1: AMQPMessage(body=b"") encodes to no bytes at all: a raw, empty payload
RSTREAM_EMPTY = b""

# rbfly 0.10.0: encode_amqp(buf, MessageCtx(b"hello", None, None, None, None, None, None))
RBFLY_BYTES = annotated("""
    00 53 75                # data section
    a0 05 68656c6c6f        #   vbin8 "hello"
""")

# rbfly 0.10.0: MessageCtx("hello", ...) -- a str body is an amqp-value
RBFLY_STR = annotated("""
    00 53 77                # amqp-value section
    a1 05 68656c6c6f        #   str8 "hello"
""")

# rbfly 0.10.0: MessageCtx(b'{"a":1}', ..., properties=AMQPProperties([None] * 6 + [Symbol("application/json"),
#     None, None, <creation time>]), app_properties={"k": "v", "pkey": "p1"}) -- rbfly's encoder writes the
# application properties (always map32) and drops the properties section
RBFLY_PROPS = annotated("""
    00 53 74                # application-properties section
    d1 00000014 00000004    #   map32: size 20, 4 items
    a1 01 6b  a1 01 76      #   "k": str8 "v"
    a1 04 706b6579  a1 02 7031   # "pkey": str8 "p1"
    00 53 75                # data section
    a0 07 7b2261223a317d    #   vbin8 '{"a":1}'
""")

# rbfly 0.10.0: MessageCtx({"a": 1}, ...) -- an amqp-value of another type (a map)
RBFLY_MAP = annotated("""
    00 53 77                # amqp-value section
    d1 0000000c 00000002    #   map32: size 12, 2 items
    a1 01 61                #   str8 "a"
    71 00000001             #   int 1
""")

# Riverbed: encode_message([b"a", b"", b"bc"], "application/octet-stream", 1700000000123, {"X-a": "b", "k": b"\0"})
# -- a ZeroMQ message with three frames (one empty) and two headers
RIVERBED_ZMQ = annotated("""
    00 53 73                # properties section
    c0 2c 0a                #   list8: size 44, 10 fields (up to creation-time)
    40 40 40 40 40 40       #   0-5 message-id .. correlation-id: null
    a3 18 6170706c69636174696f6e2f6f637465742d73747265616d   # 6 content-type: sym8 "application/octet-stream"
    40 40                   #   7-8 content-encoding, absolute-expiry-time: null
    83 0000018bcfe5687b     #   9 creation-time: timestamp 1700000000123 ms
    00 53 74                # application-properties section
    c1 0f 04                #   map8: size 15, 4 items
    a1 03 582d61  a1 01 62  #   "X-a": str8 "b"
    a1 01 6b  a0 01 00      #   "k": vbin8 00
    00 53 75  a0 01 61      # data section: vbin8 "a"
    00 53 75  a0 00         # data section: vbin8 "" (an empty frame is kept)
    00 53 75  a0 02 6263    # data section: vbin8 "bc"
""")


def test_public_names_and_constants_agree():
    for name in PUBLIC:
        assert callable(getattr(_pycore, name)) and getattr(core, name) is getattr(core.impl, name), name
    for name in CONSTANTS:
        assert getattr(core, name) == getattr(_pyrecord, name) == getattr(_pycore, name), name
    if not core.NO_EXTENSIONS:
        _core = compiled_twin()
        assert core.impl is _core and core.COMPILED
        for name in PUBLIC:
            assert callable(getattr(_core, name)), name
        for name in CONSTANTS:
            assert getattr(_core, name) == getattr(_pyrecord, name), name


def test_rstream_golden_bytes_decode(twin):
    assert twin.decode_message(RSTREAM_FULL) == (
        "application/json", 1700000000123, {"k": "v", "n": 7}, [b"hello"], twin.BODY_DATA)
    assert twin.decode_message(RSTREAM_BARE) == (None, None, None, [b'{"a":1}'], twin.BODY_DATA)
    assert twin.decode_message(RSTREAM_STR_BODY) is None
    assert twin.decode_message(RSTREAM_EMPTY) is None


def test_rbfly_golden_bytes_decode(twin):
    assert twin.decode_message(RBFLY_BYTES) == (None, None, None, [b"hello"], twin.BODY_DATA)
    assert twin.decode_message(RBFLY_STR) == (None, None, None, [b"hello"], twin.BODY_VALUE_STRING)
    assert twin.decode_message(RBFLY_PROPS) == (None, None, {"k": "v", "pkey": "p1"}, [b'{"a":1}'],
                                                twin.BODY_DATA)
    assert twin.decode_message(RBFLY_MAP) == (None, None, None, [RBFLY_MAP[3:]], twin.BODY_VALUE)


def test_riverbed_golden_bytes(twin):
    args = ([b"a", b"", b"bc"], CT_OCTET, 1700000000123, {"X-a": "b", "k": b"\0"})
    assert twin.encode_message(*args) == RIVERBED_ZMQ
    assert twin.decode_message(RIVERBED_ZMQ) == (CT_OCTET, 1700000000123, {"X-a": "b", "k": b"\0"},
                                                 [b"a", b"", b"bc"], twin.BODY_DATA)


def test_rstream_encoder_still_writes_the_golden_bytes_and_reads_ours():
    from rstream import AMQPMessage, Header, Properties, amqp_decoder
    full = AMQPMessage(body=b"hello", header=Header(durable=True), message_annotations={b"x-opt": "v"},
                       properties=Properties(message_id="m1", content_type="application/json",
                                             creation_time=1700000000123),
                       application_properties={"k": "v", "n": 7}, footer={b"f": 1})
    assert bytes(full) == RSTREAM_FULL
    assert bytes(AMQPMessage(body=b'{"a":1}')) == RSTREAM_BARE
    assert bytes(AMQPMessage(body="text")) == RSTREAM_STR_BODY
    assert bytes(AMQPMessage(body=b"")) == RSTREAM_EMPTY
    ours = amqp_decoder(core.encode_message([b"payload"], CT_JSON, 1700000000123, {"pkey": "p1", "b": b"\1"}))
    assert ours.body == b"payload"
    assert ours.properties.content_type == CT_JSON.encode() and ours.properties.creation_time == 1700000000123
    assert ours.application_properties == {b"pkey": b"p1", b"b": b"\1"}


def test_rbfly_encoder_still_writes_the_golden_bytes_and_reads_ours():
    pytest.importorskip("rbfly")
    from rbfly.amqp._message import AMQPProperties, MessageCtx, decode_amqp, encode_amqp
    from rbfly.types import Symbol

    def encode(body, properties=None, app_properties=None):
        buf = bytearray(1024)
        return bytes(buf[:encode_amqp(buf, MessageCtx(body, None, None, None, properties, app_properties, None))])

    assert encode(b"hello") == RBFLY_BYTES
    assert encode("hello") == RBFLY_STR
    props = AMQPProperties([None] * 6 + [Symbol("application/json"), None, None,
                                         datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=timezone.utc)])
    assert encode(b'{"a":1}', props, {"k": "v", "pkey": "p1"}) == RBFLY_PROPS
    assert encode({"a": 1}) == RBFLY_MAP
    ours = decode_amqp(core.encode_message([b"payload"], CT_JSON, 1700000000123, {"pkey": "p1"}))
    assert ours.body == b"payload" and ours.app_properties == {"pkey": "p1"}
    assert ours.properties.content_type == Symbol(CT_JSON)
    assert ours.properties.creation_time == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=timezone.utc)


# ---- decoding rules --------------------------------------------------------------------------------------

def data(body):
    return b"\x00\x53\x75" + (bytes([0xA0, len(body)]) if len(body) < 256 else b"\xb0" + struct.pack(">I", len(body))) + body


def section(code, value):
    return b"\x00\x53" + bytes([code]) + value


LIST0 = b"\x45"
MAP_EMPTY = b"\xc1\x01\x00"


def test_section_order_and_forms(twin):
    body = data(b"x")
    ok = [
        section(0x70, LIST0) + section(0x71, MAP_EMPTY) + section(0x72, MAP_EMPTY) + section(0x73, LIST0)
        + section(0x74, MAP_EMPTY) + body + section(0x78, MAP_EMPTY),
        b"\x00\x80" + struct.pack(">Q", 0x75) + b"\xa0\x01x",                    # long descriptor
        b"\x00\xa3\x10amqp:data:binary\xa0\x01x",                                # symbolic descriptor
        body + data(b"") + data(b"y"),                                           # several data sections
        section(0x76, b"\xc0\x03\x01\x50\x07") + section(0x76, LIST0),          # two amqp-sequences
        section(0x77, b"\x00\x53\x01\xa0\x01x"),                                 # described amqp-value
        section(0x74, b"\xd1\x00\x00\x00\x04\x00\x00\x00\x00") + body,           # map32 with nothing in it
    ]
    for msg in ok:
        assert twin.decode_message(msg) is not None, msg.hex()
    assert twin.decode_message(ok[1])[3] == [b"x"] and twin.decode_message(ok[3])[3] == [b"x", b"", b"y"]
    assert twin.decode_message(ok[4]) == (None, None, None, [b"\xc0\x03\x01\x50\x07", LIST0], twin.BODY_SEQUENCE)
    assert twin.decode_message(ok[5]) == (None, None, None, [b"\x00\x53\x01\xa0\x01x"], twin.BODY_VALUE)
    assert twin.decode_message(ok[6])[2] == {}
    bad = [
        section(0x73, LIST0) + section(0x70, LIST0) + body,                      # header after properties
        section(0x73, LIST0) + section(0x73, LIST0) + body,                      # properties twice
        section(0x78, MAP_EMPTY) + body,                                         # footer before the body
        section(0x73, LIST0),                                                    # no body
        body + section(0x77, b"\x40"),                                           # data then amqp-value
        section(0x77, b"\x40") + section(0x77, b"\x40"),                         # two amqp-values
        body + section(0x78, MAP_EMPTY) + body,                                  # data after the footer
        section(0x75, b"\xa1\x01x"),                                             # data holding a string
        section(0x73, MAP_EMPTY) + body,                                         # properties not a list
        section(0x74, LIST0) + body,                                             # app properties not a map
        section(0x74, b"\xc1\x03\x02\x54\x01\x40") + body,                       # app property key not a string
        section(0x79, LIST0) + body,                                             # no such section
        b"\x00\x80" + struct.pack(">Q", 0x1_0000_0075) + b"\xa0\x01x",           # long descriptor, other domain
        b"\x00\xa3\x0bamqp:data:x\xa0\x01x",                                     # unknown symbolic descriptor
        b"\x00\x52\x75\xa0\x01x",                                                # uint is not a descriptor
        body + b"\x00",                                                          # a byte left over
        body[:-1],                                                               # cut short
        section(0x77, b"\xc0\x02\x01"),                                          # list count with no element
        section(0x77, b"\xc1\x03\x01\x40\x40"),                                  # map with an odd count
        section(0x77, b"\xc0\x03\x01\x40\x40"),                                  # list size past its element
        section(0x77, b"\xe0\x01\x00"),                                          # array without constructor
        section(0x77, b"\x57\x00"),                                              # undefined format code
        b"",
    ]
    for msg in bad:
        assert twin.decode_message(msg) is None, msg.hex()


def test_nesting_depth_limit(twin):
    def nested(n):
        v = b"\x40"
        for _ in range(n):
            v = b"\xc0" + bytes([len(v) + 1, 1]) + v if len(v) < 250 else b"\xd0" + struct.pack(">II", len(v) + 4, 1) + v
        return section(0x77, v)
    assert twin.decode_message(nested(_pyrecord.MAX_DEPTH)) is not None
    assert twin.decode_message(nested(_pyrecord.MAX_DEPTH + 1)) is None
    chain = b"\x00" * 5000 + b"\x40"           # descriptors of descriptors: refused, no recursion error
    assert twin.decode_message(section(0x77, chain)) is None


def properties(fields, count):
    return section(0x73, b"\xc0" + bytes([len(fields) + 1, count]) + fields)


def test_properties_fields(twin):
    # a content-type stored as str8 (not a symbol) is read too; a creation-time that is not a timestamp is not
    fields = b"\x40" * 6 + b"\xa1\x04text" + b"\x40\x40" + b"\x80" + b"\0" * 8
    assert twin.decode_message(properties(fields, 10) + data(b"x"))[:2] == ("text", None)
    fields = b"\x40" * 6 + b"\x71\0\0\0\1" + b"\x40\x40" + b"\x83" + struct.pack(">q", -5) + b"\x40" * 3
    assert twin.decode_message(properties(fields, 13) + data(b"x"))[:2] == (None, -5)
    assert twin.decode_message(properties(b"\x40" * 6, 6) + data(b"x"))[:2] == (None, None)
    assert twin.decode_message(properties(b"\xa3", 1) + data(b"x")) is None        # a field cut short
    assert twin.decode_message(properties(b"\x40\x40", 3) + data(b"x")) is None   # count past the fields


def test_app_property_values(twin):
    values = [
        (b"\x40", None), (b"\x41", True), (b"\x42", False), (b"\x56\x00", False), (b"\x43", 0), (b"\x44", 0),
        (b"\x50\xff", 255), (b"\x51\xff", -1), (b"\x52\x07", 7), (b"\x53\x07", 7), (b"\x54\xfe", -2),
        (b"\x55\xfe", -2), (b"\x60\xff\xff", 65535), (b"\x61\xff\xfe", -2), (b"\x70\xff\xff\xff\xff", 2**32 - 1),
        (b"\x71\xff\xff\xff\xfe", -2), (b"\x72" + struct.pack(">f", 1.5), 1.5), (b"\x73\x00\x00\x00\x41", "A"),
        (b"\x73\x00\x11\x00\x00", "\ufffd"), (b"\x80" + b"\xff" * 8, 2**64 - 1), (b"\x81" + b"\xff" * 8, -1),
        (b"\x82" + struct.pack(">d", -0.25), -0.25), (b"\x83" + struct.pack(">q", 1700000000123), 1700000000123),
        (b"\x98" + bytes(range(16)), uuid.UUID(bytes=bytes(range(16)))), (b"\xa0\x02\x00\x01", b"\x00\x01"),
        (b"\xb1\x00\x00\x00\x02h\xff", "h\ufffd"), (b"\xa3\x03sym", "sym"),
        (b"\x74\x01\x02\x03\x04", b"\x74\x01\x02\x03\x04"), (b"\xc0\x03\x01\x50\x01", b"\xc0\x03\x01\x50\x01"),
        (b"\xe0\x04\x02\x50\x01\x02", b"\xe0\x04\x02\x50\x01\x02"), (b"\x00\x53\x01\x40", b"\x00\x53\x01\x40"),
    ]
    for enc, expected in values:
        items = b"\xa1\x01k" + enc
        msg = section(0x74, b"\xc1" + bytes([len(items) + 1, 2]) + items) + data(b"x")
        got = twin.decode_message(msg)[2]["k"]
        assert got == expected and type(got) is type(expected), (enc.hex(), got)


# ---- encoding --------------------------------------------------------------------------------------------

def test_encode_forms(twin):
    long_ct = "application/" + "x" * 300
    msg = twin.encode_message([b"z" * 300], long_ct, None, {"k" * 300: "v" * 300, "b": b"\1" * 256})
    assert msg[3:4] == b"\xd0" and twin.decode_message(msg) == (
        long_ct, None, {"k" * 300: "v" * 300, "b": b"\1" * 256}, [b"z" * 300], twin.BODY_DATA)
    assert twin.encode_message([b"x"]) == data(b"x")
    assert twin.encode_message((bytearray(b"ab"), memoryview(b"cd")), None, 0) == (
        section(0x73, b"\xc0\x13\x0a" + b"\x40" * 9 + b"\x83" + b"\0" * 8) + data(b"ab") + data(b"cd"))
    assert twin.encode_message([b""], "ct", None, {}) == section(0x73, b"\xc0\x0b\x07" + b"\x40" * 6 + b"\xa3\x02ct") + data(b"")


@pytest.mark.parametrize("args, error", [
    (([],), ValueError),
    ((b"abc",), TypeError),
    (([b"x", 5],), TypeError),
    (([b"x"], 5), TypeError),
    (([b"x"], "caf\u00e9"), ValueError),
    (([b"x"], None, 1.5), TypeError),
    (([b"x"], None, 2**63), OverflowError),
    (([b"x"], None, -2**63 - 1), OverflowError),
    (([b"x"], None, None, {1: "x"}), TypeError),
    (([b"x"], None, None, {"k": 5}), TypeError),
    (([b"x"], None, None, {"k": "\ud800"}), UnicodeEncodeError),
])
def test_encode_errors(twin, args, error):
    with pytest.raises(error):
        twin.encode_message(*args)


headers_st = st.dictionaries(st.text(max_size=40), st.one_of(st.text(max_size=300), st.binary(max_size=300)),
                             max_size=6)
frames_st = st.lists(st.binary(max_size=400), min_size=1, max_size=5)
ct_st = st.one_of(st.none(), st.sampled_from([CT_JSON, CT_BSON, CT_OCTET]), st.text("abc/+;= ", max_size=300))
ts_st = st.one_of(st.none(), st.integers(-2**63, 2**63 - 1))


@PROPERTY
@given(frames=frames_st, ct=ct_st, ts=ts_st, headers=headers_st)
def test_round_trip(twin, frames, ct, ts, headers):
    msg = twin.encode_message(frames, ct, ts, headers)
    assert twin.decode_message(msg) == (ct, ts, headers or None, frames, twin.BODY_DATA)
    assert _pyrecord.decode_message(msg) == twin.decode_message(bytearray(msg))


@needs_compiled
@PROPERTY
@given(frames=frames_st, ct=ct_st, ts=ts_st, headers=headers_st)
def test_twins_encode_the_same_bytes(frames, ct, ts, headers):
    assert compiled_twin().encode_message(frames, ct, ts, headers) == _pyrecord.encode_message(frames, ct, ts, headers)


# ---- differential: generated AMQP, mutated AMQP, garbage ------------------------------------------------

FIXED = {0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0, 0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1,
         0x55: 1, 0x56: 1, 0x60: 2, 0x61: 2, 0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4, 0x74: 4, 0x80: 8, 0x81: 8,
         0x82: 8, 0x83: 8, 0x84: 8, 0x94: 16, 0x98: 16}


def var(small, big, raw, wide):
    return bytes([big]) + struct.pack(">I", len(raw)) + raw if wide or len(raw) > 255 else bytes([small, len(raw)]) + raw


def compound(small, big, items, wide):
    body = b"".join(items)
    if wide or len(body) + 1 > 255:
        return bytes([big]) + struct.pack(">II", len(body) + 4, len(items)) + body
    return bytes([small, len(body) + 1, len(items)]) + body


fixed_st = st.sampled_from(sorted(FIXED)).flatmap(
    lambda code: st.binary(min_size=FIXED[code], max_size=FIXED[code]).map(lambda b: bytes([code]) + b))
string_st = st.builds(lambda t, small, wide: var(small, small | 0x10, t.encode(), wide),
                      st.text(max_size=20), st.sampled_from([0xA1, 0xA3]), st.booleans())
binary_st = st.builds(lambda b, wide: var(0xA0, 0xB0, b, wide), st.binary(max_size=20), st.booleans())


def array(code, n, wide):
    body = bytes([code]) + b"\x07" * FIXED[code] * n
    if wide:
        return b"\xf0" + struct.pack(">II", len(body) + 4, n) + body
    return bytes([0xE0, len(body) + 1, n]) + body


array_st = st.builds(array, st.sampled_from([0x40, 0x50, 0x70, 0x83]), st.integers(0, 5), st.booleans())


def extend(children):
    pairs = st.lists(st.tuples(string_st, children), max_size=4).map(lambda kv: [x for p in kv for x in p])
    return st.one_of(
        st.builds(lambda items, wide: compound(0xC0, 0xD0, items, wide), st.lists(children, max_size=4), st.booleans()),
        st.builds(lambda items, wide: compound(0xC1, 0xD1, items, wide), pairs, st.booleans()),
        st.builds(lambda d, v: b"\x00" + d + v, st.one_of(fixed_st, string_st), children),
    )


value_st = st.recursive(st.one_of(fixed_st, string_st, binary_st, array_st), extend, max_leaves=12)
list_st = st.builds(lambda items, wide: compound(0xC0, 0xD0, items, wide), st.lists(value_st, max_size=4),
                    st.booleans())
map_st = st.builds(lambda kv, wide: compound(0xC1, 0xD1, [x for p in kv for x in p], wide),
                   st.lists(st.tuples(string_st, value_st), max_size=3), st.booleans())
descriptor_st = st.sampled_from(["short", "long", "symbol"])
NAMES = {code: name for name, code in _pyrecord.SECTION_NAMES.items()}


def described(code, value, form):
    if form == "short":
        return b"\x00\x53" + bytes([code]) + value
    if form == "long":
        return b"\x00\x80" + struct.pack(">Q", code) + value
    return b"\x00\xa3" + bytes([len(NAMES[code])]) + NAMES[code] + value


@st.composite
def messages(draw):
    parts = []
    for code, value in [(0x70, list_st), (0x71, map_st), (0x72, map_st), (0x73, list_st),
                        (0x74, st.lists(st.tuples(string_st, value_st), max_size=3).map(
                            lambda kv: compound(0xC1, 0xD1, [x for p in kv for x in p], False)))]:
        if draw(st.booleans()):
            parts.append(described(code, draw(value), draw(descriptor_st)))
    body = draw(st.sampled_from(["data", "value", "sequence"]))
    if body == "data":
        for b in draw(st.lists(binary_st, min_size=1, max_size=3)):
            parts.append(described(0x75, b, draw(descriptor_st)))
    elif body == "value":
        parts.append(described(0x77, draw(value_st), draw(descriptor_st)))
    else:
        for v in draw(st.lists(list_st, min_size=1, max_size=2)):
            parts.append(described(0x76, v, draw(descriptor_st)))
    if draw(st.booleans()):
        parts.append(described(0x78, draw(map_st), draw(descriptor_st)))
    return b"".join(parts)


def outcome(fn, *args):
    try:
        return repr(fn(*args))          # repr: NaN floats compare equal as text
    except Exception as exc:  # noqa: BLE001 - the comparison is of error types
        return type(exc).__name__


@needs_compiled
@PROPERTY
@given(msg=messages(), cut=st.integers(0, 10_000), flip=st.tuples(st.integers(0, 10_000), st.integers(1, 255)))
def test_twins_agree_on_generated_and_mutated_messages(msg, cut, flip):
    _core = compiled_twin()
    assert _pyrecord.decode_message(msg) is not None, msg.hex()
    mutated = [msg, msg[:cut % (len(msg) + 1)], msg + b"\x00"]
    pos, xor = flip
    if msg:
        b = bytearray(msg)
        b[pos % len(b)] ^= xor
        mutated.append(bytes(b))
    for m in mutated:
        assert outcome(_core.decode_message, m) == outcome(_pyrecord.decode_message, m), m.hex()
        assert outcome(_core.payload_kind, m) == outcome(_pyrecord.payload_kind, m), m.hex()
    assert _pyrecord.decode_message(msg[:-1]) is None


@needs_compiled
@settings(max_examples=400, deadline=None)
@given(raw=st.one_of(st.binary(max_size=64), st.binary(max_size=8).map(lambda b: b"\x00\x53" + b),
                     st.builds(lambda d: json.dumps(d).encode(), st.dictionaries(st.text(max_size=5), st.integers())),
                     st.builds(lambda d: bson.encode(d), st.dictionaries(KEYS, st.integers(0, 9)))))
def test_twins_agree_on_garbage(raw):
    _core = compiled_twin()
    assert outcome(_core.decode_message, raw) == outcome(_pyrecord.decode_message, raw)
    assert outcome(_core.payload_kind, raw) == outcome(_pyrecord.payload_kind, raw)


def test_every_truncation_of_a_message_is_raw_but_the_one_before_the_footer(twin):
    before_footer = RSTREAM_FULL.index(b"\x00\x53\x78")
    for i in range(len(RSTREAM_FULL)):
        assert (twin.decode_message(RSTREAM_FULL[:i]) is None) == (i != before_footer), i


# ---- payload kinds ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("payload, kind", [
    (b'{"a": 1}', "KIND_JSON"), (b' \t\r\n{}\n', "KIND_JSON"), (b'{"a": [1, {"b": null}]}', "KIND_JSON"),
    (b"[1, 2]", "KIND_BYTES"), (b"5", "KIND_BYTES"), (b'"x"', "KIND_BYTES"), (b"{broken", "KIND_BYTES"),
    (b'{"a": NaN}', "KIND_BYTES"), (b'{"a": 1} {}', "KIND_BYTES"), (b'{"\xff": 1}', "KIND_BYTES"),
    (b"\xef\xbb\xbf{}", "KIND_BYTES"), (b"{" * 100_000 + b"}", "KIND_BYTES"),
    (bson.encode({"a": 1}), "KIND_BSON"), (b"\x05\x00\x00\x00\x00", "KIND_BSON"),
    (b"\x06\x00\x00\x00\x00", "KIND_BYTES"), (b"\x05\x00\x00\x00\x01", "KIND_BYTES"), (b"", "KIND_BYTES"),
    (b"\x04\x00\x00\x00", "KIND_BYTES"),
])
def test_payload_kind(twin, payload, kind):
    assert twin.payload_kind(payload) == getattr(twin, kind)
    assert twin.payload_kind(bytearray(payload)) == getattr(twin, kind)


# ---- the record layer ------------------------------------------------------------------------------------

DOC = {"_id": ObjectId("65a1b2c3d4e5f60718293a4b"), "at": datetime(2024, 5, 1, 12, tzinfo=timezone.utc),
       "n": Int64(5), "i": 3, "f": 1.5, "b": b"\x01\x02", "s": "x", "l": [1, "two"], "o": {"k": None}}
DOC_EJSON = {"_id": {"$oid": "65a1b2c3d4e5f60718293a4b"}, "at": {"$date": "2024-05-01T12:00:00Z"}, "n": 5,
             "i": 3, "f": 1.5, "b": {"$binary": {"base64": "AQI=", "subType": "00"}}, "s": "x", "l": [1, "two"],
             "o": {"k": None}}


def test_content_type_says_what_a_payload_is():
    js, bs = b'{"a": 1}', bson.encode({"a": 1})
    cases = [
        (record.encode_record(js, CT_JSON), "json"),
        (record.encode_record(b"[1]", CT_JSON), "json"),               # labeled: not sniffed
        (record.encode_record(bs, CT_BSON), "bson"),
        (record.encode_record(js, "Application/JSON; charset=utf-8"), "json"),
        (record.encode_record(js, CT_OCTET), "json"),                 # octet-stream: sniffed
        (record.encode_record(bs, CT_OCTET), "bson"),
        (record.encode_record(b"\x01", CT_OCTET), "bytes"),
        (record.encode_record(js, None, 5), "json"),                  # no content-type: sniffed
        (record.encode_record(js, "text/plain"), "bytes"),            # another type: bytes
        (js, "json"), (bs, "bson"), (b"plain", "bytes"),               # raw records: sniffed
        (b"\x05\x00\x00\x00\x00", "bson"),                            # the empty document
        (b"\x0a\x00\x00\x00\x7f\x00\x00\x00\x00\x00", "bytes"),       # BSON framing, does not decode
        (RBFLY_STR, "bytes"), (section(0x77, b'\xa1\x02{}'), "json"),  # a string amqp-value is its text
        (RBFLY_MAP, "bytes"),                                         # other amqp-values: their encoding
    ]
    for raw, kind in cases:
        assert record.decode_record(raw).kind == kind, raw


def test_decode_record_fields():
    raw = record.encode_record([b"a", b"", b"b", b""], CT_OCTET, 1700000000123, {"X-id": "7", "pkey": b"k"})
    rec = record.decode_record(raw)
    assert rec.amqp and rec.content_type == CT_OCTET and rec.creation_time == 1700000000123
    assert rec.app_properties == {"X-id": "7", "pkey": b"k"}
    assert rec.sections == [b"a", b"", b"b", b""] and rec.payload == b"ab" and rec.kind == "bytes"
    assert rec.body_kind == core.BODY_DATA
    raw_rec = record.decode_record(bytearray(b"\x00\x53\x75\xa0\x05hel"))    # starts like AMQP, incomplete
    assert not raw_rec.amqp and raw_rec.payload == b"\x00\x53\x75\xa0\x05hel"
    assert raw_rec.sections == [raw_rec.payload] and raw_rec.app_properties == {} and raw_rec.kind == "bytes"
    assert raw_rec.content_type is None and raw_rec.creation_time is None and raw_rec.body_kind == 0
    assert record.decode_record(RSTREAM_FULL) == record.decode_record(bytes(RSTREAM_FULL))
    assert "hello" in repr(record.decode_record(RSTREAM_FULL))
    empty = record.decode_record(RSTREAM_EMPTY)
    assert not empty.amqp and empty.payload == b"" and empty.kind == "bytes"


def test_rstream_and_rbfly_records_render():
    rec = record.decode_record(RSTREAM_FULL)              # content-type json, payload not JSON
    assert rec.kind == "json" and record.to_json_value(rec) == {"base64": "aGVsbG8="}
    assert record.to_json_text(rec) == "hello"           # labeled JSON passes through unparsed
    rec = record.decode_record(RBFLY_PROPS)
    assert rec.kind == "json" and rec.app_properties == {"k": "v", "pkey": "p1"}
    assert record.to_json_value(rec) == {"a": 1} and record.to_bson_document(rec) == {"a": 1}


def test_bson_renders_as_relaxed_extended_json():
    for raw in (record.from_bson(DOC), bson.encode(DOC), record.encode_record(bson.encode(DOC), CT_OCTET)):
        rec = record.decode_record(raw)
        assert rec.kind == "bson"
        assert record.to_json_value(rec) == DOC_EJSON
        text = record.to_json_text(rec)
        assert json.loads(text) == DOC_EJSON and ", " not in text and '": ' not in text
        assert record.to_bson_document(rec) == DOC
        assert record.to_bson_bytes(rec) == bson.encode(DOC)          # as stored, byte for byte


def test_json_renders_as_bson():
    text = '{"b":1,  "a": {"$date": "2024-05-01T12:00:00Z"}, "big": 12345678901, "u": "\u00e9"}'
    for raw in (record.from_json_text(text), record.from_json_text(text.encode()), text.encode()):
        rec = record.decode_record(raw)
        assert rec.kind == "json"
        assert record.to_json_text(rec) == text                       # byte for byte
        assert record.to_json_value(rec) == json.loads(text)
        doc = record.to_bson_document(rec)
        assert doc == {"b": 1, "a": datetime(2024, 5, 1, 12, tzinfo=timezone.utc), "big": 12345678901, "u": "\u00e9"}
        assert bson.decode(record.to_bson_bytes(rec)) == {**doc, "a": doc["a"].replace(tzinfo=None)}
    bad_ejson = record.decode_record(b'{"a": {"$date": "not a date"}}')
    assert record.to_bson_document(bad_ejson) == {"a": {"$date": "not a date"}}
    huge = record.decode_record(b'{"n": 100000000000000000000}')
    assert record.to_bson_document(huge) == {"n": 10**20}
    assert bson.decode(record.to_bson_bytes(huge)) == {"data": b'{"n": 100000000000000000000}'}


def test_bytes_render_as_data_and_base64():
    for raw in (b"\x01\x02\xff", record.encode_record(b"\x01\x02\xff", CT_OCTET)):
        rec = record.decode_record(raw)
        assert rec.kind == "bytes"
        assert record.to_json_value(rec) == {"base64": base64.b64encode(b"\x01\x02\xff").decode()}
        assert record.to_json_text(rec) == '{"base64":"AQL/"}'
        doc = record.to_bson_document(rec)
        assert doc == {"data": Binary(b"\x01\x02\xff")} and type(doc["data"]) is Binary
        assert bson.decode(record.to_bson_bytes(rec)) == {"data": b"\x01\x02\xff"}


def test_labeled_payloads_that_do_not_decode_render_as_bytes():
    arr = record.decode_record(record.encode_record(b"[1, 2]", CT_JSON))
    assert record.to_json_value(arr) == [1, 2] and record.to_bson_document(arr) == {"data": Binary(b"[1, 2]")}
    not_utf8 = record.decode_record(record.encode_record(b"\xff", CT_JSON))
    assert record.to_json_text(not_utf8) == '{"base64":"/w=="}'
    assert record.to_bson_document(not_utf8) == {"data": Binary(b"\xff")}
    bad_bson = record.decode_record(record.encode_record(b"\x01\x02", CT_BSON))
    assert record.to_json_value(bad_bson) == {"base64": "AQI="}
    assert bson.decode(record.to_bson_bytes(bad_bson)) == {"data": b"\x01\x02"}


def test_zeromq_frames_and_headers_pass_unchanged():
    frames = [bson.encode({"a": 1}), b"", b"\x00\xff"]
    rec = record.decode_record(record.encode_record(frames, CT_OCTET, None, {"X-reply": "q"}))
    assert rec.sections == frames and rec.app_properties == {"X-reply": "q"}
    one = record.decode_record(record.from_bson({"a": 1}))
    assert one.sections == [bson.encode({"a": 1})]          # a BSON record arrives as its BSON bytes


@PROPERTY
@given(doc=st.dictionaries(KEYS, st.one_of(st.integers(-2**31, 2**31 - 1), st.text(TEXT, max_size=8),
                                                           st.booleans(), st.none()), max_size=6))
def test_record_round_trips(doc):
    text = json.dumps(doc)
    rec = record.decode_record(record.from_json_text(text))
    assert record.to_json_text(rec) == text and record.to_bson_document(rec) == doc
    rec = record.decode_record(record.from_bson(doc))
    assert record.to_bson_document(rec) == doc and record.to_json_value(rec) == doc
    assert json.loads(record.to_json_text(rec)) == doc


# ---- the nesting-depth limit (issue 21) -----------------------------------------------------------------

def _deep(n):
    d = {"x": 1}
    for _ in range(n - 1):
        d = {"a": [d]} if _ % 2 else {"a": d}
    return d


def test_depth_of_json_text_and_values():
    assert record.json_depth("5") == 0 and record.json_depth("[]") == 1 and record.json_depth("{}") == 1
    assert record.json_depth('{"a":[1,{"b":"[[[\\"[{"}]}') == 3        # brackets in strings do not count
    assert record.json_depth(b'{"a":"\\\\"}') == 1                       # an escaped backslash ends the escape
    for n in (1, 2, 64, 65, 600):
        text = json.dumps(_deep(n))
        assert record.json_depth(text) == record.value_depth(_deep(n), 10**6) == n + (n - 1) // 2
    assert record.value_depth(_deep(600), 64) == 65                      # stops once past the limit
    assert record.json_within_depth("[" * 10 + "]" * 10, 10) and not record.json_within_depth("[" * 11 + "]" * 11, 10)


@pytest.mark.parametrize("make", [
    lambda d: record.from_bson(d),
    lambda d: record.from_json_text(json.dumps(d)),
    lambda d: record.encode_record(bson.encode(d), None),                 # sniffed
    lambda d: json.dumps(d).encode(),                                      # raw, sniffed
])
def test_a_record_deeper_than_the_limit_renders_raw_everywhere_and_is_counted(make):
    deep, ok = {"x": 1}, {"x": 1}
    for _ in range(599):
        deep = {"a": deep}
    for _ in range(63):
        ok = {"a": ok}
    before = record.render_fallbacks()
    rec = record.decode_record(make(deep))
    payload = rec.payload
    assert record.to_json_value(rec) == {"base64": base64.b64encode(payload).decode()}
    assert json.loads(record.to_json_text(rec)) == {"base64": base64.b64encode(payload).decode()}
    assert record.to_bson_document(rec) == {"data": Binary(payload)}
    assert bson.decode(record.to_bson_bytes(rec)) == {"data": payload}
    after = record.render_fallbacks()
    assert sum(after.values()) - sum(before.values()) >= 3
    assert after.get(("json", "depth"), 0) > before.get(("json", "depth"), 0)
    rec = record.decode_record(make(ok))                                   # at the limit: as always
    assert record.to_json_value(rec) == ok and json.loads(record.to_json_text(rec)) == ok
    assert record.to_bson_document(rec) == ok and bson.decode(record.to_bson_bytes(rec)) == ok


def test_set_max_depth_is_the_one_limit():
    rec = record.decode_record(record.from_bson({"a": {"b": {}}}))
    try:
        record.set_max_depth(2)
        assert record.max_depth() == 2 and record.to_json_value(rec).keys() == {"base64"}
        record.set_max_depth(3)
        assert record.to_json_value(rec) == {"a": {"b": {}}}
        for bad in (0, 257, "3", True, 2.5):
            with pytest.raises(ValueError):
                record.set_max_depth(bad)
    finally:
        record.set_max_depth(record.DEFAULT_MAX_DEPTH)

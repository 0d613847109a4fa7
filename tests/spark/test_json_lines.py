"""decode=json's bulk path: ``core.json_lines`` (compiled and its twin) and ``spark.jsonbatch``.

Golden records as annotated hex, the twins against each other on random and mutated records, and the
bulk decode against the per-record path (``amqp.decode_documents``), which defines every value."""

import json
import struct

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.engine import _core, _pyjsonlines, record
from riverbed.spark import amqp, jsonbatch
from tests.twins import both

pytestmark = pytest.mark.spark

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TWINS = (_core, _pyjsonlines)


def hexb(text):
    """Bytes from annotated hex: ``#`` starts a comment, whitespace is ignored."""
    return bytes.fromhex("".join(line.split("#", 1)[0] for line in text.splitlines()).replace(" ", ""))


def buffers(records):
    body = pa.array(records, pa.binary())
    return body, body.buffers()[1], body.buffers()[2]


def lines_of(module, records, max_depth=64, long_ints=True):
    _, vo, data = buffers(records)
    lines, rows, bounds = module.json_lines(vo, data, max_depth, long_ints)
    return bytes(lines), list(struct.unpack(f"<{len(rows) // 8}q", rows)), \
        list(struct.unpack(f"<{len(bounds) // 8}q", bounds))


LABELED_JSON = hexb("""
    00 53 73                    # described: properties
    c0 19 07                    # list8, 25 bytes, 7 fields
    40 40 40 40 40 40           # message-id .. reply-to .. correlation-id: null
    a3 10 6170706c69636174696f6e2f6a736f6e   # content-type: sym8 "application/json"
    00 53 75                    # described: data
    a0 07 7b2261223a317d        # vbin8, 7 bytes: {"a":1}
""")
BARE_DATA = hexb("""
    00 53 75                    # data, no properties: the payload is sniffed
    a0 0e 7b2261223a322c0a2262223a337d   # {"a":2,\\n"b":3} (a newline between tokens)
""")
WITH_APP_PROPERTIES = hexb("""
    00 53 74                    # application-properties
    c1 0b 02                    # map8, 11 bytes, 2 elements (one key, one value)
    a1 04 706b6579              # str8 "pkey"
    a1 02 6b31                  # str8 "k1"
    00 53 75 a0 07 7b2261223a347d   # data: {"a":4}
""")
BSON_LABELED = hexb("""
    00 53 73 c0 19 07 40 40 40 40 40 40
    a3 10 6170706c69636174696f6e2f62736f6e   # content-type "application/bson": never JSON
    00 53 75 a0 0c 0c000000 10 6100 01000000 00   # {"a": int32 1}
""")
TWO_DATA_SECTIONS = hexb("""
    00 53 75 a0 05 7b2261223a    # {"a":
    00 53 75 a0 02 357d          # 5}: joined by the per-record path, left to it here
""")
BROKEN_MESSAGE = hexb("""
    00 53 75 a0 09 7b2261223a367d   # a data section claiming 9 bytes with 7 left: not a message, raw bytes
""")


@pytest.mark.parametrize("module", TWINS)
def test_golden_records(module):
    records = [LABELED_JSON, BARE_DATA, b' {"a":7} ', WITH_APP_PROPERTIES, BSON_LABELED, TWO_DATA_SECTIONS,
               BROKEN_MESSAGE, b"", b"[1]", b'{"a":1}{"a":2}', b'{"a":"$oid"}', b'{"a":"\\ud83d\\ude00"}',
               b'{"a":NaN}', b'{"a":"\xff"}', b'{"a":"x\ty"}']
    lines, rows, bounds = lines_of(module, records)
    assert lines == b'{"a":1}\n{"a":2, "b":3}\n {"a":7} \n{"a":4}\n'
    assert rows == [0, 1, 2, 3]
    assert bounds == [0, 8, 23, 33, 41]


@pytest.mark.parametrize("module", TWINS)
def test_depth_and_long_integers(module):
    deep = b'{"a":' * 3 + b"1" + b"}" * 3
    assert lines_of(module, [deep], max_depth=3)[1] == [0]
    assert lines_of(module, [deep], max_depth=2)[1] == []
    long_int = b'{"a":1234567890123456,"b":-123456789012345,"c":1.234567890123456789}'
    assert lines_of(module, [long_int], long_ints=True)[1] == [0]
    assert lines_of(module, [long_int], long_ints=False)[1] == []     # 16 digits may not fit a double
    assert lines_of(module, [b'{"b":-123456789012345,"c":1.234567890123456789e5}'], long_ints=False)[1] == [0]


@pytest.mark.parametrize("module", TWINS)
def test_bad_offsets_are_refused(module):
    with pytest.raises(ValueError):
        module.json_lines(b"\x00\x00\x00\x00\x09\x00\x00\x00", b"abc")
    with pytest.raises(ValueError):
        module.json_lines(b"\x02\x00\x00\x00\x01\x00\x00\x00", b"abc")
    with pytest.raises(ValueError):
        module.json_lines(b"\x00\x00", b"")
    with pytest.raises(ValueError):
        module.json_lines(b"\x00\x00\x00\x00", b"", 0)
    assert module.json_lines(b"\x00\x00\x00\x00", b"") == (bytearray(), bytearray(), bytearray(8))


# ---- random records: the twins agree and never crash ------------------------------------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b", "s", "$x", "l"]), inner, max_size=3)),
    max_leaves=8)
any_text = st.text(alphabet=st.characters(blacklist_categories=()), max_size=6)     # surrogates too
typed_docs = st.fixed_dictionaries({}, optional={        # mostly the columns' own types: the bulk path's case
    "id": st.none() | st.integers(-2**63, 2**63 - 1), "name": st.none() | any_text,
    "price": st.floats(allow_nan=False, allow_infinity=False) | st.integers(-2**60, 2**60),
    "ok": st.booleans(), "tags": st.lists(st.none() | any_text, max_size=3),
    "sub": st.none() | st.fixed_dictionaries({}, optional={"a": st.integers(-2**31, 2**31 - 1), "s": any_text}),
    "other": json_values})
docs = st.dictionaries(st.sampled_from(["id", "name", "price", "ok", "tags", "sub", "other"]), json_values,
                       max_size=6) | typed_docs


@st.composite
def json_texts(draw):
    doc = draw(docs)
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1])))
    data = text.encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 4)) == 0 and data:      # a mutation: a byte changed, dropped or doubled
        i = draw(st.integers(0, len(data) - 1))
        op = draw(st.integers(0, 2))
        b = bytes([draw(st.integers(0, 255))])
        data = data[:i] + b + data[i + 1:] if op == 0 else data[:i] + data[i + 1:] if op == 1 else \
            data[:i] + data[i:i + 1] * 2 + data[i + 1:]
    return data


@st.composite
def stored_records(draw):
    payload = draw(json_texts())
    form = draw(st.integers(0, 5))
    if form == 0:
        return payload
    if form == 1:
        return record.from_json_text(payload)
    if form == 2:
        return record.encode_record(payload, draw(st.sampled_from([None, "", record.CT_OCTET, "Application/JSON",
                                                                    record.CT_BSON, "text/plain"])))
    if form == 3:
        return record.encode_record(payload, record.CT_JSON, 1700000000000, {"pkey": "k"})
    if form == 4:
        return b"\x00\x53\x75\xa0" + bytes([len(payload) & 0xFF]) + payload
    return draw(st.binary(max_size=40))


@PROPERTY
@given(st.lists(stored_records(), max_size=8), st.integers(1, 8), st.booleans())
def test_twins_agree_on_random_records(records, max_depth, long_ints):
    _, vo, data = buffers(records)
    both(_core, _pyjsonlines, "json_lines", vo, data, max_depth, long_ints)


@PROPERTY
@given(st.binary(max_size=64), st.binary(max_size=200))
def test_malformed_buffers_never_crash(vo, data):
    both(_core, _pyjsonlines, "json_lines", vo, data)


# ---- the bulk decode gives what the per-record path gives ----------------------------------------------

FIELDS = [pa.field("id", pa.int64()), pa.field("name", pa.string()), pa.field("price", pa.float64()),
          pa.field("ok", pa.bool_()), pa.field("tags", pa.list_(pa.string())),
          pa.field("sub", pa.struct([pa.field("a", pa.int32()), pa.field("s", pa.string())]))]


def bulk_equals_per_record(records, fields):
    body, vo, data = buffers(records)
    want = amqp.decode_documents(body, "json", fields)
    split, jsonbatch.MIN_SPLIT_ROWS = jsonbatch.MIN_SPLIT_ROWS, 1      # every line Arrow takes is used
    try:
        got = jsonbatch.decode_json(vo, data, body, fields)
    finally:
        jsonbatch.MIN_SPLIT_ROWS = split
    assert [g.type for g in got] == [w.type for w in want]
    assert [g.to_pylist() for g in got] == [w.to_pylist() for w in want]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(stored_records(), max_size=12))
def test_bulk_decode_matches_the_per_record_path(records):
    bulk_equals_per_record(records, FIELDS)
    bulk_equals_per_record(records, FIELDS[:2] + FIELDS[3:5])       # no float column: long integers taken


def test_bulk_decode_of_typical_and_odd_records():
    good = [record.from_json_text(json.dumps({"id": i, "name": f"n{i}", "price": i / 4, "ok": i % 2 == 0,
                                              "tags": ["a"], "sub": {"a": i, "s": "x"}}).encode())
            for i in range(300)]
    odd = [b'{"id":"7"}', b'{"id":99999999999999999999}', b'{"price":9007199254740993}', b'{"name":5}',
           b'{"id":1,"id":2}', record.from_bson({"id": 5, "name": "bson"}), b'{"name":"\\ud800"}',
           b'{"sub":{"a":3000000000}}', b'{"tags":"x"}', b'{"ok":1}', b'{"id":1.0}', b"not json",
           b'{"name":{"$oid":"65a1"}}', b'{"price":NaN}', b'{"id":1} ']
    records = good[:100] + odd + good[100:] + odd[::-1]
    bulk_equals_per_record(records, FIELDS)
    bulk_equals_per_record([b'{}', b'{"id": null, "sub": []}', b'{"id": null, "name": null, "sub": {}}'], FIELDS)
    body, vo, data = buffers(good)
    cols = jsonbatch.decode_json(vo, data, body, FIELDS)
    assert cols[0].to_pylist() == list(range(300)) and cols[5][7].as_py() == {"a": 7, "s": "x"}


def test_unsupported_types_are_not_taken():
    assert jsonbatch.supported(FIELDS)
    assert not jsonbatch.supported([pa.field("t", pa.timestamp("us", tz="UTC"))])
    assert not jsonbatch.supported([pa.field("l", pa.list_(pa.float32()))])


def test_the_shells_own_json_form_is_taken_as_the_section_walk_takes_it():
    long_doc = b'{"name":"' + b"x" * 300 + b'"}'
    shell = record.from_json_text(long_doc)
    assert shell[33] == 0xB0                                          # 00 53 75 b0 <u32 length>: vbin32
    records = [shell, record.from_json_text(b'{"a":1}'), record.from_json_text(b'{"a":1}') + b"\x00",
               record.from_json_text(b'{"a":1}')[:-1], record.from_json_text(b'{"a":1}', 5)]
    _, vo, data = buffers(records)
    lines, rows, _ = both(_core, _pyjsonlines, "json_lines", vo, data)[1]
    assert struct.unpack("<3q", rows) == (0, 1, 4) and lines.startswith(long_doc + b"\n")

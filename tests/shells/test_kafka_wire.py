"""The Kafka shell's record loops (``riverbed.shells.wire``: ``kafka.pxi`` compiled, ``_pywire`` pure):
Produce's record batch -> stored records (chunk entries) and Fetch's stored records -> a record batch v2.

Every test takes the ``wire_twin`` fixture and so runs against both implementations; the differential
tests feed the same input to both and compare bytes and errors; the fast-path tests show that the
compiled twin takes the layouts the shells write without handing them to the pure one.
"""

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.engine import core
from riverbed.engine.errors import ChunkError, FrameError
from riverbed.engine.record import CT_OCTET, encode_record, from_bson, from_json_text
from riverbed.shells import _pywire, wire
from riverbed.shells.kafka import codec as C
from riverbed.shells.kafka import records as R

PROPERTY = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])
needs_compiled = pytest.mark.skipif(wire.NO_EXTENSIONS, reason="RIVERBED_NO_EXTENSIONS=1")

# (timestamp, key, value, headers) as a Kafka client sends them: the cases the mapping distinguishes
RECORDS = [
    (1_700_000_000_000, b"k1", b"x" * 100, []),
    (1_700_000_000_001, None, b"v", []),
    (1_700_000_000_002, b"", None, []),
    (5, b"key", b'{"a": 1}', [("h", b"text"), ("bin", b"\xff\x00"), ("null", None), ("empty", b"")]),
    (-1, b"neg", b"no creation time", [("\u00e9t\u00e9", "\u2603".encode())]),
    (1_700_000_000_003, b"k" * 300, b"v" * 70_000, [("n" * 300, b"w" * 300)]),
    (1_700_000_000_004, None, b"", [(f"h{i}", b"%d" % i) for i in range(16)]),
]


def _body(records):
    """The records section and base timestamp of a batch v2 of ``records`` (the clients' encoding)."""
    batch = C.encode_batch(0, records)
    return batch[C.LEN_BATCH_HEADER:], records[0][0]


def _expected_entries(records):
    return core.encode_entries([R.to_stored(k, v, h, ts) for ts, k, v, h in records])


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # the exception type and message are part of the contract
        return ("error", type(exc), str(exc))


def _stored(twin, body, count, base_ts):
    out = bytearray(b"head")
    res = _outcome(twin.kafka_stored, body, count, base_ts, out, R.to_stored)
    return res, (bytes(out) if res[0] == "ok" else None)


# ---- Produce -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", range(len(RECORDS)))
def test_produce_stores_each_record_as_to_stored_does(wire_twin, case):
    records = [RECORDS[case], RECORDS[(case + 1) % len(RECORDS)]]
    body, base_ts = _body(records)
    out = bytearray(b"head")
    assert wire_twin.kafka_stored(body, len(records), base_ts, out, R.to_stored) == len(body)
    assert bytes(out) == b"head" + _expected_entries(records)


def test_produce_all_records_in_one_batch(wire_twin):
    body, base_ts = _body(RECORDS)
    out = bytearray()
    assert wire_twin.kafka_stored(memoryview(body), len(RECORDS), base_ts, out, R.to_stored) == len(body)
    assert bytes(out) == _expected_entries(RECORDS)
    # and the stored records read back as the client sent them (a null header value comes back empty)
    raws = core.chunk_records(core.encode_chunk([bytes(r) for r in _split_entries(bytes(out))], 0, 7), False)
    for (ts, k, v, h), raw in zip(RECORDS, raws):
        got = R.from_stored(raw, 7)
        assert got == (ts if ts >= 0 else 7, k, v if v is not None else b"",
                       [(n, x if x is not None else b"") for n, x in h])


def _split_entries(data):
    out, pos = [], 0
    while pos < len(data):
        n = struct.unpack_from(">I", data, pos)[0]
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


@needs_compiled
def test_compiled_produce_takes_the_clients_layouts_itself():
    from riverbed.shells import _wire
    body, base_ts = _body(RECORDS)
    out = bytearray()
    assert _wire.kafka_stored_fast(body, len(RECORDS), base_ts, out) == len(body)
    assert bytes(out) == _expected_entries(RECORDS)


@needs_compiled
@pytest.mark.parametrize("records", [
    [(1, None, b"v", [("dup", b"a"), ("x", b"b"), ("dup", b"c")])],         # a header name twice: a dict
    [(1, None, b"v", [(f"h{i}", b"") for i in range(17)])],                 # more headers than it keeps
], ids=["repeated-header", "many-headers"])
def test_compiled_produce_hands_unusual_records_to_the_pure_twin(records):
    from riverbed.shells import _wire
    body, base_ts = _body(records)
    out = bytearray(b"keep")
    assert _wire.kafka_stored_fast(body, len(records), base_ts, out) is None and out == b"keep"
    assert _stored(_wire, body, len(records), base_ts) == _stored(_pywire, body, len(records), base_ts)
    assert _stored(_wire, body, 1, base_ts)[1] == b"head" + _expected_entries(records)


def test_produce_refuses_a_timestamp_outside_int64(wire_twin):
    body, _ = _body([(0, None, b"v", []), (1 << 40, None, b"w", [])])
    with pytest.raises(FrameError, match="timestamp outside int64"):
        wire_twin.kafka_stored(body, 2, (1 << 63) - 2, bytearray(), R.to_stored)


@pytest.mark.parametrize("cut", [1, 5, 20, 60, 99])
def test_produce_truncated_records_fail_the_same_way(cut):
    body, base_ts = _body(RECORDS[:4])
    if wire.NO_EXTENSIONS:
        pytest.skip("RIVERBED_NO_EXTENSIONS=1")
    from riverbed.shells import _wire
    a = _stored(_wire, body[:cut], 4, base_ts)
    assert a == _stored(_pywire, body[:cut], 4, base_ts)
    assert a[0][0] == "error" and a[0][1] is FrameError


@needs_compiled
@PROPERTY
@given(st.data())
def test_produce_twins_agree_on_mutated_batches(data):
    from riverbed.shells import _wire
    records = data.draw(st.lists(st.tuples(
        st.integers(-5, 1 << 45), st.one_of(st.none(), st.binary(max_size=20)),
        st.one_of(st.none(), st.binary(max_size=300)),
        st.lists(st.tuples(st.sampled_from(["a", "b", "pkey", "\u00e9", "x" * 40]),
                           st.one_of(st.none(), st.binary(max_size=12), st.just("\u2603".encode()))),
                 max_size=4)), min_size=1, max_size=5))
    body = bytearray(_body(records)[0])
    for _ in range(data.draw(st.integers(0, 3))):
        if body:
            i = data.draw(st.integers(0, len(body) - 1))
            body[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        body = body[:data.draw(st.integers(0, len(body)))]
    count = data.draw(st.integers(0, len(records) + 1))
    base_ts = data.draw(st.sampled_from([0, records[0][0], (1 << 63) - 10, -(1 << 63) + 10]))
    assert _stored(_wire, bytes(body), count, base_ts) == _stored(_pywire, bytes(body), count, base_ts)


def test_codec_stored_batches_builds_one_chunk_of_every_batch():
    a = C.encode_batch(0, RECORDS[:3], producer_id=7, producer_epoch=1, base_sequence=10)
    b = C.encode_batch(0, RECORDS[3:5], compression=C.COMPRESSION_GZIP, producer_id=7, producer_epoch=1,
                       base_sequence=13)
    chunk, count, batches = C.stored_batches(a + b, 1 << 20, R.to_stored)
    assert count == 5 and [x.records for x in batches] == [3, 2]
    assert [x.base_sequence for x in batches] == [10, 13]
    data = _expected_entries(RECORDS[:5])
    assert bytes(chunk[48:]) == data
    h = core.read_header(bytes(chunk))
    assert (h[2], h[3], h[8]) == (5, 5, len(data))         # entries, records, data length; CRC left to the writer
    bad = bytearray(a)
    bad[-1] ^= 1
    with pytest.raises(C.CorruptBatch, match="CRC"):
        C.stored_batches(bytes(bad), 1 << 20, R.to_stored)


# ---- Fetch ---------------------------------------------------------------------------------------------

def _stored_records():
    """Records as every shell stores them: Kafka's own, JSON, BSON, a raw RabbitMQ Stream payload,
    WebSocket's pkey, ZeroMQ's headers, an amqp-value message, text that is not UTF-8, ..."""
    return ([R.to_stored(k, v, h, ts) for ts, k, v, h in RECORDS]
            + [from_json_text('{"a":1}', 1234, {"pkey": "p1"}), from_bson({"x": 2}),
               from_json_text('{"b":2}', None, {"X-One": "1", "X-Bin": b"\x00\xff"}),
               encode_record([b"frame1", b"", b"frame3"], None),
               b"\x01 a raw payload", b"", b"\x00\x53\x77\xa1\x05hello",          # raw, empty, amqp-value
               encode_record(b"v", CT_OCTET, 5, {"bad": b"ok"})[:-1] + b"\xff",  # a damaged one: raw
               b"\x00\x53\x73\x45\x00\x53\x75\xa0\x01z",                          # list0 properties
               b"\x00\x53\x74\xc1\x07\x02\xa1\x01k\xa1\x01\xff\x00\x53\x75\xa0\x00",  # text that is not UTF-8
               b"\x00\x53\x74\xc1\x06\x02\xa1\x01k\x54\x07\x00\x53\x75\xa0\x00"])    # a byte-valued property


def _expected_batch(raws, skip, base, chunk_ts):
    recs = [R.from_stored(r, chunk_ts) for r in raws[skip:]]
    return C.encode_batch(base, recs) if recs else None


@pytest.mark.parametrize("skip", [0, 3, 17])
def test_fetch_batch_is_what_from_stored_and_encode_batch_make(wire_twin, skip):
    raws = _stored_records()
    got = wire_twin.kafka_batch(raws, skip, 100 + skip, 1_650_000_000_000, R.from_stored)
    assert (bytes(got) if got is not None else None) == _expected_batch(raws, skip, 100 + skip, 1_650_000_000_000)
    if got is not None:
        (b,) = C.decode_batches(bytes(got), 1 << 20)      # a client reads it back: CRC and layout hold
        assert b.base_offset == 100 + skip and len(b.records) == len(raws) - skip


def test_fetch_nothing_past_the_last_record(wire_twin):
    assert wire_twin.kafka_batch([b"a", b"b"], 2, 0, 0, R.from_stored) is None
    assert wire_twin.kafka_batch([], 0, 0, 0, R.from_stored) is None


@needs_compiled
def test_compiled_fetch_reads_the_shells_layouts_itself():
    from riverbed.shells import _wire
    raws = [R.to_stored(k, v, h, ts) for ts, k, v, h in RECORDS] + [
        from_json_text('{"a":1}', 1234, {"pkey": "p1"}), from_bson({"x": 2}), b"\x01raw", b"",
        encode_record([b"f1", b"f2"], None, None, {"X-A": "1", "X-B": b"\x00"})]
    got = _wire.kafka_batch_fast(raws, 1, 9, 77)
    assert got is not None and bytes(got) == _expected_batch(raws, 1, 9, 77)


@needs_compiled
def test_compiled_fetch_hands_other_layouts_to_from_stored():
    from riverbed.shells import _wire
    for raw in (b"\x00\x53\x77\xa1\x05hello", b"\x00\x53\x74\xc1\x06\x02\xa1\x01k\x54\x07\x00\x53\x75\xa0\x00"):
        assert _wire.kafka_batch_fast([raw], 0, 0, 1) is None
        seen = []

        def spy(r, ts):
            seen.append(r)
            return R.from_stored(r, ts)
        assert bytes(_wire.kafka_batch([raw], 0, 0, 1, spy)) == _expected_batch([raw], 0, 0, 1)
        assert seen == [raw]


def test_fetch_timestamps_far_apart_agree(wire_twin):
    raws = [R.to_stored(None, b"a", [], (1 << 63) - 1), b"\x01raw chunk-timestamped"]
    got = wire_twin.kafka_batch(raws, 0, 0, -(1 << 62), R.from_stored)
    assert bytes(got) == _expected_batch(raws, 0, 0, -(1 << 62))


@needs_compiled
@PROPERTY
@given(st.data())
def test_fetch_twins_agree_on_mutated_records(data):
    from riverbed.shells import _wire
    pool = _stored_records()
    raws = []
    for _ in range(data.draw(st.integers(1, 5))):
        raw = bytearray(data.draw(st.sampled_from(pool)))
        for _ in range(data.draw(st.integers(0, 2))):
            if raw:
                raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
        if raw and data.draw(st.booleans()):
            raw = raw[:data.draw(st.integers(0, len(raw)))]
        raws.append(bytes(raw))
    skip = data.draw(st.integers(0, len(raws)))
    chunk_ts = data.draw(st.sampled_from([0, 1_650_000_000_000, -(1 << 63), (1 << 63) - 1]))
    a = _outcome(_wire.kafka_batch, raws, skip, 5, chunk_ts, R.from_stored)
    b = _outcome(_pywire.kafka_batch, raws, skip, 5, chunk_ts, R.from_stored)
    assert a == b


# ---- Fetch from a stored chunk, into one buffer ------------------------------------------------------------

def _chunk_forms(raws):
    """The same records as the engine stores them: simple entries (with a bloom filter too), and a
    sub-batch followed by simple entries (read through chunk_records)."""
    simple = core.encode_chunk(raws, 40, 1_650_000_000_000)
    bloom = core.build_chunk(core.encode_entries(raws), len(raws), len(raws), 1_650_000_000_000, 40,
                             bloom=core.build_bloom([b"f"], True, 16))
    k = min(4, len(raws))
    mixed = core.build_chunk(core.encode_sub_batch(raws[:k]) + core.encode_entries(raws[k:]), 1 + len(raws) - k,
                             len(raws), 1_650_000_000_000, 40)
    return {"simple": simple, "bloom": bloom, "sub-batch": mixed}


@pytest.mark.parametrize("form", ["simple", "bloom", "sub-batch"])
@pytest.mark.parametrize("skip", [0, 3, 17, 99])
def test_fetch_from_a_chunk_appends_what_kafka_batch_makes(wire_twin, form, skip):
    raws = _stored_records()
    chunk = _chunk_forms(raws)[form]
    out = bytearray(b"before")
    n = wire_twin.kafka_chunk_batch(chunk, skip, 40 + skip, 1_650_000_000_000, out, R.from_stored)
    want = _expected_batch(raws, skip, 40 + skip, 1_650_000_000_000) or b""
    assert n == len(want) and bytes(out) == b"before" + want
    # a second chunk goes right after the first, in the same buffer
    n2 = wire_twin.kafka_chunk_batch(chunk, 0, 80, 7, out, R.from_stored)
    assert bytes(out) == b"before" + want + _expected_batch(raws, 0, 80, 7) and n2 > 0


@pytest.mark.parametrize("form", ["simple", "bloom", "sub-batch"])
def test_fetch_into_a_reserved_buffer_writes_each_batch_after_the_last(wire_twin, form):
    # chunk after chunk at the end of what is written, over room reserved (and garbage) past it: the
    # same bytes kafka_chunk_batch appends, the head kept, and a buffer trimmed once at the end
    raws = _stored_records()
    chunk = _chunk_forms(raws)[form]
    one = [R.to_stored(None, b"v", [], 5)]
    small = core.encode_chunk(one, 900, 5)
    out = bytearray(b"head")
    wire_twin.kafka_reserve(out, 4, [(40, memoryview(chunk)), (900, small)])
    if wire_twin.COMPILED:      # room for both batches, from their headers (the pure twin grows as it writes)
        assert len(out) >= 4 + len(_expected_batch(raws, 0, 40, 1) + _expected_batch(one, 0, 900, 5))
    out[4:] = b"\xee" * (len(out) - 4)
    at = wire_twin.kafka_chunk_batch_at(memoryview(chunk), 3, 43, 1, out, 4, R.from_stored)
    at = wire_twin.kafka_chunk_batch_at(small, 0, 900, 5, out, at, R.from_stored)
    assert wire_twin.kafka_chunk_batch_at(small, 1, 901, 5, out, at, R.from_stored) == at     # nothing from 1 on
    want = b"head" + _expected_batch(raws, 3, 43, 1) + _expected_batch(one, 0, 900, 5)
    assert at == len(want) and bytes(out[:at]) == want
    # the same as appending one chunk after the other
    appended = bytearray(b"head")
    wire_twin.kafka_chunk_batch(chunk, 3, 43, 1, appended, R.from_stored)
    wire_twin.kafka_chunk_batch(small, 0, 900, 5, appended, R.from_stored)
    assert appended == want
    # the room need not be reserved: an empty buffer grows as it is written
    out = bytearray()
    end = wire_twin.kafka_chunk_batch_at(chunk, 0, 40, 1, out, 0, R.from_stored)
    assert bytes(out[:end]) == _expected_batch(raws, 0, 40, 1)
    for bad_at in (-1, len(out) + 1):
        with pytest.raises(ValueError):
            wire_twin.kafka_chunk_batch_at(chunk, 0, 40, 1, out, bad_at, R.from_stored)
        with pytest.raises(ValueError):
            wire_twin.kafka_reserve(out, bad_at, [])


def test_fetch_into_a_reserved_buffer_refuses_a_chunk_that_does_not_walk(wire_twin):
    raws = [R.to_stored(None, b"v%d" % i, [], 5) for i in range(3)]
    bad = core.build_chunk(core.encode_entries(raws), 3, 4, 5, 0)          # header says 4 records
    out = bytearray(b"kept")
    with pytest.raises(ChunkError):
        wire_twin.kafka_chunk_batch_at(bad, 0, 0, 5, out, 4, R.from_stored)
    assert out[:4] == b"kept"


@needs_compiled
def test_compiled_fetch_from_a_chunk_makes_no_object_per_record():
    # the shells' layouts are read in place: from_stored is never called, for none of the records
    from riverbed.shells import _wire
    raws = [R.to_stored(k, v, h, ts) for ts, k, v, h in RECORDS] + [from_json_text('{"a":1}', 1234, {"pkey": "p"}),
                                                                    b"\x01raw", b""]

    def refuse(raw, ts):
        raise AssertionError("handed over")
    out = bytearray()
    _wire.kafka_chunk_batch(core.encode_chunk(raws, 3, 9), 0, 3, 9, out, refuse)
    assert bytes(out) == _expected_batch(raws, 0, 3, 9)


def test_fetch_from_a_chunk_whose_entries_do_not_walk_is_a_chunk_error(wire_twin):
    raws = [R.to_stored(None, b"v%d" % i, [], 5) for i in range(3)]
    good = core.encode_chunk(raws, 0, 5)
    for bad in (core.build_chunk(core.encode_entries(raws)[:-1], 3, 3, 5, 0),       # overruns the section
                core.build_chunk(core.encode_entries(raws), 3, 4, 5, 0),            # header says 4 records
                good[:-2]):                                                          # data cut short
        out = bytearray(b"x")
        with pytest.raises(ChunkError):
            wire_twin.kafka_chunk_batch(bad, 0, 0, 5, out, R.from_stored)
        assert out == b"x"


@needs_compiled
@PROPERTY
@given(st.data())
def test_fetch_from_a_chunk_twins_agree_on_mutated_chunks(data):
    from riverbed.shells import _wire
    raws = [data.draw(st.sampled_from(_stored_records())) for _ in range(data.draw(st.integers(1, 6)))]
    chunk = bytearray(_chunk_forms(raws)[data.draw(st.sampled_from(["simple", "sub-batch"]))])
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(48, len(chunk) - 1))
        chunk[at] = data.draw(st.integers(0, 255))
    skip = data.draw(st.integers(0, len(raws)))
    a, b = bytearray(b"a"), bytearray(b"a")
    ra = _outcome(_wire.kafka_chunk_batch, bytes(chunk), skip, 3, 11, a, R.from_stored)
    rb = _outcome(_pywire.kafka_chunk_batch, bytes(chunk), skip, 3, 11, b, R.from_stored)
    assert ra == rb and a == b


@pytest.mark.parametrize("seqs", [[], [(0, 3)], [(5, 2), (7, 0), (100, 3)], [((1 << 63) - 2, 2)]])
def test_sequence_ids_are_each_batchs_run_as_big_endian_u64s(wire_twin, seqs):
    want = b"".join(struct.pack(">Q", base + i) for base, n in seqs for i in range(n))
    assert wire_twin.kafka_sequence_ids(seqs) == want


def test_sequence_ids_past_int64_or_negative_are_refused(wire_twin):
    with pytest.raises(OverflowError):
        wire_twin.kafka_sequence_ids([((1 << 63) - 2, 3)])
    with pytest.raises(ValueError):
        wire_twin.kafka_sequence_ids([(-1, 1)])

"""mc0 framing (riverbed.shells.zmq_mc0.codec): requests, replies, stored records and MESSAGE."""

import random

import pytest

from riverbed.engine import record
from riverbed.shells.zmq_mc0 import codec
from riverbed.shells.zmq_mc0.codec import RequestError, parse_request


def test_full_request():
    r = parse_request([b"", b"PUT", b"TOPIC", b"t", b"X-A", b"1", b"ID", b"9", b"", b"a", b"", b"\x00\xff"])
    assert r.verb == b"PUT" and r.id == b"9"
    assert r.headers == [(b"TOPIC", b"t"), (b"X-A", b"1"), (b"ID", b"9")]
    assert r.body == [b"a", b"", b"\x00\xff"]
    assert r.header(b"TOPIC") == b"t" and r.header(b"NOPE") is None


def test_delimiter_and_body_optional():
    r = parse_request([b"", b"NOOP"])
    assert (r.verb, r.headers, r.body, r.id) == (b"NOOP", [], [], None)
    r = parse_request([b"", b"NOOP", b"ID", b"x"])
    assert r.id == b"x" and r.body == []
    r = parse_request([b"", b"SUB", b"", b"t1", b"t2"])
    assert r.body == [b"t1", b"t2"]


@pytest.mark.parametrize("frames, text, rid", [
    ([b"NOOP"], "empty delimiter", None),
    ([], "empty delimiter", None),
    ([b""], "no verb", None),
    ([b"", b""], "no verb", None),
    ([b"", b"NOOP", b"ID"], "odd number", None),
    ([b"", b"PUT", b"ID", b"7", b"TOPIC", b"", b"x"], "odd number", b"7"),
    ([b"", b"FROB", b"ID", b"5"], "Unknown verb 'FROB'", b"5"),
    ([b"", b"noop"], "Unknown verb", None),
])
def test_errors(frames, text, rid):
    with pytest.raises(RequestError) as ei:
        parse_request(frames)
    assert text in ei.value.text and ei.value.id == rid


def test_random_frames_never_crash():
    rnd = random.Random(4)
    for _ in range(3000):
        frames = [bytes(rnd.getrandbits(8) for _ in range(rnd.choice((0, 0, 1, 3, 9))))
                  for _ in range(rnd.randint(0, 8))]
        if rnd.random() < 0.5 and frames:
            frames[0] = b""
        try:
            parse_request(frames)
        except RequestError as e:
            assert e.text


def test_replies():
    assert codec.encode_ok(b"1") == [b"", b"OK", b"ID", b"1"]
    assert codec.encode_error("bad") == [b"", b"ERROR", b"MESSAGE", b"bad"]
    assert codec.encode_error("bad", b"2") == [b"", b"ERROR", b"MESSAGE", b"bad", b"ID", b"2"]
    assert codec.encode_message([(b"TOPIC", b"t")], [b"x", b""]) == [b"", b"MESSAGE", b"TOPIC", b"t", b"", b"x", b""]


def test_put_record_round_trip():
    headers = [(b"TOPIC", b"t"), (b"X-REPLY-TO", b"r"), (b"ID", b"1"), (b"X-BIN", b"\xff\x00")]
    body = [b"one", b"", b"\x00" * 10]
    raw = codec.put_record(headers, body)
    rec = record.decode_record(raw)
    assert rec.amqp and rec.content_type == record.CT_OCTET
    assert rec.app_properties == {"X-REPLY-TO": "r", "X-BIN": b"\xff\x00"}
    assert rec.sections == body
    assert codec.record_message(b"t", raw, 7) == [b"", b"MESSAGE", b"TOPIC", b"t", b"X-REPLY-TO", b"r",
                                                  b"X-BIN", b"\xff\x00", b"X-OFFSET", b"7", b"X-CONTENT-TYPE", b"application/octet-stream", b"", *body]


def test_put_record_keeps_header_order_when_topic_is_not_first():
    raw = codec.put_record([(b"X-A", b"1"), (b"TOPIC", b"t")], [b"b"])
    assert codec.record_message(b"t", raw, 0) == [b"", b"MESSAGE", b"X-A", b"1", b"TOPIC", b"t", b"X-OFFSET", b"0",
                                                  b"X-CONTENT-TYPE", b"application/octet-stream", b"", b"b"]


def test_other_protocols_records():
    raw = b"raw bytes from rstream"
    assert codec.record_message(b"s", raw, 3) == [b"", b"MESSAGE", b"TOPIC", b"s", b"X-OFFSET", b"3", b"X-CONTENT-TYPE", b"application/octet-stream",
                                                  b"", raw]
    raw = record.encode_record([b'{"a":1}'], record.CT_JSON, 123, {"pkey": "k", "n": "5"})
    assert codec.record_message(b"s", raw, 4) == [b"", b"MESSAGE", b"TOPIC", b"s", b"pkey", b"k", b"n", b"5",
                                                  b"X-OFFSET", b"4", b"X-CONTENT-TYPE", b"application/json",
                                                  b"", b'{"a":1}']
    # a raw JSON object and a BSON document say what they are; a PUT's own X-OFFSET is not repeated
    import bson
    doc = bson.encode({"id": 1})
    frames = codec.record_message(b"s", record.encode_record([doc], record.CT_BSON), 6)
    assert frames[-4:] == [b"X-CONTENT-TYPE", b"application/bson", b"", doc]
    frames = codec.record_message(b"s", b'{"raw":true}', 5)
    assert frames[-4:] == [b"X-CONTENT-TYPE", b"application/json", b"", b'{"raw":true}']
    frames = codec.record_message(b"s", codec.put_record([(b"X-OFFSET", b"99")], [b"x"]), 8)
    assert frames.count(b"X-OFFSET") == 1 and frames[frames.index(b"X-OFFSET") + 1] == b"8"


def test_numbers_and_topics():
    assert codec.parse_ms(b"1000") == 1000
    assert codec.parse_offset(b"0") == 0
    for bad in (b"", b"-1", b"1.5", b"x", b"0"):
        with pytest.raises(ValueError):
            codec.parse_ms(bad)
    with pytest.raises(ValueError):
        codec.parse_offset(b"-3")
    assert codec.topic_name("é t".encode()) == "é t"
    for bad in (b"", b"\xff", b"x" * 256):
        with pytest.raises(ValueError):
            codec.topic_name(bad)

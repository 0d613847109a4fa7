"""REAM's delivery fast path gives exactly the bytes of the general rendering for every record."""

import json

import pytest

from riverbed.engine.core import encode_message
from riverbed.engine.record import CT_BSON, CT_JSON, decode_record, encode_record, max_depth, to_json_text
from riverbed.shells.ream_text import delivery
from riverbed.shells.ream_text.delivery import delivery_text

DEEP = ("[" * (max_depth() + 1) + "]" * (max_depth() + 1)).encode()
PAYLOADS = [
    b"{}",
    b'{"i":1,"pad":"xxxx"}',
    json.dumps({"pad": "x" * 400}).encode(),                    # a vbin32 data section
    json.dumps({"t": "caf\u00e9 \u2603"}, ensure_ascii=False).encode(),   # UTF-8, not ASCII
    b'{"a":"\xff"}',                                             # not UTF-8
    DEEP,                                                        # past the nesting limit
    b'{"a":"' + b"{" * (max_depth() + 2) + b'"}',                # many brackets, but in a string
]


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("ct", [CT_JSON, CT_BSON, "text/plain"])
def test_same_bytes_as_the_general_rendering(payload, ct):
    for raw in (encode_message((payload,), ct), encode_record(payload, ct)):
        assert delivery_text(raw) == to_json_text(decode_record(raw)).encode("utf-8")


def test_ream_records_take_the_fast_path(monkeypatch):
    raw = encode_record(PAYLOADS[2], CT_JSON)
    assert raw.startswith(delivery.HEAD)
    monkeypatch.setattr(delivery, "decode_record", None)     # the general path would fail now
    assert delivery_text(raw) == PAYLOADS[2]
    assert delivery_text(encode_record(PAYLOADS[1], CT_JSON)) == PAYLOADS[1]


def test_truncated_or_mislabelled_lengths_take_the_general_path():
    raw = encode_record(PAYLOADS[1], CT_JSON)
    for bad in (raw[:-1], raw + b"x", delivery.HEAD, delivery.HEAD + b"\xa0"):
        assert delivery_text(bad) == to_json_text(decode_record(bad)).encode("utf-8")


def test_a_memoryview_record_as_the_pure_core_gives():
    raw = encode_record(PAYLOADS[1], CT_JSON)
    assert delivery_text(memoryview(raw)) == PAYLOADS[1]
    other = encode_message((PAYLOADS[3],), CT_JSON)
    assert delivery_text(memoryview(other)) == PAYLOADS[3]

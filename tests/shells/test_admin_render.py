"""The admin CLI's output: aligned tables, one-line JSON, records rendered by content type."""

import base64
import json

import bson

from riverbed.engine.record import CT_BSON, CT_JSON, CT_OCTET, encode_record
from riverbed.shells.admin import render


def test_table_aligns_text_left_and_numbers_right_with_a_heading():
    rows = [{"name": "a", "records": 5, "x": None}, {"name": "longer", "records": 12345, "x": {"k": "v"}}]
    text = render.table(rows, [("NAME", "name"), ("RECORDS", "records"), ("X", "x")])
    assert text.splitlines() == [
        "NAME    RECORDS  X",
        "a             5  -",
        "longer    12345  k=v",
    ]


def test_table_without_rows_is_its_heading():
    assert render.table([], [("NAME", "name"), ("LAG", "lag")]) == "NAME  LAG"


def test_key_values_pads_keys():
    assert render.key_values([("name", "s"), ("records", 3)]).splitlines() == ["name     s", "records  3"]


def test_to_json_is_one_line_and_keeps_bytes_as_base64():
    text = render.to_json({"a": "é", "b": b"\x00\x01"})
    assert "\n" not in text and json.loads(text) == {"a": "é", "b": {"base64": "AAE="}}


def test_iso_ms():
    assert render.iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert render.iso_ms(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"
    assert render.iso_ms(-1) is None and render.iso_ms(None) is None


def test_json_record_renders_as_its_value():
    out = render.record_json(7, encode_record(b'{"a": [1, 2]}', CT_JSON), 1_700_000_000_000)
    assert out == {"offset": 7, "timestamp": "2023-11-14T22:13:20.000Z", "content_type": CT_JSON,
                   "kind": "json", "value": {"a": [1, 2]}}


def test_bson_record_renders_as_relaxed_extended_json():
    out = render.record_json(0, encode_record(bson.encode({"n": 1, "b": bson.Binary(b"x")}), CT_BSON))
    assert out["kind"] == "bson"
    assert out["value"] == {"n": 1, "b": {"$binary": {"base64": "eA==", "subType": "00"}}}


def test_bytes_render_as_base64_and_text_plain_as_a_string():
    out = render.record_json(1, encode_record(b"\xff\x00", CT_OCTET))
    assert out["value"] == {"base64": base64.b64encode(b"\xff\x00").decode()}
    out = render.record_json(2, encode_record("héllo".encode(), "text/plain; charset=utf-8"))
    assert out["value"] == "héllo" and out["content_type"] == "text/plain; charset=utf-8"
    # a text label on bytes that are not UTF-8 still renders them losslessly
    assert render.record_json(3, encode_record(b"\xff", "text/plain"))["value"] == {"base64": "/w=="}


def test_raw_record_without_amqp_is_sniffed():
    out = render.record_json(0, b'{"raw": true}')
    assert out["content_type"] is None and out["kind"] == "json" and out["value"] == {"raw": True}
    assert render.record_raw(b"plain bytes") == b"plain bytes"


def test_properties_are_shown_when_present():
    raw = encode_record([b"a", b"b"], CT_OCTET, creation_time=1000, app_properties={"pkey": "k1"})
    out = render.record_json(0, raw)
    assert out["creation_time"] == "1970-01-01T00:00:01.000Z"
    assert out["app_properties"] == {"pkey": "k1"}
    assert render.record_raw(raw) == b"ab"
    json.loads(render.to_json(out))

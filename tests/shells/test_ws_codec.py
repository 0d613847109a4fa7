"""Streamr v28 codec and partition routing (shells/ws_json/codec.py, partitions.py)."""

import json
import struct

import pytest

from riverbed.shells.ws_json import codec, partitions
from riverbed.shells.ws_json.codec import RequestError


def murmur3_x86_32(data, seed):
    """Reference MurmurHash3 x86 32-bit (Austin Appleby's algorithm), written from the published
    description, to check that mmh3 is this exact function with an unsigned result."""
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed & mask
    n = len(data) // 4 * 4
    for i in range(0, n, 4):
        k = struct.unpack_from("<I", data, i)[0]
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
        h = ((h << 13) | (h >> 19)) & mask
        h = (h * 5 + 0xE6546B64) & mask
    k = 0
    tail = data[n:]
    if len(tail) >= 3:
        k ^= tail[2] << 16
    if len(tail) >= 2:
        k ^= tail[1] << 8
    if tail:
        k ^= tail[0]
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h


def test_mmh3_is_murmur3_x86_32_unsigned():
    assert murmur3_x86_32(b"hello", 0) == 0x248BFA47            # the published test vector
    for key in ["", "a", "ab", "abc", "abcd", "hello", "device-42", "ключ", "🙂 emoji key", "x" * 1001]:
        data = key.encode("utf-8")
        assert partitions.pkey_hash(key) == murmur3_x86_32(data, 104729)
    assert all(partitions.pkey_hash(f"k{i}") >= 0 for i in range(200))


def test_partition_for_key_spreads_and_is_stable():
    n = 3
    seen = {partitions.partition_for_key(f"key-{i}", n) for i in range(100)}
    assert seen == {0, 1, 2}
    assert partitions.partition_for_key("abc", n) == murmur3_x86_32(b"abc", 104729) % n
    assert partitions.partition_for_key("anything", 1) == 0


def test_control_frames():
    assert codec.encode_frame(codec.TYPE_SUBSCRIBED, codec.stream_payload("s", 0)) == \
        '[0,2,"",{"stream":"s","partition":0}]'
    assert json.loads(codec.encode_frame(codec.TYPE_RESENT, codec.stream_payload("s", 1, "7"))) == \
        [0, 5, "", {"stream": "s", "partition": 1, "sub": "7"}]
    assert codec.error_frame("Unknown request type: x") == '[0,7,"","Unknown request type: x"]'


def test_msg_and_ws_frames():
    prefix = codec.msg_prefix('we"ird', 2)
    msg = codec.encode_msg(prefix, 1533924184016, 5, None, '{"a": "é"}')
    assert json.loads(msg) == [28, 'we"ird', 2, 1533924184016, 0, 5, None, 27, '{"a": "é"}']
    assert json.loads(codec.encode_msg(prefix, 1, 6, 5, "{}"))[6] == 5
    b = codec.broadcast_frame(msg)
    assert json.loads(b) == [0, 0, "", json.loads(msg)]
    assert json.loads(codec.unicast_frame(msg, "3")) == [0, 1, "3", json.loads(msg)]
    for size in (0, 125, 126, 65535, 65536, 70000):
        text = "a" * size
        f = codec.ws_text_frame(text)
        assert f[0] == 0x81
        if size < 126:
            assert f[1] == size and f[2:] == text.encode()
        elif size < 65536:
            assert f[1] == 126 and struct.unpack(">H", f[2:4])[0] == size and len(f) == 4 + size
        else:
            assert f[1] == 127 and struct.unpack(">Q", f[2:10])[0] == size and len(f) == 10 + size


@pytest.mark.parametrize("text", ["not json", "[1,2]", "3", '"s"', "{", b"\xff\xfe"])
def test_parse_request_refuses_non_objects(text):
    with pytest.raises(RequestError) as e:
        codec.parse_request(text)
    assert e.value.payload == codec.ERR_NOT_A_REQUEST


def test_parse_request_type():
    assert codec.parse_request('{"type":"publish"}') == {"type": "publish"}
    with pytest.raises(RequestError, match="Unknown request type: undefined"):
        codec.parse_request("{}")
    with pytest.raises(RequestError, match="Unknown request type: 5"):
        codec.parse_request('{"type": 5}')


def test_check_publish():
    assert codec.check_publish({"stream": "s", "msg": '{"a":1}'}) == ("s", '{"a":1}', None, None)
    assert codec.check_publish({"stream": "s", "msg": "[]", "ts": 5, "pkey": "k"}) == ("s", "[]", 5, "k")
    assert codec.check_publish({"stream": "s", "msg": "{}", "pkey": 7})[3] == "7"
    for bad, text in [({"msg": "{}"}, codec.ERR_MISSING_STREAM),
                      ({"stream": "", "msg": "{}"}, codec.ERR_MISSING_STREAM),
                      ({"stream": 5, "msg": "{}"}, codec.ERR_MISSING_STREAM),
                      ({"stream": "s", "msg": {"a": 1}}, codec.ERR_NOT_JSON_MSG),
                      ({"stream": "s"}, codec.ERR_NOT_JSON_MSG),
                      ({"stream": "s", "msg": "{nope"}, codec.ERR_NOT_JSON_MSG)]:
        with pytest.raises(RequestError) as e:
            codec.check_publish(bad)
        assert e.value.payload == text
    with pytest.raises(RequestError, match="ts"):
        codec.check_publish({"stream": "s", "msg": "{}", "ts": "yesterday"})
    with pytest.raises(RequestError, match="pkey"):
        codec.check_publish({"stream": "s", "msg": "{}", "pkey": {"k": 1}})


def test_resend_variants():
    v = codec.resend_variant
    assert v({"resend_all": True}) == (codec.RESEND_ALL, None, None)
    assert v({"resend_last": 5}) == (codec.RESEND_LAST, 5, None)
    assert v({"resend_last": 10 ** 9}) == (codec.RESEND_LAST, 100_000, None)
    assert v({"resend_from": 3}) == (codec.RESEND_RANGE, 3, None)
    assert v({"resend_from": 3, "resend_to": 9}) == (codec.RESEND_RANGE, 3, 9)
    assert v({"resend_from_time": 1500}) == (codec.RESEND_FROM_TIME, 1500, None)
    for bad in [{}, {"resend_all": False}, {"resend_all": 1}, {"resend_last": 0}, {"resend_last": "5"},
                {"resend_to": 5}, {"resend_from": -1}, {"resend_from": "a"}, {"resend_all": True, "resend_last": 1},
                {"resend_from_time": "x"}, {"resend_from": 1, "resend_from_time": 5}]:
        assert v(bad) is None, bad


def test_request_partition():
    assert codec.request_partition({}) == 0
    assert codec.request_partition({"partition": 2}) == 2
    for bad in (-1, "1", 1.5, True):
        with pytest.raises(RequestError):
            codec.request_partition({"partition": bad})

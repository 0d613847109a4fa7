"""The forwarding frames (shells/cluster/forward_wire.py): each encoder's frame decodes back to what was
encoded, and any malformed payload (truncated, mutated, random) is a WireError, never another exception."""

import random
import struct

import pytest

from riverbed.engine import core
from riverbed.engine.layout import PublishingIds
from riverbed.shells.cluster import forward_wire as fw
from riverbed.shells.cluster.wire import WireError
from wirecheck import mutations, payload_of


def samples():
    data = core.encode_entries([b"a", b"bc", b"def"])
    raw = struct.pack(">3Q", 7, 8, 9)
    return [
        fw.encode_hello("n2"),
        b"".join(fw.encode_append(1, "orders", None, None, None, 3, 3, data)),
        b"".join(fw.encode_append(2, "orders", "pub-1", PublishingIds(raw, 7, 9, True), None, 3, 3, data)),
        b"".join(fw.encode_append(3, "s", "p", [1, 5, 2], [b"eu", None, b""], 3, 3, memoryview(data))),
        fw.encode_offset(4, "orders", "reader-1", 42),
        fw.encode_sequence(7, "orders", "pub-1"),
        fw.encode_result(5, fw.CODE_OK, 10, 12, [3, 4], ""),
        fw.encode_result(6, fw.CODE_NOT_CONFIRMED, message="no majority"),
    ]


def test_round_trip():
    data = core.encode_entries([b"a", b"bc", b"def"])
    kind, p = payload_of(b"".join(fw.encode_append(9, "orders", "pub", [1, 5, 2], [b"eu", None, b""], 3, 3, data)))
    assert kind == fw.FWD_APPEND
    rid, stream, pub, ids, filters, ne, nr, body = fw.decode_frame(kind, p)
    assert (rid, stream, pub, ids, filters, ne, nr, bytes(body)) == (9, "orders", "pub", [1, 5, 2],
                                                                     [b"eu", None, b""], 3, 3, data)
    kind, p = payload_of(fw.encode_offset(4, "orders", "reader-1", 42))
    assert fw.decode_frame(kind, p) == (4, "orders", "reader-1", 42)
    kind, p = payload_of(fw.encode_result(5, fw.CODE_OK, 10, 12, [3, 4], "x"))
    assert fw.decode_frame(kind, p) == (5, fw.CODE_OK, 10, 12, [3, 4], "x")
    assert fw.decode_frame(*payload_of(fw.encode_hello("n2"))) == "n2"
    assert fw.decode_frame(*payload_of(fw.encode_sequence(7, "orders", "pub-1"))) == (7, "orders", "pub-1")
    kind, p = payload_of(fw.encode_result(8, fw.CODE_OK, fw.i64_of(2 ** 64 - 2), -1))
    assert fw.u64_of(fw.decode_frame(kind, p)[2]) == 2 ** 64 - 2


@pytest.mark.parametrize("payload,kind", [
    (b"", fw.FWD_APPEND), (b"\x00" * 9 + b"\xff\xff", fw.FWD_APPEND), (b"\x00" * 8 + b"\x04", fw.FWD_APPEND),
    (b"\x00" * 8 + b"\x01" + b"\x00\x01s" + b"\x00\x00" + struct.pack(">II", 1, 1) + b"\xff\xff\xff\xff",
     fw.FWD_APPEND),                                            # 4 billion ids announced, none there
    (b"\x00" * 8 + b"\x00" + b"\x00\x01s" + b"\x00\x00" + struct.pack(">II", 0, 0), fw.FWD_APPEND),  # empty
    (b"\x00" * 8 + b"\x00\x02\xff\xfe", fw.FWD_OFFSET),          # a name that is not UTF-8
    (b"\x00" * 8 + b"\x00\x01s\x00\x00", fw.FWD_SEQUENCE),        # no publisher
    (b"\x00" * 8 + b"\x00\x07" + b"\x00" * 20, fw.FWD_RESULT),     # an unknown code
    (b"\x00" * 26 + b"\x00\x00\x00\x09", fw.FWD_RESULT), (b"[1]", fw.FWD_HELLO), (b"\xff", fw.FWD_HELLO), (b"", 99),
])
def test_malformed_payloads_are_wire_errors(payload, kind):
    with pytest.raises(WireError):
        fw.decode_frame(kind, payload)


def test_mutated_frames_decode_or_raise_wire_error():
    rng = random.Random(23)
    for frame_bytes in samples():
        kind, p = payload_of(frame_bytes)
        for mutant in mutations(p, rng):
            try:
                fw.decode_frame(kind, mutant)
            except WireError:
                pass

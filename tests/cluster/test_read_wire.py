"""The reader's frames (shells/cluster/read_wire.py, and HELLO's ``observer`` flag in wire.py): each
encodes and decodes back, and a malformed payload (truncated, mutated, random) is a WireError, never
another exception."""

import random
import struct

import pytest

from riverbed.shells.cluster import read_wire as rw
from riverbed.shells.cluster import wire
from riverbed.shells.cluster.wire import LEN_FRAME_HEADER, WireError
from wirecheck import payload_of


def test_committed_round_trip():
    kind, p = payload_of(rw.encode_committed(2 ** 64 - 1, "örders"))
    assert kind == rw.READ_COMMITTED
    assert rw.decode_committed(p) == (2 ** 64 - 1, "örders")


@pytest.mark.parametrize("payload", [b"", b"\x00" * 9, b"\x00" * 10, struct.pack(">QH", 1, 3) + b"ab",
                                     struct.pack(">QH", 1, 2) + b"abc", struct.pack(">QH", 1, 2) + b"\xff\xfe"])
def test_committed_malformed(payload):
    with pytest.raises(WireError):
        rw.decode_committed(payload)


def test_committed_fuzz():
    rnd = random.Random(25)
    good = payload_of(rw.encode_committed(7, "orders"))[1]
    for _ in range(3000):
        b = bytearray(good[:rnd.randrange(len(good) + 1)] if rnd.random() < 0.3 else good)
        for _ in range(rnd.randrange(4)):
            if b:
                b[rnd.randrange(len(b))] = rnd.randrange(256)
        try:
            rid, stream = rw.decode_committed(bytes(b))
        except WireError:
            continue
        assert isinstance(rid, int) and isinstance(stream, str) and stream


def test_hello_observer_flag():
    base = {"node": "n3", "stream": "s", "epoch": 1, "next": 0, "last": None}
    assert wire.decode_hello(wire.json_frame(wire.HELLO, base)[LEN_FRAME_HEADER:])["observer"] is False
    got = wire.decode_hello(wire.json_frame(wire.HELLO, dict(base, observer=True))[LEN_FRAME_HEADER:])
    assert got["observer"] is True
    for bad in (1, "yes", None, [True]):
        with pytest.raises(WireError):
            wire.decode_hello(wire.json_frame(wire.HELLO, dict(base, observer=bad))[LEN_FRAME_HEADER:])


def test_frame_types_do_not_meet_the_other_wire_modules():
    import importlib
    import pkgutil

    import riverbed.shells.cluster as pkg
    others = set()
    for m in pkgutil.iter_modules(pkg.__path__):
        if m.name.endswith("wire") and m.name != "read_wire":
            others |= set(getattr(importlib.import_module(f"riverbed.shells.cluster.{m.name}"), "DECODERS", {}))
    assert others and not set(rw.DECODERS) & others

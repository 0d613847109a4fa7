"""The single-active-consumer frames (shells/cluster/sac_wire.py): each encoder's frame decodes back to
what was encoded, and any malformed payload (truncated, mutated, random) is a WireError, never another
exception."""

import random
import struct

import pytest

from riverbed.shells.cluster import sac_wire as sw
from riverbed.shells.cluster.wire import WireError
from wirecheck import mutations, payload_of


def test_round_trip():
    cases = [
        (sw.encode_hello("n2"), "n2"),
        (sw.encode_register(7, 0, -1, 0, "orders", "billing"), (7, 0, -1, 0, "orders", "billing")),
        (sw.encode_register(2 ** 64 - 1, 5, 2, 2, "inv-2", "app"), (2 ** 64 - 1, 5, 2, 2, "inv-2", "app")),
        (sw.encode_unregister(7, "orders", "billing"), (7, "orders", "billing")),
        (sw.encode_stepped_down(8, "ü", "g"), (8, "ü", "g")),
        (sw.encode_registered(7, 4), (7, 4, sw.CODE_OK)),
        (sw.encode_registered(9, 0, sw.CODE_NOT_LEADER), (9, 0, sw.CODE_NOT_LEADER)),
        (sw.encode_activate(3), 3),
        (sw.encode_step_down(4), 4),
    ]
    for frame_bytes, want in cases:
        assert sw.decode_frame(*payload_of(frame_bytes)) == want
    assert sorted(payload_of(f)[0] for f in sw.sample_frames()) == sorted(
        [sw.SAC_HELLO, sw.SAC_REGISTER, sw.SAC_REGISTER, sw.SAC_UNREGISTER, sw.SAC_STEPPED_DOWN,
         sw.SAC_REGISTERED, sw.SAC_REGISTERED, sw.SAC_ACTIVATE, sw.SAC_STEP_DOWN])
    with pytest.raises(ValueError):
        sw.encode_register(1, 0, -1, 0, "s" * 70000, "g")


REGISTER_HEAD = struct.Struct(">QQiB")


@pytest.mark.parametrize("payload,kind", [
    (b"", sw.SAC_REGISTER),
    (REGISTER_HEAD.pack(1, 0, -2, 0) + b"\x00\x01s\x00\x01g", sw.SAC_REGISTER),       # index below -1
    (REGISTER_HEAD.pack(1, 0, 1 << 30, 0) + b"\x00\x01s\x00\x01g", sw.SAC_REGISTER),  # absurd index
    (REGISTER_HEAD.pack(1, 0, -1, 3) + b"\x00\x01s\x00\x01g", sw.SAC_REGISTER),       # unknown state
    (REGISTER_HEAD.pack(1, 0, -1, 0) + b"\x00\x00\x00\x01g", sw.SAC_REGISTER),        # no stream
    (REGISTER_HEAD.pack(1, 0, -1, 0) + b"\x00\x01s\x00\x05g", sw.SAC_REGISTER),       # name cut short
    (REGISTER_HEAD.pack(1, 0, -1, 0) + b"\x00\x01s\x00\x01gX", sw.SAC_REGISTER),      # trailing byte
    (b"\x00" * 8 + b"\x00\x02\xff\xfe\x00\x01g", sw.SAC_UNREGISTER),                 # not UTF-8
    (b"\x00" * 8 + b"\x00\x01s\x00\x00", sw.SAC_STEPPED_DOWN),                         # no group name
    (b"\x00" * 16 + b"\x02", sw.SAC_REGISTERED),                                        # unknown code
    (b"\x00" * 17 + b"\x00", sw.SAC_REGISTERED),
    (b"\x00" * 7, sw.SAC_ACTIVATE), (b"\x00" * 9, sw.SAC_STEP_DOWN),
    (b"[1]", sw.SAC_HELLO), (b'{"node":""}', sw.SAC_HELLO), (b"\xff", sw.SAC_HELLO), (b"[" * 5000, sw.SAC_HELLO),
    (b"", 99),
])
def test_malformed_payloads_are_wire_errors(payload, kind):
    with pytest.raises(WireError):
        sw.decode_frame(kind, payload)


def test_mutated_frames_decode_or_raise_wire_error():
    rng = random.Random(25)
    for frame_bytes in sw.sample_frames():
        kind, p = payload_of(frame_bytes)
        for mutant in mutations(p, rng):
            try:
                sw.decode_frame(kind, mutant)
            except WireError:
                pass


def test_frame_types_are_apart_from_the_other_wire_modules():
    from riverbed.shells.cluster import forward_wire, wire
    assert not set(sw.DECODERS) & set(forward_wire.DECODERS)
    assert min(sw.DECODERS) > max(forward_wire.DECODERS) and min(sw.DECODERS) > wire.OFFSETS

"""The protocols' frame splitters (``riverbed.shells.wire``): RabbitMQ Stream (u32 BE size excluding
itself) and BSON/TCP (i32 LE size including itself).

Every test takes the ``wire_twin`` fixture and so runs against both implementations (compiled ``_wire``,
pure ``_pywire``), except the differential tests, which feed the same input to both and compare.
"""

import os
import struct
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.engine import _pycore, core
from riverbed.engine.errors import FrameError, FrameTooLarge
from riverbed.shells import _pywire, wire

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import twins  # noqa: E402

# The wire_twin fixture is function-scoped but stateless (it returns a module), so sharing it across the
# examples of one hypothesis test is safe.
PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])
needs_compiled = pytest.mark.skipif(wire.NO_EXTENSIONS, reason="RIVERBED_NO_EXTENSIONS=1")

PUBLIC = ["split_frames", "split_bson_frames", "publish_chunk", "bson_pub", "kafka_stored", "kafka_batch",
          "kafka_chunk_batch", "kafka_chunk_batch_at", "kafka_reserve"]


def test_wire_twin_fixture_yields_the_named_implementation(wire_twin):
    assert wire_twin.COMPILED is (wire_twin is not _pywire)
    for name in PUBLIC:
        assert callable(getattr(wire_twin, name)), name


def test_the_selector_hands_out_the_picked_twin():
    if wire.NO_EXTENSIONS:
        assert wire.impl is _pywire and wire.COMPILED is False
    else:
        from riverbed.shells import _wire
        assert wire.impl is _wire and wire.COMPILED is True
    for name in PUBLIC:
        assert getattr(wire, name) is getattr(wire.impl, name), name


def test_the_protocol_parsers_left_the_engine():
    # the engine's core keeps chunks, CRC, index, record format and the document store; nothing of the
    # protocols' frames is left in either of its twins
    for impl in (core, core.impl, _pycore):
        for name in PUBLIC:
            assert not hasattr(impl, name), (impl, name)


def _both(name, *args):
    from riverbed.shells import _wire
    return twins.both(_wire, _pywire, name, *args)


@needs_compiled
def test_both_twins_have_the_same_public_names():
    from riverbed.shells import _wire
    twins.check_public_names(_wire, _pywire, PUBLIC)


def _feed(split, stream, cuts, max_size):
    """Deliver ``stream`` in pieces cut at ``cuts`` the way a socket reader would."""
    frames, buf, points = [], b"", sorted(set(cuts)) + [len(stream)]
    start = 0
    for stop in points:
        buf += stream[start:stop]
        start = stop
        got, consumed = split(buf, max_size)
        assert consumed == sum(len(f) for f in got) + (4 * len(got) if split.__name__ == "split_frames" else 0)
        frames.extend(got)
        buf = buf[consumed:]
    return frames, buf


@PROPERTY
@given(payloads=st.lists(st.binary(max_size=300), max_size=20), data=st.data())
def test_split_frames_cut_anywhere_gives_back_the_frames(wire_twin, payloads, data):
    stream = b"".join(struct.pack(">I", len(p)) + p for p in payloads)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    frames, rest = _feed(wire_twin.split_frames, stream, cuts, 300)
    assert frames == payloads and rest == b""
    assert wire_twin.split_frames(stream, 300) == (payloads, len(stream))
    assert wire_twin.split_frames(stream + b"\x00\x00", 300) == (payloads, len(stream))


def test_split_frames_gives_frames_of_the_view_key_as_views_of_the_buffer(wire_twin):
    #           size        key   ver   body
    publish = b"\x00\x00\x00\x06" b"\x00\x02" b"\x00\x01" b"ab"
    other = b"\x00\x00\x00\x05" b"\x00\x17" b"\x00\x01" b"c"
    short = b"\x00\x00\x00\x01" b"\x00"             # under 2 bytes: no key, always a copy
    buf = bytearray(publish + other + short + publish[:5])
    frames, used = wire_twin.split_frames(buf, 100, 0x0002)
    assert used == len(buf) - 5
    assert [type(f) for f in frames] == [memoryview, bytes, bytes]
    assert [bytes(f) for f in frames] == [publish[4:], other[4:], short[4:]]
    assert frames[0].obj is buf                       # no copy
    frames, _ = wire_twin.split_frames(buf, 100)
    assert [type(f) for f in frames] == [bytes, bytes, bytes]


@PROPERTY
@given(bodies=st.lists(st.binary(min_size=1, max_size=300), max_size=20), data=st.data())
def test_split_bson_frames_cut_anywhere_gives_back_the_documents(wire_twin, bodies, data):
    docs = [struct.pack("<i", 4 + len(b)) + b for b in bodies]
    stream = b"".join(docs)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    frames, rest = _feed(wire_twin.split_bson_frames, stream, cuts, 304)
    assert frames == docs and rest == b""
    assert wire_twin.split_bson_frames(bytearray(stream), 304) == (docs, len(stream))


@needs_compiled
@PROPERTY
@given(blob=st.binary(max_size=400), max_size=st.one_of(st.integers(-5, 500), st.just(2**40)))
def test_twins_agree_on_frame_splitting(blob, max_size):
    _both("split_frames", blob, max_size)
    _both("split_bson_frames", blob, max_size)


def test_oversized_frame_is_refused_on_its_prefix_alone(wire_twin):
    with pytest.raises(FrameTooLarge) as err:
        wire_twin.split_frames(struct.pack(">I", 2_000_000), 1_048_576)
    assert err.value.size == 2_000_000
    ok = struct.pack(">I", 3) + b"abc"
    with pytest.raises(FrameTooLarge):
        wire_twin.split_frames(ok + struct.pack(">I", 0xFFFFFFFF), 1_048_576)
    assert wire_twin.split_frames(ok + struct.pack(">I", 1_048_576), 1_048_576) == ([b"abc"], 7)
    assert wire_twin.split_frames(ok + b"\x00\x10", 1_048_576) == ([b"abc"], 7)
    assert wire_twin.split_frames(b"", 10) == ([], 0)


def test_bson_length_3_is_frame_error(wire_twin):
    for n in (3, 0, -1, -2**31):
        with pytest.raises(FrameError) as err:
            wire_twin.split_bson_frames(struct.pack("<i", n), 1024)
        assert not isinstance(err.value, FrameTooLarge) and err.value.size == n
    with pytest.raises(FrameTooLarge) as err:
        wire_twin.split_bson_frames(struct.pack("<i", 2048), 1024)
    assert err.value.size == 2048
    doc = struct.pack("<i", 5) + b"\x00"
    assert wire_twin.split_bson_frames(doc + doc[:3], 1024) == ([doc], 5)

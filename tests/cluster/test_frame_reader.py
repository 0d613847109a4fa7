"""wire.FrameReader (shells/cluster/wire.py): the replication port's frames read straight into buffers, a
large payload (a member's chunk) into a bytearray of its own that goes to the engine as it was read.
The frames must be split_frames' for the same bytes whatever the reads, and a large payload must be the
very buffer the reads filled (no copy after the socket's)."""

import pytest

from riverbed.shells.cluster import wire

BIG = 4 << 10


def stream_bytes():
    frames = [
        (wire.SEQS, b'{"p":1}'),
        (wire.CHUNK, bytes(range(256)) * 40),          # 10 KiB: its own buffer
        (wire.COMMIT, (7).to_bytes(8, "big")),
        (wire.CHUNK, b"x" * (BIG - 1)),                # just under: from the scratch buffer
        (wire.CHUNK, b"y" * BIG),                      # just at: its own buffer
        (wire.OFFSETS, b'{"c":3}'),
        (wire.CHUNK, b"z" * 70_000),                   # larger than the scratch buffer
    ]
    return frames, b"".join(wire.frame(k, p) for k, p in frames)


def read_in(reader, data, cut):
    """Feed ``data`` to ``reader`` as reads of at most ``cut`` bytes (each filling what get_buffer gave)."""
    got, pos = [], 0
    while pos < len(data):
        buf = reader.get_buffer()
        assert len(buf) > 0
        n = min(len(buf), cut, len(data) - pos)
        buf[:n] = data[pos:pos + n]
        pos += n
        got += reader.feed(n)
    return got


@pytest.mark.parametrize("cut", [1, 5, 6, 4095, 4101, 65536, 1 << 20])
def test_the_frames_are_split_frames_whatever_the_reads(cut):
    frames, data = stream_bytes()
    got = read_in(wire.FrameReader(), data, cut)
    assert [(k, bytes(p)) for k, p in got] == frames == wire.split_frames(data)[0]
    for (k, p) in got:
        assert type(p) is (bytearray if len(p) >= BIG else bytes)


def test_a_large_payload_is_the_buffer_the_reads_filled():
    reader = wire.FrameReader()
    payload = b"c" * 100_000
    data = wire.frame(wire.CHUNK, payload)
    first = reader.get_buffer()
    first[:1000] = data[:1000]
    assert reader.feed(1000) == []
    rest = reader.get_buffer()
    assert len(rest) == len(payload) - (1000 - wire.LEN_FRAME_HEADER)
    target = rest.obj            # the bytearray the rest is read into
    rest[:] = data[1000:]
    ((kind, got),) = reader.feed(len(data) - 1000)
    assert kind == wire.CHUNK and got is target and got == payload


@pytest.mark.parametrize("length", [0, wire.MAX_FRAME + 1])
def test_a_bad_length_is_a_wire_error(length):
    reader = wire.FrameReader()
    data = wire.frame(wire.COMMIT, (1).to_bytes(8, "big")) + length.to_bytes(4, "big") + b"\x02"
    buf = reader.get_buffer()
    buf[:len(data)] = data
    with pytest.raises(wire.WireError):
        reader.feed(len(data))

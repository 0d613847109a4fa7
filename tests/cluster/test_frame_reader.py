"""wire.FrameReader (shells/cluster/wire.py): the replication port's frames read straight into buffers, a
large payload (a member's chunk) into a receive buffer of its own that goes to the engine as it was read
and, released once stored, is read into again. The frames must be split_frames' for the same bytes
whatever the reads, a large payload must be the very buffer the reads filled (no copy after the
socket's), and a released buffer is reused without ever changing a payload not yet released."""

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
        assert type(p) is (memoryview if len(p) >= BIG else bytes)


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
    assert kind == wire.CHUNK and got.obj is target and got == payload


@pytest.mark.parametrize("length", [0, wire.MAX_FRAME + 1])
def test_a_bad_length_is_a_wire_error(length):
    reader = wire.FrameReader()
    data = wire.frame(wire.COMMIT, (1).to_bytes(8, "big")) + length.to_bytes(4, "big") + b"\x02"
    buf = reader.get_buffer()
    buf[:len(data)] = data
    with pytest.raises(wire.WireError):
        reader.feed(len(data))


def test_a_released_buffer_is_read_into_again_and_a_held_one_never():
    reader = wire.FrameReader(pool=wire.SlabPool())
    sizes = [300_000, 200_000, 250_000, 300_000, 10_000]

    def chunks(which):
        return b"".join(wire.frame(wire.CHUNK, bytes([i]) * sizes[i]) for i in which)
    got = read_in(reader, chunks(range(5)), 65536)
    assert [bytes(p) for _, p in got] == [bytes([i]) * n for i, n in enumerate(sizes)]
    slabs = [p.obj for _, p in got]
    assert len({id(s) for s in slabs}) == len(sizes)       # none released yet: five buffers
    held = got[1][1]
    for _, p in got[:1] + got[2:]:
        reader.release(p)
    with pytest.raises(ValueError):
        bytes(got[0][1])            # a released payload cannot be read by mistake
    again = read_in(reader, chunks([0, 2, 3, 4, 1]), 65536)
    reused = {id(s) for s in slabs} - {id(held.obj)}
    assert {id(p.obj) for _, p in again[:4]} == reused      # no new buffer for these: the released ones
    assert again[4][1].obj is not held.obj                  # the held one is not read into
    assert held == bytes([1]) * 200_000                     # and never changed
    assert [bytes(p) for _, p in again] == [bytes([i]) * sizes[i] for i in (0, 2, 3, 4, 1)]


def test_only_payloads_it_gave_are_reused_and_a_payload_over_grow_is_never():
    pool = wire.SlabPool()
    reader = wire.FrameReader(grow=64 << 10, pool=pool)
    data = wire.frame(wire.CHUNK, b"g" * 200_000)
    ((_, big),) = read_in(reader, data, 1 << 20)
    assert type(big) is bytearray and big == b"g" * 200_000     # grew as it arrived: no slab
    reader.release(big)
    reader.release(b"x" * 10_000)
    assert pool.spare == {} and pool.spare_bytes == 0


def test_the_readers_of_a_thread_share_one_pool_that_keeps_a_bounded_number_of_bytes():
    assert wire.FrameReader().pool is wire.FrameReader().pool is wire.thread_pool()
    pool = wire.SlabPool(keep=1 << 20)
    readers = [wire.FrameReader(pool=pool) for _ in range(6)]
    data = wire.frame(wire.CHUNK, b"k" * 300_000)            # a 512 KiB slab each
    payloads = [read_in(r, data, 1 << 20)[0][1] for r in readers]
    slabs = {id(p.obj) for p in payloads}
    for r, p in zip(readers, payloads):
        r.release(p)
    assert pool.spare_bytes == 1 << 20 and len(pool.spare[512 << 10]) == 2      # the rest dropped
    again = read_in(readers[0], data, 1 << 20)[0][1]        # another connection's released slab
    assert id(again.obj) in slabs and again == b"k" * 300_000


def test_lone_ack_reads_exactly_one_whole_ack_frame_and_nothing_else():
    """wire.lone_ack, the leader's shortcut for the usual read from a member (leader_path.AckReader): the
    offset of a read that is one whole ACK frame; None for anything split_frames must read instead (a
    partial frame, two frames, another type, a wrong length), so that the shortcut never reads what
    split_frames would not."""
    ack = wire.u64_frame(wire.ACK, 123_456_789_012)
    assert wire.lone_ack(ack) == 123_456_789_012
    assert wire.lone_ack(bytearray(ack)) == 123_456_789_012
    assert wire.lone_ack(ack[:-1]) is None
    assert wire.lone_ack(ack + ack) is None
    assert wire.lone_ack(ack + b"\0") is None
    assert wire.lone_ack(wire.u64_frame(wire.COMMIT, 5)) is None
    assert wire.lone_ack(b"\0\0\0\x0a" + ack[4:] + b"\0") is None     # a 9-byte ACK payload: not this shape
    assert wire.lone_ack(b"") is None

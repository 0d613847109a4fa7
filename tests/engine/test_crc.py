"""The chunks' data CRC (zlib's CRC-32) through ISA-L (engine/datacrc.py, crc.pxi): the same values as zlib
on every path that computes one, in both twins, and the fast code actually in use."""

import os
import random
import struct
import zlib

import pytest

from riverbed.engine import core, datacrc
from riverbed.engine.format import H_CRC, LEN_CHUNK_HEADER
from riverbed.shells import wire

# around the fast path's threshold, zlib's GIL release threshold (64 KiB), and a chunk of 1 MiB
SIZES = (0, 1, 47, datacrc.FAST_MIN - 1, datacrc.FAST_MIN, datacrc.FAST_MIN + 1, 4093, 65535, 65536, 65537,
         (1 << 20) + 3)


def _bytes(n, seed):
    return random.Random(seed).randbytes(n)


def test_fast_crc_in_use():
    # python-isal is a dependency: an install where it is missing, or a compiled module built without the
    # fast path, must fail here rather than pass at zlib's speed
    assert datacrc.IMPL == "isa-l"
    if not core.NO_EXTENSIONS:
        from riverbed.engine import _core
        from riverbed.shells import _wire
        assert _core.CRC32_IMPL == "isa-l"
        assert _wire.CRC32_IMPL == "isa-l"


@pytest.mark.parametrize("n", SIZES)
def test_crc32_is_zlibs(twin, n):
    data = _bytes(n, n)
    assert twin.crc32(data) == zlib.crc32(data)
    for start in (1, 0xFFFFFFFF, 0x1234567890, -5):
        assert twin.crc32(data, start) == zlib.crc32(data, start)
    for kind in (bytearray, memoryview):
        assert twin.crc32(kind(data)) == zlib.crc32(data)
    # continued over two pieces, as a chunk's data is when checked piece by piece
    cut = n // 3
    assert twin.crc32(data[cut:], twin.crc32(data[:cut])) == zlib.crc32(data)


def test_datacrc_is_zlibs():
    for n in SIZES:
        data = _bytes(n, n + 1)
        assert datacrc.crc32(data) == zlib.crc32(data)
        assert datacrc.crc32(memoryview(data)[3:], 77) == zlib.crc32(data[3:], 77)


@pytest.mark.parametrize("n", (1, 10, 100, 700, 5000))
def test_every_chunk_encoder_writes_zlibs_crc(twin, n):
    records = [_bytes(100 + i % 7, i) for i in range(n)]
    data = twin.encode_entries(records)
    chunks = [twin.encode_chunk(records, 5, 6) if n <= 0xFFFF else None,
              twin.encode_chunk_buffer(records),
              twin.build_chunk(data, n, n, 6, 5),
              twin.build_chunk(data, n, n, 6, 5, bloom=b"\1" * 16, trailer=b"t")]
    for chunk in chunks:
        h = twin.read_header(chunk)
        assert h[H_CRC] == zlib.crc32(data)
        assert twin.check_chunk(chunk) == h
    broken = bytearray(chunks[0])
    broken[LEN_CHUNK_HEADER + len(data) // 2] ^= 1
    with pytest.raises(Exception, match="CRC"):
        twin.check_chunk(bytes(broken))


@pytest.mark.parametrize("n", (3, 2000))
def test_publish_chunk_writes_zlibs_crc(wire_twin, n):
    # a RabbitMQ Stream Publish v1 (key, version, publisher id, count, then id + simple entry each)
    msgs = [_bytes(100, i) for i in range(n)]
    frame = struct.pack(">HHBi", 2, 1, 7, n) + b"".join(struct.pack(">QI", i, len(m)) + m
                                                         for i, m in enumerate(msgs))
    chunk = wire_twin.publish_chunk(frame)[2]
    data = bytes(chunk[LEN_CHUNK_HEADER:])
    assert struct.unpack_from(">I", chunk, 32)[0] == zlib.crc32(data)
    assert wire.publish_chunk(frame, False)[2][32:36] == b"\0\0\0\0"


@pytest.mark.skipif(os.environ.get("RIVERBED_NO_EXTENSIONS") == "1", reason="compiled twin only")
def test_compiled_and_pure_agree_on_random_buffers():
    from riverbed.engine import _core, _pycore
    rnd = random.Random(7)
    for _ in range(200):
        n = rnd.choice((rnd.randrange(0, 2048), rnd.randrange(0, 200_000)))
        data = rnd.randbytes(n)
        start = rnd.randrange(0, 1 << 32)
        assert _core.crc32(data, start) == _pycore.crc32(data, start) == zlib.crc32(data, start)

"""Pure-Python twin of the shells' compiled wire module (``_wire.pyx``): the protocols' frame parsers.
Same names, same results, same errors.

The RabbitMQ Stream frame splitter and its Publish v1 -> sealed chunk pass, the BSON document splitter
and (re-exported from :mod:`riverbed.shells._pybsonpub`) the mewbase PUB recogniser. This twin is the
readable reference and the fallback when ``RIVERBED_NO_EXTENSIONS=1``; the shells pick an implementation
in :mod:`riverbed.shells.wire`. The chunk layout the Publish path writes is the engine's
(:mod:`riverbed.engine.format`). All functions are pure (no shared state) and thread-safe.
"""

import struct
import zlib

from riverbed.engine.errors import FrameError, FrameTooLarge
from riverbed.engine.format import CHUNK_MAGIC_VERSION, CHUNK_USER, HEADER_STRUCT
from riverbed.shells._pybsonpub import bson_pub  # noqa: F401  (bsonpub.pxi is its compiled twin)

COMPILED = False

_U32 = struct.Struct(">I")
_I32LE = struct.Struct("<i")


def split_frames(buf, max_size, view_key=None):
    """Split RabbitMQ Stream frames: ``uint32 BE size (excluding itself) | payload``.

    Returns ``(frames, consumed)``: the complete payloads as ``bytes`` and how many bytes of ``buf`` they
    used; an incomplete tail is left for the next call. A declared size over ``max_size`` raises
    FrameTooLarge before any of that frame is buffered. Payloads whose 16-bit key is ``view_key`` come
    as memoryviews of ``buf`` instead of copies (big Publish frames): the caller must then not change
    ``buf`` while it uses them.
    """
    mv = memoryview(buf)
    end = len(mv)
    pos = 0
    frames = []
    while end - pos >= 4:
        n = _U32.unpack_from(mv, pos)[0]
        if n > max_size:
            raise FrameTooLarge(f"frame of {n} bytes is over the {max_size}-byte limit", n)
        if end - pos - 4 < n:
            break
        frame = mv[pos + 4:pos + 4 + n]
        if view_key is None or n < 2 or ((frame[0] << 8) | frame[1]) != view_key:
            frame = bytes(frame)
        frames.append(frame)
        pos += 4 + n
    return frames, pos


def split_bson_frames(buf, max_size):
    """Split BSON documents: ``int32 LE size (including itself) | ...``. Same contract as split_frames;
    ``frames`` hold whole documents (length prefix included)."""
    mv = memoryview(buf)
    end = len(mv)
    pos = 0
    frames = []
    while end - pos >= 4:
        n = _I32LE.unpack_from(mv, pos)[0]
        if n < 5:
            raise FrameError(f"BSON document length {n} is below the 5-byte minimum", n)
        if n > max_size:
            raise FrameTooLarge(f"BSON document of {n} bytes is over the {max_size}-byte limit", n)
        if end - pos < n:
            break
        frames.append(bytes(mv[pos:pos + n]))
        pos += n
    return frames, pos


# ---- RabbitMQ Stream Publish v1 -> sealed chunk (the broker's hot path) --------------------------------

_PUB_HEAD = struct.Struct(">Bi")       # publisher id, count (after key and version)
_PUB_MSG = struct.Struct(">QI")        # publishing id, then the entry's first 4 bytes
_PUB_SUB = struct.Struct(">BHII")      # sub-batch header after the publishing id


def publish_chunk(payload, crc=True):
    """Turn a RabbitMQ Stream Publish v1 payload (key and version included) into a sealed chunk.

    With ``crc=False`` the header's data CRC is left 0 for the caller to fill in (the engine does it when
    it stores the chunk whole, and skips it when the chunk must be cut into several: no CRC computed twice).

    Returns ``(publisher_id, count, chunk, ids, first_id, last_id, increasing, num_records, sub_batches)``:

    * ``chunk``: a ``bytearray`` laid out as a whole user chunk, as the engine's
      :func:`~riverbed.engine.core.encode_chunk_buffer` makes it: the 48-byte header (magic, NumEntries =
      count, NumRecords, data CRC and length; chunk id, timestamp and epoch 0 for the writer to stamp)
      followed by the data section, each message's entry without its publishing id. With more than 65535 messages NumEntries and NumRecords are left 0 (a u16 cannot
      hold the count): the data section is still right, the header is not a sealable one.
    * ``ids``: the publishing ids as ``bytes``, 8 big-endian bytes each (a PublishConfirm body as is);
      ``first_id`` and ``last_id`` (0 when there are none) and ``increasing``, whether they strictly rise.
    * ``num_records``: records in the entries (a sub-batch counts its declared NumRecords).
    * ``sub_batches``: ``(message index, flags, records, uncompressed size, body start, body end)`` per
      sub-batch entry, positions in ``payload``, for the caller to validate.

    Raises FrameError when the payload does not parse (too short, a count that cannot fit, a message
    running past the end, bytes left over).
    """
    mv = memoryview(payload).cast("B")
    end = len(mv)
    if end < 9:
        raise FrameError("Publish frame too short")
    publisher_id, count = _PUB_HEAD.unpack_from(mv, 4)
    if count < 0 or count * 12 > end - 9:
        raise FrameError(f"Publish message count {count} does not fit the frame")
    data_len = end - 9 - 8 * count
    if data_len > 0xFFFFFFFF:
        raise FrameError(f"Publish frame of {end} bytes is over the 4 GiB chunk data limit")
    ids = []
    parts = []
    subs = []
    records = 0
    pos = 9
    for i in range(count):
        if end - pos < 12:
            raise FrameError("Publish frame ends inside a message")
        pid, n = _PUB_MSG.unpack_from(mv, pos)
        ids.append(pid)
        if n < 0x80000000:
            e = pos + 12 + n
            records += 1
        else:
            if end - pos < 19:
                raise FrameError("Publish frame ends inside a message")
            flags, nrec, usize, size = _PUB_SUB.unpack_from(mv, pos + 8)
            e = pos + 19 + size
            records += nrec
            subs.append((i, flags, nrec, usize, pos + 19, e))
        if e > end:
            raise FrameError("Publish frame ends inside a message")
        parts.append(mv[pos + 8:e])
        pos = e
    if pos != end:
        raise FrameError(f"{end - pos} bytes left over after {count} messages")
    data = b"".join(parts)
    sealable = count <= 0xFFFF
    header = HEADER_STRUCT.pack(CHUNK_MAGIC_VERSION, CHUNK_USER, count if sealable else 0,
                                records if sealable else 0, 0, 0, 0, zlib.crc32(data) if crc else 0, len(data),
                                0, 0)
    increasing = all(ids[k] < ids[k + 1] for k in range(len(ids) - 1))
    return (publisher_id, count, bytearray(header + data), struct.pack(f">{count}Q", *ids),
            ids[0] if ids else 0, ids[-1] if ids else 0, increasing, records, subs)

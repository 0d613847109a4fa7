"""Pure-Python twin of the shells' compiled wire module (``_wire.pyx``): the protocols' frame parsers.
Same names, same results, same errors.

The RabbitMQ Stream frame splitter and its Publish v1 -> sealed chunk pass, the BSON document splitter
and (re-exported from :mod:`riverbed.shells._pybsonpub`) the mewbase PUB recogniser. This twin is the
readable reference and the fallback when ``RIVERBED_NO_EXTENSIONS=1``; the shells pick an implementation
in :mod:`riverbed.shells.wire`. The chunk layout the Publish path writes is the engine's
(:mod:`riverbed.engine.format`). All functions are pure (no shared state) and thread-safe.
"""

import struct

import crc32c as _crc32c

from riverbed.engine import core as _core
from riverbed.engine.datacrc import crc32 as _data_crc32
from riverbed.engine.errors import FrameError, FrameTooLarge
from riverbed.engine.format import CHUNK_MAGIC_VERSION, CHUNK_USER, HEADER_STRUCT
from riverbed.shells._pybsonpub import bson_pub  # noqa: F401  (bsonpub.pxi is its compiled twin)
from riverbed.shells._pyream import ream_publish_run  # noqa: F401  (ream.pxi is its compiled twin)

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
                                records if sealable else 0, 0, 0, 0, _data_crc32(data) if crc else 0, len(data),
                                0, 0)
    increasing = all(ids[k] < ids[k + 1] for k in range(len(ids) - 1))
    return (publisher_id, count, bytearray(header + data), struct.pack(f">{count}Q", *ids),
            ids[0] if ids else 0, ids[-1] if ids else 0, increasing, records, subs)


_ALONE_HEAD = struct.Struct(">IHHBi")    # size, key, version, publisher id, count: a Publish frame's head
_CONFIRM_HEAD = struct.Struct(">IHHBi")  # size, key, version, publisher id, id count: a PublishConfirm's
KEY_PUBLISH = 0x0002
KEY_PUBLISH_CONFIRM = 0x0003


def publish_alone(data, max_size, max_entries):
    """The one-message path's parser (issue 26): ``data``, one read from a connection, taken whole when it
    is exactly one RabbitMQ Stream Publish v1 frame (its u32 size first) of at most ``max_size`` bytes
    after the size, with 1..``max_entries`` messages, all plain (no sub-batch entry), that parses.

    Returns ``publish_chunk(payload, crc=False)``'s first eight values with, in the place of the
    sub-batches, ``confirm``: the PublishConfirm frame of every id (size prefix included), the bytes the
    general path's merged confirm of this frame alone would be. Anything else gives None, a malformed
    frame included: the general path then splits, checks and refuses it as usual.
    """
    mv = memoryview(data).cast("B")
    n = len(mv)
    if n < 13:
        return None
    size, key, version, _, count = _ALONE_HEAD.unpack_from(mv, 0)
    if size != n - 4 or size > max_size or key != KEY_PUBLISH or version != 1 or not 1 <= count <= max_entries:
        return None
    try:
        got = publish_chunk(mv[4:], crc=False)
    except FrameError:
        return None
    if got[8]:
        return None
    ids = got[3]
    confirm = _CONFIRM_HEAD.pack(9 + len(ids), KEY_PUBLISH_CONFIRM, 1, got[0], count) + ids
    return got[:8] + (confirm,)


# ---- Kafka record batches v2 <-> the one record format (kafka.pxi is the compiled twin) --------------
#
# The Kafka shell's two byte loops. Produce: the records of one record batch v2 (its records section,
# decompressed) become stored records, appended as simple entries (u32 BE length | record) to the data
# section of the chunk being built; the stored form is ``to_stored``'s (records.py: an AMQP 1.0 bare
# message, key as the annotation x-key, headers as application properties, value as the data section,
# timestamp as creation-time). Fetch: the stored records of one chunk become one record batch v2, each
# read as ``from_stored`` reads it. Both take those two functions as arguments (the record mapping is
# the Kafka shell's; this module only walks bytes), and so does the compiled twin, which calls them for
# whatever its fast path does not take.

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_KAFKA_BATCH = struct.Struct(">qiibIhiqqqhii")   # base offset .. record count: the 61-byte batch header
LEN_KAFKA_BATCH_HEADER = 61
LEN_KAFKA_BATCH_OVERHEAD = 12         # base offset and length: what the batch length does not count
LEN_KAFKA_CRC_START = 21              # CRC-32C covers the batch from its attributes on
_KAFKA_MAGIC = 2
_KAFKA_NULL = b"\x01"                 # zigzag -1: a null key or value


def _kafka_zz(buf, pos, end):
    """A zigzag varint at ``pos`` of ``buf`` (not past ``end``): (value, next position)."""
    if pos >= end:
        raise FrameError("truncated varint")
    b = buf[pos]
    if b < 0x80:                     # the common case: one byte
        return (b >> 1) ^ -(b & 1), pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end or shift > 63:
            raise FrameError("bad varint")
        b = buf[pos]
        result |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def kafka_records(buf, count, base_ts):
    """The first ``count`` records of a record batch v2's records section ``buf`` (bytes), whose
    timestamps are deltas from ``base_ts``: ``([(timestamp ms, key, value, headers)], bytes used)``; key
    and value bytes or None, headers a list of (str, bytes or None). Raises FrameError for records that
    do not parse (a varint, length, key, value or header past its record, a header name that is not
    UTF-8, a record whose fields do not fill its length)."""
    out = []
    pos = 0
    n = len(buf)
    zz = _kafka_zz
    for _ in range(count):
        length, pos = zz(buf, pos, n)
        end = pos + length
        if length < 1 or end > n:
            raise FrameError("record length out of range")
        pos += 1                                  # attributes: unused
        ts, pos = zz(buf, pos, end)
        _, pos = zz(buf, pos, end)                # offset delta: records are contiguous here
        klen, pos = zz(buf, pos, end)
        if klen >= 0:
            if pos + klen > end:
                raise FrameError("key past the record")
            key = buf[pos:pos + klen]
            pos += klen
        else:
            key = None
        vlen, pos = zz(buf, pos, end)
        if vlen >= 0:
            if pos + vlen > end:
                raise FrameError("value past the record")
            value = buf[pos:pos + vlen]
            pos += vlen
        else:
            value = None
        nh, pos = zz(buf, pos, end)
        headers = []
        for _ in range(nh):
            hk, pos = zz(buf, pos, end)
            if hk < 0 or pos + hk > end:
                raise FrameError("bad header key")
            try:
                name = buf[pos:pos + hk].decode("utf-8")
            except UnicodeDecodeError:
                raise FrameError("header key is not UTF-8") from None
            pos += hk
            hv, pos = zz(buf, pos, end)
            if hv >= 0:
                if pos + hv > end:
                    raise FrameError("header value past the record")
                headers.append((name, buf[pos:pos + hv]))
                pos += hv
            else:
                headers.append((name, None))
        if pos != end:
            raise FrameError("record length mismatch")
        out.append((base_ts + ts, key, value, headers))
    return out, pos


def kafka_stored(body, count, base_ts, out, to_stored):
    """Produce: the first ``count`` records of a batch's records section ``body`` (bytes-like,
    decompressed; timestamps are deltas from ``base_ts``), each stored as ``to_stored(key, value,
    headers, timestamp)`` makes it, appended to bytearray ``out`` as simple entries (u32 BE length,
    then the record). Returns the bytes of ``body`` used. Raises FrameError as :func:`kafka_records`,
    and for a timestamp outside int64 (what creation-time holds); ``out`` then holds an unknown part of
    the records (the caller drops it)."""
    records, used = kafka_records(bytes(body), count, base_ts)
    pack = _U32.pack
    for ts, key, value, headers in records:
        if not _INT64_MIN <= ts <= _INT64_MAX:
            raise FrameError("record timestamp outside int64")
        rec = to_stored(key, value, headers, ts)
        out += pack(len(rec))
        out += rec
    return used


def _kafka_uvarint(n):
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _kafka_varint(n):
    return _kafka_uvarint((n << 1) ^ (n >> 63))


_KAFKA_SMALL = [_kafka_varint(n) for n in range(8192)]      # zigzag varints of 0..8191, made once


def _kafka_vi(n):
    return _KAFKA_SMALL[n] if 0 <= n < 8192 else _kafka_varint(n)


def kafka_record(offset_delta, ts_delta, key, value, headers):
    """One record of a batch v2, its length prefix included: attributes 0, the deltas, ``key`` and
    ``value`` (bytes or None), ``headers`` ((str, bytes or None) each). The timestamp delta wraps to
    int64 as Kafka's (Java's) long arithmetic does, so a reader adding it to the base gets the time back."""
    vi = _kafka_vi
    if not _INT64_MIN <= ts_delta <= _INT64_MAX:
        ts_delta = ((ts_delta - _INT64_MIN) & 0xFFFFFFFFFFFFFFFF) + _INT64_MIN
    parts = [b"\x00", vi(ts_delta), vi(offset_delta)]
    if key is None:
        parts.append(_KAFKA_NULL)
    else:
        parts.append(vi(len(key)))
        parts.append(key)
    if value is None:
        parts.append(_KAFKA_NULL)
    else:
        parts.append(vi(len(value)))
        parts.append(value)
    parts.append(vi(len(headers)))
    for name, val in headers:
        nb = name.encode("utf-8")
        parts.append(vi(len(nb)))
        parts.append(nb)
        if val is None:
            parts.append(_KAFKA_NULL)
        else:
            parts.append(vi(len(val)))
            parts.append(val)
    body = b"".join(parts)
    return vi(len(body)) + body


def kafka_batch_header(base_offset, body_len, count, base_ts, max_ts, attributes=0, producer_id=-1,
                       producer_epoch=-1, base_sequence=-1):
    """The 61-byte header of a record batch v2 of ``count`` records whose records section is
    ``body_len`` bytes, CRC 0 (:func:`kafka_seal` sets it). A bytearray."""
    return bytearray(_KAFKA_BATCH.pack(base_offset, LEN_KAFKA_BATCH_HEADER - LEN_KAFKA_BATCH_OVERHEAD + body_len,
                                       -1, _KAFKA_MAGIC, 0, attributes, count - 1, base_ts, max_ts, producer_id,
                                       producer_epoch, base_sequence, count))


def kafka_seal(batch):
    """Set the CRC-32C of a whole record batch v2 (a bytearray) in place and return it."""
    _U32.pack_into(batch, 17, _crc32c.crc32c(memoryview(batch)[LEN_KAFKA_CRC_START:]))
    return batch


def kafka_chunk_batch(chunk, skip, base_offset, chunk_ts, out, from_stored):
    """Fetch: the records of one stored user chunk ``chunk`` (bytes-like, as ``read_chunks`` gives it)
    from its ``skip``-th on, appended to bytearray ``out`` as the one record batch v2 :func:`kafka_batch`
    makes of them (from ``base_offset``; ``chunk_ts`` the chunk's timestamp). Returns the bytes
    appended: 0 when the chunk has no record from ``skip`` on. Raises ChunkError (``out`` as it was) for
    a data section ``chunk_records`` refuses."""
    batch = kafka_batch(_core.chunk_records(chunk, False), skip, base_offset, chunk_ts, from_stored)
    if batch is None:
        return 0
    out += batch
    return len(batch)


def kafka_chunk_batch_at(chunk, skip, base_offset, chunk_ts, out, at, from_stored):
    """Fetch, into a buffer filled chunk after chunk: :func:`kafka_chunk_batch`'s batch written at
    ``out[at:]`` (0 <= ``at`` <= ``len(out)``), over whatever is there, and its end returned (``at`` when
    the chunk has no record from ``skip`` on). ``out[:at]`` is kept; ``out`` may end up longer than the
    returned end (room for the next chunks: :func:`kafka_reserve`): the caller trims it when done. Raises
    ChunkError as kafka_chunk_batch; ``out[at:]`` is then unspecified."""
    if not 0 <= at <= len(out):
        raise ValueError("at outside the buffer")
    batch = kafka_batch(_core.chunk_records(chunk, False), skip, base_offset, chunk_ts, from_stored)
    if batch is None:
        return at
    out[at:at + len(batch)] = batch
    return at + len(batch)


def kafka_reserve(out, at, chunks):
    """Room in ``out`` past ``at`` for the batches of ``chunks`` (``(chunk_id, stored chunk)`` pairs, as
    ``read_chunk_views`` gives them) before :func:`kafka_chunk_batch_at` writes them. Only a size hint:
    the compiled twin grows ``out`` once, here the writes grow it as they go, so this does nothing."""
    if not 0 <= at <= len(out):
        raise ValueError("at outside the buffer")


def kafka_sequence_ids(seqs):
    """An idempotent producer's sequences, ``(base sequence, records)`` per batch (ints >= 0), as the
    engine's publishing ids: each batch's ``base .. base + records - 1`` as big-endian u64s, in order
    (bytes). Raises OverflowError past int64."""
    parts = []
    for base, n in seqs:
        if n < 0:
            raise ValueError("negative record count")
        if base < 0:
            raise ValueError("negative sequence")
        if n and base + n - 1 > _INT64_MAX:
            raise OverflowError("sequence past int64")
        parts.append(struct.pack(f">{n}Q", *range(base, base + n)))
    return b"".join(parts)


def kafka_batch(raws, skip, base_offset, chunk_ts, from_stored):
    """Fetch: the stored records ``raws[skip:]`` (bytes each: one chunk's, as the broker reads them) as
    one record batch v2 from ``base_offset``, each record read as ``from_stored(raw, chunk_ts)`` gives
    it (timestamp ms, key, value, headers): a ``bytearray``, CRC-32C set, no compression, attributes 0,
    no producer; or None when there is no record from ``skip`` on."""
    recs = [from_stored(r, chunk_ts) for r in (raws[skip:] if skip else raws)]
    if not recs:
        return None
    base_ts = recs[0][0]
    body = b"".join([kafka_record(i, ts - base_ts, k, v, h) for i, (ts, k, v, h) in enumerate(recs)])
    out = kafka_batch_header(base_offset, len(body), len(recs), base_ts, max(r[0] for r in recs))
    out += body
    return kafka_seal(out)

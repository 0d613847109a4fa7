"""Pure-Python twin of the compiled core (``_core.pyx``). Same names, same results, same errors.

The byte layouts are documented in :mod:`riverbed.engine.format`. This twin is the readable reference
and the fallback when ``RIVERBED_NO_EXTENSIONS=1``; the engine picks an implementation in
:mod:`riverbed.engine.core`. All functions are pure (no shared state) and thread-safe.
"""

import struct
import zlib

from riverbed.engine.datacrc import crc32 as _data_crc32
from riverbed.engine.errors import ChunkError
from riverbed.engine.format import (
    BLOOM_SEED_1, BLOOM_SEED_2, CHUNK_MAGIC_VERSION, CHUNK_USER, COMPRESSION_NONE, HEADER_STRUCT,
    LEN_CHUNK_HEADER, LEN_SIMPLE_HEADER, LEN_SUB_BATCH_HEADER, MAX_ENTRY_SIZE, decompress,
)
# The record codec (AMQP 1.0 bare messages) is its own module, re-exported so that core.impl has it
# whichever twin is in use.
from riverbed.engine._pyrecord import (  # noqa: F401
    BODY_DATA, BODY_SEQUENCE, BODY_VALUE, BODY_VALUE_BINARY, BODY_VALUE_STRING, KIND_BSON, KIND_BYTES, KIND_JSON,
    decode_message, encode_message, payload_kind,
)
# The document store's raw-BSON matcher is its own module too (docs.pxi is its compiled twin).
from riverbed.engine._pydocs import DocMatcher, bson_index_keys, bson_values  # noqa: F401
# JSON payloads of a batch joined for one Arrow parse (jsonlines.pxi is its compiled twin).
from riverbed.engine._pyjsonlines import json_lines  # noqa: F401

COMPILED = False

_U32 = struct.Struct(">I")
_SUB = struct.Struct(">BHII")


def crc32(data, value=0):
    """zlib crc32 of ``data`` (any buffer), continuing from ``value`` (computed by
    :mod:`riverbed.engine.datacrc`: ISA-L's when python-isal is installed)."""
    return _data_crc32(data, value)


def receive_buffer(size):
    """A ``bytearray`` of ``size`` bytes for a socket read to fill (the compiled twin leaves it
    uninitialised; here it is zeroed). Raises ValueError for a negative size."""
    if size < 0:
        raise ValueError("negative size")
    return bytearray(size)


def encode_entries(records):
    """Data section of simple entries, one per record (a sequence of bytes-like objects)."""
    parts = []
    for r in records:
        n = memoryview(r).nbytes
        if n > MAX_ENTRY_SIZE:
            raise ValueError(f"record of {n} bytes is over the 2 GiB entry limit")
        parts.append(_U32.pack(n))
        parts.append(r)
    return b"".join(parts)


def encode_sub_batch(records, compression=COMPRESSION_NONE, compress=None):
    """One sub-batch entry holding ``records``. ``compress`` turns the simple-entry run into the body
    for a compression code other than none."""
    if not 0 <= compression <= 7:
        raise ValueError(f"compression code {compression} out of range 0..7")
    inner = encode_entries(records)
    body = inner if compression == COMPRESSION_NONE else compress(inner)
    if len(records) > 0xFFFF:
        raise ValueError("a sub-batch holds at most 65535 records")
    return _SUB.pack(0x80 | (compression << 4), len(records), len(inner), len(body)) + body


def build_chunk(data, num_entries, num_records, timestamp, chunk_id, epoch=0, chunk_type=CHUNK_USER,
                bloom=b"", trailer=b""):
    """Header + bloom + data + trailer as one ``bytes``; computes the data CRC."""
    header = HEADER_STRUCT.pack(CHUNK_MAGIC_VERSION, chunk_type, num_entries, num_records, timestamp, epoch,
                                chunk_id, _data_crc32(data), len(data), len(trailer), len(bloom))
    return b"".join((header, bloom, data, trailer))


def encode_chunk(records, chunk_id, timestamp, epoch=0):
    """A user chunk of simple entries, one per record."""
    return build_chunk(encode_entries(records), len(records), len(records), timestamp, chunk_id, epoch)


def encode_chunk_buffer(records):
    """A user chunk of ``records`` (at most 65535) as a ``bytearray``, CRC computed, chunk id and timestamp
    0: the writer stamps those two in place (seal_chunk), so the record bytes are copied only once."""
    if len(records) > 0xFFFF:
        raise ValueError("a chunk holds at most 65535 entries")
    return bytearray(encode_chunk(records, 0, 0))


_STAMP = struct.Struct(">qQQ")             # header bytes 8..32: timestamp, epoch, chunk id
STAMP_RANGE = "a chunk's chunk id, timestamp or epoch is outside its field's range"


def stamp_chunk(chunk, chunk_id, timestamp, epoch, crc):
    """Ready a sealed chunk for storing at ``chunk_id``, in place (the one-message commit's byte work).

    ``chunk`` is a ``bytearray`` of a 48-byte header and the data after it (no bloom, no trailer: a
    Publish frame's chunk, wire.publish_chunk). With ``crc`` true its data CRC (of every byte after the
    header) is computed into the header first; then ``timestamp`` (ms, i64), ``epoch`` and ``chunk_id``
    (u64) are stamped. Returns None. Raises TypeError when ``chunk`` is not a bytearray, struct.error for
    a value outside its field's range, ChunkError when ``chunk`` is shorter than the header (nothing is
    changed then)."""
    if type(chunk) is not bytearray:
        raise TypeError(f"a chunk to stamp must be a bytearray, not {type(chunk).__name__}")
    try:
        stamp = _STAMP.pack(timestamp, epoch, chunk_id)
    except struct.error:
        raise struct.error(STAMP_RANGE) from None
    if len(chunk) < LEN_CHUNK_HEADER:
        raise ChunkError(f"{len(chunk)} bytes is shorter than the 48-byte chunk header")
    if crc:
        _U32.pack_into(chunk, 32, _data_crc32(memoryview(chunk)[LEN_CHUNK_HEADER:]))
    chunk[8:32] = stamp


def read_header(buf):
    """Parse the 48-byte header into an 11-tuple (see format.H_*). Checks magic and size only."""
    if len(buf) < LEN_CHUNK_HEADER:
        raise ChunkError(f"{len(buf)} bytes is shorter than the 48-byte chunk header")
    h = HEADER_STRUCT.unpack_from(buf, 0)
    if h[0] != CHUNK_MAGIC_VERSION:
        raise ChunkError(f"bad magic/version byte 0x{h[0]:02x} (expected 0x50)")
    return h


def check_chunk(buf):
    """Header tuple of a complete chunk after checking lengths and the data CRC. Raises ChunkError."""
    h = read_header(buf)
    bloom, data_len, trailer_len = h[10], h[8], h[9]
    if bloom and bloom < 16:
        raise ChunkError(f"bloom size {bloom} is neither 0 nor 16..255")
    if LEN_CHUNK_HEADER + bloom + data_len + trailer_len != len(buf):
        raise ChunkError(f"lengths (bloom {bloom}, data {data_len}, trailer {trailer_len}) do not add up "
                         f"to the stored {len(buf)} bytes")
    start = LEN_CHUNK_HEADER + bloom
    crc = _data_crc32(memoryview(buf)[start:start + data_len])
    if crc != h[7]:
        raise ChunkError(f"data CRC 0x{crc:08x} does not match header CRC 0x{h[7]:08x}")
    return h


def scan_entries(data):
    """Walk a data section without decoding bodies: ``(ends, counts)``, the end offset of each entry in
    ``data`` and the number of records it holds (1 for a simple entry, NumRecords for a sub-batch).
    Raises ChunkError when an entry overruns the section."""
    mv = memoryview(data)
    end = len(mv)
    ends = []
    counts = []
    pos = 0
    while pos < end:
        if mv[pos] & 0x80 == 0:
            if pos + LEN_SIMPLE_HEADER > end:
                raise ChunkError("truncated simple entry header")
            pos += LEN_SIMPLE_HEADER + _U32.unpack_from(mv, pos)[0]
            counts.append(1)
        else:
            if pos + LEN_SUB_BATCH_HEADER > end:
                raise ChunkError("truncated sub-batch entry header")
            _, count, _, size = _SUB.unpack_from(mv, pos)
            pos += LEN_SUB_BATCH_HEADER + size
            counts.append(count)
        if pos > end:
            raise ChunkError("entry overruns the data section")
        ends.append(pos)
    return ends, counts


def walk_simple_entries(data, pos, max_count):
    """Count the simple entries of ``data`` from ``pos`` without copying or allocating per entry, for a
    sub-batch body validated piece by piece as it is decompressed. Stops after ``max_count`` entries.

    Returns ``(count, pos)``: ``pos`` is where the walk stopped, past the end of ``data`` when the last
    entry's body runs on (the caller skips that much of the next piece), or within the last 3 bytes when
    an entry header is cut by the end of ``data``. Raises ChunkError on a sub-batch entry (a sub-batch
    holds simple entries only). ``max_count`` < 0 raises ValueError."""
    if max_count < 0 or pos < 0:
        raise ValueError("max_count and pos must be >= 0")
    mv = memoryview(data)
    end = len(mv)
    count = 0
    unpack = _U32.unpack_from
    while count < max_count and pos + LEN_SIMPLE_HEADER <= end:
        if mv[pos] & 0x80:
            raise ChunkError("a sub-batch entry inside a sub-batch")
        pos += LEN_SIMPLE_HEADER + unpack(mv, pos)[0]
        count += 1
    if count < max_count and pos < end and mv[pos] & 0x80:
        raise ChunkError("a sub-batch entry inside a sub-batch")
    return count, pos


def cut_entries(data, max_bytes, max_entries, max_records):
    """Where to cut a data section into chunks: a list of ``(end, entries, records)``, one per piece, each
    piece ending at ``end`` (an offset in ``data``) and holding at most ``max_bytes`` bytes, ``max_entries``
    entries and ``max_records`` records, except that an entry over a limit by itself is a piece of its
    own. Raises ChunkError when an entry overruns the section."""
    ends, counts = scan_entries(data)
    cuts = []
    start = entries = records = 0
    pos = 0
    for nxt, count in zip(ends, counts):
        if entries and (nxt - start > max_bytes or entries + 1 > max_entries or records + count > max_records):
            cuts.append((pos, entries, records))
            start, entries, records = pos, 0, 0
        entries += 1
        records += count
        pos = nxt
    if entries:
        cuts.append((pos, entries, records))
    return cuts


def data_records(data, num_entries, num_records):
    """All records of a data section as a list of ``bytes``; sub-batches are decompressed and expanded.

    Raises ChunkError when the entries overrun the section or the counts disagree with the header, and
    UnsupportedCompression for a codec that is not registered.
    """
    mv = memoryview(data)
    end = len(mv)
    out = []
    pos = 0
    for _ in range(num_entries):
        if pos + 1 > end:
            raise ChunkError("data section ends before the last entry")
        first = mv[pos]
        if first & 0x80 == 0:
            if pos + LEN_SIMPLE_HEADER > end:
                raise ChunkError("truncated simple entry header")
            n = _U32.unpack_from(mv, pos)[0]
            pos += LEN_SIMPLE_HEADER
            if pos + n > end:
                raise ChunkError("simple entry overruns the data section")
            out.append(bytes(mv[pos:pos + n]))
            pos += n
        else:
            if pos + LEN_SUB_BATCH_HEADER > end:
                raise ChunkError("truncated sub-batch entry header")
            flags, count, usize, size = _SUB.unpack_from(mv, pos)
            pos += LEN_SUB_BATCH_HEADER
            if pos + size > end:
                raise ChunkError("sub-batch entry overruns the data section")
            body = decompress((flags >> 4) & 0x7, mv[pos:pos + size], usize)
            pos += size
            inner = data_records(body, count, count)
            out.extend(inner)
    if pos != end:
        raise ChunkError(f"{end - pos} bytes left after {num_entries} entries")
    if len(out) != num_records:
        raise ChunkError(f"entries hold {len(out)} records, header says {num_records}")
    return out


def chunk_records(buf, verify=True):
    """Records of a whole stored chunk, checking the CRC first unless ``verify`` is false."""
    h = check_chunk(buf) if verify else read_header(buf)
    start = LEN_CHUNK_HEADER + h[10]
    return data_records(memoryview(buf)[start:start + h[8]], h[2], h[3])


def _bloom_bits(value, nbits):
    m = nbits - 1
    return zlib.crc32(value, BLOOM_SEED_1) % m + 1, zlib.crc32(value, BLOOM_SEED_2) % m + 1


def build_bloom(values, has_unfiltered, size):
    """Bloom filter bytes for the filter values of one chunk (``size`` bytes, 16..255), or b"" when there
    are no values."""
    if not values:
        return b""
    bloom = bytearray(size)
    nbits = size * 8
    if has_unfiltered:
        bloom[0] |= 0x80
    for v in values:
        for bit in _bloom_bits(v, nbits):
            bloom[bit >> 3] |= 0x80 >> (bit & 7)
    return bytes(bloom)


def bloom_match(bloom, values, match_unfiltered):
    """Whether a chunk with this bloom may hold a record a subscriber with ``values`` wants.

    An empty bloom means the chunk has no filter values at all: it matches only ``match_unfiltered``
    subscribers (a subscriber with no values at all never calls this).
    """
    if not bloom:
        return match_unfiltered
    if match_unfiltered and bloom[0] & 0x80:
        return True
    nbits = len(bloom) * 8
    for v in values:
        b1, b2 = _bloom_bits(v, nbits)
        if bloom[b1 >> 3] & (0x80 >> (b1 & 7)) and bloom[b2 >> 3] & (0x80 >> (b2 & 7)):
            return True
    return False



def chunk_bloom_match(chunk, values, match_unfiltered):
    """Whether the stored ``chunk`` (header, bloom, data) is a user chunk that may hold a record a
    subscriber with filter ``values`` wants: :func:`bloom_match` on its bloom filter; False for a chunk of
    the log's own (offset tracking). Raises ChunkError for a bad header or a bloom past the end."""
    h = read_header(chunk)
    size = h[10]
    if LEN_CHUNK_HEADER + size > len(chunk):
        raise ChunkError(f"bloom of {size} bytes runs past the {len(chunk)}-byte chunk")
    if h[1] != CHUNK_USER:
        return False
    if size == 0:
        return match_unfiltered
    return bloom_match(memoryview(chunk)[LEN_CHUNK_HEADER:LEN_CHUNK_HEADER + size], values, match_unfiltered)

# ---- Arrow column buffers (riverbed.spark) ------------------------------------------------------------

_I64LE = struct.Struct("<q")
_I32LE_OUT = struct.Struct("<i")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_ARROW_BINARY_MAX = 0x7FFFFFFF       # an Arrow ``binary`` array addresses its data with int32 offsets


def new_arrow_buffers():
    """Empty buffers for :func:`chunk_to_arrow`: ``(offsets, timestamps, chunk_ids, value_offsets, data)``,
    all ``bytearray``, value_offsets holding the leading int32 0 an Arrow binary array starts with."""
    return bytearray(), bytearray(), bytearray(), bytearray(4), bytearray()


def _check_arrow_out(out):
    if len(out) != 5 or not all(type(b) is bytearray for b in out):
        raise ValueError("out must be the 5 bytearrays of new_arrow_buffers() or a previous chunk_to_arrow call")
    offsets, timestamps, chunk_ids, value_offsets, data = out
    n = len(offsets)
    if (n % 8 or len(timestamps) != n or len(chunk_ids) != n or len(value_offsets) != (n // 8 + 1) * 4
            or _I32LE_OUT.unpack_from(value_offsets, len(value_offsets) - 4)[0] != len(data)):
        raise ValueError("out buffers disagree on the record count or the data length")


def chunk_to_arrow(chunk, first_offset=0, end_offset=None, out=None, verify=True, wire=False):
    """Append the records of one chunk to the buffers of five Arrow columns, in one pass over its entries.

    ``chunk`` is a whole chunk as stored (48-byte header, bloom, data) or, with ``wire``, as a RabbitMQ
    Stream Deliver frame carries it (header then data: the bloom is left out although the header still
    gives its size). Only records whose offset (chunk id + position) is in ``[first_offset, end_offset)``
    are appended (``end_offset`` None: no end). ``verify`` checks the lengths and the data CRC first.

    ``out`` is None (fresh buffers) or the five bytearrays of :func:`new_arrow_buffers` or of a previous
    call, extended in place, so several chunks make one batch. Returns ``(offsets, timestamps, chunk_ids,
    value_offsets, data, appended)``: per record an int64 offset, int64 timestamp in microseconds since the
    epoch (the chunk's, as Arrow ``timestamp("us")``), int64 chunk id; ``value_offsets`` int32, one more than
    the records, and ``data`` the bodies back to back (an Arrow ``binary`` array). All little-endian, ready
    for ``pyarrow.Array.from_buffers`` without a copy. ``appended`` counts the records this call added.

    Sub-batches are expanded (compressed ones through :func:`riverbed.engine.format.decompress`); a
    sub-batch wholly outside the range is skipped without being decompressed. Raises ChunkError (bad
    header or CRC, entries overrunning the section, record counts disagreeing with a header),
    UnsupportedCompression, OverflowError (data past 2**31-1 bytes: start a new batch, or a timestamp that
    does not fit in microseconds) and ValueError (``out`` not such buffers). On an error the buffers are
    left as they were. Pure; thread-safe as long as no other thread uses the same ``out``.
    """
    if out is None:
        out = new_arrow_buffers()
    else:
        _check_arrow_out(out)
    offsets, timestamps, chunk_ids, value_offsets, data = out
    lengths = [len(b) for b in out]
    try:
        appended = _arrow_chunk(chunk, first_offset, end_offset, out, verify, wire)
    except BaseException:
        for b, n in zip(out, lengths):
            del b[n:]
        raise
    return offsets, timestamps, chunk_ids, value_offsets, data, appended


def _arrow_chunk(chunk, first_offset, end_offset, out, verify, wire):
    mv = memoryview(chunk).cast("B")
    if wire:
        h = read_header(mv)
        start = LEN_CHUNK_HEADER
        if verify:
            if LEN_CHUNK_HEADER + h[8] != len(mv):
                raise ChunkError(f"data length {h[8]} does not add up to the delivered {len(mv)} bytes")
            crc = _data_crc32(mv[start:start + h[8]])
            if crc != h[7]:
                raise ChunkError(f"data CRC 0x{crc:08x} does not match header CRC 0x{h[7]:08x}")
    else:
        h = check_chunk(mv) if verify else read_header(mv)
        start = LEN_CHUNK_HEADER + h[10]
    ts_us = h[4] * 1000
    if not _INT64_MIN <= ts_us <= _INT64_MAX:
        raise OverflowError(f"chunk timestamp {h[4]} ms does not fit in int64 microseconds")
    chunk_id = h[6]
    if chunk_id > _INT64_MAX:
        raise OverflowError(f"chunk id {chunk_id} does not fit in int64")
    state = [chunk_id, max(first_offset, 0), _INT64_MAX if end_offset is None else end_offset,
             _I64LE.pack(ts_us), _I64LE.pack(chunk_id), out, 0]
    records = _arrow_entries(mv[start:start + h[8]], h[2], state)
    if records != h[3]:
        raise ChunkError(f"entries hold {records} records, header says {h[3]}")
    return state[6]


def _arrow_entries(mv, num_entries, state):
    """Walk ``num_entries`` entries; append those in range. Returns the records the entries hold."""
    end = len(mv)
    pos = 0
    records = 0
    offsets, timestamps, chunk_ids, value_offsets, data = state[5]
    for _ in range(num_entries):
        if pos + 1 > end:
            raise ChunkError("data section ends before the last entry")
        if mv[pos] & 0x80 == 0:
            if pos + LEN_SIMPLE_HEADER > end:
                raise ChunkError("truncated simple entry header")
            n = _U32.unpack_from(mv, pos)[0]
            pos += LEN_SIMPLE_HEADER
            if pos + n > end:
                raise ChunkError("simple entry overruns the data section")
            offset = state[0]
            if state[1] <= offset < state[2]:
                if len(data) + n > _ARROW_BINARY_MAX:
                    raise OverflowError("Arrow binary data would pass 2**31-1 bytes; start a new batch")
                offsets += _I64LE.pack(offset)
                timestamps += state[3]
                chunk_ids += state[4]
                data += mv[pos:pos + n]
                value_offsets += _I32LE_OUT.pack(len(data))
                state[6] += 1
            state[0] = offset + 1
            records += 1
            pos += n
        else:
            if pos + LEN_SUB_BATCH_HEADER > end:
                raise ChunkError("truncated sub-batch entry header")
            flags, count, usize, size = _SUB.unpack_from(mv, pos)
            pos += LEN_SUB_BATCH_HEADER
            if pos + size > end:
                raise ChunkError("sub-batch entry overruns the data section")
            if state[0] + count > state[1] and state[0] < state[2]:
                body = decompress((flags >> 4) & 0x7, mv[pos:pos + size], usize)
                inner = _arrow_entries(memoryview(body), count, state)
                if inner != count:
                    raise ChunkError(f"entries hold {inner} records, header says {count}")
            else:
                state[0] += count
            records += count
            pos += size
    if pos != end:
        raise ChunkError(f"{end - pos} bytes left after {num_entries} entries")
    return records

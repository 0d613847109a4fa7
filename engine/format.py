"""Byte layouts of the Osiris chunk, the single source of truth for both core twins.

This module owns the chunk format. ``_core.pyx`` (compiled) and ``_pycore.py`` (pure Python) implement the
byte loops over it; the constants below are the contract both twins and all shells share.

Chunk (osiris ``osiris_log.erl``), big-endian throughout::

     0      1      2             4                    8
    +------+------+-------------+--------------------+
    | 0x50 | type | NumEntries  | NumRecords         |      0x50 = magic 5 << 4 | chunk version 0
    |      |      | uint16      | uint32             |      type: 0 user, 1 tracking delta, 2 tracking snapshot
    +------+------+-------------+--------------------+
    8                                               16
    | Timestamp int64, ms since the Unix epoch       |
    16                                              24
    | Epoch uint64 (leader epoch; Riverbed writes 1) |
    24                                              32
    | ChunkId uint64 = offset of the chunk's first record |
    32              36              40              44      45           48
    | DataCrc u32   | DataLength u32| TrailerLen u32| Bloom | Reserved 0 |
    |               |               |               | Size  | (3 bytes)  |
    +---------------+---------------+---------------+-------+------------+
    48                48+B                 48+B+DataLength        +TrailerLength
    | bloom (B bytes) | data entries ...    | trailer (tracking) ... |

    DataCrc = zlib crc32 of the data entries only: bytes [48+B, 48+B+DataLength). The header, the bloom
    filter and the trailer are NOT covered by the CRC (they are not covered in osiris either).

Data entries::

    simple entry     | 0:1 | Length:31 | body (Length bytes) |                          4-byte header
    sub-batch entry  | 1:1 | Compression:3 | 0:4 | NumRecords u16 | UncompressedLen u32 | Length u32 | body |
                                                                                        11-byte header
    The (decompressed) body of a sub-batch is itself a run of simple entries. A sub-batch is one entry
    and NumRecords records (offsets).

Compression codes: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd, 5-6 reserved, 7 user defined. The core
decodes 0 and 1; other codecs are looked up in :data:`SUB_BATCH_CODECS` (shells register them) and a
missing one raises :class:`~riverbed.engine.errors.UnsupportedCompression`.

Bloom filter (optional, B = 0 or 16..255): bits numbered from the most significant bit of byte 0. Bit 0
means "the chunk holds an entry without a filter value". A value v sets bits h1(v) and h2(v) in
[1, 8B-1]. Clients never see the bloom (Deliver skips it), so Riverbed uses its own hash (two crc32 with
different seeds) instead of Erlang's phash2.

Deliver on the RabbitMQ Stream wire = the 48-byte header as stored + the data entries; bloom and trailer
are skipped while the header keeps BloomSize and TrailerLength. Riverbed writes TrailerLength 0: Osiris
appends a 24-byte writer-tracking trailer to user chunks, but Riverbed keeps publisher sequences and
consumer offsets in its own LMDB table, and the trailer is never sent to clients anyway. So a stored
chunk without a bloom is header + data, contiguous. The epoch is 1, as Osiris writes for a new stream.
"""

import importlib.util
import struct
import zlib

from riverbed.engine.errors import ChunkError, UnsupportedCompression

LEN_CHUNK_HEADER = 48
LEN_SIMPLE_HEADER = 4
LEN_SUB_BATCH_HEADER = 11
MAX_ENTRY_SIZE = 0x7FFFFFFF

CHUNK_MAGIC_VERSION = 0x50
CHUNK_USER = 0
CHUNK_TRACKING_DELTA = 1
CHUNK_TRACKING_SNAPSHOT = 2

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
COMPRESSION_USER = 7

BLOOM_MIN_SIZE = 16
BLOOM_MAX_SIZE = 255
BLOOM_DEFAULT_SIZE = 16
BLOOM_SEED_1 = 0
BLOOM_SEED_2 = 0x5BD1E995

TRACKING_SEQUENCE = 0
TRACKING_OFFSET = 1
TRACKING_TIMESTAMP = 2

# ">BBHIqQQIIIB3s": magic+version, type, entries, records, timestamp, epoch, chunk id, crc, data length,
# trailer length, bloom size, reserved. The header tuple the twins return drops the reserved bytes.
FMT_CHUNK_HEADER = ">BBHIqQQIIIB3x"
HEADER_STRUCT = struct.Struct(FMT_CHUNK_HEADER)
assert HEADER_STRUCT.size == LEN_CHUNK_HEADER

# Field positions in the header tuple returned by read_header().
H_MAGIC, H_TYPE, H_ENTRIES, H_RECORDS, H_TIMESTAMP, H_EPOCH, H_CHUNK_ID, H_CRC, H_DATA_LEN, H_TRAILER_LEN, \
    H_BLOOM_SIZE = range(11)


DECOMPRESS_PIECE = 256 << 10      # bytes a streamed decompression hands out at a time


class DecompressionLimit(ValueError):
    """A compressed body inflates past the limit it was given (``limit``): decompression stopped there,
    so a bomb costs the limit, never what it would have inflated to."""

    def __init__(self, limit):
        super().__init__(f"decompresses to more than {limit} bytes")
        self.limit = limit


def _gzip_pieces(body, limit, piece):
    # wbits 47 accepts both gzip and zlib wrappers: Java clients use GZIPOutputStream. max_length bounds
    # each step's output, so inflation proceeds piece by piece and stops at the limit.
    d = zlib.decompressobj(47)
    data = body
    while True:
        out = d.decompress(data, piece)
        data = d.unconsumed_tail
        if out:
            yield out
        elif d.eof:
            return
        elif not data:
            raise zlib.error("incomplete or truncated stream")


def _zstd_pieces(body, limit, piece):
    global _ZSTD
    if _ZSTD is None:
        import zstandard
        _ZSTD = zstandard.ZstdDecompressor()
    reader = _ZSTD.stream_reader(body, read_across_frames=True)
    while True:
        out = reader.read(piece)
        if not out:
            return
        yield out


def _lz4_pieces(body, limit, piece):
    global _LZ4F
    if _LZ4F is None:
        import lz4.frame
        _LZ4F = lz4.frame
    d = _LZ4F.LZ4FrameDecompressor()
    out = d.decompress(body, max_length=piece)
    while True:
        if out:
            yield out
        if d.eof:
            return
        if d.needs_input:
            raise ValueError("truncated lz4 frame")
        out = d.decompress(b"", max_length=piece)


SNAPPY_STREAM_ID = b"\xff\x06\x00\x00sNaPpY"   # the framing format's stream identifier chunk
SNAPPY_MAX_CHUNK = 65536                         # uncompressed bytes of one framed chunk, at most


def _snappy_pieces(body, limit, piece):
    # Framed snappy (Java, rbfly; xerial framing too) is a run of chunks of at most 64 KiB uncompressed.
    # cramjam has no streamed decompression with an output bound, so each data chunk goes through it on its
    # own (as a one-chunk stream: cramjam checks its CRC) into a 64 KiB buffer: one chunk at a time.
    global _CRAMJAM
    if _CRAMJAM is None:
        import cramjam
        _CRAMJAM = cramjam
    cramjam = _CRAMJAM
    mv = memoryview(body)
    if bytes(mv[:len(SNAPPY_STREAM_ID)]) != SNAPPY_STREAM_ID:
        # raw (unframed) snappy states its length up front: check it before decompressing
        try:
            raw_len = cramjam.snappy.decompress_raw_len(body)
        except Exception:
            raise ValueError("not snappy data") from None
        if raw_len > limit:
            raise DecompressionLimit(limit)
        yield bytes(cramjam.snappy.decompress_raw(body))
        return
    pos = len(SNAPPY_STREAM_ID)
    buf = bytearray(SNAPPY_MAX_CHUNK)
    while pos < len(mv):
        if pos + 4 > len(mv):
            raise ValueError("truncated snappy chunk header")
        kind = mv[pos]
        n = int.from_bytes(mv[pos + 1:pos + 4], "little")
        if pos + 4 + n > len(mv):
            raise ValueError("truncated snappy chunk")
        chunk = mv[pos:pos + 4 + n]
        pos += 4 + n
        if kind == 0xFF:                  # another stream identifier (concatenated streams)
            if bytes(chunk) != SNAPPY_STREAM_ID:
                raise ValueError("bad snappy stream identifier")
        elif kind in (0x00, 0x01):        # compressed / uncompressed data
            got = cramjam.snappy.decompress_into(SNAPPY_STREAM_ID + bytes(chunk), buf)
            yield bytes(buf[:got])
        elif kind < 0x80:                 # 0x02-0x7f: reserved, unskippable
            raise ValueError(f"reserved snappy chunk type 0x{kind:02x}")
        # 0x80-0xfe: skippable (padding)


SUB_BATCH_CODECS = {COMPRESSION_GZIP: _gzip_pieces}
"""compression code -> ``pieces(body: bytes, limit: int, piece: int)``, a generator of the decompressed
body in pieces of at most ``piece`` bytes; it may stop early or overshoot ``limit`` by one piece (the
caller counts), and raises on a corrupt or truncated body."""


def register_codec(code, pieces):
    """Make sub-batch entries with compression ``code`` (2..7) readable: ``pieces`` as in
    :data:`SUB_BATCH_CODECS`. Not thread-safe; call at start-up."""
    if not 1 <= code <= 7:
        raise ValueError(f"compression code {code} out of range 1..7")
    SUB_BATCH_CODECS[code] = pieces


def iter_decompress(code, body, limit, piece=DECOMPRESS_PIECE):
    """The decompressed sub-batch ``body`` as a generator of pieces (bytes-like, at most ``piece`` bytes
    each), streamed: at most one piece is held at a time, and DecompressionLimit is raised as soon as
    more than ``limit`` bytes came out, so a bomb costs ``limit`` of work, not what it inflates to.
    Raises UnsupportedCompression for a code with no codec, and the codec's own error (a ValueError,
    zlib.error, zstandard.ZstdError, ...) for a corrupt body."""
    if code == COMPRESSION_NONE:
        if len(body) > limit:
            raise DecompressionLimit(limit)
        mv = memoryview(body)
        for i in range(0, len(mv), piece):
            yield mv[i:i + piece]
        return
    fn = SUB_BATCH_CODECS.get(code)
    if fn is None:
        raise UnsupportedCompression(code)
    total = 0
    for out in fn(body, limit, piece):
        total += len(out)
        if total > limit:
            raise DecompressionLimit(limit)
        yield out


def decompress(code, body, uncompressed_size):
    """Decompress a sub-batch body that must come to exactly ``uncompressed_size`` bytes; decompression
    stops past it (a body that would inflate further is refused without inflating it). Raises
    UnsupportedCompression for a code with no codec, and ChunkError for a body that does not decompress,
    inflates past the size or comes to another size (one error for every reader of a bad chunk, whatever
    the codec library raised)."""
    if code == COMPRESSION_NONE:
        return bytes(body)
    try:
        out = b"".join(iter_decompress(code, bytes(body), uncompressed_size))
    except UnsupportedCompression:
        raise
    except Exception as e:  # noqa: BLE001 - zlib.error, RuntimeError (lz4), ZstdError, DecompressionLimit, ...
        raise ChunkError(f"sub-batch does not decompress ({type(e).__name__}: {e})") from None
    if len(out) != uncompressed_size:
        raise ChunkError(f"sub-batch decompressed to {len(out)} bytes, header says {uncompressed_size}")
    return bytes(out)


def gzip_compress(data):
    """gzip-wrap ``data`` the way the Java and Python clients do for compression code 1."""
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


_ZSTD = _LZ4F = _CRAMJAM = None


def _register_optional_codecs():
    # The well-kept codec libraries are dependencies; registering them here means every reader of a
    # sub-batch (RabbitMQ Deliver decode, Spark, dump) understands every codec a client can send. Each
    # library is imported on the first body of its codec, not here: cramjam alone maps ~3 MB of code into
    # every broker process, and most never see a compressed sub-batch (issue 26, broker memory).
    for code, module, pieces in ((COMPRESSION_ZSTD, "zstandard", _zstd_pieces),
                                 (COMPRESSION_LZ4, "lz4", _lz4_pieces),
                                 (COMPRESSION_SNAPPY, "cramjam", _snappy_pieces)):
        if importlib.util.find_spec(module) is not None:
            register_codec(code, pieces)


_register_optional_codecs()

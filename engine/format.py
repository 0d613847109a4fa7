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


def _gzip_decompress(body, uncompressed_size):
    # wbits 47 accepts both gzip and zlib wrappers: Java clients use GZIPOutputStream.
    return zlib.decompress(body, 47)


SUB_BATCH_CODECS = {COMPRESSION_GZIP: _gzip_decompress}
"""compression code -> ``decompress(body: bytes, uncompressed_size: int) -> bytes``."""


def register_codec(code, decompress):
    """Make sub-batch entries with compression ``code`` (2..7) readable. Not thread-safe; call at start-up."""
    if not 1 <= code <= 7:
        raise ValueError(f"compression code {code} out of range 1..7")
    SUB_BATCH_CODECS[code] = decompress


def decompress(code, body, uncompressed_size):
    """Decompress a sub-batch body. Raises UnsupportedCompression for a code with no codec, ChunkError for
    a body that does not decompress or decompresses to another size than the header's."""
    if code == COMPRESSION_NONE:
        return bytes(body)
    fn = SUB_BATCH_CODECS.get(code)
    if fn is None:
        raise UnsupportedCompression(code)
    try:
        out = fn(bytes(body), uncompressed_size)
    except Exception as e:  # noqa: BLE001 - zlib.error, RuntimeError (lz4), ZstdError, ...: one error for readers
        raise ChunkError(f"sub-batch does not decompress ({type(e).__name__}: {e})") from None
    if len(out) != uncompressed_size:
        raise ChunkError(f"sub-batch decompressed to {len(out)} bytes, header says {uncompressed_size}")
    return out


def gzip_compress(data):
    """gzip-wrap ``data`` the way the Java and Python clients do for compression code 1."""
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


def _register_optional_codecs():
    # The well-kept codec libraries are dependencies; registering them here means every reader of a
    # sub-batch (RabbitMQ Deliver decode, Spark, dump) understands every codec a client can send.
    try:
        import zstandard
        _zd = zstandard.ZstdDecompressor()
        register_codec(COMPRESSION_ZSTD, lambda b, n: _zd.decompress(b, max_output_size=n))
    except ImportError:  # pragma: no cover - dependency missing
        pass
    try:
        import lz4.frame
        register_codec(COMPRESSION_LZ4, lambda b, n: lz4.frame.decompress(b))
    except ImportError:  # pragma: no cover
        pass
    try:
        import cramjam
        # Java and rbfly use framed snappy (xerial / snappy-java framing is also "framed" in cramjam).
        register_codec(COMPRESSION_SNAPPY, _snappy_decompress)
    except ImportError:  # pragma: no cover
        pass


def _snappy_decompress(body, uncompressed_size):
    import cramjam
    try:
        return bytes(cramjam.snappy.decompress(body))
    except Exception:
        return bytes(cramjam.snappy.decompress_raw(body))


_register_optional_codecs()

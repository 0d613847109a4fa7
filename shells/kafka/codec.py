"""The Kafka wire format, as pure functions: frames, request and response headers, message bodies at
any version (classic and flexible: compact strings and arrays, tagged fields), and record batches v2
(the only record format the served Produce and Fetch versions carry).

Bodies are plain dicts keyed by the snake-case field names of :mod:`riverbed.shells.kafka.schema`;
arrays of structs are lists of dicts. Decoding fills every field present at the version (absent ones
read as their defaults); encoding writes the fields present at the version and takes the default for a
key that is missing.

Bad input raises :class:`DecodeError` (a request that does not parse: the session closes the
connection, as Kafka does) or :class:`CorruptBatch` (a record batch whose CRC or framing is wrong:
answered CORRUPT_MESSAGE, nothing stored). Every function here is pure and thread-safe.
"""

import struct
import uuid as _uuid

import crc32c as _crc32c

from riverbed.engine import format as _fmt
from riverbed.engine.errors import FrameError
from riverbed.shells import _pywire
from riverbed.shells import wire as _wire
from riverbed.shells.kafka.schema import MESSAGES

# ---- API keys, versions served, error codes ------------------------------------------------------------

API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA = 0, 1, 2, 3
API_OFFSET_COMMIT, API_OFFSET_FETCH, API_FIND_COORDINATOR, API_JOIN_GROUP = 8, 9, 10, 11
API_HEARTBEAT, API_LEAVE_GROUP, API_SYNC_GROUP, API_DESCRIBE_GROUPS, API_LIST_GROUPS = 12, 13, 14, 15, 16
API_SASL_HANDSHAKE, API_API_VERSIONS, API_CREATE_TOPICS, API_DELETE_TOPICS = 17, 18, 19, 20
API_INIT_PRODUCER_ID, API_DESCRIBE_CONFIGS, API_SASL_AUTHENTICATE, API_CREATE_PARTITIONS = 22, 32, 36, 37
API_CONSUMER_GROUP_HEARTBEAT, API_CONSUMER_GROUP_DESCRIBE = 68, 69      # KIP-848

ERR_NONE = 0
ERR_UNKNOWN_SERVER_ERROR = -1
ERR_OFFSET_OUT_OF_RANGE = 1
ERR_CORRUPT_MESSAGE = 2
ERR_UNKNOWN_TOPIC_OR_PARTITION = 3
ERR_NOT_LEADER_OR_FOLLOWER = 6
ERR_REQUEST_TIMED_OUT = 7
ERR_MESSAGE_TOO_LARGE = 10
ERR_COORDINATOR_NOT_AVAILABLE = 15
ERR_NOT_COORDINATOR = 16
ERR_INVALID_TOPIC_EXCEPTION = 17
ERR_RECORD_LIST_TOO_LARGE = 18
ERR_INVALID_REQUIRED_ACKS = 21
ERR_TOPIC_AUTHORIZATION_FAILED = 29
ERR_UNSUPPORTED_VERSION = 35
ERR_TOPIC_ALREADY_EXISTS = 36
ERR_INVALID_PARTITIONS = 37
ERR_INVALID_REPLICATION_FACTOR = 38
ERR_INVALID_CONFIG = 40
ERR_INVALID_REQUEST = 42
ERR_POLICY_VIOLATION = 44
ERR_KAFKA_STORAGE_ERROR = 56
ERR_GROUP_ID_NOT_FOUND = 69
ERR_UNSUPPORTED_COMPRESSION_TYPE = 76
ERR_INVALID_RECORD = 87
ERR_UNKNOWN_TOPIC_ID = 100
ERR_FENCED_MEMBER_EPOCH = 110
ERR_UNSUPPORTED_ASSIGNOR = 112
ERR_STALE_MEMBER_EPOCH = 113
ERR_INVALID_REGULAR_EXPRESSION = 128

# api key -> (lowest, highest) version served. ApiVersions advertises exactly these. Metadata 10-12 carry
# topic ids (KIP-848 assignments name topics by id; librdkafka asks Metadata by id only at 12+); Fetch
# stays below 13, where topics would be named by id, so every client fetches by name.
SERVED = {
    API_PRODUCE: (3, 9),          # 3: record batches v2 only
    API_FETCH: (4, 12),           # 4: record batches v2, isolation level
    API_LIST_OFFSETS: (1, 6),     # 7 would add MAX_TIMESTAMP (-3)
    API_METADATA: (0, 12),
    API_API_VERSIONS: (0, 3),
    API_CREATE_TOPICS: (0, 5),
    API_FIND_COORDINATOR: (0, 3),  # 4 brings the batched form
    API_JOIN_GROUP: (0, 4),        # 5 brings static membership (group.instance.id), not served
    API_SYNC_GROUP: (0, 5),
    API_HEARTBEAT: (0, 4),
    API_LEAVE_GROUP: (0, 5),
    API_OFFSET_COMMIT: (0, 9),     # 9: the KIP-848 consumer protocol's (a member epoch as generation)
    API_OFFSET_FETCH: (0, 7),      # 8 brings the batched form
    API_LIST_GROUPS: (0, 5),
    API_DESCRIBE_GROUPS: (0, 5),
    API_DELETE_TOPICS: (0, 5),     # 6 names topics by id
    API_CREATE_PARTITIONS: (0, 3),
    API_DESCRIBE_CONFIGS: (0, 4),
    API_INIT_PRODUCER_ID: (0, 4),  # 5 is for transactions (KIP-890)
    API_SASL_HANDSHAKE: (1, 1),    # 1: tokens in SaslAuthenticate (v0's raw token frames are not served)
    API_SASL_AUTHENTICATE: (0, 2),
    API_CONSUMER_GROUP_HEARTBEAT: (0, 1),   # KIP-848; librdkafka 2.16 asks 1
    API_CONSUMER_GROUP_DESCRIBE: (0, 0),
}

MAX_FRAME = 100 << 20           # bytes of one request (Kafka's socket.request.max.bytes is 100 MiB)
LEN_SIZE = 4

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_HEAD = struct.Struct(">hhi")   # api key, api version, correlation id


class DecodeError(ValueError):
    """A request that does not parse at its version: Kafka closes such a connection."""


class CorruptBatch(ValueError):
    """A record batch with a wrong CRC, magic or framing: answered CORRUPT_MESSAGE, never stored."""


class BatchTooLarge(CorruptBatch):
    """A record batch whose records decompress past the limit: answered MESSAGE_TOO_LARGE."""


class FrameTooLarge(DecodeError):
    """A frame size over the limit (or negative): the connection closes."""


class UnsupportedCompression(ValueError):
    """A record batch with a compression code Kafka does not define (5-7)."""


def is_flexible(api_key, version):
    """Whether ``version`` of ``api_key`` is a flexible version (compact types, tagged fields)."""
    first = MESSAGES[api_key][3]
    return first is not None and version >= first


# ---- primitive reading -----------------------------------------------------------------------------------

class Reader:
    """Reads Kafka primitives from ``buf`` from ``pos`` on; raises DecodeError past the end."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf, pos=0, end=None):
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def _take(self, n):
        p = self.pos
        if n < 0 or p + n > self.end:
            raise DecodeError("truncated")
        self.pos = p + n
        return p

    def i8(self):
        return _I8.unpack_from(self.buf, self._take(1))[0]

    def i16(self):
        return _I16.unpack_from(self.buf, self._take(2))[0]

    def u16(self):
        return _U16.unpack_from(self.buf, self._take(2))[0]

    def i32(self):
        return _I32.unpack_from(self.buf, self._take(4))[0]

    def u32(self):
        return _U32.unpack_from(self.buf, self._take(4))[0]

    def i64(self):
        return _I64.unpack_from(self.buf, self._take(8))[0]

    def f64(self):
        return _F64.unpack_from(self.buf, self._take(8))[0]

    def raw(self, n):
        p = self._take(n)
        return bytes(self.buf[p:p + n])

    def uvarint(self):
        shift = result = 0
        while True:
            if shift > 63:
                raise DecodeError("varint too long")
            b = self.buf[self._take(1)]
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def varint(self):
        """A zigzag-encoded signed varint (varint and varlong alike)."""
        n = self.uvarint()
        return (n >> 1) ^ -(n & 1)


def _read_string(r, flexible, nullable):
    n = r.uvarint() - 1 if flexible else r.i16()
    if n < 0:
        if not nullable:
            raise DecodeError("null in a non-nullable string")
        return None
    try:
        return r.raw(n).decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError("string is not UTF-8") from None


def _read_bytes(r, flexible):
    n = r.uvarint() - 1 if flexible else r.i32()
    if n < 0:
        return None
    return r.raw(n)


def _read_records(r, flexible):
    # a Produce's record batches: a view of the request frame, not a copy (the frame is never changed)
    n = r.uvarint() - 1 if flexible else r.i32()
    if n < 0:
        return None
    p = r._take(n)
    return memoryview(r.buf)[p:p + n]


def _skip_tags(r):
    for _ in range(r.uvarint()):
        r.uvarint()
        n = r.uvarint()
        r._take(n)


_PRIM_READ = {
    "int8": Reader.i8, "int16": Reader.i16, "int32": Reader.i32, "int64": Reader.i64, "uint16": Reader.u16,
    "bool": lambda r: r.i8() != 0, "uuid": lambda r: r.raw(16), "float64": Reader.f64,
}


def _read_value(r, f, typ, v, flexible):
    fn = _PRIM_READ.get(typ)
    if fn is not None:
        return fn(r)
    if typ == "string":
        return _read_string(r, flexible, f.nullable(v))
    if typ == "records":
        return _read_records(r, flexible)
    if typ == "bytes":
        b = _read_bytes(r, flexible)
        if b is None and typ == "bytes" and not f.nullable(v):
            raise DecodeError("null in non-nullable bytes")
        return b
    raise DecodeError(f"unknown type {typ}")


def _read_array_len(r, flexible):
    n = r.uvarint() - 1 if flexible else r.i32()
    if n > r.end - r.pos:           # every element takes at least one byte: a bogus count is refused early
        raise DecodeError("array longer than the frame")
    return n


def decode_struct(fields, r, v, flexible):
    """Read one struct of ``fields`` at version ``v`` from Reader ``r``; a dict."""
    out = {}
    tagged = None
    for f in fields:
        if not f.present(v):
            out[f.name] = f.default
            continue
        if f.tag is not None and flexible:
            out[f.name] = f.default
            if tagged is None:
                tagged = {}
            tagged[f.tag] = f
            continue
        out[f.name] = _decode_field(r, f, v, flexible)
    if flexible:
        for _ in range(r.uvarint()):
            tag = r.uvarint()
            size = r.uvarint()
            f = tagged.get(tag) if tagged else None
            if f is None:
                r._take(size)
            else:
                sub = Reader(r.buf, r.pos, r._take(size) + size)
                out[f.name] = _decode_field(sub, f, v, flexible)
    return out


def _decode_field(r, f, v, flexible):
    t = f.type
    if t == "[]" or f.item is not None:
        n = _read_array_len(r, flexible)
        if n < 0:
            if not f.nullable(v):
                raise DecodeError("null in a non-nullable array")
            return None
        if f.item is not None:
            return [_read_value(r, f, f.item, v, flexible) for _ in range(n)]
        return [decode_struct(f.fields, r, v, flexible) for _ in range(n)]
    if t == "{}":
        if f.nullable(v):
            # a nullable struct: an int8 marker first, -1 null and 1 present (Kafka's generated code)
            if r.i8() < 0:
                return None
        return decode_struct(f.fields, r, v, flexible)
    return _read_value(r, f, t, v, flexible)


# ---- primitive writing -----------------------------------------------------------------------------------

def uvarint(n):
    """The unsigned varint of ``n`` (>= 0) as bytes."""
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_ONE_BYTE = [bytes((i,)) for i in range(0x80)]


def varint(n):
    """The zigzag varint (varint and varlong alike) of signed ``n``."""
    return uvarint((n << 1) ^ (n >> 63))


def _w_string(out, s, flexible):
    if s is None:
        out += b"\x00" if flexible else b"\xff\xff"
        return
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    out += uvarint(len(b) + 1) if flexible else _I16.pack(len(b))
    out += b


def _w_bytes(out, b, flexible):
    if b is None:
        out += b"\x00" if flexible else b"\xff\xff\xff\xff"
        return
    out += uvarint(len(b) + 1) if flexible else _I32.pack(len(b))
    if type(out) is _Parts and len(b) >= SPLICE_MIN:
        out.splices.append((len(out), b))       # sent as it is, after what is written so far
        return
    out += b


SPLICE_MIN = 64 << 10       # bytes values at least this long are not copied into an answer (encode_response_parts)


class _Parts(bytearray):
    """An answer being encoded, and the long values to send between its pieces: ``(position, value)``."""

    __slots__ = ("splices",)

    def __init__(self, size):
        super().__init__(size)
        self.splices = []


_NOT_NULL = {"string": "", "bytes": b"", "int8": 0, "int16": 0, "int32": 0, "int64": 0, "uint16": 0, "bool": False,
             "uuid": b"\0" * 16, "float64": 0.0}

_PRIM_WRITE = {
    "int8": _I8.pack, "int16": _I16.pack, "int32": _I32.pack, "int64": _I64.pack, "uint16": _U16.pack,
    "bool": lambda b: b"\x01" if b else b"\x00", "uuid": lambda u: bytes(u), "float64": _F64.pack,
}


def _write_value(out, typ, val, flexible):
    fn = _PRIM_WRITE.get(typ)
    if fn is not None:
        out += fn(val)
    elif typ == "string":
        _w_string(out, val, flexible)
    else:
        _w_bytes(out, val, flexible)


def encode_struct(fields, obj, v, flexible, out):
    """Append struct ``obj`` (a dict; missing keys take their defaults) at version ``v`` to bytearray
    ``out``."""
    tagged = []
    for f in fields:
        if not f.present(v):
            continue
        val = obj.get(f.name, f.default) if obj is not None else f.default
        if val is None and not f.nullable(v) and f.type != "records":
            val = _NOT_NULL.get(f.type, []) if f.type != "{}" else {}     # null only where the version allows
        if f.tag is not None and flexible:
            if val is not None and val != f.default:
                buf = bytearray()
                _encode_field(buf, f, val, v, flexible)
                tagged.append((f.tag, buf))
            continue
        _encode_field(out, f, val, v, flexible)
    if flexible:
        out += uvarint(len(tagged))
        for tag, buf in sorted(tagged, key=lambda t: t[0]):
            out += uvarint(tag)
            out += uvarint(len(buf))
            out += buf


def _encode_field(out, f, val, v, flexible):
    t = f.type
    if t == "[]" or f.item is not None:
        if val is None:
            out += b"\x00" if flexible else b"\xff\xff\xff\xff"
            return
        out += uvarint(len(val) + 1) if flexible else _I32.pack(len(val))
        if f.item is not None:
            for x in val:
                _write_value(out, f.item, x, flexible)
        else:
            for x in val:
                encode_struct(f.fields, x, v, flexible, out)
    elif t == "{}":
        if f.nullable(v):
            if val is None:
                out += b"\xff"
                return
            out += b"\x01"
        encode_struct(f.fields, val, v, flexible, out)
    else:
        _write_value(out, t, val, flexible)


# ---- requests and responses ------------------------------------------------------------------------------

class RequestHeader:
    """A parsed request header. ``body`` is the offset of the body in the frame."""

    __slots__ = ("api_key", "version", "correlation_id", "client_id", "body")

    def __init__(self, api_key, version, correlation_id, client_id, body):
        self.api_key = api_key
        self.version = version
        self.correlation_id = correlation_id
        self.client_id = client_id
        self.body = body


def decode_header(frame):
    """The header of one request ``frame`` (the bytes after the size). The client id is a classic
    nullable string in every header version; header v2 (a flexible request) adds tagged fields. An API
    key this module has no schema for gets ``body`` -1 (the caller closes: Kafka does). Raises
    DecodeError for a header that does not parse."""
    if len(frame) < 8:
        raise DecodeError("request header truncated")
    api_key, version, corr = _HEAD.unpack_from(frame, 0)
    r = Reader(frame, 8)
    client_id = _read_string(r, False, True)
    if api_key not in MESSAGES:
        return RequestHeader(api_key, version, corr, client_id, -1)
    if is_flexible(api_key, version):
        _skip_tags(r)
    return RequestHeader(api_key, version, corr, client_id, r.pos)


def decode_request(api_key, version, frame, pos):
    """The body of a request at ``pos`` of ``frame`` as a dict. Raises DecodeError; bytes left over
    after the body are ignored (Kafka does the same for forward-compatible fields)."""
    _, req, _, _ = MESSAGES[api_key]
    return decode_struct(req, Reader(frame, pos), version, is_flexible(api_key, version))


def encode_response(api_key, version, correlation_id, body):
    """One whole response frame (size included) for ``body`` (a dict) at ``version``. ApiVersions
    responses keep header v0 at every version (clients read them before they know the versions)."""
    return b"".join(encode_response_parts(api_key, version, correlation_id, body))


def encode_response_parts(api_key, version, correlation_id, body):
    """:func:`encode_response` as a list of bytes-like pieces to send in order (one ``writelines``):
    a bytes or bytearray value of at least ``SPLICE_MIN`` bytes in ``body`` (a Fetch answer's records)
    is one piece itself, never copied. The values must not change until the pieces are sent."""
    _, _, res, _ = MESSAGES[api_key]
    flexible = is_flexible(api_key, version)
    out = _Parts(8)
    _I32.pack_into(out, 4, correlation_id)
    if flexible and api_key != API_API_VERSIONS:
        out += b"\x00"
    encode_struct(res, body, version, flexible, out)
    splices = out.splices
    if not splices:
        _I32.pack_into(out, 0, len(out) - 4)
        return [out]
    _I32.pack_into(out, 0, len(out) - 4 + sum(len(b) for _, b in splices))
    mv = memoryview(out)
    parts = []
    at = 0
    for pos, b in splices:
        parts.append(mv[at:pos])
        parts.append(b)
        at = pos
    parts.append(mv[at:])
    return parts


def encode_request(api_key, version, correlation_id, client_id, body):
    """One whole request frame (for tests and tools): header v1, or v2 for a flexible version."""
    _, req, _, _ = MESSAGES[api_key]
    flexible = is_flexible(api_key, version)
    out = bytearray(4)
    out += _HEAD.pack(api_key, version, correlation_id)
    _w_string(out, client_id, False)
    if flexible:
        out += b"\x00"
    encode_struct(req, body, version, flexible, out)
    _I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def decode_response(api_key, version, frame):
    """The correlation id and body of one response ``frame`` (after the size): for tests and tools."""
    _, _, res, _ = MESSAGES[api_key]
    flexible = is_flexible(api_key, version)
    r = Reader(frame, 4)
    if flexible and api_key != API_API_VERSIONS:
        _skip_tags(r)
    return _I32.unpack_from(frame, 0)[0], decode_struct(res, r, version, flexible)


def split_frames(buf, max_frame=MAX_FRAME):
    """The complete size-prefixed frames at the start of ``buf`` (memoryviews) and the bytes used.
    Raises DecodeError for a frame size that is negative or over ``max_frame``."""
    frames = []
    pos = 0
    n = len(buf)
    mv = memoryview(buf)
    while n - pos >= LEN_SIZE:
        size = _I32.unpack_from(buf, pos)[0]
        if size < 0 or size > max_frame:
            raise FrameTooLarge(f"frame size {size} out of range 0..{max_frame}")
        if n - pos - LEN_SIZE < size:
            break
        frames.append(mv[pos + LEN_SIZE:pos + LEN_SIZE + size])
        pos += LEN_SIZE + size
    return frames, pos


# ---- record batches v2 -----------------------------------------------------------------------------------

MAGIC_V2 = 2
LEN_BATCH_OVERHEAD = 12                  # base offset (8) and batch length (4) before what the length counts
LEN_BATCH_HEADER = 61                    # bytes of a batch before its records
ATTR_COMPRESSION = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD = 0, 1, 2, 3, 4
_BATCH = struct.Struct(">qiibIhiqqqhii")  # base offset .. record count
XERIAL_MAGIC = b"\x82SNAPPY\x00"        # Java's (xerial) snappy framing, used by Kafka clients


class Batch:
    """One decoded record batch. ``records``: list of (timestamp ms, key, value, headers), key/value
    bytes or None, headers a list of (str, bytes or None)."""

    __slots__ = ("base_offset", "attributes", "last_offset_delta", "base_timestamp", "max_timestamp",
                 "producer_id", "producer_epoch", "base_sequence", "records")

    def __init__(self, base_offset, attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id,
                 producer_epoch, base_sequence, records):
        self.base_offset = base_offset
        self.attributes = attributes
        self.last_offset_delta = last_offset_delta
        self.base_timestamp = base_timestamp
        self.max_timestamp = max_timestamp
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.records = records

    @property
    def compression(self):
        return self.attributes & ATTR_COMPRESSION


def _xerial_pieces(body, limit, piece):
    # Java's snappy framing: the magic, version and compat ints, then blocks of (int32 length, raw snappy)
    import cramjam
    pos = 16
    total = 0
    while pos < len(body):
        if pos + 4 > len(body):
            raise ValueError("truncated xerial block")
        n = _I32.unpack_from(body, pos)[0]
        blk = bytes(body[pos + 4:pos + 4 + n])
        if n < 0 or len(blk) != n:
            raise ValueError("truncated xerial block")
        pos += 4 + n
        size = cramjam.snappy.decompress_raw_len(blk)
        total += size
        if total > limit:
            raise _fmt.DecompressionLimit(limit)
        yield bytes(cramjam.snappy.decompress_raw(blk))


def decompress(code, body, limit):
    """The records section of a batch with compression ``code``, decompressed to at most ``limit``
    bytes (format.iter_decompress streams it; a bomb costs the limit). Raises UnsupportedCompression,
    CorruptBatch (does not decompress, or inflates past ``limit``)."""
    if code not in (COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD):
        raise UnsupportedCompression(f"compression code {code}")
    try:
        if code == COMPRESSION_SNAPPY and bytes(body[:8]) == XERIAL_MAGIC:
            pieces = _xerial_pieces(body, limit, 0)
        else:
            pieces = _fmt.iter_decompress(code, bytes(body), limit)
        return b"".join(pieces)
    except _fmt.UnsupportedCompression:
        raise UnsupportedCompression(f"compression code {code}") from None
    except _fmt.DecompressionLimit:
        raise BatchTooLarge(f"records decompress to more than {limit} bytes") from None
    except Exception as e:  # noqa: BLE001 - zlib.error, ValueError, ZstdError, cramjam errors ...
        raise CorruptBatch(f"records do not decompress ({type(e).__name__})") from None


def compress(code, data):
    """``data`` compressed with Kafka compression ``code`` (for tests and Fetch answers)."""
    if code == COMPRESSION_NONE:
        return bytes(data)
    if code == COMPRESSION_GZIP:
        return _fmt.gzip_compress(data)
    import cramjam
    if code == COMPRESSION_SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if code == COMPRESSION_LZ4:
        return bytes(cramjam.lz4.compress(data))
    if code == COMPRESSION_ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise UnsupportedCompression(f"compression code {code}")


def _batch_bodies(data, limit):
    """Yield ``(Batch, records section)`` for each record batch (magic 2) of a Produce partition's
    ``records`` bytes, in order; the Batch's ``records`` is the record count. Each batch's CRC-32C is
    checked before anything else is read; the records section is decompressed to at most ``limit``
    bytes. Raises CorruptBatch (a CRC, magic or framing error, a bomb), UnsupportedCompression."""
    mv = memoryview(data)
    pos = 0
    while pos < len(mv):
        if len(mv) - pos < LEN_BATCH_HEADER:
            raise CorruptBatch("truncated batch header")
        (base_offset, length, _leader_epoch, magic, crc, attrs, last_delta, base_ts, max_ts, pid, epoch, seq,
         count) = _BATCH.unpack_from(mv, pos)
        if magic != MAGIC_V2:
            raise CorruptBatch(f"record batch magic {magic} (only 2 is served)")
        end = pos + LEN_BATCH_OVERHEAD + length
        if length < LEN_BATCH_HEADER - LEN_BATCH_OVERHEAD or end > len(mv):
            raise CorruptBatch("batch length out of range")
        if _crc32c.crc32c(mv[pos + 21:end]) != crc:
            raise CorruptBatch("batch CRC mismatch")
        if count < 0 or count > length:
            raise CorruptBatch("bad record count")
        body = mv[pos + LEN_BATCH_HEADER:end]
        code = attrs & ATTR_COMPRESSION
        if code != COMPRESSION_NONE:
            body = decompress(code, body, limit)
        yield Batch(base_offset, attrs, last_delta, base_ts, max_ts, pid, epoch, seq, count), body
        pos = end


def decode_batches(data, limit):
    """The record batches (magic 2) of a Produce partition's ``records`` bytes, records decoded
    (:class:`Batch`). Each batch's CRC-32C is checked before anything else is read; records decompress
    to at most ``limit`` bytes per batch. Raises CorruptBatch (a CRC, magic or framing error, records
    that do not parse, a bomb), UnsupportedCompression."""
    batches = []
    for b, body in _batch_bodies(data, limit):
        try:
            body = bytes(body)
            records, used = _pywire.kafka_records(body, b.records, b.base_timestamp)
            if used != len(body):
                raise FrameError("bytes after the last record")
        except FrameError as e:
            raise CorruptBatch(str(e)) from None
        b.records = records
        batches.append(b)
    return batches


def stored_batches(data, limit, to_stored):
    """Produce: the record batches of a partition's ``records`` bytes as one chunk to append, in one pass
    per batch (:func:`riverbed.shells.wire.kafka_stored`: compiled, or its pure twin): ``(chunk, count,
    batches)``. ``chunk`` is a bytearray laid out as the engine's ``append_chunk`` takes it (the 48-byte
    header with the counts and data length, CRC left for the writer, then one simple entry per record,
    each ``to_stored(key, value, headers, timestamp)``'s form); ``count`` its records; ``batches`` the
    :class:`Batch` headers, ``records`` being each one's record count. Control batches are checked but
    add nothing to the chunk. Raises as :func:`decode_batches` (a record timestamp outside int64 is
    CorruptBatch too)."""
    chunk = bytearray(_fmt.LEN_CHUNK_HEADER)
    batches = []
    count = 0
    for b, body in _batch_bodies(data, limit):
        control = b.attributes & ATTR_CONTROL
        try:
            used = _wire.kafka_stored(body, b.records, b.base_timestamp, bytearray() if control else chunk,
                                      to_stored)
            if used != len(body):
                raise FrameError("bytes after the last record")
        except FrameError as e:
            raise CorruptBatch(str(e)) from None
        if not control:
            count += b.records
        batches.append(b)
    n = count if count <= 0xFFFF else 0     # a u16 cannot count more: append_chunk then splits the entries
    _fmt.HEADER_STRUCT.pack_into(chunk, 0, _fmt.CHUNK_MAGIC_VERSION, _fmt.CHUNK_USER, n, n, 0, 0, 0, 0,
                                 len(chunk) - _fmt.LEN_CHUNK_HEADER, 0, 0)
    return chunk, count, batches


encode_record = _pywire.kafka_record      # one record of a batch v2 (length prefix included)


def encode_batch(base_offset, records, *, compression=COMPRESSION_NONE, producer_id=-1, producer_epoch=-1,
                 base_sequence=-1, attributes=0):
    """A record batch v2 of ``records`` ((timestamp ms, key, value, headers) each) from ``base_offset``,
    its CRC-32C set. ``compression`` compresses the records section (tests, clients' forms)."""
    if not records:
        raise ValueError("a batch holds at least one record")
    base_ts = records[0][0]
    max_ts = max(r[0] for r in records)
    body = b"".join(encode_record(i, ts - base_ts, k, v, h) for i, (ts, k, v, h) in enumerate(records))
    if compression:
        body = compress(compression, body)
    attrs = (attributes & ~ATTR_COMPRESSION) | compression
    head = bytearray(_BATCH.pack(base_offset, LEN_BATCH_HEADER - LEN_BATCH_OVERHEAD + len(body), -1, MAGIC_V2, 0,
                                 attrs, len(records) - 1, base_ts, max_ts, producer_id, producer_epoch,
                                 base_sequence, len(records)))
    crc = _crc32c.crc32c(bytes(head[21:]) + body)
    _U32.pack_into(head, 17, crc)
    return bytes(head) + body


def topic_uuid(name):
    """A stable topic id for ``name`` (Kafka's ids are random; here the name fixes it): 16 bytes."""
    return _uuid.uuid5(_uuid.NAMESPACE_URL, "riverbed-kafka:" + name).bytes


def crc32c(data):
    """CRC-32C (Castagnoli) of ``data``, as record batches v2 carry it."""
    return _crc32c.crc32c(data)


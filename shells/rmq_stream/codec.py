"""RabbitMQ Stream frames: building what the server sends and parsing what clients send.

Frame = ``uint32 size | uint16 key | uint16 version | body``, big-endian; see shared/specs/FACTS.md ("003"
and "Appendix A") for every layout. Pure functions, no state: thread-safe.
"""

import struct

from riverbed.engine import core
from riverbed.engine import format as fmt
from riverbed.engine.errors import (
    ChunkError, InvalidArgument, StorageFull, StreamExists, StreamNotFound, UnsupportedCompression,
)
from riverbed.shells import auth as _auth
from riverbed.shells.broker import limits as _limits
from riverbed.shells.broker.core import NotLeaderError
from riverbed.shells.rmq_stream.constants import (
    CMD_CLOSE, CMD_CONSUMER_UPDATE, CMD_CREDIT, CMD_DELIVER, CMD_EXCHANGE_COMMAND_VERSIONS, CMD_HEARTBEAT,
    CMD_METADATA, CMD_METADATA_UPDATE, CMD_OPEN, CMD_PARTITIONS, CMD_PEER_PROPERTIES, CMD_PUBLISH,
    CMD_PUBLISH_CONFIRM, CMD_PUBLISH_ERROR, CMD_QUERY_OFFSET, CMD_QUERY_PUBLISHER_SEQUENCE, CMD_RESOLVE_OFFSET_SPEC,
    CMD_ROUTE, CMD_SASL_HANDSHAKE, CMD_STORE_OFFSET, CMD_STREAM_STATS, CMD_TUNE,
    LEN_KEY_VERSION, LEN_PUBLISH_HEAD, OFFSET_TYPE_FIRST, OFFSET_TYPE_LAST,
    OFFSET_TYPE_NEXT, OFFSET_TYPE_NONE, OFFSET_TYPE_OFFSET, OFFSET_TYPE_TIMESTAMP, RC_AUTHENTICATION_FAILURE,
    RC_INTERNAL_ERROR, RC_OK, RC_PRECONDITION_FAILED, RC_SASL_AUTHENTICATION_FAILURE_LOOPBACK, RC_SASL_ERROR,
    RC_SASL_MECHANISM_NOT_SUPPORTED, RC_STREAM_ALREADY_EXISTS, RC_STREAM_DOES_NOT_EXIST, RC_STREAM_NOT_AVAILABLE,
    RESPONSE,
)

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_HEAD = struct.Struct(">IHH")            # size, key, version
_KEY_VERSION = struct.Struct(">HH")
_RESP = struct.Struct(">IHHIH")          # size, key, version, correlation id, response code
_PUB_HEAD = struct.Struct(">Bi")         # publisher id, count
_ID_LEN = struct.Struct(">QI")           # publishing id + entry length (or sub-batch flag byte...)
_ID_FLEN = struct.Struct(">Qh")          # v2: publishing id + filter value length
_SUB_BATCH = struct.Struct(">BHII")      # flags, records, uncompressed size, size
_DELIVER_V1 = struct.Struct(">IHHB")
_DELIVER_V2 = struct.Struct(">IHHBQ")
_CREDIT = struct.Struct(">BH")
_KMM = struct.Struct(">HHH")
_CONFIRM_HEAD = struct.Struct(">IHHBi")  # size, key, version, publisher id, id count


class DecodeError(ValueError):
    """A frame body does not parse as the command its key names (truncated, bad lengths, bad UTF-8)."""


class FieldError(DecodeError):
    """A frame that parses to its end but holds a value its command cannot take (a null property key or
    value, a null in a list of stream names): answered with the command's response code
    (PRECONDITION_FAILED) and the connection stays open. Raised by :meth:`Reader.done`."""


def frame(key, body=b"", version=1):
    """One complete frame (size prefix included) for ``key`` with ``body`` bytes."""
    return _HEAD.pack(len(body) + LEN_KEY_VERSION, key, version) + body


def response(key, correlation_id, code, body=b""):
    """A response frame: ``key | 0x8000``, correlation id, response code, then ``body``."""
    return _RESP.pack(len(body) + 10, key | RESPONSE, 1, correlation_id, code) + body


def enc_string(s):
    """``string``: int16 length + UTF-8 (None -> length -1)."""
    if s is None:
        return b"\xff\xff"
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    if len(b) > 0x7FFF:
        raise ValueError("string over 32767 bytes")
    return _I16.pack(len(b)) + b


def enc_strings(items):
    """``[string]``: int32 count + strings."""
    return _I32.pack(len(items)) + b"".join(enc_string(s) for s in items)


def enc_properties(props):
    """``[(string, string)]`` from a dict or a list of pairs."""
    items = list(props.items()) if isinstance(props, dict) else list(props)
    return _I32.pack(len(items)) + b"".join(enc_string(k) + enc_string(v) for k, v in items)


class Reader:
    """Cursor over one frame payload (key and version included). Every read raises DecodeError when
    the payload is too short, so a truncated or lying frame can never raise anything else."""

    __slots__ = ("buf", "pos", "end", "problem")

    def __init__(self, buf, pos=LEN_KEY_VERSION):
        self.buf = buf
        self.pos = pos
        self.end = len(buf)
        self.problem = None     # the first value read that its command cannot take (see done())

    def _take(self, st):
        p = self.pos
        if p + st.size > self.end:
            raise DecodeError("frame ends inside a field")
        self.pos = p + st.size
        return st.unpack_from(self.buf, p)[0]

    def u8(self):
        return self._take(_U8)

    def u16(self):
        return self._take(_U16)

    def u32(self):
        return self._take(_U32)

    def i32(self):
        return self._take(_I32)

    def u64(self):
        return self._take(_U64)

    def i64(self):
        return self._take(_I64)

    def raw(self, n):
        p = self.pos
        if n < 0 or p + n > self.end:
            raise DecodeError("frame ends inside a field")
        self.pos = p + n
        return self.buf[p:p + n]

    def string(self):
        """A string, or None for length -1. Invalid UTF-8 raises DecodeError."""
        n = self._take(_I16)
        if n == -1:
            return None
        if n < 0:
            raise DecodeError(f"negative string length {n}")
        try:
            return bytes(self.raw(n)).decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError("string is not valid UTF-8") from None

    def bytes_(self):
        """``bytes`` (int32 length): None for -1."""
        n = self._take(_I32)
        if n == -1:
            return None
        return bytes(self.raw(n))

    def count(self, min_item_size=1):
        """An array count, checked against the bytes left so a lying count cannot make us loop long."""
        n = self._take(_I32)
        if n < 0 or n * min_item_size > self.end - self.pos:
            raise DecodeError(f"array count {n} does not fit the frame")
        return n

    def strings(self):
        """An array of strings; a null among them is a problem (see :meth:`done`) and is left out."""
        out = []
        for _ in range(self.count(2)):
            v = self.string()
            if v is None:
                self.problem = self.problem or "null string in an array of strings"
            else:
                out.append(v)
        return out

    def properties(self, null_values=False):
        """``[(string, string)]`` as a dict (later keys win). A null key, or a null value unless
        ``null_values`` (kept as None), is a problem (see :meth:`done`) and its pair is left out."""
        out = {}
        for _ in range(self.count(4)):
            k = self.string()
            v = self.string()
            if k is None or (v is None and not null_values):
                self.problem = self.problem or f"null {'key' if k is None else 'value'} in a properties map"
            else:
                out[k] = v
        return out

    def done(self):
        """The end of the frame: every byte read (DecodeError otherwise), and no value the command
        cannot take (FieldError, with the first such problem)."""
        if self.pos != self.end:
            raise DecodeError(f"{self.end - self.pos} bytes left over after the last field")
        if self.problem is not None:
            raise FieldError(self.problem)


def decode_offset_spec(r, allow_none=False):
    """``OffsetType u16`` + ``Offset`` (u64 for offset, i64 for timestamp, absent otherwise) as
    ``(type, value)``. Unknown types raise DecodeError: the frame cannot be parsed past them."""
    t = r.u16()
    if t == OFFSET_TYPE_OFFSET:
        return t, r.u64()
    if t == OFFSET_TYPE_TIMESTAMP:
        return t, r.i64()
    if t in (OFFSET_TYPE_FIRST, OFFSET_TYPE_LAST, OFFSET_TYPE_NEXT) or (allow_none and t == OFFSET_TYPE_NONE):
        return t, None
    raise DecodeError(f"unknown offset type {t}")


class PublishBatch:
    """A decoded Publish frame. ``data`` is the Osiris data section to append (entries in frame order,
    publishing ids stripped), ``ids`` the publishing id of each entry, ``filters`` the filter value of
    each entry (v2) or None, and ``sub_batches`` the ``(entry index, flags, records, uncompressed size,
    body)`` of each sub-batch entry, for validation."""

    __slots__ = ("publisher_id", "ids", "data", "filters", "sub_batches", "parts")

    def __init__(self, publisher_id, ids, parts, filters, sub_batches):
        self.publisher_id = publisher_id
        self.ids = ids
        self.parts = parts
        self.filters = filters
        self.sub_batches = sub_batches
        self.data = None


def decode_publish(payload, version):
    """Parse a Publish payload (key and version included) without copying message bodies.

    v1: ``PublisherId u8 | count i32 | count x (PublishingId u64 | entry)`` where an entry is a simple
    entry (``u32 len | body``) or a sub-batch (``1:1 Cmp:3 0:4 | NumRecords u16 | Uncompressed u32 |
    Size u32 | body``); both are already in Osiris data-entry form, so the data section is the frame
    minus the 8-byte ids. v2: ``PublishingId u64 | FilterValue string | Message bytes``.
    ``parts`` holds memoryviews of the entries; ``batch.data`` is left to the caller to join.
    Raises DecodeError.
    """
    end = len(payload)
    if end < LEN_PUBLISH_HEAD:
        raise DecodeError("Publish frame too short")
    publisher_id, count = _PUB_HEAD.unpack_from(payload, LEN_KEY_VERSION)
    if count < 0 or count * 12 > end - LEN_PUBLISH_HEAD:
        raise DecodeError(f"Publish message count {count} does not fit the frame")
    mv = memoryview(payload)
    ids = []
    parts = []
    subs = []
    pos = LEN_PUBLISH_HEAD
    if version == 1:
        # Hot loop: no bounds check per message. An overrun either makes the next unpack_from raise
        # struct.error or leaves pos past the end, and both are caught below.
        unpack = _ID_LEN.unpack_from
        ids_append = ids.append
        parts_append = parts.append
        try:
            for _ in range(count):
                pid, n = unpack(payload, pos)
                ids_append(pid)
                if n < 0x80000000:
                    e = pos + 12 + n
                else:
                    flags, nrec, usize, size = _SUB_BATCH.unpack_from(payload, pos + 8)
                    e = pos + 19 + size
                    subs.append((len(parts), flags, nrec, usize, mv[pos + 19:e]))
                parts_append(mv[pos + 8:e])
                pos = e
        except struct.error:
            raise DecodeError("Publish frame ends inside a message") from None
        filters = None
    elif version == 2:
        filters = []
        for _ in range(count):
            if pos + 10 > end:
                raise DecodeError("Publish frame ends inside a message header")
            pid, flen = _ID_FLEN.unpack_from(payload, pos)
            pos += 10
            if flen == -1:
                filters.append(None)
            elif flen < 0 or pos + flen > end:
                raise DecodeError("bad filter value length")
            else:
                filters.append(bytes(mv[pos:pos + flen]))
                pos += flen
            if pos + 4 > end:
                raise DecodeError("Publish frame ends inside a message length")
            n = _I32.unpack_from(payload, pos)[0]
            e = pos + 4 + n
            if n < 0 or e > end:
                raise DecodeError("message overruns the Publish frame")
            ids.append(pid)
            parts.append(mv[pos:e])
            pos = e
    else:
        raise DecodeError(f"Publish version {version}")
    if pos != end:
        raise DecodeError(f"{end - pos} bytes left over after {count} messages")
    return PublishBatch(publisher_id, ids, parts, filters, subs)


class Refusal(str):
    """Why a sub-batch is refused (the text, for the log), with ``reason``: the
    :mod:`~riverbed.shells.broker.limits` reason label when a named limit refused it, else None (a
    corrupt or unsupported sub-batch)."""

    reason = None

    @classmethod
    def by_limit(cls, reason, text):
        r = cls(text)
        r.reason = reason
        return r


def check_sub_batch(flags, nrec, usize, body, limits=None):
    """Return None if a sub-batch entry is readable by consumers, else a :class:`Refusal`. A corrupt or
    unsupported batch is refused at publish time instead of breaking every consumer later.

    Bounded before and during the work (``limits``, default :func:`riverbed.shells.broker.limits.current`):
    the declared size is checked against ``max_decompressed_size`` and the ratio cap before anything is
    decompressed; decompression is streamed, each piece walked and dropped (entries are counted, never
    collected), and it stops as soon as the output passes the declared size or the walk passes the
    declared record count. So a bomb costs at most one piece of memory and the declared size of work."""
    lim = limits if limits is not None else _limits.current()
    code = (flags >> 4) & 0x7
    if flags & 0x0F:
        return Refusal("reserved bits set in the sub-batch flags")
    if usize > lim.max_decompressed_size:
        return Refusal.by_limit(_limits.REASON_DECOMPRESSED_SIZE, f"sub-batch of {usize} uncompressed bytes "
                                f"is over max_decompressed_size {lim.max_decompressed_size}")
    if code == fmt.COMPRESSION_NONE:
        if usize != len(body):
            return Refusal("uncompressed sub-batch sizes disagree")
    elif code not in fmt.SUB_BATCH_CODECS:
        return Refusal(f"compression type {code} is not supported")
    elif usize > lim.sub_batch_cap(len(body)):
        return Refusal.by_limit(_limits.REASON_DECOMPRESSION_RATIO, f"sub-batch of {len(body)} bytes declares "
                                f"{usize} uncompressed, over max_decompression_ratio {lim.max_decompression_ratio}")
    total = records = skip = 0
    carry = b""
    try:
        for piece in fmt.iter_decompress(code, body, usize):
            total += len(piece)
            if skip >= len(piece):            # inside one entry's body: nothing to walk here
                skip -= len(piece)
                continue
            if carry:                         # an entry header was cut by the end of the last piece
                piece = carry + bytes(piece)
            count, pos = core.walk_simple_entries(piece, skip, nrec - records + 1)
            records += count
            if records > nrec:
                return Refusal.by_limit(_limits.REASON_ENTRIES,
                                        f"sub-batch holds more than the {nrec} records its header says")
            if pos >= len(piece):
                skip, carry = pos - len(piece), b""
            else:
                skip, carry = 0, bytes(piece[pos:])
    except fmt.DecompressionLimit:
        return Refusal.by_limit(_limits.REASON_DECOMPRESSED_SIZE,
                                f"sub-batch inflates past the {usize} bytes its header declares")
    except UnsupportedCompression:
        return Refusal(f"compression type {code} is not supported")
    except ChunkError as e:
        return Refusal(f"sub-batch body: {e}")
    except Exception as e:  # every codec library raises its own error type
        return Refusal(f"sub-batch does not decompress ({type(e).__name__})")
    if total != usize:
        return Refusal(f"sub-batch decompressed to {total} bytes, header says {usize}")
    if skip or carry:
        return Refusal("sub-batch body: the last entry overruns the body")
    if records != nrec:
        return Refusal(f"sub-batch holds {records} simple entries, header says {nrec}")
    return None


def encode_publish_confirm(publisher_id, ids):
    """PublishConfirm: ``PublisherId u8 | [PublishingId u64]``."""
    n = len(ids)
    return _HEAD.pack(9 + 8 * n, CMD_PUBLISH_CONFIRM, 1) + _PUB_HEAD.pack(publisher_id, n) + \
        struct.pack(f">{n}Q", *ids)


def encode_publish_error(publisher_id, errors):
    """PublishError: ``PublisherId u8 | [(PublishingId u64, Code u16)]``; ``errors`` = [(id, code)]."""
    body = _PUB_HEAD.pack(publisher_id, len(errors)) + b"".join(struct.pack(">QH", i, c) for i, c in errors)
    return frame(CMD_PUBLISH_ERROR, body)


def encode_deliver_prefix(subscription_id, data_len, version=1, committed_chunk_id=0):
    """The bytes before a chunk in a Deliver frame, for a chunk whose data section is ``data_len``
    bytes (the frame then carries the 48-byte header and the data)."""
    if version == 1:
        return _DELIVER_V1.pack(5 + fmt.LEN_CHUNK_HEADER + data_len, CMD_DELIVER, 1, subscription_id)
    return _DELIVER_V2.pack(13 + fmt.LEN_CHUNK_HEADER + data_len, CMD_DELIVER, 2, subscription_id,
                            committed_chunk_id & 0xFFFFFFFFFFFFFFFF)


def deliver_parts(stored):
    """The pieces of a stored chunk that go on the wire after the Deliver prefix: the 48-byte header
    and the data section, bloom and trailer skipped. One piece when the chunk has no bloom."""
    bloom = stored[44]
    data_len = _U32.unpack_from(stored, 36)[0]
    end = fmt.LEN_CHUNK_HEADER + bloom + data_len
    if bloom == 0:
        return data_len, [stored if len(stored) == end else memoryview(stored)[:end]]
    mv = memoryview(stored)
    return data_len, [mv[:fmt.LEN_CHUNK_HEADER], mv[fmt.LEN_CHUNK_HEADER + bloom:end]]


def encode_close(correlation_id, code, reason):
    """Server-initiated Close: ``CorrelationId | ClosingCode u16 | ClosingReason string``."""
    return frame(CMD_CLOSE, _U32.pack(correlation_id) + _U16.pack(code) + enc_string(reason[:200]))


def encode_tune(frame_max, heartbeat):
    return frame(CMD_TUNE, struct.pack(">II", frame_max, heartbeat))


def encode_heartbeat():
    return frame(CMD_HEARTBEAT)


def encode_metadata_update(code, stream):
    return frame(CMD_METADATA_UPDATE, _U16.pack(code) + enc_string(stream))


def encode_consumer_update(correlation_id, subscription_id, active):
    return frame(CMD_CONSUMER_UPDATE, struct.pack(">IBB", correlation_id, subscription_id, 1 if active else 0))


def encode_credit_response(code, subscription_id):
    return frame(CMD_CREDIT | RESPONSE, struct.pack(">HB", code, subscription_id))


def encode_metadata_response(correlation_id, brokers, streams):
    """MetadataResponse. ``brokers`` = [(reference, host, port)], ``streams`` = [(name, code, leader,
    [replicas])]; no top-level response code (per-stream codes instead)."""
    body = [_U32.pack(correlation_id), _I32.pack(len(brokers))]
    for ref, host, port in brokers:
        body.append(_U16.pack(ref) + enc_string(host) + _U32.pack(port))
    body.append(_I32.pack(len(streams)))
    for name, code, leader, replicas in streams:
        body.append(enc_string(name) + _U16.pack(code) + _U16.pack(leader) + _I32.pack(len(replicas)) +
                    b"".join(_U16.pack(r) for r in replicas))
    return frame(CMD_METADATA | RESPONSE, b"".join(body))


def encode_command_versions(correlation_id, versions):
    body = _I32.pack(len(versions)) + b"".join(_KMM.pack(*v) for v in versions)
    return response(CMD_EXCHANGE_COMMAND_VERSIONS, correlation_id, RC_OK, body)


def encode_stream_stats(correlation_id, code, stats):
    body = _I32.pack(len(stats)) + b"".join(enc_string(k) + _I64.pack(v) for k, v in stats)
    return response(CMD_STREAM_STATS, correlation_id, code, body)


_AUTH_CODES = {
    _auth.OK: RC_OK,
    _auth.NO_MECHANISM: RC_SASL_MECHANISM_NOT_SUPPORTED,
    _auth.FAILURE: RC_AUTHENTICATION_FAILURE,
    _auth.LOOPBACK_ONLY: RC_SASL_AUTHENTICATION_FAILURE_LOOPBACK,
    _auth.SASL_ERROR: RC_SASL_ERROR,
}


def response_code_for(exc):
    """The response code that tells a client why an engine operation failed (None -> OK)."""
    if exc is None:
        return RC_OK
    if isinstance(exc, StreamNotFound):
        return RC_STREAM_DOES_NOT_EXIST
    if isinstance(exc, StreamExists):
        return RC_STREAM_ALREADY_EXISTS
    if isinstance(exc, (InvalidArgument, ChunkError, UnsupportedCompression)):
        return RC_PRECONDITION_FAILED
    if isinstance(exc, StorageFull):
        # a full disk or the disk alarm: the stream cannot take writes now (rstream: StreamNotAvailable);
        # nothing was stored, the same publish may be retried once space returns
        return RC_STREAM_NOT_AVAILABLE
    if isinstance(exc, NotLeaderError):
        # a cluster: the leader went away with the (forwarded) publish unconfirmed; retry with the same ids
        return RC_STREAM_NOT_AVAILABLE
    return RC_INTERNAL_ERROR


# Requests whose response is more than a code: the body a refusal carries so that clients parse it (the
# shapes of the empty answers the handlers give; StreamStats' and ExchangeCommandVersions' empty lists).
REFUSAL_BODIES = {
    CMD_PEER_PROPERTIES: enc_properties({}),
    CMD_SASL_HANDSHAKE: enc_strings([]),
    CMD_OPEN: enc_properties({}),
    CMD_QUERY_OFFSET: b"\x00" * 8,
    CMD_QUERY_PUBLISHER_SEQUENCE: b"\x00" * 8,
    CMD_ROUTE: enc_strings([]),
    CMD_PARTITIONS: enc_strings([]),
    CMD_STREAM_STATS: b"\x00" * 4,
    CMD_EXCHANGE_COMMAND_VERSIONS: b"\x00" * 4,
    CMD_RESOLVE_OFFSET_SPEC: struct.pack(">HQ", OFFSET_TYPE_OFFSET, 0),
}
# Requests without a correlation id, so without a response to refuse them with.
NO_RESPONSE_KEYS = frozenset((CMD_TUNE, CMD_HEARTBEAT, CMD_CREDIT, CMD_STORE_OFFSET, CMD_PUBLISH))

"""RabbitMQ Stream protocol shell: the wire protocol of RabbitMQ streams (keys 1-31) over Riverbed's log.

Layers, one way only (like asyncpg's coreproto vs protocol)::

    _RmqProtocol (asyncio transport glue)  ->  RmqStreamSession (sans-I/O state machine)  ->  codec
                                                 |
                                                 v
                                          RmqBroker (handler: auth, super streams, SAC groups)  ->  Engine

The session never touches a socket or an event loop: it takes bytes (``data_received``), clock ticks
(``tick``) and flow-control signals, and it emits bytes and actions through a small ``io`` object
(``write``/``writelines``/``close``/``pause_reading``/``resume_reading``/``defer``). The broker reaches the
engine and marshals the engine's writer-thread completions back to the loop thread with ``post``.

Sections of this module, in order: constants, codec, session, handler, server, ``serve()``.

Frame = ``uint32 size | uint16 key | uint16 version | body``, big-endian; see shared/specs/FACTS.md
("003" and "Appendix A") for every layout. Deliver writes the stored chunk bytes straight from the engine
(48-byte header + data; the bloom filter is skipped), one ``writelines([prefix, chunk])`` per chunk.

Behaviour where the protocol leaves a choice (each covered by tests/shells/test_rmq_session.py):

* Limits: 8 KiB frames until Open, then the negotiated frame_max, except Publish, which may be up to
  ``MAX_PUBLISH_FRAME`` (64 MiB). Over the cap: Close 0x0e. Unknown key or version, or a body that does
  not parse: Close 0x0d. A command that needs authentication (or Open) before it: Close 0x10.
* Authentication failures answer SaslAuthenticate with 0x08 / 0x0b / 0x09 and close the socket; an
  unknown mechanism (0x07) leaves the connection open for another try.
* Publish: an undeclared publisher gets PublishError 0x12 per id; a publisher whose stream was deleted
  gets MetadataUpdate 0x06 once, then PublishError 0x02; a sub-batch with an unsupported codec, or one
  that does not decompress to its declared records, gets PublishError 0x11 and the rest of the frame is
  stored. Duplicates (named publishers) are confirmed, as in RabbitMQ. Confirms go out after the commit.
* Flow control: a connection stops being read while 32 MiB of its appends are uncommitted, while 10,000
  of its engine operations are pending, or while its transport's write buffer is over 4 MiB (so a
  consumer that does not read, or a peer that does not read its replies, costs bounded memory).
* QueryOffset and QueryPublisherSequence wait for this broker's in-flight StoreOffset / appends of the
  same reference, so a client reads back what it just wrote.
* Single active consumer: on a plain stream the first member is active until it leaves; on a super
  stream partition (``super-stream`` property) member ``partition index mod N`` is, with a step-down
  (ConsumerUpdate inactive, answered) before the next member is activated.
* Super stream definitions live in ``rmq-super-streams.json`` in the data directory (the engine has
  no table for them); partitions are ordinary streams.
"""

import asyncio
import json
import logging
import os
import platform
import struct
import time

from riverbed.engine import OffsetSpec, PublishingIds, core
from riverbed.engine import format as fmt
from riverbed.engine.errors import (
    ChunkError, FrameError, FrameTooLarge, InvalidArgument, RiverbedError, StreamExists, StreamNotFound,
    UnsupportedCompression,
)
from riverbed.shells import auth as _auth

log = logging.getLogger("riverbed.rmq")

# ======================================================================================== constants

CMD_DECLARE_PUBLISHER = 0x01
CMD_PUBLISH = 0x02
CMD_PUBLISH_CONFIRM = 0x03
CMD_PUBLISH_ERROR = 0x04
CMD_QUERY_PUBLISHER_SEQUENCE = 0x05
CMD_DELETE_PUBLISHER = 0x06
CMD_SUBSCRIBE = 0x07
CMD_DELIVER = 0x08
CMD_CREDIT = 0x09
CMD_STORE_OFFSET = 0x0A
CMD_QUERY_OFFSET = 0x0B
CMD_UNSUBSCRIBE = 0x0C
CMD_CREATE = 0x0D
CMD_DELETE = 0x0E
CMD_METADATA = 0x0F
CMD_METADATA_UPDATE = 0x10
CMD_PEER_PROPERTIES = 0x11
CMD_SASL_HANDSHAKE = 0x12
CMD_SASL_AUTHENTICATE = 0x13
CMD_TUNE = 0x14
CMD_OPEN = 0x15
CMD_CLOSE = 0x16
CMD_HEARTBEAT = 0x17
CMD_ROUTE = 0x18
CMD_PARTITIONS = 0x19
CMD_CONSUMER_UPDATE = 0x1A
CMD_EXCHANGE_COMMAND_VERSIONS = 0x1B
CMD_STREAM_STATS = 0x1C
CMD_CREATE_SUPER_STREAM = 0x1D
CMD_DELETE_SUPER_STREAM = 0x1E
CMD_RESOLVE_OFFSET_SPEC = 0x1F
RESPONSE = 0x8000  # bit 15 of the key marks a response

RC_OK = 0x01
RC_STREAM_DOES_NOT_EXIST = 0x02
RC_SUBSCRIPTION_ID_ALREADY_EXISTS = 0x03
RC_SUBSCRIPTION_ID_DOES_NOT_EXIST = 0x04
RC_STREAM_ALREADY_EXISTS = 0x05
RC_STREAM_NOT_AVAILABLE = 0x06
RC_SASL_MECHANISM_NOT_SUPPORTED = 0x07
RC_AUTHENTICATION_FAILURE = 0x08
RC_SASL_ERROR = 0x09
RC_SASL_CHALLENGE = 0x0A
RC_SASL_AUTHENTICATION_FAILURE_LOOPBACK = 0x0B
RC_VIRTUAL_HOST_ACCESS_FAILURE = 0x0C
RC_UNKNOWN_FRAME = 0x0D
RC_FRAME_TOO_LARGE = 0x0E
RC_INTERNAL_ERROR = 0x0F
RC_ACCESS_REFUSED = 0x10
RC_PRECONDITION_FAILED = 0x11
RC_PUBLISHER_DOES_NOT_EXIST = 0x12
RC_NO_OFFSET = 0x13
RC_SASL_CANNOT_CHANGE_MECHANISM = 0x14
RC_SASL_CANNOT_CHANGE_USERNAME = 0x15

OFFSET_TYPE_NONE = 0       # only in a ConsumerUpdate answer: "keep the Subscribe offset spec"
OFFSET_TYPE_FIRST = 1
OFFSET_TYPE_LAST = 2
OFFSET_TYPE_NEXT = 3
OFFSET_TYPE_OFFSET = 4
OFFSET_TYPE_TIMESTAMP = 5

LEN_SIZE = 4                       # the uint32 frame size prefix
LEN_KEY_VERSION = 4                # uint16 key + uint16 version
LEN_DELIVER_PREFIX_V1 = 9          # size, key, version, subscription id
LEN_DELIVER_PREFIX_V2 = 17         # ... + committed chunk id u64
LEN_PUBLISH_HEAD = 9               # key, version, publisher id u8, count i32 (offsets into a frame payload)

INITIAL_FRAME_MAX = 8192           # bytes accepted per frame until Open succeeds (RabbitMQ 2026-07)
DEFAULT_FRAME_MAX = 1048576        # advertised in Tune, bytes
DEFAULT_HEARTBEAT = 60             # advertised in Tune, seconds
MAX_PUBLISH_FRAME = 64 << 20       # hard cap for Publish frames after Open: rstream's send_batch does not
                                   # split batches by frame_max, RabbitMQ stores them anyway
MAX_UNCOMPRESSED_SUB_BATCH = 64 << 20   # RabbitMQ's max_uncompressed_sub_entry_batch_size
MAX_REFERENCE = 255                # bytes of UTF-8 in a publisher/consumer reference (the engine's limit;
                                   # the protocol says 256 characters)
DEFAULT_HANDSHAKE_TIMEOUT = 10.0   # seconds from accept to a successful Open
CLOSE_TIMEOUT = 1.0                # seconds to wait for a CloseResponse to a server-initiated Close

# Publish flow control: stop reading a connection while this many bytes of its appends are not yet
# committed, resume below the low mark (RabbitMQ blocks on "publisher credits" the same way).
PUBLISH_INFLIGHT_HIGH = 32 << 20
PUBLISH_INFLIGHT_LOW = 8 << 20
# Same for the number of engine operations in flight (a flood of StoreOffset has no replies to throttle it).
PENDING_OPS_HIGH = 10000
PENDING_OPS_LOW = 2500

# Chunks one pump of one subscription may send before yielding to other connections.
DELIVER_BUDGET = 32

# rabbit_stream_utils:command_versions/0, in RabbitMQ's order: rstream indexes the reply by key - 1.
SERVER_COMMAND_VERSIONS = (
    (CMD_DECLARE_PUBLISHER, 1, 1), (CMD_PUBLISH, 1, 2), (CMD_QUERY_PUBLISHER_SEQUENCE, 1, 1),
    (CMD_DELETE_PUBLISHER, 1, 1), (CMD_SUBSCRIBE, 1, 1), (CMD_CREDIT, 1, 1), (CMD_STORE_OFFSET, 1, 1),
    (CMD_QUERY_OFFSET, 1, 1), (CMD_UNSUBSCRIBE, 1, 1), (CMD_CREATE, 1, 1), (CMD_DELETE, 1, 1),
    (CMD_METADATA, 1, 1), (CMD_CLOSE, 1, 1), (CMD_HEARTBEAT, 1, 1), (CMD_ROUTE, 1, 1),
    (CMD_PARTITIONS, 1, 1), (CMD_STREAM_STATS, 1, 1), (CMD_CREATE_SUPER_STREAM, 1, 1),
    (CMD_DELETE_SUPER_STREAM, 1, 1), (CMD_RESOLVE_OFFSET_SPEC, 1, 1),
)

PRODUCT = "Riverbed"
try:
    from importlib.metadata import version as _pkg_version
    VERSION = _pkg_version("riverbed")
except Exception:  # pragma: no cover - running from a source tree without metadata
    VERSION = "0.0.0"

# ============================================================================================ codec

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

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf, pos=LEN_KEY_VERSION):
        self.buf = buf
        self.pos = pos
        self.end = len(buf)

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
        return [self.string() for _ in range(self.count(2))]

    def properties(self):
        """``[(string, string)]`` as a dict (later keys win)."""
        out = {}
        for _ in range(self.count(4)):
            k = self.string()
            out[k] = self.string()
        return out

    def done(self):
        if self.pos != self.end:
            raise DecodeError(f"{self.end - self.pos} bytes left over after the last field")


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


def check_sub_batch(flags, nrec, usize, body):
    """Return None if a sub-batch entry is readable by consumers, else the reason. Compressed bodies are
    decompressed once here so a corrupt or unsupported batch is refused at publish time instead of
    breaking every consumer later."""
    code = (flags >> 4) & 0x7
    if flags & 0x0F:
        return "reserved bits set in the sub-batch flags"
    if usize > MAX_UNCOMPRESSED_SUB_BATCH:
        return f"sub-batch of {usize} uncompressed bytes is over {MAX_UNCOMPRESSED_SUB_BATCH}"
    if code == fmt.COMPRESSION_NONE:
        if usize != len(body):
            return "uncompressed sub-batch sizes disagree"
        inner = body
    elif code in fmt.SUB_BATCH_CODECS:
        try:
            inner = fmt.decompress(code, body, usize)
        except UnsupportedCompression:
            return f"compression type {code} is not supported"
        except Exception as e:  # every codec library raises its own error type
            return f"sub-batch does not decompress ({type(e).__name__})"
    else:
        return f"compression type {code} is not supported"
    try:
        ends, counts = core.scan_entries(inner)
    except ChunkError as e:
        return f"sub-batch body: {e}"
    if len(ends) != nrec or any(c != 1 for c in counts):
        return f"sub-batch holds {len(ends)} simple entries, header says {nrec}"
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
    return RC_INTERNAL_ERROR


# ========================================================================================== session

ST_HANDSHAKE = 0    # connected: PeerProperties, SASL
ST_TUNING = 1       # authenticated, Tune sent: waiting for the Tune echo and Open
ST_OPEN = 2
ST_CLOSING = 3      # the server sent Close and waits for the CloseResponse
ST_CLOSED = 4

SAC_NONE = 0        # not a single-active consumer
SAC_WAITING = 1     # in a group, not active
SAC_ACTIVATING = 2  # ConsumerUpdate(active) sent, waiting for the client's answer
SAC_ACTIVE = 3
SAC_STEPPING_DOWN = 4   # ConsumerUpdate(inactive) sent (super stream rebalance), waiting for the answer


class _Publisher:
    __slots__ = ("publisher_id", "stream", "reference", "stream_gone")

    def __init__(self, publisher_id, stream, reference):
        self.publisher_id = publisher_id
        self.stream = stream
        self.reference = reference or None     # "" = unnamed: no deduplication
        self.stream_gone = False               # deleted under it: Publish gets 0x02


class _Subscription:
    __slots__ = ("sub_id", "stream", "credit", "offset", "spec", "filters", "match_unfiltered", "sac",
                 "sac_name", "cancel_wait", "pump_scheduled", "gone")

    def __init__(self, sub_id, stream, credit, spec, filters, match_unfiltered):
        self.sub_id = sub_id
        self.stream = stream
        self.credit = credit
        self.offset = -1           # next offset to read from: the chunk holding it is delivered next
        self.spec = spec           # (offset type, value) as subscribed, for SAC activation "none"
        self.filters = filters     # list of bytes, empty when the subscriber does not filter
        self.match_unfiltered = match_unfiltered
        self.sac = SAC_NONE
        self.sac_name = None
        self.cancel_wait = None    # cancels the engine watch when one is armed
        self.pump_scheduled = False
        self.gone = False

    @property
    def delivering(self):
        return self.sac == SAC_NONE or self.sac == SAC_ACTIVE


def _truthy(v):
    return v is not None and v.strip().lower() == "true"


class RmqStreamSession:
    """One RabbitMQ Stream connection as a sans-I/O state machine.

    Feed it bytes with :meth:`data_received`, the clock with :meth:`tick` (seconds, the broker's clock),
    and the transport's flow-control signals with :meth:`pause_writing` / :meth:`resume_writing`. It
    writes through ``io`` (``write``, ``writelines``, ``close``, ``pause_reading``, ``resume_reading``,
    ``defer(fn, *args)``) and reaches storage only through ``broker`` (:class:`RmqBroker`).

    Not thread-safe: every method, and every callback the broker runs for it, must run on one thread
    (the event loop's). Bad input never raises out of here: it ends in a response code or a
    server-initiated Close (0x0d unknown frame, 0x0e frame too large, ...) and the connection closes.
    """

    def __init__(self, broker, io, *, peer="?", local_host=None, peer_loopback=False):
        self.broker = broker
        self.io = io
        self.peer = peer
        self.local_host = local_host
        self.peer_loopback = peer_loopback
        self.state = ST_HANDSHAKE
        now = broker.clock()
        self.created = now
        self.last_recv = now
        self.last_sent = now
        self.frame_max = broker.frame_max
        self.heartbeat = broker.heartbeat
        self.user = None
        self.username = None
        self.mechanism = None
        self.client_properties = {}
        self.publishers = {}
        self.subscriptions = {}
        self.deliver_version = 1
        self._buf = bytearray()
        self._need = 0
        self._max_frame = INITIAL_FRAME_MAX
        self._out = []
        self._corr = 0
        self._pending_updates = {}      # correlation id of a ConsumerUpdate we sent -> subscription id
        self._write_paused = False
        self._read_paused = False
        self._shutting_down = False
        self._inflight_bytes = 0        # Publish data handed to the engine and not committed yet
        self.pending_ops = 0            # engine operations of this connection not completed yet
        self._close_deadline = None
        broker.register(self)

    # ------------------------------------------------------------------------------- input and output

    def data_received(self, data):
        """Bytes from the peer. Processes every complete frame and writes the replies."""
        if self.state >= ST_CLOSED:
            return
        self.last_recv = self.broker.clock()
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return
            src = buf
        else:
            src = data
        try:
            frames, used = core.split_frames(src, self._max_frame)
        except FrameTooLarge:
            # Frames before the big one may include Open, which raises the cap: go one at a time.
            frames, used = self._split_slowly(src)
            if frames is None:
                return
        if src is buf:
            if used:
                del buf[:used]
        elif used < len(data):
            self._buf = bytearray(memoryview(data)[used:])
        rest = self._buf
        self._need = LEN_SIZE + _U32.unpack_from(rest, 0)[0] if len(rest) >= LEN_SIZE else LEN_SIZE
        for f in frames:
            self._dispatch(f)
            if self.state >= ST_CLOSED:
                return
        self._flush()

    def _split_slowly(self, src):
        """Frame by frame with the cap in force at each frame; dispatches as it goes. Returns
        ``([], used)``, or ``(None, 0)`` once the connection has been closed."""
        mv = memoryview(src)
        pos = 0
        while len(mv) - pos >= LEN_SIZE:
            n = _U32.unpack_from(mv, pos)[0]
            if n > self._max_frame:
                self._fatal(RC_FRAME_TOO_LARGE, f"frame of {n} bytes is over the {self._max_frame}-byte limit")
                return None, 0
            if len(mv) - pos - LEN_SIZE < n:
                break
            self._dispatch(bytes(mv[pos + LEN_SIZE:pos + LEN_SIZE + n]))
            pos += LEN_SIZE + n
            if self.state >= ST_CLOSED:
                return None, 0
        return [], pos

    def _send(self, data):
        self._out.append(data)

    def _flush(self):
        if self._out and self.state < ST_CLOSED:
            out, self._out = self._out, []
            self.io.writelines(out)
            self.last_sent = self.broker.clock()

    def _next_corr(self):
        self._corr = (self._corr + 1) & 0xFFFFFFFF
        return self._corr

    def _respond(self, key, corr, code, body=b""):
        self._send(response(key, corr, code, body))

    def _later(self, fn):
        """Wrap a completion callback: counted for flow control and shutdown, dropped once the
        connection is gone, flushes after running."""
        self.pending_ops += 1
        if self.pending_ops > PENDING_OPS_HIGH and not self._read_paused:
            self._update_reading()

        def run(*args):
            self.pending_ops -= 1
            if self.state >= ST_CLOSED:
                return
            fn(*args)
            if self._read_paused:
                self._update_reading()
            self._flush()
        return run

    # ------------------------------------------------------------------------------ flow and lifecycle

    def pause_writing(self):
        """The transport's buffer is over its high-water mark: stop delivering and stop reading (a peer
        that does not read its replies must not make us buffer them without bound)."""
        self._write_paused = True
        self._update_reading()

    def resume_writing(self):
        self._write_paused = False
        self._update_reading()
        for sub in list(self.subscriptions.values()):
            self._pump(sub)
        self._flush()

    def _update_reading(self):
        want_pause = self._write_paused or self._shutting_down or self._inflight_bytes > PUBLISH_INFLIGHT_HIGH \
            or self.pending_ops > PENDING_OPS_HIGH
        if want_pause and not self._read_paused:
            self._read_paused = True
            self.io.pause_reading()
        elif self._read_paused and not want_pause and self._inflight_bytes <= PUBLISH_INFLIGHT_LOW \
                and self.pending_ops <= PENDING_OPS_LOW:
            self._read_paused = False
            self.io.resume_reading()

    def tick(self, now):
        """Clock tick (seconds): heartbeats both ways, the handshake timeout and the Close timeout."""
        if self.state >= ST_CLOSED:
            return
        if self.state == ST_CLOSING:
            if now >= self._close_deadline:
                self._hard_close()
            return
        if self.state < ST_OPEN:
            if now - self.created > self.broker.handshake_timeout:
                log.info("%s: no Open within %.0f s; closing", self.peer, self.broker.handshake_timeout)
                self._hard_close()
            return
        hb = self.heartbeat
        if hb:
            if now - self.last_recv > 2 * hb:
                log.info("%s: nothing received for %.1f s (heartbeat %d s); closing", self.peer,
                         now - self.last_recv, hb)
                self._hard_close()
            elif now - self.last_sent >= hb:
                self._send(encode_heartbeat())
                self._flush()

    def begin_shutdown(self):
        """Server shutdown, step 1: stop reading; in-flight appends still complete and confirm."""
        self._shutting_down = True
        self._update_reading()

    def close_gracefully(self, reason="server shutdown", code=RC_OK):
        """Send Close and wait (``CLOSE_TIMEOUT``) for the CloseResponse before closing the socket."""
        if self.state >= ST_CLOSING:
            return
        self._send(encode_close(self._next_corr(), code, reason))
        self._flush()
        self.state = ST_CLOSING
        self._close_deadline = self.broker.clock() + CLOSE_TIMEOUT

    def _fatal(self, code, reason):
        """Protocol error: Close with ``code`` and drop the connection (the bytes already queued,
        including the Close, are flushed by the transport before it closes)."""
        log.warning("%s: closing connection: %s (code 0x%02x)", self.peer, reason, code)
        if self.state < ST_CLOSING:
            self._send(encode_close(self._next_corr(), code, reason))
        self._flush()
        self._hard_close()

    def _hard_close(self):
        if self.state >= ST_CLOSED:
            return
        self._flush()
        self.state = ST_CLOSED
        self._release()
        self.io.close()

    def connection_lost(self):
        """The transport is gone (peer closed, reset, or we closed it)."""
        self.state = ST_CLOSED
        self._release()

    def _release(self):
        for sub in list(self.subscriptions.values()):
            self._drop_subscription(sub)
        self.subscriptions.clear()
        self._out = []
        self.broker.unregister(self)

    # -------------------------------------------------------------------------------------- dispatch

    def _dispatch(self, f):
        if len(f) < LEN_KEY_VERSION:
            self._fatal(RC_UNKNOWN_FRAME, f"frame of {len(f)} bytes has no key and version")
            return
        key, version = _KEY_VERSION.unpack_from(f, 0)
        if key == CMD_PUBLISH and self.state == ST_OPEN:
            if version != 1 and version != 2:
                self._fatal(RC_UNKNOWN_FRAME, f"unsupported version {version} of Publish")
                return
            try:
                self._on_publish(f, version)
            except DecodeError as e:
                self._fatal(RC_UNKNOWN_FRAME, f"malformed Publish frame: {e}")
            return
        entry = _COMMANDS.get(key)
        if entry is None:
            self._fatal(RC_UNKNOWN_FRAME, f"unknown command key 0x{key:04x}")
            return
        method, versions, min_state, name = entry
        if version not in versions:
            self._fatal(RC_UNKNOWN_FRAME, f"unsupported version {version} of {name}")
            return
        if self.state == ST_CLOSING and key not in (CMD_CLOSE, CMD_CLOSE | RESPONSE, CMD_HEARTBEAT):
            return  # we are closing: the peer's in-flight requests are moot
        if self.state < min_state:
            self._fatal(RC_ACCESS_REFUSED, f"{name} is not allowed before "
                        f"{'authentication' if self.state == ST_HANDSHAKE else 'Open'}")
            return
        if self.state == ST_OPEN and self.frame_max and len(f) + LEN_SIZE > self.frame_max:
            self._fatal(RC_FRAME_TOO_LARGE, f"{name} frame of {len(f) + LEN_SIZE} bytes is over the "
                        f"negotiated frame_max {self.frame_max}")
            return
        try:
            method(self, f, version)
        except DecodeError as e:
            self._fatal(RC_UNKNOWN_FRAME, f"malformed {name} frame: {e}")

    def _can(self, what, resource):
        return self.user is not None and self.user.can(what, resource)

    # ------------------------------------------------------------------------------------ handshake

    def _on_peer_properties(self, f, version):
        r = Reader(f)
        corr = r.u32()
        self.client_properties = r.properties()
        r.done()
        self._respond(CMD_PEER_PROPERTIES, corr, RC_OK, enc_properties(self.broker.server_properties()))

    def _on_sasl_handshake(self, f, version):
        r = Reader(f)
        corr = r.u32()
        r.done()
        self._respond(CMD_SASL_HANDSHAKE, corr, RC_OK, enc_strings(self.broker.auth.mechanisms()))

    def _on_sasl_authenticate(self, f, version):
        r = Reader(f)
        corr = r.u32()
        mechanism = r.string() or ""
        data = r.bytes_() or b""
        r.done()
        result = self.broker.auth.authenticate(mechanism, data, self.peer_loopback)
        code = _AUTH_CODES[result.outcome]
        if self.state >= ST_TUNING:
            # re-authentication after the handshake (a refreshed secret; RabbitMQ 3.13)
            if mechanism != self.mechanism:
                self._respond(CMD_SASL_AUTHENTICATE, corr, RC_SASL_CANNOT_CHANGE_MECHANISM)
            elif code == RC_OK and result.username != self.username:
                self._respond(CMD_SASL_AUTHENTICATE, corr, RC_SASL_CANNOT_CHANGE_USERNAME)
            elif code == RC_OK:
                self.user = result.user
                self._respond(CMD_SASL_AUTHENTICATE, corr, RC_OK)
            else:
                self._respond(CMD_SASL_AUTHENTICATE, corr, code)
                log.warning("%s: re-authentication of %r failed: %s", self.peer, self.username, result.reason)
                self._hard_close()
            return
        if code == RC_OK:
            self.user = result.user
            self.username = result.username
            self.mechanism = mechanism
            self.state = ST_TUNING
            self._respond(CMD_SASL_AUTHENTICATE, corr, RC_OK)
            self._send(encode_tune(self.broker.frame_max, self.broker.heartbeat))
            return
        self._respond(CMD_SASL_AUTHENTICATE, corr, code)
        if code == RC_SASL_MECHANISM_NOT_SUPPORTED:
            return  # the client may try another mechanism
        log.warning("%s: authentication failed: %s", self.peer, result.reason)
        self._hard_close()

    def _on_tune(self, f, version):
        r = Reader(f)
        frame_max = r.u32()
        heartbeat = r.u32()
        r.done()
        ours = self.broker.frame_max
        self.frame_max = min(frame_max, ours) if frame_max and ours else (frame_max or ours)
        hb = self.broker.heartbeat
        # as RabbitMQ: 0 from one side means "no preference", so the other side's value holds
        self.heartbeat = min(heartbeat, hb) if heartbeat and hb else (heartbeat or hb)

    def _on_open(self, f, version):
        r = Reader(f)
        corr = r.u32()
        vhost = r.string()
        r.done()
        if vhost not in ("/", None, ""):
            self._respond(CMD_OPEN, corr, RC_VIRTUAL_HOST_ACCESS_FAILURE, enc_properties({}))
            log.warning("%s: virtual host %r does not exist", self.peer, vhost)
            self._hard_close()
            return
        self.state = ST_OPEN
        self._max_frame = MAX_PUBLISH_FRAME
        host, port = self.broker.advertised(self.local_host)
        self._respond(CMD_OPEN, corr, RC_OK,
                      enc_properties({"advertised_host": host, "advertised_port": str(port)}))

    def _on_close(self, f, version):
        r = Reader(f)
        corr = r.u32()
        code = r.u16()
        reason = r.string()
        r.done()
        log.debug("%s: client closed (0x%02x %s)", self.peer, code, reason)
        self._respond(CMD_CLOSE, corr, RC_OK)
        self._hard_close()

    def _on_close_response(self, f, version):
        if self.state == ST_CLOSING:
            self._hard_close()

    def _on_heartbeat(self, f, version):
        pass  # data_received already noted the time

    # --------------------------------------------------------------------------------------- streams

    def _on_create(self, f, version):
        r = Reader(f)
        corr = r.u32()
        stream = r.string()
        args = r.properties()
        r.done()
        if not stream:
            self._respond(CMD_CREATE, corr, RC_PRECONDITION_FAILED)
        elif not self._can("configure", stream):
            self._respond(CMD_CREATE, corr, RC_ACCESS_REFUSED)
        elif self.broker.engine.has_stream(stream):
            self._respond(CMD_CREATE, corr, RC_STREAM_ALREADY_EXISTS)
        else:
            self.broker.create_stream(stream, args, self._later(
                lambda exc: self._respond(CMD_CREATE, corr, response_code_for(exc))))

    def _on_delete(self, f, version):
        r = Reader(f)
        corr = r.u32()
        stream = r.string()
        r.done()
        if not stream or not self.broker.engine.has_stream(stream):
            self._respond(CMD_DELETE, corr, RC_STREAM_DOES_NOT_EXIST)
        elif not self._can("configure", stream):
            self._respond(CMD_DELETE, corr, RC_ACCESS_REFUSED)
        else:
            self.broker.delete_stream(stream, self._later(
                lambda exc: self._respond(CMD_DELETE, corr, response_code_for(exc))))

    def _on_metadata(self, f, version):
        r = Reader(f)
        corr = r.u32()
        streams = r.strings()
        r.done()
        host, port = self.broker.advertised(self.local_host)
        has = self.broker.engine.has_stream
        entries = [(s, RC_OK, 0, []) if s and has(s) else (s or "", RC_STREAM_DOES_NOT_EXIST, 0xFFFF, [])
                   for s in streams]
        self._send(encode_metadata_response(corr, [(0, host, port)], entries))

    def stream_deleted(self, stream):
        """The engine deleted ``stream``: drop its subscriptions, orphan its publishers (their Publish
        frames get 0x02 from now on) and send MetadataUpdate 0x06 once. Called by the broker."""
        if self.state >= ST_CLOSED:
            return
        notify = False
        for sub in list(self.subscriptions.values()):
            if sub.stream == stream:
                self._drop_subscription(sub, sac_handover=False)
                del self.subscriptions[sub.sub_id]
                notify = True
        for pub in self.publishers.values():
            if pub.stream == stream and not pub.stream_gone:
                pub.stream_gone = True
                notify = True
        if notify:
            self._send(encode_metadata_update(RC_STREAM_NOT_AVAILABLE, stream))
            self._flush()

    def _on_stream_stats(self, f, version):
        r = Reader(f)
        corr = r.u32()
        stream = r.string()
        r.done()
        if not stream or not self.broker.engine.has_stream(stream):
            self._send(encode_stream_stats(corr, RC_STREAM_DOES_NOT_EXIST, []))
        elif not self._can("read", stream):
            self._send(encode_stream_stats(corr, RC_ACCESS_REFUSED, []))
        else:
            try:
                info = self.broker.engine.stream_info(stream)
            except StreamNotFound:
                self._send(encode_stream_stats(corr, RC_STREAM_DOES_NOT_EXIST, []))
                return
            self._send(encode_stream_stats(corr, RC_OK, [
                ("first_chunk_id", info.first_chunk_id), ("committed_chunk_id", info.committed_chunk_id),
                ("last_chunk_id", info.last_chunk_id)]))

    def _on_exchange_command_versions(self, f, version):
        r = Reader(f)
        corr = r.u32()
        for _ in range(r.count(6)):
            key = r.u16()
            r.u16()                      # the client's min version: we support every v1
            hi = r.u16()
            if key == CMD_DELIVER and hi >= 2:
                self.deliver_version = 2
        r.done()
        self._send(encode_command_versions(corr, SERVER_COMMAND_VERSIONS))

    # ---------------------------------------------------------------------------------- super streams

    def _on_create_super_stream(self, f, version):
        r = Reader(f)
        corr = r.u32()
        name = r.string()
        partitions = r.strings()
        keys = r.strings()
        args = r.properties()
        r.done()
        if not name or not partitions or len(partitions) != len(keys) or not all(partitions) \
                or None in keys or len(set(partitions)) != len(partitions):
            self._respond(CMD_CREATE_SUPER_STREAM, corr, RC_PRECONDITION_FAILED)
        elif not all(self._can("configure", x) for x in [name] + partitions):
            self._respond(CMD_CREATE_SUPER_STREAM, corr, RC_ACCESS_REFUSED)
        else:
            self.broker.create_super_stream(name, partitions, keys, args, self._later(
                lambda code: self._respond(CMD_CREATE_SUPER_STREAM, corr, code)))

    def _on_delete_super_stream(self, f, version):
        r = Reader(f)
        corr = r.u32()
        name = r.string()
        r.done()
        parts = self.broker.partitions(name or "")
        if parts is None:
            self._respond(CMD_DELETE_SUPER_STREAM, corr, RC_STREAM_DOES_NOT_EXIST)
        elif not all(self._can("configure", x) for x in [name] + parts):
            self._respond(CMD_DELETE_SUPER_STREAM, corr, RC_ACCESS_REFUSED)
        else:
            self.broker.delete_super_stream(name, self._later(
                lambda code: self._respond(CMD_DELETE_SUPER_STREAM, corr, code)))

    def _on_route(self, f, version):
        r = Reader(f)
        corr = r.u32()
        routing_key = r.string()
        super_stream = r.string()
        r.done()
        streams = self.broker.route(super_stream or "", routing_key)
        code = RC_OK if streams is not None else RC_STREAM_DOES_NOT_EXIST
        self._respond(CMD_ROUTE, corr, code, enc_strings(streams or []))

    def _on_partitions(self, f, version):
        r = Reader(f)
        corr = r.u32()
        super_stream = r.string()
        r.done()
        streams = self.broker.partitions(super_stream or "")
        code = RC_OK if streams is not None else RC_STREAM_DOES_NOT_EXIST
        self._respond(CMD_PARTITIONS, corr, code, enc_strings(streams or []))

    # ------------------------------------------------------------------------------------ publishing

    def _on_declare_publisher(self, f, version):
        r = Reader(f)
        corr = r.u32()
        publisher_id = r.u8()
        reference = r.string()
        stream = r.string()
        r.done()
        if publisher_id in self.publishers:
            code = RC_PRECONDITION_FAILED
        elif reference and len(reference.encode("utf-8")) > MAX_REFERENCE:
            code = RC_PRECONDITION_FAILED
        elif not stream or not self.broker.engine.has_stream(stream):
            code = RC_STREAM_DOES_NOT_EXIST
        elif not self._can("write", stream):
            code = RC_ACCESS_REFUSED
        elif reference and any(p.reference == reference and p.stream == stream and not p.stream_gone
                               for p in self.publishers.values()):
            code = RC_PRECONDITION_FAILED
        else:
            self.publishers[publisher_id] = _Publisher(publisher_id, stream, reference)
            code = RC_OK
        self._respond(CMD_DECLARE_PUBLISHER, corr, code)

    def _on_delete_publisher(self, f, version):
        r = Reader(f)
        corr = r.u32()
        publisher_id = r.u8()
        r.done()
        code = RC_OK if self.publishers.pop(publisher_id, None) is not None else RC_PUBLISHER_DOES_NOT_EXIST
        self._respond(CMD_DELETE_PUBLISHER, corr, code)

    def _on_query_publisher_sequence(self, f, version):
        self._tracking_query(f, CMD_QUERY_PUBLISHER_SEQUENCE, None, self.broker.query_publisher_sequence)

    def _tracking_query(self, f, cmd, permission, query):
        """QueryOffset and QueryPublisherSequence: ``corr | reference | stream`` answered with ``code |
        u64``; a value of None (no offset stored) is code 0x13."""
        r = Reader(f)
        corr = r.u32()
        reference = r.string() or ""
        stream = r.string()
        r.done()
        if not stream or not self.broker.engine.has_stream(stream):
            self._respond(cmd, corr, RC_STREAM_DOES_NOT_EXIST, _U64.pack(0))
            return
        if permission is not None and not self._can(permission, stream):
            self._respond(cmd, corr, RC_ACCESS_REFUSED, _U64.pack(0))
            return

        def answer(value, exc):
            if exc is not None:
                self._respond(cmd, corr, response_code_for(exc), _U64.pack(0))
            elif value is None:
                self._respond(cmd, corr, RC_NO_OFFSET, _U64.pack(0))
            else:
                self._respond(cmd, corr, RC_OK, _U64.pack(value & 0xFFFFFFFFFFFFFFFF))
        query(stream, reference, self._later(answer))

    def _on_publish(self, f, version):
        if version == 1:
            self._on_publish_v1(f)
        else:
            self._publish_batch(decode_publish(f, version))

    def _on_publish_v1(self, f):
        """The hot path: one compiled pass turns the frame into a sealed chunk (CRC included) and the raw
        publishing ids, so nothing here is per message unless a sub-batch or the publisher is bad."""
        try:
            publisher_id, count, chunk, raw_ids, first, last, increasing, records, subs = core.publish_chunk(f)
        except FrameError as e:
            raise DecodeError(e.reason) from None
        pub = self.publishers.get(publisher_id)
        if pub is None or pub.stream_gone or count == 0:
            self._publish_batch(decode_publish(f, 1))   # errors for every id (or nothing to do)
            return
        if subs:
            mv = memoryview(f)
            if any(check_sub_batch(flags, nrec, usize, mv[a:b]) is not None for _, flags, nrec, usize, a, b in subs):
                # rare: the general path drops the refused sub-batches and reports why
                self._publish_batch(decode_publish(f, 1))
                return
        size = len(chunk) - fmt.LEN_CHUNK_HEADER
        self._inflight_bytes += size
        ids = PublishingIds(raw_ids, first, last, increasing)

        def done(result, exc):
            self._inflight_bytes -= size
            if exc is None:
                # the confirm body is the ids as they came in: header, then the raw bytes, unjoined
                self._send(_CONFIRM_HEAD.pack(9 + len(raw_ids), CMD_PUBLISH_CONFIRM, 1, publisher_id, count))
                self._send(raw_ids)
            else:
                code = response_code_for(exc)
                if code == RC_INTERNAL_ERROR:
                    log.error("%s: append to %r failed: %r", self.peer, pub.stream, exc)
                self._send(encode_publish_error(publisher_id, [(i, code) for i in ids]))

        self.broker.append_chunk(pub.stream, chunk, ids if pub.reference else None, pub.reference,
                                 self._later(done), count, records)
        if self._inflight_bytes > PUBLISH_INFLIGHT_HIGH:
            self._update_reading()

    def _publish_batch(self, batch):
        """Publish v2, and v1 frames the fast path hands over (refused sub-batches, unknown publisher)."""
        pub = self.publishers.get(batch.publisher_id)
        ids = batch.ids
        if pub is None or pub.stream_gone:
            if ids:
                code = RC_PUBLISHER_DOES_NOT_EXIST if pub is None else RC_STREAM_DOES_NOT_EXIST
                self._send(encode_publish_error(batch.publisher_id, [(i, code) for i in ids]))
            return
        parts = batch.parts
        filters = batch.filters
        records = len(ids)
        if batch.sub_batches:
            bad = {}
            for idx, flags, nrec, usize, body in batch.sub_batches:
                why = check_sub_batch(flags, nrec, usize, body)
                if why is not None:
                    bad[idx] = why
                else:
                    records += nrec - 1
            if bad:
                log.warning("%s: refusing %d sub-batch(es) from publisher %d: %s", self.peer, len(bad),
                            batch.publisher_id, next(iter(bad.values())))
                self._send(encode_publish_error(batch.publisher_id,
                                                [(ids[i], RC_PRECONDITION_FAILED) for i in sorted(bad)]))
                keep = [i for i in range(len(ids)) if i not in bad]
                parts = [parts[i] for i in keep]
                ids = [ids[i] for i in keep]
                records -= len(bad)
        if not parts:
            return
        data = b"".join(parts)
        size = len(data)
        self._inflight_bytes += size
        publisher_id = batch.publisher_id

        def done(result, exc):
            self._inflight_bytes -= size
            if exc is None:
                self._send(encode_publish_confirm(publisher_id, ids))
            else:
                code = response_code_for(exc)
                if code == RC_INTERNAL_ERROR:
                    log.error("%s: append to %r failed: %r", self.peer, pub.stream, exc)
                self._send(encode_publish_error(publisher_id, [(i, code) for i in ids]))

        # the entry and record counts are exact (every entry was parsed and every sub-batch checked),
        # which spares the writer a walk over the data section
        self.broker.append(pub.stream, data, ids if pub.reference else None, pub.reference, filters,
                           self._later(done), len(ids), records)
        if self._inflight_bytes > PUBLISH_INFLIGHT_HIGH:
            self._update_reading()

    # ------------------------------------------------------------------------------------- consuming

    def _on_subscribe(self, f, version):
        r = Reader(f)
        corr = r.u32()
        sub_id = r.u8()
        stream = r.string()
        spec = decode_offset_spec(r)
        credit = r.u16()
        props = r.properties()
        r.done()
        if sub_id in self.subscriptions:
            self._respond(CMD_SUBSCRIBE, corr, RC_SUBSCRIPTION_ID_ALREADY_EXISTS)
            return
        if not stream or not self.broker.engine.has_stream(stream):
            self._respond(CMD_SUBSCRIBE, corr, RC_STREAM_DOES_NOT_EXIST)
            return
        if not self._can("read", stream):
            self._respond(CMD_SUBSCRIBE, corr, RC_ACCESS_REFUSED)
            return
        sac = _truthy(props.get("single-active-consumer"))
        name = props.get("name")
        if sac and not name:
            self._respond(CMD_SUBSCRIBE, corr, RC_PRECONDITION_FAILED)
            return
        filters = _filter_values(props)
        sub = _Subscription(sub_id, stream, credit, spec, filters, _truthy(props.get("match-unfiltered")))
        try:
            sub.offset = self.broker.resolve(stream, *spec)
        except RiverbedError as e:
            self._respond(CMD_SUBSCRIBE, corr, response_code_for(e))
            return
        self.subscriptions[sub_id] = sub
        self._respond(CMD_SUBSCRIBE, corr, RC_OK)
        if sac:
            sub.sac = SAC_WAITING
            sub.sac_name = name
            self.broker.sac_register(stream, name, self, sub, props.get("super-stream"))
        else:
            self._pump(sub)

    def sac_activate(self, sub):
        """Make ``sub`` the active consumer of its group: ConsumerUpdate(active) goes out and delivery
        starts once the client answers with the offset to start from. Called by the broker."""
        if sub.gone or self.state >= ST_CLOSING:
            return
        sub.sac = SAC_ACTIVATING
        corr = self._next_corr()
        self._pending_updates[corr] = sub.sub_id
        self._send(encode_consumer_update(corr, sub.sub_id, True))
        self._flush()

    def sac_step_down(self, sub):
        """Stop delivering to ``sub`` and tell the client (ConsumerUpdate inactive); the broker moves the
        group on once the client answers. Called by the broker on a super stream rebalance."""
        if sub.gone or self.state >= ST_CLOSING:
            return
        sub.sac = SAC_STEPPING_DOWN
        if sub.cancel_wait is not None:
            sub.cancel_wait()
            sub.cancel_wait = None
        corr = self._next_corr()
        self._pending_updates[corr] = sub.sub_id
        self._send(encode_consumer_update(corr, sub.sub_id, False))
        self._flush()

    def _on_consumer_update_response(self, f, version):
        r = Reader(f)
        corr = r.u32()
        code = r.u16()
        spec = decode_offset_spec(r, allow_none=True) if r.pos < r.end else (OFFSET_TYPE_NONE, None)
        # no r.done(): rstream always appends a u64 offset, even for types that take none
        sub_id = self._pending_updates.pop(corr, None)
        sub = self.subscriptions.get(sub_id) if sub_id is not None else None
        if sub is None:
            return
        if sub.sac == SAC_STEPPING_DOWN:
            sub.sac = SAC_WAITING
            self.broker.sac_stepped_down(sub.stream, sub.sac_name, self, sub)
            return
        if sub.sac != SAC_ACTIVATING:
            return
        if code != RC_OK or spec[0] == OFFSET_TYPE_NONE:
            spec = sub.spec
        try:
            sub.offset = self.broker.resolve(sub.stream, *spec)
        except RiverbedError as e:
            log.warning("%s: cannot resolve the activation offset %r of %r: %s", self.peer, spec, sub.stream, e)
            return
        sub.sac = SAC_ACTIVE
        self._pump(sub)

    def _on_credit(self, f, version):
        if len(f) != LEN_KEY_VERSION + 3:
            raise DecodeError("Credit frame is not 3 bytes")
        sub_id, credit = _CREDIT.unpack_from(f, LEN_KEY_VERSION)
        sub = self.subscriptions.get(sub_id)
        if sub is None:
            self._send(encode_credit_response(RC_SUBSCRIPTION_ID_DOES_NOT_EXIST, sub_id))
            return
        sub.credit += credit
        if sub.sac == SAC_WAITING or sub.sac == SAC_STEPPING_DOWN:
            self._send(encode_credit_response(RC_PRECONDITION_FAILED, sub_id))
            return
        self._pump(sub)

    def _on_unsubscribe(self, f, version):
        r = Reader(f)
        corr = r.u32()
        sub_id = r.u8()
        r.done()
        sub = self.subscriptions.pop(sub_id, None)
        if sub is None:
            self._respond(CMD_UNSUBSCRIBE, corr, RC_SUBSCRIPTION_ID_DOES_NOT_EXIST)
            return
        self._drop_subscription(sub)
        self._respond(CMD_UNSUBSCRIBE, corr, RC_OK)

    def _drop_subscription(self, sub, sac_handover=True):
        sub.gone = True
        if sub.cancel_wait is not None:
            sub.cancel_wait()
            sub.cancel_wait = None
        if sub.sac != SAC_NONE and sac_handover:
            self.broker.sac_unregister(sub.stream, sub.sac_name, self, sub)

    def _pump(self, sub):
        """Deliver chunks to ``sub`` while it has credit, the transport takes data, and the stream has
        committed chunks past ``sub.offset``; then arm an engine watch for the next chunk. One credit per
        chunk; chunks a filter rules out, and non-user chunks, are skipped without using credit."""
        if sub.gone or not sub.delivering or self.state != ST_OPEN:
            return
        broker = self.broker
        budget = DELIVER_BUDGET
        committed = 0
        if self.deliver_version == 2:
            committed = broker.committed_chunk_id(sub.stream)
        while sub.credit > 0 and not self._write_paused:
            if budget <= 0:
                if not sub.pump_scheduled:
                    sub.pump_scheduled = True
                    self.io.defer(self._deferred_pump, sub)
                return
            try:
                chunks = broker.read_chunks(sub.stream, sub.offset, min(sub.credit, budget)
                                            if not sub.filters else budget)
            except StreamNotFound:
                return  # the delete listener sends MetadataUpdate and drops the subscription
            except ChunkError as e:
                log.error("%s: %s; closing the connection rather than skipping data", self.peer, e)
                self._fatal(RC_INTERNAL_ERROR, f"corrupt chunk in stream {sub.stream!r}")
                return
            if not chunks:
                self._arm_wait(sub)
                return
            for chunk_id, raw in chunks:
                budget -= 1
                records = _U32.unpack_from(raw, 4)[0]
                sub.offset = chunk_id + (records or 1)
                if raw[1] != fmt.CHUNK_USER:
                    continue
                if sub.filters:
                    bloom = raw[44]
                    if not core.bloom_match(raw[48:48 + bloom] if bloom else b"", sub.filters,
                                            sub.match_unfiltered):
                        continue
                data_len, parts = deliver_parts(raw)
                self._flush()
                parts.insert(0, encode_deliver_prefix(sub.sub_id, data_len, self.deliver_version, committed))
                self.io.writelines(parts)
                self.last_sent = broker.clock()
                sub.credit -= 1
                if sub.credit <= 0 or self._write_paused:
                    break

    def _deferred_pump(self, sub):
        sub.pump_scheduled = False
        if self.state == ST_OPEN:
            self._pump(sub)
            self._flush()

    def _arm_wait(self, sub):
        if sub.cancel_wait is not None:
            return

        def woke(exc):
            if sub.gone or self.state != ST_OPEN:
                return
            sub.cancel_wait = None
            if exc is None:
                self._pump(sub)
                self._flush()
        sub.cancel_wait = self.broker.watch(sub.stream, sub.offset, woke)

    # -------------------------------------------------------------------------------------- offsets

    def _on_store_offset(self, f, version):
        r = Reader(f)
        reference = r.string()
        stream = r.string()
        offset = r.u64()
        r.done()
        # StoreOffset has no reply by design; a bad one is dropped (and logged)
        if not reference or len(reference.encode("utf-8")) > MAX_REFERENCE or not stream:
            log.info("%s: StoreOffset with an empty or over-long reference ignored", self.peer)
        elif not self._can("read", stream):
            log.info("%s: StoreOffset on %r refused (no read permission)", self.peer, stream)
        elif self.broker.engine.has_stream(stream):
            self.broker.store_offset(stream, reference, offset, self._later(lambda exc: None))

    def _on_query_offset(self, f, version):
        self._tracking_query(f, CMD_QUERY_OFFSET, "read", self.broker.query_offset)

    def _on_resolve_offset_spec(self, f, version):
        r = Reader(f)
        corr = r.u32()
        stream = r.string()
        spec = decode_offset_spec(r)
        props = r.properties()
        r.done()
        if not stream or not self.broker.engine.has_stream(stream):
            self._respond(CMD_RESOLVE_OFFSET_SPEC, corr, RC_STREAM_DOES_NOT_EXIST, struct.pack(">HQ", 4, 0))
            return
        if not self._can("read", stream):
            self._respond(CMD_RESOLVE_OFFSET_SPEC, corr, RC_ACCESS_REFUSED, struct.pack(">HQ", 4, 0))
            return
        try:
            offset = self.broker.resolve(stream, *spec)
            filters = _filter_values(props)
            if filters:
                offset = self.broker.first_matching_chunk(stream, offset, filters,
                                                          _truthy(props.get("match-unfiltered")))
        except RiverbedError as e:
            self._respond(CMD_RESOLVE_OFFSET_SPEC, corr, response_code_for(e), struct.pack(">HQ", 4, 0))
            return
        self._respond(CMD_RESOLVE_OFFSET_SPEC, corr, RC_OK, struct.pack(">HQ", OFFSET_TYPE_OFFSET, offset))


def _filter_values(props):
    """``filter.N`` subscription properties, in N order, as UTF-8 bytes."""
    found = []
    for k, v in props.items():
        if k.startswith("filter.") and v is not None:
            suffix = k[7:]
            found.append((int(suffix) if suffix.isdigit() else 1 << 30, k, v.encode("utf-8")))
    return [v for _, _, v in sorted(found)]


# key -> (method, accepted versions, lowest state, name)
_COMMANDS = {
    CMD_PEER_PROPERTIES: (RmqStreamSession._on_peer_properties, (1,), ST_HANDSHAKE, "PeerProperties"),
    CMD_SASL_HANDSHAKE: (RmqStreamSession._on_sasl_handshake, (1,), ST_HANDSHAKE, "SaslHandshake"),
    CMD_SASL_AUTHENTICATE: (RmqStreamSession._on_sasl_authenticate, (1,), ST_HANDSHAKE, "SaslAuthenticate"),
    CMD_TUNE: (RmqStreamSession._on_tune, (1,), ST_TUNING, "Tune"),
    CMD_OPEN: (RmqStreamSession._on_open, (1,), ST_TUNING, "Open"),
    CMD_CLOSE: (RmqStreamSession._on_close, (1,), ST_HANDSHAKE, "Close"),
    CMD_CLOSE | RESPONSE: (RmqStreamSession._on_close_response, (1,), ST_HANDSHAKE, "CloseResponse"),
    CMD_HEARTBEAT: (RmqStreamSession._on_heartbeat, (1,), ST_HANDSHAKE, "Heartbeat"),
    CMD_DECLARE_PUBLISHER: (RmqStreamSession._on_declare_publisher, (1,), ST_OPEN, "DeclarePublisher"),
    CMD_PUBLISH: (None, (1, 2), ST_OPEN, "Publish"),   # handled before the table (hot path)
    CMD_QUERY_PUBLISHER_SEQUENCE: (RmqStreamSession._on_query_publisher_sequence, (1,), ST_OPEN,
                                   "QueryPublisherSequence"),
    CMD_DELETE_PUBLISHER: (RmqStreamSession._on_delete_publisher, (1,), ST_OPEN, "DeletePublisher"),
    CMD_SUBSCRIBE: (RmqStreamSession._on_subscribe, (1,), ST_OPEN, "Subscribe"),
    CMD_CREDIT: (RmqStreamSession._on_credit, (1,), ST_OPEN, "Credit"),
    CMD_STORE_OFFSET: (RmqStreamSession._on_store_offset, (1,), ST_OPEN, "StoreOffset"),
    CMD_QUERY_OFFSET: (RmqStreamSession._on_query_offset, (1,), ST_OPEN, "QueryOffset"),
    CMD_UNSUBSCRIBE: (RmqStreamSession._on_unsubscribe, (1,), ST_OPEN, "Unsubscribe"),
    CMD_CREATE: (RmqStreamSession._on_create, (1,), ST_OPEN, "Create"),
    CMD_DELETE: (RmqStreamSession._on_delete, (1,), ST_OPEN, "Delete"),
    CMD_METADATA: (RmqStreamSession._on_metadata, (1,), ST_OPEN, "Metadata"),
    CMD_ROUTE: (RmqStreamSession._on_route, (1,), ST_OPEN, "Route"),
    CMD_PARTITIONS: (RmqStreamSession._on_partitions, (1,), ST_OPEN, "Partitions"),
    CMD_CONSUMER_UPDATE | RESPONSE: (RmqStreamSession._on_consumer_update_response, (1,), ST_OPEN,
                                     "ConsumerUpdateResponse"),
    CMD_EXCHANGE_COMMAND_VERSIONS: (RmqStreamSession._on_exchange_command_versions, (1,), ST_OPEN,
                                    "ExchangeCommandVersions"),
    CMD_STREAM_STATS: (RmqStreamSession._on_stream_stats, (1,), ST_OPEN, "StreamStats"),
    CMD_CREATE_SUPER_STREAM: (RmqStreamSession._on_create_super_stream, (1,), ST_OPEN, "CreateSuperStream"),
    CMD_DELETE_SUPER_STREAM: (RmqStreamSession._on_delete_super_stream, (1,), ST_OPEN, "DeleteSuperStream"),
    CMD_RESOLVE_OFFSET_SPEC: (RmqStreamSession._on_resolve_offset_spec, (1,), ST_OPEN, "ResolveOffsetSpec"),
}


# ========================================================================================== handler

SUPER_STREAMS_FILE = "rmq-super-streams.json"

_SPEC_BUILDERS = {
    OFFSET_TYPE_FIRST: lambda v: OffsetSpec.first(),
    OFFSET_TYPE_LAST: lambda v: OffsetSpec.last(),
    OFFSET_TYPE_NEXT: lambda v: OffsetSpec.next(),
    OFFSET_TYPE_OFFSET: OffsetSpec.offset,
    OFFSET_TYPE_TIMESTAMP: OffsetSpec.timestamp,
}


class SuperStreamStore:
    """Super stream definitions (name -> partitions in order, binding keys, arguments), kept in a
    JSON file next to the LMDB environment and replaced atomically on every change. The engine has no
    metadata table for them; partitions themselves are ordinary streams. Loop-thread only."""

    def __init__(self, path=None):
        self.path = path
        self._defs = {}
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self._defs = json.load(f).get("super_streams", {})

    def get(self, name):
        return self._defs.get(name)

    def put(self, name, partitions, binding_keys, arguments):
        self._defs[name] = {"partitions": list(partitions), "binding_keys": list(binding_keys),
                            "arguments": dict(arguments)}
        self._save()

    def remove(self, name):
        if self._defs.pop(name, None) is not None:
            self._save()

    def _save(self):
        if not self.path:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"super_streams": self._defs}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class _SacGroup:
    __slots__ = ("members", "active", "stepping_down", "partition_index")

    def __init__(self, partition_index):
        self.members = []            # [(session, subscription)] in arrival order
        self.active = None           # the member delivering (or being activated)
        self.stepping_down = None    # the member told to step down, until it answers
        self.partition_index = partition_index   # -1: not a super stream partition


class RmqBroker:
    """The handler between RabbitMQ Stream sessions and the engine, shared by all connections of one
    listener: authentication, stream admin, super streams, single-active-consumer groups, and the
    read-your-writes barriers for offsets and publisher sequences.

    Loop-thread only, except that engine completions arrive on the writer thread and are handed to the
    loop through ``post(fn, *args)`` (``loop.call_soon_threadsafe`` in the server; a queue in tests).
    Callbacks given to its methods always run on the loop thread, possibly before the method returns
    (``query_*``), never in the middle of another callback.
    """

    def __init__(self, engine, *, post, auth=None, clock=time.monotonic, data_dir=None,
                 advertised_host=None, advertised_port=None, frame_max=DEFAULT_FRAME_MAX,
                 heartbeat=DEFAULT_HEARTBEAT, handshake_timeout=DEFAULT_HANDSHAKE_TIMEOUT):
        self.engine = engine
        self.post = post
        self.auth = auth or _auth.Authenticator()
        self.clock = clock
        self.advertised_host = advertised_host
        self.advertised_port = advertised_port
        self.listen_host = None
        self.listen_port = None
        self.frame_max = frame_max
        self.heartbeat = heartbeat
        self.handshake_timeout = handshake_timeout
        self.sessions = set()
        self.super_streams = SuperStreamStore(os.path.join(data_dir, SUPER_STREAMS_FILE) if data_dir else None)
        self._sac = {}             # (stream, name) -> [(session, subscription)], the first is active
        self._offset_writes = {}   # (stream, reference) -> [in-flight count, waiting callbacks]
        self._seq_writes = {}      # (stream, publisher) -> [in-flight count, waiting callbacks]
        self._closed = False
        engine.add_delete_listener(self._deleted_on_writer)

    def close(self):
        """Detach from the engine's delete notifications (the listener stays registered but idle)."""
        self._closed = True

    def _post(self, fn, *args):
        if self._closed:
            return
        try:
            self.post(fn, *args)
        except RuntimeError:  # the loop is closed: the process is stopping, nobody waits for this
            pass

    def _then(self, fut, cb):
        """Run ``cb(result, exc)`` on the loop thread once ``fut`` completes."""
        def done(f):
            try:
                res, exc = f.result(), None
            except BaseException as e:  # the engine reports every failure through the future
                res, exc = None, e
            self._post(cb, res, exc)
        fut.add_done_callback(done)

    # ------------------------------------------------------------------------------ sessions, config

    def register(self, session):
        self.sessions.add(session)

    def unregister(self, session):
        self.sessions.discard(session)

    def server_properties(self):
        return {"product": PRODUCT, "version": VERSION, "cluster_name": "riverbed",
                "platform": f"Python {platform.python_version()}",
                "copyright": "Copyright (c) the Riverbed authors",
                "information": "Licensed under the Apache 2.0 license, see https://www.apache.org/licenses/"}

    def advertised(self, local_host=None):
        """``(host, port)`` for OpenResponse and Metadata: the configured advertised address, else the
        address the client reached us on (always reachable by that client), else the listen address."""
        host = self.advertised_host or local_host or self.listen_host or "localhost"
        if host.startswith("::ffff:") and "." in host:
            host = host[7:]
        return host, self.advertised_port or self.listen_port or 5552

    # ----------------------------------------------------------------------------------- stream admin

    def create_stream(self, name, arguments, cb):
        """``cb(exc)`` once created (exc None) or refused."""
        try:
            fut = self.engine.create_stream(name, arguments)
        except RiverbedError as e:
            cb(e)
            return
        self._then(fut, lambda res, exc: cb(exc))

    def delete_stream(self, name, cb):
        """``cb(exc)``. Sessions hear about the deletion from the engine's delete listener."""
        try:
            fut = self.engine.delete_stream(name)
        except RiverbedError as e:
            cb(e)
            return
        self._then(fut, lambda res, exc: cb(exc))

    def _deleted_on_writer(self, name):
        self._post(self.stream_deleted, name)

    def stream_deleted(self, name):
        """Tell every session (MetadataUpdate) and forget the stream's SAC groups."""
        for key in [k for k in self._sac if k[0] == name]:
            del self._sac[key]
        for s in list(self.sessions):
            s.stream_deleted(name)

    # -------------------------------------------------------------------------------- reads, waiting

    def resolve(self, stream, offset_type, value=None):
        """The offset a subscription with this spec starts at. Raises StreamNotFound, InvalidArgument."""
        build = _SPEC_BUILDERS.get(offset_type)
        if build is None:
            raise InvalidArgument(f"offset type {offset_type}")
        return self.engine.resolve(stream, build(value))

    def read_chunks(self, stream, offset, n):
        return self.engine.read_chunks(stream, offset, n)

    def committed_chunk_id(self, stream):
        try:
            return self.engine.committed_chunk_id(stream)
        except StreamNotFound:
            return 0

    def watch(self, stream, offset, cb):
        """``cb(exc)`` on the loop thread once a committed chunk holds ``offset`` (exc None), or the
        stream is deleted (StreamNotFound). Returns a cancel function."""
        return self.engine.watch(stream, offset, lambda exc: self._post(cb, exc))

    def first_matching_chunk(self, stream, offset, filters, match_unfiltered):
        """The id of the first user chunk at or after ``offset`` whose bloom filter may match, or the
        stream's next offset when none does."""
        pos = offset
        while True:
            chunks = self.engine.read_chunks(stream, pos, 64)
            if not chunks:
                return self.engine.resolve(stream, OffsetSpec.next())
            for chunk_id, raw in chunks:
                bloom = raw[44]
                if raw[1] == fmt.CHUNK_USER and core.bloom_match(raw[48:48 + bloom] if bloom else b"", filters,
                                                                 match_unfiltered):
                    return chunk_id
                pos = chunk_id + (_U32.unpack_from(raw, 4)[0] or 1)

    # ------------------------------------------------------------------------ appends and tracking

    @staticmethod
    def _barrier_enter(table, key):
        entry = table.get(key)
        if entry is None:
            entry = table[key] = [0, []]
        entry[0] += 1

    @staticmethod
    def _barrier_leave(table, key):
        entry = table[key]
        entry[0] -= 1
        if entry[0] == 0:
            del table[key]
            for fn in entry[1]:
                fn()

    def append(self, stream, data, ids, publisher, filters, cb, num_entries=None, num_records=None):
        """Append a data section; ``cb(AppendResult, exc)`` after the commit. ``num_entries`` and
        ``num_records``, when given, must be exact."""
        try:
            fut = self.engine.append_entries(stream, data, publishing_ids=ids, publisher=publisher,
                                             filter_values=filters, num_entries=num_entries,
                                             num_records=num_records)
        except RiverbedError as e:
            cb(None, e)
            return
        self._appended(fut, stream, publisher, cb)

    def append_chunk(self, stream, chunk, ids, publisher, cb, num_entries, num_records):
        """Append a sealed chunk (core.publish_chunk); ``cb(AppendResult, exc)`` after the commit. The
        counts must be exact; the chunk belongs to the engine from here on."""
        try:
            fut = self.engine.append_chunk(stream, chunk, num_entries=num_entries, num_records=num_records,
                                           publishing_ids=ids, publisher=publisher)
        except RiverbedError as e:
            cb(None, e)
            return
        self._appended(fut, stream, publisher, cb)

    def _appended(self, fut, stream, publisher, cb):
        # a named publisher's in-flight appends hold back QueryPublisherSequence (read-your-writes)
        key = (stream, publisher) if publisher else None
        if key is None:
            self._then(fut, cb)
            return
        self._barrier_enter(self._seq_writes, key)

        def done(res, exc):
            self._barrier_leave(self._seq_writes, key)
            cb(res, exc)
        self._then(fut, done)

    def query_publisher_sequence(self, stream, publisher, cb):
        """``cb(sequence, exc)``, after this process's in-flight appends of that publisher commit."""
        self._after_writes(self._seq_writes, (stream, publisher),
                           lambda: self.engine.query_publisher_sequence(stream, publisher), cb)

    @staticmethod
    def _after_writes(table, key, read, cb):
        # read-your-writes: answer ``cb(read(), None)`` once the writes in flight under ``key`` commit
        def answer():
            try:
                cb(read(), None)
            except RiverbedError as e:
                cb(None, e)
        entry = table.get(key)
        if entry is None:
            answer()
        else:
            entry[1].append(answer)

    def store_offset(self, stream, reference, offset, cb=None):
        """Store a consumer offset; ``cb(exc)`` after the commit. There is no reply in the protocol, so
        failures are only logged."""
        key = (stream, reference)
        try:
            fut = self.engine.store_offset(stream, reference, offset)
        except RiverbedError as e:
            log.info("StoreOffset %r on %r refused: %s", reference, stream, e)
            if cb is not None:
                cb(e)
            return
        self._barrier_enter(self._offset_writes, key)

        def done(res, exc):
            self._barrier_leave(self._offset_writes, key)
            if exc is not None:
                log.info("StoreOffset %r on %r failed: %s", reference, stream, exc)
            if cb is not None:
                cb(exc)
        self._then(fut, done)

    def query_offset(self, stream, reference, cb):
        """``cb(offset or None, exc)``, after in-flight StoreOffsets of that reference commit, so a
        client reads back what it (or a consumer it replaced) just stored."""
        self._after_writes(self._offset_writes, (stream, reference),
                           lambda: self.engine.query_offset(stream, reference), cb)

    # --------------------------------------------------------------------- single active consumer
    #
    # A group is (stream, name). On a plain stream the first member (in arrival order) is active until
    # it leaves. On a partition of a super stream (the subscription names it in ``super-stream``), the
    # active member is members[partition index mod N], as RabbitMQ spreads partitions over the
    # instances of an application: when a join or leave moves that choice, the current active member
    # is first told to step down (ConsumerUpdate inactive) and the new one is activated only after the
    # old one has answered, so two members are never active at once.

    def sac_register(self, stream, name, session, sub, super_stream=None):
        """Join the group ``(stream, name)``; the chosen member gets ``session.sac_activate(sub)``."""
        group = self._sac.get((stream, name))
        if group is None:
            index = -1
            parts = self.partitions(super_stream) if super_stream else None
            if parts and stream in parts:
                index = parts.index(stream)
            group = self._sac[(stream, name)] = _SacGroup(index)
        group.members.append((session, sub))
        self._sac_rebalance(group)

    def sac_unregister(self, stream, name, session, sub):
        """Leave the group; a new active member is chosen when needed."""
        key = (stream, name)
        group = self._sac.get(key)
        if group is None:
            return
        group.members = [m for m in group.members if m[1] is not sub]
        if group.active is not None and group.active[1] is sub:
            group.active = None
        if group.stepping_down is not None and group.stepping_down[1] is sub:
            group.stepping_down = None
        if not group.members:
            del self._sac[key]
            return
        self._sac_rebalance(group)

    def sac_stepped_down(self, stream, name, session, sub):
        """The member told to step down has answered: activate the member that should now be active."""
        group = self._sac.get((stream, name))
        if group is not None and group.stepping_down is not None and group.stepping_down[1] is sub:
            group.stepping_down = None
            self._sac_rebalance(group)

    def _sac_rebalance(self, group):
        if not group.members or group.stepping_down is not None:
            return
        if group.partition_index >= 0:
            want = group.members[group.partition_index % len(group.members)]
        else:
            want = group.active if group.active is not None else group.members[0]
        if group.active is None:
            group.active = want
            want[0].sac_activate(want[1])
        elif group.active[1] is not want[1]:
            group.stepping_down, group.active = group.active, None
            group.stepping_down[0].sac_step_down(group.stepping_down[1])

    # -------------------------------------------------------------------------------- super streams

    def partitions(self, name):
        """Partition stream names in order, or None when there is no such super stream."""
        d = self.super_streams.get(name)
        return list(d["partitions"]) if d else None

    def route(self, name, routing_key):
        """Partitions whose binding key equals ``routing_key`` ([] when none), or None when there is
        no such super stream."""
        d = self.super_streams.get(name)
        if d is None:
            return None
        return [p for p, k in zip(d["partitions"], d["binding_keys"]) if k == routing_key]

    def create_super_stream(self, name, partitions, binding_keys, arguments, cb):
        """Create the partition streams, then record the super stream; ``cb(response code)``. If a
        partition cannot be created, the ones that were are deleted again."""
        if self.super_streams.get(name) is not None or any(self.engine.has_stream(p) for p in partitions):
            cb(RC_STREAM_ALREADY_EXISTS)
            return
        futs = []
        try:
            for p in partitions:
                futs.append((p, self.engine.create_stream(p, arguments)))
        except RiverbedError as e:
            for p, f in futs:
                self._then(f, lambda res, exc, p=p: exc is None and self.engine.delete_stream(p))
            cb(response_code_for(e))
            return
        results = {}

        def one_done(p, exc):
            results[p] = exc
            if len(results) < len(futs):
                return
            errors = [e for e in results.values() if e is not None]
            if errors:
                for q, e in results.items():
                    if e is None:
                        self.engine.delete_stream(q)
                cb(response_code_for(errors[0]))
                return
            try:
                self.super_streams.put(name, partitions, binding_keys, arguments)
            except OSError as e:
                log.error("cannot record super stream %r: %s", name, e)
                cb(RC_INTERNAL_ERROR)
                return
            cb(RC_OK)

        for p, f in futs:
            self._then(f, lambda res, exc, p=p: one_done(p, exc))

    def delete_super_stream(self, name, cb):
        """Forget the super stream and delete its partitions; ``cb(response code)``."""
        d = self.super_streams.get(name)
        if d is None:
            cb(RC_STREAM_DOES_NOT_EXIST)
            return
        try:
            self.super_streams.remove(name)
        except OSError as e:
            log.error("cannot update the super stream file: %s", e)
            cb(RC_INTERNAL_ERROR)
            return
        parts = [p for p in d["partitions"] if self.engine.has_stream(p)]
        if not parts:
            cb(RC_OK)
            return
        left = [len(parts)]

        def one_done(res, exc):
            if exc is not None and not isinstance(exc, StreamNotFound):
                log.warning("deleting partition of super stream %r: %s", name, exc)
            left[0] -= 1
            if left[0] == 0:
                cb(RC_OK)
        for p in parts:
            try:
                self._then(self.engine.delete_stream(p), one_done)
            except RiverbedError as e:
                one_done(None, e)


# =========================================================================================== server

TICK_INTERVAL = 0.25        # seconds between heartbeat/timeout checks of all sessions
WRITE_BUFFER_HIGH = 4 << 20  # transport write buffer marks, bytes: delivery pauses above the high mark
WRITE_BUFFER_LOW = 1 << 20


class _RmqProtocol(asyncio.Protocol):
    """asyncio glue: moves bytes and flow-control signals between a transport and a session, and is
    the session's ``io``."""

    __slots__ = ("server", "loop", "transport", "session")

    def __init__(self, server):
        self.server = server
        self.loop = server.loop
        self.transport = None
        self.session = None

    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername") or ("?", 0)
        local = transport.get_extra_info("sockname") or (None, 0)
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        self.session = RmqStreamSession(self.server.broker, self, peer=f"{peer[0]}:{peer[1]}",
                                        local_host=local[0], peer_loopback=_auth.is_loopback(peer[0]))
        self.server.protocols.add(self)

    def data_received(self, data):
        try:
            self.session.data_received(data)
        except Exception:  # a bug must cost this connection only, never the server
            log.exception("%s: internal error; closing the connection", self.session.peer)
            self.transport.abort()

    def eof_received(self):
        return False

    def connection_lost(self, exc):
        self.server.protocols.discard(self)
        if self.session is not None:
            self.session.connection_lost()

    def pause_writing(self):
        self.session.pause_writing()

    def resume_writing(self):
        try:
            self.session.resume_writing()
        except Exception:
            log.exception("%s: internal error; closing the connection", self.session.peer)
            self.transport.abort()

    # the session's io
    def write(self, data):
        self.transport.write(data)

    def writelines(self, parts):
        self.transport.writelines(parts)

    def close(self):
        self.transport.close()

    def pause_reading(self):
        if not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self):
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def defer(self, fn, *args):
        self.loop.call_soon(fn, *args)


class RmqStreamServer:
    """A RabbitMQ Stream listener over one engine. Create it with :func:`serve`.

    ``port`` is the bound port (useful with port 0). Loop-thread only.
    """

    name = "rabbitmq-stream"

    def __init__(self, engine, *, host="127.0.0.1", port=5552, auth=None, data_dir=None, advertised_host=None,
                 advertised_port=None, frame_max=DEFAULT_FRAME_MAX, heartbeat=DEFAULT_HEARTBEAT,
                 handshake_timeout=DEFAULT_HANDSHAKE_TIMEOUT):
        self.engine = engine
        self.host = host
        self.port = port
        self.loop = None
        self.broker = None
        self.protocols = set()
        self._server = None
        self._ticker = None
        self._options = dict(auth=auth, data_dir=data_dir, advertised_host=advertised_host,
                             advertised_port=advertised_port, frame_max=frame_max, heartbeat=heartbeat,
                             handshake_timeout=handshake_timeout)

    async def start(self):
        self.loop = asyncio.get_running_loop()
        self.broker = RmqBroker(self.engine, post=self.loop.call_soon_threadsafe, **self._options)
        self._server = await self.loop.create_server(lambda: _RmqProtocol(self), self.host, self.port,
                                                     reuse_address=True, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        self.broker.listen_host = self.host if self.host not in ("", "0.0.0.0", "::") else None
        self.broker.listen_port = self.port
        self._ticker = self.loop.call_later(TICK_INTERVAL, self._tick)
        return self

    def _tick(self):
        now = self.broker.clock()
        for s in list(self.broker.sessions):
            try:
                s.tick(now)
            except Exception:
                log.exception("%s: internal error in tick", s.peer)
        self._ticker = self.loop.call_later(TICK_INTERVAL, self._tick)

    def stop_accepting(self):
        if self._server is not None:
            self._server.close()

    async def shutdown(self, drain_timeout=10.0):
        """Stop accepting, stop reading, let in-flight appends commit and confirm (at most
        ``drain_timeout`` seconds), send Close to every client, wait briefly for the replies, and
        close every connection."""
        self.stop_accepting()
        sessions = list(self.broker.sessions)
        for s in sessions:
            s.begin_shutdown()
        deadline = self.loop.time() + drain_timeout
        while any(s.pending_ops for s in self.broker.sessions) and self.loop.time() < deadline:
            await asyncio.sleep(0.01)
        for s in list(self.broker.sessions):
            s.close_gracefully("server shutdown")
        deadline = self.loop.time() + CLOSE_TIMEOUT
        while self.protocols and self.loop.time() < deadline:
            await asyncio.sleep(0.01)
        for p in list(self.protocols):
            p.transport.abort()
        if self._ticker is not None:
            self._ticker.cancel()
        self.broker.close()
        await asyncio.sleep(0)


# ============================================================================================ serve

async def serve(engine, *, host="127.0.0.1", port=5552, auth=None, data_dir=None, advertised_host=None,
                advertised_port=None, frame_max=DEFAULT_FRAME_MAX, heartbeat=DEFAULT_HEARTBEAT,
                handshake_timeout=DEFAULT_HANDSHAKE_TIMEOUT):
    """Start a RabbitMQ Stream listener on ``host:port`` (0 = any free port) serving ``engine``.

    ``auth`` is a :class:`riverbed.shells.auth.Authenticator` (default: guest/guest from loopback).
    ``data_dir`` is where super stream definitions are kept (None: in memory only). The advertised
    address (OpenResponse, Metadata) defaults to the address each client connected to and the bound
    port. ``frame_max`` (bytes) and ``heartbeat`` (seconds) are offered in Tune; ``handshake_timeout``
    (seconds) bounds the time from accept to Open.

    Returns the started :class:`RmqStreamServer`; stop it with ``await server.shutdown()``. Must be
    awaited on the loop that will run it. Raises OSError when the address cannot be bound.
    """
    server = RmqStreamServer(engine, host=host, port=port, auth=auth, data_dir=data_dir,
                             advertised_host=advertised_host, advertised_port=advertised_port,
                             frame_max=frame_max, heartbeat=heartbeat, handshake_timeout=handshake_timeout)
    return await server.start()

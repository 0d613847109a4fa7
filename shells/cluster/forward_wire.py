"""The forwarding frames: a node that does not lead a stream hands a publish (or a StoreOffset) to the
node that does, over that leader's replication port (wire.py framing: ``| length u32 | type u8 |
payload |``, big-endian), on a connection of its own that opens with FWD_HELLO instead of HELLO::

    FWD_HELLO   forwarder -> leader  JSON {"node": forwarding node's name}
    FWD_APPEND  forwarder -> leader  rid u64 | flags u8 | stream str | publisher str | entries u32 |
                                     records u32 | [ids: n u32, n x u64] | [filters: n u32, n x (len i32,
                                     bytes; -1 = none)] | data section (the rest)
    FWD_OFFSET  forwarder -> leader  rid u64 | stream str | reference str | offset u64
    FWD_SEQUENCE forwarder -> leader rid u64 | stream str | publisher str: QueryPublisherSequence (its
                                     answer's ``first`` is the sequence, as the u64's two's complement)
    FWD_RESULT  leader -> forwarder  rid u64 | code u16 | first i64 | last i64 | duplicates n u32, n x u64 |
                                     message (the rest, UTF-8)

``str`` is ``len u16 | UTF-8``; ``rid`` is the forwarder's request id, echoed in the FWD_RESULT (answers
may come in any order). ``flags``: FLAG_IDS (the ids part is there: a named publisher's publishing ids, one
per entry), FLAG_FILTERS (the filters part is there). The data section is an Osiris data section (simple
and sub-batch entries, engine/format.py) whatever the protocol it came from.

Frame types start at 32 so that they never meet the replication frames' own numbers (1, 2, ...).

Every ``decode_*`` takes the payload (bytes-like) and returns plain values, or raises
:class:`~riverbed.shells.cluster.wire.WireError` for a malformed one (never another exception):
:func:`decode_frame` dispatches on the type, for the fuzz target of the replication port.
"""

import json
import struct

from riverbed.shells.cluster.wire import WireError, frame

FWD_HELLO, FWD_APPEND, FWD_OFFSET, FWD_RESULT, FWD_SEQUENCE = 32, 33, 34, 35, 36

FLAG_IDS = 1
FLAG_FILTERS = 2

# FWD_RESULT codes: what the leader did with a request
CODE_OK = 0
CODE_NOT_LEADER = 1        # refused before anything was stored: the forwarder may send it to the new leader
CODE_NOT_FOUND = 2         # no such stream on the leader
CODE_INVALID = 3           # malformed entries, a bad name or argument: nothing stored
CODE_STORAGE_FULL = 4      # the leader's disk alarm: nothing stored
CODE_NOT_CONFIRMED = 5     # stored or not, not confirmed (no majority in time, leadership lost meanwhile)
CODE_ERROR = 6             # anything else

LEN_STR_MAX = 0xFFFF
MAX_IDS = 1 << 24          # bounds a hostile count before anything is allocated

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_APPEND_COUNTS = struct.Struct(">II")
_RESULT_HEAD = struct.Struct(">QHqq")
_NO_FILTER = -1


def _str(s):
    b = s.encode()
    if len(b) > LEN_STR_MAX:
        raise ValueError("name too long to forward")
    return _U16.pack(len(b)) + b


class _Reader:
    """Bounds-checked reads over one payload; every overrun is a WireError."""

    __slots__ = ("mv", "pos")

    def __init__(self, payload):
        self.mv = memoryview(payload).cast("B") if not isinstance(payload, memoryview) else payload.cast("B")
        self.pos = 0

    def take(self, n):
        end = self.pos + n
        if n < 0 or end > len(self.mv):
            raise WireError("truncated forward frame")
        out = self.mv[self.pos:end]
        self.pos = end
        return out

    def unpack(self, st):
        return st.unpack(self.take(st.size))

    def str(self):
        (n,) = self.unpack(_U16)
        try:
            return bytes(self.take(n)).decode()
        except UnicodeDecodeError:
            raise WireError("a name that is not UTF-8") from None

    def rest(self):
        out = self.mv[self.pos:]
        self.pos = len(self.mv)
        return out


# ------------------------------------------------------------------------------------------ encoders

def encode_hello(node):
    return frame(FWD_HELLO, json.dumps({"node": node}, separators=(",", ":")).encode())


def encode_append(rid, stream, publisher, ids, filters, num_entries, num_records, data):
    """One FWD_APPEND frame as a list of byte parts (the data section is not copied). ``ids``: None, a
    list of ints or a PublishingIds (its ``raw`` bytes go as they are); ``filters``: None or one bytes
    (or None) per entry. Raises ValueError for what cannot be encoded (a name over 65535 bytes)."""
    flags = (FLAG_IDS if ids is not None else 0) | (FLAG_FILTERS if filters is not None else 0)
    head = [_U64.pack(rid), _U8.pack(flags), _str(stream), _str(publisher or ""),
            _APPEND_COUNTS.pack(num_entries, num_records)]
    if ids is not None:
        raw = getattr(ids, "raw", None)
        if raw is None:
            raw = struct.pack(f">{len(ids)}Q", *ids)
        head.append(_U32.pack(len(raw) >> 3))
        head.append(bytes(raw))
    if filters is not None:
        head.append(_U32.pack(len(filters)))
        for f in filters:
            if f is None:
                head.append(_I32.pack(_NO_FILTER))
            else:
                head.append(_I32.pack(len(f)) + bytes(f))
    body = b"".join(head)
    size = len(body) + len(data) + 1
    return [struct.pack(">IB", size, FWD_APPEND), body, data]


def encode_offset(rid, stream, reference, offset):
    return frame(FWD_OFFSET, _U64.pack(rid) + _str(stream) + _str(reference) + _U64.pack(offset))


def encode_sequence(rid, stream, publisher):
    return frame(FWD_SEQUENCE, _U64.pack(rid) + _str(stream) + _str(publisher))


def encode_result(rid, code, first=-1, last=-1, duplicates=(), message=""):
    dups = list(duplicates or ())
    return frame(FWD_RESULT, _RESULT_HEAD.pack(rid, code, first, last) + _U32.pack(len(dups))
                 + struct.pack(f">{len(dups)}Q", *dups) + message.encode("utf-8", "replace"))


# ------------------------------------------------------------------------------------------ decoders

def decode_hello(payload):
    """The forwarding node's name. WireError when malformed."""
    try:
        obj = json.loads(bytes(payload))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise WireError("bad FWD_HELLO") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("node"), str):
        raise WireError("FWD_HELLO without a node name")
    return obj["node"]


def decode_append(payload):
    """``(rid, stream, publisher or None, ids or None, filters or None, num_entries, num_records, data)``
    of a FWD_APPEND payload; ``data`` is a memoryview into it. WireError when malformed."""
    r = _Reader(payload)
    (rid,) = r.unpack(_U64)
    (flags,) = r.unpack(_U8)
    if flags & ~(FLAG_IDS | FLAG_FILTERS):
        raise WireError(f"unknown forward flags {flags:#x}")
    stream = r.str()
    publisher = r.str() or None
    num_entries, num_records = r.unpack(_APPEND_COUNTS)
    if not stream:
        raise WireError("a forwarded publish without a stream")
    ids = None
    if flags & FLAG_IDS:
        (n,) = r.unpack(_U32)
        if n > MAX_IDS:
            raise WireError(f"{n} publishing ids")
        ids = list(struct.unpack(f">{n}Q", r.take(8 * n)))
    filters = None
    if flags & FLAG_FILTERS:
        (n,) = r.unpack(_U32)
        if n > MAX_IDS:
            raise WireError(f"{n} filter values")
        filters = []
        for _ in range(n):
            (ln,) = r.unpack(_I32)
            if ln == _NO_FILTER:
                filters.append(None)
            elif ln < 0:
                raise WireError(f"filter value length {ln}")
            else:
                filters.append(bytes(r.take(ln)))
    data = r.rest()
    if ids is not None and len(ids) != num_entries:
        raise WireError(f"{len(ids)} publishing ids for {num_entries} entries")
    if filters is not None and len(filters) != num_entries:
        raise WireError(f"{len(filters)} filter values for {num_entries} entries")
    if num_entries == 0 or num_records < num_entries or not len(data):
        raise WireError(f"a forwarded publish of {num_entries} entries, {num_records} records, {len(data)} bytes")
    return rid, stream, publisher, ids, filters, num_entries, num_records, data


def decode_offset(payload):
    """``(rid, stream, reference, offset)`` of a FWD_OFFSET payload. WireError when malformed."""
    r = _Reader(payload)
    (rid,) = r.unpack(_U64)
    stream = r.str()
    reference = r.str()
    (offset,) = r.unpack(_U64)
    if r.pos != len(r.mv):
        raise WireError("trailing bytes after FWD_OFFSET")
    if not stream or not reference:
        raise WireError("FWD_OFFSET without a stream or reference")
    return rid, stream, reference, offset


def decode_sequence(payload):
    """``(rid, stream, publisher)`` of a FWD_SEQUENCE payload. WireError when malformed."""
    r = _Reader(payload)
    (rid,) = r.unpack(_U64)
    stream = r.str()
    publisher = r.str()
    if r.pos != len(r.mv):
        raise WireError("trailing bytes after FWD_SEQUENCE")
    if not stream or not publisher:
        raise WireError("FWD_SEQUENCE without a stream or publisher")
    return rid, stream, publisher


def u64_of(signed):
    """The u64 a FWD_RESULT's i64 field carries (a publisher sequence may use all 64 bits)."""
    return signed & 0xFFFFFFFFFFFFFFFF


def i64_of(value):
    return value - (1 << 64) if value >= 1 << 63 else value


def decode_result(payload):
    """``(rid, code, first, last, [duplicate ids], message)`` of a FWD_RESULT payload. WireError when
    malformed."""
    r = _Reader(payload)
    rid, code, first, last = r.unpack(_RESULT_HEAD)
    (n,) = r.unpack(_U32)
    if n > MAX_IDS:
        raise WireError(f"{n} duplicate ids")
    dups = list(struct.unpack(f">{n}Q", r.take(8 * n)))
    if code > CODE_ERROR:
        raise WireError(f"unknown forward result code {code}")
    message = bytes(r.rest()).decode("utf-8", "replace")
    return rid, code, first, last, dups, message


DECODERS = {FWD_HELLO: decode_hello, FWD_APPEND: decode_append, FWD_OFFSET: decode_offset,
            FWD_RESULT: decode_result, FWD_SEQUENCE: decode_sequence}


def decode_frame(kind, payload):
    """Decode a forwarding frame's payload by its type (the fuzz target's entry point): the decoder's
    result, or WireError (an unknown type included)."""
    dec = DECODERS.get(kind)
    if dec is None:
        raise WireError(f"not a forwarding frame type: {kind}")
    return dec(payload)

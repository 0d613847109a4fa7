"""Pure-Python twin of ``bsonpub.pxi``: recognising a mewbase PUB frame without decoding it.

Re-exported by :mod:`riverbed.shells._pywire` and picked through :mod:`riverbed.shells.wire`. Same
results in both twins; the docstring of :func:`bson_pub` is the spec. Pure and thread-safe.
"""

import struct

from bson.int64 import Int64

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")

MAX_DEPTH = 64          # documents nested deeper than this are left to the caller
MAX_KEYS = 64           # ... and so are documents with more elements (duplicate keys are looked for pairwise)

# element types accepted in an event, and the size of the fixed-size ones
_FIXED = {0x01: 8, 0x07: 12, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16, 0xFF: 0, 0x7F: 0}
_BINARY_SUBTYPES = frozenset([0, 1, 3, 4, 5, 6, 7, 8, *range(0x80, 0x100)])

_K_TYPE, _K_FRAME = b"type", b"frame"
_K_CHANNEL, _K_EVENT, _K_RID, _K_SESS = b"channel", b"event", b"rID", b"sessID"


class _Reject(Exception):
    pass


def _utf8_ok(b, start, end):
    try:
        bytes(b[start:end]).decode("utf-8")       # strict: no overlongs, surrogates or code points past U+10FFFF
    except UnicodeDecodeError:
        return False
    return True


def _cstring(b, pos, end):
    """End (the NUL) of the key starting at ``pos``; the NUL must come before ``end``."""
    k = b.find(b"\x00", pos, end)
    if k < 0:
        raise _Reject
    return k


def _string(b, pos, end):
    """``(text start, text end)`` of the BSON string value at ``pos`` (``text end`` is its NUL, which must
    come before ``end``), checked: length >= 1, in bounds, NUL-terminated, valid UTF-8."""
    if end - pos < 4:
        raise _Reject
    s = _I32.unpack_from(b, pos)[0]
    if s < 1 or s > end - pos - 4 or b[pos + 4 + s - 1] != 0:
        raise _Reject
    if not _utf8_ok(b, pos + 4, pos + 4 + s - 1):
        raise _Reject
    return pos + 4, pos + 4 + s - 1


def _value(t, b, pos, end, depth):
    """Bytes taken by a checked value of type ``t`` at ``pos`` (it must end by ``end``)."""
    n = _FIXED.get(t)
    if n is not None:
        if n > end - pos:
            raise _Reject
        return n
    if t == 0x08:
        if end - pos < 1 or b[pos] > 1:
            raise _Reject
        return 1
    if t == 0x02:
        return _string(b, pos, end)[1] + 1 - pos
    if t == 0x03 or t == 0x04:
        if end - pos < 5:
            raise _Reject
        n = _I32.unpack_from(b, pos)[0]
        if n < 5 or n > end - pos:
            raise _Reject
        _document(b, pos, n, depth + 1, t == 0x04, False)
        return n
    if t == 0x05:
        if end - pos < 5:
            raise _Reject
        n = _I32.unpack_from(b, pos)[0]
        if n < 0 or n > end - pos - 5 or b[pos + 4] not in _BINARY_SUBTYPES:
            raise _Reject
        return 5 + n
    raise _Reject       # deprecated or unusual types: undefined, regex, DBPointer, code, symbol, code w/ scope


def _document(b, start, n, depth, array, top):
    """Check the document (or array) of ``n`` bytes at ``start``."""
    if depth > MAX_DEPTH:
        raise _Reject
    end = start + n - 1
    if b[end] != 0:
        raise _Reject
    pos = start + 4
    keys = []
    count = 0
    while pos < end:
        t = b[pos]
        k = _cstring(b, pos + 1, end)
        key = bytes(b[pos + 1:k])
        if array:
            if key != str(count).encode():
                raise _Reject
        else:
            if not _utf8_ok(b, pos + 1, k) or key == b"$ref" or key in keys or len(keys) >= MAX_KEYS:
                raise _Reject
            if top and key == b"_id" and keys:
                raise _Reject           # the encoder would move _id first
            keys.append(key)
        count += 1
        pos = k + 1 + _value(t, b, k + 1, end, depth)
    if pos != end:
        raise _Reject


def _int(t, b, pos, end):
    if t == 0x10:
        if end - pos < 4:
            raise _Reject
        return _I32.unpack_from(b, pos)[0], 4
    if t == 0x12:
        if end - pos < 8:
            raise _Reject
        return Int64(_I64.unpack_from(b, pos)[0]), 8
    raise _Reject


def bson_pub(frame):
    """Recognise one whole mewbase PUB frame (bytes-like, its int32 LE length included) without decoding it.

    Returns ``(channel, rid, sess_id, event_start, event_end)`` when ``frame`` is exactly the envelope
    ``{type: "PUB", frame: {channel: <non-empty string>, event: <document>, rID: <int32|int64>,
    sessID: <string|int32|int64>}}`` (``rID`` and ``sessID`` optional, fields in any order, each at most
    once, no others) and the whole frame is valid BSON by a strict check; ``frame[event_start:event_end]``
    is the event document's bytes. ``rid``/``sess_id`` are None when absent, an int32 as ``int`` and an
    int64 as ``bson.int64.Int64`` (as ``bson.decode`` gives them); ``channel`` and a string ``sessID``
    are ``str``.

    The strict check: every length in bounds and adding up exactly (the frame's own length equals
    ``len(frame)``), every document and array ending in its NUL, keys NUL-terminated inside their document
    and valid UTF-8, strings of length >= 1, NUL-terminated, valid UTF-8 (strict, as Python decodes it),
    booleans 0 or 1. Inside the event the accepted element types are double, string, document, array,
    binary (any subtype but 2 and the reserved 9..0x7F), ObjectId, boolean, datetime, null, int32,
    timestamp, int64, decimal128, min key and max key. Besides, so that the event's bytes are exactly
    what decoding and encoding them again with pymongo would store: no document holds a key twice or a
    ``$ref`` key (pymongo would decode a DBRef), array keys are ``"0"``, ``"1"``, ... in order, and an
    ``_id`` of the event itself comes first. Documents nested more than 64 deep (the event is depth 1) or,
    arrays aside, holding more than 64 elements are not looked at.

    Returns None for anything else, valid or not: the caller then decodes the frame the slow way, which
    decides. A returned tuple therefore always means ``bson.decode(frame)`` succeeds and gives the same
    channel, rID, sessID and event. Never raises for bytes-like input.
    """
    b = bytes(memoryview(frame).cast("B"))
    n = len(b)
    try:
        if n < 5 or _I32.unpack_from(b, 0)[0] != n or b[n - 1] != 0:
            return None
        end = n - 1
        pos = 4
        seen_type = False
        fstart = -1
        while pos < end:
            t = b[pos]
            k = _cstring(b, pos + 1, end)
            key = bytes(b[pos + 1:k])
            vs = k + 1
            if key == _K_TYPE and t == 0x02 and not seen_type:
                s, e = _string(b, vs, end)
                if bytes(b[s:e]) != b"PUB":
                    return None
                seen_type = True
                pos = e + 1
            elif key == _K_FRAME and t == 0x03 and fstart < 0:
                if end - vs < 5:
                    return None
                fn = _I32.unpack_from(b, vs)[0]
                if fn < 5 or fn > end - vs:
                    return None
                fstart = vs
                pos = vs + fn
            else:
                return None
        if pos != end or not seen_type or fstart < 0:
            return None
        return _pub_frame(b, fstart, _I32.unpack_from(b, fstart)[0])
    except _Reject:
        return None


def _pub_frame(b, start, n):
    end = start + n - 1
    if b[end] != 0:
        return None
    pos = start + 4
    channel = rid = sess = None
    ev = None
    seen = set()
    while pos < end:
        t = b[pos]
        k = _cstring(b, pos + 1, end)
        key = bytes(b[pos + 1:k])
        vs = k + 1
        if key in seen:
            return None
        seen.add(key)
        if key == _K_CHANNEL and t == 0x02:
            s, e = _string(b, vs, end)
            if e == s:
                return None
            channel = bytes(b[s:e]).decode("utf-8")
            pos = e + 1
        elif key == _K_EVENT and t == 0x03:
            if end - vs < 5:
                return None
            size = _I32.unpack_from(b, vs)[0]
            if size < 5 or size > end - vs:
                return None
            _document(b, vs, size, 1, False, True)      # the event is depth 1
            ev = (vs, vs + size)
            pos = vs + size
        elif key == _K_RID:
            rid, size = _int(t, b, vs, end)
            pos = vs + size
        elif key == _K_SESS:
            if t == 0x02:
                s, e = _string(b, vs, end)
                sess = bytes(b[s:e]).decode("utf-8")
                pos = e + 1
            else:
                sess, size = _int(t, b, vs, end)
                pos = vs + size
        else:
            return None
    if pos != end or channel is None or ev is None:
        return None
    return channel, rid, sess, ev[0], ev[1]

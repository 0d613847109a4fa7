"""mewbase wire format: BSON documents over TCP, pure functions (no I/O, no state).

Every frame is one BSON document, whose leading int32 little-endian length counts its own 4 bytes,
shaped as the envelope ``{type: <string>, frame: <document>}``. Splitting is the shells' compiled wire
parsers' (:func:`riverbed.shells.wire.split_bson_frames`); encoding and decoding is pymongo's ``bson``,
except for the two frames sent in bulk (RECEV and QUERYRESULT), which are assembled around the event's
stored BSON bytes without decoding them.
"""

import math
import struct

import bson
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument

from riverbed.engine.record import value_within_depth

# frame types (FACTS § 000: what the 2016-17 server put on the wire)
FT_CONNECT = "CONNECT"
FT_RESPONSE = "RESPONSE"
FT_PUB = "PUB"
FT_STARTTX = "STARTTX"
FT_COMMITTX = "COMMITTX"
FT_ABORTTX = "ABORTTX"
FT_SUBSCRIBE = "SUBSCRIBE"
FT_SUBRESPONSE = "SUBRESPONSE"
FT_UNSUBSCRIBE = "UNSUBSCRIBE"
FT_SUBCLOSE = "SUBCLOSE"
FT_RECEV = "RECEV"
FT_ACKEV = "ACKEV"
FT_QUERY = "QUERY"
FT_QUERYRESULT = "QUERYRESULT"
FT_QUERYACK = "QUERYACK"
FT_PING = "PING"
FT_FINDBYID = "FINDBYID"
FT_LISTCHANNELS = "LISTCHANNELS"
FT_LISTCHANNELS_SIC = "LISTCHANNNELS"      # the real server's spelling (three N)
FT_CREATECHANNEL = "CREATECHANNEL"
FT_LISTBINDERS = "LISTBINDERS"
FT_CREATEBINDER = "CREATEBINDER"
FT_CREATEPROJECTION = "CREATEPROJECTION"

# errCode values (ints, as the real server sent them)
ERR_AUTHENTICATION_FAILED = 1
ERR_NOT_AUTHORISED = 2
ERR_NO_SUCH_CHANNEL = 3
ERR_NO_SUCH_BINDER = 4
ERR_NO_SUCH_QUERY = 5
ERR_COMMAND_NOT_PROCESSED = 6
ERR_SERVER_ERROR = 100

SERVER_VERSION = 0.1          # a CONNECT version parsed as a float must be <= this
PING_REQUEST, PING_REPLY = 8, 0

MIN_FRAME = 5                 # the smallest BSON document
MAX_FRAME = 16 << 20          # declared lengths above this are refused before the body is read
WINDOW_HIGH = 4 << 20         # RECEV / QUERYRESULT bytes unacknowledged before a pause
WINDOW_LOW = 2 << 20          # ... and the level an ACKEV / QUERYACK must bring them to for a resume

# decoding keeps what encoding needs to give the same BSON back: dates outside datetime's range stay
# DatetimeMS, int64 stays Int64 (pymongo's default), binary subtypes stay Binary
# bson.decode / bson.encode minus their argument checks (a third of their cost on 100-byte events):
# the module-level names are the C extension's functions when it is built, the pure-Python ones if not
_bson_to_dict = bson._bson_to_dict
_dict_to_bson = bson._dict_to_bson
_ENCODE = bson.DEFAULT_CODEC_OPTIONS
_K_FRAME = b"\x03frame\x00"
DECODE = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)


class DecodeError(ValueError):
    """A frame that is not valid BSON or not an envelope. ``rid`` is the request id when one was read."""

    def __init__(self, msg, rid=None):
        super().__init__(msg)
        self.rid = rid


def decode_envelope(raw):
    """``(type, frame)`` of one whole frame (bytes, length prefix included), ``frame`` a dict, fully
    decoded (so the whole document is validated). Raises DecodeError for bad BSON or a missing or
    mistyped ``type``/``frame``. Pure.

    A full decode in C, and encoding an event again where its bytes are needed, costs a third of
    reading the frame lazily as RawBSONDocuments (whose accessors run in Python)."""
    try:
        env = _bson_to_dict(raw, DECODE)
    except Exception as e:  # noqa: BLE001 - the C decoder raises InvalidBSON, ValueError, OverflowError, ...
        raise DecodeError(f"invalid BSON: {e}") from None
    ftype = env.get("type")
    frame = env.get("frame")
    if type(ftype) is not str:     # a BSON JavaScript value decodes to bson.Code, a str subclass that is unhashable
        raise DecodeError("not a frame: the document needs a string field 'type'")
    if not isinstance(frame, dict):
        raise DecodeError("not a frame: the document needs a document field 'frame'")
    return ftype, frame


class FieldError(ValueError):
    """A frame whose fields do not have the types the protocol gives them, or that nests deeper than the
    limit; ``reason`` is the ``riverbed_rejected_total`` reason (``"field"`` or ``"depth"``)."""

    def __init__(self, msg, reason="field"):
        super().__init__(msg)
        self.reason = reason


def _is_int(v):
    return type(v) is int or (isinstance(v, int) and not isinstance(v, bool))


_STR = ("a string", lambda v: isinstance(v, str))
_INT = ("an integer", _is_int)
_DOC = ("a document", lambda v: isinstance(v, dict))
# The one validation step of a decoded frame (besides its envelope): every field a client frame may carry
# and what it must be when present and not null, whatever the frame type (each name means one thing in
# every frame that has it). The handlers then read fields without guarding each access.
FIELD_TYPES = {
    "channel": _STR, "name": _STR, "binder": _STR, "durableID": _STR, "username": _STR, "password": _STR,
    "subID": _INT, "queryID": _INT, "bytes": _INT, "pos": _INT, "startPos": _INT, "startTimestamp": _INT,
    "sequence": _INT,
    "sessID": ("a string or an integer", lambda v: isinstance(v, str) or _is_int(v)),
    "matcher": _DOC,       # ("event" is checked by PUB: a DBRef-shaped one decodes as a DBRef)
}


def check_frame(frame, max_depth):
    """Validate a decoded frame (a dict) before any handler reads it: the types of :data:`FIELD_TYPES`,
    and nesting: the frame may hold documents ``max_depth`` deep (an event at its limit is at depth 2
    of the frame). Raises :class:`FieldError`. Pure."""
    for key, (what, ok) in FIELD_TYPES.items():
        v = frame.get(key)
        if v is not None and not ok(v):
            raise FieldError(f"'{key}' must be {what}, not {_bson_type_name(v)}")
    if not value_within_depth(frame, max_depth + 1):
        raise FieldError(f"frame nests documents deeper than the limit of {max_depth}", "depth")


def _bson_type_name(v):
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, dict):
        return "a document"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a double"
    return type(v).__name__


def encode_event(event):
    """An event document (as decoded with DECODE) as BSON bytes again: the same fields, order and
    types. Raises DecodeError when it cannot be encoded."""
    try:
        return _dict_to_bson(event, False, _ENCODE)
    except Exception as e:  # noqa: BLE001 - InvalidDocument, OverflowError
        raise DecodeError(f"event cannot be stored as BSON: {e}") from None


def encode_frame(ftype, frame):
    """One frame: ``{type, frame}`` as BSON bytes. ``frame`` is a dict (RawBSONDocument values are
    copied in as they are)."""
    return bson.encode({"type": ftype, "frame": frame})


# RESPONSE {ok: true, rID: int32}, the answer to every PUB, laid out once
_OK_HEAD = struct.Struct("<i19s7si10si2s")
_OK_TYPE = b"\x02type\x00" + struct.pack("<i", 9) + b"RESPONSE\x00"
_OK_BODY = b"\x08ok\x00\x01\x10rID\x00"
_OK_END = b"\x00\x00"
LEN_OK = _OK_HEAD.size


def response_ok(rid):
    """RESPONSE {ok: true, rID} for an int32 ``rid`` (else the general :func:`response`)."""
    if type(rid) is int and -0x80000000 <= rid <= 0x7FFFFFFF:
        return _OK_HEAD.pack(LEN_OK, _OK_TYPE, _K_FRAME, 19, _OK_BODY, rid, _OK_END)
    return response(rid, True)


def response(rid, ok=True, err_code=None, err_msg=None, **fields):
    """A RESPONSE frame. ``rid`` None leaves ``rID`` out (the answer to CONNECT)."""
    body = {"ok": ok}
    if rid is not None:
        body["rID"] = rid
    if err_code is not None:
        body["errCode"] = err_code
    if err_msg is not None:
        body["errMsg"] = err_msg
    body.update(fields)
    return encode_frame(FT_RESPONSE, body)


def sub_response(rid, ok=True, sub_id=None, err_code=None, err_msg=None):
    body = {"ok": ok, "rID": rid}
    if sub_id is not None:
        body["subID"] = sub_id
    if err_code is not None:
        body["errCode"] = err_code
    if err_msg is not None:
        body["errMsg"] = err_msg
    return encode_frame(FT_SUBRESPONSE, body)


# RECEV = {type: "RECEV", frame: {subID: int32, pos: int64, timestamp: int64, event: <doc>}}, laid out
# here byte by byte so the event's stored BSON goes out without being decoded and encoded again.
_RECEV_HEAD = struct.Struct("<i16s7si7si5sq11sq7s")
_RECEV_TYPE = b"\x02type\x00" + struct.pack("<i", 6) + b"RECEV\x00"
_K_SUBID = b"\x10subID\x00"
_K_POS = b"\x12pos\x00"
_K_TS = b"\x12timestamp\x00"
_K_EVENT = b"\x03event\x00"
LEN_RECEV_OVERHEAD = _RECEV_HEAD.size + 2       # bytes of a RECEV besides the event
_END2 = b"\x00\x00"


def encode_recev(sub_id, pos, timestamp, event_raw):
    """A RECEV frame around ``event_raw`` (one BSON document's bytes, trusted to be valid). ``pos`` and
    ``timestamp`` (ms) are int64."""
    n = len(event_raw)
    return b"".join((_RECEV_HEAD.pack(LEN_RECEV_OVERHEAD + n, _RECEV_TYPE, _K_FRAME, 55 + n, _K_SUBID, sub_id, _K_POS,
                                      pos, _K_TS, timestamp, _K_EVENT), event_raw, _END2))


def encode_query_result(query_id, result_raw=None, last=False, **extra):
    """A QUERYRESULT frame; ``result_raw`` (stored BSON bytes) is copied in without decoding; None
    leaves ``result`` out (an empty answer)."""
    body = {"queryID": query_id}
    if result_raw is not None:
        body["result"] = RawBSONDocument(result_raw)
    body.update(extra)
    body["last"] = last
    return encode_frame(FT_QUERYRESULT, body)


def encode_ping(sequence, kind=PING_REPLY):
    return encode_frame(FT_PING, {"type": kind, "sequence": sequence})


def parse_version(value):
    """A CONNECT ``version`` as a float (the real server's ``Float.valueOf``), or None when it is not
    a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        v = float(value)
    elif isinstance(value, str):
        try:
            v = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return None if math.isnan(v) else v


def is_int(v):
    """A BSON int32/int64 as Python sees it (bools excluded)."""
    return isinstance(v, int) and not isinstance(v, bool)

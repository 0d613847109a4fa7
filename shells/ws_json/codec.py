"""Streamr broker protocol v28 (JSON over WebSocket): frames, MSG arrays and request validation.

Pure functions; thread-safe. Every server frame is one text frame holding ``[0, type, subId, payload]``
(``subId`` is ``""`` except in unicast frames). A stream message (MSG) is
``[28, streamId, partition, timestamp_ms, ttl, offset, previousOffset, 27, "<json text>"]``.

Broadcast frames go to many connections, so :func:`ws_text_frame` also builds the WebSocket frame bytes
(server frames are never masked): a message is JSON-encoded and framed once, and the same bytes are
written to every subscriber.
"""

import json
import math
import re
import struct

from riverbed.engine.record import json_within_depth, max_depth

PROTOCOL_VERSION = 0          # element 0 of every server frame
MSG_VERSION = 28
CONTENT_TYPE_JSON = 27
DEFAULT_TTL = 0               # seconds; Riverbed keeps messages by retention, not per-message TTL

TYPE_BROADCAST = 0
TYPE_UNICAST = 1
TYPE_SUBSCRIBED = 2
TYPE_UNSUBSCRIBED = 3
TYPE_RESENDING = 4
TYPE_RESENT = 5
TYPE_NO_RESEND = 6
TYPE_ERROR = 7

RESEND_LAST_MAX = 100_000

ERR_MISSING_STREAM = "Publish request is missing the stream id!"
ERR_NOT_JSON_MSG = "Message must be stringified JSON!"
ERR_AUTH_FAILED = "Authentication failed."
ERR_NOT_A_REQUEST = "Request must be a JSON object!"
ERR_NOT_SUBSCRIBED = "Not subscribed"
ERR_BAD_TEXT = "Request must be valid Unicode text: it holds an unpaired surrogate escape"

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_loads = json.loads
_U16 = struct.Struct(">BBH")
_U64 = struct.Struct(">BBQ")


class RequestError(ValueError):
    """A request the server answers with an error frame; ``payload`` is the error frame's payload (a
    string or an object); ``reason``, when set, is the ``riverbed_rejected_total`` reason the refusal
    counts under (``"depth"``, ``"encoding"``, ``"field"``)."""

    def __init__(self, payload, reason=None):
        super().__init__(payload if isinstance(payload, str) else json.dumps(payload))
        self.payload = payload
        self.reason = reason


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


# NaN and Infinity are Python's extension, not JSON: a request using them is not JSON (a NaN ts would
# otherwise pass every comparison)
_decode = json.JSONDecoder(parse_constant=_no_constant).decode
# a \uD800-\uDFFF escape: the only way a str from a WebSocket text frame (checked UTF-8) can come to
# hold a lone surrogate, which no UTF-8 encoder (ours included, for the error frame) can write
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


# ------------------------------------------------------------------------------------------ output

def encode_frame(msg_type, payload, sub_id=""):
    """A control frame ``[0, type, subId, payload]`` as compact JSON text (str)."""
    return _dumps([PROTOCOL_VERSION, msg_type, sub_id, payload])


def error_frame(reason):
    """An error frame (type 7); ``reason`` is a string or a JSON-able object."""
    return encode_frame(TYPE_ERROR, reason)


def stream_payload(stream_id, partition, sub=None):
    """``{"stream", "partition"}``, plus ``"sub"`` for resending/resent/no_resend (the real client routes
    those by it)."""
    p = {"stream": stream_id, "partition": partition}
    if sub is not None:
        p["sub"] = sub
    return p


def msg_prefix(stream_id, partition):
    """The constant start of every MSG of one stream-partition: ``28,"<id>",<p>,`` (cache it)."""
    return f"{MSG_VERSION},{_dumps(stream_id)},{int(partition)},"


def encode_msg(prefix, timestamp, offset, previous_offset, text, ttl=DEFAULT_TTL):
    """A MSG array as JSON text. ``prefix`` from :func:`msg_prefix`; ``text`` is the message's JSON text
    (str), embedded as a JSON string; ``previous_offset`` None becomes null."""
    prev = "null" if previous_offset is None else str(previous_offset)
    return f"[{prefix}{timestamp},{ttl},{offset},{prev},{CONTENT_TYPE_JSON},{_dumps(text)}]"


def broadcast_frame(msg_json):
    """A broadcast frame (type 0) around MSG JSON text."""
    return f'[0,0,"",{msg_json}]'


def unicast_frame(msg_json, sub_id):
    """A unicast frame (type 1, a resent message) around MSG JSON text."""
    return f"[0,1,{_dumps(sub_id)},{msg_json}]"


def decode_msg_list(frame_text):
    """Parse a server frame (str) into a list (tests and clients). Raises ValueError."""
    return _loads(frame_text)


def ws_text_frame(text):
    """The bytes of one unmasked, unfragmented WebSocket text frame (RFC 6455 §5.2) holding ``text``
    (str), as a server sends it."""
    data = text.encode("utf-8")
    n = len(data)
    if n < 126:
        return bytes((0x81, n)) + data
    if n < 65536:
        return _U16.pack(0x81, 126, n) + data
    return _U64.pack(0x81, 127, n) + data


# ------------------------------------------------------------------------------------------- input

def parse_json(text):
    """JSON text (str) parsed strictly: NaN and Infinity are not JSON. Raises ValueError (a
    RecursionError too deep to parse becomes one); check the depth first (``record.json_within_depth``)."""
    try:
        return _decode(text)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def parse_request(text):
    """One client frame (str or UTF-8 bytes) as a request dict: the one validation step every request
    goes through before a handler reads it. Raises RequestError for text that is not a JSON object (NaN
    and Infinity are not JSON), that nests deeper than the depth limit, that holds a lone surrogate
    (``"\\ud800"``), that has no string ``type``, or whose common fields have the wrong types
    (see :data:`FIELD_TYPES`)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(ERR_NOT_A_REQUEST, "encoding") from None
    if not json_within_depth(text, max_depth()):
        raise RequestError(f"Request nests deeper than the limit of {max_depth()}", "depth")
    try:
        req = _decode(text)
    except (ValueError, RecursionError):
        raise RequestError(ERR_NOT_A_REQUEST) from None
    if not isinstance(req, dict):
        raise RequestError(ERR_NOT_A_REQUEST)
    if _SURROGATE_ESCAPE.search(text) is not None:
        try:
            _dumps(req).encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(ERR_BAD_TEXT, "encoding") from None
    t = req.get("type")
    if not isinstance(t, str):
        raise RequestError(f"Unknown request type: {t}" if t is not None else "Unknown request type: undefined")
    for key, (what, ok) in FIELD_TYPES.items():
        v = req.get(key)
        if v is not None and not ok(v):
            raise RequestError(f"Invalid {key}: {key} must be {what}", "field")
    return req


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# The fields every handler reads without checking their type again (null is "not given"); the others
# (partition, msg, ts, pkey, resend_*) are checked by the functions below with the real server's texts.
FIELD_TYPES = {
    "authKey": ("a string", lambda v: isinstance(v, str)),
    "sub": ("a string", lambda v: isinstance(v, str)),
}


def request_partition(req):
    """The request's ``partition`` (default 0). Raises RequestError when it is not an int >= 0."""
    p = req.get("partition", 0)
    if p is None:
        return 0
    if not is_int(p) or p < 0:
        raise RequestError(f"Invalid partition: {json.dumps(p)}")
    return p


def request_stream(req, missing=None):
    """The request's ``stream`` (a non-empty str). Raises RequestError(``missing`` or a generic text)."""
    s = req.get("stream")
    if not isinstance(s, str) or not s:
        raise RequestError(missing or f"{req.get('type')} request is missing the stream id!")
    return s


def check_publish(req):
    """Validate a publish request. Returns ``(stream, msg_text, ts or None, pkey or None)``. Raises
    RequestError with the real server's texts: a missing stream id, a ``msg`` that is not a string
    holding valid JSON; and for a ``ts`` that is not a number or a ``pkey`` that is not a string/number."""
    stream = request_stream(req, ERR_MISSING_STREAM)
    msg = req.get("msg")
    if not isinstance(msg, str):
        raise RequestError(ERR_NOT_JSON_MSG)
    if not json_within_depth(msg, max_depth()):
        raise RequestError(f"Message nests deeper than the limit of {max_depth()}", "depth")
    try:
        _decode(msg)
    except (ValueError, RecursionError):
        raise RequestError(ERR_NOT_JSON_MSG) from None
    ts = req.get("ts")
    if ts is not None:
        if not is_number(ts) or not math.isfinite(ts) or ts < 0 or ts >= 1 << 62:
            raise RequestError("Invalid timestamp: ts must be a number of milliseconds since the epoch")
        ts = int(ts)
    pkey = req.get("pkey")
    if pkey is not None:
        if is_number(pkey):
            pkey = json.dumps(pkey)
        elif not isinstance(pkey, str):
            raise RequestError("Invalid partition key: pkey must be a string")
    return stream, msg, ts, pkey


# resend variants: (kind, a, b); offsets inclusive
RESEND_ALL = "all"
RESEND_LAST = "last"
RESEND_RANGE = "range"        # from a to b (b None: to the end)
RESEND_FROM_TIME = "time"

_RESEND_KEYS = ("resend_all", "resend_last", "resend_from", "resend_to", "resend_from_time")


def resend_variant(req):
    """Which resend a request asks for: ``(RESEND_*, a, b)``, or None for anything the server answers
    with no_resend (no variant, more than one, a wrong type). ``resend_all`` must be true;
    ``resend_last`` an int (capped at :data:`RESEND_LAST_MAX`; <= 0 resends nothing); ``resend_from``
    an int offset, optionally with ``resend_to``; ``resend_from_time`` a number of ms."""
    given = {k: req[k] for k in _RESEND_KEYS if req.get(k) is not None}
    keys = set(given)
    if keys == {"resend_all"}:
        return (RESEND_ALL, None, None) if given["resend_all"] is True else None
    if keys == {"resend_last"}:
        n = given["resend_last"]
        if not is_int(n) or n <= 0:
            return None
        return RESEND_LAST, min(n, RESEND_LAST_MAX), None
    if keys == {"resend_from"} or keys == {"resend_from", "resend_to"}:
        a, b = given["resend_from"], given.get("resend_to")
        if not is_int(a) or a < 0 or (b is not None and not is_int(b)):
            return None
        return RESEND_RANGE, a, b
    if keys == {"resend_from_time"}:
        t = given["resend_from_time"]
        if not is_number(t):
            return None
        return RESEND_FROM_TIME, t, None
    return None

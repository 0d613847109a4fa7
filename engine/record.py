"""The one record format, as every shell and the Spark reader see it (DESIGN.md, "One record format").

A RabbitMQ Stream client's record is stored exactly as sent. Every other shell stores an AMQP 1.0 bare
message made by :func:`encode_record`: ``properties`` (content-type ``CT_JSON``, ``CT_BSON`` or
``CT_OCTET``; creation-time in ms when the protocol has a per-message time), ``application-properties``
(protocol headers: ZeroMQ ``X-*``, WebSocket ``pkey``), one ``data`` section per payload frame.

Reading (:func:`decode_record`): a record that parses completely as AMQP 1.0 is that message (its
payload is its data sections joined); anything else is a raw payload, the whole record. What the
payload is:

* content-type ``application/json`` -> JSON, ``application/bson`` -> BSON (the media type is compared
  case-insensitively, parameters such as ``; charset=utf-8`` ignored). The label is trusted and checked
  only cheaply (UTF-8 text, BSON framing); a payload that fails a renderer's check renders as bytes.
* a raw record, ``application/octet-stream`` or no content-type: one complete JSON object -> JSON, else
  one complete BSON document (framing, and it decodes) -> BSON, else bytes.
* any other content-type -> bytes; so is an amqp-value that is not a binary or a string and an
  amqp-sequence body (their payload is their AMQP encoding; see ``_pyrecord.decode_message``).

Rendering, each shell in its own terms: JSON and BSON convert both ways (BSON becomes relaxed Extended
JSON, ``bson.json_util`` with ``RELAXED_JSON_OPTIONS``; JSON becomes BSON through ``json_util.loads``, so
Extended JSON in it comes back as its BSON types); bytes become ``{"data": Binary}`` in BSON and
``{"base64": "..."}`` in JSON. ZeroMQ takes :attr:`Record.sections` as frames and
:attr:`Record.app_properties` as headers.

The byte work is the core's (:mod:`riverbed.engine.core`: compiled, or its pure-Python twin
:mod:`riverbed.engine._pyrecord`, whose docstring has the byte layout). Every function here is pure and
thread-safe; a :class:`Record` is read-only to its users (it caches its decoded document, an idempotent
write).
"""

import base64
import json
import logging
import re
import threading
import time
from datetime import timezone
from itertools import accumulate

import bson
from bson import json_util
from bson.binary import Binary
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.json_util import RELAXED_JSON_OPTIONS, JSONMode, JSONOptions

from riverbed.engine import core

CT_JSON = "application/json"
CT_BSON = "application/bson"
CT_OCTET = "application/octet-stream"

KIND_JSON = "json"
KIND_BSON = "bson"
KIND_BYTES = "bytes"

# BSON read for rendering: tz-aware UTC datetimes, and dates past datetime's range kept (as DatetimeMS)
# instead of failing the record.
BSON_OPTIONS = CodecOptions(tz_aware=True, tzinfo=timezone.utc,
                            datetime_conversion=DatetimeConversion.DATETIME_AUTO)
# Extended JSON read back into BSON types with the same conventions.
EJSON_READ_OPTIONS = JSONOptions(json_mode=JSONMode.RELAXED, tz_aware=True, tzinfo=timezone.utc,
                                 datetime_conversion=DatetimeConversion.DATETIME_AUTO)
COMPACT = {"separators": (",", ":"), "ensure_ascii": False}

_KINDS = {core.KIND_JSON: KIND_JSON, core.KIND_BSON: KIND_BSON, core.KIND_BYTES: KIND_BYTES}
_SNIFFED = (None, "", CT_OCTET)
_LABELS = {CT_JSON: CT_JSON, CT_BSON: CT_BSON, CT_OCTET: CT_OCTET}     # what the shells write: no parsing
_NO_DOCUMENT = object()      # cache marker: the payload has been tried and is not a document

log = logging.getLogger("riverbed.record")

# ---- the nesting-depth limit (DESIGN.md, "Limits") -----------------------------------------------------
#
# One limit for BSON documents and JSON values, on publish (the shells refuse deeper payloads with their
# own error, through check_* below) and on render (a deeper stored payload, e.g. one written raw through
# RabbitMQ Stream, is converted to no other format: readers get it in the raw form). Depth counts
# containers: ``{}`` and ``[]`` are depth 1, ``{"a": {}}`` depth 2; a BSON event is depth 1. MongoDB
# allows 100 levels, Jackson 1000; pymongo's C codec and Python's json take about 1000 (the interpreter's
# recursion limit) and json_util's BSON -> Extended JSON conversion fails near 500 (two frames a level:
# the 600-deep event of issue 21). 64 is the AMQP decoder's own bound (``_pyrecord.MAX_DEPTH``) and the
# BSON PUB fast path's (``riverbed.shells._pybsonpub.MAX_DEPTH``); ``--max-depth`` may set
# 1..MAX_DEPTH_CAP, which keeps every renderer clear of the recursion limit.
DEFAULT_MAX_DEPTH = 64
MAX_DEPTH_CAP = 256
_max_depth = DEFAULT_MAX_DEPTH

# A JSON text's nesting, without parsing it: strings dropped (they may hold brackets), every other byte
# but brackets deleted, opens +1 and closes -1, the running maximum.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_OPENS = frozenset(b"[{")
# Every level of BSON nesting takes at least 7 bytes (type, an empty key's NUL, the embedded document's
# int32 length and terminator); the innermost document 5. So a document shorter than 5 + 7 x limit
# cannot nest deeper than the limit.
_LEN_BSON_MIN = 5
LEN_BSON_LEVEL = 7


def set_max_depth(depth):
    """Set the process-wide nesting-depth limit (an int in 1..MAX_DEPTH_CAP; the server's
    ``--max-depth``). Raises ValueError outside that range. Takes effect for the next publish or render;
    thread-safe (one int assignment)."""
    global _max_depth
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH_CAP:
        raise ValueError(f"max depth must be an integer in 1..{MAX_DEPTH_CAP}, not {depth!r}")
    _max_depth = depth


def max_depth():
    """The nesting-depth limit in force (see :func:`set_max_depth`)."""
    return _max_depth


def json_depth(text):
    """The nesting depth of JSON text (str or UTF-8 bytes): 0 for a scalar, 1 for ``{}`` or ``[]``, ...
    Brackets inside strings do not count. Text that is not JSON gives an upper bound of what its
    brackets would nest. Linear time, no recursion; pure; thread-safe."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKET)
    if not brackets:
        return 0
    return max(0, max(accumulate(1 if b in _OPENS else -1 for b in brackets)))


def json_within_depth(text, limit=None):
    """True when JSON text (str or bytes) nests no deeper than ``limit`` (default: :func:`max_depth`).
    A text shorter than 2 x limit + 2, or with no more brackets than the limit, is accepted without
    scanning it."""
    limit = _max_depth if limit is None else limit
    if len(text) <= 2 * limit + 1:          # depth d takes at least 2d characters
        return True
    if isinstance(text, str):
        if text.count("{") + text.count("[") <= limit:
            return True
    elif text.count(b"{") + text.count(b"[") <= limit:
        return True
    return json_depth(text) <= limit


def value_depth(value, limit=None):
    """The nesting depth of a decoded value (dicts, lists and tuples are containers; a BSON
    document decoded by pymongo is a dict): 0 for a scalar, 1 for ``{}``. The walk stops once it passes
    ``limit`` (returning ``limit + 1``); iterative, so any depth is safe. Pure; thread-safe."""
    limit = _max_depth if limit is None else limit
    if not isinstance(value, (dict, list, tuple)):
        return 0
    deepest = 1
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > deepest:
            deepest = d
            if d > limit:
                return d
        for child in (v.values() if isinstance(v, dict) else v):
            if isinstance(child, (dict, list, tuple)):
                stack.append((child, d + 1))
    return deepest


def value_within_depth(value, limit=None):
    """True when a decoded value nests no deeper than ``limit`` (default: :func:`max_depth`)."""
    limit = _max_depth if limit is None else limit
    return value_depth(value, limit) <= limit


# ---- render fallbacks: counted and logged (rate limited) -----------------------------------------------

RENDER_LOG_INTERVAL = 10.0   # seconds between two log lines about records rendered in the raw form
FALLBACK_DEPTH = "depth"     # nested deeper than the limit
FALLBACK_INVALID = "invalid"  # labeled JSON/BSON that does not parse as its label says
FALLBACK_ERROR = "error"     # the conversion failed (a value the target cannot hold, ...)

_fallbacks = {}              # (target format, reason) -> records rendered in the raw form
_fallback_lock = threading.Lock()
_fallback_logged = [0.0, 0]  # time of the last log line, fallbacks since it


def render_fallbacks():
    """``{(target, reason): count}``: records rendered in the raw form instead of as ``target``
    (``"json"`` or ``"bson"``) since the process started, by reason (``FALLBACK_*``). A copy;
    thread-safe. ``/metrics`` serves it as ``riverbed_render_fallback_total``."""
    with _fallback_lock:
        return dict(_fallbacks)


def _fallback(target, reason, rec):
    """Count one record rendered raw and log it, at most one line per RENDER_LOG_INTERVAL."""
    now = time.monotonic()
    with _fallback_lock:
        key = (target, reason)
        _fallbacks[key] = _fallbacks.get(key, 0) + 1
        _fallback_logged[1] += 1
        if now - _fallback_logged[0] < RENDER_LOG_INTERVAL:
            return
        suppressed = _fallback_logged[1] - 1
        _fallback_logged[0], _fallback_logged[1] = now, 0
    log.warning("a %s record of %d bytes cannot be rendered as %s (%s): delivered in the raw form%s",
                rec.kind, len(rec.payload), target.upper(), reason,
                f" ({suppressed} more since the last such line)" if suppressed else "")


class Record:
    """One stored record, read by :func:`decode_record`.

    * ``amqp``: True when the record is an AMQP 1.0 message, False for a raw payload.
    * ``content_type``: str or None (the properties' content-type, as stored).
    * ``creation_time``: int ms since the Unix epoch, or None.
    * ``app_properties``: dict (empty when there are none); values as ``_pyrecord.decode_message`` maps
      them (str, bytes, int, ...).
    * ``sections``: list of bytes, the payload frames: the data sections of a message (empty ones kept),
      ``[the whole record]`` for a raw payload.
    * ``payload``: bytes, the frames joined.
    * ``kind``: ``"json"``, ``"bson"`` or ``"bytes"``.
    * ``body_kind``: ``core.BODY_*`` for a message, 0 for a raw payload.
    """

    __slots__ = ("amqp", "content_type", "creation_time", "app_properties", "sections", "payload", "kind",
                 "body_kind", "_document")

    def __init__(self, amqp, content_type, creation_time, app_properties, sections, payload, kind, body_kind):
        self.amqp = amqp
        self.content_type = content_type
        self.creation_time = creation_time
        self.app_properties = app_properties
        self.sections = sections
        self.payload = payload
        self.kind = kind
        self.body_kind = body_kind
        self._document = None

    def _fields(self):
        return (self.amqp, self.content_type, self.creation_time, self.app_properties, self.sections,
                self.payload, self.kind, self.body_kind)

    def __eq__(self, other):
        return isinstance(other, Record) and self._fields() == other._fields()

    __hash__ = None

    def __repr__(self):
        payload = self.payload if len(self.payload) <= 32 else self.payload[:32] + b"..."
        return (f"Record(amqp={self.amqp}, kind={self.kind!r}, content_type={self.content_type!r}, "
                f"creation_time={self.creation_time}, app_properties={self.app_properties!r}, "
                f"sections={len(self.sections)}, payload={payload!r})")


def media_type(content_type):
    """The media type of a content-type, lower case, parameters dropped: ``"application/json"`` for
    ``"Application/JSON; charset=utf-8"``; None for None."""
    if content_type is None:
        return None
    return content_type.split(";", 1)[0].strip().lower()


# ---- writing -------------------------------------------------------------------------------------------

def encode_record(sections_or_bytes, content_type, creation_time=None, app_properties=None):
    """The stored form of one message from a shell other than RabbitMQ Stream: an AMQP 1.0 bare message.

    ``sections_or_bytes``: one bytes-like payload, or a list/tuple of frames (one data section each,
    empty ones kept). ``content_type``: ``CT_JSON``, ``CT_BSON``, ``CT_OCTET`` (any ASCII str is
    written as given) or None. ``creation_time``: int ms since the Unix epoch, or None.
    ``app_properties``: dict of str -> str or bytes, or None.

    Raises TypeError, ValueError (no frames, a non-ASCII content type, a frame over 2**31-1 bytes) and
    OverflowError (creation time outside int64), as ``core.encode_message``. Pure; thread-safe.
    """
    if isinstance(sections_or_bytes, (bytes, bytearray, memoryview)):
        sections_or_bytes = (sections_or_bytes,)
    return core.encode_message(sections_or_bytes, content_type, creation_time, app_properties)


def from_json_text(text, creation_time=None, app_properties=None):
    """A JSON payload (str, or UTF-8 bytes) as a stored record with content-type ``CT_JSON``. The text
    is stored byte for byte and not parsed: a shell validates before it stores. Raises as
    :func:`encode_record`."""
    return encode_record(text.encode("utf-8") if isinstance(text, str) else text, CT_JSON, creation_time,
                         app_properties)


def from_bson(document, creation_time=None, app_properties=None):
    """A BSON payload (a mapping, encoded with ``bson.encode``, or already-encoded BSON bytes stored as
    given) as a stored record with content-type ``CT_BSON``. Raises what ``bson.encode`` raises
    (InvalidDocument, OverflowError) and as :func:`encode_record`."""
    if not isinstance(document, (bytes, bytearray, memoryview)):
        document = bson.encode(document)
    return encode_record(document, CT_BSON, creation_time, app_properties)


# ---- reading -------------------------------------------------------------------------------------------

def decode_record(raw):
    """Read one stored record (any bytes-like object) as a :class:`Record`. Never raises for bytes-like
    input: a record that is not a complete AMQP 1.0 message is a raw payload. Pure; thread-safe."""
    msg = core.decode_message(raw)
    if msg is None:
        payload = raw if type(raw) is bytes else bytes(raw)
        rec = Record(False, None, None, {}, [payload], payload, KIND_BYTES, 0)
        _sniff(rec)
        return rec
    content_type, creation_time, app_properties, sections, body_kind = msg
    payload = sections[0] if len(sections) == 1 else b"".join(sections)
    rec = Record(True, content_type, creation_time, app_properties or {}, sections, payload, KIND_BYTES,
                 body_kind)
    if body_kind in (core.BODY_VALUE, core.BODY_SEQUENCE):
        return rec
    media = _LABELS.get(content_type) or media_type(content_type)
    if media == CT_JSON:
        rec.kind = KIND_JSON
    elif media == CT_BSON:
        rec.kind = KIND_BSON
    elif media in _SNIFFED:
        _sniff(rec)
    return rec


def _sniff(rec):
    kind = _KINDS[core.payload_kind(rec.payload)]
    if kind == KIND_BSON:
        # the core checked the framing; only a document that decodes is BSON
        if _bson_document(rec) is None:
            kind = KIND_BYTES
    rec.kind = kind


def _bson_document(rec):
    """The payload decoded as BSON (cached on the record), or None when it does not decode."""
    doc = rec._document
    if doc is None:
        try:
            doc = bson.decode(rec.payload, BSON_OPTIONS)
        except Exception:  # noqa: BLE001 - the C decoder raises InvalidBSON, ValueError, OverflowError, ...
            doc = _NO_DOCUMENT
        rec._document = doc
    return None if doc is _NO_DOCUMENT else doc


def _json_value(rec):
    """The payload parsed as JSON, or _NO_DOCUMENT when it does not parse."""
    try:
        return json.loads(rec.payload.decode("utf-8"))
    except (ValueError, RecursionError):
        return _NO_DOCUMENT


def _bson_framed(payload):
    return core.payload_kind(payload) == core.KIND_BSON


# ---- rendering -----------------------------------------------------------------------------------------

def _raw_json_value(rec):
    return {"base64": base64.b64encode(rec.payload).decode("ascii")}


def to_json_value(rec):
    """The record as a JSON protocol shows it, a Python value ready for ``json.dumps``: a JSON payload
    parsed (a dict for a sniffed one; a labeled one may hold any JSON value), a BSON payload as relaxed
    Extended JSON (a dict), bytes as ``{"base64": "..."}``. A labeled payload that does not parse, and a
    payload nested deeper than :func:`max_depth`, render as bytes (counted, see
    :func:`render_fallbacks`). Never raises; pure; thread-safe."""
    if rec.kind == KIND_JSON:
        if not json_within_depth(rec.payload):
            _fallback(KIND_JSON, FALLBACK_DEPTH, rec)
        else:
            value = _json_value(rec)
            if value is not _NO_DOCUMENT:
                return value
            _fallback(KIND_JSON, FALLBACK_INVALID, rec)
    elif rec.kind == KIND_BSON:
        doc = _bson_document(rec)
        if doc is None:
            _fallback(KIND_JSON, FALLBACK_INVALID, rec)
        elif not value_within_depth(doc):
            _fallback(KIND_JSON, FALLBACK_DEPTH, rec)
        else:
            try:
                return json.loads(json_util.dumps(doc, json_options=RELAXED_JSON_OPTIONS))
            except Exception:  # noqa: BLE001 - RecursionError, a value json_util cannot write, ...
                _fallback(KIND_JSON, FALLBACK_ERROR, rec)
    return _raw_json_value(rec)


def to_json_text(rec):
    """The record as compact JSON text (``str``). A JSON payload is returned as its original text, byte
    for byte (so a WebSocket client gets exactly the ``msg`` that was published); it is not parsed again,
    only decoded as UTF-8 and its nesting measured (a labeled payload that is not UTF-8, or that nests
    deeper than :func:`max_depth`, renders as bytes). BSON becomes relaxed Extended JSON, bytes
    ``{"base64":"..."}``. Never raises; pure; thread-safe."""
    if rec.kind == KIND_JSON:
        try:
            text = rec.payload.decode("utf-8")
        except UnicodeDecodeError:
            _fallback(KIND_JSON, FALLBACK_INVALID, rec)
        else:
            # depth d takes 2d characters, and the bracket count bounds it: most texts are cleared
            # without a scan (hot path)
            if len(text) <= 2 * _max_depth + 1 or text.count("{") + text.count("[") <= _max_depth \
                    or json_depth(text) <= _max_depth:
                return text
            _fallback(KIND_JSON, FALLBACK_DEPTH, rec)
    elif rec.kind == KIND_BSON:
        doc = _bson_document(rec)
        if doc is None:
            _fallback(KIND_JSON, FALLBACK_INVALID, rec)
        elif not value_within_depth(doc):
            _fallback(KIND_JSON, FALLBACK_DEPTH, rec)
        else:
            try:
                return json_util.dumps(doc, json_options=RELAXED_JSON_OPTIONS, **COMPACT)
            except Exception:  # noqa: BLE001 - RecursionError, a value json_util cannot write, ...
                _fallback(KIND_JSON, FALLBACK_ERROR, rec)
    return json.dumps(_raw_json_value(rec), **COMPACT)


def _raw_bson_document(rec):
    return {"data": Binary(rec.payload)}


def to_bson_document(rec):
    """The record as the BSON protocol shows it, a dict for ``bson.encode``: a BSON payload decoded
    (tz-aware UTC datetimes), a JSON object read as Extended JSON (``{"$date": ...}`` becomes a
    datetime, ...), bytes, and any payload that is not a document (a JSON array, a labeled payload that
    does not decode, a document nested deeper than :func:`max_depth`), as ``{"data": Binary(payload)}``.
    Never raises; pure; thread-safe."""
    if rec.kind == KIND_BSON:
        doc = _bson_document(rec)
        if doc is None:
            _fallback(KIND_BSON, FALLBACK_INVALID, rec)
        elif not value_within_depth(doc):
            _fallback(KIND_BSON, FALLBACK_DEPTH, rec)
        else:
            return doc
    elif rec.kind == KIND_JSON:
        if not json_within_depth(rec.payload):
            _fallback(KIND_BSON, FALLBACK_DEPTH, rec)
        else:
            doc = _json_document(rec)
            if doc is not None:
                return doc
    return _raw_bson_document(rec)


def _json_document(rec):
    try:
        text = rec.payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
    try:
        doc = json_util.loads(text, json_options=EJSON_READ_OPTIONS)
    except Exception:  # noqa: BLE001 - bad Extended JSON ({"$date": "x"}) raises many types: read plainly
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            return None
    return doc if isinstance(doc, dict) else None


def to_bson_bytes(rec):
    """:func:`to_bson_document` encoded. A BSON payload is returned as stored, byte for byte, when it is
    framed as one BSON document (a sniffed one has also been decoded) and nests no deeper than
    :func:`max_depth` (only a payload long enough to nest that deep is decoded to measure it; a deeper
    or undecodable one renders as bytes). A document that ``bson.encode`` refuses (an integer past int64)
    renders as bytes. Never raises; pure; thread-safe."""
    if rec.kind == KIND_BSON and ((rec._document is not None and rec._document is not _NO_DOCUMENT)
                                or _bson_framed(rec.payload)):
        if len(rec.payload) < _LEN_BSON_MIN + LEN_BSON_LEVEL * _max_depth:
            return rec.payload           # too short to nest deeper than the limit: no need to look
        doc = _bson_document(rec)
        if doc is not None and value_within_depth(doc):
            return rec.payload
        _fallback(KIND_BSON, FALLBACK_DEPTH if doc is not None else FALLBACK_INVALID, rec)
        return bson.encode(_raw_bson_document(rec))
    doc = to_bson_document(rec)
    try:
        return bson.encode(doc)
    except Exception:  # noqa: BLE001 - InvalidDocument, OverflowError, RecursionError, ...
        _fallback(KIND_BSON, FALLBACK_ERROR, rec)
        return bson.encode(_raw_bson_document(rec))
